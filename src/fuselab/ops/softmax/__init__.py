"""Softmax over the last dimension: the spec and its impls naive, torch, compile, triton, cuda,
triton-elementwise (one element per thread, reduced through global memory: the lecture's counter-example), and
liger (Liger-Kernel's, where installed: the rival the draws time ours against).

Importing registers them all; it needs no GPU or nvcc (the CUDA extension is built on first use), and Triton only
for the triton impl, which is otherwise registered as unavailable, saying why.
"""

import importlib.util

from fuselab.ops.backends import triton_unavailable
from fuselab.ops.softmax import naive  # noqa: F401  (registration by import, in the order tools list impls)
from fuselab.ops.softmax.spec import SOFTMAX

if importlib.util.find_spec("triton") is not None:
    from fuselab.ops.softmax import triton  # noqa: F401
else:

    @SOFTMAX.impl("triton", requires=triton_unavailable, backward=True)
    def softmax_triton(x):
        """Triton kernels (Triton is not installed)."""
        raise RuntimeError(f"softmax triton: {triton_unavailable('cuda')}")


from fuselab.ops.softmax import cuda  # noqa: F401

if importlib.util.find_spec("triton") is not None:
    from fuselab.ops.softmax import triton_elementwise  # noqa: F401
else:

    @SOFTMAX.impl("triton-elementwise", requires=triton_unavailable)
    def softmax_triton_elementwise(x):
        """Triton, one element per thread (Triton is not installed)."""
        raise RuntimeError(f"softmax triton-elementwise: {triton_unavailable('cuda')}")


from fuselab.ops.softmax import liger  # noqa: F401
from fuselab.ops.softmax.module import Softmax

__all__ = ["SOFTMAX", "Softmax"]
