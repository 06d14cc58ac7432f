"""The float64 reference in pieces: a case of bench, or a forward-only case of check (the gate's past-2^31 checks),
needs at most ~3x its input in memory, whatever the dtype (issue 24: a 2 GiB tensor peaked at 19.3 GB in bench; on an
80 GB H100 the gate refused its 2^31-element checks, each said to need 72-80 GiB), and the need stated in a refusal
covers what it takes.

Measured as the process's peak resident memory (Linux: VmHWM, reset through /proc/self/clear_refs) in a child
process, over one case of GELU; the pieces are made small (REFERENCE_PIECE_BYTES) so that a 64 MiB input shows
the structure (inputs, one output, the kept reference) and not the fixed size of a piece."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

CHILD = r"""
import json, sys, torch
import fuselab.ops
from fuselab.evaluate import cases as evaluate
from fuselab.bench import accuracy
from fuselab.evaluate.bench import bench_case
from fuselab.evaluate.check import check_case
from fuselab.bench.sweep import TooBig
from fuselab.ops.registry import get_op
from fuselab.bench.timer import Timing

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024

evaluate.REFERENCE_PIECE_BYTES = int(sys.argv[3])
op, dtype, numel, what = get_op("gelu"), getattr(torch, sys.argv[1]), int(sys.argv[2]), sys.argv[4]
options = {"approximate": "tanh"}
accuracy.POISON_BYTES = numel * dtype.itemsize  # check poisons one block of the output's size (a GPU's past 8 GiB)

def run(numel):
    if what == "check":
        return check_case(op, op.get_impl("torch"), (numel,), dtype, "cpu", options, 7, grad=False)
    return bench_case(op, [op.get_impl("torch")], (numel,), dtype, "cpu", options,
                      Timing(rep_ms=1, warmup_ms=1, min_reps=3), call_cost_ms=0)["torch"]

warm = run(4096)  # the first call's one-time costs (kernels, thread pools) out of the way
free = evaluate.free_bytes
evaluate.free_bytes = lambda device: 0  # what the refusal says this case needs
try:
    evaluate.refuse_if_too_big(op, (numel,), dtype, "cpu", options, pieces=True)
except TooBig as exc:
    stated = str(exc)
evaluate.free_bytes = free
start = status("VmRSS")
open("/proc/self/clear_refs", "w").write("5")  # VmHWM := VmRSS
row = run(numel)
print(json.dumps({"start": start, "peak": status("VmHWM"), "rel_err": row["rel_err"], "stated": stated,
                  "need": evaluate.case_memory(op, (numel,), dtype, options, pieces=True)}))
"""


@pytest.mark.skipif(not os.access("/proc/self/clear_refs", os.W_OK), reason="needs Linux's /proc/self/clear_refs")
@pytest.mark.parametrize("what", ["bench", "check"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_case_needs_at_most_three_times_its_input_in_memory(dtype: str, what: str) -> None:
    numel, piece = 2**24, 2**20  # 64 MiB of float32 input (32 MiB of bfloat16); pieces of 1 MiB of float64
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", CHILD, dtype, str(numel), str(piece), what],
                          capture_output=True, text=True, env=env, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.strip().splitlines()[-1])
    input_bytes = numel * (4 if dtype == "float32" else 2)
    used = got["peak"] - got["start"]
    assert 0 < got["rel_err"] < 1e-2  # the error was measured, against the reference
    assert used <= 3 * input_bytes + 16 * piece, f"peak {used / input_bytes:.2f}x the input"
    assert got["need"] >= used  # the need a refusal states covers what the case took
    assert "needs about" in got["stated"]


def test_a_16_bit_case_is_measured_against_the_reference_remade_beside_each_output(monkeypatch) -> None:
    """Nothing of float32 kept for bfloat16 inputs; the error summed piece by piece is the whole reference's, and a
    non-finite or misshapen output is still inf."""
    import torch

    from fuselab.bench.accuracy import relative_error
    from fuselab.evaluate import cases as evaluate
    from fuselab.ops.registry import get_op

    gelu = get_op("gelu")
    monkeypatch.setattr(evaluate, "REFERENCE_PIECE_BYTES", 5 * 129 * 8)  # 5 rows a piece
    x = gelu.make_inputs((37, 129), torch.bfloat16, "cpu", 3)[0]
    out = torch.nn.functional.gelu(x.float() * 1.001).to(torch.bfloat16)
    whole = gelu.reference(x.double(), approximate="none")
    for dtype, kept in ((torch.bfloat16, False), (torch.float32, True)):
        ref = evaluate.Reference(gelu, (x.to(dtype),), {"approximate": "none"})
        assert (ref.kept is not None) is kept and ref.rows == 5
        exact = relative_error(out.to(dtype), whole)
        assert ref.error(out.to(dtype)) == pytest.approx(exact, rel=1e-4 if kept else 1e-9)  # kept: float32's rounding
    bad = out.clone()
    bad[31, 7] = float("nan")
    assert ref.error(bad.float()) == math.inf
    assert evaluate.Reference(gelu, (x,), {"approximate": "none"}).error(out[:36]) == math.inf
