"""GELU's launch rule and its parameters: BLOCK = block_bytes / itemsize elements per program, warps by element size.

Defaults hold for a GPU never tuned; `fuselab tune gelu` writes this GPU's values to plans/<device key>.json (see
fuselab.ops.tuning). The rule does not depend on the element count: the bulk is unmasked and the last block masked
whatever the count (triton_kernels.py). Measurements behind the defaults: docs/ops/gelu.md.
"""

from __future__ import annotations

from pathlib import Path

from fuselab.ops import tuning

FOLDER = Path(__file__).parent
DEFAULTS: dict[str, object] = {
    "block_bytes": 4096,  # input bytes per program: one 16-byte vector per thread in fp32 at 8 warps
    "warps": {"4": 8, "2": 4},  # by element size
}


def gelu_config(itemsize: int, key: str | None, table: dict | None = None) -> tuple[int, int]:
    """(BLOCK elements per program, num_warps) for elements of `itemsize` bytes on GPU `key` (None: defaults).
    table: parameters to use instead of the GPU's (the tuner's candidates)."""
    p = table if table is not None else tuning.params(DEFAULTS, FOLDER, key)
    block = max(16, int(p["block_bytes"]) // itemsize)
    return block, int(p["warps"][str(itemsize)])
