"""What a set of page-locked host buffers for the 8B drafter's snapshot
costs (masters + both AdamW moments, fp32, ~12.6 GB), allocated four ways,
and whether allocating them on another thread slows GPU work running
meanwhile.  One JSON line a measurement on stdout.

    python gpu/dev/pinned_probe.py [--layers 5] [--reps 2]

  per_tensor      torch.empty(pin_memory=True) per tensor: PyTorch's caching
                  host allocator (what DrafterEngine::free_host_set does today;
                  each block rounded up to a power of two)
  one_block       one cudaHostAlloc of the exact total, tensors as views
  register        anonymous mmap, pages touched, then cudaHostRegister (the
                  touch and the registration timed apart)
  d2h             the snapshot copy itself (device -> each kind), GB/s
  overlap         a bf16 GEMM loop on the main thread, alone and while another
                  thread does one_block: ms per GEMM each way
"""
import argparse, ctypes, glob, json, mmap, os, threading, time
import torch


def drafter_shapes(layers, d=4096, heads=32, kv=8, hd=128, inter=12288, taps=5):
    s = [(d, taps * d), (d,)]  # fc over the taps, hidden norm
    for _ in range(layers):
        s += [(heads * hd, d), (kv * hd, d), (kv * hd, d), (d, heads * hd), (hd,), (hd,),
              (inter, d), (inter, d), (d, inter), (d,), (d,)]
    s += [(d,)]
    return s


def cudart():
    sp = os.path.dirname(torch.__file__)
    for pat in [sp + "/lib/libcudart.so*", sp + "/../nvidia/cuda_runtime/lib/libcudart.so*",
                sp + "/../nvidia/cu13/lib/libcudart.so*"]:
        for f in sorted(glob.glob(pat)):
            try:
                return ctypes.CDLL(f)
            except OSError:
                pass
    return ctypes.CDLL("libcudart.so")


def line(**k):
    print(json.dumps(k), flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--layers", type=int, default=5)
    p.add_argument("--reps", type=int, default=2)
    a = p.parse_args()
    shapes = drafter_shapes(a.layers)
    numels = [int(torch.Size(s).numel()) for s in shapes]
    total = 3 * sum(numels) * 4
    rt = cudart()
    torch.cuda.init()
    dev = torch.empty(sum(numels), device="cuda")  # one tensor's worth on the device
    line(case="shapes", tensors=3 * len(shapes), gb=round(total / 1e9, 3))

    keep = []
    for r in range(a.reps):  # a fresh set each rep, the earlier ones kept (as two host sets are)
        t0 = time.perf_counter()
        ts = [torch.empty(s, pin_memory=True) for _ in range(3) for s in shapes]
        dt = time.perf_counter() - t0
        keep.append(ts)
        line(case="per_tensor", rep=r, s=round(dt, 3), gb_s=round(total / dt / 1e9, 2))
    # what the caching allocator reserved for them
    line(case="per_tensor_reserved_gb",
         gb=round(sum(1 << (t.numel() * 4 - 1).bit_length() for ts in keep for t in ts) / 1e9, 3))
    # d2h into the caching allocator's buffers
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for t in keep[0][: len(shapes)]:
        t.view(-1).copy_(dev[: t.numel()], non_blocking=True)
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    line(case="d2h_per_tensor", gb_s=round(total / 3 / dt / 1e9, 2))
    del keep, ts
    torch.cuda.synchronize()

    ptrs = []
    for r in range(a.reps):
        ptr = ctypes.c_void_p()
        t0 = time.perf_counter()
        rc = rt.cudaHostAlloc(ctypes.byref(ptr), ctypes.c_size_t(total), 0)
        dt = time.perf_counter() - t0
        ptrs.append(ptr)
        line(case="one_block", rep=r, rc=rc, s=round(dt, 3), gb_s=round(total / dt / 1e9, 2))
    buf = (ctypes.c_float * (total // 4)).from_address(ptrs[0].value)
    host = torch.frombuffer(buf, dtype=torch.float32)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    host[: dev.numel()].copy_(dev, non_blocking=True)
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    line(case="d2h_one_block", gb_s=round(dev.numel() * 4 / dt / 1e9, 2))
    del host, buf
    for ptr in ptrs:
        rt.cudaFreeHost(ptr)

    for r in range(a.reps):
        t0 = time.perf_counter()
        m = mmap.mmap(-1, total, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
        ctypes.memset(addr, 0, total)
        t1 = time.perf_counter()
        rc = rt.cudaHostRegister(ctypes.c_void_p(addr), ctypes.c_size_t(total), 0)
        t2 = time.perf_counter()
        line(case="register", rep=r, rc=rc, touch_s=round(t1 - t0, 3), register_s=round(t2 - t1, 3))
        rt.cudaHostUnregister(ctypes.c_void_p(addr))
        del addr
        try:
            m.close()
        except BufferError:
            pass

    # GPU work beside an allocation on another thread
    x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    def gemms(n):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            y = x @ x
            torch.cuda.synchronize()  # the drafter syncs per step: launch-bound waits show
        return 1e3 * (time.perf_counter() - t0) / n
    gemms(20)
    alone = gemms(200)
    got = {}
    def alloc():
        ptr = ctypes.c_void_p()
        t0 = time.perf_counter()
        got["rc"] = rt.cudaHostAlloc(ctypes.byref(ptr), ctypes.c_size_t(total), 0)
        got["s"] = time.perf_counter() - t0
        got["ptr"] = ptr
    th = threading.Thread(target=alloc)
    th.start()
    n, t0, worst = 0, time.perf_counter(), 0.0
    while th.is_alive():
        t = time.perf_counter()
        y = x @ x
        torch.cuda.synchronize()
        worst = max(worst, time.perf_counter() - t)
        n += 1
    dt = time.perf_counter() - t0
    th.join()
    rt.cudaFreeHost(got["ptr"])
    line(case="overlap", gemm_ms_alone=round(alone, 3), gemm_ms_beside_alloc=round(1e3 * dt / max(n, 1), 3),
         worst_gemm_ms=round(1e3 * worst, 1), gemms=n, alloc_s=round(got["s"], 3), rc=got["rc"])


if __name__ == "__main__":
    main()
