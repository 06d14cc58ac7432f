"""Ops, one folder each. Importing this package discovers every folder under ops/ and so registers each op and
its implementations (nothing here names an op: a new folder is found by every tool)."""

from fuselab.bench.shapes import format_shape
from fuselab.ops.registry import Defaults, Impl, Op, Option, all_ops, discover, get_op, parse_shape, register_op

discover(__name__)

__all__ = ["Defaults", "Impl", "Op", "Option", "all_ops", "format_shape", "get_op", "parse_shape", "register_op"]
