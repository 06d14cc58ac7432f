"""The random-shape bench: the draw (seeded, reproducible, odd / prime / model sizes), layouts, the ratio summary,
and `fuselab bench OP --shapes random:N` end to end on the CPU."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
import torch

from fuselab.bench import shapes as sh
from fuselab.ops import get_op


def test_primes() -> None:
    assert [n for n in range(30) if sh.is_prime(n)] == [2, 3, 5, 7, 11, 13, 17, 19, 23, 29]
    assert sh.next_prime(50257) == 50261 and sh.is_prime(32771) and not sh.is_prime(32769)


def test_log_uniform_covers_the_range_evenly_in_log() -> None:
    rng = np.random.default_rng(3)
    draws = np.array([sh.log_uniform(rng, 1, 2**20) for _ in range(4000)])
    assert draws.min() >= 1 and draws.max() <= 2**20
    # each quarter of the log range holds about a quarter of the draws
    quarters = np.histogram(np.log2(draws), bins=4, range=(0, 20))[0] / len(draws)
    assert np.all(np.abs(quarters - 0.25) < 0.04), quarters
    with pytest.raises(ValueError, match="lo <= hi"):
        sh.log_uniform(rng, 5, 4)


def test_draw_is_reproducible_and_has_odd_prime_and_model_sizes() -> None:
    op = get_op("softmax")
    a, b, c = (sh.draw_shapes(op.defaults.random_shape, 300, seed) for seed in (11, 11, 12))
    assert a == b and a != c and len(set(a)) == 300
    widths = [s[-1] for s in a]
    assert all(1 <= w <= 2**20 and len(s) == 2 and s[0] >= 1 for s, w in zip(a, widths, strict=True))
    share = lambda pred: sum(map(pred, widths)) / len(widths)  # noqa: E731
    assert share(lambda w: w % 2 == 1) > 0.35  # odd: drawn odd, primes, and half the rest by chance
    assert share(lambda w: w > 100 and sh.is_prime(w)) > 0.08
    assert share(lambda w: w in sh.COMMON_SIZES) > 0.05
    assert share(lambda w: w & (w - 1) == 0) < 0.2  # powers of two are the exception, not the rule
    numel = [math.prod(s) for s in a]
    assert max(numel) <= 2**26 + 2**20 and min(numel) >= 1


def test_gelu_draw_spans_its_element_range() -> None:
    op = get_op("gelu")
    drawn = sh.draw_shapes(op.defaults.random_shape, 200, 5)
    numel = [math.prod(s) for s in drawn]
    assert min(numel) < 2**21 and max(numel) > 2**26 and max(numel) <= 2**28
    assert {len(s) for s in drawn} == {1, 2}


def test_parse_random() -> None:
    assert sh.parse_random("random:60") == 60 and sh.parse_random("2^24") is None
    for bad in ("random:x", "random:0"):
        with pytest.raises(ValueError, match="random:N"):
            sh.parse_random(bad)


@pytest.mark.parametrize("layout", sh.LAYOUTS)
@pytest.mark.parametrize("shape", [(37,), (5, 129), (2, 3, 17)], ids=str)
def test_layouts_keep_shape_and_values(layout: str, shape: tuple[int, ...]) -> None:
    t = torch.randn(shape)
    out = sh.apply_layout(t, layout)
    assert out.shape == t.shape
    if layout == "expanded" and t.dim() > 1:
        assert out.stride(0) == 0 and torch.equal(out, t[:1].expand(shape))
    else:
        assert torch.equal(out, t)
    if layout == "sliced" and t.dim() == 1:
        assert out.data_ptr() % 16 != 0  # contiguous, but starting one element into its buffer
    elif layout != "contiguous" and not (layout == "expanded" and t.dim() == 1):
        assert not out.is_contiguous()
    with pytest.raises(ValueError, match="unknown layout"):
        sh.apply_layout(t, "diagonal")


def test_ratios_and_summary() -> None:
    from fuselab.bench.record import Case, Row

    def row(impl: str, width: int, median_ms: float) -> Row:
        return Row(Case.of("x", impl, "float32", (3, width)), median_ms=median_ms)

    rows = []
    for i, width in enumerate((100, 200, 300, 400, 500, 600)):
        rows += [row("torch", width, 1.0), row("compile", width, 0.5 if i == 0 else 2.0)]
        rows.append(row("mine", width, 1.0 + 0.1 * i))
    rows.append(row("mine", 700, 1.0))
    rows = sh.add_ratios(rows, ("torch", "compile"))
    mine = [r for r in rows if r.case.impl == "mine"]
    assert mine[0].ratio == pytest.approx(2.0) and mine[0].best_peer == "compile"
    assert mine[1].ratio == pytest.approx(1.1) and mine[1].best_peer == "torch"
    assert mine[-1].ratio is None  # no peer timed that case
    (summary,) = [s for s in sh.summarize(rows) if s["impl"] == "mine"]
    ratios = np.array([2.0, 1.1, 1.2, 1.3, 1.4, 1.5])
    assert summary["shapes"] == 6 and summary["worst"] == pytest.approx(2.0)
    assert summary["p95"] == pytest.approx(np.percentile(ratios, 95))
    assert summary["geomean"] == pytest.approx(math.exp(np.log(ratios).mean()))
    assert [w["shape"] for w in summary["worst_shapes"]] == [[3, 100], [3, 600], [3, 500], [3, 400], [3, 300]]


def test_cli_random_shapes_end_to_end_on_the_cpu(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`fuselab bench softmax --impl torch,naive --shapes random:5 --seed 3`: rows for every drawn shape and impl,
    ratios to torch, a summary in the JSON's meta and on the terminal, a plot; the same seed draws the same shapes."""
    from fuselab.bench import ceilings
    from fuselab.cli import main

    monkeypatch.setenv("FUSELAB_CACHE", str(tmp_path))
    path = ceilings.cache_dir() / f"{ceilings.cache_key('cpu')}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"copy_gbps": 10.0, "matmul_tflops": {}, "quick": False}))
    op = get_op("softmax")
    small = lambda rng: (int(rng.integers(1, 5)), sh.draw_width(rng, 1, 300))  # noqa: E731  (CPU-sized draws)
    monkeypatch.setattr(op, "defaults", dataclasses.replace(op.defaults, random_shape=small))
    args = ["bench", "softmax", "--impl", "torch,naive", "--shapes", "random:5", "--seed", "3", "--dtype", "fp32"]
    args += ["--device", "cpu", "--rep-ms", "2", "--warmup-ms", "1", "--rounds", "2", "--layout", "sliced"]
    assert main([*args, "--out", str(tmp_path / "r.json"), "--plot", str(tmp_path / "r.png")]) == 0
    result = json.loads((tmp_path / "r.json").read_text())
    rows = result["records"]
    drawn = sh.draw_shapes(small, 5, 3)
    assert sorted({tuple(r["shape"]) for r in rows}) == sorted(drawn)
    assert all(r["error"] is None and r["layout"] == "sliced" for r in rows)
    assert all(r["ratio"] == 1.0 for r in rows if r["impl"] == "torch")
    assert result["meta"]["random"] == {"n": 5, "seed": 3, "layouts": ["sliced"], "peers": ["torch", "compile"]}
    assert "layout_ratios" not in result["meta"]  # no contiguous rows to hold the layout against
    assert {s["impl"] for s in result["meta"]["ratios"]} == {"torch", "naive"}
    assert (tmp_path / "r.png").stat().st_size > 0
    with pytest.raises(SystemExit):
        main([*args, "--layout", "bogus"])
    assert main(["bench", "softmax", "--shapes", "random:2", "--shape", "4x4", "--device", "cpu"]) == 2


def test_cli_random_draws_on_the_cpu_are_capped_and_leave_compile_out(tmp_path, cache, monkeypatch, capsys) -> None:
    """On the CPU, --shapes random:N cuts each draw to CPU_RANDOM_CAP (4 MiB a call) and, unless named with --impl,
    leaves out the compiled impls (one compile per shape), saying both."""
    from fuselab.cli import main
    from fuselab.evaluate import choices

    monkeypatch.setenv("FUSELAB_CACHE", str(cache))
    args = ["bench", "softmax", "--shapes", "random:4", "--seed", "11", "--dtype", "fp32", "--device", "cpu"]
    args += ["--rep-ms", "1", "--warmup-ms", "1", "--rounds", "1", "--out", str(tmp_path / "r.json")]
    assert main(args) == 0
    err = capsys.readouterr().err
    assert "capped at 4 MiB" in err and "compile (one torch.compile per shape) left out" in err
    rows = json.loads((tmp_path / "r.json").read_text())["records"]
    op = get_op("softmax")
    assert {r["impl"] for r in rows} == {n for n, impl in op.impls.items() if not impl.compiled}
    cap = choices.CPU_RANDOM_CAP["max_bytes"]
    assert all(op.bytes_moved(tuple(r["shape"]), torch.float32) <= cap for r in rows)
    uncapped = sh.draw_shapes(op.defaults.random_shape, 4, 11)
    assert any(op.bytes_moved(s, torch.float32) > cap for s in uncapped)  # the cap did cut something


def test_a_capped_draw_cuts_the_first_dimension_and_keeps_the_rest() -> None:
    rows_of = lambda rng: (int(rng.integers(1, 10**6)), int(rng.choice([7, 1000, 50257])))  # noqa: E731
    load = lambda shape: math.prod(shape) / 2**20  # noqa: E731  (at most 2^20 elements)
    capped = sh.draw_shapes(rows_of, 20, 3, load=load)
    assert capped == sh.draw_shapes(rows_of, 20, 3, load=load)  # reproducible
    assert len(capped) == 20 and all(load(s) <= 1.0 for s in capped)
    assert {s[1] for s in capped} <= {7, 1000, 50257}  # the width is the op's draw, kept
    assert min(load(s) for s in capped) >= 1 / 64 / 2  # cut to land within [1/64, 1] of the cap (rounded down)
    too_wide = sh.draw_shapes(lambda rng: (4, 2**21), 3, 0, load=load)  # even one row is over the cap: dropped
    assert too_wide == []


def test_scale_shape_halves_the_largest_leading_dimension_then_doubles_the_first() -> None:
    nbytes = lambda shape: 4 * math.prod(shape)  # noqa: E731
    assert sh.scale_shape((4096, 4096), 2**16, nbytes) == (4, 4096)  # rows shrink, the row width stays
    assert sh.scale_shape((4096, 4096), 2**10, nbytes) == (1, 256)  # one row left: the width shrinks
    assert sh.scale_shape((1, 16, 4096, 64), 2**20, nbytes) == (1, 16, 256, 64)  # the sequence (largest) first
    assert sh.scale_shape((2**24,), 2**30, nbytes) == (2**28,)  # grown by the first dimension
    assert sh.scale_shape((3, 5), 1, nbytes) == (1, 1)  # nothing fits: all ones
    ladder = sh.size_ladder((4096, 4096), nbytes, 2**12, 2**24, factor=16)
    assert ladder == [(1, 1024), (4, 4096), (64, 4096), (1024, 4096)]
    with pytest.raises(ValueError):
        sh.size_ladder((4,), nbytes, 10, 1)
