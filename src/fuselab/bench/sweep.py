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
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

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


def grid(**axes: Iterable[object]) -> list[Case]:
    """The cartesian product of the axes as cases: grid(impl=["a", "b"], n=[1, 2]) -> 4 cases."""
    names = list(axes)
    return [dict(zip(names, values, strict=True)) for values in itertools.product(*(list(v) for v in axes.values()))]


def run_sweep(
    cases: Sequence[Case],
    run_case: Callable[[Case], Mapping[str, object]],
    out: str | Path | None = None,
    *,
    description: str = "sweep",
    show_progress: bool = True,
    log: Callable[[str], None] | None = None,
    cost: Callable[[Case], float] | None = None,
    group: Callable[[Case], str] | None = None,
) -> list[dict]:
    """Run every case not already done in `out`; return one row per case (old and new), in case order.

    Each row is the case's fields, the fields run_case returned, `key`, `status` and `error` (None or why).
    log(message): where to say what is resumed and, when progress is on but stderr is not a terminal (no live bar),
    a line per finished case, at most one a second (default: stderr).
    `out` is locked while the sweep runs (`out.lock`): a second run on it stops with distributed.LogBusy.
    Under torchrun with more than one rank (fuselab.bench.distributed), the cases not done are split over the
    ranks by `cost` (estimated seconds, default 1 each), keeping cases with the same `group` key on one rank;
    each rank logs to its own part file, and every rank returns all rows.
    """
    say = log or _stderr
    path = Path(out) if out is not None else None
    done: dict[str, dict] = {}
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)

    def run_cases(todo: list[tuple[str, Case]], part: Path | None, extra: dict) -> dict[str, dict]:
        main = distributed.is_main()
        return _run_cases(todo, run_case, part, extra, description, show_progress and main, say)

    if distributed.active():
        return distributed.run_spread(cases, run_cases, path, done_ok=_done, cost=cost, group=group)
    with distributed.LogLock(path) if path is not None else contextlib.nullcontext():
        if path is not None:
            repair_log(path)  # a torn last line, left by a run killed mid-write
            distributed.merge_parts(path)  # rows a spread run left in part files
            done = latest_by_key(load_records(path))
        rows: dict[str, dict] = {}
        todo = []
        for case in cases:
            key = case_key(case)
            if key in done and _done(done[key]):
                rows[key] = done[key]
            else:
                todo.append((key, case))
        if rows:
            say(f"resuming {path}: {len(rows)} of {len(cases)} cases done, {len(todo)} to run")
        rows.update(run_cases(todo, path, {}))
    return [rows[case_key(case)] for case in cases]


def _done(row: Mapping[str, object]) -> bool:
    return row.get("error") is None


def _run_cases(
    todo: Sequence[tuple[str, Case]],
    run_case: Callable[[Case], Mapping[str, object]],
    path: Path | None,
    extra: Mapping[str, object],
    description: str,
    show_progress: bool,
    say: Callable[[str], None],
) -> dict[str, dict]:
    """Run (key, case) pairs in order, appending each row (case, `extra`, results, key) to `path` as it finishes."""
    rows: dict[str, dict] = {}
    live = show_progress and sys.stderr.isatty()
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TextColumn("eta"), TimeRemainingColumn())  # fmt: skip
    last_line = time.perf_counter()
    with Progress(*columns, console=Console(stderr=True), disable=not live, transient=False) as progress:
        task = progress.add_task(description, total=len(todo))
        for i, (key, case) in enumerate(todo, 1):
            progress.update(task, description=f"{description}: {_short(case)}")
            start = time.perf_counter()
            row = {**case_fields(case), **extra, **_run_one(run_case, case), "key": key}
            rows[key] = row
            if path is not None:
                append_record(path, row)
            progress.advance(task)
            now = time.perf_counter()
            if show_progress and not live and (now - last_line >= PROGRESS_EVERY_S or i == len(todo)):
                say(f"{description} [{i}/{len(todo)}] {_short(case)}: {row['status']} ({now - start:.1f} s)")
                last_line = now
        progress.update(task, description=description)
    return rows


def _run_one(run_case: Callable[[Case], Mapping[str, object]], case: Case) -> dict[str, object]:
    try:
        return {"status": Status.OK, **run_case(case), "error": None}
    except NotRun as exc:
        return {"status": exc.status, "error": str(exc)[:MAX_ERROR_CHARS]}
    except torch.OutOfMemoryError as exc:
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return {"status": Status.ERROR, "error": f"out of memory: {_first_line(exc)}"}
    except Exception as exc:  # any failure of one case becomes its row; the sweep goes on
        return {"status": Status.ERROR, "error": f"{type(exc).__name__}: {exc}".strip()[:MAX_ERROR_CHARS]}


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _short(case: Case) -> str:
    parts = [
        format_shape(tuple(v)) if isinstance(v, list) and all(isinstance(d, int) for d in v) else str(v)
        for v in case_fields(case).values()
        if not isinstance(v, dict)
    ]
    return " ".join(parts)[:70]


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
