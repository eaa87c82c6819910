"""Built-in file loggers that need no package: ``report_to="jsonl"`` and ``report_to="csv"``.

Both write into the run's logging dir (``args.logging_dir``, else ``{output_dir}/runs/{run_name or
date_host}``): ``logs.jsonl`` holds one JSON object per log, ``logs.csv`` one row per log with a column per
key. Each record carries ``step``, ``epoch`` and a UNIX ``time``, so throughput can be rebuilt later. Files
are appended to (a resumed run continues its file) and flushed at every log, so they can be tailed live.
"""

from __future__ import annotations

import csv
import io
import os
import time
from typing import Any

from trainwell.integrations.base import TrackerCallback, resolve_logging_dir
from trainwell.utils.jsonl import append_json_line
from trainwell.utils.safe_files import append_bytes, read_bytes, write_file


class _FileLogger(TrackerCallback):
    filename = ""

    def __init__(self) -> None:
        super().__init__()
        self.path: str | None = None

    def start(self, args: Any, state: Any, model: Any) -> None:
        if self.path is None:
            folder = resolve_logging_dir(args)
            os.makedirs(folder, exist_ok=True)
            self.path = os.path.join(folder, self.filename)

    def _record(self, logs: dict[str, Any], step: int, state: Any) -> dict[str, Any]:
        return {"step": step, "epoch": state.epoch, "time": round(time.time(), 3), **logs}


class JsonlLoggerCallback(_FileLogger):
    """Appends each log as one JSON line to ``logs.jsonl`` (non-JSON values written with ``str``)."""

    name = "jsonl"
    filename = "logs.jsonl"

    def log_metrics(self, logs: dict[str, Any], step: int, args: Any, state: Any) -> None:
        append_json_line(self.path, self._record(logs, step, state))  # the live log's writer: one line, no link


class CsvLoggerCallback(_FileLogger):
    """Appends each log as a row of ``logs.csv``; when a log brings a new key (the first evaluation, the end
    of training), the file is rewritten once with the wider header, so every row has every column."""

    name = "csv"
    filename = "logs.csv"

    def __init__(self) -> None:
        super().__init__()
        self._columns: list[str] | None = None

    def _existing(self) -> tuple[list[str], list[dict[str, str]]]:
        if not os.path.exists(self.path):
            return [], []
        text = read_bytes(self.path, 1 << 30).decode("utf-8", errors="replace")  # a regular file, never a link
        reader = csv.DictReader(io.StringIO(text, newline=""))
        return list(reader.fieldnames or []), list(reader)

    def log_metrics(self, logs: dict[str, Any], step: int, args: Any, state: Any) -> None:
        record = self._record(logs, step, state)
        if self._columns is None:
            self._columns, _ = self._existing()
        new = [k for k in record if k not in self._columns]
        if new or not self._columns:
            _, rows = self._existing()
            self._columns = self._columns + new
            text = io.StringIO(newline="")
            writer = csv.DictWriter(text, fieldnames=self._columns)
            writer.writeheader()
            writer.writerows(rows)
            write_file(self.path, text.getvalue())  # atomic: a crash mid-rewrite leaves the old file, never half
        row = io.StringIO(newline="")
        csv.DictWriter(row, fieldnames=self._columns).writerow(record)
        append_bytes(self.path, row.getvalue().encode("utf-8"))
