#!/usr/bin/env python3
"""Checks every `#include "..."` in the repository against Tandem's layer table.

    python3 tests/layers/check_layers.py [REPO_ROOT]

Each source file belongs to one layer (the longest matching path prefix in
LAYERS); a layer may include only itself and the layers it names in ALLOWED,
directly or through them (the transitive closure).  The table mirrors the
CMake targets (gpu/CMakeLists.txt: one static library per folder, each linking
only the layers below it; bench/CMakeLists.txt; actors/; tools/):

    messages                                   protocols, descriptors (CAF only)
    gpu/kernels                                CUDA kernels (no LibTorch, no project headers)
    gpu/pch.hpp                                the precompiled LibTorch headers
    gpu/device   < messages, kernels, pch      errors, shape text, probe, runtime, env modes
    gpu/io       < device                      safetensors, config.json
    gpu/nccl     < device                      communicator, flat gradient bucket
    gpu/transport< nccl                        payload handles, peer copies, NCCL send/recv
    gpu/data     < io                          shards, order, packer, staging
    gpu/models   < io, kernels                 Qwen3, DFlash, the objective, FLOP counts
    gpu/engine   < models, data, transport     engines, graphs, AdamW, checkpoints
    gpu/decode   < engine                      KV-cache decoding, speculative decoding, eval, export
    gpu/dev      < engine                      experiments (never included)
    bench        < decode                      the `tandem bench` harness
    launch       < gpu's facades               run config, launch plan (no CAF, no torch)
    actors       < messages, launch + facades  (torch-free: FACADES only)
    tools        < actors, launch, bench + facades
    tests        anything

So models never reach the engine, nothing in gpu/ or actors/ includes bench/,
and a file in gpu/ outside every layer folder (a loose file at the root) is an
error.  Quoted includes that name no file in the repository (generated headers
such as build_info.hpp) are resolved beside the including file or skipped.
Prints one line per violation and exits 1 when there is any, 0 otherwise.

    python3 tests/layers/check_layers.py --self-test

runs the check on a scratch tree that breaks each rule once and exits 0 only
when every break is reported (the check can fail).
"""

import os
import re
import subprocess
import sys
import tempfile

# Layer of a file: the longest prefix that matches its repository path.
LAYERS = {
    "messages/": "messages",
    "gpu/kernels/": "gpu/kernels",
    "gpu/pch.hpp": "gpu/pch",
    "gpu/device/": "gpu/device",
    "gpu/io/": "gpu/io",
    "gpu/nccl/": "gpu/nccl",
    "gpu/transport/": "gpu/transport",
    "gpu/data/": "gpu/data",
    "gpu/models/": "gpu/models",
    "gpu/engine/": "gpu/engine",
    "gpu/decode/": "gpu/decode",
    "gpu/dev/": "gpu/dev",
    "bench/": "bench",
    "launch/": "launch",
    "actors/": "actors",
    "tools/": "tools",
    "tests/": "tests",
}

# Direct dependencies of each layer (closed transitively below).
ALLOWED = {
    "messages": [],
    "gpu/kernels": [],
    "gpu/pch": [],
    "gpu/device": ["messages", "gpu/kernels", "gpu/pch"],
    "gpu/io": ["gpu/device"],
    "gpu/nccl": ["gpu/device"],
    "gpu/transport": ["gpu/nccl"],
    "gpu/data": ["gpu/io"],
    "gpu/models": ["gpu/io", "gpu/kernels"],
    "gpu/engine": ["gpu/models", "gpu/data", "gpu/transport"],
    "gpu/decode": ["gpu/engine"],
    "gpu/dev": ["gpu/engine"],
    "bench": ["gpu/decode"],
    "launch": ["facades"],
    "actors": ["messages", "launch", "facades"],
    "tools": ["actors", "launch", "bench", "facades"],
    "tests": list(set(LAYERS.values()) - {"tests"}) + ["facades"],
}

# The torch-free headers of gpu/ that actors/ and tools/ may include (their
# targets do not even have LibTorch on the include path).
FACADES = {
    "gpu/engine/drafter_engine.hpp",
    "gpu/engine/target_engine.hpp",
    "gpu/engine/prefetch_engine.hpp",
    "gpu/engine/checkpoint.hpp",
    "gpu/decode/eval.hpp",
    "gpu/device/runtime.hpp",
    "gpu/device/probe.hpp",
    "gpu/device/error.hpp",
    "gpu/data/dataset.hpp",
    "gpu/nccl/communicator.hpp",
    "gpu/transport/transport.hpp",
    "gpu/transport/link.hpp",
}

SOURCE = re.compile(r"\.(c|cc|cpp|cxx|h|hh|hpp|cu|cuh|in)$")
INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)


def layer_of(path):
    best = None
    for prefix, layer in LAYERS.items():
        if (path == prefix or path.startswith(prefix)) and (best is None or len(prefix) > len(best[0])):
            best = (prefix, layer)
    return best[1] if best else None


def closure(layer):
    seen, todo = set(), [layer]
    while todo:
        for dep in ALLOWED.get(todo.pop(), []):
            if dep not in seen:
                seen.add(dep)
                todo.append(dep)
    return seen | {layer}


def tracked_files(root):
    try:
        top = subprocess.run(["git", "-C", root, "rev-parse", "--show-toplevel"],
                             check=True, capture_output=True, text=True).stdout.strip()
        if os.path.realpath(top) != os.path.realpath(root):
            raise OSError("not the root of a git work tree")
        out = subprocess.run(["git", "-C", root, "ls-files", "-co", "--exclude-standard"],
                             check=True, capture_output=True, text=True).stdout
        return [f for f in out.splitlines() if os.path.isfile(os.path.join(root, f))]
    except (OSError, subprocess.CalledProcessError):
        files = []
        for d, dirs, names in os.walk(root):
            dirs[:] = [x for x in dirs if not x.startswith(".") and not x.startswith("build")]
            files += [os.path.relpath(os.path.join(d, n), root) for n in names]
        return files


def check(root):
    files = set(tracked_files(root))
    errors, checked = [], 0
    for path in sorted(files):
        if not SOURCE.search(path) or path.startswith("build"):
            continue
        top = path.split("/", 1)[0]
        layer = layer_of(path)
        if top == "gpu" and layer is None:
            errors.append(f"{path}: in gpu/ but in no layer folder (gpu/CMakeLists.txt lists them)")
            continue
        if layer is None:
            continue
        allowed = closure(layer)
        with open(os.path.join(root, path), encoding="utf-8", errors="replace") as f:
            text = f.read()
        for m in INCLUDE.finditer(text):
            inc = m.group(1)
            line = text.count("\n", 0, m.start()) + 1
            target = inc
            if inc not in files:
                beside = os.path.normpath(os.path.join(os.path.dirname(path), inc))
                if beside in files:
                    target = beside
                elif layer_of(inc) is None:
                    continue  # generated (build_info.hpp, git_commit.hpp) or a system header
            checked += 1
            to = layer_of(target)
            if to is None:
                continue
            if "facades" in ALLOWED.get(layer, []) and target in FACADES:
                continue
            if to not in allowed:
                why = "a layer above or beside its own"
                if to == "bench":
                    why = "bench/ (nothing in gpu/ or actors/ includes the benchmarks)"
                elif to.startswith("gpu/") and layer in ("actors", "tools"):
                    why = "not one of gpu/'s torch-free facades"
                errors.append(f"{path}:{line}: [{layer}] includes \"{inc}\" [{to}]: {why}")
    return errors, checked


def self_test():
    """Each entry: a file and its one include, which the check must refuse."""
    bad = {
        "gpu/models/m.cpp": "gpu/engine/e.hpp",     # a model reaching the engine
        "gpu/io/i.cpp": "gpu/models/m.hpp",         # a layer above
        "gpu/engine/e.cpp": "bench/b.hpp",          # training reaching the bench
        "actors/a.cpp": "gpu/engine/adamw.hpp",     # not a facade
        "actors/b.cpp": "bench/b.hpp",              # actors reaching the bench
        "gpu/loose.cpp": "gpu/device/error.hpp",    # a file at gpu/'s root
        "launch/l.cpp": "messages/m.hpp",           # the launch plan reaching CAF
    }
    good = {"gpu/engine/f.cpp": "gpu/models/m.hpp", "actors/c.cpp": "gpu/engine/drafter_engine.hpp",
            "tools/t.cpp": "bench/b.hpp", "bench/c.cpp": "gpu/engine/e.hpp"}
    headers = ["messages/m.hpp", "gpu/engine/e.hpp", "gpu/models/m.hpp", "bench/b.hpp", "gpu/engine/adamw.hpp",
               "gpu/device/error.hpp", "gpu/engine/drafter_engine.hpp"]
    with tempfile.TemporaryDirectory() as root:
        for path, inc in list(bad.items()) + list(good.items()) + [(h, None) for h in headers]:
            os.makedirs(os.path.join(root, os.path.dirname(path)), exist_ok=True)
            with open(os.path.join(root, path), "w") as f:
                f.write(f'#include "{inc}"\n' if inc else "#pragma once\n")
        errors, _ = check(root)
    reported = {e.split(":", 1)[0] for e in errors}
    missed = sorted(set(bad) - reported)
    wrong = sorted(reported - set(bad))
    for e in errors:
        print("expected: " + e)
    if missed or wrong:
        print(f"check_layers --self-test: FAILED (missed {missed}, wrongly refused {wrong})")
        return 1
    print(f"check_layers --self-test: all {len(bad)} breaks reported, {len(good)} good includes accepted")
    return 0


def main():
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                           os.path.join(os.path.dirname(__file__), "..", ".."))
    errors, checked = check(root)
    for e in errors:
        print(e)
    print(f"check_layers: {checked} includes checked, {len(errors)} violation(s)")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
