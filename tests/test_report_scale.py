"""The report's cost grows linearly with the log (issue 26: 10,000 entries took 69 s and 20,000 took 214 s, since
telling sessions apart rescanned the earlier entries), and a long series is drawn from a faithful sample."""

from __future__ import annotations

import json
import math
import time

import pytest

from trainwell.report import curves, history, load_run, sessions, summary_text, write_report
from trainwell.report.curves import build_axis, downsample


def _log(n: int, resume_every: int | None = None) -> list[dict]:
    """``n`` entries: a training log per step and an evaluation every 50 steps, then a summary; with
    ``resume_every``, the step goes back 5 every that many entries (a run resumed from an earlier checkpoint, again
    and again: one session per ``resume_every`` entries)."""
    entries, step = [], 0
    while len(entries) < n - 1:
        step += 1
        if resume_every and len(entries) % resume_every == resume_every - 1:
            step = max(step - 5, 1)
        entries.append(
            {
                "loss": 2.0 / (1 + step * 1e-3),
                "grad_norm": 1.0,
                "learning_rate": 1e-4,
                "epoch": step / 1000,
                "num_input_tokens_seen": step * 64,
                "train_runtime": step * 0.1,
                "step": step,
            }
        )
        if step % 50 == 0:
            entries.append({"eval_loss": 2.1 / (1 + step * 1e-3), "epoch": step / 1000, "step": step})
    entries.append(
        {
            "train_runtime": step * 0.1,
            "train_samples_per_second": 80.0,
            "train_steps_per_second": 10.0,
            "train_loss": 1.0,
            "step": step,
        }
    )
    return entries


def _write(folder, entries):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "trainer_state.json").write_text(
        json.dumps({"global_step": entries[-1]["step"], "max_steps": 0, "log_history": entries})
    )
    return folder


def _entry_reads(monkeypatch, folder) -> int:
    """How often reading the run, its summary and every x axis looks at an entry's step."""
    calls = 0
    real = sessions.entry_step

    def counting(entry):
        nonlocal calls
        calls += 1
        return real(entry)

    for module in (sessions, history, curves):
        monkeypatch.setattr(module, "entry_step", counting)
    run = load_run(folder)
    summary_text(run)
    for axis in ("step", "epoch", "tokens", "time"):
        build_axis(run, axis)
    return calls


@pytest.mark.parametrize("resume_every", [None, 40], ids=["one session", "a session per 40 entries"])
def test_reading_a_run_looks_at_each_entry_a_bounded_number_of_times(tmp_path, monkeypatch, resume_every):
    """The algorithmic property behind the timing: twice the entries, about twice the work (the quadratic
    version read an entry's step about n/2 times per entry, 4x the work for 2x the entries)."""
    reads = {n: _entry_reads(monkeypatch, _write(tmp_path / str(n), _log(n, resume_every))) for n in (2000, 4000)}
    if resume_every:
        assert len(load_run(tmp_path / "4000").sessions) > 50
    assert reads[4000] <= 2.2 * reads[2000], reads
    assert reads[4000] <= 40 * 4000, reads


def test_a_200k_entry_log_is_reported_with_every_plot_faithful(tmp_path):
    folder = _write(tmp_path / "run", _log(200_000))
    start = time.perf_counter()
    report = write_report(folder)
    elapsed = time.perf_counter() - start
    assert "mean train loss" in report.text and (folder / "report" / "summary.txt").is_file()
    assert elapsed < 120, f"{elapsed:.1f} s (about 2 s on a 2-core machine)"  # generous: a hang, not a slowdown
    pytest.importorskip("matplotlib")
    from trainwell.report.plots import run_figures

    run = load_run(folder)
    figures = run_figures(run)
    for name, figure in figures.items():
        for line in figure.axes[0].get_lines():
            assert len(line.get_xdata()) <= 4002, name
    loss = figures["loss"].axes[0].get_lines()[0]
    assert loss.get_xdata()[-1] == run.series["loss"][-1][0]  # the last point is always drawn


def test_downsample_keeps_the_envelope_the_ends_and_the_gaps():
    points = [(float(i), math.sin(i / 500) + (5.0 if i == 123_457 else 0.0)) for i in range(300_000)]
    points[200_001] = (200_001.0, math.nan)
    kept = downsample(points, buckets=1000)
    assert len(kept) <= 2 * 1000 + 2 + 1000  # two per bucket, the ends, a non-finite point where there is one
    assert kept[0] == points[0] and kept[-1] == points[-1]
    assert points[123_457] in kept  # a one-step spike survives
    assert any(math.isnan(v) for _, v in kept)  # so does the gap a NaN draws
    assert max(v for _, v in kept if not math.isnan(v)) == max(v for _, v in points if not math.isnan(v))
    assert [x for x, _ in kept] == sorted(x for x, _ in kept)
    short = points[:500]
    assert downsample(short, buckets=1000) is short
