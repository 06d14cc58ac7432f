"""What the lecture asks of GELU, answered from this run: its claim (near the copy ceiling) and its questions 2
(why the naive GELU is slower than one fused kernel) and 4 (CUDA C++ against Triton: thread per element against
program per block). Read by fuselab.studies.claims through `Op.claims` and `Op.questions`."""

from __future__ import annotations

import inspect
from pathlib import Path

from fuselab.bench.record import Row
from fuselab.ops.findings import Finding, NotMeasured, Results, bench_row, fmt_gbps, fmt_ms, fmt_x, section

NEAR_COPY_PCT = 80.0  # F.gelu's GB/s as % of the copy ceiling
NAIVE_SLOWER = 2.0
HERE = Path(__file__).parent


def _row(results: Results, impl: str, numel: int | None = None) -> Row:
    """The fp32 tanh-GELU row of impl at `numel` elements (default: its largest)."""
    match = {"numel": numel} if numel is not None else {}
    return bench_row(results, "gelu", impl, approximate="tanh", **match)


def near_copy(results: Results) -> Finding:
    row = _row(results, "torch")
    if row.pct_copy is None or row.gbps is None:
        raise NotMeasured("no copy ceiling to compare with")
    figure = f"F.gelu fp32, {row.numel:,} elements: {fmt_gbps(row.gbps)} = {row.pct_copy:.0f}% of copy"
    return figure, row.pct_copy, row.pct_copy >= NEAR_COPY_PCT


CLAIMS = [
    (
        "GELU is memory-bound: the fused kernel runs near the copy bandwidth.",
        f"F.gelu ≥ {NEAR_COPY_PCT:g}% of the copy GB/s",
        near_copy,
    )
]


def q_fusion(results: Results) -> tuple[str, float | None, bool | None]:
    naive = _row(results, "naive")
    fused = _row(results, "torch", naive.numel)
    ratio = naive.median_ms / fused.median_ms  # type: ignore[operator]
    text = (
        "GELU is memory-bound: its arithmetic is cheap, moving the tensor is not. Written as PyTorch ops it runs each "
        "op (x³, ×0.044715, +x, ×√(2/π), tanh, +1, ×x, ×0.5) as its own kernel, each reading and writing the whole "
        "tensor; one fused kernel reads x once and writes y once. Here, fp32 at "
        f"{naive.numel:,} elements: naive {fmt_ms(naive.median_ms)} ({fmt_gbps(naive.gbps)} of useful "
        f"traffic) against F.gelu {fmt_ms(fused.median_ms)} ({fmt_gbps(fused.gbps)}): {fmt_x(ratio)} slower."
    )
    return text, ratio, ratio >= NAIVE_SLOWER


def cuda_kernel_source() -> str:
    """The CUDA C++ kernel of gelu.cu (its template line, signature and body)."""
    text = (HERE / "gelu.cu").read_text()
    start = text.index("__global__")
    start = text.rfind("template", 0, start)
    depth, end = 0, text.index("{", start)
    for end in range(end, len(text)):  # noqa: B020  (scan on from the first brace to its match)
        depth += {"{": 1, "}": -1}.get(text[end], 0)
        if depth == 0:
            break
    return text[start : end + 1]


def triton_kernel_source() -> str:
    """The Triton forward kernel's source."""
    from fuselab.ops.gelu import triton_kernels

    kernel = triton_kernels.TRITON_KERNELS[0]
    return inspect.getsource(getattr(kernel, "fn", kernel))


def q_cuda_vs_triton(results: Results) -> tuple[str, float | None, bool | None]:
    cuda, tri = cuda_kernel_source(), triton_kernel_source()
    items = section(results, "inspect").get("items", [])
    found = next((i for i in items if i.get("op") == "gelu" and i.get("impl") == "triton" and i.get("kernels")), None)
    if found is None:
        raise NotMeasured("the inspect section did not compile the Triton GELU")
    loads = found["kernels"][0].get("loads") or []
    widest = loads[0] if loads else {}
    lines = (len(cuda.strip().splitlines()), len(tri.strip().splitlines()))
    text = (
        "In CUDA C++ the programmer writes what one thread does: each thread computes its own index "
        "(blockIdx.x · blockDim.x + threadIdx.x), loads its element(s), and the vector width, bounds checks and "
        "launch shape are its job. In Triton one writes what one program does to a whole block of elements "
        "(tl.arange over BLOCK, a mask for the tail), and the compiler spreads the block over threads, chooses the "
        f"vector loads and coalesces them. Here the CUDA kernel is {lines[0]} lines, the Triton one {lines[1]}; in "
        f"the PTX Triton emitted `{widest.get('instr', '?')}` ({widest.get('bytes', '?')} bytes per thread per load) "
        "from a plain tl.load of the block."
        f"\n\n```cuda\n{cuda}\n```\n\n```python\n{tri}\n```"
    )
    return text, float(widest.get("bytes") or 0), bool(widest.get("bytes", 0) >= 8)


QUESTIONS = [
    (2, "Why is a GELU written as several PyTorch ops much slower than one fused kernel?", "≥ 2× slower", q_fusion),
    (
        4,
        "What is the key structural difference between a kernel in CUDA C++ and in Triton?",
        "Triton's loads vectorized (≥ 8 B per thread) without asking",
        q_cuda_vs_triton,
    ),
]
