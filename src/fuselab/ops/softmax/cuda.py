"""Softmax in CUDA C++: kernels and launchers in softmax.cu, torch binding in softmax_binding.cpp, built on first use.

Registered as impl "cuda" and, through the op factory (fuselab.ops.library), as ops fuselab::softmax_cuda /
fuselab::softmax_cuda_backward: schemas and fakes in Python, CUDA and AutogradCUDA kernels registered from C++
(TORCH_LIBRARY_IMPL in softmax_binding.cpp) when the extension loads. In eager mode a call goes to the binding's C++
entry (`fast`) first.

The kernels (short rows staged through shared memory in 16-byte packs; a warp or fewer threads per short row; a
block per span of a wider row, the spans of one row meeting through a scratch buffer the binding keeps per stream; a
looped online softmax past that; see softmax.cu) need no torch headers, so
`nvcc -arch=sm_90 -c softmax.cu` checks them anywhere. The extension is built once per machine and cached in
~/.cache/fuselab/ext/fuselab_softmax (FUSELAB_EXT_DIR overrides); the first call takes a minute or so.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from types import ModuleType

import torch

from fuselab.ops import tuning
from fuselab.ops.backends import cuda_unavailable, load_cuda_extension
from fuselab.ops.softmax import _shared, plans
from fuselab.ops.softmax.spec import SOFTMAX

CU_FILE: Path = Path(__file__).with_name("softmax.cu")
BINDING_FILE: Path = Path(__file__).with_name("softmax_binding.cpp")
_EXTENSION: list[ModuleType] = []


SPAN_RULES = (
    "threads",
    "hold",
    "backward_hold",
    "min_span_bytes",
    "split_row_bytes",
    "blocks_per_sm",
    "scalar_warp_width_fp32",
    "scalar_warp_width_16bit",
    "staged_row_bytes_fp32",
    "staged_row_bytes_16bit",
    "staged_packed_row_bytes",
    "staged_tile_bytes",
    "staged_blocks_per_sm",
    "edge_warp_row_bytes",
    "single_column_elementwise",
    "one_wave",
    "staged_lane_columns",
)


# What the kernels are compiled for (softmax_plan.h's valid_rules, which the binding applies too): (least, most) per
# rule, None where unbounded; `threads` a power of 2.
SPAN_LIMITS: dict[str, tuple[int, int | None]] = {
    "threads": (128, 1024),
    "hold": (1, 32),
    "backward_hold": (1, 32),
    "min_span_bytes": (16, None),
    "split_row_bytes": (1, None),
    "blocks_per_sm": (1, None),
    "scalar_warp_width_fp32": (1, 1024),
    "scalar_warp_width_16bit": (1, 1024),
    "staged_row_bytes_fp32": (0, 2048),
    "staged_row_bytes_16bit": (0, 2048),
    "staged_packed_row_bytes": (0, 2048),
    "staged_tile_bytes": (256, 16384),
    "staged_blocks_per_sm": (1, None),
    "edge_warp_row_bytes": (0, 4096),
    "single_column_elementwise": (0, 1),
    "one_wave": (0, 1),
    "staged_lane_columns": (0, 16),
}


def refusal(rules: Mapping[str, int]) -> str | None:
    """Why the kernels cannot run under span rules `rules` (every name of SPAN_RULES), or None where they can."""
    wrong = [
        f"{name} {rules[name]} ({least}..{most if most is not None else ''})"
        for name, (least, most) in SPAN_LIMITS.items()
        if not least <= rules[name] <= (most if most is not None else rules[name])
    ]
    threads = rules["threads"]
    if threads & (threads - 1) and not wrong:
        wrong.append(f"threads {threads} (a power of 2)")
    return "softmax cuda: span rules beyond what the kernels are compiled for: " + ", ".join(wrong) if wrong else None


def extension() -> ModuleType:
    """The built extension: forward(x, y) and backward(y, dy, dx) on (rows, width) CUDA tensors, softmax(x) and
    softmax_backward(y, dy) on any shape. Loading it registers the CUDA kernels of fuselab::softmax_cuda and
    fuselab::softmax_cuda_backward, and sets every GPU's span rules from its plan table (`configure`)."""
    if not _EXTENSION:
        ext = load_cuda_extension("fuselab_softmax", (str(BINDING_FILE), str(CU_FILE)))
        for index in range(torch.cuda.device_count()):
            configure(index, span_rules(index), ext)
        _EXTENSION.append(ext)
    return _EXTENSION[0]


def span_rules(index: int) -> dict[str, int]:
    """The span rules of CUDA device `index`: plans.DEFAULTS["cuda_spans"], or its plan table's (plans/<key>.json,
    `tuning.reading_key`)."""
    return dict(plans.rule_params(tuning.reading_key(plans.FOLDER, index))["cuda_spans"])


def configure(index: int, rules: Mapping[str, int], ext: ModuleType | None = None) -> None:
    """Set the span rules the launchers apply on CUDA device `index` (every name of SPAN_RULES; values beyond what
    the kernels are compiled for are a ValueError saying which, and leave the rules as they were). Explorations call
    it to try other rules without a rebuild; calls made before keep the plans they launched."""
    missing = [name for name in SPAN_RULES if name not in rules]
    unknown = sorted(set(rules) - set(SPAN_RULES))
    if missing or unknown:
        raise ValueError(f"softmax cuda span rules: missing {missing}, unknown {unknown}; give {', '.join(SPAN_RULES)}")
    refused = refusal(rules)
    if refused:
        raise ValueError(refused)
    if not (ext or extension()).configure(index, {name: int(rules[name]) for name in SPAN_RULES}):
        raise ValueError(f"softmax cuda: the binding refused span rules {dict(rules)} (softmax_plan.h's valid_rules)")


@tuning.on_table_written
def _configure_again() -> None:
    """A written plan table's span rules, handed to the loaded extension on every GPU (a later load reads them)."""
    for index in range(torch.cuda.device_count()) if _EXTENSION else ():
        configure(index, span_rules(index), _EXTENSION[0])


def launch_forward(x: torch.Tensor, y: torch.Tensor) -> None:
    extension().forward(x, y)


def launch_backward(y: torch.Tensor, dy: torch.Tensor, dx: torch.Tensor) -> None:
    extension().backward(y, dy, dx)


DEVICES = ("cuda",)


def _forward(x: torch.Tensor) -> torch.Tensor:
    """y = softmax(x) over the last dimension, contiguous: one call into the binding (rows and output made in C++)."""
    return (_EXTENSION[0] if _EXTENSION else extension()).softmax(x)


def _backward(y: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    """dx = y * (dy - sum(dy * y)) over the last dimension, contiguous."""
    return (_EXTENSION[0] if _EXTENSION else extension()).softmax_backward(y, dy)


def _forward_with_grad(x: torch.Tensor) -> torch.Tensor:
    """softmax(x) with its backward attached in C++ (the extension's torch::autograd::Function)."""
    return (_EXTENSION[0] if _EXTENSION else extension()).softmax_with_grad(x)


softmax_cuda = _shared.FAMILY.define(
    "softmax_cuda", _forward, _backward, DEVICES, kind="cuda", autograd=_forward_with_grad,
    fast=lambda: extension().fast,
)  # fmt: skip
SOFTMAX.impl(
    "cuda",
    devices=DEVICES,
    requires=cuda_unavailable,
    backward=True,
    cuda_source=CU_FILE,
    doc="CUDA C++: a warp (or fewer threads) per short row, a block per span of a wider row held in registers (few "
    "or wide rows cut into spans whose blocks meet), or a looped online softmax; 16-byte accesses between a row's "
    "edges, fp32 math, 64-bit indices.",
)(softmax_cuda)
