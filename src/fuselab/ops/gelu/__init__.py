"""GELU: the spec (reference, inputs, cost, tolerances) and its impls naive, torch, compile, triton, cuda.

Importing registers them all; it needs no GPU, Triton or nvcc (each impl says why it is unavailable).
"""

# Registration order is the order tools list the impls in.
# isort: off
from fuselab.ops.gelu import naive  # noqa: F401
from fuselab.ops.gelu import triton  # noqa: F401
from fuselab.ops.gelu import cuda  # noqa: F401

# isort: on
from fuselab.ops.gelu.spec import GELU

__all__ = ["GELU"]
