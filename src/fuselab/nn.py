"""Drop-in modules backed by fuselab's kernels: `fuselab.nn.GELU(impl="triton")`, `fuselab.nn.Softmax(...)`."""

from fuselab.ops.gelu.module import GELU
from fuselab.ops.softmax.module import Softmax

__all__ = ["GELU", "Softmax"]
