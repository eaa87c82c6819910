"""The live page of ``trainwell report --watch``: one HTML file with its script, drawing SVG charts itself.

Owns the markup and the style; the script is ``watch_page.js`` beside this file (hand-written, no library,
shipped in the wheel). The script asks ``/data`` every second (``?since=VERSION``: the server answers
``unchanged`` until a run's files change), then redraws: a table with one row per run (a show/hide box, step,
sessions, last losses, how long ago it last logged, its state: ``trainwell.report.watch_state``) and one chart per
figure of the server (``watch.figures``), every run on each chart in its own colour, a dashed line at each resume
point; then the system metrics of the live log (CPU, memory, GPU) against wall time. On the page: a smoothing
slider (TensorBoard's debiased exponential average, over every training series; evaluation series are not
smoothed), the x axis (step, epoch, input tokens, wall time: those some run logged), a log/linear button and a CSV
download per chart, the values of every shown run at the pointer, zoom by dragging a box or turning the wheel
(charts on the same x axis zoom together), a double-click to reset. Nothing is fetched from elsewhere (the
server's Content-Security-Policy allows this script, by its nonce, and requests to itself only); each data request
carries the page's token (from its address), which the server requires. Every name from a run folder is set as
text (``textContent``), never parsed as markup.

For the browser test: ``document.body`` carries ``data-version`` and ``data-x`` (the x axis); every chart its
figure's ``data-key``, and its ``svg`` ``data-points`` and the ranges drawn (``data-x0``, ``data-x1``,
``data-y0``, ``data-y1``); every curve a ``g`` with ``data-run``, ``data-series``, ``data-points`` and
``data-last`` (its last value); the hover box is a chart's ``.tip``; ``window.trainwellCsv(key)`` is a chart's CSV.
"""

from __future__ import annotations

import functools
from pathlib import Path

_STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;max-width:1800px;margin:1.5em auto;padding:0 1em}
body{color:#222}
h1{font-size:1.4em;overflow-wrap:anywhere}.note{color:#a60}.muted{color:#777}
.scroll{overflow-x:auto;max-width:100%;margin:1em 0}
table{border-collapse:collapse}td,th{border:1px solid #ddd;padding:4px 10px;text-align:left;vertical-align:top}
th{background:#f4f4f4}td.num{white-space:nowrap;text-align:right}td{overflow-wrap:break-word}
.swatch{display:inline-block;width:.8em;height:.8em;margin-right:.4em;border-radius:2px}
.plots{display:grid;grid-template-columns:repeat(auto-fit,minmax(min(100%,460px),1fr));gap:.5em 1em}
figure{margin:0;min-width:0}figcaption{font-weight:600;margin:.6em 0 .2em}
svg{width:100%;height:auto;display:block;border:1px solid #eee}svg text{font-size:11px;fill:#555}
.legend{font-size:.85em;color:#444;overflow-wrap:anywhere}.legend span{margin-right:1em;white-space:nowrap}
figure{position:relative}figcaption button{margin-left:.6em;font-size:.75em}
.tip{position:absolute;display:none;background:rgba(255,255,255,.95);border:1px solid #bbb;padding:3px 6px;
font-size:.8em;pointer-events:none;max-width:60%;z-index:2}
.controls{margin:.5em 0;display:flex;flex-wrap:wrap;gap:.4em 1.2em;align-items:center}h2{font-size:1.1em}
"""

_SCRIPT_FILE = Path(__file__).with_name("watch_page.js")


@functools.cache
def _script() -> str:
    return _SCRIPT_FILE.read_text(encoding="utf-8")


def page(nonce: str) -> str:
    """The page, its script allowed by ``nonce`` (the server's Content-Security-Policy names it)."""
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width, initial-scale=1'><title>trainwell live</title>"
        f"<style>{_STYLE}</style></head><body><h1 id='title'>trainwell live</h1>"
        "<p class='muted'>Follows the runs' folders: a new log shows within about two seconds. "
        "Written by <code>trainwell report --watch</code>; nothing here changes a run.</p>"
        "<p id='status' class='note'></p><div id='runs' class='scroll'></div>"
        "<div class='controls'><label>smoothing <input id='smoothing' type='range' min='0' max='0.99' step='0.01' "
        "value='0'> <span id='weight'></span></label> <label>x axis <select id='xaxis'></select></label> "
        "<button id='reset' type='button'>reset zoom</button> <span class='muted'>drag a box or turn the wheel over "
        "a chart to zoom, double-click to reset</span></div>"
        "<div id='plots' class='plots'></div><h2 id='system-title' style='display:none'>system</h2>"
        "<div id='system' class='plots'></div>"
        f"<script nonce='{nonce}'>{_script()}</script></body></html>"
    )


__all__ = ["page"]
