# Experiment: can NCCL join two ranks on ONE GPU when each process claims another
# host (NCCL_HOSTID)?  NCCL refuses two ranks of one communicator on one GPU of one
# host ("Duplicate GPU detected"); its check compares the host hash, which NCCL_HOSTID
# sets.  If this works, the cross-host NCCL path (net transport over loopback sockets)
# can be exercised on the one-GPU H200 kind.
# Run: python gpu/dev/nccl_hostid_probe.py   (one CUDA GPU; prints per-rank results)
import os, sys, time, torch, torch.distributed as dist, torch.multiprocessing as mp
def run(rank):
    os.environ["NCCL_HOSTID"] = f"tandem-probe-host-{rank}"
    os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")
    os.environ["NCCL_NVLS_ENABLE"] = "0"
    dist.init_process_group("nccl", init_method="tcp://127.0.0.1:29517", rank=rank, world_size=2,
                            device_id=torch.device("cuda:0"))
    x = torch.full((1 << 24,), float(rank + 1), device="cuda:0")
    t0 = time.time()
    if rank == 0:
        dist.send(x, 1)
    else:
        dist.recv(x, 0)
    torch.cuda.synchronize()
    dt = time.time() - t0
    y = torch.ones(4, device="cuda:0") * (rank + 1)
    dist.all_reduce(y)
    torch.cuda.synchronize()
    # timed second send of 512 MB
    big = torch.empty(256 << 20, dtype=torch.bfloat16, device="cuda:0")
    for i in range(3):
        torch.cuda.synchronize(); t0 = time.time()
        if rank == 0: dist.send(big, 1)
        else: dist.recv(big, 0)
        torch.cuda.synchronize(); dt2 = time.time() - t0
        print(f"rank {rank} 512MB p2p {dt2*1e3:.1f} ms", flush=True)
    print(f"rank {rank}: recv ok={x[0].item()} allreduce={y[0].item()} first p2p {dt*1e3:.1f} ms", flush=True)
    dist.destroy_process_group()
if __name__ == "__main__":
    mp.spawn(run, nprocs=2)
