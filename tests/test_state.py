"""TrainerState / TrainerControl / ExportableState: fields, JSON round trips, step resolution, callback states."""

from __future__ import annotations

import dataclasses
import json
import logging
from types import SimpleNamespace

import pytest

from trainwell.state import ExportableState, TrainerControl, TrainerState

REFERENCE_FIELDS = [
    ("epoch", 0),
    ("global_step", 0),
    ("max_steps", 0),
    ("logging_steps", 500),
    ("eval_steps", 500),
    ("save_steps", 500),
    ("train_batch_size", None),
    ("num_train_epochs", 0),
    ("num_input_tokens_seen", 0),
    ("total_flos", 0),
    ("log_history", []),
    ("best_metric", None),
    ("best_global_step", None),
    ("best_model_checkpoint", None),
    ("is_local_process_zero", True),
    ("is_world_process_zero", True),
    ("is_hyper_param_search", False),
    ("trial_name", None),
    ("trial_params", None),
    ("stateful_callbacks", {}),
]


class Counter(ExportableState):
    """A minimal stateful callback: one constructor argument, one mutable attribute."""

    def __init__(self, start: int = 0) -> None:
        self.start = start
        self.count = start

    def state(self) -> dict:
        return {"args": {"start": self.start}, "attributes": {"count": self.count}}


class Plain:
    """A callback without state."""


# -- fields and JSON --------------------------------------------------------------------------------


def test_fields_and_defaults_match_the_reference():
    state = TrainerState()
    assert [f.name for f in dataclasses.fields(state)] == [name for name, _ in REFERENCE_FIELDS]
    for name, default in REFERENCE_FIELDS:
        assert getattr(state, name) == default, name


def test_log_history_is_not_shared_between_instances():
    a, b = TrainerState(), TrainerState()
    a.log_history.append({"loss": 1.0})
    assert b.log_history == []
    assert TrainerState(log_history=None).log_history == []


def test_save_to_json_format_and_round_trip(tmp_path):
    state = TrainerState(
        epoch=1.5,
        global_step=12,
        max_steps=24,
        log_history=[{"loss": 0.5, "step": 12}],
        best_metric=0.25,
        best_global_step=10,
        best_model_checkpoint="out/checkpoint-10",
        trial_params={"lr": 0.1},
        stateful_callbacks=[Counter(3)],
    )
    path = tmp_path / "trainer_state.json"
    state.save_to_json(path)
    text = path.read_text(encoding="utf-8")
    assert text == json.dumps(dataclasses.asdict(state), indent=2, sort_keys=True) + "\n"
    assert list(tmp_path.iterdir()) == [path]  # the temporary file was renamed, not left behind
    assert TrainerState.load_from_json(str(path)) == state


def test_load_rejects_bad_json_naming_the_file(tmp_path):
    path = tmp_path / "trainer_state.json"
    path.write_text("{not json", encoding="utf-8")
    with pytest.raises(ValueError, match=r"trainer_state\.json is not valid JSON"):
        TrainerState.load_from_json(path)


def test_load_rejects_non_object_and_missing_fields(tmp_path):
    path = tmp_path / "trainer_state.json"
    path.write_text("[1, 2]", encoding="utf-8")
    with pytest.raises(ValueError, match=r"trainer_state\.json holds a list"):
        TrainerState.load_from_json(path)
    path.write_text(json.dumps({"epoch": 1.0, "log_history": []}), encoding="utf-8")
    with pytest.raises(ValueError, match=r"trainer_state\.json.*lacks global_step, max_steps"):
        TrainerState.load_from_json(path)


def test_load_accepts_older_and_newer_files(tmp_path, caplog):
    # An old file lacks recent fields; a newer one may carry fields this version does not know.
    path = tmp_path / "trainer_state.json"
    data = {"epoch": 2.0, "global_step": 8, "max_steps": 8, "log_history": [], "future_field": 1}
    path.write_text(json.dumps(data), encoding="utf-8")
    with caplog.at_level(logging.WARNING):
        state = TrainerState.load_from_json(path)
    assert (state.global_step, state.best_global_step, state.stateful_callbacks) == (8, None, {})
    assert "future_field" in caplog.text and "trainer_state.json" in caplog.text


def test_load_missing_file_raises_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError):
        TrainerState.load_from_json(tmp_path / "nope.json")


# -- compute_steps / init_training_references -------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "max_steps", "expected"),
    [
        ((10, 20, 30), 100, (10, 20, 30)),
        ((0.1, 0.25, 0.5), 100, (10, 25, 50)),
        ((0.1, 0.1, 0.1), 25, (3, 3, 3)),  # ceil(2.5)
        ((5.0, 0.5, 1), 9, (5, 5, 1)),
    ],
)
def test_compute_steps_resolves_ratios(given, max_steps, expected):
    args = SimpleNamespace(logging_steps=given[0], eval_steps=given[1], save_steps=given[2])
    state = TrainerState()
    state.compute_steps(args, max_steps)
    assert (state.logging_steps, state.eval_steps, state.save_steps) == expected
    assert all(type(v) is int for v in (state.logging_steps, state.eval_steps, state.save_steps))


def test_compute_steps_keeps_defaults_for_missing_values():
    state = TrainerState()
    state.compute_steps(SimpleNamespace(logging_steps=7, eval_steps=None), 100)
    assert (state.logging_steps, state.eval_steps, state.save_steps) == (7, 500, 500)


class FakeTrainer:
    def __init__(self, local=True, world=False, hp_name=None, trial=None):
        self._local, self._world = local, world
        self.hp_name, self._trial = hp_name, trial

    def is_local_process_zero(self):
        return self._local

    def is_world_process_zero(self):
        return self._world


def test_init_training_references():
    state = TrainerState(trial_params={"stale": 1})
    state.init_training_references(FakeTrainer(local=True, world=False), 40, 3, None)
    assert (state.max_steps, state.num_train_epochs) == (40, 3)
    assert (state.is_local_process_zero, state.is_world_process_zero) == (True, False)
    assert state.trial_params is None and state.trial_name is None


def test_init_training_references_with_trials():
    trial = {"learning_rate": 0.1, "seed": 3}
    trainer = FakeTrainer(hp_name=lambda t: f"run-{t['seed']}", trial=trial)
    state = TrainerState()
    state.init_training_references(trainer, 10, 1, trial)
    assert state.trial_name == "run-3"
    assert state.trial_params == trial and state.trial_params is not trial

    optuna_like = SimpleNamespace(params={"lr": 0.5})
    state.init_training_references(FakeTrainer(), 10, 1, optuna_like)
    assert state.trial_params == {"lr": 0.5}
    with pytest.raises(TypeError, match="trial of type int"):
        state.init_training_references(FakeTrainer(), 10, 1, 42)


# -- stateful callbacks -----------------------------------------------------------------------------


def test_stateful_callbacks_from_a_list():
    first, second = Counter(1), Counter(2)
    state = TrainerState(stateful_callbacks=[Plain(), first, TrainerControl(should_log=True), second])
    assert state.stateful_callbacks["Counter"] == [first.state(), second.state()]
    assert state.stateful_callbacks["TrainerControl"]["args"]["should_log"] is True
    assert "Plain" not in state.stateful_callbacks


def test_record_callback_states_rebuilds_instead_of_appending(tmp_path):
    # The reference appends on every checkpoint: two instances and three saves give a growing list.
    callbacks = [Counter(0), Counter(10), TrainerControl()]
    state = TrainerState(stateful_callbacks=callbacks)
    for save in range(3):
        callbacks[0].count += 1
        state.record_callback_states(callbacks)
        state.save_to_json(tmp_path / f"state-{save}.json")
    loaded = TrainerState.load_from_json(tmp_path / "state-2.json")
    assert loaded.stateful_callbacks["Counter"] == [
        {"args": {"start": 0}, "attributes": {"count": 3}},
        {"args": {"start": 10}, "attributes": {"count": 10}},
    ]
    restored = [Counter.from_state(s) for s in loaded.stateful_callbacks["Counter"]]
    assert [(c.start, c.count) for c in restored] == [(0, 3), (10, 10)]


def test_record_callback_states_single_instance_is_a_dict():
    state = TrainerState()
    mapping = state.record_callback_states([Counter(4)])
    assert mapping == {"Counter": {"args": {"start": 4}, "attributes": {"count": 4}}}
    assert state.stateful_callbacks is mapping
    assert state.record_callback_states([]) == {}


# -- TrainerControl / ExportableState ---------------------------------------------------------------


def test_control_resets():
    control = TrainerControl(True, True, True, True, True)
    control._new_step()
    assert (control.should_save, control.should_evaluate, control.should_log) == (False, False, False)
    assert control.should_training_stop and control.should_epoch_stop


def test_control_state_round_trip():
    control = TrainerControl(should_save=True, should_training_stop=True)
    exported = control.state()
    assert exported == {
        "args": {
            "should_training_stop": True,
            "should_epoch_stop": False,
            "should_save": True,
            "should_evaluate": False,
            "should_log": False,
        },
        "attributes": {},
    }
    assert TrainerControl.from_state(json.loads(json.dumps(exported))) == control


def test_exportable_state_requires_state():
    class Forgetful(ExportableState):
        pass

    with pytest.raises(NotImplementedError, match="Forgetful"):
        Forgetful().state()


def test_from_state_tolerates_missing_sections():
    assert Counter.from_state({"args": {"start": 2}}).count == 2
    assert Counter.from_state({"attributes": {"count": 9}}).count == 9
