"""Checks that two runs logged the same loss at every step 1..N, bit for bit
(runtime resume test: CPU float32 training is deterministic).

usage: compare_losses.py WHOLE_METRICS PARTS_METRICS N
"""
import json
import sys


def losses(path):
    out = {}
    for line in open(path):
        x = json.loads(line)
        if x["event"] == "step":
            out[x["step"]] = x["loss"]
    return out


a, b, n = losses(sys.argv[1]), losses(sys.argv[2]), int(sys.argv[3])
bad = [(k, a.get(k), b.get(k)) for k in range(1, n + 1) if a.get(k) is None or a.get(k) != b.get(k)]
print(f"resume: steps 1..{n} compared, {len(bad)} differ {bad[:3]}")
sys.exit(1 if bad else 0)
