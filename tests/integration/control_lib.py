"""Shared by the control endpoint's integration tests (control, control_actions, observe,
dashboard): the check counter, metrics.jsonl's lines, and a work folder holding the tiny
run of run_test.toml (its data set and config)."""
import json
import os
import subprocess
import tempfile

here = os.path.dirname(os.path.abspath(__file__))


class Checks:
    """check(ok, what): counts a pass, or records and prints a failure."""

    def __init__(self):
        self.passed = 0
        self.failures = []

    def __call__(self, ok, what):
        if ok:
            self.passed += 1
        else:
            self.failures.append(what)
            print("FAILED:", what, flush=True)


def lines(path, kind=None):
    """The JSON lines of a metrics.jsonl (those of event `kind` only, when given)."""
    out = []
    if os.path.exists(path):
        for line in open(path):
            j = json.loads(line)
            if kind is None or j.get("event") == kind:
                out.append(j)
    return out


def tiny_run_folder(python, fixtures, prefix):
    """A fresh work folder with data/ (make_run_dataset.py) and run.toml (run_test.toml on the
    parity fixtures' tiny Qwen3)."""
    work = tempfile.mkdtemp(prefix=prefix)
    subprocess.run([python, os.path.join(here, "make_run_dataset.py"), os.path.join(work, "data")], check=True)
    config = open(os.path.join(here, "run_test.toml")).read().replace("@TARGET@",
                                                                     os.path.join(fixtures, "qwen3_tiny"))
    open(os.path.join(work, "run.toml"), "w").write(config)
    return work
