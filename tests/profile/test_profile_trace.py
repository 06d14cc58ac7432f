"""Traces: ranges recorded on the CPU, lanes, syncs and launch links (CPU profiles and the handmade GPU-like trace)."""

import gzip
import json
from pathlib import Path

import pytest
import torch

import fuselab.profile as fp
from fuselab.profile.trace import DTOH, Trace

DATA = Path(__file__).resolve().parents[1] / "data" / "profile"


@fp.range("decorated")
def _decorated(x: torch.Tensor) -> torch.Tensor:
    return x * 3


def _work(x: torch.Tensor) -> torch.Tensor:
    with fp.range("outer"):
        y = x + 1
        with fp.range("inner"):
            y = y.sum()
    return _decorated(y)


def test_ranges_appear_nested_in_a_cpu_trace(tmp_path):
    x = torch.randn(1001)
    result = fp.profile_callable(lambda: _work(x), label="call", warmup=1, iters=2, out_dir=tmp_path, cuda=False)
    trace = result.trace
    names = [e.name for e in trace.ranges]
    assert names.count("call") == 2 and names.count("outer") == 2 and names.count("inner") == 2
    assert names.count("decorated") == 2
    # nesting: every "inner" lies inside an "outer", and aten::sum inside "inner"
    for inner in (e for e in trace.ranges if e.name == "inner"):
        enclosing = [e.name for e in trace.enclosing("user_annotation", inner.thread, inner.ts)]
        assert enclosing[:2] == ["call", "outer"]
    sums = [e for e in trace.top_level_ops() if e.name == "aten::sum"]
    assert len(sums) == 2
    assert "inner" in [e.name for e in trace.enclosing("user_annotation", sums[0].thread, sums[0].ts)]
    assert json.loads(result.trace_path.read_text())["traceEvents"]  # a real Chrome trace on disk


def test_range_is_reentrant_and_rejects_empty_names(tmp_path):
    @fp.range("fact")
    def fact(n: int) -> int:
        return 1 if n <= 1 else n * fact(n - 1)

    assert fact(4) == 24  # outside a profiler too
    trace = fp.profile_callable(lambda: fact(4), label=None, warmup=0, iters=1, out_dir=tmp_path).trace
    facts = [e for e in trace.ranges if e.name == "fact"]
    assert len(facts) == 4
    assert [len(trace.enclosing("user_annotation", e.thread, e.ts)) for e in facts] == [1, 2, 3, 4]
    with pytest.raises(ValueError, match="non-empty name"):
        fp.range("")


def test_lanes_of_a_cpu_trace(tmp_path):
    a = torch.randn(64, 64)
    trace = fp.profile_callable(lambda: (a @ a).relu(), label="mm", warmup=0, iters=1, out_dir=tmp_path).trace
    lanes = {lane.label: lane for lane in trace.lanes()}
    assert set(lanes) == {"ranges", "CPU ops"}
    ops = lanes["CPU ops"]
    assert ops.kind == "cpu"
    top = [e.name for e, depth in ops.events if depth == 0]
    assert top == ["aten::matmul", "aten::relu"]
    assert any(e.name == "aten::mm" and depth == 1 for e, depth in ops.events)  # called from aten::matmul
    assert not trace.has_gpu and trace.syncs() == []


def test_gpu_like_trace_links_launches_and_finds_syncs(tmp_path):
    trace = Trace.load(DATA / "runahead_gpu_like_print.json")
    assert trace.has_gpu
    kinds = [(lane.label, lane.kind) for lane in trace.lanes()]
    assert kinds == [
        ("ranges", "range"),
        ("CPU ops", "cpu"),
        ("CUDA API", "api"),
        ("GPU ranges", "gpu_range"),
        ("GPU 0 stream 7", "gpu"),
    ]
    pairs = trace.launches()
    assert len(pairs) == 12  # 9 kernels + 3 copies
    for launch, work in pairs:
        assert launch.correlation == work.correlation and launch.cat == "cuda_runtime"
        assert work.ts >= launch.ts
    syncs = trace.syncs()
    assert [s.kind for s in syncs].count(DTOH) == 3
    assert [s.kind for s in syncs].count("cudaStreamSynchronize") == 3
    assert [s.kind for s in syncs].count("cudaDeviceSynchronize") == 1
    # gzip traces read the same
    gz = tmp_path / "t.json.gz"
    with gzip.open(gz, "wt") as f:
        f.write((DATA / "runahead_gpu_like_print.json").read_text())
    assert len(Trace.load(gz).events) == len(trace.events)
