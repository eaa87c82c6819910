"""The report's HTML page in a real headless browser: it never scrolls sideways, wide tables scroll inside their
containers, long names wrap, images decode, the plots fill a wide window in a grid (one column on a phone), and
nothing is fetched. Everything is measured against the viewport the browser reports: a browser may not give the
window size asked for (Debian's Chromium makes a 485 px viewport of --window-size=420,800).

Two browsers are used when present, neither downloaded at run time:
- Qt WebEngine (Chromium inside Qt) from PyPI: ``pip install PyQt6-WebEngine``; its wheels ship the browser
  engine itself, so nothing else is fetched (playwright's and pyppeteer's wheels do not: their ``install`` step
  downloads a browser from a CDN, which a machine limited to the package registries cannot reach);
- a Chromium binary on PATH (``chromium``, ``chromium-headless-shell``, ``google-chrome``...), e.g. Debian's
  ``chromium-headless-shell`` package.
Each is skipped, saying which package to install, when absent. ``tests/test_report_page.py`` checks the same
page structurally without a browser.
"""

from __future__ import annotations

import html
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from tests.common.timing import hang_timeout
from tests.test_report_page import LONG_NAME, wide_run
from trainwell.report import write_report

WIDTHS = (1600, 1024, 420)  # a wide screen, a laptop window and a phone
_CHROMIUM = ("chromium", "chromium-browser", "chromium-headless-shell", "headless_shell", "google-chrome",
             "google-chrome-stable")

# What the test needs from the laid-out page, as one JSON string.
MEASURE = """(function () {
  var viewport = document.documentElement.clientWidth;
  var tables = Array.prototype.map.call(document.querySelectorAll('table'), function (t) {
    var box = t.parentElement, rect = box.getBoundingClientRect();
    return {container: box.className, overflowX: getComputedStyle(box).overflowX, right: rect.right,
            scrollWidth: box.scrollWidth, clientWidth: box.clientWidth, text: t.textContent.slice(0, 40)};
  });
  var images = Array.prototype.map.call(document.images, function (i) {
    var rect = i.getBoundingClientRect();
    return {complete: i.complete, naturalWidth: i.naturalWidth, left: rect.left, right: rect.right,
            top: Math.round(rect.top)};
  });
  var fetched = performance.getEntriesByType('resource').map(function (r) { return r.name; })
    .filter(function (n) { return n.indexOf('data:') !== 0; });
  return JSON.stringify({viewport: viewport, pageWidth: document.documentElement.scrollWidth, tables: tables,
                         images: images, fetched: fetched});
})()"""

# Run in a child process: Qt wants its own main thread and one QApplication per process.
_QT_DRIVER = """
import json, sys
from PyQt6.QtCore import QTimer, QUrl
from PyQt6.QtWidgets import QApplication
from PyQt6.QtWebEngineWidgets import QWebEngineView
page, width, measure = sys.argv[1], int(sys.argv[2]), sys.stdin.read()
app = QApplication(sys.argv[:1])
view = QWebEngineView()
view.resize(width, 800)
def measured(result):
    print("RESULT " + str(result), flush=True)
    app.quit()
view.loadFinished.connect(lambda ok: view.page().runJavaScript(measure, measured))
view.load(QUrl.fromLocalFile(page))
view.show()
QTimer.singleShot(60000, app.quit)
app.exec()
"""


def _qt_missing() -> str | None:
    try:
        found = importlib.util.find_spec("PyQt6.QtWebEngineWidgets") is not None
    except ImportError:
        found = False
    return None if found else ("Qt WebEngine is not installed: pip install PyQt6-WebEngine (its wheels ship the "
                               "Chromium engine; nothing is downloaded at run time)")


def _chromium() -> str | None:
    return next((path for name in _CHROMIUM if (path := shutil.which(name))), None)


def _measure_qt(page: str, width: int) -> dict:
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "QTWEBENGINE_CHROMIUM_FLAGS": "--disable-gpu"}
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        env["QTWEBENGINE_DISABLE_SANDBOX"] = "1"  # Chromium's sandbox refuses to run as root (containers, CI)
    done = subprocess.run([sys.executable, "-c", _QT_DRIVER, page, str(width)], input=MEASURE, env=env,
                          capture_output=True, text=True, timeout=hang_timeout(120))
    found = re.search(r"^RESULT (.*)$", done.stdout, re.MULTILINE)
    assert found, f"Qt WebEngine gave no result (exit {done.returncode}):\n{done.stderr[-3000:]}"
    return json.loads(found.group(1))


def _measure_chromium(binary: str, page: str, width: int, tmp_path) -> dict:
    """Chromium's --dump-dom prints the DOM after the load event: a copy of the page writes its measurements
    into an attribute on load (the report itself has no script)."""
    text = open(page, encoding="utf-8").read()
    probe = (f"<script>window.addEventListener('load', function () {{ document.body.setAttribute("
             f"'data-measure', {MEASURE}); }});</script></body>")
    copy = tmp_path / f"probe-{width}.html"
    copy.write_text(text.replace("</body>", probe), encoding="utf-8")
    args = [binary, "--headless", "--disable-gpu", "--no-sandbox", f"--window-size={width},800",
            "--virtual-time-budget=5000", "--dump-dom", copy.as_uri()]
    done = subprocess.run(args, capture_output=True, text=True, timeout=hang_timeout(120))
    found = re.search(r'data-measure="([^"]*)"', done.stdout)
    assert found, f"{binary} gave no measurements (exit {done.returncode}):\n{done.stderr[-3000:]}"
    return json.loads(html.unescape(found.group(1)))


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    """A report with a wide log table, long metric names and a very long run name."""
    return str(write_report(wide_run(tmp_path_factory.mktemp("browser"))).html)


def _check(result: dict) -> None:
    viewport = result["viewport"]
    assert result["pageWidth"] <= viewport, f"the page scrolls sideways: {result}"
    assert result["tables"], result
    for table in result["tables"]:
        assert table["container"] == "scroll" and table["overflowX"] == "auto", table
        assert table["right"] <= viewport + 1, f"a table's container sticks out of the page: {table}"
    # the wide log table really is wider than its container (it scrolls inside it) ...
    assert any(t["scrollWidth"] > t["clientWidth"] for t in result["tables"]) or viewport > 1000
    # ... while the summary, whose run name and state file path are long, wraps instead
    summary = result["tables"][0]
    assert LONG_NAME[:20] in summary["text"] and summary["scrollWidth"] <= summary["clientWidth"], summary
    for image in result["images"]:
        assert image["complete"] and image["naturalWidth"] > 0 and image["right"] <= viewport + 1, image
    assert result["fetched"] == []
    _check_grid(result["images"], viewport)


def _check_grid(images: list[dict], viewport: int) -> None:
    """The plots in a grid: side by side in a window wide enough for two columns of 460 px, filling its width
    (not one narrow column leaving half of it empty); one under the other on a phone."""
    assert len(images) >= 4, images
    per_row = sum(1 for image in images if image["top"] == images[0]["top"])
    if viewport < 2 * 460 + 16:
        assert per_row == 1, (viewport, images)
        return
    assert per_row >= (3 if viewport >= 3 * 460 + 64 else 2), (viewport, images)
    span = max(i["right"] for i in images) - min(i["left"] for i in images)
    assert span >= 0.9 * (viewport - 48), f"the plots leave the window's side empty: {span} of {viewport}"


@pytest.mark.parametrize("width", WIDTHS)
def test_the_page_in_qt_webengine(page, width):
    missing = _qt_missing()
    if missing:
        pytest.skip(missing)
    _check(_measure_qt(page, width))


@pytest.mark.parametrize("width", WIDTHS)
def test_the_page_in_chromium(page, width, tmp_path):
    binary = _chromium()
    if binary is None:
        pytest.skip(f"no Chromium on PATH (looked for {', '.join(_CHROMIUM)}); e.g. apt-get install "
                    "chromium-headless-shell")
    _check(_measure_chromium(binary, page, width, tmp_path))
