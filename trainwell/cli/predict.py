"""``trainwell predict RUN [TEXT ...] [--data FILE] [--output FILE]``: use a model ``trainwell train`` (with a task)
or ``trainwell demo`` trained.

Owns the command: where the texts come from (arguments, a ``.txt`` file of one text per line, a JSONL or CSV file's
text column, or lines on stdin) and where the predictions go (stdout as one line per text, or a JSONL or CSV file).
Loading the run and predicting belong to ``trainwell.cli.inference``.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
from typing import Any, TextIO

from trainwell.cli import CliError

FORMATS = ("text", "jsonl", "csv")
_SUFFIX_FORMAT = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl", ".csv": "csv"}
_HOW_TO_GIVE = ("give texts as arguments (trainwell predict RUN 'a text' 'another'), as a file (--data texts.txt, one "
                "per line, or a .jsonl/.csv file with the task's text column), or as lines on stdin "
                "(... | trainwell predict RUN).")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", metavar="RUN",
                        help="the output_dir of a `trainwell demo` run or of a `trainwell train` run with a task "
                             "(or one of its checkpoint-N folders, or the config file that trained it)")
    parser.add_argument("texts", nargs="*", metavar="TEXT", help="texts to predict on (else --data, else stdin)")
    parser.add_argument("--data", metavar="FILE",
                        help="a .txt file (one text per line; blank lines skipped), a .jsonl or .csv file (its text "
                             "column), or - for stdin")
    parser.add_argument("--text-column", metavar="NAME", help="the column of --data holding the text (default: the "
                                                               "task's text_column)")
    parser.add_argument("--output", metavar="FILE", help="write the predictions to a .jsonl or .csv file, not stdout")
    parser.add_argument("--format", choices=FORMATS,
                        help="text (one line per input: label, score and text, or the text and its continuation), "
                             "jsonl or csv; default: text on stdout, else from --output's suffix")
    parser.add_argument("--batch-size", type=int, default=32, help="texts classified at once (default 32)")
    parser.add_argument("--max-new-tokens", type=int, default=50, help="causal LM: tokens to generate (default 50)")
    parser.add_argument("--temperature", type=float, default=None,
                        help="causal LM: 0 takes the most probable token; above 0 samples (default: 0, or what "
                             "the run's task.json suggests: the demo's 0.8)")
    parser.add_argument("--top-k", type=int, default=None,
                        help="causal LM: sample among the k most probable tokens (default 40, or the task.json's)")
    parser.add_argument("--seed", type=int, default=0, help="causal LM: the seed of sampling")
    parser.add_argument("--trust-remote-code", action="store_true",
                        help="let transformers run the code the run folder's config names (a custom model or "
                             "tokenizer class, its auto_map); off by default: no code from the folder runs")
    parser.add_argument("--device", default="cpu", choices=("auto", "cpu", "cuda", "mps"),
                        help="where the model runs (default cpu; auto: a GPU when present)")


def run(ns: argparse.Namespace) -> int:
    from trainwell.cli.inference import load_trained, read_task, run_folder

    # The run, the output and the input are checked before the model is loaded.
    fmt = _output_format(ns.output, ns.format)
    folder = run_folder(ns.run, newest_checkpoint=True)
    if os.path.normpath(folder) != os.path.normpath(ns.run) and not os.path.isfile(ns.run):
        print(f"{ns.run} has no final model yet (interrupted, or still training): using its newest checkpoint, "
              f"{folder}", file=sys.stderr)
    task, saved = read_task(folder)
    texts = read_texts(ns.texts, ns.data, ns.text_column or task.text_column, sys.stdin)
    suggested = _generation_defaults(saved)
    temperature = ns.temperature if ns.temperature is not None else suggested.get("temperature", 0.0)
    top_k = ns.top_k if ns.top_k is not None else suggested.get("top_k", 40)
    trained = load_trained(folder, device=ns.device, trust_remote_code=ns.trust_remote_code)
    rows = trained.predict(texts, batch_size=ns.batch_size, max_new_tokens=ns.max_new_tokens,
                           temperature=temperature, top_k=top_k, seed=ns.seed)
    if ns.output is None:
        write_predictions(rows, sys.stdout, fmt, trained.task.name)
        return 0
    with open(ns.output, "w", encoding="utf-8", newline="" if fmt == "csv" else None) as out:
        write_predictions(rows, out, fmt, trained.task.name)
    print(f"{len(rows)} predictions ({trained.task.name}, the model in {trained.path}) written to {ns.output}",
          file=sys.stderr)
    return 0


def _generation_defaults(saved: dict[str, Any]) -> dict[str, Any]:
    """The sampling a run's ``task.json`` suggests (``"generation": {"temperature": T, "top_k": K}``; the demo's
    byte model writes 0.8 and 40, since its most probable next byte is mostly a space); values that are not
    numbers in range are left out."""
    suggested = saved.get("generation")
    if not isinstance(suggested, dict):
        return {}
    out: dict[str, Any] = {}
    temperature, top_k = suggested.get("temperature"), suggested.get("top_k")
    if isinstance(temperature, (int, float)) and not isinstance(temperature, bool) and 0 <= temperature <= 10:
        out["temperature"] = float(temperature)
    if isinstance(top_k, int) and not isinstance(top_k, bool) and top_k >= 0:
        out["top_k"] = top_k
    return out


def _output_format(output: str | None, fmt: str | None) -> str:
    if fmt is not None:
        return fmt
    if output is None:
        return "text"
    suffix = os.path.splitext(output)[1].lower()
    if suffix not in _SUFFIX_FORMAT:
        raise CliError(f"--output {output}: name a .jsonl or .csv file, or say which with --format jsonl|csv|text.")
    return _SUFFIX_FORMAT[suffix]


def read_texts(texts: list[str], data: str | None, column: str, stdin: TextIO) -> list[str]:
    """The texts to predict on: ``texts`` (the arguments), else the ``data`` file (``-``: stdin), else stdin's
    lines when it is not a terminal; ``CliError`` when there are none, or both arguments and a file."""
    if texts and data is not None:
        raise CliError("give texts as arguments or --data FILE, not both.")
    if texts:
        return list(texts)
    if data == "-" or (data is None and not _is_terminal(stdin)):
        found = [line.rstrip("\r\n") for line in stdin if line.strip()]
    elif data is not None:
        found = _read_file(data, column)
    else:
        raise CliError(f"no texts to predict on: {_HOW_TO_GIVE}")
    if not found:
        raise CliError(f"{data if data not in (None, '-') else 'stdin'} holds no text: {_HOW_TO_GIVE}")
    return found


def _is_terminal(stream: TextIO) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def _read_file(path: str, column: str) -> list[str]:
    from trainwell.cli.build import read_rows

    if not os.path.isfile(path):
        raise FileNotFoundError(f"--data: no such file {path!r} (in {os.getcwd()}).")
    fmt = _SUFFIX_FORMAT.get(os.path.splitext(path)[1].lower())
    if fmt is None:  # plain text: one per line
        with open(path, encoding="utf-8") as f:
            return [line.rstrip("\r\n") for line in f if line.strip()]
    rows = read_rows(path, fmt)
    for number, row in enumerate(rows, 1):
        if not isinstance(row, dict) or column not in row:
            columns = sorted(row) if isinstance(row, dict) else type(row).__name__
            raise CliError(f"{path}: row {number} has no column {column!r} (the columns are {columns}); pass the "
                           "column that holds the text as --text-column NAME.")
        if row[column] in (None, ""):
            raise CliError(f"{path}: row {number} has no text in column {column!r}.")
    # A CSV cell that looks like a number was read as one; it is still text here.
    return [row[column] if isinstance(row[column], str) else str(row[column]) for row in rows]


def _one_line(text: str) -> str:
    return text.replace("\r", "\\r").replace("\n", "\\n")


def write_predictions(rows: list[dict[str, Any]], out: TextIO, fmt: str, task: str) -> None:
    """``rows`` (from ``TrainedModel.predict``) to ``out`` as ``fmt``: ``text`` writes one line per input
    (``label<TAB>score<TAB>text``, or the text followed by its continuation, newlines shown as ``\\n``), ``jsonl``
    one JSON object per input, ``csv`` a header and a row per input (``text,label,score`` or
    ``text,generated``)."""
    classification = task == "text-classification"
    if fmt == "jsonl":
        for row in rows:
            out.write(json.dumps(row, ensure_ascii=False) + "\n")
    elif fmt == "csv":
        columns = ["text", "label", "score"] if classification else ["text", "generated"]
        writer = csv.writer(out)
        writer.writerow(columns)
        writer.writerows([row[c] for c in columns] for row in rows)
    elif classification:
        for row in rows:
            out.write(f"{row['label']}\t{row['score']:.4f}\t{_one_line(row['text'])}\n")
    else:
        for row in rows:
            out.write(_one_line(row["text"] + row["generated"]) + "\n")
