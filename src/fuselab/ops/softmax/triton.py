"""Softmax over the last dimension in Triton, registered as impl "triton" and, through the op factory
(fuselab.ops.library), as triton ops fuselab::softmax_triton / fuselab::softmax_triton_backward.

The input is seen as (rows, width) with unit stride along the width (`_shared.as_rows`); kernels take row strides,
so sliced rows need no copy. The pieces: plans.py (which kernel, tile and warps, by rules whose parameters a GPU's
plan table may tune), kernels_rows.py (rows held whole in registers), kernels_wide.py (rows split over programs, or
looped), launch.py (a name -> launcher table; alignment and the aligned-bulk + edges reading of misaligned rows).
docs/ops/softmax.md explains the choices and the measurements behind them.
"""

from __future__ import annotations

from fuselab.ops.backends import triton_unavailable
from fuselab.ops.softmax import _shared
from fuselab.ops.softmax.launch import (  # noqa: F401  (the module's public face; tests and the tuner use these)
    BACKWARD,
    FORWARD,
    INTERPRETER_PROGRAMS,
    SPLIT_PARTS,
    TRITON_KERNELS,
    aligned16,
    alignment,
    backward_plan,
    can_wait,
    edges,
    forward_plan,
    in_pairs,
    interpreted,
    launch_backward,
    launch_forward,
    sm_count,
)
from fuselab.ops.softmax.plans import DEFAULTS, Plan  # noqa: F401
from fuselab.ops.softmax.spec import SOFTMAX

ROW_MAX = DEFAULTS["row_max"]
BACKWARD_ROW_MAX = DEFAULTS["backward_row_max"]
TILE_BYTES = DEFAULTS["tile_bytes"]  # by element size
LOOP_BLOCK = DEFAULTS["loop"][0]

DEVICES = ("cpu", "cuda")  # the CPU under TRITON_INTERPRET=1 only (slow: for tests)

_forward, _backward = _shared.row_functions(launch_forward, launch_backward)
# replay: forward allocates y with empty_like and writes it with its kernels alone (the split plan's workspace keeps
# its calls from being replayed)
softmax_triton = _shared.FAMILY.define("softmax_triton", _forward, _backward, DEVICES, kind="triton", replay=True)
SOFTMAX.impl(
    "triton",
    devices=DEVICES,
    requires=triton_unavailable,
    backward=True,
    triton_kernels=lambda: TRITON_KERNELS,
    doc="Triton, chosen by width: rows whole in registers (several short ones per program), a wide row split over "
    "programs that meet through global memory (bf16 held in pairs), or a looped online softmax; misaligned rows read "
    "as an aligned bulk of 16-byte vectors and edges. fp32 math, 64-bit row offsets.",
)(softmax_triton)
