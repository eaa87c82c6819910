"""``train_script.py`` whose ``--die-in-save STEP:FILE`` can die after *any* file of a checkpoint.

The harness's own hook only sees the files written with ``torch_save`` (optimizer, scheduler, RNG, data
position). This entry point also kills the process right after ``model.safetensors`` (the model writer),
``training_args.json`` and ``trainer_state.json`` (written last, just before the folder is published), so
the kill tests can crash a save at each of its stages. Everything else is ``train_script.main()``.
"""

from __future__ import annotations

import os
import signal
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from tests.checkpointing import train_script  # noqa: E402

_original_hook = train_script._die_inside_save


def _in_checkpoint(path: str, step: int) -> bool:
    return os.path.basename(os.path.dirname(os.path.abspath(str(path)))).endswith(f"checkpoint-{step}")


def _die_inside_save(step: int, file_name: str) -> None:
    """SIGKILL this process right after ``file_name`` of checkpoint ``step`` is complete on disk."""
    from trainwell.checkpoint import contents
    from trainwell.state import TrainerState

    _original_hook(step, file_name)  # optimizer.pt, scheduler.pt, rng_state*.pth, data_state*.pth

    def die_if(path: str) -> None:
        if os.path.basename(str(path)) == file_name and _in_checkpoint(path, step):
            os.kill(os.getpid(), signal.SIGKILL)

    save_weights = contents.save_model_weights

    def save_model_weights(model, directory, state_dict=None):
        save_weights(model, directory, state_dict=state_dict)
        die_if(os.path.join(str(directory), "model.safetensors"))

    write_json = contents.write_json

    def write_json_then_maybe_die(obj, path):
        write_json(obj, path)
        die_if(path)

    save_state = TrainerState.save_to_json

    def save_to_json(self, json_path):
        save_state(self, json_path)
        die_if(json_path)

    contents.save_model_weights = save_model_weights
    contents.write_json = write_json_then_maybe_die
    TrainerState.save_to_json = save_to_json


train_script._die_inside_save = _die_inside_save

if __name__ == "__main__":
    train_script.main()
