"""Sweeps: run a grid of cases, append each finished case to a JSON-lines file at once, resume on rerun.

A case is a flat dict of JSON values (op, impl, shape, dtype, ...); `run_case(case)` returns the measured
fields. A case that raises (out of memory, compile error, unavailable backend) becomes a row with its error,
and the sweep goes on. On a rerun, cases whose row succeeded are skipped; failed ones are tried again.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

import torch
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from fuselab.bench import distributed

Case = dict[str, object]
MAX_ERROR_CHARS = 2000


def grid(**axes: Iterable[object]) -> list[Case]:
    """The cartesian product of the axes as cases: grid(impl=["a", "b"], n=[1, 2]) -> 4 cases."""
    names = list(axes)
    return [dict(zip(names, values, strict=True)) for values in itertools.product(*(list(v) for v in axes.values()))]


def case_key(case: Mapping[str, object]) -> str:
    return json.dumps(case, sort_keys=True, default=str)


def load_records(path: str | Path) -> list[dict]:
    """All rows of a JSON-lines results file; a torn last line (a run killed mid-write) is ignored."""
    path = Path(path)
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def latest_by_key(records: Iterable[dict]) -> dict[str, dict]:
    """The last row of each case (a retried case keeps its newest row)."""
    latest: dict[str, dict] = {}
    for record in records:
        if "key" in record:
            latest[record["key"]] = record
    return latest


def append_record(path: Path, record: Mapping[str, object]) -> None:
    with path.open("a") as f:
        f.write(json.dumps(record, default=str) + "\n")
        f.flush()


def run_sweep(
    cases: Sequence[Case],
    run_case: Callable[[Case], Mapping[str, object]],
    out: str | Path | None = None,
    *,
    description: str = "sweep",
    show_progress: bool = True,
    cost: Callable[[Case], float] | None = None,
    group: Callable[[Case], str] | None = None,
) -> list[dict]:
    """Run every case not already done in `out`; return one row per case (old and new), in case order.

    Each row is the case's fields, the fields run_case returned, `key`, and `error` (None or the message).
    `out` is locked while the sweep runs (`out.lock`): a second run on it stops with distributed.LogBusy.
    Under torchrun with more than one rank (fuselab.bench.distributed), the cases not done are split over the
    ranks by `cost` (estimated seconds, default 1 each), keeping cases with the same `group` key on one rank;
    each rank logs to its own part file, and every rank returns all rows.
    """
    path = Path(out) if out is not None else None
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)

    def run_cases(todo: list[tuple[str, Case]], log: Path | None, extra: dict) -> dict[str, dict]:
        return _run_cases(todo, run_case, log, extra, description, show_progress and distributed.is_main())

    if distributed.active():
        return distributed.run_spread(cases, run_cases, path, done_ok=_done, cost=cost, group=group)
    with distributed.LogLock(path) if path is not None else contextlib.nullcontext():
        if path is not None:
            distributed.merge_parts(path)  # rows a spread run left in part files
        done = latest_by_key(load_records(path)) if path is not None else {}
        rows: dict[str, dict] = {}
        todo = []
        for case in cases:
            key = case_key(case)
            if key in done and _done(done[key]):
                rows[key] = done[key]
            else:
                todo.append((key, case))
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
) -> dict[str, dict]:
    """Run (key, case) pairs in order, appending each row (case, `extra`, results, key) to `path` as it finishes."""
    rows: dict[str, dict] = {}
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, disable=not show_progress, transient=False) as progress:
        task = progress.add_task(description, total=len(todo))
        for key, case in todo:
            progress.update(task, description=f"{description}: {_short(case)}")
            row = {**case, **extra, **_run_one(run_case, case), "key": key}
            rows[key] = row
            if path is not None:
                append_record(path, row)
            progress.advance(task)
        progress.update(task, description=description)
    return rows


def _run_one(run_case: Callable[[Case], Mapping[str, object]], case: Case) -> dict[str, object]:
    try:
        return {**run_case(case), "error": None}
    except torch.OutOfMemoryError as exc:
        torch.cuda.empty_cache()
        return {"error": f"out of memory: {_first_line(exc)}"}
    except Exception as exc:  # any failure of one case becomes its row; the sweep goes on
        detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        return {"error": detail[:MAX_ERROR_CHARS]}


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _short(case: Mapping[str, object]) -> str:
    return " ".join(str(v) for v in case.values() if not isinstance(v, dict | list))[:60]
