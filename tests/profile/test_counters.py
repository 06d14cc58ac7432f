"""Hardware counters: parsing real ncu output (H200), verdicts, the cost-model comparison, and the no-ncu path.

tests/profile/data/ncu_raw_gelu_h200.csv is real `ncu --csv --page raw --print-units base` output from the H200
(ncu 2025.3.1, 2026-11-30), cut to the columns fuselab reads: torch.randn's kernel, then F.gelu on 2^24 fp32.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from fuselab.cli import main
from fuselab.profile import counters as cn

DATA = Path(__file__).parent / "data"
SAMPLE = DATA / "ncu_raw_gelu_h200.csv"
MARKER = {"id": -1, "name": "void at::cuda::<unnamed>::spin_kernel(long)", "metrics": {}}


@pytest.fixture(scope="module")
def sample() -> list[dict]:
    return cn.parse_raw_csv(SAMPLE.read_text())


def test_parse_raw_csv_reads_base_units(sample):
    assert [k["id"] for k in sample] == [0, 1]
    randn, gelu = sample
    assert "distribution_elementwise" in randn["name"] and "GeluCUDAKernelImpl" in gelu["name"]
    m = gelu["metrics"]  # "31,264" ns and "109,..." bytes: thousands separators read as such
    assert m["gpu__time_duration.sum"] == 31264.0
    assert m["dram__bytes_read.sum"] + m["dram__bytes_write.sum"] == 109892864.0
    assert m["gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed"] == pytest.approx(73.13)
    assert m["launch__registers_per_thread"] > 0 and "Kernel Name" not in m


def test_parse_value_units_and_text():
    assert cn.parse_value("1,234.5", "usecond") == pytest.approx(1234500.0)
    assert cn.parse_value("2", "Mbyte") == 2e6
    assert cn.parse_value("n/a") is None and cn.parse_value("(256, 1, 1)") is None and cn.parse_value("") is None


def test_parse_rejects_other_text():
    with pytest.raises(ValueError, match="raw CSV"):
        cn.parse_raw_csv("Kernel: foo\n  Duration  31 us\n")


def test_verdicts_on_real_counters(sample):
    randn, gelu = (cn.Kernel(k["name"], k["metrics"]) for k in sample)
    bound, line = cn.verdict(gelu)
    assert bound == "memory" and line == "memory-bound at 73% of DRAM peak"
    bound, line = cn.verdict(randn)  # Philox: the SM issues at 73% while DRAM idles at 20%
    assert bound == "compute" and "73% of SM peak" in line
    assert randn.occupancy_limiter() == "registers"  # 5 blocks by registers, 8 by warps, 32 by shared memory


def test_latency_verdict_names_occupancy_and_stall(sample):
    metrics = dict(sample[1]["metrics"])
    for name in list(metrics):
        if "pct_of_peak" in name:
            metrics[name] = 12.0
    metrics["sm__warps_active.avg.pct_of_peak_sustained_active"] = 21.0
    metrics["smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio"] = 9.5
    metrics["smsp__average_warps_issue_stalled_wait_per_issue_active.ratio"] = 1.25
    metrics["smsp__average_warps_issue_stalled_selected_per_issue_active.ratio"] = 40.0  # issuing is not a stall
    metrics["launch__waves_per_multiprocessor"] = 0.25
    k = cn.Kernel("k", metrics)
    bound, line = cn.verdict(k)
    assert bound == "latency"
    assert "occupancy 21%" in line and "top stall long_scoreboard (9.5" in line and "0.25 waves" in line
    assert [r for r, _ in k.stalls()] == ["long_scoreboard", "wait"]


def test_assess_against_cost_model(sample):
    from fuselab.ops.registry import get_op

    n = 2**24
    case = cn.Case("gelu", "torch", (n,))
    kernels = cn.split_by_marker([sample[0], MARKER, sample[1]], 1)[0]  # the randn before the marker is not counted
    row = cn.assess_case(case, kernels)
    minimum = get_op("gelu").bytes_moved((n,), torch.float32)
    assert row["model_bytes"] == minimum == 2 * 4 * n
    assert row["bytes_ratio"] == pytest.approx(109892864 / minimum)
    assert row["n_kernels"] == 1 and row["duration_ns"] == 31264.0
    assert row["tflops"] == pytest.approx(get_op("gelu").flops((n,)) / 31264.0 / 1e3)
    assert row["kernels"][0]["verdict"] == "memory-bound at 73% of DRAM peak"
    text = cn.bytes_line(row)
    assert f"{109892864 / minimum:.2f}x the minimum" in text


def test_assess_sums_an_unfused_chain(sample):
    gelu = sample[1]
    row = cn.assess_case(cn.Case("gelu", "naive", (2**24,)), [gelu] * 7)
    assert row["n_kernels"] == 7 and row["bytes_ratio"] == pytest.approx(7 * 109892864 / (8 * 2**24))
    row2 = cn.assess_case(cn.Case("gelu", "naive", (2**24,)), [gelu] * 6, iters=2)  # two calls: per-call figures
    assert row2["n_kernels"] == 3 and row2["dram_bytes"] == pytest.approx(3 * 109892864)


def test_split_by_marker_counts_cases(sample):
    a, b = sample
    groups = cn.split_by_marker([MARKER, a, b, MARKER, MARKER, b], 3)
    assert [len(g) for g in groups] == [2, 0, 1]
    with pytest.raises(ValueError, match="expected 2"):
        cn.split_by_marker([MARKER, a], 2)


def test_failed_case_keeps_its_error():
    row = cn.assess_case(cn.Case("gelu", "cuda", (5,)), [], error="RuntimeError: no nvcc")
    assert row["error"] == "RuntimeError: no nvcc" and row["kernels"] == []


def test_roofline_points_move_with_measured_bytes(sample):
    rows = [cn.assess_case(cn.Case("gelu", "naive", (2**24,)), [sample[1]] * 4)]
    modelled, measured = cn.roofline_points(rows)
    assert modelled[0].flops == measured[0].flops and modelled[0].median_ms == measured[0].median_ms
    assert measured[0].bytes / modelled[0].bytes == pytest.approx(rows[0]["bytes_ratio"])
    peak = cn.dram_peak_gbps(rows)  # bytes/ns over 73.13% of peak: the DRAM peak ncu counts against, GB/s
    assert peak == pytest.approx(109892864 / 31264 / 0.7313)


def test_plot_rooflines_writes_both(sample, tmp_path):
    rows = [cn.assess_case(cn.Case("gelu", i, (2**24,)), [sample[1]] * n) for i, n in (("naive", 5), ("torch", 1))]
    paths = cn.plot_rooflines(rows, 4000.0, {"fp32": 50.0}, tmp_path)
    assert [p.name for p in paths] == ["roofline_model.png", "roofline_dram.png"] and all(
        p.stat().st_size for p in paths
    )


def test_ncu_command_filters_the_range_and_keeps_clocks(tmp_path):
    cmd = cn.ncu_command("/x/ncu", tmp_path / "s.json", tmp_path / "t.json", tmp_path / "r.ncu-rep", "gelu|elementwise")
    assert cmd[cmd.index("--clock-control") + 1] == "none"
    assert cmd[cmd.index("--nvtx-include") + 1] == f"{cn.RANGE}/"
    assert cmd[cmd.index("--kernel-name") + 1] == f"regex:{cn.MARKER}|gelu|elementwise"  # markers always kept
    assert cmd[-6:-4] == ["-m", "fuselab.profile.counters"]


def test_explain_failure_one_line():
    log = "==PROF== Connected\n==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access counters\n"
    line = cn.explain_failure(log, 1)
    assert "not permitted" in line and "\n" not in line
    assert cn.explain_failure("", 3) == "ncu failed: ncu exited with status 3"


def test_no_ncu_says_so(monkeypatch):
    monkeypatch.setenv("FUSELAB_NCU", "/nonexistent/ncu")
    assert cn.find_ncu() is None
    assert "CUDA GPU" in cn.counters_unavailable("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert "ncu" in cn.counters_unavailable("cuda") and "not found" in cn.counters_unavailable("cuda")
    with pytest.raises(cn.CountersUnavailable, match="not found"):
        cn.profile_counters("gelu", ["torch"], (1000,))


def test_cli_counters_without_ncu_one_line_nonzero(monkeypatch, capsys):
    monkeypatch.setenv("FUSELAB_NCU", "/nonexistent/ncu")
    assert main(["profile", "gelu", "--counters", "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("fuselab profile: error: --counters:") and "CUDA GPU" in err
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert main(["profile", "gelu", "--counters", "--device", "cuda"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("fuselab profile: error:") and "not found" in err


def test_cli_counters_needs_an_op(capsys):
    assert main(["profile", "--case", "add", "--counters"]) == 2


def test_report_section_skips_without_counters(tmp_path, monkeypatch):
    from fuselab.report.doc import Doc
    from fuselab.report.runner import Context
    from fuselab.report.sections.counters import counters_section

    monkeypatch.setenv("FUSELAB_NCU", "/nonexistent/ncu")
    ctx = Context(out=tmp_path, device="cpu", mode="quick", budget={})
    doc = Doc(tmp_path)
    result = counters_section(ctx, doc)
    assert "CUDA GPU" in result["skipped"] and any("Skipped" in str(b) for b in doc.blocks)


def test_study_shapes_rule():
    from fuselab.ops.registry import all_ops

    for op in all_ops():
        large, small = cn.study_shapes(op)
        assert math.prod(large) > 100 * math.prod(small) and small[0] % 2 == 1  # odd: a size nobody tuned for


def test_affordable_shape_falls_back_to_the_small_shape_for_a_slow_call():
    """ncu replays every kernel of a call: an impl whose plain call is over the bound at the large shape is profiled at
    the small one, a fast impl at the large one; the last shape is taken without timing."""
    import time

    from tests.evaluate.test_evaluate import make_toy

    op = make_toy()

    @op.impl("slow_when_large")
    def slow_when_large(x):
        if x.numel() > 1000:
            time.sleep(0.05)
        return x * x

    shapes = [(4099,), (17,)]
    assert cn.affordable_shape(op, "torch", shapes, "cpu", max_call_ms=20.0) == 0
    assert cn.affordable_shape(op, "slow_when_large", shapes, "cpu", max_call_ms=20.0) == 1
    assert cn.affordable_shape(op, "slow_when_large", shapes[1:], "cpu", max_call_ms=0.0) == 0


def test_affordable_shape_hands_a_refusing_impl_to_ncu():
    """An impl that raises Unavailable at call time (SDPA forced to cuDNN, in float32: the H200 report's counters
    section failed on it, 2026-12-01) gets the last shape, where ncu's child reports the refusal as a row."""
    from fuselab.bench.sweep import Unavailable
    from tests.evaluate.test_evaluate import make_toy

    op = make_toy()

    @op.impl("refuses")
    def refuses(x):
        raise Unavailable("no kernel for float32 here")

    assert op.get_impl("refuses").unavailable("cpu", None) is None  # asked first, it says it can run
    assert cn.affordable_shape(op, "refuses", [(4099,), (17,)], "cpu", max_call_ms=20.0) == 1
    assert cn.affordable_shape(op, "gpu_only", [(4099,), (17,)], "cpu", max_call_ms=20.0) == 1  # not called here


def test_study_sample_naive_against_fused():
    """Real H200 run (the counters study, counters.json): naive GELU's 9 kernels against F.gelu's one, 2^26 fp32."""
    kernels = cn.parse_raw_csv((DATA / "ncu_raw_study_h200.csv").read_text())
    naive_k, torch_k = cn.split_by_marker(kernels, 2)
    n = 2**26
    naive = cn.assess_case(cn.Case("gelu", "naive", (n,)), naive_k)
    fused = cn.assess_case(cn.Case("gelu", "torch", (n,)), torch_k)
    assert naive["n_kernels"] == 9 and fused["n_kernels"] == 1
    assert 9 < naive["bytes_ratio"] < 12  # each unfused kernel reads and writes the whole tensor
    assert fused["dram_read"] == pytest.approx(4 * n, rel=0.01)  # the input, read once from DRAM
    assert 0.9 < fused["bytes_ratio"] <= 1.0  # part of the output is still in L2 when the kernel ends
    assert all(k["bound"] == "memory" and "of DRAM peak" in k["verdict"] for k in naive["kernels"] + fused["kernels"])
    assert naive["duration_ns"] > 8 * fused["duration_ns"]


def test_affordable_shape_calls_in_the_dtype_asked():
    """The report profiles each op in its own first bench dtype (attention: bfloat16): an impl that computes in 16-bit
    only is then timed, not handed to ncu as refusing."""
    from tests.evaluate.test_evaluate import make_toy

    op = make_toy()
    op.impl("sixteen_bit", dtypes=(torch.float16, torch.bfloat16))(lambda x: x * x)
    shapes = [(4099,), (17,)]
    assert cn.affordable_shape(op, "sixteen_bit", shapes, "cpu", max_call_ms=1e3) == 1  # float32: refused
    assert cn.affordable_shape(op, "sixteen_bit", shapes, "cpu", max_call_ms=1e3, dtype="bfloat16") == 0


def test_report_section_profiles_in_the_ops_dtype_and_heads_one_shape(tmp_path, monkeypatch):
    """Each op's cases are in its report dtype, and the headline compares impls measured at the same shape only (at
    f8f436f it set attention's naive at 1x32x16384x64 beside triton measured at 1x32x65x64)."""
    from types import SimpleNamespace

    import fuselab.profile.counters as counters
    from fuselab.ops.registry import all_ops
    from fuselab.report.doc import Doc
    from fuselab.report.runner import Context
    from fuselab.report.sections.counters import counters_section

    seen = []

    def fake_run(cases, out_dir):
        seen.extend(cases)
        rows = []
        for i, c in enumerate(cases):
            shape = list(c.shape) if i % 2 == 0 else [1, *c.shape[1:]]  # every other impl "at its small shape"
            kernel = {"duration_ns": 1000.0, "short_name": "k", "verdict": "memory-bound"}
            rows.append({"op": c.op, "impl": c.impl, "shape": shape, "kernels": [kernel], "n_kernels": 1 + i,
                         "dram_read": 1e6, "dram_write": 1e6, "bytes_ratio": 1.0 + i, "l2_bytes": 1e6,
                         "duration_ns": 1000.0, "model_bytes": 2e6})  # fmt: skip
        return SimpleNamespace(rows=rows, source="fake")

    monkeypatch.setattr(counters, "counters_unavailable", lambda device: None)
    monkeypatch.setattr(counters, "affordable_shape", lambda op, impl, shapes, device, max_call_ms, dtype: 0)
    monkeypatch.setattr(counters, "run_cases", fake_run)
    ctx = Context(out=tmp_path, device="cpu", mode="quick", budget={"max_call_ms": 1.0})
    result = counters_section(ctx, Doc(tmp_path))
    for op in all_ops():
        dtype = next(iter(op.report_plan("quick")["bench_dtypes"]))
        assert {c.dtype for c in seen if c.op == op.name} == {dtype}
    for headline in result["headline"].split("; "):
        op_name = headline.split()[0]
        at_shape = {r["impl"] for r in result["rows"] if r["op"] == op_name and r["shape"] == next(
            r0["shape"] for r0 in result["rows"] if r0["op"] == op_name)}  # fmt: skip
        named = [w for w in headline.replace(",", "").split() if w in {r["impl"] for r in result["rows"]}]
        assert named and set(named) <= at_shape, headline


def test_a_backward_case_is_held_against_the_backward_cost_model(sample):
    """`fuselab profile OP --backward --counters`: the case says forward+backward, its child runs the forward and the
    gradients, and its kernels are held against the cost model of forward + backward (as `fuselab bench --backward`)."""
    from fuselab.ops.registry import get_op

    n = 2**24
    forward, both = cn.Case("gelu", "triton", (n,)), cn.Case("gelu", "triton", (n,), backward=True)
    assert both.label.endswith("forward+backward") and "backward" not in forward.label
    kernels = [sample[1]]
    row, row_bwd = cn.assess_case(forward, kernels), cn.assess_case(both, kernels)
    op = get_op("gelu")
    assert row_bwd["model_bytes"] == op.bytes_moved((n,), torch.float32, backward=True) > row["model_bytes"]
    assert row_bwd["backward"] is True and row["backward"] is False


def test_report_section_profiles_the_backward_of_fused_kernels_and_peers(tmp_path, monkeypatch):
    """On the GPU report an op that times its backward (attention) is also profiled forward + backward, for its own
    kernels and its peers (cuDNN) but not the teaching impls; a compute-bound op's kernels get their own table (tensor
    pipe, occupancy, stalls) that leaves out kernels under 5% of their call's time."""
    from types import SimpleNamespace

    import fuselab.profile.counters as counters
    from fuselab.report.doc import Doc
    from fuselab.report.runner import Context
    from fuselab.report.sections.counters import counters_section

    seen = []

    def fake_run(cases, out_dir):
        seen.extend(cases)
        rows = []
        for c in cases:
            kernels = [
                {"duration_ns": 9000.0, "short_name": f"{c.impl}_main", "verdict": "compute-bound", "tensor_pct": 61.5,
                 "sm_pct": 70.0, "occupancy_pct": 12.1, "theoretical_occupancy_pct": 12.5,
                 "occupancy_limiter": "registers", "registers": 255.0, "stalls": [["wait", 1.5], ["math_pipe", 0.7]]},
                {"duration_ns": 100.0, "short_name": f"{c.impl}_tiny", "verdict": "latency-bound"},
            ]  # fmt: skip
            rows.append({"op": c.op, "impl": c.impl, "shape": list(c.shape), "backward": c.backward,
                         "bound_model": get_op(c.op).bound, "kernels": kernels, "n_kernels": 2, "dram_read": 1e6,
                         "dram_write": 1e6, "bytes_ratio": 1.0, "l2_bytes": 1e6, "duration_ns": 9100.0,
                         "model_bytes": 2e6})  # fmt: skip
        return SimpleNamespace(rows=rows, source="fake")

    from fuselab.ops.registry import get_op

    monkeypatch.setattr(counters, "counters_unavailable", lambda device: None)
    monkeypatch.setattr(counters, "affordable_shape", lambda op, impl, shapes, device, max_call_ms, dtype: 0)
    monkeypatch.setattr(counters, "run_cases", fake_run)
    ctx = Context(out=tmp_path, device="cuda", mode="gpu", budget={"max_call_ms": 1.0})
    doc = Doc(tmp_path)
    counters_section(ctx, doc)
    backward = {(c.op, c.impl) for c in seen if c.backward}
    assert {("attention", "triton"), ("attention", "sdpa-cudnn")} <= backward
    assert ("attention", "naive") not in backward and ("attention", "tiled") not in backward
    assert all(op == "attention" for op, _ in backward)  # gelu and softmax time their forward alone on the report
    text = "\n".join(str(b) for b in doc.blocks)
    assert "triton, forward + backward" in text and "sdpa-cudnn, forward + backward" in text
    assert "61.5" in text and "12.1 / 12.5 (registers)" in text and "wait 1.5, math_pipe 0.7" in text
    assert "triton_tiny" not in text  # 1% of its call
