"""The README's quickstart is ``examples/quickstart.py``, character for character, and it does what the README
says: run as written, it trains, evaluates, saves and predicts, and ``trainwell report`` on its output folder
writes the report."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

from tests.common.timing import hang_timeout

ROOT = Path(__file__).resolve().parent.parent
QUICKSTART = ROOT / "examples" / "quickstart.py"
FENCED_PYTHON = re.compile(r"^```python\n(.*?)^```$", re.DOTALL | re.MULTILINE)


def test_the_readme_quickstart_is_the_example_file():
    blocks = FENCED_PYTHON.findall((ROOT / "README.md").read_text(encoding="utf-8"))
    assert blocks, "README.md has no ```python block"
    assert QUICKSTART.read_text(encoding="utf-8") in blocks, (
        "README.md's quickstart differs from examples/quickstart.py: paste the file into the README's ```python "
        "block unchanged"
    )


def test_the_quickstart_trains_and_its_folder_gives_a_report(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MPLBACKEND": "Agg"}
    run = subprocess.run([sys.executable, str(QUICKSTART)], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=hang_timeout(300))  # fmt: skip
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    lines = run.stdout.strip().splitlines()
    metrics = ast.literal_eval(lines[-2])  # print(trainer.evaluate())
    assert metrics["epoch"] == 3.0 and metrics["eval_accuracy"] >= 0.9, metrics
    assert re.fullmatch(r"predicted: \[[0-3]( [0-3]){7}\]", lines[-1]), lines[-1]
    out = tmp_path / "quickstart-out"
    assert {"model.safetensors", "training_args.json", "checkpoint-192"} <= set(os.listdir(out))
    report = subprocess.run([sys.executable, "-m", "trainwell", "report", "quickstart-out"], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=hang_timeout(300))  # fmt: skip
    assert report.returncode == 0, report.stdout[-2000:] + report.stderr[-4000:]
    assert (out / "report" / "index.html").is_file()


def test_the_first_screen_is_for_users_and_the_test_suites_workings_come_later():
    """A newcomer reads the README's first screen (up to the quickstart): how the suite schedules its workers is
    contributor material, in its own section further down."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    first_screen = text[:text.index("## Quickstart")]
    for contributor_words in ("xdist", "worker", "@pytest.mark", "slowest tests"):
        assert contributor_words not in first_screen, contributor_words
    contributing = text[text.index("## Contributing: the test suite"):]
    assert "pytest-xdist workers" in contributing.split("\n## ")[0]
    assert text.index("## Contributing: the test suite") > text.index("## Differences from the reference")
