"""Which processes of a multi-process run see which checkpoint writer's ``output_dir``: one shared file system, or a
disk on each node.

A checkpoint is written by the processes with ``args.should_save``: world process zero, or each node's local
process zero with ``save_on_each_node=True``. Whether the nodes share ``output_dir`` decides what works:

* ``save_on_each_node=True`` on a shared file system: two writers would write every file of each checkpoint into
  the same folder. Refused before training (the fix: ``save_on_each_node=False``).
* ``save_on_each_node=True`` under FSDP or tensor parallelism: their (DCP) checkpoint is one folder of every
  process's shards; refused.
* ``save_on_each_node=False`` on node-local disks: the checkpoints (complete: the writer writes every process's RNG
  state, gathered) are on world process zero's disk only. Training works; a warning names the processes that do
  not see them, and a resume sends them the checkpoint from world process zero over the process group
  (``trainwell.checkpoint.fetch``). Under FSDP or DeepSpeed every process writes its shards into the writer's
  folder, and ``load_best_model_at_end`` reads the best checkpoint on every process: both are refused there.

:func:`probe` finds out, once per ``train()`` call, with a file in ``output_dir`` whose name is new (a fresh
name, so no client caches it as missing: NFS caches failed look-ups of names it has seen), and two small
all-gathers. Single-process runs never probe.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from trainwell.utils.safe_files import write_file

logger = logging.getLogger(__name__)

PROBE_PREFIX = ".trainwell-disk-"


@dataclass(frozen=True)
class Disks:
    """Who writes checkpoints and whose folder each process sees (process indices)."""

    writers: tuple[int, ...]  #: the processes that write checkpoints (``args.should_save``)
    sees: tuple[tuple[int, ...], ...]  #: for each process, the writers whose ``output_dir`` it sees

    def blind(self) -> list[int]:
        """The processes that see no writer's ``output_dir``: they cannot read the checkpoints back."""
        return [rank for rank, seen in enumerate(self.sees) if not seen]

    def shared_writers(self) -> list[int]:
        """Writers that see another writer's folder: two of them would write the same files."""
        return [w for w in self.writers if any(other != w for other in self.sees[w])]


def probe(output_dir: str, should_save: bool, gather: Callable[[Any], list[Any]]) -> Disks:
    """Find out which processes share ``output_dir`` (a collective: every process calls it).

    Each writer creates an empty file of a fresh name in ``output_dir``; once every writer has, each process
    looks for every writer's file; once every process has looked, the writers remove theirs.
    """
    token = None
    if should_save:
        token = f"{PROBE_PREFIX}{uuid.uuid4().hex}"
        try:
            os.makedirs(output_dir, exist_ok=True)
            write_file(os.path.join(output_dir, token), b"")
        except OSError as err:  # a read-only folder: the save itself will say what is wrong
            logger.debug("Could not create %s in %s: %s", token, output_dir, err)
            token = None
    tokens = gather(token)  # also the barrier after which every writer's file exists
    seen = tuple(rank for rank, name in enumerate(tokens)
                 if name is not None and os.path.exists(os.path.join(output_dir, name)))
    sees = gather(seen)  # ... and the one after which every process has looked
    if token is not None:
        try:
            os.remove(os.path.join(output_dir, token))
        except OSError:
            pass
    writers = tuple(rank for rank, name in enumerate(tokens) if name is not None)
    return Disks(writers=writers, sees=tuple(tuple(s) for s in sees))


def check(disks: Disks, args: Any, every_process_writes: bool, is_main: bool, one_folder: bool = False) -> None:
    """Refuse what cannot work with this placement, before training; warn (on the main process) when checkpoints
    will not be readable by every process.

    ``every_process_writes``: the engine writes shards from every process (FSDP, tensor parallelism, DeepSpeed);
    ``one_folder``: its checkpoint is one folder of all the shards and their metadata (DCP: FSDP, tensor
    parallelism), which a copy per node cannot be.
    """
    if one_folder and len(disks.writers) > 1:
        raise ValueError(
            "save_on_each_node=True with FSDP or tensor parallelism: their checkpoint is one folder into which every "
            "process writes its shards and process 0 their metadata, so a copy on each node would be incomplete. "
            "Put output_dir on a file system every node mounts and set save_on_each_node=False."
        )
    shared = disks.shared_writers()
    if shared:
        raise ValueError(
            f"save_on_each_node=True, but {_names(shared)} (the main processes of different nodes) see the "
            f"same output_dir ({args.output_dir}): it is on a file system the nodes share, and each would write "
            "every file of each checkpoint into the same folder. Set save_on_each_node=False (process 0 then "
            "writes for every node); keep save_on_each_node=True for disks local to each node."
        )
    blind = disks.blind()
    if not blind:
        return
    where = (f"{_names(blind)} {'does' if len(blind) == 1 else 'do'} not see the output_dir ({args.output_dir}) "
             f"that {_names(disks.writers)} {'writes' if len(disks.writers) == 1 else 'write'} checkpoints into: it is "
             "not shared between the nodes")
    fix = ("set save_on_each_node=True (each node's main process keeps a complete copy on its own disk) or put "
           "output_dir on a file system every node mounts")
    if every_process_writes:
        raise ValueError(f"Under FSDP or DeepSpeed every process writes its shards into the checkpoint, but {where}. "
                         "Put output_dir on a file system every node mounts.")
    if args.load_best_model_at_end:
        raise ValueError(f"load_best_model_at_end=True reloads the best checkpoint on every process, but {where}. "
                         f"To keep it, {fix}.")
    if is_main:
        logger.warning(
            "%s%s. Training goes on; a resume sends the checkpoint from process 0 to the processes whose disks lack "
            "it, over the process group (trainwell.checkpoint.fetch), each time. To keep a copy on every node instead, "
            "%s.", where[0].upper(), where[1:], fix,
        )  # fmt: skip


def _names(ranks: list[int] | tuple[int, ...]) -> str:
    """``process 1`` or ``processes 2, 3``."""
    return ("process " if len(ranks) == 1 else "processes ") + ", ".join(str(rank) for rank in ranks)
