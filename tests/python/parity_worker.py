"""
parity_worker: one MPI rank of the parity runs (mpirun -np 4). For each
config named on the command line it trains through mfsdp and writes
OUT/<config>.rank<r>.pt with its losses and master shards; the checker
(test_parity.py) merges the ranks and compares with the reference.

    mpirun -np 4 python parity_worker.py OUT hfsdp:3:adamw:fp32 ...
"""
import os
import sys
import time

import torch

import train

torch.set_num_threads(1)


def parse(arg):
    layout, M, opt, dtype, *rest = arg.split(":")
    ckpt = tuple(int(i) for i in rest[0].split(",")) if rest and rest[0] else ()
    return {"layout": layout, "M": int(M), "opt": opt, "dtype": dtype, "ckpt": ckpt,
            "steps": int(os.environ.get("MFSDP_TEST_STEPS", "10")), "b": 2}


def main():
    out = sys.argv[1]
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMI_RANK", "0")))
    for arg in sys.argv[2:]:
        c = parse(arg)
        t0 = time.perf_counter()
        losses, shards, sm = train.mfsdp_train(c, rank)
        sm.close()
        torch.save({"config": c, "losses": losses, "shards": shards,
                    "seconds": time.perf_counter() - t0},
                   os.path.join(out, "%s.rank%d.pt" % (train.config_name(c), rank)))


if __name__ == "__main__":
    main()
