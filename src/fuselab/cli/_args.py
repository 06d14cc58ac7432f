"""The one argument parser of every command that takes an op: OP, --impl, --dtype, --shape, --opt, --device,
--nargs, and the checks of output paths. Values are parsed once, here, into their real types (torch.dtype, a shape
tuple, a checked device string, typed option values); commands never parse them again.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import tempfile
from pathlib import Path

import torch

from fuselab.bench.dtypes import DTYPES, parse_dtype
from fuselab.bench.record import CONTIGUOUS
from fuselab.evaluate.selection import Selection
from fuselab.ops.registry import Op, Shape, all_ops, get_op, parse_shape
from fuselab.ops.user import user_op

DEVICE_TYPES = ("cpu", "cuda")


# ------------------------------------------------------------------------------------------ value types


def dtype_arg(text: str) -> torch.dtype:
    """argparse type: 'fp32' / 'float32' / 'torch.float32' -> torch.float32."""
    try:
        return parse_dtype(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _shape(text: str, *, allow_empty: bool) -> Shape:
    try:
        shape = parse_shape(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if not allow_empty and 0 in shape:
        raise argparse.ArgumentTypeError(
            f"bad shape {text!r}: it has no elements to time; every dimension must be >= 1"
        )
    return shape


def shape_arg(text: str) -> Shape:
    """argparse type for commands that time or profile: '2^24' -> (16777216,); a shape with no elements is refused."""
    return _shape(text, allow_empty=False)


def check_shape_arg(text: str) -> Shape:
    """argparse type for `check`: as shape_arg, but an empty shape ('0', '5x0') is a case worth checking."""
    return _shape(text, allow_empty=True)


def positive(kind: type) -> callable:
    """argparse type: a number of `kind` (int or float) that is > 0."""

    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a {kind.__name__}, got {text!r}") from None
        if not value > 0:
            raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
        return value

    parse.__name__ = f"positive {kind.__name__}"
    return parse


def non_negative(kind: type) -> callable:
    """argparse type: a number of `kind` (int or float) that is >= 0."""

    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a {kind.__name__}, got {text!r}") from None
        if not value >= 0:
            raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
        return value

    parse.__name__ = f"non-negative {kind.__name__}"
    return parse


def percent(text: str) -> float:
    """argparse type: a percentage >= 0, with or without its sign ('5', '5%', '2.5 %') -> 5.0 (`non_negative`)."""
    return non_negative(float)(text.strip().removesuffix("%").strip())


def device_arg(text: str) -> str:
    """argparse type: 'cpu', 'cuda' or 'cuda:N', checked against this machine (a GPU that is not here is an error)."""
    try:
        device = torch.device(text.strip())
    except RuntimeError:
        device = None
    if device is None or device.type not in DEVICE_TYPES:
        raise argparse.ArgumentTypeError(f"unknown device {text!r}; accepted: cpu, cuda, cuda:N")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise argparse.ArgumentTypeError(f"{text}: no CUDA GPU in this process; use --device cpu")
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            raise argparse.ArgumentTypeError(
                f"{text}: no such GPU; this machine has {count} (cuda:0 to cuda:{count - 1})"
            )
    return str(device)


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def split(values: list[str] | None) -> list[str] | None:
    """['a,b', 'c'] -> ['a', 'b', 'c']; None or nothing given -> None; given but naming nothing (',') -> ValueError."""
    if not values:
        return None
    names = [v.strip() for value in values for v in value.split(",") if v.strip()]
    if not names:
        raise ValueError(f"{', '.join(map(repr, values))} names nothing; give names separated by commas")
    return names


# ------------------------------------------------------------------------------------------ arguments


def add_op_arguments(p: argparse.ArgumentParser, *, several: bool = True, check: bool = False) -> None:
    """OP, --impl, --dtype, --shape, --opt, --nargs, --device.

    several: --dtype and --shape may repeat (check, bench); else one each (profile, inspect).
    check: shapes with no elements are accepted (they are edge cases worth checking).
    """
    shape_type = check_shape_arg if check else shape_arg
    p.add_argument("op", help=f"{op_names()} or a function as MODULE:FUNCTION / FILE.py:FUNCTION")
    add_impl_argument(p)
    if several:
        p.add_argument("--dtype", action="append", type=dtype_arg, help="fp32, fp16, bf16 (float32, ...), repeated")
        p.add_argument("--shape", action="append", type=shape_type, help="shape(s) like 2^24 or 4096x1024, repeated")
    else:
        p.add_argument("--dtype", type=dtype_arg, default=torch.float32, help="fp32, fp16, bf16 (default fp32)")
        p.add_argument("--shape", type=shape_type, help="shape like 2^24 or 4096x1024 (default: the op's first)")
    add_opt_argument(p)
    p.add_argument("--nargs", type=positive(int), default=1, help="for MODULE:FUNCTION: how many tensors it takes")
    add_device_argument(p)


def op_names(tuned: bool = False) -> str:
    """'an op (attention, gelu, softmax; `fuselab list`)': the registered ops (tuned: those with a tuner) for --help."""
    names = ", ".join(op.name for op in all_ops() if op.tuner or not tuned)
    return f"an op{' with a tuner' if tuned else ''} ({names}; `fuselab list`)"


def add_impl_argument(p: argparse.ArgumentParser, default: str | None = None) -> None:
    p.add_argument(  # no argparse default: "append" would add to it; commands fall back to `default` themselves
        "--impl",
        action="append",
        help=f"implementation(s), comma-separated or repeated (default: {default or 'all'})",
    )


def add_opt_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--opt", action="append", default=[], metavar="KEY=VALUE", help="op option, e.g. approximate=none")


def add_device_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", type=device_arg, default=None, help="cpu, cuda or cuda:N (default: the GPU if any)")


# ------------------------------------------------------------------------------------------ resolving


def load_op(spec: str, nargs: int = 1) -> Op:
    """A registered op by name, or the user's function given as MODULE:FUNCTION / FILE.py:FUNCTION."""
    return user_op(spec, nargs) if ":" in spec else get_op(spec)


def parse_options(op: Op, items: list[str]) -> dict[str, object] | None:
    """--opt KEY=VALUE items -> the op's options, each parsed to its Option's type and checked (ValueError naming the
    key and what is accepted). None when no --opt was given."""
    if not items:
        return None
    given: dict[str, object] = {}
    for item in items:
        key, sep, text = item.partition("=")
        key, text = key.strip(), text.strip()
        if not sep or not key:
            raise ValueError(f"--opt takes KEY=VALUE, got {item!r}")
        given[key] = text
    return op.resolve_options(given)


def resolve(args: argparse.Namespace) -> tuple[Op, Selection]:
    """The op and the Selection for check_op/bench_op from parsed arguments (everything checked)."""
    op = load_op(args.op, args.nargs)
    layouts = args.layout or (CONTIGUOUS,)
    chosen = Selection(split(args.impl), args.dtype, args.shape, device=args.device, layouts=layouts).checked(op)
    return op, dataclasses.replace(chosen, options=parse_options(op, args.opt))  # --opt's errors after the names


# ------------------------------------------------------------------------------------------ output paths


def check_writable(path: Path | None, *, folder: bool = False) -> None:
    """Raise OSError now, before a long run, when `path` (a file, or a folder when `folder`) cannot be written.

    Creates the missing parent folders (the run would create them anyway).
    """
    if path is None:
        return
    target = path if folder else path.parent
    try:
        target.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OSError(f"cannot write {path}: {exc.strerror or exc}") from None
    if not folder and path.is_dir():
        raise OSError(f"cannot write {path}: it is a folder")
    probe = path if (not folder and path.exists()) else target
    if not os.access(probe, os.W_OK):
        raise OSError(f"cannot write {path}: permission denied")
    if not folder and not path.exists():
        try:  # some file systems (/proc) refuse a new file whatever the permission bits say; a probe of
            # its own name, so that ranks checking the same path at once do not delete each other's probe
            with tempfile.NamedTemporaryFile(dir=target, prefix=f".{path.name}.", suffix=".probe"):
                pass
        except OSError as exc:
            raise OSError(f"cannot write {path}: {exc.strerror or exc}") from None


__all__ = ["DTYPES", "add_op_arguments", "check_writable", "resolve"]
