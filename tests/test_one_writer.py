"""One way to write: every file trainwell writes goes through ``trainwell.utils.safe_files`` (a fresh temporary name
created with ``O_CREAT | O_EXCL | O_NOFOLLOW``, then a rename; appends and the lock in place, refusing a link or a
non-regular file). A scan of the package's syntax trees lists every write and fails on one that bypasses it; then
the holes of issue 39: a link planted at ``task.json``, ``tokenizer.json``, ``training_args.json``, a checkpoint
file or a log, pointing at a file outside the run, is replaced or refused, and its target never written."""

from __future__ import annotations

import ast
import json
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
HELPER = "trainwell/utils/safe_files.py"

# (file, function): writes that bypass the helper on purpose, each with why. Nothing else may.
ALLOWED = {
    # ``trainwell predict --output FILE``: a file the user names, anywhere (not a run folder), opened as asked
    ("trainwell/cli/predict.py", "run"): "open",
    # /dev/null, opened to silence a library's prints
    ("trainwell/cli/__init__.py", "main"): "os.open",
    # copies of a checkpoint into a fresh private folder (mkdtemp) for Ray / Neptune to upload: each file linked,
    # or copied through ``safe_files.copy_file``
    ("trainwell/integrations/ray.py", "on_save"): "shutil.copytree",
    ("trainwell/integrations/neptune.py", "checkpoint_saved"): "shutil.copytree",
    # the libraries' own writers (save_pretrained, safetensors), called on a fresh private folder that
    # ``safe_files.staged`` renames into place
    ("trainwell/checkpoint/io.py", "_write_weights"): "save_pretrained save_model save_file",
    # contents.save_model calling itself with the staging folder of an object-store output_dir (not a writer)
    ("trainwell/checkpoint/contents.py", "save_model"): "save_model",
}

_WRITE_MODE = set("wax+")
_WRITE_FLAGS = {"O_WRONLY", "O_RDWR", "O_CREAT", "O_APPEND", "O_TRUNC"}
_HANDLE_MAKERS = {"open_for_write", "open_write", "BytesIO", "StringIO"}


def _name(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_name(node.value)}.{node.attr}"
    return ""


def _mode(call: ast.Call, position: int) -> str | None:
    mode = call.args[position] if len(call.args) > position else next(
        (k.value for k in call.keywords if k.arg == "mode"), None)
    return mode.value if isinstance(mode, ast.Constant) and isinstance(mode.value, str) else None


class _Writes(ast.NodeVisitor):
    """The writes of one module, as ``(line, function, what)``."""

    def __init__(self) -> None:
        self.found: list[tuple[int, str, str]] = []
        self.function = "<module>"
        self.handles: set[str] = set()  # names bound to a helper's file or an in-memory buffer

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        outer, self.function = self.function, node.name if self.function == "<module>" else self.function
        self.generic_visit(node)
        self.function = outer

    visit_AsyncFunctionDef = visit_FunctionDef  # type: ignore[assignment]

    def visit_withitem(self, node: ast.withitem) -> None:
        if isinstance(node.context_expr, ast.Call) and _name(node.context_expr.func).split(".")[-1] in _HANDLE_MAKERS:
            if isinstance(node.optional_vars, ast.Name):
                self.handles.add(node.optional_vars.id)
        self.generic_visit(node)

    def visit_Assign(self, node: ast.Assign) -> None:
        if isinstance(node.value, ast.Call) and _name(node.value.func).split(".")[-1] in _HANDLE_MAKERS:
            self.handles.update(t.id for t in node.targets if isinstance(t, ast.Name))
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        name = _name(node.func)
        last = name.split(".")[-1]
        what = None
        if name in ("open", "io.open") or (last == "open" and isinstance(node.func, ast.Attribute)
                                            and name not in ("os.open",) and len(node.args) <= 1):
            mode = _mode(node, 1 if name in ("open", "io.open") else 0)
            if mode is not None and _WRITE_MODE & set(mode):
                what = "open"
        elif name == "os.open":
            flags = {n.attr for n in ast.walk(node.args[1]) if isinstance(n, ast.Attribute)} if len(node.args) > 1 \
                else set()
            if flags & _WRITE_FLAGS:
                what = "os.open"
        elif name == "os.fdopen":
            mode = _mode(node, 1)
            if mode is not None and _WRITE_MODE & set(mode):
                what = "os.fdopen"
        elif last in ("write_text", "write_bytes") and len(node.args) == 1:  # Path's (a SafeFolder's take a name)
            what = last
        elif name in ("json.dump", "pickle.dump") or last in ("copyfile", "copy", "copy2", "copytree", "move") \
                and name.startswith("shutil."):
            what = name
        elif name == "torch.save" or (last in ("savefig", "to_csv") and isinstance(node.func, ast.Attribute)):
            target = (node.args[1] if len(node.args) > 1 else None) if name == "torch.save" else (
                node.args[0] if node.args else None)
            if target is not None and not (isinstance(target, ast.Name) and target.id in self.handles):
                what = last if last != "save" else "torch.save"
        elif name in ("save_file", "save_model", "safetensors.torch.save_file") or last == "save_pretrained":
            what = last
        if what is not None:
            self.found.append((node.lineno, self.function, what))
        self.generic_visit(node)


def _writes() -> dict[str, list[tuple[int, str, str]]]:
    found = {}
    for path in sorted((ROOT / "trainwell").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel == HELPER:
            continue
        visitor = _Writes()
        visitor.visit(ast.parse(path.read_text(), rel))
        if visitor.found:
            found[rel] = visitor.found
    return found


def _bypassing() -> list[str]:
    out = []
    for rel, writes in _writes().items():
        for line, function, what in writes:
            if what in ALLOWED.get((rel, function), "").split() or (what == "save_pretrained" and _staged(rel, line)):
                continue
            out.append(f"{rel}:{line} in {function}(): {what}")
    return out


def _staged(rel: str, line: int) -> bool:
    """A ``save_pretrained`` call inside a ``with staged(...) as x`` block (the library writes into ``x``)."""
    tree = ast.parse((ROOT / rel).read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.With) and any(isinstance(i.context_expr, ast.Call)
                                              and _name(i.context_expr.func).endswith("staged") for i in node.items):
            if node.lineno <= line <= node.end_lineno:
                return True
    return False


def test_every_write_in_the_package_goes_through_the_one_helper():
    bypassing = _bypassing()
    assert not bypassing, "writes that bypass trainwell.utils.safe_files:\n" + "\n".join(bypassing)


def test_the_scan_sees_each_kind_of_write(tmp_path):
    """The scan is not blind: each kind of write it looks for, in a module of its own, is found."""
    source = """
import io, json, os, shutil, torch
from safetensors.torch import save_file
def f(path, obj, data):
    open(path, "w")
    open(path, mode="ab")
    path.open("w")
    os.open(path, os.O_WRONLY | os.O_CREAT)
    os.fdopen(3, "w")
    path.write_text("x")
    json.dump(obj, data)
    shutil.copyfile(path, path)
    torch.save(obj, path)
    save_file(obj, path)
    model.save_pretrained(path)
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    open(path, "rb")
"""
    visitor = _Writes()
    visitor.visit(ast.parse(source))
    assert [what for _, _, what in visitor.found] == ["open", "open", "open", "os.open", "os.fdopen", "write_text",
                                                       "json.dump", "shutil.copyfile", "torch.save", "save_file",
                                                       "save_pretrained"]


# ------------------------------------------------------------------------------------------------- planted links
@pytest.fixture
def target(tmp_path):
    """A file outside the run (standing for ``~/.bashrc``) that a planted link points at."""
    path = tmp_path / "bashrc"
    path.write_text("export KEEP=1\n")
    return path


def _plant(folder: Path, name: str, target: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    link = folder / name
    link.symlink_to(target)
    return link


def test_the_demo_replaces_a_planted_task_json_link(tmp_path, target, capsys):
    from trainwell.cli import main

    out = tmp_path / "out"
    link = _plant(out, "task.json", target)
    assert main(["demo", "--output-dir", str(out), "--steps", "2", "--size", "tiny", "--evals", "1", "--sample-bytes",
                 "4", "--batch-size", "2", "--no-report"]) == 0
    assert target.read_text() == "export KEEP=1\n"
    assert not link.is_symlink() and json.loads(link.read_text())["task"]


def test_extra_files_and_a_copied_tokenizer_replace_planted_links(tmp_path, target):
    from trainwell.cli.tokenizer import ByteTokenizer, TextTokenizer

    out = tmp_path / "out"
    _plant(out, "task.json", target)
    ByteTokenizer({"task.json": {"task": "causal-lm"}}).save_pretrained(str(out))
    assert target.read_text() == "export KEEP=1\n" and json.loads((out / "task.json").read_text())["task"]

    source = tmp_path / "tok" / "tokenizer.json"
    source.parent.mkdir()
    source.write_text('{"version": "1.0"}')
    run = tmp_path / "run"
    _plant(run, "tokenizer.json", target)
    tokenizer = TextTokenizer.__new__(TextTokenizer)
    tokenizer.kind, tokenizer.source, tokenizer.extra_files = "tokenizers", str(source), {}
    tokenizer.save_pretrained(str(run))
    assert target.read_text() == "export KEEP=1\n"
    assert (run / "tokenizer.json").read_text() == '{"version": "1.0"}' and not (run / "tokenizer.json").is_symlink()


def test_a_save_replaces_planted_links_to_its_files(tmp_path, target):
    """``model.safetensors``, ``training_args.json``, ``trainer_state.json``, the manifest and a ``torch.save``d
    piece: each a link to a file outside the run; the writers replace the link, and its target is untouched."""
    import torch

    from trainwell.checkpoint import manifest
    from trainwell.checkpoint.io import save_model_weights, torch_save, write_json
    from trainwell.state import TrainerState

    out = tmp_path / "out"
    names = ["model.safetensors", "training_args.json", "trainer_state.json", manifest.MANIFEST_NAME, "optimizer.pt"]
    for name in names:
        _plant(out, name, target)
    save_model_weights(torch.nn.Linear(2, 2), out)
    write_json({"seed": 1}, out / "training_args.json")
    TrainerState().save_to_json(out / "trainer_state.json")
    manifest.write(out, {})
    torch_save({"x": torch.ones(1)}, out / "optimizer.pt")
    assert target.read_text() == "export KEEP=1\n"
    assert not any((out / name).is_symlink() for name in names)
    assert sorted(p.name for p in out.iterdir()) == sorted(names)  # no temporary file or staging folder left


def test_appends_refuse_a_link_and_write_nothing_through_it(tmp_path, target):
    from trainwell.utils.safe_files import UnsafeFileError, append_bytes

    link = _plant(tmp_path / "run", "logs.jsonl", target)
    with pytest.raises(UnsafeFileError, match="symbolic link"):
        append_bytes(link, b"{}\n")
    fifo = tmp_path / "run" / "fifo.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(UnsafeFileError, match="FIFO"):
        append_bytes(fifo, b"{}\n")
    assert target.read_text() == "export KEEP=1\n"


# ------------------------------------------------------------------------------------------------- read-only disk
def _read_only_disk(monkeypatch, folder: Path) -> None:
    """``os.open`` raises EROFS for anything created or written in ``folder`` (as on a disk mounted read-only;
    a read-only bind mount cannot be made here)."""
    import errno

    real_open, inside = os.open, str(folder)
    writes = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC

    def refusing(path, flags, *args, **kwargs):
        where = os.fspath(path)
        if kwargs.get("dir_fd") is not None:
            where = os.path.join(os.readlink(f"/proc/self/fd/{kwargs['dir_fd']}"), where)
        if flags & writes and os.path.abspath(where).startswith(inside):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), where)
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", refusing)


@pytest.mark.parametrize("lock", [True, False], ids=["lock-file", "lock-left-by-a-crash"])
def test_a_saving_run_on_a_read_only_disk_is_named_before_any_step(tmp_path, monkeypatch, lock):
    from tests.common.models import RegressionDataset, RegressionModel
    from trainwell import Trainer, TrainingArguments

    out = tmp_path / "out"
    out.mkdir()
    if not lock:
        (out / ".trainwell.lock").write_text("{}")  # a lock file left behind: opened, not created
    args = TrainingArguments(str(out), max_steps=2, save_steps=1, report_to="none", disable_tqdm=True)
    trainer = Trainer(RegressionModel(), args, train_dataset=RegressionDataset())
    _read_only_disk(monkeypatch, out)
    with pytest.raises(PermissionError, match=rf"output_dir {str(out)!r} cannot be written \(Read-only file system\) "
                                              r"\(the disk is mounted read-only\): the run could save nothing there"):
        trainer.train()
    assert trainer.state.global_step == 0


def test_the_write_check_before_the_first_step_names_a_read_only_disk(tmp_path, monkeypatch):
    """The probe a saving run makes before its first step (every process that saves, lock or not)."""
    from trainwell.utils.safe_files import check_writable

    check_writable(tmp_path / "new")  # created, writable: nothing said
    assert os.listdir(tmp_path / "new") == []
    _read_only_disk(monkeypatch, tmp_path / "new")
    with pytest.raises(PermissionError, match="the disk is mounted read-only") as err:
        check_writable(tmp_path / "new")
    assert str(tmp_path / "new") in str(err.value)
