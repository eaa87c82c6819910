"""A file swapped while trainwell reads it: a checkpoint file is opened once, relative to its folder's descriptor,
and checked and loaded from the same bytes, so another process renaming a link or a same-size file over it in a loop
never gets its weights loaded (issue 39: before, 192 of 5,000 loads read a file outside the run)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from tests.common.timing import hang_timeout
from trainwell.checkpoint import manifest
from trainwell.checkpoint.io import read_model_weights
from trainwell.checkpoint.resume import manifest_problem

LOADS = 500

# A second process that renames its two files over ``target`` in turn, as fast as it can, until ``stop`` exists.
_SWAPPER = """
import os, sys
target, stop, first, second, kind = sys.argv[1:6]
temp = os.path.join(os.path.dirname(first), ".swap")
open(os.path.join(os.path.dirname(stop), "started"), "w").close()
while not os.path.exists(stop):
    for source in (first, second):
        if os.path.lexists(temp):  # a rename onto a link of the same file leaves its source: remove it
            os.unlink(temp)
        if kind == "link" and source == second:
            os.symlink(source, temp)
        else:
            os.link(source, temp)
        os.replace(temp, target)
"""


def _weights(value: float) -> dict[str, torch.Tensor]:
    return {"net.weight": torch.full((64, 64), value), "net.bias": torch.full((64,), value)}


@pytest.fixture
def checkpoint(tmp_path):
    """``checkpoint-2/`` with ``model.safetensors`` (all 1.0) and its manifest; ``spare/`` beside it holds a copy of
    the good file and the swapped-in one (all 7.0, the same size)."""
    folder, spare = tmp_path / "checkpoint-2", tmp_path / "spare"
    folder.mkdir()
    spare.mkdir()
    save_file(_weights(1.0), str(folder / "model.safetensors"))
    manifest.write(folder, manifest.build(folder, []))
    os.link(folder / "model.safetensors", spare / "good.safetensors")
    save_file(_weights(7.0), str(spare / "other.safetensors"))
    assert (spare / "other.safetensors").stat().st_size == (folder / "model.safetensors").stat().st_size
    return folder, spare


def _swapping(folder: Path, spare: Path, kind: str) -> subprocess.Popen:
    """Start the swapper (``kind`` "link": the good file and a link to the other one; "file": the good file and the
    other one, a regular file of the same size) and wait until it runs."""
    stop = spare / "stop"
    process = subprocess.Popen([sys.executable, "-c", _SWAPPER, str(folder / "model.safetensors"), str(stop),
                                str(spare / "good.safetensors"), str(spare / "other.safetensors"), kind])
    while not (spare / "started").exists():
        assert process.poll() is None, "the swapper ended before it started"
        time.sleep(0.01)
    return process


def _race(folder: Path, spare: Path, kind: str, check_first: bool) -> dict[str, int]:
    """``LOADS`` loads of the folder's weights while the swapper runs; how many loaded the other file's weights,
    the good ones, or were refused (any error: the file was a link, or not the manifest's)."""
    counts = {"other": 0, "good": 0, "refused": 0}
    swapper = _swapping(folder, spare, kind)
    try:
        for _ in range(LOADS):
            try:
                if check_first and manifest_problem(folder) is not None:
                    counts["refused"] += 1
                    continue
                bias = read_model_weights(folder)["net.bias"]
            except (OSError, ValueError):
                counts["refused"] += 1
                continue
            counts["other" if bias[0].item() == 7.0 else "good"] += 1
    finally:
        (spare / "stop").touch()
        swapper.wait(timeout=hang_timeout(60))
    return counts


def test_a_link_swapped_in_while_weights_load_is_never_followed(checkpoint):
    """A link to a file outside the run, renamed over ``model.safetensors`` and back in a loop: no load reads it."""
    counts = _race(*checkpoint, kind="link", check_first=False)
    assert counts["other"] == 0, counts
    assert counts["good"] > 0, counts  # the race ran: loads got through between the swaps


def test_a_same_size_file_swapped_in_after_the_checksum_is_never_loaded(checkpoint):
    """A same-size regular file renamed over ``model.safetensors`` between the manifest's check and the load: the
    load checks the bytes it loads against the manifest, so what it loads is what it checked."""
    counts = _race(*checkpoint, kind="file", check_first=True)
    assert counts["other"] == 0, counts
    assert counts["good"] > 0, counts


def test_a_loaded_file_is_opened_once_relative_to_its_folder(checkpoint, monkeypatch):
    """``read_model_weights`` opens ``model.safetensors`` once, by a name relative to a folder descriptor (not a
    path a loader opens again), and never through a link."""
    folder, _ = checkpoint
    real_open, opened = os.open, []

    def recording(path, flags, *args, **kwargs):
        opened.append((os.fspath(path), flags, kwargs.get("dir_fd")))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", recording)
    read_model_weights(folder)
    weights = [entry for entry in opened if entry[0].endswith("model.safetensors")]
    assert len(weights) == 1, opened
    name, flags, dir_fd = weights[0]
    assert name == "model.safetensors" and dir_fd is not None and flags & os.O_NOFOLLOW
