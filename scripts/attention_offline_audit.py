"""The Triton attention's launches as a GPU's plan table and SM count make them, compiled without that GPU.

For each shape (B x Hq x Hkv x Nq x Nk x d, a trailing "c" for causal) and dtype, the forward and backward launch
under Triton's interpreter with the launches intercepted (not run), planned as the GPU would (`tuning.planning_as`:
its tuned plans, fitted to the shape; TMA descriptors for 16-bit inputs, as on Hopper); each launched kernel is
compiled for sm_90 as Triton's JIT would specialize it, and ptxas counts its registers. Prints, per launch: the plan
(queries x keys a tile / stages), warps, registers a thread, spilled bytes, shared memory, programs an SM (by
registers, warps and shared memory), the grid and the waves it takes. `--force dkdv=16,64,4,3` launches a kernel
with a plan of your own (a candidate to time). What it found is in docs/ops/attention.md.

    python scripts/attention_offline_audit.py --dtype bf16 16x1x1x16384x16384x64c 1x16x4x11589x11589x128c
    python scripts/attention_offline_audit.py --dtype bf16 --force dkdv=16,64,4,3 3x8x2x7371x7371x128c
    python scripts/attention_offline_audit.py --dtype bf16 --stored-scores yes 8x12x12x1024x1024x64c

`--ptx-digest` prints instead each launch's kernel code as a short digest of its PTX (debug sections and comments
aside): run it on two trees (PYTHONPATH) to see which kernels a change compiles differently, and so which it can
change the speed of (docs/ops/attention.md, session 74: a rewrite that compiled to kernels already timed).

    PYTHONPATH=src python scripts/attention_offline_audit.py --ptx-digest 16x1x1x16384x16384x64c 2x8x8x3000x3000x96
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
from dataclasses import dataclass
from functools import partial

import torch

import fuselab  # noqa: F401  (TRITON_INTERPRET=1 without a GPU, before a kernel is defined)
from fuselab.bench.dtypes import parse_dtype
from fuselab.ops import tuning
from fuselab.ops.attention import triton_kernels as tk
from fuselab.profile import inspect_triton
from fuselab.profile.inspect_triton import InterceptedLaunch


@dataclass(frozen=True)
class Shape:
    batch: int
    q_heads: int
    kv_heads: int
    nq: int
    nk: int
    d: int
    causal: bool

    @classmethod
    def parse(cls, text: str) -> Shape:
        """'1x16x4x11589x11589x128c' (B x Hq x Hkv x Nq x Nk x d, c: causal)."""
        causal = text.endswith("c")
        sizes = [int(n) for n in text.removesuffix("c").split("x")]
        if len(sizes) != 6:
            raise argparse.ArgumentTypeError(f"{text!r}: give B x Hq x Hkv x Nq x Nk x d, e.g. 1x16x4x3000x3000x128c")
        return cls(*sizes, causal)

    def __str__(self) -> str:
        return "x".join(map(str, (self.batch, self.q_heads, self.kv_heads, self.nq, self.nk, self.d))) + (
            "c" if self.causal else ""
        )


def intercept(
    shapes: list[Shape], dtype: torch.dtype, forced: dict[str, tk.Plan], stored_scores: bool | None = None
) -> dict[Shape, list[InterceptedLaunch]]:
    """Each shape's forward and backward launches, intercepted under the interpreter (`stored_scores`: the
    backward's dS stored for dQ, or recomputed, whatever the rule says; None: the rule)."""

    def run(s: Shape) -> None:
        q = torch.empty(s.batch, s.q_heads, s.nq, s.d, dtype=dtype)
        k = torch.empty(s.batch, s.kv_heads, s.nk, s.d, dtype=dtype)
        v = torch.empty_like(k)
        o, lse = tk.forward(q, k, v, s.causal, s.d**-0.5)
        tk.backward(torch.empty_like(o), q, k, v, o, lse, s.causal, s.d**-0.5)

    scores = tk.forced_stored_scores(stored_scores) if stored_scores is not None else contextlib.nullcontext()
    with tk.forced_plans(forced), scores:
        return {s: inspect_triton.intercept(partial(run, s)) for s in shapes}


def tile(kwargs: dict) -> str:
    """A launch's plan as "BLOCK_M x BLOCK_N / stages"."""
    rows = kwargs.get("BLOCK_M", kwargs.get("BLOCK_R", "-"))
    return f"{rows}x{kwargs.get('BLOCK_N', '-')}/{kwargs.get('num_stages')}"


def ptx_digest(ptx: str) -> str:
    """A kernel's PTX code as 12 hex digits: equal wherever two trees compile the kernel alike (the debug sections,
    which hold source paths and lines, and comments left out)."""
    code = ptx.split(".section\t.debug")[0].split(".section .debug")[0]
    lines = (line.split("//")[0].rstrip() for line in code.splitlines())
    kept = (line for line in lines if line and not line.lstrip().startswith((".loc", ".file")))
    return hashlib.sha1("\n".join(kept).encode()).hexdigest()[:12]


def forced_plan(text: str) -> tuple[str, tk.Plan]:
    """'dkdv=16,64,4,3' -> ("dkdv", Plan(16, 64, 4, 3))."""
    kernel, _, plan = text.partition("=")
    kernels = (*tk.KERNELS, tk.DQ_DS)  # dqds: the dQ kernel of stored scores
    if kernel not in kernels or len(plan.split(",")) != 4:
        raise argparse.ArgumentTypeError(f"{text!r}: give KERNEL=BLOCK_M,BLOCK_N,WARPS,STAGES, KERNEL in {kernels}")
    return kernel, tk.Plan(*(int(n) for n in plan.split(",")))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "shapes", nargs="+", type=Shape.parse, help="B x Hq x Hkv x Nq x Nk x d[c], e.g. 1x8x2x3000x3000x80c"
    )
    parser.add_argument("--dtype", default="bf16", help="bf16, fp16, fp32 (default bf16)")
    parser.add_argument("--gpu", default=tuning.key_of("NVIDIA H200", 9, 0), help="plan table key (default: H200)")
    parser.add_argument("--sms", type=int, default=132, help="the GPU's SM count (default 132)")
    parser.add_argument(
        "--force", type=forced_plan, action="append", default=[], help="KERNEL=BLOCK_M,BLOCK_N,WARPS,STAGES"
    )
    parser.add_argument(
        "--stored-scores", choices=("yes", "no"), help="the backward stores dS for dQ (yes) or not; default: the rule"
    )
    parser.add_argument(
        "--ptx-digest", action="store_true", help="print each launch's kernel code as a digest of its PTX instead"
    )
    args = parser.parse_args()
    stored = None if args.stored_scores is None else args.stored_scores == "yes"
    with tuning.planning_as(tuning.GPUModel(args.gpu, args.sms, 9)):
        by_shape = intercept(args.shapes, parse_dtype(args.dtype), dict(args.force), stored)
    if args.ptx_digest:
        jobs = sorted({one.job for launches in by_shape.values() for one in launches})
        compiled = inspect_triton.compile_jobs_offline([json.loads(job) for job in jobs], 90)
        digests = {job: ptx_digest(c["asm"]["ptx"]) for job, c in zip(jobs, compiled, strict=True)}
        names = {job: c["metadata"]["name"] for job, c in zip(jobs, compiled, strict=True)}
        print("shape kernel tile warps ptx_digest")
        for shape, launches in by_shape.items():
            for one in launches:
                print(f"{shape} {names[one.job]} {tile(one.kwargs)} {one.warps} {digests[one.job]}")
        return
    compiled = inspect_triton.compile_launches([one.job for launches in by_shape.values() for one in launches], 90)
    print("shape kernel tile warps registers spilled_bytes widest_load_bytes shared_kib programs_per_sm grid waves")
    for shape, launches in by_shape.items():
        for one in launches:
            c = compiled[one.job]
            held = inspect_triton.programs_per_sm(c, one.warps)
            print(f"{shape} {c.name} {tile(one.kwargs)} {one.warps} {c.registers} {c.spills} {c.widest_load} "
                  f"{c.shared / 1024:.1f} {held} {one.grid} {one.grid / (held * args.sms):.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
