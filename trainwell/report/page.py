"""The report's HTML page: one self-contained file (PNGs inlined as data URIs, no scripts, no network).

Owns the markup only; numbers come from ``trainwell.report.history`` and ``tables``, images from ``plots``.
Every table sits in a ``div.scroll`` container: a table wider than the page (the log entries, a comparison of
many metrics) scrolls sideways inside it instead of stretching the page. Long names (paths, metric keys, run
names) wrap at underscores and slashes (``<wbr>``); cells only break words that cannot fit otherwise
(``overflow-wrap: break-word``, which unlike ``anywhere`` never squeezes a column below its longest word), and
numbers never wrap. Headings wrap anywhere, since a page title has no container to scroll in.

The plots sit in a CSS grid (``div.plots``), as TensorBoard and W&B lay out their charts: as many columns of at
least 460 px as the window holds (one on a phone, two on a laptop, three or four on a wide screen), each plot
scaled down to its cell, never up; a lone plot (a comparison's) takes the whole row.
"""

from __future__ import annotations

import base64
import html
import re
from pathlib import Path
from typing import Any

_STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;max-width:1800px;margin:2em auto;padding:0 1em;color:#222}
.plots{display:grid;grid-template-columns:repeat(auto-fit,minmax(min(100%,460px),1fr));gap:.5em 1em;align-items:start}
.plots>figure{min-width:0}
.scroll{overflow-x:auto;max-width:100%;margin:1em 0}
table{border-collapse:collapse}td,th{border:1px solid #ddd;padding:4px 10px;text-align:left;vertical-align:top}
th{background:#f4f4f4}td,th{overflow-wrap:break-word}td.num{white-space:nowrap}
table.rows td:not(.num){min-width:10em}
th.diff{background:#fff2cc}img{max-width:100%;height:auto;border:1px solid #eee;margin:.5em 0}.note{color:#a60}
code{background:#f4f4f4;padding:1px 4px}figure{margin:0}h1,h2,p{overflow-wrap:anywhere}
"""
_NUMBER = re.compile(r"^(≥ )?[-+]?(\d[\d.,:-]*|\.\d+)(e[-+]?\d+)?( .*)?$", re.IGNORECASE)
_LONG = 16  # characters: longer names get line-break opportunities


def _image(path: Path) -> str:
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return f'<figure><img alt="{html.escape(path.stem)}" src="data:image/png;base64,{data}"></figure>'


def _name(text: Any) -> str:
    """Escaped text; a long one gets a line-break opportunity after each ``_`` and ``/``, so metric keys and
    paths wrap there rather than widen their column (short ones, "steps/s", stay whole)."""
    text = html.escape(str(text))
    return re.sub(r"([_/])", r"\1<wbr>", text) if len(text) > _LONG else text


def _cell(value: Any) -> str:
    text = f"{value:.5g}" if isinstance(value, float) else str(value)
    numeric = isinstance(value, (int, float)) or not text or bool(_NUMBER.match(text)) and len(text) < 24
    return f"<td class='num'>{html.escape(text)}</td>" if numeric else f"<td>{_name(text)}</td>"


def _scroll(table: str) -> str:
    return f"<div class='scroll'>{table}</div>"


def key_value_table(rows: dict[str, Any]) -> str:
    """A two-column table (name, value) in a scroll container."""
    body = "".join(f"<tr><th>{_name(k)}</th>{_cell(v)}</tr>" for k, v in rows.items())
    return _scroll(f"<table>{body}</table>")


def rows_table(rows: list[dict[str, Any]], highlight: set[str] | frozenset[str] = frozenset()) -> str:
    """A table with a header row (the keys of the rows), in a scroll container; ``highlight``ed columns (e.g.
    the hyperparameters that differ between runs) get a coloured header."""
    if not rows:
        return ""
    keys = list(dict.fromkeys(k for row in rows for k in row))
    head = "".join(f"<th class='diff'>{_name(k)}</th>" if k in highlight else f"<th>{_name(k)}</th>" for k in keys)
    body = "".join("<tr>" + "".join(_cell(row.get(k, "")) for k in keys) + "</tr>" for row in rows)
    return _scroll(f"<table class='rows'><tr>{head}</tr>{body}</table>")


def render(title: str, summaries: list[dict[str, Any]], images: list[Path], note: str | None = None,
           log_history: list[dict[str, Any]] | None = None,
           tables: list[tuple[str, str]] | None = None, details: list[tuple[str, str]] | None = None) -> str:
    """The whole page as a string: title, one summary table per run, the ``(heading, table html)`` sections of
    ``tables`` (sessions, hyperparameters, comparison), the images, the sections of ``details``, then the last
    log entries. Sections whose table is empty are left out."""
    parts = [f"<!doctype html><html><head><meta charset='utf-8'>"
             f"<meta name='viewport' content='width=device-width, initial-scale=1'><title>{html.escape(title)}</title>",
             f"<style>{_STYLE}</style></head><body><h1>{_name(title)}</h1>"]
    if note:
        parts.append(f"<p class='note'>{html.escape(note)}</p>")
    parts += [key_value_table(rows) for rows in summaries]
    parts += [f"<h2>{_name(heading)}</h2>{table}" for heading, table in tables or [] if table]
    if images:
        parts.append("<div class='plots'>" + "".join(_image(p) for p in images) + "</div>")
    parts += [f"<h2>{_name(heading)}</h2>{table}" for heading, table in details or [] if table]
    if log_history:
        last = [e for e in log_history[-12:] if isinstance(e, dict)]
        parts.append("<h2>Last log entries</h2>" + rows_table([{k: e.get(k, "") for k in e} for e in last]))
    parts.append("<p><small>Written by <code>trainwell report</code>.</small></p></body></html>")
    return "\n".join(parts)
