"""Time attention variants at chosen shapes, forward + backward (or, `--forward-only`, the forward), beside cuDNN, in
one run: one kernel's candidate plans, the backward's dS stored or recomputed, the head dim in other chunks.

    python3 scripts/attention_plan_sweep.py --kernel dkdv --plans 32x64x4x1,32x16x4x1 \
        --shape 24x16x4x117x117x256 --shape 2x8x8x2000x2000x192 --causal both --out sweep.jsonl
    python3 scripts/attention_plan_sweep.py --stored-scores --kernel dqds --plans 64x64x4x3,128x64x8x3 \
        --chunks 64+0 --shape 84x4x4x125x125x48 --out sweep.jsonl
    python3 scripts/attention_plan_sweep.py --forward-only --kernel fwd --plans 128x64x8x3,64x64x4x3 \
        --shape 209x8x8x91x91x64 --out sweep.jsonl

A shape is B x Hq x Hkv x Nq x Nk x d (GQA when Hkv < Hq). For each shape and causal setting, side by side
(fuselab.bench.timer.benchmark_side_by_side, L2 flushed): cuDNN and SDPA-flash (the op's sdpa-cudnn and sdpa-flash
impls, K/V heads repeated once beforehand; a backend that refuses the shape is recorded as its error), the Triton
kernels at their own plans ("plan", what `choose_plan` picks: table or rule, fitted), with `--kernel` forced to each of
`--plans` (as given, not fitted to the shape; dqds: the dQ kernel of stored scores, timed with them stored; dq: the
recomputing dQ kernel, timed with dS recomputed, the only backward it runs in), with the dS stored for dQ ("stored",
`--stored-scores`) or recomputed ("recomputed", where the rule stores it), and with the head dim held in other chunks
("chunks64+0", `--chunks`; own plans, as the table keys them), and by pointers where they would take TMA descriptors
("pointers", and "<variant> pointers"; `--pointers`). Each line of `--out` (JSON) is one shape's medians in ms,
with the GPU, torch, Triton and git revision. A variant that fails to compile or gives a wrong result is recorded with
its error. Exploration: what it finds goes into the rules or the tuner's candidates (docs/ops/attention.md).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
import triton

from fuselab.bench.accuracy import relative_error
from fuselab.bench.env import revision
from fuselab.bench.timer import benchmark_side_by_side
from fuselab.ops import tuning
from fuselab.ops.attention import triton_kernels as tk
from fuselab.ops.attention.spec import ATTENTION, reference, repeat_kv

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # the CPU: a smoke test under TRITON_INTERPRET=1


DTYPE = torch.bfloat16 if DEVICE == "cuda" else torch.float32  # the interpreter: fp32 only
PEERS = ("sdpa-cudnn", "sdpa-flash")  # timed beside, where they take the shape (K/V heads repeated beforehand)


def parse_plan(text: str) -> tk.Plan:
    """'32x16x4x1' -> Plan(block_m 32, block_n 16, warps 4, stages 1)."""
    m, n, w, s = (int(x) for x in text.split("x"))
    return tk.Plan(m, n, w, s)


def parse_shape(text: str) -> tuple[int, ...]:
    shape = tuple(int(x) for x in text.lower().split("x"))
    if len(shape) != 6:
        raise argparse.ArgumentTypeError(f"a shape is BxHqxHkvxNqxNkxd, got {text!r}")
    return shape


@dataclass(frozen=True)
class Variant:
    """One way to run the Triton kernels: plans forced by kernel, dS stored or not (None: the rule), the head dim's
    chunks (None: `d_chunks`), by pointers where TMA descriptors would be used (`pointers`)."""

    plans: dict[str, tk.Plan] = field(default_factory=dict)
    stored: bool | None = None
    chunks: tuple[int, int] | None = None
    pointers: bool = False


@contextlib.contextmanager
def running(variant: Variant, d: int) -> Iterator[None]:
    """Within the block, the kernels run as `variant` says (chunks: `tk.d_chunks` answers them for d, with plans
    chosen apart from the other variants')."""
    stack = contextlib.ExitStack()
    with stack:
        stack.enter_context(tk.forced_plans(variant.plans))
        if variant.stored is not None:
            stack.enter_context(tk.forced_stored_scores(variant.stored))
        if variant.chunks is not None:
            original, plans = tk.d_chunks, tk._PLANS
            tk.d_chunks = lambda n: variant.chunks if n == d else original(n)
            tk._PLANS = CHUNKED_PLANS.setdefault(variant.chunks, tuning.Prepared())
            stack.callback(setattr, tk, "d_chunks", original)
            stack.callback(setattr, tk, "_PLANS", plans)
        if variant.pointers:
            stack.callback(setattr, tk, "tma_ready", tk.tma_ready)
            tk.tma_ready = lambda *tensors: False
        yield


CHUNKED_PLANS: dict[tuple[int, int], tuning.Prepared] = {}  # the plans chosen under each chunking


def sweep_shape(
    shape: tuple[int, ...], causal: bool, variants: dict[str, Variant], rep_ms: float, backward: bool = True
) -> dict:
    """Medians (ms) of cuDNN, the Triton kernels at their own plans ("plan"), and as each variant runs them: forward +
    backward, or (backward False) the forward alone, checked on its output alone."""
    b, hq, hkv, nq, nk, d = shape
    gen = torch.Generator(device=DEVICE).manual_seed(sum(shape) + causal)
    q, k, v, do = (
        torch.randn(b, h, n, d, device=DEVICE, generator=gen).to(DTYPE)
        for h, n in ((hq, nq), (hkv, nk), (hkv, nk), (hq, nq))
    )
    scale = d**-0.5
    # K/V heads repeated once, outside the timed call; the backend forced as `fuselab bench attention` forces it
    leaves = [t.clone().requires_grad_(True) for t in (q, *repeat_kv(q, k, v))]

    def peer_step(impl: str):
        fn = ATTENTION.get_impl(impl)

        def step() -> None:
            out = fn(*leaves, causal=causal, scale=scale)
            if backward:
                out.backward(do)

        return step

    def triton_step(variant: Variant):
        def step() -> None:
            with running(variant, d):
                o, lse = tk.forward(q, k, v, causal, scale)
                if backward:
                    tk.backward(do, q, k, v, o, lse, causal, scale)

        return step

    # checked against float64 on one batch entry, every output
    small = [t[:1] for t in (q, k, v)]
    refs = None
    fns, errors = {}, {}
    for impl in PEERS:  # each tried once: a backend that refuses the shape is recorded, not timed
        step = peer_step(impl)
        try:
            step()
            fns[impl] = step
        except Exception as exc:
            errors[impl] = f"{type(exc).__name__}: {exc}"[:200]
    fns["plan"] = triton_step(Variant())
    for name, variant in variants.items():
        if variant.chunks is not None and sum(variant.chunks) < d:
            continue  # chunks that cannot hold this head dim
        try:
            with running(variant, d):
                xs = [t.clone().double().requires_grad_(True) for t in small]
                if refs is None:
                    out = reference(*xs, causal=causal)
                    out.backward(do[:1].double())
                    refs = [out.detach(), *(x.grad for x in xs)]
                o, lse = tk.forward(*small, causal, scale)
                got = (o, *tk.backward(do[:1], *small, o, lse, causal, scale)) if backward else (o,)
                err = max(relative_error(g, want) for g, want in zip(got, refs[: len(got)], strict=True))
            if not err < 3e-2:
                raise AssertionError(f"relative error {err:.2e}")
            fns[name] = triton_step(variant)
        except Exception as exc:  # out of shared memory, a compile error, a wrong result
            errors[name] = f"{type(exc).__name__}: {exc}"[:200]
    ms = {name: m.median_ms for name, m in benchmark_side_by_side(fns, rounds=3, rep_ms=rep_ms, warmup_ms=50).items()}
    # each kernel's plan as the launchers choose it (dK/dV: the keys some query sees, over key/value heads)
    sizes = {"fwd": (nk, b * hq), "dkdv": (tk.seen_keys(nq, nk, causal), b * hkv), "dq": (nk, b * hq)}
    if not backward:
        sizes = {"fwd": sizes["fwd"]}
    chosen = {kernel: str(tk.choose_plan(kernel, d, q.dtype, causal, q.device, nq, *sizes[kernel])) for kernel in sizes}
    stores = backward and tk.stores_scores(d, b * hq, nq, nk)
    if stores:  # the own plans' dQ is the kernel of stored scores
        gpu = tk._gpu(q.device)
        chosen[tk.DQ_DS] = str(tk.ds_plan(d, q.dtype, nq, nk, b * hq, gpu[1] if gpu else 0))
        del chosen["dq"]
    return {
        "shape": list(shape),
        "causal": causal,
        "pass": "forward+backward" if backward else "forward",
        "own_plans": chosen,
        "stores_scores": stores,
        "variants_store": {name: variant.stored for name, variant in variants.items() if name in ms},
        "ms": ms,
        "errors": errors,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kernel", choices=(*tk.KERNELS, tk.DQ_DS), help="the kernel whose --plans are forced")
    p.add_argument("--plans", default="", help="comma-separated MxNxWARPSxSTAGES")
    p.add_argument("--stored-scores", action="store_true", help="time dS stored for dQ, and recomputed")
    p.add_argument("--chunks", default="", help="comma-separated head-dim chunks, e.g. 64+0,32+16")
    p.add_argument("--shape", type=parse_shape, action="append", required=True)
    p.add_argument("--causal", choices=("yes", "no", "both"), default="yes")
    p.add_argument("--forward-only", action="store_true", help="time the forward alone (the backward not run)")
    p.add_argument("--pointers", action="store_true", help="also run the own plans and each variant by pointers, "
                   "where they would take TMA descriptors")  # fmt: skip
    p.add_argument("--rep-ms", type=float, default=150.0)
    p.add_argument("--out", type=Path, required=True, help="JSON lines, appended")
    args = p.parse_args()
    if DEVICE == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        print("attention_plan_sweep: needs a CUDA GPU (or TRITON_INTERPRET=1, a smoke test)", file=sys.stderr)
        return 2
    variants: dict[str, Variant] = {}
    for plan in (parse_plan(t) for t in args.plans.split(",") if t):
        if args.kernel is None:
            p.error("--plans needs --kernel")
        name = f"{args.kernel} {plan.block_m}x{plan.block_n}x{plan.warps}x{plan.stages}"
        # the dQ kernel of stored scores runs only with them stored, the recomputing one only without
        stored = {tk.DQ_DS: True, "dq": False}.get(args.kernel)
        variants[name] = Variant({args.kernel: plan}, stored)
    if args.stored_scores:
        variants["stored"], variants["recomputed"] = Variant(stored=True), Variant(stored=False)
    for text in (t for t in args.chunks.split(",") if t):
        da, db = (int(x) for x in text.split("+"))
        variants[f"chunks{da}+{db}"] = Variant(chunks=(da, db))
    if args.pointers:
        by_pointers = {f"{name} pointers": replace(variant, pointers=True) for name, variant in variants.items()}
        variants = {**variants, "pointers": Variant(pointers=True), **by_pointers}
    if not variants:
        p.error("nothing to time beside the own plans: give --plans, --stored-scores, --chunks or --pointers")
    if args.forward_only and (args.stored_scores or args.kernel not in (None, "fwd")):
        p.error("--forward-only times the forward: --kernel fwd or --chunks only")
    causals = {"yes": [True], "no": [False], "both": [False, True]}[args.causal]
    commit, dirty = revision()
    env = {
        "gpu": torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu",
        "torch": torch.__version__,
        "triton": triton.__version__,
        "revision": commit,
        "dirty": dirty,
    }
    for shape in args.shape:
        for causal in causals:
            start = time.perf_counter()
            row = {**sweep_shape(shape, causal, variants, args.rep_ms, not args.forward_only), **env}
            with args.out.open("a") as f:
                f.write(json.dumps(row) + "\n")
            best = min(row["ms"].items(), key=lambda kv: kv[1] if kv[0] != "sdpa-cudnn" else float("inf"))
            cudnn = row["ms"].get("sdpa-cudnn")
            ratio = f"{best[1] / cudnn:.2f}x cuDNN" if cudnn else "no cuDNN"
            print(
                f"{'x'.join(map(str, shape))} causal={causal}: own plans {row['ms']['plan']:.3f} ms; "
                f"best {best[0]} {best[1]:.3f} ({ratio}); {time.perf_counter() - start:.0f} s",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
