"""trainwell's arguments parsed by the reference's own parsers: ``transformers.HfArgumentParser`` and the copy TRL
ships (``trl.scripts._hf_argparser``, behind ``TrlParser``), as every TRL script and many user scripts do.

Those parsers rewrite each dataclass ``Field.type`` in place (``float | None`` becomes ``float``), and the fields
are shared by every subclass, so whatever trainwell reads about a field must come from the class declarations,
never from ``Field.type``. Each case runs in a fresh process (the rewrite would leak into the rest of the session),
once with the parser running before any ``TrainingArguments`` was built (nothing cached yet) and once after.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.common.timing import hang_timeout

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SCRIPT = r'''
from __future__ import annotations
import json, sys
import trainwell
from trainwell import Seq2SeqTrainingArguments, TrainingArguments
from trainwell.args import fields, parser as tw_parser

which, order = sys.argv[1], sys.argv[2]
if which == "transformers":
    from transformers import HfArgumentParser as Parser
elif which == "trl":
    from trl.scripts._hf_argparser import HfArgumentParser as Parser
else:
    Parser = None


def local_class():
    class Unknown:
        pass

    class Local(TrainingArguments):  # its own annotation cannot be resolved: the parser's fallback reads the rest
        extra: Unknown | None = None
    import dataclasses
    return dataclasses.dataclass(Local)


def errors():
    out = {}
    for kwargs in ({"run_name": 42}, {"fp16_full_eval": 3}, {"learning_rate": "x"}, {"hub_token": 5}):
        try:
            TrainingArguments(output_dir="y", **kwargs)
            out[str(kwargs)] = "accepted"
        except ValueError as err:
            out[str(kwargs)] = str(err).split(":")[0]
    return out


if order == "after":
    TrainingArguments(output_dir="first")
result = {}
if Parser is not None:
    (args,) = Parser(TrainingArguments).parse_args_into_dataclasses(
        ["--output_dir", "x", "--max_steps", "3", "--warmup_steps", "0.5"])
    (s2s,) = Parser(Seq2SeqTrainingArguments).parse_args_into_dataclasses(
        ["--output_dir", "x", "--generation_max_length", "7"])
    result["parsed"] = [args.output_dir, args.neftune_noise_alpha, args.max_steps, args.warmup_steps,
                        s2s.generation_max_length, s2s.generation_num_beams]
plain = TrainingArguments(output_dir="y", learning_rate="5e-5", fp16_full_eval="false")
result["plain"] = [plain.neftune_noise_alpha, plain.learning_rate, plain.fp16_full_eval, plain.max_grad_norm]
result["errors"] = errors()
for cached in vars(fields).values():
    if hasattr(cached, "cache_clear"):
        cached.cache_clear()  # what trainwell would read about each field if it were read now
result["kinds"] = [{name: [kind.__name__, optional] for name, (kind, optional) in
                    fields.numeric_fields(Seq2SeqTrainingArguments).items()},
                   sorted(fields.bool_fields(Seq2SeqTrainingArguments))]
result["fallback"] = {name: repr(hint) for name, hint in tw_parser._resolve_hints(local_class()).items()}
print("RESULT" + json.dumps(result))
'''


def _run(parser: str, order: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", SCRIPT, parser, order], capture_output=True, text=True,
                          timeout=hang_timeout(300), cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.split("RESULT", 1)[1])


@pytest.fixture(scope="module")
def untouched() -> dict:
    """What trainwell reads about the fields in a process where no reference parser ran."""
    return _run("none", "before")


@pytest.mark.parametrize("order", ["before", "after"])
@pytest.mark.parametrize("parser", ["transformers", "trl"])
def test_the_reference_parsers_leave_trainwell_reading_its_fields_as_declared(parser, order, untouched):
    pytest.importorskip("transformers")
    if parser == "trl":
        pytest.importorskip("trl")
    result = _run(parser, order)
    assert result["parsed"] == ["x", None, 3, 0.5, 7, None]
    assert result["plain"] == untouched["plain"] == [None, 5e-5, False, 1.0]
    assert result["errors"] == untouched["errors"] == {
        "{'run_name': 42}": "run_name=42", "{'fp16_full_eval': 3}": "fp16_full_eval=3",
        "{'learning_rate': 'x'}": "learning_rate='x'", "{'hub_token': 5}": "hub_token=5"}
    assert result["kinds"] == untouched["kinds"]
    assert result["fallback"] == untouched["fallback"]


def test_field_kinds_come_from_the_declarations():
    from trainwell import Seq2SeqTrainingArguments
    from trainwell.args import fields

    terms = fields.field_terms(Seq2SeqTrainingArguments)
    assert terms["neftune_noise_alpha"] == {"float", "None"}
    assert terms["run_name"] == {"str", "None"}
    assert terms["generation_max_length"] == {"int", "None"}
    assert fields.numeric_fields(Seq2SeqTrainingArguments)["neftune_noise_alpha"] == (float, True)
    assert fields.numeric_fields(Seq2SeqTrainingArguments)["max_steps"] == (int, False)
    assert "fp16" in fields.bool_fields(Seq2SeqTrainingArguments)
    assert fields.text_fields(Seq2SeqTrainingArguments)["hub_token"] == (True, False)


def test_typing_forms_and_objects_read_alike():
    from typing import Literal, Optional, Union

    from trainwell.args.fields import _terms

    for written in ("Optional[float]", "float | None", "None | float", "Union[float, None]", "typing.Optional[float]",
                    Optional[float], float | None, Union[None, float]):  # noqa: UP007, UP045 -- the old spellings too
        assert set(_terms(written)) == {"float", "None"}, written
    assert set(_terms("str | None | Literal[False]")) == set(_terms(str | None | Literal[False])) == {
        "str", "None", "Literal[False]"}
    assert _terms("dict[str, Any] | str | None") == ["dict[str, Any]", "str", "None"]


def test_a_library_redeclaring_a_field_sets_its_kind_and_its_own_fields_are_its_own():
    """A subclass's annotation wins for a Trainer API field (TRL declares ``bf16: bool | None = None``); the fields
    only a library declares are the library's to check (TRL's ``scale_rewards: str`` also takes True/False)."""
    import dataclasses

    from trainwell import TrainingArguments
    from trainwell.args import fields

    @dataclasses.dataclass
    class LibraryConfig(TrainingArguments):
        bf16: bool | None = None
        scale_rewards: str = "group"

    assert fields.field_terms(LibraryConfig)["bf16"] == {"bool", "None"}
    assert "scale_rewards" not in fields.field_terms(LibraryConfig)
    assert LibraryConfig(output_dir="x", scale_rewards=False).scale_rewards is False
