"""A pytest plugin (``pytest -p fuselab.gate.pytest_log``) that appends every collected test and every outcome to
the JSON-lines file named by FUSELAB_GATE_PYTEST_LOG as it happens, so that a run stopped by a time cap still says
which tests passed, failed, and never finished."""

from __future__ import annotations

import json
import os

import pytest

LOG_VARIABLE = "FUSELAB_GATE_PYTEST_LOG"


def _append(record: dict) -> None:
    path = os.environ.get(LOG_VARIABLE)
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(record) + "\n")


def pytest_collection_finish(session: pytest.Session) -> None:
    _append({"collected": [item.nodeid for item in session.items]})


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """One line per test: its outcome at the first phase that did not pass, else at the call."""
    if report.when == "call" or report.outcome != "passed":
        text = ""
        if report.outcome == "skipped" and isinstance(report.longrepr, tuple):
            text = str(report.longrepr[2])
        elif report.outcome == "failed":
            text = (report.longreprtext or "").strip().splitlines()[-1:][0] if report.longreprtext else ""
        _append({"test": report.nodeid, "when": report.when, "outcome": report.outcome,
                 "seconds": report.duration, "detail": text[:400]})  # fmt: skip
