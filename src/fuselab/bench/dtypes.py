"""The one dtype codec. A dtype has three forms: the torch.dtype, its name in logs and result rows ("float32"), and
its short name in tables and on the command line ("fp32"); every layer converts between them here."""

from __future__ import annotations

import torch

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
}
SHORT_NAMES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "float64": "fp64"}
_BY_SHORT_NAME = {short: name for name, short in SHORT_NAMES.items()}


def parse_dtype(name: str | torch.dtype) -> torch.dtype:
    """ "fp32", "float32", "torch.float32" (any case) or a torch.dtype -> torch.float32; ValueError naming the
    accepted names otherwise."""
    if isinstance(name, torch.dtype):
        key = dtype_name(name)
    else:
        lowered = str(name).lower().removeprefix("torch.")
        key = _BY_SHORT_NAME.get(lowered, lowered)
    if key not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}; accepted: {', '.join([*DTYPES, *_BY_SHORT_NAME])}")
    return DTYPES[key]


def dtype_name(dtype: torch.dtype | str) -> str:
    """torch.float32 (or "fp32") -> "float32": the name logs and result rows carry."""
    if isinstance(dtype, torch.dtype):
        return str(dtype).removeprefix("torch.")
    return dtype_name(parse_dtype(dtype))


def short_name(dtype: object) -> str:
    """torch.float32 or "float32" -> "fp32" (tables stay narrow); None -> ""; a name this codec does not know, as it
    is."""
    if dtype is None:
        return ""
    name = dtype_name(dtype) if isinstance(dtype, torch.dtype) else str(dtype)
    return SHORT_NAMES.get(name, name)
