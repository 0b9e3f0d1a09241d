"""
test_migration: every example of docs/pytorch.md's "Coming from FSDP2: call
by call" runs, as written, on 4 MPI ranks in one mpirun (migration_worker.py,
in a fresh working directory): the complete script (fully_shard with torch's
MixedPrecisionPolicy, the loop, sm.clip_grad_norm_, the full state dict, a
DCP checkpoint saved and loaded into a fresh model; it asserts that the loss
halves and that the loaded weights equal the saved ones) and the refused
FSDP2 calls. Every python block of the section must carry the marker, so an
example cannot be added without running here.
"""
import os

import pytest

import conftest
import migration_worker
import mfsdp

DOCS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "docs", "pytorch.md")


def test_every_example_is_marked():
    found = migration_worker.examples(DOCS)
    assert len(found) >= 2, found
    unmarked = [line for line, _, marked in found if not marked]
    assert not unmarked, "docs/pytorch.md lines %s: examples without the marker" % unmarked
    assert any("save_dcp" in code and "load_dcp" in code for _, code, _ in found)


@pytest.mark.skipif(not mfsdp.backend_available("mpi"),
                    reason="libmfsdp built without the MPI backend")
def test_examples_run_on_4_ranks(tmp_path):
    port = conftest.free_port()
    env = conftest.env()
    env["MFSDP_CACHE_DIR"] = str(tmp_path / "cache")
    cmd = conftest.mpirun() + [conftest.sys.executable,
                               os.path.join(conftest.HERE, "migration_worker.py"),
                               os.path.abspath(DOCS), str(port)]
    p = conftest.subprocess.run(cmd, env=env, cwd=str(tmp_path), capture_output=True, text=True,
                                timeout=120)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    print(p.stdout)
    lines = [line for line, _, _ in migration_worker.examples(DOCS)]
    for line in lines:
        assert "example at line %d: ok" % line in p.stdout, p.stdout
    assert os.path.isdir(tmp_path / "ckpt-step8")          # the script's DCP checkpoint
