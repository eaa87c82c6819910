"""Shared pieces of the reliability benchmarks (``benchmarks/reliability_*.py``); not a benchmark itself.

* which library a run uses (``--library trainwell|transformers|both``) and importing it quietly;
* the workload: a seeded ~0.6M-parameter MLP with dropout (2.5 MB of weights, ~7.5 MB per checkpoint with
  its AdamW state) on a seeded in-memory dataset, and the ``TrainingArguments`` both libraries get;
* an independent check that a ``checkpoint-N`` folder is whole (every file read back), not the library's own;
* running a training function in a forked child (instant: the parent imported the library once) or a
  controller in a fresh interpreter that answers with one JSON line;
* weight comparison and table printing.
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import traceback
import warnings
from pathlib import Path
from types import SimpleNamespace

import torch
from torch import nn
from torch.utils.data import Dataset

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

LIBRARIES = ("trainwell", "transformers")
CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")


def add_library_flag(parser) -> None:
    parser.add_argument("--library", choices=["trainwell", "transformers", "both"], default="both",
                        help="which implementation to measure (default: both, side by side)")


def selected(choice: str) -> list[str]:
    return list(LIBRARIES) if choice == "both" else [choice]


def load(library: str) -> SimpleNamespace:
    """The library's Trainer, TrainingArguments, TrainerCallback and get_last_checkpoint, its logs quiet."""
    warnings.filterwarnings("ignore")
    if library == "trainwell":
        import trainwell as lib
        from trainwell.checkpoint.resume import get_last_checkpoint
    else:
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
        import transformers as lib
        from transformers.trainer_utils import get_last_checkpoint

        lib.logging.set_verbosity_error()
    logging.getLogger("trainwell").setLevel(logging.ERROR)
    return SimpleNamespace(name=library, version=lib.__version__, Trainer=lib.Trainer,
                           TrainingArguments=lib.TrainingArguments, TrainerCallback=lib.TrainerCallback,
                           get_last_checkpoint=get_last_checkpoint)


def version(library: str) -> str:
    """The installed version, without importing the library (transformers takes seconds to import)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed(library)
    except PackageNotFoundError:
        return ""


# ------------------------------------------------------------------------------------------------ the workload
class WideMLP(nn.Module):
    """32 -> 768 -> 768 -> 8 with dropout (randomness a resume must reproduce); 0.62M parameters."""

    def __init__(self, d_in: int = 32, hidden: int = 768, n_classes: int = 8) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d_in, hidden), nn.ReLU(), nn.Dropout(0.1), nn.Linear(hidden, hidden),
                                 nn.ReLU(), nn.Linear(hidden, n_classes))

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        logits = self.net(x)
        out = {"logits": logits}
        if labels is not None:
            out["loss"] = nn.functional.cross_entropy(logits, labels)
        return out


class Blobs(Dataset):
    """``n`` seeded samples ``{"x": 32 floats, "labels": class}``; the labels follow a fixed random projection."""

    def __init__(self, n: int = 640, d_in: int = 32, n_classes: int = 8, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, d_in, generator=g)
        self.y = (self.x @ torch.randn(d_in, n_classes, generator=g)).argmax(-1)

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"x": self.x[i], "labels": self.y[i]}


def training_args(lib: SimpleNamespace, output_dir: str, **overrides):
    """The same arguments for both libraries: AdamW, linear schedule with warmup, clipping, batch 16, seed 7."""
    kwargs = dict(output_dir=output_dir, per_device_train_batch_size=16, learning_rate=1e-3, weight_decay=0.01,
                  optim="adamw_torch", lr_scheduler_type="linear", warmup_steps=5, max_grad_norm=1.0,
                  logging_steps=10, report_to="none", disable_tqdm=True, use_cpu=True, seed=7,
                  dataloader_num_workers=0, save_strategy="no")
    kwargs.update(overrides)
    return lib.TrainingArguments(**kwargs)


def model_and_data(n: int = 640) -> tuple[WideMLP, Blobs]:
    torch.manual_seed(0)
    return WideMLP(), Blobs(n)


def weights(module: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def compare(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> tuple[bool, float]:
    """(bit-equal, max abs difference) of two state dicts."""
    if set(a) != set(b):
        return False, float("inf")
    equal = all(torch.equal(a[k], b[k]) for k in a)
    return equal, max(float((a[k].double() - b[k].double()).abs().max()) for k in a)


def describe_diff(equal: bool | None, diff: float | None) -> str:
    if equal is None:
        return "n/a"
    return "bit-equal" if equal else f"max abs diff {diff:.2e}"


# ------------------------------------------------------------------------------------------------ checkpoints
def checkpoint_dirs(output_dir: str | os.PathLike) -> list[tuple[int, Path]]:
    """Every ``checkpoint-N`` folder (complete or not), oldest first."""
    root = Path(output_dir)
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if p.is_dir() and (m := CHECKPOINT_RE.match(p.name))]
    return sorted(found)


def incomplete_entries(output_dir: str | os.PathLike, since: float = 0.0) -> list[Path]:
    """Folders of a save in progress (or cut short), changed after ``since``: trainwell's ``.tmp-checkpoint-N``,
    the reference's ``checkpoint-N`` without ``trainer_state.json`` (it is written last)."""
    root = Path(output_dir)
    if not root.is_dir():
        return []
    found = []
    with os.scandir(root) as entries:
        for entry in entries:
            try:
                if not entry.is_dir() or entry.stat().st_mtime < since:
                    continue
                if entry.name.startswith(".tmp") or (
                        CHECKPOINT_RE.match(entry.name) and not os.path.exists(os.path.join(entry.path,
                                                                                            "trainer_state.json"))):
                    found.append(Path(entry.path))
            except FileNotFoundError:  # published or removed meanwhile
                continue
    return found


def checkpoint_problem(path: str | os.PathLike) -> str | None:
    """Why ``path`` is not a whole checkpoint (None when it is): every file is read back completely."""
    from safetensors.torch import load_file

    path = Path(path)
    try:
        names = {p.name for p in path.iterdir()}
        needed = ("model.safetensors", "optimizer.pt", "scheduler.pt", "trainer_state.json")
        missing = [n for n in needed if n not in names]
        missing += [] if any(n.startswith("rng_state") for n in names) else ["rng_state*.pth"]
        if missing:
            return "no " + ", ".join(missing)
        state = json.loads((path / "trainer_state.json").read_text())
        if state.get("global_step") != int(path.name.split("-")[1]):
            return f"trainer_state.json says step {state.get('global_step')}"
        tensors = load_file(str(path / "model.safetensors"))
        if not tensors or not all(torch.isfinite(t).all() for t in tensors.values()):
            return "model.safetensors empty or not finite"
        for name in ("optimizer.pt", "scheduler.pt"):
            torch.load(path / name, weights_only=True)
        for name in names:
            if name.startswith("rng_state"):
                torch.load(path / name, weights_only=False)
    except Exception as err:  # noqa: BLE001 - any failure to read back is the answer
        return f"{type(err).__name__}: {str(err).splitlines()[0][:120] if str(err) else ''}"
    return None


# ------------------------------------------------------------------------------------------------ processes
class Forked:
    """A training function run in a forked child (fd 1 goes to stderr); ``returncode`` as subprocess gives it."""

    def __init__(self, fn, *args) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        self.pid = os.fork()
        if self.pid == 0:  # the child: run, then leave without the parent's cleanup
            code = 0
            try:
                os.dup2(2, 1)
                torch.set_num_threads(1)
                fn(*args)
            except BaseException:  # noqa: BLE001
                traceback.print_exc()
                code = 1
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self) -> int:
        if self.returncode is None:
            _, status = os.waitpid(self.pid, 0)
            self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def kill(self, sig: int) -> None:
        os.kill(self.pid, sig)


class Launched:
    """A launcher command (``torchrun``): a signal goes to it and to every process under it.

    torchrun starts each worker in a session of its own, so a signal to the launcher's process group would
    leave the workers running (and writing checkpoints) after the "kill".
    """

    def __init__(self, cmd: list[str]) -> None:
        self.proc = subprocess.Popen(cmd, env=child_env(), cwd=ROOT, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        self.pid, self.family = self.proc.pid, []

    def poll(self) -> int | None:
        return self.proc.poll()

    def wait(self) -> int:
        import psutil

        code = self.proc.wait()
        psutil.wait_procs(self.family, timeout=60)  # the workers are gone too (zombies count as gone)
        return code

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode

    def kill(self, sig: int) -> None:
        import psutil

        try:
            self.family = psutil.Process(self.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            self.family = []
        for proc in [*self.family, psutil.Process(self.pid)]:
            try:
                proc.send_signal(sig)
            except psutil.NoSuchProcess:
                pass


def child_env() -> dict[str, str]:
    # one thread per process: on a shared 2-core machine, two OpenMP threads per process run 5-10x slower
    return {**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
            "CUDA_VISIBLE_DEVICES": "", "TRANSFORMERS_VERBOSITY": "error", "TOKENIZERS_PARALLELISM": "false"}


def run_controller(script: str, argv: list[str], timeout: float = 1800) -> dict:
    """``python script *argv`` in a fresh interpreter; its last stdout line is the JSON answer."""
    proc = subprocess.run([sys.executable, script, *argv], capture_output=True, text=True, env=child_env(),
                          cwd=ROOT, timeout=timeout, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def answer(result: dict) -> None:
    print(json.dumps(result), flush=True)


def print_table(rows: list[tuple[str, ...]], libraries: list[str], versions: dict[str, str]) -> None:
    """Rows of (what, value per library...): one column per library."""
    heads = [f"{lib} {versions.get(lib, '')}".strip() for lib in libraries]
    width = max(len(r[0]) for r in rows) + 2
    cols = [max(len(h), *(len(str(r[i + 1])) for r in rows)) + 2 for i, h in enumerate(heads)]
    print(f"{'':<{width}}" + "".join(f"{h:<{c}}" for h, c in zip(heads, cols)))
    for row in rows:
        print(f"{row[0]:<{width}}" + "".join(f"{str(v):<{c}}" for v, c in zip(row[1:], cols)))
