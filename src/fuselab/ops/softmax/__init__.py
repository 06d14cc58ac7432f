"""Softmax over the last dimension: naive PyTorch, torch.softmax, torch.compile, Triton and CUDA C++.

Importing registers every implementation on SOFTMAX; it needs no GPU, and Triton only for the Triton impl (reported
as unavailable without it). The CUDA C++ extension is built on first use.
"""

import importlib.util

from fuselab.ops.backends import triton_unavailable
from fuselab.ops.softmax import naive  # noqa: F401  (registration by import, in the order tools list them)
from fuselab.ops.softmax.spec import SOFTMAX

if importlib.util.find_spec("triton") is not None:
    from fuselab.ops.softmax import triton  # noqa: F401
else:

    @SOFTMAX.impl("triton", requires=triton_unavailable, backward=True)
    def softmax_triton(x):  # registered anyway, so tools can say why it cannot run
        """Triton kernels (Triton is not installed)."""
        raise RuntimeError(triton_unavailable("cuda"))


from fuselab.ops.softmax import cuda  # noqa: F401
from fuselab.ops.softmax.module import Softmax

__all__ = ["SOFTMAX", "Softmax"]
