"""Hostile bytes at a cluster leader's port (issue 18): random data, bytes
shaped like protocol headers with huge lengths, a truncated gate answer, an
over-long line, a wrong proof, many idle connections held open, and a
connection that passes nothing but garbage after the gate's nonce.  The
leader must neither crash nor stall: the caller then lets real members join
and checks the run.  Prints what each probe saw.

usage: cluster_hostile.py HOST PORT IDLE_SECONDS
"""
import os
import socket
import struct
import sys
import time

host, port, idle_s = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])


def conn():
    s = socket.create_connection((host, port), timeout=10)
    return s


def probe(name, payload, read=True, hold=0.0):
    s = conn()
    got = b""
    try:
        if read:
            got = s.recv(256)  # the gate's nonce line
        s.sendall(payload)
        time.sleep(hold)
        s.settimeout(6)
        try:
            got += s.recv(256)
        except (socket.timeout, ConnectionResetError):
            pass
    except (BrokenPipeError, ConnectionResetError) as e:
        got += f" [{type(e).__name__}]".encode()
    finally:
        s.close()
    print(f"{name}: {got[:80]!r}")


for i in range(3):
    probe(f"random-{i}", os.urandom(65536), read=False)
probe("ones", b"\xff" * 4096, read=False)
for pos in range(0, 32, 8):
    b = bytearray(64)
    b[pos:pos + 4] = struct.pack(">I", 0x7FFFFFF0)
    probe(f"huge-length-at-{pos}", bytes(b), read=False)
probe("truncated-answer", b"gpu-a", hold=0.5)
probe("over-long-line", b"x" * 4096 + b"\n")
probe("wrong-proof", b"gpu-a " + b"0" * 64 + b"\n")
probe("no-proof", b"gpu-a\n")
probe("garbage-after-nonce", os.urandom(8192))
# Many idle connections at once: over the gate's limit they are closed at
# once; the rest are dropped at the handshake deadline.
idle = []
for _ in range(200):
    try:
        idle.append(conn())
    except OSError as e:
        print(f"idle connect refused: {e}")
        break
print(f"idle: {len(idle)} connections open")
time.sleep(idle_s)
closed = 0
for s in idle:
    s.settimeout(0.2)
    try:
        s.recv(256)  # the nonce, then EOF once the gate gave up on it
        if s.recv(256) == b"":
            closed += 1
    except (socket.timeout, ConnectionResetError):
        pass
    s.close()
print(f"idle: {closed} of {len(idle)} closed by the leader after {idle_s} s")
