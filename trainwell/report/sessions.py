"""The sessions of a run: the ``train()`` calls whose entries one ``log_history`` holds, and what each cost.

How a resume shows up in ``log_history``. Resuming restores the checkpoint's ``TrainerState`` (trainwell's
``checkpoint/resume.py``, as the reference does), so a resumed run's history is the checkpoint's history
followed by what the new ``train()`` call logs, its step counter going on from the checkpoint's step. Two things
follow: what the earlier call logged after that checkpoint is gone, and so is its end-of-``train()`` summary
entry (``train_runtime``, ``train_samples_per_second``, ``train_loss``...), since checkpoints are written before
it. A resume is therefore seen by one of these marks, checked in this order:

1. a summary entry followed by more training (``train()`` called again on the same Trainer, or histories
   appended to each other); an evaluation logged after the summary at its step stays with its session;
2. the step going back, or a training loss logged twice at a step: a later session resumed from an earlier
   checkpoint and its entries were appended (the later session wins for the steps both logged);
3. the per-log ``train_runtime`` (seconds since the ``train()`` call started, logged with
   ``include_num_input_tokens_seen``) going back: the clock of a new call;
4. a summary that covers fewer steps than its session holds: ``train_steps_per_second x train_runtime`` is the
   number of steps that call trained (trainwell and the reference count only the call's own steps), so the
   entries before ``last step - that number`` came from an earlier, unsummarized call.

The resume point of a session is the last step logged before its first training loss (the checkpoint's step
when checkpoints fall on logging steps, as with the default ``save_steps`` and ``logging_steps``), or, when the
session's summary pins it to one step between that one and its first training loss, that step
(``summarized_start``: a checkpoint written between two logging steps, as a Ctrl-C writes one).
Only the standard library is used here.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from typing import Any

# Keys only the end-of-train() summary has (per-log entries carry train_runtime and train_tokens_per_second too).
_SUMMARY_ONLY = ("train_loss", "train_samples_per_second", "train_steps_per_second")
# train_steps_per_second is logged rounded to 3 decimals, so steps/s x runtime may be off by up to half the last
# digit times the runtime: a slow run (0.012 steps/s for days) cannot tell a resume from rounding that way.
_RATE_ROUNDING = 0.0005


def is_summary(entry: dict[str, Any]) -> bool:
    """Whether ``entry`` is the summary ``train()`` logs when it returns (has a key of ``_SUMMARY_ONLY``, spelled
    out: this runs for every entry)."""
    return "train_loss" in entry or "train_samples_per_second" in entry or "train_steps_per_second" in entry


def entry_step(entry: dict[str, Any]) -> int:
    """The entry's ``step`` (0 when it has none, or one that is not a finite number: see ``bad_step``)."""
    step = entry.get("step", 0)
    if type(step) is int:  # the common case, first: this runs for every entry, several times
        return step
    return int(step) if isinstance(step, float) and math.isfinite(step) else 0


def bad_step(entry: dict[str, Any]) -> str | None:
    """Why the entry's ``step`` cannot place it (NaN, infinite, a string, a bool), or None when it is a finite
    number or absent."""
    step = entry.get("step")
    if step is None and "step" not in entry:
        return None
    if isinstance(step, int) and not isinstance(step, bool) or isinstance(step, float) and math.isfinite(step):
        return None
    return f"step {step!r} is not a finite number"


def number(value: Any) -> float | None:
    """``value`` as a float when it is a finite or non-finite JSON number (never a bool), else None. An integer
    too large for a float becomes an infinity of its sign."""
    kind = type(value)
    if kind is float:
        return value
    if kind is bool or not isinstance(value, (int, float)):
        return None
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


@dataclass
class Session:
    """One ``train()`` call: its entries as logged (``summary`` apart), where it started and what it cost."""

    index: int
    entries: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] | None = None
    #: the step it resumed from (0 for the first session)
    start_step: int = 0
    #: ``num_input_tokens_seen`` at the resume point (0 for the first session or when not logged)
    start_tokens: float = 0.0
    _memo: dict[str, tuple[tuple[int, int, int], Any]] = field(default_factory=dict, init=False, repr=False,
                                                               compare=False)

    def _remembered(self, name: str, compute: Any) -> Any:
        """``compute()``, kept while the entries (by count), the summary and the start step stay the same: the
        tables and the summary ask a session's end step and clock many times, each a pass over its entries."""
        key = (len(self.entries), id(self.summary), self.start_step)
        known = self._memo.get(name)
        if known is None or known[0] != key:
            known = self._memo[name] = (key, compute())
        return known[1]

    @property
    def end_step(self) -> int:
        return self._remembered("end_step", lambda: max(
            (entry_step(e) for e in [*self.entries, *([self.summary] if self.summary else [])]),
            default=self.start_step))

    @property
    def trained_steps(self) -> int:
        """Optimizer steps this call trained (steps another session trained again are counted in both)."""
        return max(self.end_step - self.start_step, 0)

    @property
    def clock(self) -> float | None:
        """The largest per-log ``train_runtime``: how long the call had run at its last log."""
        return self._remembered("clock", lambda: max(
            (v for e in self.entries if (v := number(e.get("train_runtime"))) is not None), default=None))

    @property
    def runtime(self) -> float | None:
        """Seconds the call ran: the summary's ``train_runtime``, else (a call that ended without its summary)
        the clock at its last log, a lower bound; None when neither was logged."""
        value = number(self.summary.get("train_runtime")) if self.summary else None
        return value if value is not None else self.clock

    @property
    def runtime_is_complete(self) -> bool:
        return self.summary is not None and number(self.summary.get("train_runtime")) is not None

    @property
    def samples(self) -> float | None:
        """Samples trained: steps x the samples per step the summary implies (its two rates divided), so the
        number stays right whether a summary's rates count the call's steps only or the whole run's."""
        if not self.summary:
            return None
        per_second, steps_per_second = (number(self.summary.get(k)) for k in ("train_samples_per_second",
                                                                             "train_steps_per_second"))
        if not per_second or not steps_per_second:
            return None
        return self.trained_steps * per_second / steps_per_second

    @property
    def tokens(self) -> float | None:
        """Input tokens trained (``num_input_tokens_seen`` at the end minus at the resume point)."""
        seen = [v for e in [*self.entries, self.summary or {}] if (v := number(e.get("num_input_tokens_seen")))]
        return max(seen) - self.start_tokens if seen else None

    @property
    def mean_loss(self) -> float | None:
        """The training loss averaged over the call's steps: the summary's ``train_loss``, else the logged
        losses weighted by the steps each one averages (a log's ``loss`` is the mean since the previous log)."""
        value = number(self.summary.get("train_loss")) if self.summary else None
        if value is not None:
            return value
        return weighted_mean_loss(self.entries, self.start_step)

    def rate(self, amount: float | None) -> float | None:
        """``amount`` per second of ``runtime`` (None when either is unknown)."""
        runtime = self.runtime
        return amount / runtime if amount is not None and runtime else None


def weighted_mean_loss(entries: list[dict[str, Any]], start_step: int = 0) -> float | None:
    """The mean of the logged training losses, each weighted by the steps since the previous log (a NaN or
    infinite log is left out, with the steps it averaged)."""
    total, steps, previous = 0.0, 0, start_step
    for entry in entries:
        loss, step = number(entry.get("loss")), entry_step(entry)
        if loss is None or step <= previous:
            continue
        if math.isfinite(loss):
            total, steps = total + loss * (step - previous), steps + step - previous
        previous = step
    return total / steps if steps else None


def split_sessions(log_history: list[dict[str, Any]], resumes: dict[int, float] | None = None) -> list[Session]:
    """The sessions of ``log_history``, in order (see the module docstring for the marks of a resume). Entries
    that are not JSON objects are skipped. Linear in the length of the history (``_Marks`` keeps what the
    current session has logged so far, so no entry is looked at twice). ``resumes``: the steps the run is known
    to have resumed from (the live log's session lines), each with its ``num_input_tokens_seen``; a session whose
    resume point the history only brackets takes the known step inside the bracket, and a history that
    runs on past a known resume step is split there (a crash leaves no mark of its own in the history)."""
    sessions = [Session(1)]
    marks = _Marks(sorted(resumes or {}))
    for entry in log_history:
        if not isinstance(entry, dict):
            continue
        final = is_summary(entry)
        if marks.place(entry, final):
            sessions.append(Session(len(sessions) + 1))
        if final:
            sessions[-1].summary = entry
        else:
            sessions[-1].entries.append(entry)
    sessions = [s for part in sessions for s in _split_by_summary(part)]
    for index, session in enumerate(sessions, start=1):
        session.index = index
    _set_resume_points(sessions, resumes or {})
    return sessions


class _Marks:
    """What the session being read has logged so far: its last step, the step of its last training loss, its
    clock (the largest per-log ``train_runtime``) and whether its summary came, kept up to date entry by entry."""

    def __init__(self, resumes: list[int] | None = None) -> None:
        self.resumes = resumes or []  # known resume steps, sorted: an entry past one after an entry before it
        self._reset()

    def _reset(self) -> None:
        self.end_step: int | None = None
        self.loss_step: int | None = None
        self.clock: float | None = None
        self.summarized = False

    def place(self, entry: dict[str, Any], final: bool) -> bool:
        """Take ``entry`` (``final``: an end-of-``train()`` summary) into account; True when it starts a new
        session (the marks then describe that one)."""
        step = entry_step(entry)
        clock = None if final else number(entry.get("train_runtime"))
        new = self.end_step is not None and self._starts_new_session(entry, final, step, clock)
        if new:
            self._reset()
        self.end_step = step if self.end_step is None or step > self.end_step else self.end_step
        if final:
            self.summarized = True
            return new
        if "loss" in entry:
            self.loss_step = step
        if clock is not None and (self.clock is None or clock > self.clock):
            self.clock = clock
        return new

    def _starts_new_session(self, entry: dict[str, Any], final: bool, step: int, clock: float | None) -> bool:
        if self.summarized:  # an evaluation after train() returned belongs to the run it evaluated
            return final or "loss" in entry or step != self.end_step
        if self.end_step is not None and step < self.end_step:
            return True
        if self.resumes and not final:  # the history crosses a known resume point: the resumed call's first entry
            after = bisect.bisect_left(self.resumes, self.end_step)
            if after < len(self.resumes) and self.resumes[after] < step:
                return True
        if "loss" in entry and self.loss_step is not None and step <= self.loss_step:
            return True
        return clock is not None and self.clock is not None and clock < self.clock


def _split_by_summary(session: Session) -> list[Session]:
    """``session`` alone, or, when its summary covers fewer steps than its entries span, an earlier
    unsummarized session (the entries up to the resume point) and this one."""
    summary = session.summary
    # rollback_on_spike restarts the call from a checkpoint inside it: its summary then covers the steps since the
    # last rollback (trainwell.loop.rollback), which is no sign of an earlier call.
    if not summary or not session.entries or any("rollback" in e for e in session.entries):
        return [session]
    steps_per_second, runtime = number(summary.get("train_steps_per_second")), number(summary.get("train_runtime"))
    if not steps_per_second or not runtime:
        return [session]
    start = session.end_step - round(steps_per_second * runtime)
    tolerance = 1.0 + _RATE_ROUNDING * runtime
    # Only a history logged clearly before the implied start holds an earlier call (not rounding noise).
    if not any("loss" in e and entry_step(e) < start - tolerance for e in session.entries):
        return [session]
    # The call began at a logged step near the implied start (a checkpoint on a logging step), else at the start
    # itself, between two logged steps (a checkpoint that Ctrl-C wrote, or save_steps off the logging grid).
    near = [s for s in {entry_step(e) for e in session.entries} if s < session.end_step and abs(s - start) <= tolerance]
    cut = min(near, key=lambda s: abs(s - start)) if near else start
    earlier = [e for e in session.entries if entry_step(e) <= cut]
    later = [e for e in session.entries if entry_step(e) > cut]
    if not earlier or not any("loss" in e for e in later):
        return [session]
    return [Session(0, earlier), Session(0, later, summary)]


def _set_resume_points(sessions: list[Session], resumes: dict[int, float]) -> None:
    """Each later session's resume point: the highest step below its first training step that an earlier
    session logged (the first entry logged at that step gives ``start_tokens``), made exact by a known resume
    step between that step and the first training step (``resumes``, else the summary: ``summarized_start``:
    a Ctrl-C checkpoint falls between two logging steps). One pass over the entries,
    the "highest step below" found in a ``PrefixMax`` (log time per query), so even a history of thousands of
    sessions is read in about linear time."""
    if len(sessions) < 2:
        return
    steps = sorted({entry_step(e) for s in sessions for e in s.entries})
    seen = PrefixMax(len(steps))
    first_at: dict[int, dict[str, Any]] = {}
    for k, session in enumerate(sessions):
        first = first_training_step(session) if k else None
        found = seen.query(bisect.bisect_left(steps, first)) if first is not None else -1
        if k and found < 0:
            session.start_step = sessions[k - 1].end_step
        elif k:
            resume = first_at[steps[found]]
            session.start_step = entry_step(resume)
            session.start_tokens = number(resume.get("num_input_tokens_seen")) or 0.0
        if k and first is not None:
            known = [step for step in resumes if session.start_step <= step < first]
            exact = max(known) if known else summarized_start(session)
            if exact is not None and session.start_step <= exact < first:
                session.start_step = exact
            if known:
                session.start_tokens = resumes[exact] or session.start_tokens
        for entry in session.entries:
            step = entry_step(entry)
            if step not in first_at:
                first_at[step] = entry
                position = bisect.bisect_left(steps, step)
                seen.update(position, position)


def summarized_start(session: Session) -> int | None:
    """The step a summarized ``train()`` call started from: its last step minus the steps it trained
    (``train_steps_per_second x train_runtime``), when the rounding of the logged numbers leaves exactly one
    whole step it can be; None otherwise (no summary, or a call too long to pin to one step).

    This is how a resume from a checkpoint between two logging steps (``checkpoint-101`` with ``logging_steps``
    10, written by a Ctrl-C) is placed at 101, where the entries alone only show that it came after step 100.
    """
    summary = session.summary
    if not summary:
        return None
    steps_per_second, runtime = number(summary.get("train_steps_per_second")), number(summary.get("train_runtime"))
    if not steps_per_second or not runtime or not math.isfinite(steps_per_second * runtime):
        return None
    start = session.end_step - steps_per_second * runtime
    # steps: the rate's rounding (3 decimals) times the runtime, the runtime's (4 decimals) times the rate
    error = _RATE_ROUNDING * runtime + 0.00005 * steps_per_second + 1e-6
    nearest = round(start)
    return nearest if error < 0.5 and abs(start - nearest) <= error else None


class PrefixMax:
    """A Fenwick tree over positions ``0..size-1``: ``update(i, value)`` raises position ``i`` to ``value``;
    ``query(n)`` is the largest value among positions ``< n`` (-1 when none was set). Both in log time."""

    def __init__(self, size: int) -> None:
        self._tree = [-1] * (size + 1)

    def update(self, position: int, value: int) -> None:
        i = position + 1
        while i < len(self._tree):
            if self._tree[i] < value:
                self._tree[i] = value
            i += i & -i

    def query(self, count: int) -> int:
        best, i = -1, count
        while i > 0:
            best = max(best, self._tree[i])
            i -= i & -i
        return best


def first_training_step(session: Session) -> int | None:
    """The step of the session's first training log (its first entry's when it logged no loss)."""
    losses = [entry_step(e) for e in session.entries if "loss" in e]
    if losses:
        return min(losses)
    return min((entry_step(e) for e in session.entries), default=None)


def merged_entries(sessions: list[Session]) -> list[tuple[int, dict[str, Any]]]:
    """``(session index, entry)`` for the run's curves: where sessions overlap, the later one wins (an earlier
    session's entries at or after a later session's first training step are left out)."""
    parts: list[list[tuple[int, dict[str, Any]]]] = []
    cutoff = math.inf
    for session in reversed(sessions):
        parts.append([(session.index, e) for e in session.entries if entry_step(e) < cutoff])
        first = first_training_step(session)
        if first is not None:
            cutoff = min(cutoff, first)
    return [pair for part in reversed(parts) for pair in part]


def trained_spans(sessions: list[Session], last_step: Any = None) -> list[tuple[int, int]]:
    """``(first, last)`` step each session trained, as far as the run tells: its logs reach ``end_step`` only, but
    a session trained at least up to the step the next one resumed from (the checkpoint it saved there), and the
    last one up to ``last_step`` (the run's ``global_step``, a step past the last log) when that is further."""
    ends = [s.end_step for s in sessions]
    for i in range(len(sessions) - 1):
        ends[i] = max(ends[i], sessions[i + 1].start_step)
    final = number(last_step)
    if sessions and final is not None and math.isfinite(final):
        ends[-1] = max(ends[-1], int(final))
    return [(s.start_step, end) for s, end in zip(sessions, ends)]

