"""A shape too big for the free memory (issue 24: `--shape 2^34`): every command refuses it before allocating, in one
line on stderr that says what it needs, exit 2, with nothing else printed."""

from __future__ import annotations

import re

import pytest
from clirun import ROOT, one_line_error  # tests/cli/clirun.py

NEEDS = re.compile(r"needs about [\d.]+ [GT]iB \(inputs.*\), [\d.]+ [GMT]iB free on cpu$")
# what some of them need, to the GiB (2^34 float32 elements are 64 GiB; check also holds the float64 reference)
EXACT = {
    "check gelu --shape 2^34": "refused before allocating: 17179869184 needs about 576 GiB (inputs, outputs and the "
    "float64 reference)",
    "profile gelu --shape 2^34": "17179869184 needs about 128 GiB (inputs and outputs)",
    "inspect gelu --shape 2^34": "17179869184 needs about 128 GiB (inputs and outputs)",
}


@pytest.mark.parametrize(
    "args",
    [
        ["check", "gelu", "--shape", "2^34"],
        ["check", "softmax", "--shape", "2^17x2^17", "--dtype", "bf16"],
        ["bench", "gelu", "--shape", "2^34"],
        ["bench", "softmax", "--impl", "torch", "--shape", "2^17x2^17", "--shape", "2^18x2^17"],
        ["profile", "gelu", "--shape", "2^34"],
        ["profile", f"{ROOT}/tests/data/userfn.py:add", "--nargs", "2", "--shape", "2^34"],
        ["inspect", "gelu", "--shape", "2^34"],
    ],
    ids=lambda args: " ".join(args).replace(str(ROOT) + "/", ""),
)
def test_a_shape_that_cannot_fit_is_refused_in_one_line_before_anything_runs(fuselab, args, tmp_path):
    out = fuselab(*args, *([] if args[0] == "inspect" else ["--device", "cpu"]))
    line = one_line_error(out, args[0], EXACT.get(" ".join(args), ""))
    assert NEEDS.search(line), line
    assert out.stdout == ""  # no table, no progress, no file written
    assert not list(tmp_path.glob("fuselab-*"))


def test_a_bench_log_gets_no_rows_of_cases_that_never_ran(fuselab, tmp_path):
    log = tmp_path / "big.jsonl"
    out = fuselab("bench", "gelu", "--impl", "torch", "--dtype", "fp32", "--shape", "2^36", "--out", str(log))
    one_line_error(out, "bench", "68719476736 needs about", "free on cpu")
    assert not log.exists() or log.read_text() == ""
