"""One JSON Lines writer for the files trainwell appends a record at a time: the live log
(``trainwell.loop.live_log``) and ``report_to="jsonl"``'s ``logs.jsonl`` (``trainwell.integrations.filelog``).

A record is one line: compact JSON, a value JSON cannot hold (a tensor a subclass logged, a path) written as its
``str`` rather than lost, text that UTF-8 cannot hold (a lone surrogate) as its escape, ``\\n`` at the end; it is
appended with one ``write`` through ``trainwell.utils.safe_files.append_bytes`` (a regular file only, never through
a link or into a FIFO), so a reader sees whole lines or an unfinished last one, never two records interleaved.
"""

from __future__ import annotations

import json
import os
from typing import Any

from trainwell.utils.safe_files import append_bytes


def json_line(record: dict[str, Any]) -> bytes:
    """``record`` as one line of JSON Lines, ``\\n`` included."""
    return (json.dumps(record, default=str, separators=(",", ":")) + "\n").encode("utf-8", "backslashreplace")


def append_json_line(path: str | os.PathLike[str], record: dict[str, Any]) -> None:
    """Append ``record`` to the JSON Lines file ``path`` (created if missing) with one ``write``."""
    append_bytes(path, json_line(record))


__all__ = ["append_json_line", "json_line"]
