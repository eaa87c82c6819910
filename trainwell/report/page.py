"""The report's HTML page: one self-contained file (PNGs inlined as data URIs, no scripts, no network).

Owns the markup only; numbers come from ``trainwell.report.history`` and images from ``plots``.
"""

from __future__ import annotations

import base64
import html
from pathlib import Path
from typing import Any

_STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;max-width:980px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ddd;padding:4px 10px;text-align:left}
th{background:#f4f4f4}img{max-width:100%;border:1px solid #eee;margin:.5em 0}.note{color:#a60}
code{background:#f4f4f4;padding:1px 4px}
"""


def _image(path: Path) -> str:
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return f'<figure><img alt="{html.escape(path.stem)}" src="data:image/png;base64,{data}"></figure>'


def _table(rows: dict[str, Any]) -> str:
    body = "".join(f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(str(v))}</td></tr>" for k, v in rows.items())
    return f"<table>{body}</table>"


def _log_table(log_history: list[dict[str, Any]], last: int = 12) -> str:
    entries = log_history[-last:]
    keys = list(dict.fromkeys(k for e in entries for k in e))
    head = "".join(f"<th>{html.escape(k)}</th>" for k in keys)
    rows = "".join(
        "<tr>" + "".join(f"<td>{html.escape(_fmt(e.get(k, '')))}</td>" for k in keys) + "</tr>" for e in entries
    )
    return f"<table><tr>{head}</tr>{rows}</table>"


def _fmt(value: Any) -> str:
    return f"{value:.5g}" if isinstance(value, float) else str(value)


def render(title: str, summaries: list[dict[str, Any]], images: list[Path], note: str | None = None,
           log_history: list[dict[str, Any]] | None = None) -> str:
    """The whole page as a string: title, one summary table per run, the images, then the last log entries."""
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>",
             f"<style>{_STYLE}</style></head><body><h1>{html.escape(title)}</h1>"]
    if note:
        parts.append(f"<p class='note'>{html.escape(note)}</p>")
    for rows in summaries:
        parts.append(_table(rows))
    parts += [_image(p) for p in images]
    if log_history:
        parts.append("<h2>Last log entries</h2>" + _log_table(log_history))
    parts.append("<p><small>Written by <code>trainwell report</code>.</small></p></body></html>")
    return "\n".join(parts)
