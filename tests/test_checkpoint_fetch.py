"""``trainwell.checkpoint.fetch``: processes whose disk lacks the checkpoint receive it from the source over a gloo
process group, checked against the manifest. Three processes (spawned, gloo on CPU): process 0 on disk A, processes
1 and 2 on disk B, so one of them receives for both; then a file changed on process 0's disk after its manifest was
written, which no process publishes and all report with the same error; then a disk every process shares, where
nothing is sent. The end-to-end resume on two simulated nodes is tests/test_multinode.py's."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch.multiprocessing as mp

WORLD = 3


def _checkpoint(folder: Path) -> None:
    """A checkpoint-like folder with its manifest: a file over two broadcast chunks, a nested one, an empty one."""
    from trainwell.checkpoint import fetch, manifest

    folder.mkdir(parents=True)
    (folder / "big.bin").write_bytes(os.urandom(2 * fetch.CHUNK + 123))
    (folder / "sub").mkdir()
    (folder / "sub" / "small.json").write_text('{"a": 1}')
    (folder / "empty.txt").write_bytes(b"")
    manifest.write(folder, manifest.build(folder, []))


def _worker(rank: int, root: str) -> None:
    import torch.distributed as dist

    from trainwell.checkpoint import fetch

    dist.init_process_group("gloo", init_method=f"file://{root}/store", rank=rank, world_size=WORLD)
    root_path = Path(root)
    disk = root_path / ("A" if rank == 0 else "B")

    def gather(obj):
        out = [None] * WORLD
        dist.all_gather_object(out, obj)
        return out

    def run(name: str, shared: bool = False):
        here = (root_path / "A" if shared else disk) / name
        try:
            fetched = fetch.fetch_missing(True, lambda: str(here) if here.is_dir() else None, lambda path: str(here),
                                          gather)
            return {"fetched": fetched}
        except ValueError as err:
            return {"error": str(err)}

    results = {"lacking": run("checkpoint-4")}
    sent = root_path / "B" / "checkpoint-4"
    results["files"] = sorted(str(p.relative_to(sent)) for p in sent.rglob("*")) if sent.is_dir() else None
    results["same"] = (sent / "big.bin").read_bytes() == (root_path / "A" / "checkpoint-4" / "big.bin").read_bytes()
    results["changed"] = run("checkpoint-6")
    results["changed_published"] = (root_path / "B" / "checkpoint-6").exists()
    results["shared"] = run("checkpoint-4", shared=True)
    (root_path / f"rank{rank}.json").write_text(json.dumps(results))
    dist.destroy_process_group()


@pytest.mark.distributed
def test_a_checkpoint_reaches_the_disks_that_lack_it_checked_against_its_manifest(tmp_path):
    from trainwell.checkpoint import manifest

    _checkpoint(tmp_path / "A" / "checkpoint-4")
    _checkpoint(tmp_path / "A" / "checkpoint-6")
    changed = tmp_path / "A" / "checkpoint-6" / "sub" / "small.json"
    changed.write_text('{"a": 2}')  # the same size, other bytes: after its manifest was written
    (tmp_path / "B").mkdir()
    mp.spawn(_worker, args=(str(tmp_path),), nprocs=WORLD, join=True)
    results = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(WORLD)]

    fetched = [r["lacking"].get("fetched") for r in results]
    assert fetched[0] is None and fetched[1] == fetched[2] == str(tmp_path / "B" / "checkpoint-4")
    assert results[1]["files"] == ["big.bin", manifest.MANIFEST_NAME, "empty.txt", "sub", "sub/small.json"]
    assert results[1]["same"] and manifest.problem(tmp_path / "B" / "checkpoint-4") is None
    assert not list((tmp_path / "B").glob(".*"))  # no temporary folder or probe file left

    errors = {r["changed"].get("error") for r in results}
    assert len(errors) == 1, errors  # every process stops with the same error
    (error,) = errors
    assert "sub/small.json arrived with other bytes than its checksum in the manifest" in str(error)
    assert not any(r["changed_published"] for r in results)

    assert all(r["shared"] == {"fetched": None} for r in results)  # a disk every process sees: nothing sent
