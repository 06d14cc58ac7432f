"""Time experimental softmax kernels against the shipped ones and torch on the GPU (2^26 elements per tensor).
Writes one JSON line per case to --out; stops starting new groups after --budget-s seconds."""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
import kernels as ek
import torch
import triton

from fuselab.bench.timer import benchmark
from fuselab.ops.softmax import cuda as sc
from fuselab.ops.softmax import triton as st
from fuselab.ops.softmax.naive import softmax_naive

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
p.add_argument("--budget-s", type=float, default=420)
p.add_argument("--groups", default="")
args = p.parse_args()
T0 = time.time()
DRY = os.environ.get("TRITON_INTERPRET") == "1"  # a CPU dry run of the script's logic, tiny tensors
dev = torch.device("cpu" if DRY else "cuda")
SMS = 4 if DRY else torch.cuda.get_device_properties(dev).multi_processor_count
E = 1 << (18 if DRY else 26)
TIMING = dict(warmup_ms=15, rep_ms=40, min_reps=5)
inputs = {}


def data(dtype, width):
    key = (dtype, width)
    if key not in inputs:
        inputs.clear()
        if not DRY:
            torch.cuda.empty_cache()
        g = torch.Generator(device=dev).manual_seed(width)
        x = (torch.randn(E // width, width, device=dev, generator=g) * 3).to(dtype)
        ref = torch.softmax(x[:16].double(), -1)
        inputs[key] = (x, torch.empty_like(x), ref)
    return inputs[key]


def record(group, dtype, width, name, fn, copy=False, **meta):
    """Check fn on 16 rows against softmax (or, with copy, against x itself), then time it."""
    x, y, ref = data(dtype, width)
    if copy:
        ref = x[:16].double()
    row = {"group": group, "dtype": str(dtype)[6:], "width": width, "name": name, **meta}
    try:
        y.fill_(float("nan"))
        out = fn(x, y)
        out = y if out is None else out
        if not DRY:
            torch.cuda.synchronize()
        err = ((out[:16].double() - ref).abs().max() / ref.abs().max()).item()
        row["err"] = err
        if not err < (2e-2 if dtype != torch.float32 else 1e-5):
            row["error"] = f"wrong: rel err {err:.2e}"
        else:
            ms = benchmark(
                lambda: fn(x, y),
                device=dev,
                **(dict(warmup_ms=0, rep_ms=0, min_reps=1, min_warmup=0) if DRY else TIMING),
            ).median_ms
            row["ms"] = ms
            row["gbps"] = 2 * x.numel() * x.element_size() / ms / 1e6
    except Exception as e:
        row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
    with open(args.out, "a") as f:
        f.write(json.dumps(row) + "\n")
    shown = f"{row['gbps']:6.0f} GB/s" if "gbps" in row else row["error"][:80]
    print(f"[{time.time() - T0:5.0f}s] {group:10s} {row['dtype']:8s} {width:7d} {name:50s} {shown}", flush=True)
    return row


def checked(fn, dtype):
    """fn, checked once on the whole tensor against torch.softmax in fp32 (a persistent kernel's later rows too)."""
    seen = set()

    def run(x, y):
        fn(x, y)
        if id(x) not in seen:
            seen.add(id(x))
            err = (y.float() - torch.softmax(x.float(), -1)).abs().max().item()
            if not err < (1e-2 if dtype != torch.float32 else 1e-5):
                raise AssertionError(f"whole tensor: max abs err {err:.2e}")

    return run


def baselines(group, dtype, width, compile_too):
    record(group, dtype, width, "torch", lambda x, y: torch.softmax(x, -1))
    record(
        group,
        dtype,
        width,
        "shipped triton " + str(st.forward_plan(width, dtype, dev)),
        lambda x, y: st.launch_forward(x, y),
    )
    record(group, dtype, width, "cuda (new batch rule)", lambda x, y: sc.launch_forward(x, y))
    if compile_too:
        torch._dynamo.reset()
        f = torch.compile(softmax_naive, dynamic=False)
        record(group, dtype, width, "compile", lambda x, y: f(x))


def rows(dtype, width, rows_, warps, evict=0):
    block = triton.next_power_of_2(width)

    def fn(x, y):
        ek.rows_kernel[(triton.cdiv(x.shape[0], rows_),)](
            x,
            y,
            x.shape[0],
            width,
            x.stride(0),
            y.stride(0),
            ROWS=rows_,
            BLOCK=block,
            LOWREG=0,
            EVICT=evict,
            num_warps=warps,
        )

    return fn


def persistent(dtype, width, rows_, warps, stages, per_sm):
    block = triton.next_power_of_2(width)

    def fn(x, y):
        grid = min(triton.cdiv(x.shape[0], rows_), per_sm * SMS)
        ek.rows_persistent_kernel[(grid,)](
            x,
            y,
            x.shape[0],
            width,
            x.stride(0),
            y.stride(0),
            ROWS=rows_,
            BLOCK=block,
            STAGES=stages,
            LOWREG=0,
            num_warps=warps,
        )

    return fn


def packed(width, rows_, warps, asm=1):
    pairs = triton.next_power_of_2(width // 2)

    def fn(x, y):
        xv, yv = x.view(torch.int32), y.view(torch.int32)
        ek.rows_packed_kernel[(triton.cdiv(x.shape[0], rows_),)](
            xv,
            yv,
            x.shape[0],
            width // 2,
            xv.stride(0),
            yv.stride(0),
            ROWS=rows_,
            PAIRS=pairs,
            ASM=asm,
            num_warps=warps,
        )

    return fn


def split(width, chunk, warps, pack):
    n_split = triton.cdiv(width, chunk)

    def fn(x, y):
        n = x.shape[0]
        stats = torch.empty(2, n * n_split, dtype=torch.float32, device=dev)
        sync = torch.zeros(1 + n, dtype=torch.int32, device=dev)
        if pack:
            xv, yv = x.view(torch.int32), y.view(torch.int32)
            ek.split_packed_kernel[(n * n_split,)](
                xv,
                yv,
                stats[0],
                stats[1],
                sync,
                width // 2,
                xv.stride(0),
                yv.stride(0),
                SPLIT=n_split,
                SPLIT_P2=triton.next_power_of_2(n_split),
                CHUNK=chunk // 2,
                ASM=1,
                num_warps=warps,
            )
        else:
            ek.split_kernel[(n * n_split,)](
                x,
                y,
                stats[0],
                stats[1],
                sync,
                width,
                x.stride(0),
                y.stride(0),
                SPLIT=n_split,
                SPLIT_P2=triton.next_power_of_2(n_split),
                CHUNK=chunk,
                LOWREG=0,
                num_warps=warps,
            )

    return fn


def row_group(dtype, width, quick=False):
    """Rows-kernel alternatives at one width: tiles/warps, eviction hint, persistent pipelined, packed (bf16)."""
    g = "rows"
    item = dtype.itemsize
    block = triton.next_power_of_2(width)
    w0 = st._warps(block, item)
    for r in sorted({max(1, tile // (block * item)) for tile in (4096, 8192, 16384)}):
        for w in sorted({max(2, w0 // 2), w0, min(32, w0 * 2)}):
            record(g, dtype, width, f"rows R{r} w{w}", rows(dtype, width, r, w), rows_=r, warps=w)
    r = max(1, 4096 // (block * item))
    record(g, dtype, width, f"rows R{r} w{w0} evict_first", rows(dtype, width, r, w0, 1), rows_=r, warps=w0, evict=1)
    for r in sorted({max(1, tile // (block * item)) for tile in (4096, 16384)}):
        tile_b = r * block * item
        for w in sorted({w0, min(32, 2 * w0)}):
            for stages in (1, 2, 3):
                if stages * tile_b > 200 * 1024:
                    continue
                for per_sm in (1, 2, 4, 8, 16):
                    if per_sm * max(stages - 1, 1) * tile_b > 220 * 1024 or per_sm * w > 64:
                        continue
                    record(
                        g,
                        dtype,
                        width,
                        f"persistent R{r} w{w} S{stages} x{per_sm}/SM",
                        persistent(dtype, width, r, w, stages, per_sm),
                        rows_=r,
                        warps=w,
                        stages=stages,
                        per_sm=per_sm,
                    )
    if dtype == torch.bfloat16:
        for r in sorted({max(1, tile // (block * item)) for tile in (4096, 8192, 16384)}):
            for w in sorted({max(4, w0 // 2), w0, min(32, 2 * w0)}):
                record(g, dtype, width, f"packed R{r} w{w}", packed(width, r, w), rows_=r, warps=w)


def split_group(dtype, width):
    g = "split"
    for chunk in (4096, 8192, 16384, 32768):
        if not 1 < triton.cdiv(width, chunk) <= SMS:
            continue
        for w in (4, 8, 16, 32):
            if chunk // (32 * w) > 64 or chunk // (32 * w) < 4:
                continue
            record(g, dtype, width, f"split C{chunk} w{w}", split(width, chunk, w, 0), chunk=chunk, warps=w)
            if dtype == torch.bfloat16:
                record(
                    g,
                    dtype,
                    width,
                    f"split packed C{chunk} w{w}",
                    split(width, chunk, w, 1),
                    chunk=chunk,
                    warps=w,
                    packed=1,
                )
    if dtype == torch.bfloat16:
        for w in (16, 32):
            record(g, dtype, width, f"packed rows R1 w{w}", packed(width, 1, w), rows_=1, warps=w)


PLAN = [
    ("base", torch.float32, 256, None),
    ("base", torch.float32, 512, None),
    ("base", torch.float32, 1024, None),
    ("rows", torch.float32, 512, None),
    ("rows", torch.float32, 1024, None),
    ("rows", torch.bfloat16, 32768, None),
    ("rows", torch.bfloat16, 16384, None),
    ("split", torch.bfloat16, 262144, None),
    ("split", torch.bfloat16, 131072, None),
    ("split", torch.bfloat16, 65536, None),
    ("rows", torch.bfloat16, 4096, None),
    ("rows", torch.bfloat16, 8192, None),
    ("rows", torch.bfloat16, 512, None),
    ("rows", torch.float32, 32768, None),
    ("base", torch.bfloat16, 512, None),
    ("base", torch.bfloat16, 1024, None),
    ("base", torch.float32, 128, None),
    ("rows", torch.bfloat16, 128, None),
    ("rows", torch.bfloat16, 256, None),
    ("rows", torch.bfloat16, 1024, None),
    ("rows", torch.bfloat16, 2048, None),
    ("rows", torch.float32, 128, None),
    ("rows", torch.float32, 256, None),
    ("rows", torch.float32, 2048, None),
    ("rows", torch.float32, 4096, None),
    ("rows", torch.float32, 8192, None),
    ("rows", torch.float32, 16384, None),
    ("split", torch.float32, 262144, None),
]
only = set(args.groups.split(",")) - {""}
for kind, dtype, width, _ in PLAN if __name__ == "__main__" else []:
    if time.time() - T0 > args.budget_s:
        print("budget spent; stopping", flush=True)
        break
    if only and kind not in only:
        continue
    if kind == "base":
        baselines("base", dtype, width, compile_too=True)
    elif kind == "rows":
        record("rows", dtype, width, "torch", lambda x, y: torch.softmax(x, -1))
        record(
            "rows",
            dtype,
            width,
            "shipped " + str(st.forward_plan(width, dtype, dev)),
            lambda x, y: st.launch_forward(x, y),
        )
        row_group(dtype, width)
    else:
        record(
            "split",
            dtype,
            width,
            "shipped " + str(st.forward_plan(width, dtype, dev)),
            lambda x, y: st.launch_forward(x, y),
        )
        split_group(dtype, width)
if __name__ == "__main__":
    print(f"done in {time.time() - T0:.0f}s")
