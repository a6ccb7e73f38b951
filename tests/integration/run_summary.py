"""Summarises a run's metrics.jsonl as one JSON object (runtime tests).

usage: run_summary.py METRICS_JSONL
"""
import json
import sys

lines = [json.loads(line) for line in open(sys.argv[1])]
steps = [x for x in lines if x["event"] == "step"]
# A non-finite step's record (an injected NaN) has loss null: not averaged.
finite = [x for x in steps if x.get("finite", True)]


def events(kind):
    return [x for x in lines if x["event"] == kind]


# Samples committed per epoch: the last checkpoint of each epoch commits all.
per_epoch, epoch = {}, 0
for x in lines:
    if x["event"] == "epoch":
        epoch = x["epoch"]
    if x["event"] == "checkpoint":
        per_epoch[str(epoch)] = x["committed"]
print(json.dumps({
    "first": sum(s["loss"] for s in finite[:5]) / max(1, len(finite[:5])),
    "last": sum(s["loss"] for s in finite[-5:]) / max(1, len(finite[-5:])),
    "steps": len(steps),
    "failed": len(events("drafter_failed")),
    "restarted": len(events("drafter_restarted")),
    "worker_restarts": len(events("worker_restarted")),
    "end": (events("end") or [{}])[-1].get("reason"),
    "committed_per_epoch": per_epoch,
    "last_step": steps[-1]["step"] if steps else 0,
    "last_checkpoint": (events("checkpoint") or [{}])[-1].get("step"),
}))
