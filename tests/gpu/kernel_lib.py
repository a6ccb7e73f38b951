"""Builds and loads one of Tandem's CUDA kernels, with a small C shim of the harness's,
as a shared library for ctypes (tests/gpu/*_harness.py).

The library is rebuilt whenever the shim or any file of gpu/kernels/ changed since it was
built (a content hash, not timestamps), so a harness never tests a stale kernel: the GPU
hosts keep ignored build folders between calls.  It goes to ROOT/build-harness/<name>/, or
to /tmp/tandem-harness/<name>/ when the repository is not writable.
"""
import ctypes
import hashlib
import os
import pathlib
import subprocess

ROOT = pathlib.Path(__file__).resolve().parents[2]
KERNELS = ROOT / "gpu" / "kernels"


def nvcc():
    """The nvcc of the CUDA toolkit PyTorch found, else the one on PATH."""
    try:
        from torch.utils.cpp_extension import CUDA_HOME
        if CUDA_HOME:
            return str(pathlib.Path(CUDA_HOME) / "bin" / "nvcc")
    except Exception:
        pass
    return "nvcc"


def _digest(shim, sources):
    h = hashlib.sha256(shim.encode())
    for p in sorted(set(KERNELS.glob("*")) | {pathlib.Path(s) for s in sources}):
        if p.is_file():
            h.update(p.name.encode())
            h.update(p.read_bytes())
    return h.hexdigest()


def _folder(name):
    here = ROOT / "build-harness" / name
    try:
        here.mkdir(parents=True, exist_ok=True)
        if os.access(here, os.W_OK):
            return here
    except OSError:
        pass
    there = pathlib.Path("/tmp/tandem-harness") / name
    there.mkdir(parents=True, exist_ok=True)
    return there


def load(name, shim, sources):
    """The library `lib<name>.so` of `shim` (CUDA C++ source text) and `sources` (paths of
    .cu files), built for sm_90a with the CUDA runtime linked statically."""
    folder = _folder(name)
    lib = folder / f"lib{name}.so"
    stamp = folder / "sources.sha256"
    # The build's sm_90a define (gpu/CMakeLists.txt): host code then picks the wgmma forms.
    flags = ["-gencode=arch=compute_90a,code=sm_90a", "-DTANDEM_KERNELS_SM90A=1"]
    digest = _digest(shim + "\n// " + " ".join(flags), sources)
    if not lib.exists() or not stamp.exists() or stamp.read_text() != digest:
        (folder / "shim.cu").write_text(shim)
        cmd = [nvcc(), "-std=c++17", "-O3", "-shared", "-Xcompiler", "-fPIC",
               *flags, "-cudart", "static", f"-I{ROOT}",
               str(folder / "shim.cu"), *[str(s) for s in sources], "-o", str(lib)]
        print(" ".join(cmd), flush=True)
        subprocess.run(cmd, check=True)
        stamp.write_text(digest)
    return ctypes.CDLL(str(lib))


def forms(name, source, old=None):
    """The (label, library name, source) of each form a harness's --bench --old compares:
    this source, then `old` (another version of the same .cu file) under its own library."""
    return [("this", name, source)] + ([("old", f"{name}_old", old)] if old else [])
