"""The results log: one JSON object a line, appended one whole line at a time, read back with a torn tail repaired.

What sweeps (fuselab.bench.sweep) and sweeps spread over ranks (fuselab.bench.distributed) both write and read.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path

from fuselab.bench.record import Case


class SweepWarning(UserWarning):
    """Something about a results log the user should know (a torn last line was cut off, a damaged line left out)."""


def case_fields(case: Case | Mapping[str, object]) -> dict[str, object]:
    """A case's flat JSON fields (a Case's `to_json`, a study's dict as it is)."""
    return case.to_json() if isinstance(case, Case) else dict(case)


def case_key(case: Case | Mapping[str, object]) -> str:
    """The log's key of a case: its JSON fields, keys sorted."""
    return json.dumps(case_fields(case), sort_keys=True, default=str)


def load_records(path: str | Path) -> list[dict]:
    """All rows of a JSON-lines results file. A torn last line (a run killed mid-write) is left out quietly; a line
    before it that is not JSON (the file was edited or damaged) is left out with a SweepWarning naming it, so that
    its case runs again."""
    path = Path(path)
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
    records = []
    for number, line in enumerate(lines, start=1):
        line = line.strip()
        if not line:
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as exc:
            if number - 1 != last:
                warnings.warn(
                    f"{path}:{number}: not a JSON row ({exc.msg}); left out, so that its case runs again",
                    SweepWarning,
                    stacklevel=2,
                )
    return records


def repair_log(path: str | Path) -> int:
    """Cut off a torn last line (a run killed mid-write) so the next append starts on a line of its own.

    Returns the bytes removed (0 when the file is whole or missing) and warns (SweepWarning) when it removes any.
    """
    path = Path(path)
    if not path.exists():
        return 0
    data = path.read_bytes()
    if not data or data.endswith(b"\n"):
        return 0
    keep = data.rfind(b"\n") + 1  # 0 when the only line is torn
    torn = len(data) - keep
    with path.open("r+b") as f:
        f.truncate(keep)
    warnings.warn(
        f"{path}: its last line was cut short (a run killed mid-write?); removed it ({torn} bytes), "
        "so that case runs again",
        SweepWarning,
        stacklevel=2,
    )
    return torn


def latest_by_key(records: Iterable[dict]) -> dict[str, dict]:
    """The last row of each case (a retried case keeps its newest row)."""
    latest: dict[str, dict] = {}
    for record in records:
        if "key" in record:
            latest[record["key"]] = record
    return latest


def append_record(path: Path, record: Mapping[str, object]) -> None:
    """Append one row as one line, with a single write on an O_APPEND descriptor (whole lines, even when killed)."""
    data = (json.dumps(record, default=str) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        written = os.write(fd, data)
        while written < len(data):  # a regular file takes it all at once but for a full disk; finish the line
            written += os.write(fd, data[written:])
    finally:
        os.close(fd)
