"""ignite's names on unirank's Horovod backend (real Horovod, ``scripts/setup --horovod``)."""

from __future__ import annotations

from pathlib import Path

from _procs import run_job

SCRIPT = Path(__file__).parent / "scripts" / "idist_horovod.py"


def test_idist_spawn_on_horovod(horovodrun: str) -> None:
    results = run_job(SCRIPT, timeout=180)
    assert [r["rank"] for r in results] == [0, 1]
    for r in results:
        assert r["model_name"] == "horovod-dist"
        assert r["bcast_obj"] == "x"
        assert r["bcast_safe"] == [0, 1, 2]
        assert r["gather_mixed"] == [{"r": 0}, None]
        assert r["shapes"] == [[1, 2], [2, 2]]
        assert "horovod backend has no torch.distributed process groups" in r["new_group"]
