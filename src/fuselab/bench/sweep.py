"""Sweeps: run a grid of cases, append each finished case to a JSON-lines file at once, resume on rerun.

A case is a flat dict of JSON values (op, impl, shape, dtype, ...); `run_case(case)` returns the measured
fields. A case that raises (out of memory, compile error, unavailable backend) becomes a row with its error,
and the sweep goes on. On a rerun, cases whose row succeeded are skipped; failed ones are tried again.

Every row has a `status`: "ok", "error" (it raised), or the status of a :class:`NotRun` it raised ("unavailable",
"skipped", "refused": the case was not run, and `error` says why). Each row is appended with one `os.write` on a
file opened with O_APPEND, so a run killed mid-sweep leaves whole lines (at worst one torn last line, which the
next run cuts off with a warning before it appends).
"""

from __future__ import annotations

import contextlib
import itertools
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from fuselab.bench import distributed, record
from fuselab.bench.log import (  # noqa: F401  (the log's functions, where sweeps' users have imported them)
    SweepWarning,
    append_record,
    case_fields,
    case_key,
    latest_by_key,
    load_records,
    repair_log,
)
from fuselab.bench.shapes import format_shape

Case = Mapping[str, object] | record.Case  # a study's dict of JSON values, or an op's typed Case
MAX_ERROR_CHARS = 2000
PROGRESS_EVERY_S = 1.0  # without a terminal, a line per finished case, at most one a second (and the last)


Status = record.Status


class NotRun(Exception):
    """Raised by `run_case` for a case that is not run, on purpose: its row gets `status` and the message as `error`.

    Subclasses set `status`: "skipped" (not worth running here), "unavailable" (cannot run here), "refused" (would
    not fit). The message is the reason, shown as it is (no exception type in front of it).
    """

    status = Status.SKIPPED


class Unavailable(NotRun, RuntimeError):
    """An impl that cannot run here; the message says why."""

    status = Status.UNAVAILABLE


class Skipped(NotRun):
    """An impl not timed here on purpose; the message says why."""

    status = Status.SKIPPED


class TooBig(NotRun):
    """A case refused before it allocates: it would not fit in the device's free memory."""

    status = Status.REFUSED


def grid(**axes: Iterable[object]) -> list[Case]:
    """The cartesian product of the axes as cases: grid(impl=["a", "b"], n=[1, 2]) -> 4 cases."""
    names = list(axes)
    return [dict(zip(names, values, strict=True)) for values in itertools.product(*(list(v) for v in axes.values()))]


class Sweep:
    """A sweep's log, open while its cases run: the caller drives the loop and the harness keeps the log.

        with Sweep(cases, out, description="bench gelu") as sweep:
            for case in sweep:  # the cases not done in `out` (this rank's share under torchrun)
                with sweep.running(case) as outcome:
                    outcome.update(measure(case))  # what it raises becomes the row's status and error
        rows = sweep.rows  # one row per case, old and new, in case order

    Each row is the case's fields, the outcome's, `key`, `status` and `error` (None or why), appended to `out` as
    it is recorded. log(message): where to say what is resumed (under torchrun, on rank 0, also how the cases left
    are split) and, when progress is on but stderr is not a terminal (no live bar), a line per finished case, at
    most one a second (default: stderr; under torchrun it counts rank 0's share: "[rank 0: 3/6]"). `out` is locked while
    the sweep is open (`out.lock`): a second run on it stops with distributed.LogBusy. Under torchrun with more than
    one rank (fuselab.bench.distributed), the cases not done are split over the ranks by `cost` (estimated seconds,
    default 1 each), keeping cases with the same `group` key on one rank; each rank logs to its own part file, and
    every rank gets all rows.
    """

    def __init__(
        self,
        cases: Sequence[Case],
        out: str | Path | None = None,
        *,
        description: str = "sweep",
        show_progress: bool = True,
        log: Callable[[str], None] | None = None,
        cost: Callable[[Case], float] | None = None,
        group: Callable[[Case], str] | None = None,
    ) -> None:
        self.cases = list(cases)
        self.path = Path(out) if out is not None else None
        self.description, self.say = description, log or _stderr
        self.show_progress = show_progress and distributed.is_main()
        self.cost, self.group = cost, group
        self.todo: list[tuple[str, Case]] = []  # (key, case) to run here
        self.done: dict[str, dict] = {}  # key: row of the cases done in the log before (their error is None)
        self.log_to: Path | None = self.path
        self.extra: dict[str, object] = {}
        self._share = ""  # under torchrun, "rank k": progress counts this rank's share of the cases
        self._new: dict[str, dict] = {}
        self._stack = contextlib.ExitStack()
        self.rows: list[dict] = []

    def __enter__(self) -> Sweep:
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._stack as stack:
            if distributed.active():
                spread = distributed.Spread(self.cases, self.path, done_ok=_done, cost=self.cost, group=self.group)
                stack.enter_context(spread)
                self._spread, self.done, self.todo = spread, spread.kept, spread.mine
                self.log_to, self.extra = spread.part, spread.extra
                self._share = f"rank {distributed.rank()}"
                if distributed.is_main():  # what the spread does, said once (rank 0's progress counts its share)
                    self._say_resumed(sum(spread.shares))
                    if sum(spread.shares) and self.show_progress:
                        each = ", ".join(f"{n} on rank {k}" for k, n in enumerate(spread.shares))
                        self.say(f"{self.description}: {sum(spread.shares)} cases to run over "
                                 f"{len(spread.shares)} ranks ({each})")  # fmt: skip
            else:
                self._spread = None
                if self.path is not None:
                    stack.enter_context(distributed.LogLock(self.path))
                    repair_log(self.path)  # a torn last line, left by a run killed mid-write
                    distributed.merge_parts(self.path)  # rows a spread run left in part files
                    logged = latest_by_key(load_records(self.path))
                    self.done = {k: r for k, r in logged.items() if _done(r)}
                keys = [case_key(case) for case in self.cases]
                self.done = {k: self.done[k] for k in keys if k in self.done}
                self.todo = [(k, c) for k, c in zip(keys, self.cases, strict=True) if k not in self.done]
                self._say_resumed(len(self.todo))
            self._stack = stack.pop_all()
        live = self.show_progress and sys.stderr.isatty()
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   TextColumn("eta"), TimeRemainingColumn())  # fmt: skip
        self._progress = Progress(*columns, console=Console(stderr=True), disable=not live, transient=False)
        self._stack.enter_context(self._progress)
        self._task = self._progress.add_task(self._title(), total=len(self.todo))
        self._live, self._last_line = live, time.perf_counter()
        self._started, self._costs = time.perf_counter(), [self.cost(c) if self.cost else 1.0 for _, c in self.todo]
        self._groups = [self.group(c) if self.group else k for k, c in self.todo]
        return self

    def __iter__(self) -> Iterator[Case]:
        for _, case in self.todo:
            self._progress.update(self._task, description=f"{self._title()}: {_short(case)}")
            yield case
        self._progress.update(self._task, description=self._title())

    def _title(self) -> str:
        """The progress bar's label: the description, and under torchrun the rank whose share it counts."""
        return f"{self.description} [{self._share}]" if self._share else self.description

    def _say_resumed(self, left: int) -> None:
        if self.done:
            self.say(f"resuming {self.path}: {len(self.done)} of {len(self.cases)} cases done, {left} to run")

    @contextlib.contextmanager
    def running(self, case: Case) -> Iterator[dict[str, object]]:
        """An outcome to fill while `case` runs; recorded when the block ends. A NotRun raised in it gives the row
        its status and reason, any other exception status "error" and the message (the sweep goes on)."""
        start, outcome = time.perf_counter(), {}
        try:
            yield outcome
            outcome = {"status": Status.OK, **outcome, "error": None}
        except NotRun as exc:
            outcome = {"status": exc.status, "error": str(exc)[:MAX_ERROR_CHARS]}
        except torch.OutOfMemoryError as exc:
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            outcome = {"status": Status.ERROR, "error": f"out of memory: {_first_line(exc)}"}
        except Exception as exc:  # any failure of one case becomes its row; the sweep goes on
            outcome = {"status": Status.ERROR, "error": f"{type(exc).__name__}: {exc}".strip()[:MAX_ERROR_CHARS]}
        self.record(case, outcome, time.perf_counter() - start)

    def record(self, case: Case, outcome: Mapping[str, object], seconds: float = 0.0) -> dict:
        """Append the row of `case` (its fields, where it ran, `outcome`, its key) to the log; return it."""
        key = case_key(case)
        row = {**case_fields(case), **self.extra, **outcome, "key": key}
        self._new[key] = row
        if self.log_to is not None:
            append_record(self.log_to, row)
        self._progress.advance(self._task)
        now, n = time.perf_counter(), len(self._new)
        if self.show_progress and not self._live and (now - self._last_line >= PROGRESS_EVERY_S or n == len(self.todo)):
            done = f"[{self._share}: {n}/{len(self.todo)}]" if self._share else f"[{n}/{len(self.todo)}]"
            line = f"{self.description} {done} {_short(case)}: {row['status']} ({seconds:.1f} s)"
            self.say(line + self._eta(n, now))
            self._last_line = now
        return row

    def _eta(self, n: int, now: float) -> str:
        """', eta 12 s' after n of the cases to run: the time so far times the remaining cases' cost over the done
        ones' ('' after the last). A case of a group begun counts as done: a group's cases are run together, at its
        first (bench times a case's impls side by side)."""
        begun = set(self._groups[:n])
        done = sum(c for c, g in zip(self._costs, self._groups, strict=True) if g in begun)
        left = sum(self._costs) - done
        if n >= len(self._costs) or done <= 0:
            return ""
        return f", eta {_duration((now - self._started) * left / done)}"

    def __exit__(self, kind: object, *exc: object) -> None:
        try:
            if kind is None:
                rows = dict(self.done)
                if self._spread is not None:
                    self._spread.gather(self._new)
                    rows = self._spread.rows
                rows.update(self._new)
                self.rows = [rows[case_key(case)] for case in self.cases]
        finally:
            self._stack.__exit__(kind, *exc)


def run_sweep(
    cases: Sequence[Case],
    run_case: Callable[[Case], Mapping[str, object]],
    out: str | Path | None = None,
    **options: Any,
) -> list[dict]:
    """Run every case not already done in `out` with run_case(case) -> its fields; return one row per case (old
    and new), in case order. options: `Sweep`'s (description, show_progress, log, cost, group)."""
    with Sweep(cases, out, **options) as sweep:
        for case in sweep:
            with sweep.running(case) as outcome:
                outcome.update(run_case(case))
    return sweep.rows


def _done(row: Mapping[str, object]) -> bool:
    return row.get("error") is None


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _short(case: Case) -> str:
    parts = [
        format_shape(tuple(v)) if isinstance(v, list) and all(isinstance(d, int) for d in v) else str(v)
        for v in case_fields(case).values()
        if not isinstance(v, dict)
    ]
    return " ".join(parts)[:70]


def _duration(seconds: float) -> str:
    """0.42 -> '0.4 s', 75 -> '75 s', 750 -> '12.5 min', 9000 -> '2.5 h'."""
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.1f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
