"""trainwell.utils.logging (the reference's transformers.utils.logging names) and log_level="passive"."""

from __future__ import annotations

import logging
import sys
import types

import pytest

from trainwell import TrainingArguments
from trainwell.utils import logging as tw_logging


@pytest.fixture(autouse=True)
def restore_library_logger(monkeypatch):
    monkeypatch.delitem(sys.modules, "transformers.utils.logging", raising=False)  # as if it was never imported
    logger = logging.getLogger("trainwell")
    level, propagate, handlers = logger.level, logger.propagate, list(logger.handlers)
    yield
    tw_logging.disable_default_handler()
    logger.setLevel(level)
    logger.propagate, logger.handlers = propagate, handlers


def test_verbosity_functions_set_the_library_level(tmp_path):
    tw_logging.set_verbosity_info()
    assert tw_logging.get_verbosity() == logging.INFO
    assert TrainingArguments(str(tmp_path)).get_process_log_level() == logging.INFO  # passive follows it
    tw_logging.set_verbosity(tw_logging.ERROR)
    assert TrainingArguments(str(tmp_path)).get_process_log_level() == logging.ERROR
    assert TrainingArguments(str(tmp_path), log_level="debug").get_process_log_level() == logging.DEBUG


def test_passive_follows_transformers_verbosity_when_a_script_set_it(tmp_path, monkeypatch):
    """An example script that switched only its Trainer imports calls transformers' set_verbosity_info()."""
    tw_logging.set_verbosity_warning()
    fake = types.ModuleType("transformers.utils.logging")
    fake.get_verbosity = lambda: logging.INFO
    monkeypatch.setitem(sys.modules, "transformers.utils.logging", fake)
    assert TrainingArguments(str(tmp_path)).get_process_log_level() == logging.INFO
    fake.get_verbosity = lambda: logging.WARNING  # its default: imported for a model, not asked for anything
    tw_logging.set_verbosity_error()
    assert TrainingArguments(str(tmp_path)).get_process_log_level() == logging.ERROR


def test_the_default_handler_prints_once_and_formats_explicitly(capsys):
    tw_logging.set_verbosity_info()
    tw_logging.enable_default_handler()
    tw_logging.enable_default_handler()  # twice: still one handler
    tw_logging.enable_explicit_format()
    tw_logging.get_logger("trainwell.example").info("hello")
    err = capsys.readouterr().err
    assert err.count("hello") == 1 and "[INFO|" in err
    tw_logging.disable_default_handler()
    assert logging.getLogger("trainwell").propagate is True


def test_the_running_training_summary_is_logged_at_info(tmp_path, caplog):
    from tests.common.models import RegressionDataset, RegressionModel
    from tests.conftest import make_args
    from trainwell import Trainer

    caplog.set_level(logging.INFO, logger="trainwell")
    args = make_args(str(tmp_path), num_train_epochs=2, per_device_train_batch_size=8, gradient_accumulation_steps=2)
    Trainer(model=RegressionModel(), args=args, train_dataset=RegressionDataset()).train()
    text = caplog.text
    assert "***** Running training *****" in text and "Num examples = 64" in text and "Num Epochs = 2" in text
    assert "Total train batch size (w. parallel, distributed & accumulation) = 16" in text
    assert "Total optimization steps = 8" in text and "Number of trainable parameters = 2" in text
