"""Twelfth round, after two side-by-side benches put the Triton softmax at fp32 512 at 1.0005x and 1.0003x
torch.compile (both at 99.3% of a copy of the same bytes): variants of the rows kernel at fp32 128-1024 taking turns
with torch.compile and the package's choice (`benchmark_side_by_side`, 10 rounds): streaming stores, exp computed
again for the output and divided (as Inductor's kernel does), other rows per program, warps and register caps.

    PYTHONPATH=src python3 benchmarks/softmax_variants/explore12.py OUT.jsonl     (TRITON_INTERPRET=1: a CPU dry run)
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import kernels as ek
import torch

from fuselab.bench.timer import benchmark_side_by_side
from fuselab.ops.softmax import triton as st
from fuselab.ops.softmax.naive import softmax_naive

DRY = os.environ.get("TRITON_INTERPRET") == "1"
dev = torch.device("cpu" if DRY else "cuda")
ELEMENTS = 1 << (14 if DRY else 26)
TIMING = {"warmup_ms": 0, "rep_ms": 0, "min_reps": 2} if DRY else {"warmup_ms": 100, "rep_ms": 400}


def variant(rows: int, warps: int, stream: bool, recompute: bool, maxnreg: int | None = None):
    def fn(x, y):
        ek.rows_even_kernel[(x.shape[0] // rows,)](
            x, y, x.stride(0), y.stride(0), ROWS=rows, BLOCK=x.shape[1], STREAM=stream, RECOMPUTE=recompute,
            PTX=not DRY, num_warps=warps, maxnreg=maxnreg,
        )  # fmt: skip

    return fn


out = sys.argv[1]
for width in (512, 128, 256, 1024):
    x = torch.randn(ELEMENTS // width, width, device=dev) * 3
    y = torch.empty_like(x)
    ref = torch.softmax(x[:64].double(), -1)
    rows = max(1, 1024 // width)  # the package's 4 KiB tile
    fns = {"chosen": lambda: st.launch_forward(x, y)}
    if not DRY:
        torch._dynamo.reset()
        compiled = torch.compile(softmax_naive, dynamic=False)
        fns["compile"] = lambda: compiled(x)
    plain = {}
    for r, w, cap in ((rows, 1, None), (rows, 1, 48), (max(1, rows // 2), 1, None), (rows * 2, 2, None)):
        for stream in (False, True):
            for recompute in (False, True):
                plain[f"R{r} w{w} cap {cap} stream {int(stream)} recompute {int(recompute)}"] = variant(
                    r, w, stream, recompute, cap
                )
    for name, fn in plain.items():
        y.fill_(float("nan"))
        fn(x, y)
        err = ((y[:64].double() - ref).abs().max() / ref.abs().max()).item()
        if err < 1e-5:
            fns[name] = lambda fn=fn: fn(x, y)
        else:
            print(f"{width} {name}: wrong, rel err {err:.2e}")
    timed = benchmark_side_by_side(fns, rounds=10, device=dev, **TIMING)
    nbytes = 2 * x.numel() * x.element_size()
    base = timed["compile"].median_ms if "compile" in timed else timed["chosen"].median_ms
    for name, m in sorted(timed.items(), key=lambda kv: kv[1].median_ms):
        row = {"width": width, "name": name, "ms": m.median_ms, "gbps": nbytes / m.median_ms / 1e6,
               "vs_compile": m.median_ms / base, "iqr_ms": m.iqr_ms, "n": m.n}  # fmt: skip
        print(f"fp32 {width:5d} {name:45s} {row['gbps']:6.0f} GB/s  {row['vs_compile']:.4f}x compile", flush=True)
        with open(out, "a") as f:
            f.write(json.dumps(row) + "\n")
