"""Ops, one folder each. Importing this package registers every built-in op and its implementations."""

from fuselab.ops import attention, gelu, softmax  # noqa: F401  (registration by import)
from fuselab.ops.registry import Impl, Op, all_ops, format_shape, get_op, parse_shape, register_op

__all__ = ["Impl", "Op", "all_ops", "format_shape", "get_op", "parse_shape", "register_op"]
