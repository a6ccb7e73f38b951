#!/usr/bin/env python3
"""`tandem certs` (issue 18's certificates; the control endpoint's HTTPS uses them too).

    certs_test.py TANDEM PYTHON FIXTURES

- `tandem certs DIR --nodes leader,gpu-1 --hosts gpu-1=10.1.2.3,leader=leader.example`: a CA,
  the cluster secret, per node cert.pem / key.pem / ca.pem / join.token; keys and secrets
  0600, folders 0700;
- each node certificate verifies against the CA for both purposes (openssl verify -purpose
  sslserver and sslclient), is not a CA, names DNS:NAME, localhost, 127.0.0.1, ::1 and its
  --hosts (an IP as an IP SAN); the CA is a CA; another `tandem certs`' certificate does not
  verify against this CA;
- join.token is HMAC-SHA256(cluster secret, name) (Python's hmac);
- bad input, exit 2 and nothing written: a name twice, a name that is not one, --hosts of
  an unknown node, a folder that is not empty;
- a tiny CPU run serving its control endpoint with the leader's files: Python's ssl with
  the CA verifies it by name (localhost) and address, `tandem shell --ca` reads it, a
  client with the other cluster's CA is refused.

~10 s on 2 cores.
"""
import hashlib
import hmac
import json
import os
import shutil
import ssl
import stat
import subprocess
import sys
import tempfile
import time
import urllib.request

from control_lib import Checks, lines, tiny_run_folder

tandem, python, fixtures = sys.argv[1:4]
check = Checks()
work = tiny_run_folder(python, fixtures, "tandem-certs-")
d = os.path.join(work, "certs")


def certs(*args):
    r = subprocess.run([tandem, "certs", *args], capture_output=True, text=True, timeout=60)
    return r.returncode, r.stdout + r.stderr


def openssl(*args):
    r = subprocess.run(["openssl", *args], capture_output=True, text=True, timeout=30)
    return r.returncode, r.stdout + r.stderr


rc, out = certs(d, "--nodes", "leader,gpu-1", "--hosts", "gpu-1=10.1.2.3,leader=leader.example")
check(rc == 0 and "copy it to that node only" in out, f"tandem certs: {rc} {out[-300:]}")
mode = lambda p: stat.S_IMODE(os.stat(os.path.join(d, p)).st_mode)
check(mode("ca.key") == 0o600 and mode("cluster.secret") == 0o600 and mode("leader/key.pem") == 0o600
      and mode("gpu-1/join.token") == 0o600 and mode(".") == 0o700 and mode("gpu-1") == 0o700,
      "keys, secret and tokens 0600, folders 0700")
for node in ("leader", "gpu-1"):
    cert = os.path.join(d, node, "cert.pem")
    for purpose in ("sslserver", "sslclient"):
        rc, out = openssl("verify", "-CAfile", os.path.join(d, "ca.pem"), "-purpose", purpose, cert)
        check(rc == 0 and ": OK" in out, f"{node}: verifies for {purpose}: {out.strip()}")
    rc, text = openssl("x509", "-in", cert, "-noout", "-ext", "subjectAltName,basicConstraints,extendedKeyUsage")
    want = [f"DNS:{node}", "DNS:localhost", "IP Address:127.0.0.1", "IP Address:0:0:0:0:0:0:0:1"]
    want.append("IP Address:10.1.2.3" if node == "gpu-1" else "DNS:leader.example")
    check(rc == 0 and all(w in text for w in want) and "CA:FALSE" in text
          and "TLS Web Server Authentication, TLS Web Client Authentication" in text, f"{node}: names and usage: {text}")
    secret = bytes.fromhex(open(os.path.join(d, "cluster.secret")).read().strip())
    token = open(os.path.join(d, node, "join.token")).read().strip()
    check(token == hmac.new(secret, node.encode(), hashlib.sha256).hexdigest(), f"{node}: the join token is the HMAC")
    check(open(os.path.join(d, node, "ca.pem")).read() == open(os.path.join(d, "ca.pem")).read(),
          f"{node}: carries the CA certificate")
rc, text = openssl("x509", "-in", os.path.join(d, "ca.pem"), "-noout", "-ext", "basicConstraints,keyUsage")
check(rc == 0 and "CA:TRUE" in text and "Certificate Sign" in text, f"the CA is a CA: {text}")
other = os.path.join(work, "other")
rc, _ = certs(other, "--nodes", "leader")
rc2, out = openssl("verify", "-CAfile", os.path.join(d, "ca.pem"), os.path.join(other, "leader", "cert.pem"))
check(rc == 0 and rc2 != 0, f"another cluster's certificate does not verify against this CA: {out.strip()}")

# Bad input: exit 2, nothing written.
for args, what in (([os.path.join(work, "b1"), "--nodes", "a,a"], "a name twice"),
                   ([os.path.join(work, "b2"), "--nodes", "a b"], "a name with a space"),
                   ([os.path.join(work, "b3"), "--nodes", "-a"], "a name starting with '-'"),
                   ([os.path.join(work, "b4"), "--nodes", "a", "--hosts", "z=h"], "--hosts of an unknown node"),
                   ([os.path.join(work, "b5"), "--nodes", "a", "--hosts", "a"], "--hosts without '='"),
                   ([d, "--nodes", "a"], "a folder that is not empty")):
    before = os.listdir(d)
    rc, out = certs(*args)
    check(rc == 2 and "tandem certs:" in out and not os.path.exists(os.path.join(work, args[0]) if args[0] != d else "")
          and os.listdir(d) == before, f"{what}: exit {rc} ({out.strip()[:160]})")

# The control endpoint over HTTPS with the leader's files.
run_dir = os.path.join(work, "run")
log = open(run_dir + ".log", "w")
proc = subprocess.Popen([tandem, "run", os.path.join(work, "run.toml"), "--set", f"run.output_dir={run_dir}",
                         "--set", "data.epochs=100", "--set", "checkpoint.every_steps=0",
                         "--set", "checkpoint.host_every=0",
                         "--set", f"control.tls_cert={os.path.join(d, 'leader', 'cert.pem')}",
                         "--set", f"control.tls_key={os.path.join(d, 'leader', 'key.pem')}"],
                        stdout=log, stderr=subprocess.STDOUT, cwd=work)
control_file = os.path.join(run_dir, "control.json")
deadline = time.time() + 60
while time.time() < deadline and not os.path.exists(control_file) and proc.poll() is None:
    time.sleep(0.1)
time.sleep(0.1)
if not os.path.exists(control_file):
    print(open(run_dir + ".log").read()[-2000:])
    sys.exit("FAILED: the run did not start")
ctl = json.load(open(control_file))


def get(host, cafile):
    ctx = ssl.create_default_context(cafile=cafile)
    req = urllib.request.Request(f"https://{host}:{ctl['port']}/v1/status",
                                 headers={"Authorization": "Bearer " + ctl["token"]})
    with urllib.request.urlopen(req, timeout=15, context=ctx) as r:
        return r.status


for host in ("localhost", "127.0.0.1"):
    try:
        check(get(host, os.path.join(d, "ca.pem")) == 200, f"HTTPS to {host}, verified with the CA")
    except Exception as e:
        check(False, f"HTTPS to {host}: {e}")
try:
    get("localhost", os.path.join(other, "ca.pem"))
    check(False, "a client with another cluster's CA was answered")
except ssl.SSLError as e:
    check("CERTIFICATE_VERIFY_FAILED" in str(e), f"another cluster's CA: refused ({e})")
except urllib.error.URLError as e:
    check("CERTIFICATE_VERIFY_FAILED" in str(e.reason), f"another cluster's CA: refused ({e.reason})")
r = subprocess.run([tandem, "shell", run_dir, "--ca", os.path.join(d, "ca.pem"), "-c", "status"], capture_output=True,
                   text=True, timeout=30)
check(r.returncode == 0 and "step" in r.stdout, f"tandem shell --ca: {r.returncode} {r.stderr[-200:]}")
r = subprocess.run([tandem, "shell", run_dir, "--ca", os.path.join(d, "ca.pem"), "-c", "stop"], capture_output=True,
                   text=True, timeout=30)
try:
    code = proc.wait(timeout=120)
except subprocess.TimeoutExpired:
    proc.kill()
    code = None
check(code == 0, f"the run ended with {code}")
print(f"certs: {check.passed} checks passed, {len(check.failures)} failed")
if check.failures:
    print(open(run_dir + ".log").read()[-1500:])
    sys.exit(1)
shutil.rmtree(work, ignore_errors=True)
