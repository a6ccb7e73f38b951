"""How much of a memory-bound optimizer pass hides behind compute-bound GEMMs
on another stream (H200, bf16 GEMMs of the drafter's forward shapes, fused
AdamW over 1.05e9 fp32 parameters).  Prints alone / together times: the
question behind deferring the drafter's update into the next step's forward
(docs/bench.md).  Throwaway: python3 gpu/dev/overlap_probe.py"""
import torch

dev = "cuda"
torch.manual_seed(0)
# The drafter forward's GEMMs, one layer: q/o 8192x4096x4096, gate/up 8192x24576x4096, down 8192x4096x12288.
x = torch.randn(8192, 4096, device=dev, dtype=torch.bfloat16)
h = torch.randn(8192, 12288, device=dev, dtype=torch.bfloat16)
w_q = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)
w_gu = torch.randn(24576, 4096, device=dev, dtype=torch.bfloat16)
w_d = torch.randn(4096, 12288, device=dev, dtype=torch.bfloat16)


def gemms(layers):
    for _ in range(layers):
        torch.mm(x, w_q.t()); torch.mm(x, w_q.t()); torch.mm(x, w_gu.t()); torch.mm(h, w_d.t())


n = 1_050_000_000
chunks = 8
ps = [torch.randn(n // chunks, device=dev) for _ in range(chunks)]
gs = [torch.randn_like(p) for p in ps]
ms = [torch.zeros_like(p) for p in ps]
vs = [torch.zeros_like(p) for p in ps]
steps = [torch.tensor(1.0, device=dev) for _ in ps]


def adamw():
    torch._fused_adamw_(ps, gs, ms, vs, [], steps, lr=1e-4, beta1=0.9, beta2=0.95, weight_decay=0.0,
                        eps=1e-8, amsgrad=False, maximize=False)


def timed(fn, stream=None, reps=5):
    ts = []
    for _ in range(reps):
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); fn(); b.record(); torch.cuda.synchronize(); ts.append(a.elapsed_time(b))
    return sorted(ts)[len(ts) // 2]


for prio_main, prio_side in ((0, 0), (-1, 0)):
    main = torch.cuda.Stream(priority=prio_main)
    side = torch.cuda.Stream(priority=prio_side)

    def both(layers=2):
        cur = torch.cuda.current_stream()
        main.wait_stream(cur); side.wait_stream(cur)
        with torch.cuda.stream(main):
            gemms(layers)
        with torch.cuda.stream(side):
            adamw()
        cur.wait_stream(main); cur.wait_stream(side)

    def g_only():
        gemms(2)

    t_g = timed(g_only)
    t_a = timed(adamw)
    t_b = timed(both)
    print(f"priorities main {prio_main} side {prio_side}: gemms {t_g:.2f} ms, adamw {t_a:.2f} ms, "
          f"serial {t_g + t_a:.2f}, together {t_b:.2f} ms: hidden {(t_g + t_a - t_b) / t_a * 100:.0f}% of the update",
          flush=True)
