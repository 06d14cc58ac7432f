"""What each mode of the report measures in the sections that are not an op's: sizes, dtypes and timing.

quick: tiny sizes, seconds per section (the CPU test). cpu: the default without a GPU, within 5 minutes on 2 cores
(Triton is checked under its interpreter, never timed). gpu: the full report, within 20 minutes on an H200.
max_call_ms: an impl whose call took longer at one case is not timed at the costlier cases of its section's sweeps
(op sections, every_shape, call_cost: fuselab.evaluate.CallCap, shapes timed cheapest first; a teaching impl in
pure PyTorch would take minutes there), nor profiled under ncu at the large study shape (counters). What an op's
own section measures in each mode is the op's (`Defaults.report`, in its folder). The pitfalls and profile entries of
kind "op" time a memory-bound op's impl (the first registered that has it).

every_shape (every op, its own `random_shape`): n shapes drawn with a fixed seed; on the CPU capped at max_bytes moved
and max_flops per call (a draw above has its first dimension cut); dtypes: how many of the op's report dtypes (None:
all); compiled: whether compiled impls (one torch.compile per shape) are timed. call_cost (every op): its profile
shape grown or shrunk to move min_bytes, min_bytes * factor, ... max_bytes (those above max_flops left out);
call_cost_ms per impl and size; compile_modes: the torch.compile modes the baseline and fused impls are also timed
under (GPU only), until compile_deadline_s has passed in the op.
"""

from __future__ import annotations

from fuselab.bench.timer import Timing
from fuselab.evaluate.choices import CPU_RANDOM_CAP

QUICK = {
    "timing": Timing(warmup_ms=5.0, min_warmup=1, rep_ms=20.0, min_reps=3, max_reps=30),
    "max_call_ms": 100.0,
    "ceilings_refresh": False,
    "pitfalls": [
        {"kind": "matmul", "n": 128, "dtype": "float32"},
        {"kind": "op", "impl": "compile", "shape": [2**12], "dtype": "float32"},
    ],
    "matmul_sizes": [2**k for k in range(4, 9)],
    "matmul_dtypes": ["float32"],
    "mlp_base": {"layers": 2, "steps": 2, "batch": 32, "dim": 64},
    "mlp_sweeps": {"layers": [1, 2, 4], "steps": [1, 2, 4], "batch": [16, 32, 64], "dim": [32, 64, 128]},
    "profile": {"warmup": 1, "iters": 2, "cases": None, "op_impl": "naive", "op_numel": 2**12},
    "runahead": {"steps": 3, "layers": 2},
    "inspect": "first",  # one Triton impl (the first op's), compiled offline: the section's path, in seconds
    "every_shape": {
        "n": 3,
        "seed": 16,
        "max_bytes": 2**18,
        "max_flops": 2e6,
        "dtypes": 1,
        "compiled": False,
        "timing": Timing(warmup_ms=1.0, min_warmup=1, rep_ms=4.0, min_reps=3, max_reps=10),
    },
    "call_cost": {
        "min_bytes": 2**12,
        "max_bytes": 2**18,
        "factor": 16,
        "max_flops": 1e7,
        "call_cost_ms": 4.0,
        "compiled": False,
        "compile_modes": (),
        "compile_deadline_s": 0.0,
        "timing": Timing(warmup_ms=1.0, min_warmup=1, rep_ms=4.0, min_reps=3, max_reps=10),
    },
}

CPU = {
    # max_reps capped: a call slowed down by other load on the machine cannot stretch a case for long
    "timing": Timing(warmup_ms=20.0, rep_ms=100.0, min_reps=5, max_reps=50),
    "max_call_ms": 500.0,
    "ceilings_refresh": False,
    "pitfalls": [
        {"kind": "matmul", "n": 512, "dtype": "float32"},
        {"kind": "op", "impl": "naive", "shape": [2**20], "dtype": "float32"},
        {"kind": "op", "impl": "compile", "shape": [2**20], "dtype": "float32"},
    ],
    "matmul_sizes": [2**k for k in range(4, 11)],
    "matmul_dtypes": ["float32"],
    "mlp_base": {"layers": 4, "steps": 2, "batch": 128, "dim": 256},
    "mlp_sweeps": {
        "layers": [1, 2, 4, 8, 16],
        "steps": [1, 2, 4, 8, 16],
        "batch": [32, 64, 128, 256, 512],
        "dim": [64, 128, 256, 512],
    },
    "profile": {"warmup": 2, "iters": 3, "cases": None, "op_impl": "naive", "op_numel": 2**20},
    "runahead": {"steps": 10, "layers": 4},
    "inspect": "all",  # every impl that declares kernels
    "every_shape": {
        "n": 12,
        "seed": 16,
        **CPU_RANDOM_CAP,  # the caps of `fuselab bench OP --shapes random:N` on the CPU
        "dtypes": 1,
        "compiled": False,  # a CPU compile per shape (seconds each) would double the report
        "timing": Timing(warmup_ms=5.0, min_warmup=2, rep_ms=25.0, min_reps=5, max_reps=30),
    },
    "call_cost": {
        "min_bytes": 2**12,
        "max_bytes": 2**24,
        "factor": 4,
        "max_flops": 2e8,
        "call_cost_ms": 25.0,
        "compiled": False,
        "compile_modes": (),
        "compile_deadline_s": 0.0,
        "timing": Timing(warmup_ms=5.0, min_warmup=2, rep_ms=20.0, min_reps=5, max_reps=30),
    },
}

GPU = {
    "timing": Timing(warmup_ms=50.0, rep_ms=100.0, min_reps=10, max_reps=1000),
    "max_call_ms": 100.0,
    "ceilings_refresh": True,
    "pitfalls": [
        {"kind": "matmul", "n": 4096, "dtype": "bfloat16"},
        {"kind": "op", "impl": "naive", "shape": [2**24], "dtype": "float32"},
        {"kind": "op", "impl": "compile", "shape": [2**24], "dtype": "float32"},
    ],
    "matmul_sizes": [2**k for k in range(4, 14)],
    "matmul_dtypes": ["float32", "bfloat16"],
    "mlp_base": {"layers": 4, "steps": 4, "batch": 1024, "dim": 1024},
    "mlp_sweeps": {
        "layers": [1, 2, 4, 8, 16, 32],
        "steps": [1, 2, 4, 8, 16, 32],
        "batch": [128, 256, 512, 1024, 2048, 4096, 8192],
        "dim": [256, 512, 1024, 2048, 4096, 8192],
    },
    "profile": {"warmup": 3, "iters": 5, "cases": None, "op_impl": "naive", "op_numel": None},
    "runahead": {"steps": 20, "layers": 4},
    "inspect": "all",  # every impl that declares kernels
    "every_shape": {
        "n": 32,
        "seed": 16,
        "max_bytes": None,  # the op's own draw, as `fuselab bench OP --shapes random:32 --seed 16`
        "max_flops": None,
        "dtypes": None,
        "compiled": False,  # one torch.compile per shape and pass: some 10 s each for attention, 32 of them
        "timing": Timing(warmup_ms=20.0, rep_ms=50.0, min_reps=10, max_reps=500),
    },
    "call_cost": {
        "min_bytes": 2**12,
        "max_bytes": 2**30,
        "factor": 4,
        "max_flops": 2e11,  # attention's naive impl at 1 GiB moved would take seconds a call
        "call_cost_ms": 50.0,
        "compiled": False,  # the op's compiled impl: a compile per size; the compile modes below cover torch.compile
        "compile_modes": ("max-autotune-no-cudagraphs", "reduce-overhead"),
        "compile_deadline_s": 30.0,
        "timing": Timing(warmup_ms=20.0, rep_ms=50.0, min_reps=10, max_reps=500),
    },
}

BUDGETS = {"quick": QUICK, "cpu": CPU, "gpu": GPU}


def mode_for(device: str, quick: bool) -> str:
    if quick:
        return "quick"
    return "gpu" if device.startswith("cuda") else "cpu"
