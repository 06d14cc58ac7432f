"""Does the L2 flush between repetitions cost the timed kernel anything? triton's do_bench (and fuselab's timer until
2026-11-30) flushes by writing a buffer twice the L2's size, which leaves the L2 full of dirty lines; the next kernel
may pay for writing them back. This times the same kernels with that flush, with fuselab's flush that only reads
(clean lines), and with none. A sum over 16 MiB (read only, fits in L2) shows whether a flush evicts at all: without
one it is served from L2.

    PYTHONPATH=src python3 benchmarks/l2_flush_study.py --out l2_flush.json
"""

import argparse
import json

import torch
import torch.nn.functional as F

from fuselab.bench import timer
from fuselab.bench.env import environment
from fuselab.ops.softmax.triton import launch_forward

TIMING = timer.Timing(warmup_ms=20, rep_ms=100, min_reps=10)
read_flush = timer.L2Flusher.__call__  # fuselab's: reads 2x the L2


def write_flush(self) -> None:
    self.buffer.zero_()  # as triton.testing.do_bench


def cases(dev: torch.device):
    x = torch.rand(2**22, device=dev)
    yield "sum 16 MiB", x.nbytes, lambda: x.sum()
    for mib in (32, 128, 256, 2048):
        src = torch.rand(mib * 2**20 // 4, device=dev)
        dst = torch.empty_like(src)
        yield f"copy {mib} MiB", 2 * src.nbytes, lambda s=src, d=dst: d.copy_(s)
    for dtype, width in ((torch.bfloat16, 1024), (torch.bfloat16, 4096), (torch.bfloat16, 16384),
                         (torch.bfloat16, 32768), (torch.float32, 1024)):  # fmt: skip
        x = torch.randn(2**26 // width, width, device=dev).to(dtype)
        y = torch.empty_like(x)
        yield f"softmax triton {str(dtype)[6:]} {width}", 2 * x.nbytes, lambda x=x, y=y: launch_forward(x, y)
    for n in (24, 28):
        x = torch.randn(2**n, device=dev)
        yield f"F.gelu tanh fp32 2^{n}", 2 * x.nbytes, lambda x=x: F.gelu(x, approximate="tanh")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    args = p.parse_args()
    dev = torch.device("cuda")
    rows = []
    for name, nbytes, fn in cases(dev):
        row = {"case": name, "bytes": nbytes}
        for mode in ("write", "read", "none"):
            timer.L2Flusher.__call__ = write_flush if mode == "write" else read_flush
            m = timer.benchmark(fn, device=dev, timing=TIMING, flush_l2=mode != "none")
            row[mode] = {"median_ms": m.median_ms, "gbps": nbytes / m.median_ms / 1e6}
        timer.L2Flusher.__call__ = read_flush
        rows.append(row)
        print(
            f"{name:32s} " + "  ".join(f"{k} {row[k]['gbps']:6.0f} GB/s" for k in ("write", "read", "none")), flush=True
        )
    with open(args.out, "w") as f:
        json.dump({"env": environment("cuda"), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
