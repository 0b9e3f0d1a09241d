"""
example_train: the training script of docs/pytorch.md, runnable as is:

    PYTHONPATH=tests/python mpirun -np 4 python tests/python/example_train.py

Trains the GPT of gpt.py through mfsdp (HFSDP on a 2 x 2 mesh, 3 microbatches,
AdamW, gradients clipped to global norm 1.0) and prints the loss of the
first and the last step (averaged over the ranks) on rank 0; then saves the
full parameters that rank 0 gathers to $MFSDP_EXAMPLE_SAVE when set.
"""
import os

import torch

import mfsdp
import mfsdp.torch as mt
from gpt import make_data, make_model   # tests/python/gpt.py: a small GPT

M, steps = 3, 10
model = make_model()                         # tied embedding / LM head, 4 blocks, final norm
spec = mt.spec_from_module(model, mesh={"dp_outer": 2, "dp_inner": 2}, layout="hfsdp",
                           microbatches=M)   # .mfsdp text
sched = mfsdp.Schedule.compile(spec)         # or mfsdp.Schedule.load("model.yaml")
sm = mt.shard(model, sched, backend="mpi")   # parameters become views of the runtime's weights
opt = torch.optim.AdamW(sm.main_parameters(), lr=3e-3)   # this rank's fp32 master shards

rank = sm.runtime.rank
X, Y = make_data(steps, 4, M, 2)             # [step][rank][microbatch] token batches
for s in range(steps):
    total = 0.0
    for m in range(M):
        loss = model(X[s, rank, m], Y[s, rank, m])
        (loss / M).backward()                # hooks fire; step_end runs in the last backward
        total += loss.item()
    sm.clip_grad_norm_(1.0)                  # global norm over every rank's shards
    opt.step()
    opt.zero_grad()
    mean = sm.mean_over_ranks(total / M)     # collective: every rank calls it
    if rank == 0 and s in (0, steps - 1):
        print("step %d: loss %.4f" % (s, mean))
full = sm.full_state_dict()                  # {name: whole tensor} on rank 0, {} elsewhere
if rank == 0 and os.environ.get("MFSDP_EXAMPLE_SAVE"):
    torch.save(full, os.environ["MFSDP_EXAMPLE_SAVE"])
sm.close()
