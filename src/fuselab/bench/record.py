"""The typed records of a benchmark: a Case (what is run) and a Row (what became of it), and their one JSON form.

A Case is built once, where the request is made (`fuselab bench`'s arguments, the report's plan), and travels as it
is to the launch; a Row carries its Case, its status, the timing's statistics, the derived rates and where it was
measured. Both are frozen: a derived value is a new Row (`dataclasses.replace`). Their JSON form is flat, one object
a line in the results log, the same keys as the logs written before these types existed (which still load):

    {"op": "gelu", "impl": "triton", "dtype": "float32", "shape": [4096], "approximate": "tanh", "pass": "forward",
     "status": "ok", "error": null, "median_ms": 0.012, "gbps": 2800.0, ..., "key": "..."}

Tables and plots that are given field names read them with `Row.field(name)`: a Row's own field, its Case's, or
an option's value.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum

import torch

from fuselab.bench.dtypes import dtype_name, parse_dtype

Shape = tuple[int, ...]
CONTIGUOUS = "contiguous"
PASSES = ("forward", "forward+backward")


class Status(str, Enum):
    """What became of a case: its row's `status` (a str, so it is written to JSON as its value)."""

    OK = "ok"  # measured
    ERROR = "error"  # it raised (out of memory, a compile error, a wrong result type)
    UNAVAILABLE = "unavailable"  # cannot run here (no GPU, no Triton, no nvcc)
    SKIPPED = "skipped"  # not worth running here (a Triton kernel under the CPU interpreter)
    REFUSED = "refused"  # would not fit in memory

    @property
    def measured(self) -> bool:
        return self is Status.OK

    @property
    def on_purpose(self) -> bool:
        """Not run, and not a failure: the row says why."""
        return self in (Status.UNAVAILABLE, Status.SKIPPED, Status.REFUSED)

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Case:
    """One case of an op: `impl` run on inputs of `shape` in `dtype` (a canonical name, e.g. "bfloat16"), with the
    op's option values `options` (name, value pairs, in the op's order), laid out as `layout`, timed for `pass_`
    ("forward" or "forward+backward"; None for a correctness check, which runs both)."""

    op: str
    impl: str
    dtype: str
    shape: Shape
    options: tuple[tuple[str, object], ...] = ()
    layout: str = CONTIGUOUS
    pass_: str | None = "forward"

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(int(n) for n in self.shape))
        object.__setattr__(self, "dtype", dtype_name(parse_dtype(self.dtype)))
        if self.pass_ is not None and self.pass_ not in PASSES:
            raise ValueError(f"unknown pass {self.pass_!r}; accepted: {', '.join(PASSES)}")

    @classmethod
    def of(
        cls,
        op: str,
        impl: str,
        dtype: torch.dtype | str,
        shape: Shape,
        options: Mapping[str, object] | None = None,
        *,
        layout: str = CONTIGUOUS,
        pass_: str | None = "forward",
    ) -> Case:
        name = dtype if isinstance(dtype, str) else dtype_name(dtype)
        return cls(op, impl, name, tuple(shape), tuple((options or {}).items()), layout, pass_)

    @property
    def torch_dtype(self) -> torch.dtype:
        return parse_dtype(self.dtype)

    @property
    def option_values(self) -> dict[str, object]:
        return dict(self.options)

    @property
    def backward(self) -> bool:
        return self.pass_ == "forward+backward"

    def with_impl(self, impl: str) -> Case:
        return dataclasses.replace(self, impl=impl)

    @property
    def peer_key(self) -> str:
        """The same for this case run by any impl."""
        return self.with_impl("").key

    def to_json(self) -> dict[str, object]:
        """The flat JSON form (a contiguous layout and no pass are left out, as the logs have always had them)."""
        laid = {} if self.layout == CONTIGUOUS else {"layout": self.layout}
        passed = {} if self.pass_ is None else {"pass": self.pass_}
        out: dict[str, object] = {"op": self.op, "impl": self.impl, "dtype": self.dtype, "shape": list(self.shape)}
        return {**out, **laid, **self.option_values, **passed}

    @property
    def key(self) -> str:
        """The log's key of this case (its JSON form, keys sorted)."""
        return json.dumps(self.to_json(), sort_keys=True, default=str)

    def field(self, name: str) -> object:
        """A field by its JSON name ("pass", "shape", "layout", an option's name, ...); KeyError when there is none."""
        return self.layout if name == "layout" else self.to_json()[name]


@dataclass(frozen=True)
class Row:
    """What became of a Case. Times in ms (host_us, e2e_us in µs), rates in GB/s and TFLOP/s, shares in %.

    status / error: OK with error None, else why not. The timing's statistics (`fuselab.bench.Measurement.summary`),
    the cost model's bytes and FLOPs, the rates derived from them, the error against the float64 reference, the
    host's cost of a call, a compile's time and flags, warnings, and where it ran, by what and when (device, GPU,
    versions, git revision, threads, time, rank).
    speedup: the op's baseline median / this median on the same case; ratio, best_peer: this median / the fastest
    peer's on the same case (the every-shape study).
    """

    case: Case
    status: Status = Status.OK
    error: str | None = None
    # the timing (Measurement.summary)
    median_ms: float | None = None
    mean_ms: float | None = None
    min_ms: float | None = None
    max_ms: float | None = None
    iqr_ms: float | None = None
    n: int | None = None
    mode: str | None = None
    host_ms: float | None = None
    flushed_l2: bool | None = None
    l2_flush: str | None = None
    rounds: int | None = None
    cpu_busy: float | None = None
    sustained_ms: float | None = None  # back to back (compute-bound ops on a GPU)
    # the cost model and the rates
    numel: int | None = None
    bytes: int | None = None
    flops: int | None = None
    bound: str | None = None
    gbps: float | None = None
    tflops: float | None = None
    sustained_tflops: float | None = None
    pct_copy: float | None = None
    copy_same_gbps: float | None = None
    pct_copy_same: float | None = None
    pct_peak: float | None = None
    speedup: float | None = None
    baseline: str | None = None  # the impl `speedup` is against
    ratio: float | None = None
    best_peer: str | None = None
    # correctness, the call, the compile
    rel_err: float | None = None
    host_us: float | None = None
    e2e_us: float | None = None
    host_bound: bool | None = None
    compile_s: float | None = None
    compile_graphs: int | None = None
    compile_flags: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    # where it ran, by what and when (bench.env.row_provenance)
    device: str | None = None
    gpu: str | None = None
    torch: str | None = None
    triton: str | None = None
    cuda: str | None = None
    revision: str | None = None
    dirty: bool | None = None
    threads: int | None = None
    written: str | None = None  # ISO 8601, UTC
    rank: int | None = None
    host: str | None = None
    gpu_index: int | None = None
    gpu_name: str | None = None
    extra: Mapping[str, object] = field(default_factory=dict)  # keys of the log no field holds (kept, written back)

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", Status(self.status))
        object.__setattr__(self, "warnings", tuple(self.warnings or ()))
        object.__setattr__(self, "compile_flags", tuple(self.compile_flags or ()))

    @property
    def measured(self) -> bool:
        return self.status is Status.OK and self.error is None

    def field(self, name: str) -> object:
        """A value by its JSON name: the row's own, its case's or an option's (None where the row has none)."""
        if name in _ROW_FIELDS or name in ("speedup", "baseline"):
            return getattr(self, name)
        if name.startswith("speedup_vs_"):
            return self.speedup if self.baseline == name.removeprefix("speedup_vs_") else None
        try:
            return self.case.field(name)
        except KeyError:
            return self.extra.get(name)

    def updated(self, **values: object) -> Row:
        return dataclasses.replace(self, **values)

    def to_json(self) -> dict[str, object]:
        """The flat JSON form: the case's fields, then the row's that hold a value (`error` always: None when
        measured), its extras and its key."""
        out = self.case.to_json()
        for name in _ROW_FIELDS:
            value = getattr(self, name)
            if (value is None and name != "error") or value == ():
                continue
            out[name] = list(value) if isinstance(value, tuple) else (str(value) if name == "status" else value)
        if self.baseline is not None:
            out[f"speedup_vs_{self.baseline}"] = self.speedup
        out.update(self.extra)
        out["key"] = self.case.key
        return out

    @classmethod
    def from_json(cls, record: Mapping[str, object], options: tuple[str, ...] | None = None) -> Row:
        """A Row from its JSON form (a log line, a results file's record), old logs included. options: the op's
        option names; None: the fields of the record's key (its case) that are not a Case's own, else every key that
        is not a case's or a row's field."""
        data = dict(record)
        key = data.pop("key", None)
        case_fields = {"op", "impl", "dtype", "shape", "layout", "pass"}
        if options is None and isinstance(key, str):
            options = tuple(k for k in json.loads(key) if k not in case_fields)
        speedups = [k for k in data if k.startswith("speedup_vs_")]
        values: dict[str, object] = {}
        if speedups:
            values["baseline"] = speedups[0].removeprefix("speedup_vs_")
            values["speedup"] = data.pop(speedups[0])
        for name in _ROW_FIELDS:
            if name in data:
                values[name] = data.pop(name)
        names = options if options is not None else tuple(k for k in data if k not in case_fields)
        case = Case(
            op=str(data.pop("op", "")),
            impl=str(data.pop("impl", "")),
            dtype=str(data.pop("dtype", "float32")),
            shape=tuple(data.pop("shape", ()) or ()),  # type: ignore[arg-type]
            options=tuple((k, data.pop(k)) for k in names if k in data),
            layout=str(data.pop("layout", CONTIGUOUS)),
            pass_=str(data.pop("pass", "forward")),
        )
        return cls(case=case, extra=data, **values)  # type: ignore[arg-type]


class Verdict(str, Enum):
    """A correctness check's outcome: its row's `status`."""

    PASS = "pass"
    FAIL = "FAIL"  # error over the tolerance, or it raised
    UNAVAILABLE = "unavailable"  # cannot run here (no GPU, a dtype it does not compute in, no kernel for the case)
    REFUSED = "refused"  # would not fit in memory

    @property
    def ran(self) -> bool:
        return self in (Verdict.PASS, Verdict.FAIL)

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class CheckRow:
    """What a correctness check of one Case found: relative errors of the output and of the gradients (None: no
    backward) against the float64 reference, the tolerance they are held to, the verdict and why (a failure's or
    a refusal's reason), the seed of the inputs, and where it ran."""

    case: Case
    status: Verdict
    rel_err: float | None = None
    grad_rel_err: float | None = None
    tolerance: float | None = None
    reason: str | None = None
    seed: int | None = None
    device: str | None = None
    rank: int | None = None
    host: str | None = None
    gpu_index: int | None = None
    gpu_name: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", Verdict(self.status))

    def field(self, name: str) -> object:
        if name in _CHECK_FIELDS:
            return getattr(self, name)
        try:
            return self.case.field(name)
        except KeyError:
            return None

    def to_json(self) -> dict[str, object]:
        fields = {name: getattr(self, name) for name in _CHECK_FIELDS}
        fields["status"] = str(self.status)
        return {**self.case.to_json(), **{k: v for k, v in fields.items() if v is not None}}


@dataclass(frozen=True)
class CheckSummary:
    """The checks of one impl, dtype, layout and option values: how many cases, the worst errors, and one verdict
    (FAIL if any failed, else pass if any passed, with `reason` counting the cases not run; else the first's)."""

    impl: str
    dtype: str
    options: tuple[tuple[str, object], ...]
    layout: str
    cases: int
    rel_err: float | None
    grad_rel_err: float | None
    tolerance: float | None
    status: Verdict
    reason: str | None

    def field(self, name: str) -> object:
        return getattr(self, name) if name in _SUMMARY_FIELDS else dict(self.options).get(name)

    def to_json(self) -> dict[str, object]:
        out = {name: getattr(self, name) for name in _SUMMARY_FIELDS if name != "options"}
        return {**out, **dict(self.options), "status": str(self.status)}


Record = Row | CheckRow | CheckSummary | Mapping[str, object]  # what tables, plots and files take


def value(record: Record, name: str) -> object:
    """A record's value by field name: a record's `field`, or a study's dict's entry (None where there is none)."""
    return record.get(name) if isinstance(record, Mapping) else record.field(name)


def as_json(record: Record) -> dict[str, object]:
    """A record's JSON form: its `to_json`, or a study's dict as it is."""
    return dict(record) if isinstance(record, Mapping) else record.to_json()


_CHECK_FIELDS = tuple(f.name for f in dataclasses.fields(CheckRow) if f.name != "case")
_SUMMARY_FIELDS = tuple(f.name for f in dataclasses.fields(CheckSummary))
_ROW_FIELDS = tuple(f.name for f in dataclasses.fields(Row) if f.name not in ("case", "extra", "speedup", "baseline"))


__all__ = [
    "CONTIGUOUS",
    "PASSES",
    "Case",
    "CheckRow",
    "CheckSummary",
    "Record",
    "Row",
    "Shape",
    "Status",
    "Verdict",
    "as_json",
    "value",
]
