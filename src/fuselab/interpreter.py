"""Triton's interpreter (TRITON_INTERPRET=1, how Triton kernels run on a machine without a GPU), made ready to run
the kernels as they are written for the GPU.

Triton 3.6 turns a runtime loop bound into a Python int with `int(array)`, which numpy >= 2.4 refuses for the
one-element arrays the interpreter holds (triton-lang/triton#9171): `for i in range(lo, hi, STEP)` with a runtime
`lo` fails with "only 0-dimensional arrays can be converted to Python scalars". `prepare` applies the upstream fix
(squeeze first), so kernels need no loop of their own for the interpreter.
"""

from __future__ import annotations

import warnings


def prepare() -> None:
    """Quiet the interpreter's numpy overflow warnings (fp32 overflows to inf as the kernels intend) and give its
    tensors an `__index__` that works with any numpy. Idempotent; a no-op without Triton."""
    warnings.filterwarnings("ignore", category=RuntimeWarning, module="triton.runtime.interpreter")
    try:
        from triton.runtime import interpreter
    except ImportError:
        return
    original = interpreter._patch_lang_tensor
    if getattr(original, "fuselab_index", False):
        return

    def patch_lang_tensor(tensor: type, scope: object) -> None:
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))

    patch_lang_tensor.fuselab_index = True
    interpreter._patch_lang_tensor = patch_lang_tensor
