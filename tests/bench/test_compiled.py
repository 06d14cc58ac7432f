import torch

from fuselab.bench.compiled import WatchedCompile


def plain(x):
    return torch.sin(x) * 2 + 1


def with_graph_break(x):
    y = torch.sin(x)
    torch._dynamo.graph_break()
    return y + 1


def test_compile_time_is_reported_apart_and_one_graph_is_clean():
    fn = WatchedCompile(plain)
    x = torch.randn(37)
    torch.testing.assert_close(fn(x), plain(x))
    fn(x)
    assert fn.compile_s is not None and fn.compile_s > 0
    assert fn.graphs == 1 and fn.flags == []


def test_graph_breaks_and_recompiles_are_flagged():
    broken = WatchedCompile(with_graph_break)
    broken(torch.randn(8))
    assert any("graph breaks" in f for f in broken.flags)

    fn = WatchedCompile(plain)
    fn(torch.randn(8))
    fn(torch.randn(9))  # a new shape with dynamic=False compiles again
    assert any("recompiled" in f for f in fn.flags)
