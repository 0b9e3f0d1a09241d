"""
dcp_worker: one rank of test_dcp.py (mpirun -np 4, gloo on 127.0.0.1 for
torch.distributed, the mpi backend for mfsdp). In one launch:

  0. before torch.distributed exists, sm.save_dcp on 4 ranks is refused;
  a. FSDP2 (fully_shard on a 1-D DeviceMesh of 4, AdamW) trains 2 steps and
     saves {"model": get_model_state_dict, "optim": get_optimizer_state_dict}
     with dcp.save; then one more step and an evaluation loss. mfsdp loads
     that DCP into 2 x 2 HFSDP and 1 x 4 ZeRO-3 (models built from another
     seed) and runs the same step and evaluation;
  b. mfsdp (2 x 2 HFSDP) trains 2 steps, sm.save_dcp and sm.save_checkpoint,
     then one more step and the evaluation; FSDP2 does dcp.load +
     set_model_state_dict + set_optimizer_state_dict and the same.

Writes OUT/<tag>.rank<r>.pt: per tensor this rank's shard offset and its
master weight, exp_avg, exp_avg_sq and step shards (mfsdp), or the full
values (FSDP2, rank 0), and the losses.

    mpirun -np 4 python dcp_worker.py OUT PORT
"""
import os
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (get_model_state_dict,
                                                     get_optimizer_state_dict,
                                                     set_model_state_dict,
                                                     set_optimizer_state_dict)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

import gpt
import mfsdp
import mfsdp.torch as mt

torch.set_num_threads(1)
M, B, WORLD = 2, 2, 4
X, Y = gpt.make_data(4, WORLD, M, B)


def adamw(params):
    return torch.optim.AdamW(params, lr=3e-3, weight_decay=0.1, foreach=False)


def step(model, rank, s):
    for m in range(M):
        (model(X[s, rank, m], Y[s, rank, m]) / M).backward()


def evaluate(model, rank, s):
    model.eval()
    with torch.no_grad():
        loss = sum(float(model(X[s, rank, m], Y[s, rank, m])) for m in range(M)) / M
    model.train()
    return loss


def fsdp2_model(seed):
    model = gpt.make_model(seed=seed)
    mesh = init_device_mesh("cpu", (WORLD,))
    for blk in model.blocks:
        fully_shard(blk, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def fsdp2_full(model, opt):
    """{name: {"main", "exp_avg", "exp_avg_sq", "step"}} as whole tensors."""
    out = {}
    for name, p in model.named_parameters():
        st = opt.state[p]
        out[name] = {"main": p.full_tensor().detach().clone(),
                     "exp_avg": st["exp_avg"].full_tensor().clone(),
                     "exp_avg_sq": st["exp_avg_sq"].full_tensor().clone(),
                     "step": st["step"].clone()}
    return out


def fsdp2_rest(model, opt, rank):
    """One more step, then the evaluation loss (mean over ranks)."""
    step(model, rank, 2)
    opt.step()
    opt.zero_grad()
    t = torch.tensor([evaluate(model, rank, 3)], dtype=torch.float64)
    dist.all_reduce(t)
    return float(t[0]) / WORLD


def mfsdp_model(layout, mesh, seed):
    model = gpt.make_model(seed=seed)
    spec = mt.spec_from_module(model, mesh=mesh, layout=layout, microbatches=M)
    sched = mfsdp.Schedule.compile(spec)
    return model, sched, mt.shard(model, sched, backend="mpi", timeout_ms=60000)


def mfsdp_dump(sm, opt):
    return {name: {"offset": off, "main": mp.detach().clone(),
                   "exp_avg": opt.state[mp]["exp_avg"].clone(),
                   "exp_avg_sq": opt.state[mp]["exp_avg_sq"].clone(),
                   "step": opt.state[mp]["step"].clone()} for name, off, mp in sm.shards()}


def mfsdp_rest(sm, model, opt, rank):
    step(model, rank, 2)
    opt.step()
    opt.zero_grad()
    return sm.mean_over_ranks(evaluate(model, rank, 3))


def main():
    out, port = sys.argv[1], sys.argv[2]
    rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
    save = lambda tag, obj: torch.save(obj, os.path.join(out, "%s.rank%d.pt" % (tag, rank)))

    # 0. save_dcp on 4 ranks without torch.distributed
    model, _, sm = mfsdp_model("hfsdp", {"dp_outer": 2, "dp_inner": 2}, 0)
    try:
        sm.save_dcp(os.path.join(out, "never"))
        refused = None
    except mfsdp.UsageError as e:
        refused = str(e)
    save("nodist", {"message": refused, "exists": os.path.exists(os.path.join(out, "never"))})
    sm.close()
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%s" % port, rank=rank,
                            world_size=WORLD)

    # a. FSDP2 saves, mfsdp loads
    model = fsdp2_model(0)
    opt = adamw(model.parameters())
    for s in range(2):
        step(model, rank, s)
        opt.step()
        opt.zero_grad()
    sd = {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, opt)}
    dcp.save(sd, checkpoint_id=os.path.join(out, "fsdp2"))
    full = fsdp2_full(model, opt)
    loss = fsdp2_rest(model, opt, rank)
    if rank == 0:
        save("fsdp2_saved", {"full": full, "loss": loss})
    del model, opt, sd
    for layout, mesh in (("hfsdp", {"dp_outer": 2, "dp_inner": 2}), ("zero3", {"dp": 4})):
        model, _, sm = mfsdp_model(layout, mesh, 5)
        opt = adamw(sm.main_parameters())
        sm.load_dcp(os.path.join(out, "fsdp2"), opt, batch_bytes=40000)
        dump = mfsdp_dump(sm, opt)
        save("load_" + layout, {"tensors": dump, "loss": mfsdp_rest(sm, model, opt, rank)})
        sm.close()

    # b. mfsdp saves, FSDP2 loads
    model, sched, sm = mfsdp_model("hfsdp", {"dp_outer": 2, "dp_inner": 2}, 0)
    opt = adamw(sm.main_parameters())
    for s in range(2):
        step(model, rank, s)
        opt.step()
        opt.zero_grad()
    sm.save_dcp(os.path.join(out, "mfsdp"), opt)
    sm.save_checkpoint(os.path.join(out, "mfsdp_ck"), opt)
    if rank == 0:
        with open(os.path.join(out, "hfsdp.yaml"), "wb") as f:
            f.write(sched.text if isinstance(sched.text, bytes) else sched.text.encode())
    save("mfsdp_saved", {"tensors": mfsdp_dump(sm, opt), "loss": mfsdp_rest(sm, model, opt, rank)})
    sm.close()
    model = fsdp2_model(5)
    opt = adamw(model.parameters())
    sd = {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, opt)}
    dcp.load(sd, checkpoint_id=os.path.join(out, "mfsdp"))
    set_model_state_dict(model, sd["model"])
    set_optimizer_state_dict(model, opt, sd["optim"])
    full = fsdp2_full(model, opt)
    loss = fsdp2_rest(model, opt, rank)
    if rank == 0:
        save("fsdp2_loaded", {"full": full, "loss": loss})
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
