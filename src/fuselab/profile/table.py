"""The kernel table: each PyTorch operator with the GPU kernels it launched, built from a trace.

A row is a top-level operator (one the user's code called, e.g. aten::cdist, not the aten::_cdist_forward it
calls): its calls, CPU time (the time the CPU spent in it, which on the GPU is mostly launch overhead) and the
GPU time of every kernel, copy and memset launched while it ran, kernel by kernel. GPU work launched outside
any operator (a Triton kernel called from Python) belongs to the innermost range (fuselab.profile.range) around
its launch. Without a GPU the rows are the CPU operators and their CPU time.
"""

from __future__ import annotations

import io
import re
from collections import defaultdict
from dataclasses import asdict, dataclass, field

from rich.console import Console
from rich.table import Table

from fuselab.profile.trace import CPU_OP, GPU_RANGE, RANGE, Event, Trace

SORT_KEYS = ("gpu", "cpu", "calls", "avg", "name")
NO_OP = "(no operator or range)"


@dataclass
class KernelStat:
    """One GPU kernel (or copy, memset) as launched by one operator; times in µs."""

    name: str  # shortened
    full_name: str
    kind: str  # "kernel", "memcpy", "memset"
    calls: int = 0
    gpu_us: float = 0.0
    launched_by: list[str] = field(default_factory=list)  # the innermost operators that made the launch

    @property
    def avg_us(self) -> float:
        return self.gpu_us / self.calls if self.calls else 0.0


@dataclass
class OpStat:
    """A top-level operator (or range, for launches outside operators) and what it launched; times in µs."""

    name: str
    kind: str  # "op", "range" or "none"
    calls: int = 0
    cpu_us: float = 0.0
    gpu_us: float = 0.0
    kernels: list[KernelStat] = field(default_factory=list)

    @property
    def gpu_avg_us(self) -> float:
        return self.gpu_us / self.calls if self.calls else 0.0


@dataclass
class RangeStat:
    """A named range (fuselab.profile.range, record_function): CPU time inside it, and the GPU time of the work
    it enclosed (from Kineto's gpu_user_annotation events); µs."""

    name: str
    calls: int = 0
    cpu_us: float = 0.0
    gpu_us: float = 0.0


@dataclass
class KernelTable:
    """Rows of :class:`OpStat`; `gpu_total_us` is the GPU time of all work in the trace, `cpu_total_us` the CPU time
    of all top-level operators."""

    ops: list[OpStat]
    gpu_total_us: float
    cpu_total_us: float
    has_gpu: bool
    title: str = ""
    ranges: list[RangeStat] = field(default_factory=list)

    def share(self, op: OpStat | KernelStat) -> float:
        """Fraction of the total: GPU time when there is a GPU, else CPU time."""
        if self.has_gpu:
            return op.gpu_us / self.gpu_total_us if self.gpu_total_us else 0.0
        return getattr(op, "cpu_us", 0.0) / self.cpu_total_us if self.cpu_total_us else 0.0

    def sorted(self, key: str | None = None) -> KernelTable:
        """A copy sorted by `key` (one of SORT_KEYS; default: GPU time with a GPU, else CPU time), largest first."""
        key = key or ("gpu" if self.has_gpu else "cpu")
        if key not in SORT_KEYS:
            raise ValueError(f"unknown sort key {key!r}; accepted: {', '.join(SORT_KEYS)}")
        order = {
            "gpu": lambda r: -r.gpu_us,
            "cpu": lambda r: -getattr(r, "cpu_us", 0.0),
            "calls": lambda r: -r.calls,
            "avg": lambda r: -(r.gpu_avg_us if isinstance(r, OpStat) else r.avg_us),
            "name": lambda r: r.name,
        }[key]
        ops = [OpStat(o.name, o.kind, o.calls, o.cpu_us, o.gpu_us, sorted(o.kernels, key=order)) for o in self.ops]
        return KernelTable(
            sorted(ops, key=order), self.gpu_total_us, self.cpu_total_us, self.has_gpu, self.title, self.ranges
        )

    def to_json(self) -> dict:
        return {
            "title": self.title,
            "has_gpu": self.has_gpu,
            "gpu_total_us": self.gpu_total_us,
            "cpu_total_us": self.cpu_total_us,
            "ops": [{**asdict(o), "share": self.share(o)} for o in self.ops],
            "ranges": [asdict(r) for r in self.ranges],
        }

    def rich(self, *, limit: int | None = None, full_names: bool = False) -> Table:
        """A rich Table: operators, and below each the kernels it launched (└)."""
        table = Table(title=self.title or None, title_justify="left")
        table.add_column("operator / └ kernel", overflow="fold")
        table.add_column("calls", justify="right")
        if self.has_gpu:
            table.add_column("GPU total", justify="right")
            table.add_column("GPU avg", justify="right")
        table.add_column("CPU total", justify="right")
        table.add_column("%", justify="right")
        shown = self.ops if limit is None else self.ops[:limit]
        for op in shown:
            name = op.name if op.kind == "op" else f"[range] {op.name}" if op.kind == "range" else op.name
            cells = [f"[bold]{_escape(name)}[/bold]", str(op.calls)]
            if self.has_gpu:
                cells += [format_us(op.gpu_us) if op.kernels else "-", format_us(op.gpu_avg_us) if op.kernels else "-"]
            cells += [format_us(op.cpu_us), f"{100 * self.share(op):.1f}"]
            table.add_row(*cells)
            for k in op.kernels:
                kname = k.full_name if full_names else k.name
                table.add_row(
                    f"  └ {_escape(kname)}",
                    str(k.calls),
                    format_us(k.gpu_us),
                    format_us(k.avg_us),
                    "",
                    f"{100 * self.share(k):.1f}",
                )
        if limit is not None and len(self.ops) > limit:
            table.caption = f"{len(self.ops) - limit} more operators not shown"
        total = f"GPU total {format_us(self.gpu_total_us)}, " if self.has_gpu else "no GPU work in this trace; "
        table.caption = (
            ((table.caption + "; ") if table.caption else "") + total + f"CPU total {format_us(self.cpu_total_us)}"
        )
        return table

    def rich_ranges(self, *, limit: int | None = None) -> Table:
        """The named ranges: calls, CPU time inside them and, with a GPU, the GPU time of what they enclosed."""
        table = Table(title="ranges", title_justify="left")
        table.add_column("range", overflow="fold")
        table.add_column("calls", justify="right")
        table.add_column("CPU total", justify="right")
        if self.has_gpu:
            table.add_column("GPU span", justify="right")
        for r in self.ranges if limit is None else self.ranges[:limit]:
            cells = [_escape(r.name), str(r.calls), format_us(r.cpu_us)]
            table.add_row(*cells, *([format_us(r.gpu_us)] if self.has_gpu else []))
        return table

    def to_text(self, *, limit: int | None = None, full_names: bool = False, width: int = 160) -> str:
        console = Console(file=io.StringIO(), width=width, color_system=None, force_terminal=False)
        console.print(self.rich(limit=limit, full_names=full_names))
        if self.ranges:
            console.print(self.rich_ranges(limit=limit))
        return console.file.getvalue()


def build_table(trace: Trace, *, title: str = "") -> KernelTable:
    """Attribute every GPU event of `trace` to the top-level operator (or range) that launched it."""
    rows: dict[str, OpStat] = {}

    def row(name: str, kind: str) -> OpStat:
        if name not in rows:
            rows[name] = OpStat(name, kind)
        return rows[name]

    top = trace.top_level_ops()
    for e in top:
        r = row(e.name, "op")
        r.calls += 1
        r.cpu_us += e.dur

    kernels: dict[tuple[str, str], KernelStat] = {}
    range_calls: dict[str, set[Event]] = defaultdict(set)
    for g in trace.gpu:
        owner, leaf = _owner(trace, g)
        if owner is None:
            r = row(NO_OP, "none")
        elif owner.cat == RANGE:
            r = row(owner.name, "range")
            if owner not in range_calls[owner.name]:
                range_calls[owner.name].add(owner)
                r.calls += 1
                r.cpu_us += owner.dur
        else:
            r = rows[owner.name]
        k = kernels.get((r.name, g.name))
        if k is None:
            k = kernels[(r.name, g.name)] = KernelStat(short_kernel_name(g.name), g.name, g.kind)
            r.kernels.append(k)
        k.calls += 1
        k.gpu_us += g.dur
        r.gpu_us += g.dur
        if leaf is not None and leaf.name not in k.launched_by:
            k.launched_by.append(leaf.name)
    if NO_OP in rows:
        rows[NO_OP].calls = sum(k.calls for k in rows[NO_OP].kernels)
    ranges: dict[str, RangeStat] = {}
    for e in trace.ranges:
        r = ranges.setdefault(e.name, RangeStat(e.name))
        r.calls += 1
        r.cpu_us += e.dur
    for e in trace.of(GPU_RANGE):
        if e.name in ranges:
            ranges[e.name].gpu_us += e.dur
    return KernelTable(
        ranges=sorted(ranges.values(), key=lambda r: -r.cpu_us),
        ops=list(rows.values()),
        gpu_total_us=sum(g.dur for g in trace.gpu),
        cpu_total_us=sum(e.dur for e in top),
        has_gpu=trace.has_gpu,
        title=title,
    ).sorted()


def _owner(trace: Trace, gpu_event: Event) -> tuple[Event | None, Event | None]:
    """(top-level operator or innermost range, innermost operator) on the CPU thread at the launch of `gpu_event`.

    The launch is found through the correlation id; failing that (or when no operator encloses it), through the
    operator Kineto linked the GPU work to ("External id").
    """
    places = [(e.thread, e.ts) for e in (trace.launch_of(gpu_event), trace.linked_cpu_event(gpu_event)) if e]
    for thread, ts in places:
        ops = trace.enclosing(CPU_OP, thread, ts)
        if ops:
            return ops[0], ops[-1]
    for thread, ts in places:
        ranges = trace.enclosing(RANGE, thread, ts)
        if ranges:
            return ranges[-1], None
    return None, None


def format_us(us: float) -> str:
    """12.3 µs, 4.56 ms or 1.23 s."""
    if us >= 1e6:
        return f"{us / 1e6:.2f} s"
    if us >= 1e3:
        return f"{us / 1e3:.3g} ms" if us < 1e4 else f"{us / 1e3:.1f} ms"
    return f"{us:.3g} µs" if us < 100 else f"{us:.0f} µs"


def _escape(text: str) -> str:
    return text.replace("[", r"\[")


# shortening kernel names

_NOISE = frozenset(
    {"at", "native", "detail", "std", "cuda", "cub", "cutlass", "c10", "anon", "void", "const", "unsigned", "signed"}
    | {"long", "int", "char", "short", "bool", "float", "double", "half", "Half", "BFloat16", "__half"}
    | {"__nv_bfloat16", "array", "Array", "lambda", "operator", "true", "false"}
)
_IDENT = re.compile(r"[A-Za-z_]\w*")
_FUNCTOR = re.compile(r"[Ff]unctor|Impl|Epilogue")
_WRAPPERS = frozenset(
    {"gpu_kernel_impl", "gpu_kernel_impl_nocast", "BinaryFunctor", "UnaryFunctor", "AUnaryFunctor", "BUnaryFunctor"}
)


def short_kernel_name(name: str, width: int = 72) -> str:
    """A readable kernel name: no return type, namespaces or argument list; the template reduced to its first
    named argument (the functor, which says what the kernel computes).

    'void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, ...>(int, ...)'
    -> 'vectorized_elementwise_kernel<CUDAFunctor_add>'. Names without templates (cuBLAS, Triton) are kept.
    """
    text = name.replace("(anonymous namespace)", "anon").strip()
    text = re.sub(r"^(void|static)\s+", "", text)
    base, template = _split_template(_strip_args(text))
    base = base.split("::")[-1].strip() or base
    short = base
    if template:
        # the functor says what an elementwise or reduction kernel computes: prefer it, however deep it sits
        functors = [t for t in _IDENT.findall(template) if _FUNCTOR.search(t) and t not in _WRAPPERS]
        ident = functors[0] if functors else next(filter(None, map(_named, _top_level_split(template))), None)
        if ident:
            short = f"{base}<{ident}>"
    if len(short) > width:
        short = short[: width - 1] + "…"
    return short


def _strip_args(text: str) -> str:
    """Drop the argument list: the last parenthesis group at template depth 0."""
    depth = 0
    for i, ch in enumerate(text):
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth = max(depth - 1, 0)
        elif ch == "(" and depth == 0 and i > 0:
            return text[:i]
    return text


def _split_template(text: str) -> tuple[str, str]:
    i = text.find("<")
    if i <= 0 or not text.endswith(">"):
        return text, ""
    return text[:i], text[i + 1 : -1]


def _top_level_split(template: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(template):
        if ch in "<({[":
            depth += 1
        elif ch in ">)}]":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(template[start:i])
            start = i + 1
    parts.append(template[start:])
    return [p.strip() for p in parts]


def _named(arg: str) -> str | None:
    """The last namespace component of a template argument's type, if it names something (not int/float/4)."""
    head = _strip_args(_drop_templates(arg))  # drop inner templates and any '(...)'
    names = [i[-1] for p in head.split("::") if (i := [t for t in _IDENT.findall(p) if t not in _NOISE])]
    if not names:
        return None
    # a very short last name ('two' in dists<float>::two) reads better with its scope
    return "::".join(names[-2:]) if len(names[-1]) <= 4 and len(names) > 1 else names[-1]


def _drop_templates(text: str) -> str:
    out, depth = [], 0
    for ch in text:
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth = max(depth - 1, 0)
        elif depth == 0:
            out.append(ch)
    return "".join(out)
