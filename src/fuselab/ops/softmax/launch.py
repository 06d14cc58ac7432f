"""Launch the Triton softmax kernels: a plan (plans.py) -> the kernel's launcher, by name (`FORWARD`, `BACKWARD`).

Each launcher takes (rows, width) tensors with unit column stride and any row strides. What the kernels are told
about memory: `alignment` (width and row strides divided by the most elements up to a 16-byte vector they are all
multiples of, multiplied back as a constexpr, so the compiler sees the divisibility), and `edges` (rows that are not
a whole number of 16-byte vectors are read as an aligned bulk and a few edge elements apart, where the buffers are
16-byte aligned and the row strides agree modulo a vector).

Launch sites follow the op factory (fuselab.ops.library): every kernel is launched as ``wrap_triton(kernel)[grid]``
(the kernel named plainly, so torch finds the kernels of the triton_op), on the tensor's GPU (`on_device`). Under
torch.compile the launchers run on fake tensors with symbolic sizes: the width is forced to an int (it picks the
plan), and alignment is read from the storage offset where there is no address (`aligned16`).
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable

import torch
import triton

from fuselab.ops import launcher, tuning
from fuselab.ops.backends import triton_unavailable
from fuselab.ops.library import on_device, wrap_triton
from fuselab.ops.softmax import plans
from fuselab.ops.softmax.kernels_rows import (
    _backward_rows_kernel,
    _backward_single_kernel,
    _forward_rows_ahead_kernel,
    _forward_rows_kernel,
    _forward_single_kernel,
)
from fuselab.ops.softmax.kernels_wide import (
    _backward_looped_kernel,
    _backward_partial_dot_kernel,
    _backward_split_kernel,
    _forward_looped_kernel,
    _forward_split_kernel,
    _forward_split_pairs_kernel,
)
from fuselab.ops.softmax.plans import Plan

INTERPRETER_PROGRAMS = 3  # persistent grids under the interpreter (and its "SM count"): a few programs
SPLIT_PARTS = 128  # partial sums of a split backward row added at a time


def sm_count(device_index: int | None) -> int:
    """SMs of CUDA device `device_index`, or of the GPU `tuning.planning_as` names."""
    model = tuning.planning_for()
    return model.sms if model is not None else _sm_count(device_index)


@functools.cache
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def gpu_sms(device: torch.device) -> int | None:
    """SMs of the GPU launches on `device` are planned for (`sm_count`), None on the CPU."""
    return sm_count(device.index) if device.type == "cuda" or tuning.planning_for() is not None else None


def interpreted() -> bool:
    """Whether Triton runs kernels under its CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def inline_ptx() -> bool:
    """Whether kernels may use inline PTX: compiled for a GPU (not run by the interpreter, or planned as a GPU)."""
    return not interpreted() or tuning.planning_for() is not None


def can_wait(device: torch.device) -> bool:
    """Whether programs can wait for each other: on a GPU, not under the interpreter (programs one by one), or
    planned as a GPU (`tuning.planning_as`)."""
    return (device.type == "cuda" and not interpreted()) or tuning.planning_for() is not None


@functools.lru_cache(maxsize=64)
def params(device: torch.device) -> dict:
    """The plan rules' parameters for `device` (its GPU's plan table, if tuned; under `tuning.planning_as`, that
    GPU's); read once per device."""
    model = tuning.planning_for()
    if model is not None:
        return plans.rule_params(model.key)
    on_gpu = device.type == "cuda" and torch.cuda.is_available()
    return plans.rule_params(tuning.reading_key(plans.FOLDER, device.index) if on_gpu else None)


@functools.lru_cache(maxsize=4096)  # cached by (width, dtype, device, reads)
def forward_plan(width: int, dtype: torch.dtype, device: torch.device, reads: str = "vectors") -> Plan:
    """The forward plan for rows of `width` read as `reads` (plans.READS) on `device` (plans.choose_forward)."""
    sms = sm_count(device.index) if can_wait(device) else None
    return plans.choose_forward(width, dtype.itemsize, dtype == torch.bfloat16, sms, params(device), reads)


@functools.lru_cache(maxsize=4096)
def backward_plan(width: int, dtype: torch.dtype, device: torch.device | None = None, reads: str = "vectors") -> Plan:
    """The backward plan for rows of `width` read as `reads` (plans.choose_backward)."""
    return plans.choose_backward(width, dtype.itemsize, params(device or torch.device("cpu")), reads)


for _cached in (params, forward_plan, backward_plan):  # made from the plan table: made again when one is written
    tuning.on_table_written(_cached.cache_clear)


def vector(t: torch.Tensor) -> int:
    """Elements in a 16-byte vector of t's dtype."""
    return 16 // t.element_size()


def alignment(*tensors: torch.Tensor) -> int:
    """The most elements, up to one 16-byte vector, that the width and every row stride of `tensors` are multiples of.

    Triton proves a load 16-byte aligned only from integers it sees divisible by 16: a bf16 row of 17000 columns
    (34000 bytes, aligned) would be read 2 bytes at a time. Kernels take the width and strides divided by this and
    multiply back by it as a constexpr, which the compiler can see. 1 from 2^31 columns: kernels scale the width back
    in int32.
    """
    width = tensors[0].shape[1]
    if width >= 2**31:
        return 1
    return math.gcd(vector(tensors[0]), int(width), *(int(t.stride(0)) for t in tensors))


def aligned16(t: torch.Tensor) -> bool:
    """Whether t's first element is 16-byte aligned; while torch.compile traces (a fake tensor, no address to read),
    whether its storage offset is a whole number of 16-byte vectors into an allocation taken to be aligned."""
    if type(t) is torch.Tensor:
        return t.data_ptr() % 16 == 0
    return int(t.storage_offset()) * t.element_size() % 16 == 0


def edges(*tensors: torch.Tensor, min_bytes: int = 0) -> bool:
    """Whether rows are read as an aligned bulk of 16-byte vectors plus edges: rows are not whole vectors (else plain
    loads are vectors already), at least `min_bytes` long and never shorter than a vector (the kernels' edges assume a
    row reaches its first 16-byte boundary), every buffer 16-byte aligned, and every row stride equal to the first
    modulo a vector (so one shift aligns the row in all of them)."""
    v = vector(tensors[0])
    width = int(tensors[0].shape[1])
    if alignment(*tensors) == v or width < v or width * tensors[0].element_size() < min_bytes or width >= 2**31:
        return False
    s = int(tensors[0].stride(0)) % v
    return all(aligned16(t) and int(t.stride(0)) % v == s for t in tensors)


def reads(*tensors: torch.Tensor, min_bytes: int) -> str:
    """How the rows kernels read rows of (rows, width) `tensors` (plans.READS): "vectors" (width and row strides
    whole 16-byte vectors), "edges" (an aligned bulk and edges, `edges`), else "scalars" (element by element)."""
    if alignment(*tensors) == vector(tensors[0]):
        return "vectors"
    return "edges" if edges(*tensors, min_bytes=min_bytes) else "scalars"


def in_pairs(*tensors: torch.Tensor) -> bool:
    """Whether (rows, width) bf16 tensors are read as int32 pairs of whole 16-byte vectors: width and row strides
    multiples of 8, 16-byte aligned buffers (other bf16 rows go one by one, with edges)."""
    return all(t.dtype == torch.bfloat16 and aligned16(t) for t in tensors) and alignment(*tensors) == 8


def _ready(x: torch.Tensor) -> None:
    if not x.is_cuda and (reason := triton_unavailable("cpu")):
        raise ValueError(f"softmax triton: input is on cpu; move it with .to('cuda'). {reason}")


# ---------------------------------------------------------------------------------------------- forward
#
# Each launcher takes what fixes a launch (the tensors' width, row strides, dtype, device and 16-byte alignment, and
# the plan) and returns the launch itself, a function of the tensors that reads only their rows: in eager mode
# `launch_forward` keeps it per layout (`_READY`), so a call repeats none of the choosing.

Launch = Callable[..., None]


def rows_per_program(plan: Plan, n_rows: int, sms: int | None, p: dict, read: str, align: int) -> int:
    """The rows plan's rows per program where programs can wait on a GPU (`sms`): fewer for a small tensor
    (plans.fill_rows), more for many rows read element by element (`read` "scalars") in loads of `align` elements
    (plans.grow_rows); a symbolic row count (torch.compile) keeps the plan's."""
    if sms is None or not isinstance(n_rows, int):
        return plan.rows
    rows = plans.fill_rows(plan.rows, plan.num_warps, n_rows, sms, p)
    return plans.grow_rows(rows, plan.block, plan.num_warps, align, n_rows, sms, p) if read == "scalars" else rows


def _rows(x: torch.Tensor, y: torch.Tensor, plan: Plan, p: dict) -> Launch:
    n_cols = int(x.shape[1])
    # Masks compiled out for fp32 tiles and held rows that divide the tensor (docs/ops/softmax.md: in 16 bits the
    # masked kernel measured faster otherwise).
    even_cols = (x.element_size() == 4 or plan.hold) and n_cols == plan.block
    a = alignment(x, y)
    fixed = (n_cols // a, x.stride(0) // a, y.stride(0) // a)
    sms = sm_count(x.device.index) if can_wait(x.device) else None
    read = reads(x, y, min_bytes=p["edge_min_bytes"])
    meta = {
        "BLOCK": plan.block, "HOLD": plan.hold and x.element_size() == 2, "PTX": inline_ptx(),
        "ALIGN": a, "EDGES": read == "edges", "VEC": vector(x),
        "num_warps": plan.num_warps, "maxnreg": plan.maxnreg,
    }  # fmt: skip

    def launch(x: torch.Tensor, y: torch.Tensor) -> None:
        n_rows = x.shape[0]
        rows = rows_per_program(plan, n_rows, sms, p, read, a)
        even = even_cols and n_rows % rows == 0
        wrap_triton(_forward_rows_kernel)[((n_rows + rows - 1) // rows,)](x, y, n_rows, *fixed, EVEN=even, ROWS=rows,
                                                                          **meta)  # fmt: skip

    return launch


def _rows_ahead(x: torch.Tensor, y: torch.Tensor, plan: Plan, p: dict) -> Launch:
    n_cols = int(x.shape[1])
    programs = gpu_sms(x.device) or INTERPRETER_PROGRAMS
    a = alignment(x, y)
    fixed = (n_cols // a, x.stride(0) // a, y.stride(0) // a)
    rows = plan.rows
    meta = {
        "ROWS": rows, "BLOCK": plan.block, "PTX": inline_ptx(), "ALIGN": a, "num_warps": plan.num_warps,
        "maxnreg": plan.maxnreg,
    }  # fmt: skip

    def launch(x: torch.Tensor, y: torch.Tensor) -> None:
        n_rows = x.shape[0]
        grid = (min((n_rows + rows - 1) // rows, programs),)
        wrap_triton(_forward_rows_ahead_kernel)[grid](x, y, n_rows, *fixed, **meta)

    return launch


def _split(x: torch.Tensor, y: torch.Tensor, plan: Plan, p: dict) -> Launch:
    n_cols = int(x.shape[1])
    pairs = plan.kernel == "split_pairs" and in_pairs(x, y)  # else one by one
    sms = gpu_sms(x.device)
    if pairs:  # in pairs of columns, divided by their alignment (4 pairs: whole 16-byte vectors)
        a = alignment(x, y) // 2
        kernel, fixed = _forward_split_pairs_kernel, (n_cols // 2 // a, x.stride(0) // 2 // a, y.stride(0) // 2 // a)
        edge_meta = {"ALIGN": a}
    else:
        a = alignment(x, y)
        kernel, fixed = _forward_split_kernel, (n_cols // a, x.stride(0) // a, y.stride(0) // a)
        edge_meta = {"ALIGN": a, "EDGES": edges(x, y, min_bytes=p["edge_min_bytes"]), "VEC": vector(x)}

    @functools.cache
    def spans(chunk: int) -> tuple[int, tuple, dict]:
        """(programs per row, the kernel's fixed arguments, its meta) for spans of at most `chunk` columns."""
        # multiples of 16 elements (16-byte vectors, and Triton sees the span argument divisible by 16)
        split, span, padded = plans.split_spans(n_cols // 2 if pairs else n_cols, chunk // (2 if pairs else 1), 16)
        if sms is not None and split > sms:  # all chunks of a row must fit on the GPU at once
            raise ValueError(f"softmax triton: {split} chunks of {span} per row > {sms} SMs")
        meta = {"SPLIT": split, "SPLIT_P2": triton.next_power_of_2(split), "CHUNK": padded, "PTX": inline_ptx()}
        return split, fixed if pairs else (*fixed, span), {**meta, **edge_meta, "num_warps": plan.num_warps}

    spans(plan.block)  # refuses a plan whose spans do not fit, at once

    def launch(x: torch.Tensor, y: torch.Tensor) -> None:
        # kept from call to call (no allocation, no memset: the kernel leaves its counters zeros), so a call replays
        n_rows = x.shape[0]
        fill = sms is not None and isinstance(n_rows, int)  # a symbolic row count (torch.compile) keeps the plan's
        split, args, meta = spans(plans.split_chunk(plan.block, n_rows, n_cols, sms, p) if fill else plan.block)
        stats = launcher.workspace("softmax split stats", 2 * n_rows * split, torch.float32, x.device, zeros=False)
        sync = launcher.workspace("softmax split sync", 1 + n_rows, torch.int32, x.device)
        wrap_triton(kernel)[(n_rows * split,)](x, y, stats[: n_rows * split], stats[n_rows * split :], sync, *args,
                                               **meta)  # fmt: skip

    return launch


def _looped(x: torch.Tensor, y: torch.Tensor, plan: Plan, p: dict) -> Launch:
    n_cols = int(x.shape[1])
    a = alignment(x, y)
    fixed = (n_cols // a, x.stride(0) // a, y.stride(0) // a)
    meta = {
        "BLOCK": plan.block, "PTX": inline_ptx(), "ALIGN": a, "EDGES": edges(x, y, min_bytes=p["edge_min_bytes"]),
        "VEC": vector(x), "num_warps": plan.num_warps,
    }  # fmt: skip

    def launch(x: torch.Tensor, y: torch.Tensor) -> None:
        wrap_triton(_forward_looped_kernel)[(x.shape[0],)](x, y, *fixed, **meta)

    return launch


def _single(x: torch.Tensor, y: torch.Tensor, plan: Plan, p: dict) -> Launch:
    meta = {"BLOCK": plan.block, "num_warps": plan.num_warps}

    def launch(x: torch.Tensor, y: torch.Tensor) -> None:
        n_rows = x.shape[0]
        grid = ((n_rows + plan.block - 1) // plan.block,)
        wrap_triton(_forward_single_kernel)[grid](x, y, n_rows, x.stride(0), y.stride(0), **meta)

    return launch


Launcher = Callable[..., Launch]
FORWARD: dict[str, Launcher] = {
    "rows": _rows,
    "rows_ahead": _rows_ahead,
    "split": _split,
    "split_pairs": _split,
    "looped": _looped,
    "single": _single,
}
_READY = tuning.Prepared()  # eager launches by layout (`_layout`), both directions


def _layout(kind: str, *tensors: torch.Tensor) -> tuple:
    """What fixes a launch on (rows, width) tensors: width, dtype, device, each row stride and 16-byte alignment."""
    x = tensors[0]
    return (kind, x.shape[1], x.dtype, x.get_device(), *[(t.stride(0), t.data_ptr() % 16) for t in tensors])


def launch_forward(x: torch.Tensor, y: torch.Tensor, plan: Plan | None = None, rules: dict | None = None) -> None:
    """y = softmax(x) row by row. x, y: (rows, width), unit column stride; plan: None chooses (`forward_plan`).
    rules: with a plan, the rules' parameters its launch reads (edges from edge_min_bytes, rows per program of a
    small tensor from fill_warps_per_sm); None: the device's (`params`). The tuner passes a candidate's."""
    if not x.is_cuda:
        _ready(x)
    if plan is None and type(x) is torch.Tensor and type(y) is torch.Tensor:  # eager: prepared once per layout
        launch = _READY.get(_layout("forward", x, y), lambda: _prepare_forward(x, y, None))
    else:
        launch = _prepare_forward(x, y, plan, rules)
    with on_device(x):
        launch(x, y)


def _prepare_forward(x: torch.Tensor, y: torch.Tensor, plan: Plan | None, rules: dict | None = None) -> Launch:
    p = rules if plan is not None and rules is not None else params(x.device)  # rules go with a plan given
    if plan is None:  # a symbolic width (torch.compile) is fixed here
        read = reads(x, y, min_bytes=p["edge_min_bytes"])
        plan = forward_plan(int(x.shape[1]), x.dtype, x.device, read)
    if plan.kernel not in FORWARD:
        raise ValueError(f"unknown softmax kernel {plan.kernel!r}; known: {', '.join(FORWARD)}")
    return FORWARD[plan.kernel](x, y, plan, p)


# ---------------------------------------------------------------------------------------------- backward


def _backward_rows(y: torch.Tensor, dy: torch.Tensor, dx: torch.Tensor, plan: Plan, p: dict) -> Launch:
    n_cols = int(y.shape[1])
    a = alignment(y, dy, dx)
    fixed = (n_cols // a, *(t.stride(0) // a for t in (y, dy, dx)))
    sms = sm_count(y.device.index) if can_wait(y.device) else None
    read = reads(y, dy, dx, min_bytes=p["edge_min_bytes"])
    meta = {
        "BLOCK": plan.block, "ALIGN": a, "EDGES": read == "edges",
        "VEC": vector(y), "num_warps": plan.num_warps,
    }  # fmt: skip

    def launch(y: torch.Tensor, dy: torch.Tensor, dx: torch.Tensor) -> None:
        n_rows = y.shape[0]
        rows = rows_per_program(plan, n_rows, sms, p, read, a)
        wrap_triton(_backward_rows_kernel)[((n_rows + rows - 1) // rows,)](y, dy, dx, n_rows, *fixed, ROWS=rows,
                                                                           **meta)  # fmt: skip

    return launch


def _backward_looped(y: torch.Tensor, dy: torch.Tensor, dx: torch.Tensor, plan: Plan, p: dict) -> Launch:
    """One looped program per row; where there are few rows (`plans.backward_split_block`, rows known as an int),
    each row split over programs: partial sums of y * dy, then dx, two kernels."""
    n_cols = int(y.shape[1])
    a = alignment(y, dy, dx)
    fixed = (n_cols // a, *(t.stride(0) // a for t in (y, dy, dx)))
    read = {"ALIGN": a, "EDGES": edges(y, dy, dx, min_bytes=p["edge_min_bytes"]), "VEC": vector(y)}
    meta = {"BLOCK": plan.block, **read, "num_warps": plan.num_warps}
    sms = gpu_sms(y.device) or INTERPRETER_PROGRAMS

    def launch(y: torch.Tensor, dy: torch.Tensor, dx: torch.Tensor) -> None:
        n_rows = y.shape[0]
        block = plans.backward_split_block(n_rows, n_cols, sms, p) if isinstance(n_rows, int) else None
        if block is None:
            wrap_triton(_backward_looped_kernel)[(n_rows,)](y, dy, dx, *fixed, **meta)
            return
        split = plans.ceil_div(n_cols, block)
        dots = launcher.workspace("softmax backward dots", n_rows * split, torch.float32, y.device, zeros=False)
        grid, warps = (n_rows * split,), 8 if block >= 4096 else 4
        wrap_triton(_backward_partial_dot_kernel)[grid](y, dy, dots, *fixed[:3], split, BLOCK=block, **read,
                                                        num_warps=warps)  # fmt: skip
        wrap_triton(_backward_split_kernel)[grid](y, dy, dx, dots, *fixed, split, BLOCK=block, PARTS=SPLIT_PARTS,
                                                  **read, num_warps=warps)  # fmt: skip

    return launch


def _backward_single(y: torch.Tensor, dy: torch.Tensor, dx: torch.Tensor, plan: Plan, p: dict) -> Launch:
    meta = {"BLOCK": plan.block, "num_warps": plan.num_warps}

    def launch(y: torch.Tensor, dy: torch.Tensor, dx: torch.Tensor) -> None:
        n_rows = y.shape[0]
        grid = ((n_rows + plan.block - 1) // plan.block,)
        strides = (y.stride(0), dy.stride(0), dx.stride(0))
        wrap_triton(_backward_single_kernel)[grid](y, dy, dx, n_rows, *strides, **meta)

    return launch


BACKWARD: dict[str, Launcher] = {"rows": _backward_rows, "looped": _backward_looped, "single": _backward_single}


def launch_backward(y: torch.Tensor, dy: torch.Tensor, dx: torch.Tensor, plan: Plan | None = None) -> None:
    """dx = y * (dy - sum(dy * y)) row by row. All (rows, width), unit column stride; plan: None chooses."""
    if not y.is_cuda:
        _ready(y)
    if plan is None and all(type(t) is torch.Tensor for t in (y, dy, dx)):
        launch = _READY.get(_layout("backward", y, dy, dx), lambda: _prepare_backward(y, dy, dx, None))
    else:
        launch = _prepare_backward(y, dy, dx, plan)
    with on_device(y):
        launch(y, dy, dx)


def _prepare_backward(y: torch.Tensor, dy: torch.Tensor, dx: torch.Tensor, plan: Plan | None) -> Launch:
    if plan is None:
        read = reads(y, dy, dx, min_bytes=params(y.device)["edge_min_bytes"])
        plan = backward_plan(int(y.shape[1]), y.dtype, y.device, read)
    if plan.kernel not in BACKWARD:
        raise ValueError(f"unknown softmax backward kernel {plan.kernel!r}; known: {', '.join(BACKWARD)}")
    return BACKWARD[plan.kernel](y, dy, dx, plan, params(y.device))


TRITON_KERNELS = (
    _forward_rows_kernel,
    _forward_rows_ahead_kernel,
    _forward_split_kernel,
    _forward_split_pairs_kernel,
    _forward_looped_kernel,
    _forward_single_kernel,
    _backward_rows_kernel,
    _backward_looped_kernel,
    _backward_partial_dot_kernel,
    _backward_split_kernel,
    _backward_single_kernel,
)
