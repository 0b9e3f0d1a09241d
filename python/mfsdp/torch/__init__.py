"""
mfsdp.torch: drive libmfsdp from a torch training loop (needs torch).

    import mfsdp, mfsdp.torch as mt
    spec = mt.spec_from_module(model, mesh={"dp_outer": 2, "dp_inner": 2}, layout="hfsdp",
                               microbatches=M)
    sm = mt.shard(model, mfsdp.Schedule.compile(spec), backend="mpi")
    opt = torch.optim.AdamW(sm.main_parameters(), lr=3e-4)

See docs/pytorch.md.
"""
from .shard import ModelMismatchError, ShardedModel, device_mesh, shard
from .spec import (LAYOUT_NAMES, default_units, hidden_matrices, layout_block, plan_units,
                   spec_from_module)
from .tensors import tensor
from .naming import expert_names, split
from .offload import CPUOffloadPolicy, OffloadReport   # torch's own when it has it
from .fully_shard import FullyShardedModel, fully_shard
from .policy import MixedPrecisionPolicy

__all__ = ["spec_from_module", "shard", "ShardedModel", "ModelMismatchError", "tensor",
           "plan_units", "layout_block", "LAYOUT_NAMES", "fully_shard", "FullyShardedModel",
           "MixedPrecisionPolicy"]
__all__ += ["CPUOffloadPolicy", "OffloadReport"]   # offload.py
__all__ += ["default_units"]                         # spec.py: one unit per block
__all__ += ["device_mesh"]                           # shard.py: mt.device_mesh(sm)
__all__ += ["hidden_matrices"]                       # spec.py: matrix_optimizer="whole"'s share
__all__ += ["expert_names", "split"]                # naming.py: global_names= values
