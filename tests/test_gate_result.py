"""The committed GPU gate record (benchmarks/results/<gpu>/gate.json, written by `make gpu-gate` on the H200 or the
H100, the newest of them by its date): it must exist, be a whole run (every group), show no failure, and have run on
this tree's source (its src/ digest), so that no change to code the GPU runs lands without a gate run on its final
revision (docs/gate.md)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from fuselab.gate.record import GROUPS, GateRecord, source_digest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
HOW = "run `make gpu-gate` on the GPU on the final revision and commit what it writes (docs/gate.md)"


@pytest.fixture(scope="module")
def record() -> GateRecord:
    records = [GateRecord.read(path) for path in sorted(RESULTS.glob("*/gate.json"))]
    assert records, f"no gate record under {RESULTS.relative_to(ROOT)}/<gpu>/gate.json: {HOW}"
    return max(records, key=lambda r: r.date)


def test_the_gate_ran_on_this_source_tree(record: GateRecord) -> None:
    assert record.src_digest == source_digest(), (
        f"src/fuselab changed since the gate ran (revision {record.revision}, {record.date}): {HOW}"
    )


def test_the_gate_record_is_a_whole_run(record: GateRecord) -> None:
    counts = record.counts()
    missing = [g for g in GROUPS if sum(counts.get(g, {}).values()) == 0]
    assert not missing, f"the gate record has no checks of {', '.join(missing)} (a partial run?): {HOW}"
    assert record.seconds > 0, f"the gate record is of a run cut short (no total time): {HOW}"
    assert counts["pytest"]["pass"] >= 100, f"only {counts['pytest']['pass']} GPU tests passed: {counts['pytest']}"
    assert str(record.environment.get("gpu", "")).startswith("NVIDIA"), record.environment


def test_the_gate_record_shows_no_failure(record: GateRecord) -> None:
    failed = [f"{c.group}: {c.name}: {c.detail}" for c in record.failures]
    assert not failed, f"{len(failed)} failed checks in the gate record, first: {failed[:3]}"


def test_the_gate_revision_is_this_history(record: GateRecord) -> None:
    """Where git is here, the recorded revision is a commit of this history (the tree's own or an ancestor whose
    src/ the digest above shows unchanged)."""
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the digest above ties the record to the tree")
    done = subprocess.run(["git", "-C", str(ROOT), "merge-base", "--is-ancestor", record.revision, "HEAD"],
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0, f"revision {record.revision} is not in this history: {done.stderr.strip()}"
