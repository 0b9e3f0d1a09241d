"""
test_dead_rank: a rank that stops calling hooks makes its peers raise
mfsdp.MfsdpError with the library's timeout message, within the runtime's
timeout, instead of hanging (the whole run is bounded by the subprocess timeout).
"""
import os
import time

import pytest

import conftest
import mfsdp


@pytest.mark.skipif(not mfsdp.backend_available("mpi"), reason="no MPI backend")
def test_dead_rank_raises_on_peers(tmp_path):
    t0 = time.monotonic()
    p = conftest.run_ranks("dead_rank_worker.py", [str(tmp_path)], timeout=240)
    elapsed = time.monotonic() - t0
    # The stopped rank (2) may be ended by mpirun once its peers have exited:
    # only the survivors must report.
    survivors = []
    for r in (0, 1, 3):
        path = tmp_path / ("rank%d.txt" % r)
        assert path.exists(), "rank %d reported nothing (%.0f s): %s" % (
            r, elapsed, (p.stdout + p.stderr)[-3000:])
        survivors.append(path.read_text())
    print(survivors)
    for text in survivors:
        assert text.startswith(("MFSDP_ERR_TIMEOUT:", "MFSDP_ERR_ABORTED:")), text
    assert any("timed out after 2000 ms" in t for t in survivors), survivors

