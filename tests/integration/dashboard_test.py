#!/usr/bin/env python3
"""The web dashboard against a real `tandem run` (issue 17), in headless Chromium.

    dashboard_test.py TANDEM PYTHON FIXTURES

The tiny run of run_test.toml on the CPU (log_every 1), paused after 15 steps, then:

- the door: GET / without the token or with a wrong one -> 401 (counted); GET /?token=T
  -> 303 to "/" (the token gone from the URL) with the token in an HttpOnly, SameSite=Strict
  cookie; GET / with the cookie -> the page, self-contained (no script, style or link
  fetched from anywhere: it must work air-gapped), under a Content-Security-Policy with a
  per-response nonce;
- the cookie reads (GET /v1/status) but does not act alone: a POST with it and without the
  page's CSRF token -> 403, with the token -> 200; a request from another Origin -> 403;
- the WebSocket /v1/ws: another Origin -> 403, no token -> 401, the bearer token -> 101;
- a headless `chromium` on `tandem shell RUN -c dashboard`'s address, its DOM read over the
  DevTools protocol until the page was fed: every
  chart has as many points as metrics.jsonl has step lines (tau: one per evaluation, none
  here; its simulated line one per step), the tree has a row per actor of GET /v1/tree,
  the event log a line per event of GET /v1/events.

SKIPPED (exit 77) without chromium (tools/deps/debian-packages.txt has it). ~20 s.
"""
import http.client
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time

from control_lib import Checks, lines, tiny_run_folder

tandem, python, fixtures = sys.argv[1:4]
chromium = shutil.which("chromium") or shutil.which("chromium-browser")
if not chromium:
    print("SKIPPED: no chromium (tools/deps/debian-packages.txt)")
    sys.exit(77)
here = os.path.dirname(os.path.abspath(__file__))
work = tiny_run_folder(python, fixtures, "tandem-dashboard-")
check = Checks()



run_dir = os.path.join(work, "run")
log = open(run_dir + ".log", "w")
proc = subprocess.Popen([tandem, "run", os.path.join(work, "run.toml"), "--set", f"run.output_dir={run_dir}",
                         "--set", "data.epochs=100", "--set", "train.max_steps=5000",
                         "--set", "checkpoint.every_steps=0", "--set", "checkpoint.host_every=0"],
                        stdout=log, stderr=subprocess.STDOUT, cwd=work)
metrics = os.path.join(run_dir, "metrics.jsonl")
control_file = os.path.join(run_dir, "control.json")
deadline = time.time() + 90
while time.time() < deadline and not (os.path.exists(control_file) and len(lines(metrics, "step")) >= 15):
    if proc.poll() is not None:
        break
    time.sleep(0.1)
if not os.path.exists(control_file) or proc.poll() is not None:
    print(open(run_dir + ".log").read()[-2000:])
    sys.exit("FAILED: the run did not start")
ctl = json.load(open(control_file))
host, port, token = ctl["host"], int(ctl["port"]), ctl["token"]
origin = f"http://{host}:{port}"


def request(method, path, headers=None, body=None):
    c = http.client.HTTPConnection(host, port, timeout=15)
    c.request(method, path, body=body, headers=headers or {})
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, dict((k.lower(), v) for k, v in r.getheaders()), data.decode(errors="replace")


bearer = {"Authorization": "Bearer " + token}
status, _, _ = request("POST", "/v1/pause", bearer)
check(status == 200, f"pause {status}")
last, still = -1, 0
while still < 8:
    n = len(lines(metrics, "step"))
    still = still + 1 if n == last else 0
    last = n
    time.sleep(0.2)

# The door.
before = json.loads(request("GET", "/v1/status", bearer)[2])["unauthorized"]
status, _, _ = request("GET", "/")
check(status == 401, f"GET / without the token: {status}")
status, _, _ = request("GET", "/?token=" + "0" * 64)
check(status == 401, f"GET / with a wrong token: {status}")
after = json.loads(request("GET", "/v1/status", bearer)[2])["unauthorized"]
check(after == before + 2, f"both refusals counted ({before} -> {after})")
status, headers, _ = request("GET", "/?token=" + token)
cookie = headers.get("set-cookie", "")
check(status == 303 and headers.get("location") == "/", f"GET /?token=: {status} to {headers.get('location')}")
name = f"tandem_session_{port}"
check("HttpOnly" in cookie and "SameSite=Strict" in cookie and cookie.startswith(name + "="),
      f"the cookie is this port's session: {cookie!r}")
session = cookie.split(";")[0].split("=", 1)[1]
check(re.fullmatch(r"[0-9a-f]{64}", session) is not None and session != token,
      "the cookie holds a session secret, not the run's token")
status, _, _ = request("GET", "/v1/status", {"Cookie": name + "=" + token})
check(status == 401, f"the run's token in the cookie is not a session: {status}")
status, _, _ = request("GET", "/v1/status", {"Cookie": f"tandem_session_{port + 1}=" + session})
check(status == 401, f"another port's cookie name is not this endpoint's: {status}")
jar = {"Cookie": name + "=" + session}
status, headers, page = request("GET", "/", jar)
check(status == 200 and headers.get("content-type", "").startswith("text/html"), f"GET / with the cookie: {status}")
csp = headers.get("content-security-policy", "")
check("script-src 'nonce-" in csp and "default-src 'none'" in csp, f"a CSP with a nonce: {csp!r}")
check(not re.search(r"<(script|img|iframe)[^>]*\bsrc=|<link\b|@import|https?://", page),
      "the page fetches nothing from anywhere (self-contained)")
m = re.search(r'const CSRF = "([0-9a-f]{64})"', page)
check(m is not None, "the page carries a CSRF token")
csrf = m.group(1) if m else ""
status, _, _ = request("GET", "/v1/status", jar)
check(status == 200, f"the cookie reads: {status}")
status, _, _ = request("POST", "/v1/checkpoint", jar, "{}")
check(status == 403, f"a POST with the cookie alone: {status}")
status, _, _ = request("POST", "/v1/checkpoint", dict(jar, **{"X-Tandem-CSRF": "f" * 64}), "{}")
check(status == 403, f"a POST with the cookie and a made-up CSRF token: {status}")
status, _, body = request("POST", "/v1/checkpoint", dict(jar, **{"X-Tandem-CSRF": csrf, "Origin": origin}), "{}")
check(status == 200, f"a POST with the cookie and the page's CSRF token: {status} {body}")
status, _, _ = request("GET", "/v1/status", dict(bearer, Origin="http://evil.example"))
check(status == 403, f"another Origin: {status}")


def ws_status(headers):
    s = socket.create_connection((host, port), timeout=10)
    req = (f"GET /v1/ws HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
           "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n")
    for k, v in headers.items():
        req += f"{k}: {v}\r\n"
    s.sendall((req + "\r\n").encode())
    first = s.recv(4096).split(b"\r\n", 1)[0].decode()
    s.close()
    return int(first.split()[1]) if first.startswith("HTTP/1.1") else 0


check(ws_status(dict(jar, Origin="http://evil.example")) == 403, "a WebSocket from another Origin -> 403")
check(ws_status({"Origin": origin}) == 401, "a WebSocket without the token -> 401")
check(ws_status(dict(bearer, Origin=origin)) == 101, "a WebSocket with the token -> 101")

# The page in Chromium.
url = subprocess.run([tandem, "shell", run_dir, "-c", "dashboard"], capture_output=True, text=True).stdout.strip()
check(url == f"{origin}/?token={token}", f"shell dashboard: {url!r}")
profile = os.path.join(work, "chromium-profile")


class Devtools:
    """The page's DOM from a headless Chromium, read in real time over the DevTools
    protocol (a WebSocket, client frames masked), so the test waits for the page's own
    WebSocket frames however busy the machine is (--dump-dom with a virtual-time budget
    did not: virtual time does not wait for WebSocket traffic, and on a loaded CI machine
    five loads in a row came back unfed)."""

    def __init__(self, url):
        log = os.path.join(work, "chromium.log")  # a file: a full pipe would stall chromium
        with open(log, "w") as err:
            self.proc = subprocess.Popen([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                                          f"--user-data-dir={profile}", "--remote-debugging-port=0", url],
                                         stdout=subprocess.DEVNULL, stderr=err)
        port = None
        deadline = time.time() + 60
        while port is None and time.time() < deadline:
            m = re.search(r"DevTools listening on ws://[^:]+:(\d+)/", open(log).read())
            port = int(m.group(1)) if m else None
            if port is None:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"chromium exited with {self.proc.returncode}: {open(log).read()[-500:]}")
                time.sleep(0.1)
        if port is None:
            raise RuntimeError("chromium did not say where DevTools listens")
        page = None
        while page is None and time.time() < deadline:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            c.request("GET", "/json/list")
            pages = [t for t in json.loads(c.getresponse().read()) if t.get("type") == "page"]
            page = pages[0]["webSocketDebuggerUrl"] if pages else None
            if page is None:
                time.sleep(0.2)
        path = "/" + page.split("/", 3)[3]
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.sock.sendall((f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
                           "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                           "Sec-WebSocket-Version: 13\r\n\r\n").encode())
        head = b""
        while b"\r\n\r\n" not in head:
            head += self.sock.recv(1)
        if b" 101 " not in head.split(b"\r\n", 1)[0]:
            raise RuntimeError(f"DevTools WebSocket: {head[:80]!r}")
        self.next_id = 0

    def _read(self, n):
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            if not chunk:
                raise RuntimeError("DevTools WebSocket closed")
            data += chunk
        return data

    def _message(self):
        payload = b""
        while True:
            b0, b1 = self._read(2)
            n = b1 & 0x7F
            if n == 126:
                n = int.from_bytes(self._read(2), "big")
            elif n == 127:
                n = int.from_bytes(self._read(8), "big")
            payload += self._read(n)
            if b0 & 0x80:  # FIN
                return json.loads(payload)

    def dom(self):
        self.next_id += 1
        body = json.dumps({"id": self.next_id, "method": "Runtime.evaluate",
                           "params": {"expression": "document.documentElement.outerHTML",
                                      "returnByValue": True}}).encode()
        mask = os.urandom(4)
        n = len(body)
        head = bytes([0x81]) + (bytes([0x80 | n]) if n < 126 else bytes([0x80 | 126]) + n.to_bytes(2, "big"))
        self.sock.sendall(head + mask + bytes(c ^ mask[i % 4] for i, c in enumerate(body)))
        while True:
            m = self._message()
            if m.get("id") == self.next_id:
                return m.get("result", {}).get("result", {}).get("value", "")

    def close(self):
        self.sock.close()
        self.proc.kill()
        self.proc.wait()


# The page is read every 0.25 s until its first frame came (tree rows) and the metric
# history arrived (the loss chart has points), for at most 60 s of real time; what it
# shows then is asserted below.
steps = lines(metrics, "step")
browser = Devtools(url)
dom = ""
waited = time.time()
while time.time() - waited < 60:
    dom = browser.dom()
    fed = re.search(r'id="chart-loss" data-points="([1-9]\d*)"', dom)
    if "<tr data-actor=" in dom and fed and "PAUSED" in dom:
        break
    time.sleep(0.25)
time.sleep(0.5)  # frames of the same moment (events after the tree) land too
dom = browser.dom()
browser.close()
print(f"dashboard: the page was fed after {time.time() - waited:.1f} s", flush=True)
for chart in ("loss", "accuracy", "tokens_per_s", "data_wait", "mfu"):
    m = re.search(rf'id="chart-{chart}" data-points="(\d+)"', dom)
    check(m is not None and int(m.group(1)) == len(steps),
          f"chart {chart}: {m.group(1) if m else None} points for {len(steps)} step lines")
tag = re.search(r'<svg id="chart-tau"[^>]*>', dom)
tau = re.search(r'data-points="(\d+)"', tag.group(0)) if tag else None
sim = re.search(r'data-sim-points="(\d+)"', tag.group(0)) if tag else None
check(tau is not None and sim is not None and int(tau.group(1)) == len(lines(metrics, "eval"))
      and int(sim.group(1)) == len(steps), f"chart tau: {tag.group(0) if tag else None}")
tree = json.loads(request("GET", "/v1/tree", bearer)[2])["actors"]
rows = re.findall(r'<tr data-actor="([^"]+)"', dom)
check(rows == [a["name"] for a in tree], f"tree rows {rows} vs {[a['name'] for a in tree]}")
events = json.loads(request("GET", "/v1/events", bearer)[2])["events"]
shown = re.findall(r'<div data-event="([a-z_]+)"', dom)
check(len(shown) >= 1 and shown == [e["event"] for e in events][:len(shown)] and len(events) - len(shown) <= 1,
      f"event lines {shown} vs {[e['event'] for e in events]}")
check("PAUSED" in dom, "the page says the run is paused")

status, _, _ = request("POST", "/v1/stop", bearer, "{}")
try:
    code = proc.wait(timeout=120)
except subprocess.TimeoutExpired:
    proc.kill()
    code = None
check(code == 0, f"the run ended with {code}")
print(f"dashboard: {check.passed} checks passed, {len(check.failures)} failed")
if check.failures:
    print(dom[:3000])
    print(open(run_dir + ".log").read()[-1500:])
    sys.exit(1)
shutil.rmtree(work, ignore_errors=True)
