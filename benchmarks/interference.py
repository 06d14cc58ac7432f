"""How much a case's time changes when the other GPUs of the host run at the same time (shared power, host CPU, PCIe).

Each case is timed by fuselab's harness on every rank's GPU in three ways, taking turns over --rounds rounds:
  alone     one rank times while the others wait (idle GPUs): what `fuselab bench --isolate` gives;
  together  all ranks time the case at once: what `fuselab bench` on many GPUs gives (throughput);
  busy      one rank times while the others run the same case back to back without pause (the worst neighbour).
The JSON has each rank's medians per mode and the ratios together/alone and busy/alone (1.00 = no effect).

    torchrun --nproc-per-node 2 benchmarks/interference.py --out benchmarks/results/h200x2/interference.json
    python benchmarks/interference.py --gpus 2 ...             (launches torchrun itself)
    torchrun --nproc-per-node 2 benchmarks/interference.py --quick --device cpu --out /tmp/i.json   (CPU, gloo)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist

from fuselab.bench import benchmark, distributed, environment
from fuselab.bench.dtypes import parse_dtype
from fuselab.ops.registry import get_op, parse_shape

MODES = ("alone", "together", "busy")


def cases(device: str, quick: bool, ops: list[str]) -> dict[str, Callable[[], Callable[[], object]]]:
    """name -> a maker of the callable to time (made on the rank's device). Generic loads plus --op cases."""
    gpu = device.startswith("cuda")
    copy_n = (2**28 if not quick else 2**24) if gpu else 2**18  # float32 elements: 1 GiB / 64 MiB / 1 MiB
    mm = (8192 if not quick else 2048) if gpu else 128
    mm_dtype = torch.bfloat16 if gpu else torch.float32

    def copy() -> Callable[[], object]:
        src = torch.rand(copy_n, device=device)
        dst = torch.empty_like(src)
        return lambda: dst.copy_(src)

    def matmul() -> Callable[[], object]:
        a, b = (torch.randn(mm, mm, device=device, dtype=mm_dtype) for _ in range(2))
        return lambda: a @ b

    def tiny() -> Callable[[], object]:
        x = torch.ones(1024, device=device)
        return lambda: x.add_(1)

    made: dict[str, Callable[[], Callable[[], object]]] = {
        f"copy {copy_n * 4 >> 20} MiB": copy,
        f"matmul {str(mm_dtype).removeprefix('torch.')} {mm}^3": matmul,
        "tiny add (launch-bound)": tiny,
    }
    for spec in ops:  # OP:IMPL:DTYPE:SHAPE, e.g. softmax:torch:bf16:16384x4096
        try:
            name, impl, dtype, shape = spec.split(":")
        except ValueError:
            raise SystemExit(f"--op takes OP:IMPL:DTYPE:SHAPE, got {spec!r}") from None

        def op_case(name: str = name, impl: str = impl, dtype: str = dtype, shape: str = shape) -> Callable:
            op = get_op(name)
            fn = op.get_impl(impl).fn
            if op.get_impl(impl).compiled:
                fn = torch.compile(fn)
            inputs = op.make_inputs(parse_shape(shape), parse_dtype(dtype), device, 1234)
            return lambda: fn(*inputs, **op.default_options())

        made[spec] = op_case
    return made


def busy_until(fn: Callable[[], object], store: dist.Store, key: str, sync: Callable[[], None]) -> int:
    """Run fn back to back until `key` appears in the store (checked every ~5 ms); returns the calls made."""
    calls = 0
    while not store.check([key]):
        start = time.perf_counter()
        while time.perf_counter() - start < 5e-3:
            fn()
            calls += 1
        sync()
    return calls


def run(args: argparse.Namespace) -> dict | None:
    me, n = distributed.rank(), distributed.world_size()
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    timing = {"warmup_ms": args.warmup_ms, "rep_ms": args.rep_ms, "device": device}
    store = dist.PrefixStore("interference/", dist.distributed_c10d._get_default_store())
    results = []
    for case, make in cases(device, args.quick, args.op).items():
        fn = make()
        fn()
        sync()
        medians: dict[str, list[float]] = {m: [] for m in MODES}
        busy_calls = 0
        for turn in range(args.rounds):
            for r in range(n):  # alone: rank r times, the others wait at the barrier
                dist.barrier()
                if me == r:
                    medians["alone"].append(benchmark(fn, label=case, **timing).median_ms)
                dist.barrier()
            dist.barrier()  # together: all at once
            medians["together"].append(benchmark(fn, label=case, **timing).median_ms)
            for r in range(n):  # busy: rank r times, the others keep their GPUs busy until it is done
                key = f"{case}/{turn}/{r}"
                dist.barrier()
                if me == r:
                    medians["busy"].append(benchmark(fn, label=case, **timing).median_ms)
                    store.set(key, "done")
                else:
                    busy_calls += busy_until(fn, store, key, sync)
                dist.barrier()
        row = {"case": case, **distributed.where(), "busy_calls_by_this_rank": busy_calls}
        for mode in MODES:
            row[f"{mode}_ms"] = medians[mode]
            row[f"{mode}_median_ms"] = statistics.median(medians[mode])
        for mode in ("together", "busy"):
            row[f"{mode}_vs_alone"] = row[f"{mode}_median_ms"] / row["alone_median_ms"]
        results.append(row)
        del fn
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
    gathered: list[list[dict] | None] = [None] * n
    dist.all_gather_object(gathered, results)
    if not distributed.is_main():
        return None
    rows = [row for rank_rows in gathered for row in rank_rows or []]
    meta = {
        "env": environment(device),
        "ranks": n,
        "nccl_nvls_enable": os.environ.get("NCCL_NVLS_ENABLE"),
        "timing": {k: v for k, v in timing.items() if k != "device"},
        "rounds": args.rounds,
        "modes": {
            "alone": "one rank times while the others wait at a barrier (idle GPUs)",
            "together": "all ranks time the case at the same time",
            "busy": "one rank times while the others run the same case back to back",
        },
    }
    return {"meta": meta, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, help="JSON results")
    p.add_argument("--op", action="append", default=[], metavar="OP:IMPL:DTYPE:SHAPE", help="also time an op's impl")
    p.add_argument("--device", help="cuda or cpu (default: the GPU if any)")
    p.add_argument("--rounds", type=int, default=2, help="alone/together/busy taken in turn this many times")
    p.add_argument("--rep-ms", type=float, default=200.0, help="time spent repeating per measurement (ms)")
    p.add_argument("--warmup-ms", type=float, default=100.0, help="warm-up per measurement (ms)")
    p.add_argument("--quick", action="store_true", help="small sizes")
    p.add_argument("--gpus", help="without torchrun: launch it on N GPUs (or all)")
    argv = sys.argv[1:] if argv is None else argv
    args = p.parse_args(argv)
    if "WORLD_SIZE" not in os.environ:
        from torch.distributed.run import parse_args as torchrun_args
        from torch.distributed.run import run as torchrun

        nproc = distributed.gpus_requested(args.gpus or "all")
        rest, _ = distributed.pop_gpus(argv)
        torchrun(torchrun_args(["--standalone", "--nproc-per-node", str(nproc), __file__, *rest]))
        return 0
    with distributed.session():
        if distributed.world_size() < 2:
            raise SystemExit("interference needs 2+ ranks: torchrun --nproc-per-node N benchmarks/interference.py")
        result = run(args)
    if result is None:
        return 0
    for row in result["rows"]:
        print(
            f"rank {row['rank']} {row['case']:<32} alone {row['alone_median_ms']:.4f} ms  "
            f"together x{row['together_vs_alone']:.3f}  busy x{row['busy_vs_alone']:.3f}"
        )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1, default=str) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
