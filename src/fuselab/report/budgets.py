"""What each mode of the report measures: sizes, dtypes and timing per section.

quick: tiny sizes, seconds per section (the CPU test). cpu: the default without a GPU, within 5 minutes on 2 cores
(Triton is checked under its interpreter, never timed). gpu: the full report, within 10 minutes on an H200.
"""

from __future__ import annotations

QUICK = {
    "timing": {"warmup_ms": 5.0, "min_warmup": 1, "rep_ms": 20.0, "min_reps": 3, "max_reps": 30},
    "ceilings_refresh": False,
    "pitfalls": [
        {"kind": "matmul", "n": 128, "dtype": "float32"},
        {"kind": "op", "op": "gelu", "impl": "compile", "shape": [2**12], "dtype": "float32"},
    ],
    "matmul_sizes": [2**k for k in range(4, 9)],
    "matmul_dtypes": ["float32"],
    "mlp_base": {"layers": 2, "steps": 2, "batch": 32, "dim": 64},
    "mlp_sweeps": {"layers": [1, 2, 4], "steps": [1, 2, 4], "batch": [16, 32, 64], "dim": [32, 64, 128]},
    "gelu": {
        "check_shapes": [(1023,), (3, 37, 129)],
        "check_dtypes": ["float32"],
        "compile_check_shapes": [(1023,)],
        "compile_check_dtypes": ["float32"],
        "bench_shapes": [(2**12,), (2**14,)],
        "bench_dtypes": ["float32"],
        "erf_shape": (2**12,),
    },
    "softmax": {
        "check_shapes": [(37, 129), (4, 5, 300)],
        "check_dtypes": ["float32"],
        "compile_check_shapes": [(37, 129)],
        "compile_check_dtypes": ["float32"],
        "bench_numel": 2**14,
        "bench_widths": [128, 1024],
        "bench_dtypes": ["float32"],
    },
    "profile": {"warmup": 1, "iters": 2, "cases": None, "impls": [("gelu", "naive", (2**12,))]},
    "runahead": {"steps": 3, "layers": 2},
    "inspect": [("gelu", "triton"), ("softmax", "triton")],
}

CPU = {
    # max_reps capped: a call slowed down by other load on the machine cannot stretch a case for long
    "timing": {"warmup_ms": 20.0, "rep_ms": 100.0, "min_reps": 5, "max_reps": 50},
    "ceilings_refresh": False,
    "pitfalls": [
        {"kind": "matmul", "n": 512, "dtype": "float32"},
        {"kind": "op", "op": "gelu", "impl": "naive", "shape": [2**20], "dtype": "float32"},
        {"kind": "op", "op": "gelu", "impl": "compile", "shape": [2**20], "dtype": "float32"},
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
    "gelu": {
        "check_shapes": [(0,), (1,), (1023,), (4097,), (65537,), (3, 37, 129)],
        "check_dtypes": ["float32", "bfloat16"],
        "compile_check_shapes": [(4097,)],
        "compile_check_dtypes": ["float32"],
        "bench_shapes": [(2**16,), (2**18,), (2**20,), (2**22,)],
        "bench_dtypes": ["float32", "bfloat16"],
        "erf_shape": (2**20,),
    },
    "softmax": {
        "check_shapes": [(0, 7), (5, 0), (), (1, 1), (1000,), (37, 129), (4, 5, 300), (2, 5000), (3, 40000)],
        "check_dtypes": ["float32", "bfloat16"],
        "compile_check_shapes": [(37, 129)],
        "compile_check_dtypes": ["float32"],
        "bench_numel": 2**20,
        "bench_widths": [128, 1024, 8192, 65536],
        "bench_dtypes": ["float32"],
    },
    "profile": {"warmup": 2, "iters": 3, "cases": None, "impls": [("gelu", "naive", (2**20,))]},
    "runahead": {"steps": 10, "layers": 4},
    "inspect": [("gelu", "triton"), ("softmax", "triton"), ("gelu", "cuda"), ("softmax", "cuda")],
}

SOFTMAX_WIDTHS_GPU = [128, 1024, 4096, 8192, 16384, 32768, 65536, 262144]

GPU = {
    "timing": {"warmup_ms": 100.0, "rep_ms": 200.0, "min_reps": 10, "max_reps": 1000},
    "ceilings_refresh": True,
    "pitfalls": [
        {"kind": "matmul", "n": 4096, "dtype": "bfloat16"},
        {"kind": "op", "op": "gelu", "impl": "naive", "shape": [2**24], "dtype": "float32"},
        {"kind": "op", "op": "gelu", "impl": "compile", "shape": [2**24], "dtype": "float32"},
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
    "gelu": {
        "check_shapes": None,  # the op's own check shapes
        "check_dtypes": ["float32", "float16", "bfloat16"],
        "compile_check_shapes": [(3, 37, 129)],  # one compile per case: few cases
        "compile_check_dtypes": ["float32", "bfloat16"],
        "bench_shapes": [(2**24,), (2**26,), (2**28,)],
        "bench_dtypes": ["float32", "bfloat16"],
        "erf_shape": (2**26,),
    },
    "softmax": {
        "check_shapes": None,
        "check_dtypes": ["float32", "float16", "bfloat16"],
        "compile_check_shapes": [(3, 40000)],
        "compile_check_dtypes": ["float32", "bfloat16"],
        "bench_numel": 2**26,
        "bench_widths": SOFTMAX_WIDTHS_GPU,
        "bench_dtypes": ["float32", "bfloat16"],
    },
    "profile": {"warmup": 3, "iters": 5, "cases": None, "impls": [("gelu", "naive", (2**24,))]},
    "runahead": {"steps": 20, "layers": 4},
    "inspect": [("gelu", "triton"), ("softmax", "triton"), ("gelu", "cuda"), ("softmax", "cuda")],
}

BUDGETS = {"quick": QUICK, "cpu": CPU, "gpu": GPU}


def mode_for(device: str, quick: bool) -> str:
    if quick:
        return "quick"
    return "gpu" if device.startswith("cuda") else "cpu"
