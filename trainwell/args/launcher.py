"""What the launcher (torchrun, ``accelerate launch``, Ray, SLURM through torchrun) tells about the processes, read
from the environment it sets, and the one decision taken from it before Accelerate runs: whether Accelerate must
be told ``cpu=True``.

Accelerate picks its process group from the device: on a machine without GPUs it joins several processes into
one job (``MULTI_CPU``, gloo) only when given ``cpu=True``. Given ``cpu=False`` there, each process started by
``torchrun`` sets itself up alone (``DistributedType.NO``, process 0 of 1): N copies of the run train side by
side, all believing they are the main process, and write the same files. The reference (and trainwell before)
did exactly that with ``use_cpu=False`` on CPU machines, on one node and on several. ``use_cpu`` means "train on
the CPU even where an accelerator exists"; where the CPU is the only device, the launcher's processes are joined
on it whatever ``use_cpu`` says.
"""

from __future__ import annotations

import os
from typing import Any

# Set by accelerate launch (or an accelerate config) when it starts an FSDP or DeepSpeed run.
_ENGINE_VARIABLES = ("ACCELERATE_USE_FSDP", "ACCELERATE_USE_DEEPSPEED")


def launched_processes() -> int:
    """The number of processes the launcher started for this job (``$WORLD_SIZE``; 1 without a launcher)."""
    try:
        return max(1, int(os.environ.get("WORLD_SIZE", "1")))
    except ValueError:
        return 1


#: what launchers (torchrun, accelerate launch, MPI) set in each process they start; Accelerate creates a process
#: group only when it finds one of these
_LAUNCHER_VARIABLES = ("LOCAL_RANK", "RANK", "WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE")


def under_a_launcher() -> bool:
    """Whether a launcher started this process (so Accelerate may create a process group in it)."""
    return any(name in os.environ for name in _LAUNCHER_VARIABLES)


def accelerate_cpu(args: Any) -> bool:
    """The ``cpu=`` to build Accelerate's state with for ``args``.

    ``use_cpu``, or True when a launcher started several processes, the device is the CPU (no CUDA, XPU or MPS
    device) and no engine that sets up its own processes (FSDP, DeepSpeed) was asked for: with ``cpu=True``
    Accelerate joins the processes over gloo (``MULTI_CPU``). FSDP and DeepSpeed keep ``cpu=False``: Accelerate
    drops both under ``cpu=True``; the runtime reports what Accelerate then set up.
    """
    if args.use_cpu:
        return True
    if launched_processes() <= 1 or args.fsdp or args.deepspeed:
        return False
    if any(os.environ.get(name, "false").lower() in ("true", "1") for name in _ENGINE_VARIABLES):
        return False
    return args.device.type == "cpu"


def partial_state(args: Any) -> Any:
    """Accelerate's ``PartialState`` for ``args`` (``cpu=`` from :func:`accelerate_cpu`, ``ddp_timeout``,
    ``ddp_backend``); under torchrun its process group joins through trainwell's rendezvous, a key space per restart
    (``trainwell.utils.rendezvous``)."""
    from accelerate import PartialState

    from trainwell.utils.rendezvous import init_method

    backend = {"backend": args.ddp_backend} if args.ddp_backend else {}
    if (method := init_method()) is not None:
        backend["init_method"] = method
    return PartialState(cpu=accelerate_cpu(args), timeout=args.ddp_timeout_delta, **backend)
