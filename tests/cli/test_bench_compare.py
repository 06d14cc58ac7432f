"""`fuselab bench ... --compare BASELINE.json --threshold 5%`, as pytest-benchmark's and asv's users write it: the
threshold with or without its %, the table of ratios per case with the regressions marked, exit 1 past the threshold,
and a baseline from another device named (issue 24)."""

from __future__ import annotations

import json

from clirun import ROOT  # tests/cli/clirun.py

USERFN = ROOT / "tests" / "data" / "userfn.py"
ARGS = ["bench", f"{USERFN}:scaled_tanh", "--shape", "1000", "--shape", "2^12", "--dtype", "fp32"]
ARGS += ["--rep-ms", "5", "--warmup-ms", "1", "--call-cost-ms", "0"]


def test_the_threshold_takes_a_percent_sign_and_another_device_is_named(fuselab, tmp_path):
    base = tmp_path / "base.json"
    assert fuselab(*ARGS, "--out", str(base)).returncode == 0
    data = json.loads(base.read_text())
    for record in data["records"]:
        record["median_ms"] /= 1000  # the baseline was 1000x faster everywhere (a busy CPU cannot undo that)
        record.update(device="cuda", gpu="NVIDIA H200")
    base.write_text(json.dumps(data))
    out = fuselab(*ARGS, "--compare", str(base), "--threshold", "5%", env={"COLUMNS": "250"})
    assert out.returncode == 1, out.stderr
    table = [line for line in out.stdout.splitlines() if "│" in line and "regressed" in line]
    assert len(table) == 2
    assert "2 of 2 cases regressed past 5% slower" in out.stdout
    assert "the baseline ran on NVIDIA H200, this run on cpu" in out.stdout
    bad = fuselab(*ARGS, "--compare", str(base), "--threshold", "five")
    assert bad.returncode == 2 and "--threshold" in bad.stderr and "five" in bad.stderr
