"""
test_example: the training script of docs/pytorch.md (example_train.py) runs
as is on 4 MPI ranks and its loss goes down.
"""
import pytest

import conftest
import mfsdp


@pytest.mark.skipif(not mfsdp.backend_available("mpi"), reason="no MPI backend")
def test_documented_example_trains():
    """docs/pytorch.md's script runs as is and its loss goes down."""
    p = conftest.run_ranks("example_train.py", [], timeout=240)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    first, last = [float(l.split()[-1]) for l in p.stdout.splitlines() if l.startswith("step ")]
    assert last < 0.9 * first, (first, last)
