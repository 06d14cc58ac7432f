"""`Softmax` as a torch.nn.Module over any registered implementation: a drop-in for torch.nn.Softmax."""

from __future__ import annotations

import warnings

import torch

from fuselab.ops.softmax.spec import SOFTMAX


class Softmax(torch.nn.Module):
    """Softmax along `dim`, torch.nn.Softmax's signature (dim=None picks the axis as torch does: 0 for inputs of 0, 1
    or 3 dimensions, else 1; warned once, when the module is built, so that forward compiles without a graph break),
    computed by implementation `impl` (keyword only; a name registered on SOFTMAX).

    impl: "auto" (default: the fused Triton kernel on a GPU, torch.softmax on the CPU, where Triton only interprets;
    `Op.native_impl`), "triton", "cuda", "torch", "naive" or "compile" (naive under torch.compile). The impls reduce
    over the last dimension; another `dim` is moved last and back (a strided view: the impls take it as it is).
    Input any shape; output the same shape and dtype. Dtypes: float32, float16, bfloat16; impl="torch" also float64.
    """

    def __init__(self, dim: int | None = None, *, impl: str = "auto") -> None:
        super().__init__()
        if dim is not None and (isinstance(dim, bool) or not isinstance(dim, int)):
            raise TypeError(f"Softmax: dim must be an int or None, got {dim!r} (the impl is a keyword: impl=...)")
        if dim is None:  # torch.nn.Softmax's legacy choice; torch warns on every call, this module once
            warnings.warn(
                "Softmax with dim=None picks the dimension as torch.nn.Softmax does (deprecated there); pass dim",
                UserWarning,
                stacklevel=2,
            )
        self.dim = dim
        self.impl = impl
        self._drop_in = SOFTMAX.drop_in(impl)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        fn = self._drop_in.pick(x)
        dim = self.dim
        if dim is None:
            dim = 0 if x.dim() in (0, 1, 3) else 1
        if x.dim() == 0:
            return fn(x)
        dim = dim % x.dim() if -x.dim() <= dim < x.dim() else _bad_dim(dim, x)
        if dim == x.dim() - 1:
            return fn(x)
        return fn(x.movedim(dim, -1)).movedim(-1, dim)

    def extra_repr(self) -> str:
        chosen = f" ({self._drop_in.describe()})" if self.impl == "auto" else ""
        return f"dim={self.dim}, impl={self.impl!r}{chosen}"

    @classmethod
    def drop_in_pair(cls, impl: str) -> tuple[torch.nn.Module, torch.nn.Module]:
        """(this module running `impl`, torch.nn.Softmax), both over the last dimension: what the contract test
        (tests/ops/test_contract.py) puts in the same model and compares."""
        return cls(dim=-1, impl=impl), torch.nn.Softmax(dim=-1)


def _bad_dim(dim: int, x: torch.Tensor) -> int:
    raise IndexError(f"Softmax: dim {dim} is out of range for a tensor of {x.dim()} dimension(s)")


__all__ = ["Softmax"]  # what fuselab.nn exposes of this op
