"""The every-shape and cost-of-a-call sections, run for real on the CPU with a tiny budget on the toy op (scaled add,
defined outside fuselab's ops folder): the ratio tables, the ladder of sizes, the plots, and what cannot run."""

import dataclasses
import json
import math
import sys
from pathlib import Path

import pytest
import torch

from fuselab.bench import ceilings
from fuselab.bench.shapes import draw_size
from fuselab.bench.timer import Timing
from fuselab.evaluate import bound_from, compiled_call_cost, draw_op_shapes, ladder_shapes, load_of
from fuselab.report.runner import Context, Section, run_section
from fuselab.report.sections.call_cost import call_cost_section
from fuselab.report.sections.every_shape import every_shape_section

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ops"))
import toy_op

PNG = b"\x89PNG\r\n\x1a\n"
TINY = Timing(warmup_ms=1.0, min_warmup=1, rep_ms=3.0, min_reps=3, max_reps=8)
EVERY_SHAPE = {"n": 6, "seed": 5, "max_bytes": 2**17, "max_flops": None, "dtypes": 1, "compiled": False, "timing": TINY}
CALL_COST = {
    "min_bytes": 2**12,
    "max_bytes": 2**18,
    "factor": 4,
    "max_flops": None,
    "call_cost_ms": 3.0,
    "compiled": False,
    "compile_modes": ("reduce-overhead",),  # a GPU's: on the CPU the section leaves them out
    "compile_deadline_s": 60.0,
    "timing": TINY,
}


def toy_random_shape(rng):
    """1-D draws of 256 to 65536 elements: the larger ones (over 2^17 bytes moved) are cut by the cap."""
    return (draw_size(rng, 2**8, 2**16),)


@pytest.fixture
def toy(monkeypatch, tmp_path):
    monkeypatch.setenv("FUSELAB_CACHE", str(tmp_path / "cache"))  # made-up ceilings: nothing measured
    path = ceilings.cache_dir() / f"{ceilings.cache_key('cpu')}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"copy_gbps": 10.0, "matmul_tflops": {}, "quick": False}))
    op = toy_op.build()
    op.defaults = dataclasses.replace(op.defaults, random_shape=toy_random_shape)
    return op


def run(tmp_path, section_fn, name, budget):
    ctx = Context(out=tmp_path / "out", device="cpu", mode="quick", budget={name: budget}, show_progress=False)
    record = run_section(Section(name, name, section_fn), ctx)
    assert record["status"] == "ok", record.get("traceback")
    saved = json.loads((tmp_path / "out" / "results" / f"{name}.json").read_text())  # the JSON results
    assert saved["results"]["ops"].keys() == record["results"]["ops"].keys()
    return record, tmp_path / "out"


def markdown(record) -> str:
    from fuselab.report.doc import blocks_to_markdown

    return blocks_to_markdown(record["blocks"])


def test_every_shape_ratio_table_per_timed_impl(toy, tmp_path):
    no_draw = dataclasses.replace(toy, name="no_draw", defaults=dataclasses.replace(toy.defaults, random_shape=None))
    record, out = run(tmp_path, every_shape_section([toy, no_draw]), "every_shape", EVERY_SHAPE)
    res = record["results"]
    assert (res["n"], res["seed"]) == (6, 5)
    mine = res["ops"][toy.name]
    drawn = draw_op_shapes(toy, 6, 5, max_bytes=2**17)
    assert [tuple(s) for s in mine["shapes"]] == drawn and len(drawn) == 6  # the same seed, the same shapes
    load = load_of(toy, max_bytes=2**17)
    assert all(load(s) <= 1.0 for s in drawn)  # within the cap
    assert any(load(s) > 1.0 for s in draw_op_shapes(toy, 6, 5))  # the cap did bite: uncapped, some are above
    # one row per timed impl (triton runs under the CPU interpreter: left out, and said so)
    assert {s["impl"] for s in mine["summary"]} == {"naive", "torch"} == set(mine["impls"])
    assert mine["not_timed"] == ["triton"]
    shapes = {tuple(s) for s in drawn}
    for s in mine["summary"]:
        assert s["shapes"] == 6 and s["dtype"] == "float32"
        assert all(math.isfinite(s[k]) and s[k] > 0 for k in ("worst", "p95", "geomean"))
        assert s["worst"] >= s["p95"] >= min(w["ratio"] for w in s["worst_shapes"])
        assert s["worst"] >= s["geomean"]
        worst = s["worst_shapes"]
        assert len(worst) == 5 and {tuple(w["shape"]) for w in worst} <= shapes
        assert [w["ratio"] for w in worst] == sorted((w["ratio"] for w in worst), reverse=True)
        assert worst[0]["ratio"] == s["worst"]
    torch_rows = [r for r in mine["rows"] if r["impl"] == "torch"]
    assert len(torch_rows) == 6 and all(r["ratio"] == 1.0 for r in torch_rows)  # the only peer timed here
    assert res["ops"]["no_draw"] == {"skipped": "no random_shape in the op's spec"}
    assert (out / "plots" / "every_shape_scaled_add.png").read_bytes()[:8] == PNG
    md = markdown(record)
    assert "| impl | shapes | worst | p95 | geomean | worst five shapes (ratio) |" in md
    assert "seed 5" in md and "`triton` (Triton under the CPU interpreter" in md
    assert "`no_draw` has no `random_shape`" in md


def test_call_cost_ladder_rows_and_where_time_grows(toy, tmp_path):
    record, out = run(tmp_path, call_cost_section([toy]), "call_cost", CALL_COST)
    res = record["results"]["ops"][toy.name]
    assert [tuple(s) for s in res["shapes"]] == [(256,), (1024,), (4096,), (16384,)]  # 3 KiB .. 192 KiB moved
    assert res["shapes"] == [list(s) for s in ladder_shapes(toy, min_bytes=2**12, max_bytes=2**18)]
    rows = res["rows"]
    assert {r["mode"] for r in rows} == {"eager"}  # no torch.compile mode on the CPU
    for impl in ("naive", "torch"):
        mine = [r for r in rows if r["impl"] == impl]
        assert len(mine) == 4
        assert all(r["host_us"] > 0 and r["e2e_us"] > 0 and r["device_us"] > 0 for r in mine)
        sizes = [r["bytes"] for r in mine]
        assert sizes == sorted(sizes) and len(set(sizes)) == 4
        assert [r["numel"] for r in mine] == [256, 1024, 4096, 16384]
        bound = res["bound_from"][f"{impl} eager"]
        assert bound is None or list(bound["shape"]) in res["shapes"]
    assert "triton" not in {r["impl"] for r in rows}
    assert "growing" in record["results"]["criterion"]
    assert (out / "plots" / "call_cost_scaled_add.png").read_bytes()[:8] == PNG
    md = markdown(record)
    assert "| impl \\ bytes per call | 3 KiB | 12 KiB | 48 KiB | 192 KiB | grows from |" in md
    assert "timed on a GPU only" in md


def test_bound_from_on_a_gpu_and_on_the_cpu():
    def rows(e2e, device=None):
        return [
            {"bytes": 2**k, "shape": [2**k], "numel": 2**k, "e2e_us": e, "device_us": d}
            for k, e, d in zip(range(10, 10 + len(e2e)), e2e, device or [None] * len(e2e), strict=True)
        ]

    # GPU: launch-bound (10 us a call) until the device time takes over
    gpu = rows([10, 10, 11, 40, 160], [2, 3, 9.5, 38, 158])
    assert bound_from(gpu, on_gpu=True)["bytes"] == 2**12
    assert bound_from(rows([10, 10, 10], [2, 2, 2]), on_gpu=True) is None
    flaky = rows([10, 10, 40, 45, 160], [2, 9, 38, 30, 158])  # 45 > 1.2 x 30: only the largest counts
    assert bound_from(flaky, on_gpu=True)["bytes"] == 2**14
    # CPU: from where a call takes twice the smallest size's time, to the end
    assert bound_from(rows([5, 6, 9, 11, 40]), on_gpu=False)["bytes"] == 2**13
    assert bound_from(rows([5, 6, 7]), on_gpu=False) is None
    assert bound_from([{"bytes": 1, "error": "unavailable"}], on_gpu=False) is None


def test_compiled_call_cost_times_each_size_or_says_why_not(toy):
    shapes = [(256,), (4096,)]
    rows = compiled_call_cost(
        toy, "naive", "max-autotune-no-cudagraphs", shapes, dtype=torch.float32, device="cpu", timing=TINY, budget_ms=3
    )
    assert [r["shape"] for r in rows] == [[256], [4096]]
    assert all(r["error"] is None and r["host_us"] > 0 and r["e2e_us"] > 0 and r["device_us"] > 0 for r in rows)
    assert all(r["mode"] == "max-autotune-no-cudagraphs" and r["bytes"] == 12 * r["numel"] for r in rows)
    toy.impl("compiled", compiled=True)(toy_op.naive_impl)
    refused = compiled_call_cost(toy, "compiled", "reduce-overhead", shapes, dtype=torch.float32, device="cpu")
    assert all(r["status"] == "unavailable" and "compiled already" in r["error"] for r in refused)


def test_the_cpu_report_states_the_caps_and_the_command_bench_draws_with() -> None:
    """The CPU report's every-shape section draws under bench's own CPU caps (issue 24: it said 8 MiB where the CLI
    said 4) and names the command that draws the same shapes, with its N and seed."""
    from fuselab.bench.memory import format_bytes
    from fuselab.evaluate.choices import CPU_RANDOM_CAP
    from fuselab.report.budgets import CPU
    from fuselab.report.sections.every_shape import _intro

    budget = CPU["every_shape"]
    assert (budget["max_bytes"], budget["max_flops"]) == (CPU_RANDOM_CAP["max_bytes"], CPU_RANDOM_CAP["max_flops"])
    text = _intro(budget)
    assert f"capped at {format_bytes(CPU_RANDOM_CAP['max_bytes'])} moved" in text
    assert f"`fuselab bench OP --shapes random:{budget['n']} --seed {budget['seed']}`" in text
