import pytest

from fuselab.studies.roofline import Point, attainable_tflops, peak_for, place, place_all, plot_roofline, ridge_point

COPY = 4000.0  # GB/s
PEAKS = {"fp32": 50.0, "tf32": 400.0, "bf16": 700.0}  # TFLOP/s


def test_ridge_point_and_the_two_roofs():
    assert ridge_point(COPY, 50.0) == pytest.approx(12.5)  # 50e12 FLOP/s / 4e12 B/s
    assert attainable_tflops(1.0, COPY, 50.0) == pytest.approx(4.0)  # memory roof: AI x bandwidth
    assert attainable_tflops(12.5, COPY, 50.0) == pytest.approx(50.0)
    assert attainable_tflops(1000.0, COPY, 50.0) == pytest.approx(50.0)  # compute roof
    with pytest.raises(ValueError):
        attainable_tflops(1.0, 0.0, 50.0)


def test_an_elementwise_kernel_is_memory_bound_and_measured_against_the_memory_roof():
    # 2^28 fp32 GELU: 9 FLOPs and 8 bytes per element, at 0.5 ms
    n = 2**28
    gelu = Point("gelu", flops=9 * n, bytes=8 * n, median_ms=0.5, dtype="bfloat16", kind="elementwise")
    p = place(gelu, COPY, PEAKS)
    assert p.ai == pytest.approx(9 / 8)
    assert p.gbps == pytest.approx(8 * n / 0.5e-3 / 1e9)
    assert p.tflops == pytest.approx(9 * n / 0.5e-3 / 1e12)
    assert p.peak == "fp32"  # not a matmul: held against the plain-core rate whatever its dtype
    assert p.bound == "memory"
    assert p.roof_tflops == pytest.approx(9 / 8 * COPY / 1e3)
    assert p.pct_of_roof == pytest.approx(100 * p.gbps / COPY)  # on the memory roof, % roof = % bandwidth
    assert list(p.to_json()) == [  # the flat form the report's results hold, in their order
        *("label", "group", "family", "kind", "dtype", "flops", "bytes", "median_ms", "ai", "tflops", "gbps"),
        *("peak", "peak_tflops", "ridge_ai", "roof_tflops", "pct_of_roof", "bound"),
    ]
    assert p.to_json()["label"] == "gelu" and p.to_json()["bound"] == "memory"


def test_a_large_bf16_matmul_is_compute_bound_against_its_dtype_peak():
    n = 8192
    flops, nbytes = 2 * n**3, 3 * n * n * 2
    p = place(Point("mm", flops=flops, bytes=nbytes, median_ms=2.0, dtype="bfloat16", kind="matmul"), COPY, PEAKS)
    assert p.peak == "bf16" and p.peak_tflops == 700.0
    assert p.ai == pytest.approx(2 * n / 6)
    assert p.bound == "compute"
    assert p.roof_tflops == pytest.approx(700.0)
    assert p.pct_of_roof == pytest.approx(100 * (flops / 2e-3 / 1e12) / 700.0)


def test_peak_falls_back_to_fp32_when_a_dtype_was_not_measured():
    assert peak_for("bfloat16", "matmul", {"fp32": 1.0}) == ("fp32", 1.0)
    assert peak_for("float32", "matmul", PEAKS) == ("fp32", 50.0)


def test_place_rejects_a_zero_time():
    with pytest.raises(ValueError, match="positive"):
        place(Point("x", flops=1, bytes=1, median_ms=0.0), COPY, PEAKS)


def test_plot_writes_a_png(tmp_path):
    points = place_all(
        [
            Point("a", flops=9e6, bytes=8e6, median_ms=0.01, family="gelu", group="gelu"),
            Point("b", flops=2e9, bytes=3e6, median_ms=0.1, family="matmul", kind="matmul", group="mm"),
        ],
        COPY,
        PEAKS,
    )
    path = plot_roofline(points, COPY, PEAKS, tmp_path / "r.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_16_bit_kernel_is_held_to_the_faster_of_its_own_rate_and_fp32s():
    """16-bit data can be multiplied in fp32: where bf16 matmuls run far below fp32 (a CPU without bf16 units) the
    roof of a bf16 kernel is fp32's; on a GPU bf16's own."""
    cpu = {"fp32": 0.17, "bf16": 0.001}
    assert peak_for("bfloat16", "matmul", cpu) == ("fp32", cpu["fp32"])
    assert peak_for("float16", "matmul", cpu) == ("fp32", cpu["fp32"])
    assert peak_for("bfloat16", "matmul", PEAKS) == ("bf16", PEAKS["bf16"])
