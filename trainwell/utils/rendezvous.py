"""The process group's key-value store under torchrun: one key space per restart.

Why (measured, torch 2.13): under ``torchrun`` (``TORCHELASTIC_USE_AGENT_STORE=True``) every process's ``env://``
store is a client of one TCP store that torchrun's agent keeps for the whole job: the static rendezvous reuses its
store on every restart, and the c10d one keeps its shared store server across rounds. torch does not set the keys of
a restarted group apart (its ``env://`` handler assumes a fresh store per restart), so the processes of a
``--max-restarts`` restart find the first attempt's keys: gloo's full-mesh connect reads the address a dead process
published, and the restarted processes either fail at once (``connectFullMesh ... Connection refused``) or wait on a
connection that never comes (until ``ddp_timeout``, 30 minutes by default, nothing printed). Which one depends on
which process writes its new address first: before this, 4 (static) and 6 (c10d) restarts in 10 came up here.

What this does: :func:`init_method` names a rendezvous (``trainwell://``) that is torch's ``env://`` with its store
wrapped in a prefix of the job's run id and torchrun's restart count, so each attempt writes and reads its own keys;
and before the process group connects, every process waits for the others of its attempt in that key space (a
store barrier), saying every 30 s which processes it still waits for, and giving up after ``ddp_timeout`` with an
error that names them and the restart each of them last joined as. Outside torchrun's agent store nothing changes.
"""

from __future__ import annotations

import datetime
import logging
import os
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlparse

logger = logging.getLogger(__name__)

SCHEME = "trainwell"
REPORT_EVERY_SECONDS = 30.0  # how often a process waiting for the others of its attempt says so
_registered = False


def init_method() -> str | None:
    """``init_method`` for ``torch.distributed.init_process_group``: ``"trainwell://"`` in a process torchrun
    started with its agent store (the rendezvous is registered on first use), None elsewhere (``env://``)."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    from torch.distributed.rendezvous import register_rendezvous_handler

    global _registered
    if not _registered:
        try:
            register_rendezvous_handler(SCHEME, _handler)
        except ValueError:  # registered already (this module imported anew)
            pass
        _registered = True
    return f"{SCHEME}://"


def attempt() -> int:
    """torchrun's restart count for this process's agent (0: the first start)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)


def _handler(url: str, timeout: datetime.timedelta | None = None, **kwargs: Any) -> Iterator[tuple[Any, int, int]]:
    """torch's ``env://`` rendezvous with the store set apart per restart, after every process of it arrived."""
    import torch.distributed as dist
    from torch.distributed.rendezvous import rendezvous

    query = urlparse(url).query
    env_kwargs = {"timeout": timeout} if timeout is not None else {}
    store, rank, world_size = next(rendezvous(f"env://?{query}" if query else "env://", **env_kwargs, **kwargs))
    wait = timeout.total_seconds() if timeout is not None else 1800.0
    job = f"trainwell/{os.environ.get('TORCHELASTIC_RUN_ID', 'job')}"
    store.set(f"{job}/restart_of/{rank}", str(attempt()))  # read by the error below, whatever its attempt
    attempt_store = dist.PrefixStore(f"{job}/restart_{attempt()}/", store)
    wait_for_all(attempt_store, store, job, rank, world_size, wait)
    yield attempt_store, rank, world_size
    raise RuntimeError("trainwell:// rendezvous: the process group cannot be set up again in this process")


def wait_for_all(attempt_store: Any, store: Any, job: str, rank: int, world_size: int, wait: float) -> None:
    """Mark this process arrived in its attempt's key space and wait until all ``world_size`` have.

    Raises ``RuntimeError`` after ``wait`` seconds, naming the processes that did not arrive and the restart count
    each last joined with (from ``store``, the job's unprefixed store); logs a warning every 30 s meanwhile.
    """
    attempt_store.set(f"arrived/{rank}", "1")
    start = time.monotonic()
    reported, pause = start, 0.01
    while True:
        missing = [r for r in range(world_size) if not attempt_store.check([f"arrived/{r}"])]
        if not missing:
            return
        now = time.monotonic()
        if now - start > wait:
            raise RuntimeError(_not_arrived(store, job, rank, world_size, missing, now - start))
        if now - reported > REPORT_EVERY_SECONDS:
            reported = now
            logger.warning("Process %d (torchrun restart %d) has waited %.0f s for process(es) %s to start; "
                           "it gives up after ddp_timeout (%.0f s).", rank, attempt(), now - start,
                           ", ".join(map(str, missing)), wait)
        time.sleep(pause)
        pause = min(pause * 2, 0.5)


def _not_arrived(store: Any, job: str, rank: int, world_size: int, missing: list[int], waited: float) -> str:
    joined = {}
    for other in missing:
        key = f"{job}/restart_of/{other}"
        joined[other] = store.get(key).decode() if store.check([key]) else None
    seen = "; ".join(f"process {r}: " + (f"last started as restart {a}" if a is not None else "never started")
                     for r, a in joined.items())
    return (f"Process {rank} of {world_size} (torchrun restart {attempt()}) waited {waited:.0f} s (ddp_timeout) for "
            f"process(es) {', '.join(map(str, missing))} to start their process group, and stops: {seen}. A process "
            "that started under another restart count was restarted by an agent that did not count the restart "
            "(torchrun counts a restart only on the node whose processes failed; with the c10d rendezvous a node "
            "restarted because another one re-joined keeps its count): stop the job and start every node again, "
            "the script resuming its last checkpoint. One that never started failed before reaching the Trainer "
            "(see its log).")
