"""
dcp_stop_worker: one rank of test_dcp_stop.py (mpirun -np 4; gloo on
127.0.0.1 for torch.distributed, the mpi backend for mfsdp, timeout_ms
6000). The ranks train one step of 2 x 2 HFSDP and save a DCP; rank 0 flips
a bit of .metadata in a copy of it. Rank 2 loads the copy, the others the good one:
every rank must refuse, none may change its master shards (OUT/agree.rank<r>.json).
Then the ranks call sm.save_dcp again and rank 3 stops itself (SIGSTOP) as
DCP's save begins, so the other ranks wait on it inside DCP's collectives.
Each surviving rank writes OUT/stop.rank<r>.json: the error's type and
message, the seconds save_dcp took and the PATH.tmp-* left in OUT then.

    mpirun -np 4 python dcp_stop_worker.py OUT PORT
"""
import json
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

import gpt
import mfsdp
import mfsdp.torch as mt

TIMEOUT_MS = 6000     # the load phase: ranks finish reading at different times


def agree(sm, opt, out, rank):
    import shutil
    sm.save_dcp(os.path.join(out, "good"), opt)
    if rank == 0:
        shutil.copytree(os.path.join(out, "good"), os.path.join(out, "bad"))
        f = os.path.join(out, "bad", ".metadata")       # read by every rank that loads it
        data = bytearray(open(f, "rb").read())
        data[len(data) // 2] ^= 1
        open(f, "wb").write(bytes(data))
    dist.barrier()
    before = [mp.detach().clone() for mp in sm.main_parameters()]
    res = {"error": None}
    try:
        sm.load_dcp(os.path.join(out, "bad" if rank == 2 else "good"), opt)
    except mfsdp.MfsdpError as e:
        res["error"] = e.message
    res["unchanged"] = all(torch.equal(a, mp.detach()) for a, mp in zip(before,
                                                                        sm.main_parameters()))
    with open(os.path.join(out, "agree.rank%d.json" % rank), "w") as f:
        json.dump(res, f)


def main():
    out, port = sys.argv[1], sys.argv[2]
    rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%s" % port, rank=rank,
                            world_size=4)
    model = gpt.make_model()
    spec = mt.spec_from_module(model, mesh={"dp_outer": 2, "dp_inner": 2}, layout="hfsdp")
    sm = mt.shard(model, mfsdp.Schedule.compile(spec), backend="mpi", timeout_ms=TIMEOUT_MS)
    opt = torch.optim.AdamW(sm.main_parameters(), lr=3e-3, foreach=False)
    X, Y = gpt.make_data(1, 4, 1, 2)
    model(X[0, rank, 0], Y[0, rank, 0]).backward()
    opt.step()
    agree(sm, opt, out, rank)
    if rank == 3:
        real = dcp.save

        def stop(*a, **kw):
            os.kill(os.getpid(), signal.SIGSTOP)
            return real(*a, **kw)
        dcp.save = stop
    t0 = time.monotonic()
    res = {"error": None}
    try:
        sm.save_dcp(os.path.join(out, "ck"), opt)
    except BaseException as e:      # noqa: BLE001 -- the test asserts which kind it is
        res = {"error": type(e).__name__, "mfsdp": isinstance(e, mfsdp.MfsdpError),
               "message": str(e)}
    res["seconds"] = time.monotonic() - t0
    res["leftover"] = [f for f in os.listdir(out) if ".tmp-" in f]   # rank 3 is still stopped
    with open(os.path.join(out, "stop.rank%d.json" % rank), "w") as f:
        json.dump(res, f)
    os._exit(0)        # rank 3 never returns: no teardown waits on it


if __name__ == "__main__":
    main()
