"""Tuning as data: an op's plan parameters per GPU, as JSON files in the op's folder (knows no op).

A table holds the parameters of an op's launch *rules* (tile bytes, warps per element size, thresholds), never plans
looked up by a tuned shape, so it applies to every shape. Files are `<op folder>/plans/<device key>.json`, the key
naming the GPU and its compute capability (`nvidia-h200-sm90`). A launcher reads its op's defaults (the rule's
parameters for a GPU never tuned) overridden by the table of the GPU it runs on, if any, else by the table of a GPU of
the same compute capability and SM count (`reading_key`: an H100 SXM reads the H200's); `fuselab tune OP` writes
the tables.

A tuner (an op's `tune` module, named by its Op's `tuner`) splits the work into cases, so `fuselab tune` can spread
them over the ranks of a torchrun group (bench.distributed) and still choose exactly as one process would:

    cases(shapes, dtypes) -> [case]             JSON-able cases, in the order one process measures them
    measure(case, device, quick, compile_peer)  -> a JSON-able dict: every candidate's time at the case, and what
                                                   choose needs (one case, on one GPU)
    choose(measurements) -> (params, evidence)  the table's parameters from every case's measurement, in the cases'
                                                   order; evidence holds 'winner' and 'scores' where there is one

A tuner that can check its choice on cases it was not tuned on (`fuselab tune --check`: a held-out draw) also takes

    measure(..., only=[name, ...])              the named candidates alone, beside the rules as they stand
    choose(measurements, held_out=[...])        the choice again, without the chosen candidates (evidence
                                                   'chosen') that slow a held-out case down

and optionally: devices (the device types it can time on; default ("cuda",)), default_dtypes, default_shapes (used
when no --shape/--shapes is given), cost(case) (estimated seconds, for the split), describe(case) and
summary(measurement) (one line each, for progress), table_key(device) and write(params, evidence, device) -> path
(a table of its own format; default: write_table into the tuner's folder under device_key).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import importlib.util
import json
import math
import re
import time
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

TABLE_VERSION = 1


def device_key(index: int | None = None) -> str:
    """'<device name>-sm<major><minor>' of CUDA device `index` (default: the current one), lower case, dashes:
    'nvidia-h200-sm90'."""
    index = torch.cuda.current_device() if index is None else index
    return _device_key(index)


@functools.cache
def _device_key(index: int) -> str:
    props = torch.cuda.get_device_properties(index)
    return key_of(props.name, props.major, props.minor)


def key_of(name: str, major: int, minor: int) -> str:
    """The table key of a GPU named `name` with compute capability major.minor."""
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    return f"{slug}-sm{major}{minor}"


@dataclass(frozen=True)
class GPUModel:
    """A GPU as the plans see it: its plan table's key, SM count and compute capability's major number."""

    key: str
    sms: int
    major: int


# The GPUs plans can be made for without them (offline inspection), by target: the one of each with a plan table
MODELS = {"sm_90": GPUModel(key_of("NVIDIA H200", 9, 0), 132, 9)}
_PLANNING_AS: list[GPUModel] = []


def reading_key(folder: Path, index: int | None = None) -> str:
    """The key of the plan table CUDA device `index` (default: the current one) reads in `folder`: its own
    (`device_key`), or where it has none there, `reading_key_of`'s stand-in of the same capability and SM count."""
    index = torch.cuda.current_device() if index is None else index
    return _reading_key(Path(folder), index)


@functools.cache
def _reading_key(folder: Path, index: int) -> str:
    props = torch.cuda.get_device_properties(index)
    return reading_key_of(folder, key_of(props.name, props.major, props.minor), props.multi_processor_count)


def reading_key_of(folder: Path, key: str, sms: int) -> str:
    """`key` where `folder` has its table; else the key of a GPU of MODELS of the same compute capability (the key's
    "-smXY") and SM count whose table it has: the same registers, shared memory and SMs, so the same tiles fit and
    fill the GPU alike (an H100 SXM, 132 SMs, reads the H200's); else `key` (no table: the op's defaults)."""
    if table_path(folder, key).exists():
        return key
    capability = key.rsplit("-", 1)[-1]
    for model in MODELS.values():
        same = model.key.rsplit("-", 1)[-1] == capability and model.sms == sms
        if same and table_path(folder, model.key).exists():
            return model.key
    return key


def planning_for() -> GPUModel | None:
    """The GPU `planning_as` names while its block runs, else None (each device plans for itself)."""
    return _PLANNING_AS[-1] if _PLANNING_AS else None


@contextlib.contextmanager
def planning_as(gpu: GPUModel) -> Iterator[None]:
    """Within the block, ops plan the launches of tensors on any device (the CPU's, under the interpreter) as `gpu`
    would: its plan table, SM count and capability (TMA, inline PTX). For compiling what that GPU would run (offline
    inspection, scripts/*_offline_audit.py), not for running it under the interpreter (split rows' programs wait for
    each other). What ops made from plans (cached rules, prepared launches) is made again on entry and on exit. For
    one thread of a process that launches nothing on a GPU meanwhile: the launchers' caches are the process's."""
    _PLANNING_AS.append(gpu)
    try:
        _forget_plans()
        yield
    finally:
        _PLANNING_AS.pop()
        _forget_plans()


def table_path(folder: Path, key: str) -> Path:
    return Path(folder) / "plans" / f"{key}.json"


@functools.cache
def load_table(folder: Path, key: str | None) -> dict:
    """The parameters tuned for GPU `key` in `folder`/plans, or {} (no table: the op's defaults hold)."""
    if key is None:
        return {}
    path = table_path(folder, key)
    if not path.exists():
        return {}
    data = json.loads(path.read_text())
    if data.get("version") != TABLE_VERSION:
        raise ValueError(f"{path}: plan table version {data.get('version')!r}, this fuselab reads {TABLE_VERSION}")
    return data.get("params", {})


def params(defaults: Mapping[str, object], folder: Path, key: str | None) -> dict:
    """`defaults` with the tuned values for GPU `key` laid over them (unknown names in the table are errors)."""
    tuned = load_table(Path(folder), key)
    unknown = set(tuned) - set(defaults)
    if unknown:
        raise ValueError(f"plan table for {key} in {folder}: unknown parameters {sorted(unknown)}")
    return {**defaults, **tuned}


_ON_WRITE: list[Callable[[], None]] = []


def on_table_written(forget: Callable[[], None]) -> Callable[[], None]:
    """Register `forget`, called whenever a plan table is written, so that what a module made from a table (cached
    rules and plans, rules handed to an extension) is made again from the new one. Returns `forget` (a decorator)."""
    _ON_WRITE.append(forget)
    return forget


class Prepared:
    """Launches an op prepared once per layout (the key its eager path reads off its tensors: shape, strides, dtype,
    device, alignment, options), so that a call repeats none of the plan's choosing. Every instance starts over when
    a plan table is written (the plans it holds may have changed), and when it holds `limit` layouts."""

    def __init__(self, limit: int = 4096) -> None:
        self.limit, self._held = limit, {}
        on_table_written(self._held.clear)

    def get(self, key: Hashable, prepare: Callable[[], Any]) -> Any:
        """The launch prepared for `key`, made by `prepare()` the first time."""
        held = self._held.get(key)
        if held is None:
            if len(self._held) >= self.limit:
                self._held.clear()
            held = self._held[key] = prepare()
        return held

    def __len__(self) -> int:
        return len(self._held)


def write_table(folder: Path, key: str, values: Mapping[str, object], evidence: Mapping[str, object]) -> Path:
    """Write (or replace) the table of GPU `key`: `values` (parameters), `evidence` (what the tuner timed). The
    process's launches then follow it: every `on_table_written` callback runs (`Prepared` launches start over)."""
    path = table_path(folder, key)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"version": TABLE_VERSION, "device": key, "params": dict(values), "evidence": dict(evidence)}
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    load_table.cache_clear()
    _reading_key.cache_clear()
    _forget_plans()
    return path


def _forget_plans() -> None:
    for forget in _ON_WRITE:
        forget()


# ---------------------------------------------------------------------------------------------- tuners

REQUIRED = ("cases", "measure", "choose")


# ---------------------------------------------------------------------------------------------- scoring

FAILED_RATIO = 10.0  # a candidate that failed (or was not timed) at a case scores this many times the best there


def geomean_scores(candidates: Iterable[str], cases: Sequence[tuple[Mapping[str, object], float]]) -> dict[str, float]:
    """Per candidate: the geometric mean over `cases` of its time / the best time there (1.0: the best everywhere).

    cases: (time in ms by candidate, the best time at that case, peers included); a candidate absent from a case's
    times, or not a number there, counts as FAILED_RATIO x the best."""
    scores = {}
    for name in candidates:
        logs = []
        for timed, best in cases:
            ms = timed.get(name)
            logs.append(math.log(ms / best if isinstance(ms, float) else FAILED_RATIO))
        scores[name] = math.exp(sum(logs) / len(logs))
    return scores


def winner(scores: Mapping[str, float], default: str = "defaults") -> str:
    """The best-scoring candidate, or `default` unless another beats it."""
    best = min(scores, key=scores.get)
    return best if default not in scores or scores[best] < scores[default] else default


def tuner_ops() -> list[str]:
    """The registered ops that name a tuner."""
    from fuselab.ops.registry import all_ops

    return [op.name for op in all_ops() if op.tuner]


def load_tuner(spec: str) -> Any:
    """The tuner of a registered op (its Op's `tuner` module), or one given as FILE.py (the module is the tuner) or
    MODULE:NAME / FILE.py:NAME (an object in it). Errors name the ops that have tuners."""
    from fuselab.ops.registry import get_op
    from fuselab.ops.user import load_module

    if spec.endswith(".py") or ":" in spec:
        where, _, name = (spec, "", "") if spec.endswith(".py") else spec.rpartition(":")
        tuner = load_module(where)
        if name:
            if not hasattr(tuner, name):
                raise LookupError(f"{where} has no {name!r}")
            tuner = getattr(tuner, name)
    else:
        op = get_op(spec)
        if not op.tuner:
            raise LookupError(
                f"op {op.name!r} has no tuner; ops with one: {', '.join(tuner_ops()) or 'none'} "
                "(or give a tuner as FILE.py or MODULE:NAME)"
            )
        tuner = importlib.import_module(op.tuner)
    missing = [name for name in REQUIRED if not callable(getattr(tuner, name, None))]
    if missing:
        raise TypeError(f"tuner {spec!r} lacks {', '.join(missing)} (a tuner defines {', '.join(REQUIRED)})")
    return tuner


def tuner_device(tuner: object) -> torch.device:
    """Where the tuner times: the current GPU when it times on CUDA and one is visible, else the CPU if it can."""
    devices = tuple(getattr(tuner, "devices", ("cuda",)))
    if "cuda" in devices and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    if "cpu" in devices:
        return torch.device("cpu")
    raise ValueError("fuselab tune times plans on a CUDA GPU; none is visible here")


def table_key(tuner: object, device: torch.device) -> str:
    """The key of the table the tuner writes for `device`."""
    if callable(getattr(tuner, "table_key", None)):
        return tuner.table_key(device)
    return device_key(device.index) if device.type == "cuda" else device.type


def write(tuner: object, params: Mapping[str, object], evidence: Mapping[str, object], device: torch.device) -> Path:
    """Write the tuner's table for `device`: its own `write`, else write_table into its folder."""
    if callable(getattr(tuner, "write", None)):
        return tuner.write(params, evidence, device)
    folder = getattr(tuner, "folder", None) or Path(tuner.__file__).parent
    return write_table(Path(folder), table_key(tuner, device), params, evidence)


def describe(tuner: object, case: object) -> str:
    if callable(getattr(tuner, "describe", None)):
        return tuner.describe(case)
    return json.dumps(case, separators=(",", ":"), default=str)


@dataclass
class Tuned:
    """What `tune` returns on rank 0: the table (params, evidence; both empty when every case failed), the cases that
    failed, and who measured what."""

    params: dict
    evidence: dict
    failed: list[dict] = field(default_factory=list)
    ranks: list[int] = field(default_factory=list)  # per case, the rank that measured it


def candidates_digest(tuner: object) -> str:
    """A digest of the tuner's CANDIDATES (names and what each sets; "" for a tuner without them): a journal's
    measurement holds only the candidates it was made with."""
    return hashlib.sha256(repr(getattr(tuner, "CANDIDATES", "")).encode()).hexdigest()[:16]


def checks_held_out(tuner: object) -> bool:
    """True for a tuner whose measure takes `only` and choose `held_out` (it can check its choice on held-out cases)."""
    import inspect

    return all(
        callable(getattr(tuner, f, None)) and arg in inspect.signature(getattr(tuner, f)).parameters
        for f, arg in (("measure", "only"), ("choose", "held_out"))
    )


def read_journal(path: Path, device_name: str, candidates: str, only: list[str] | None = None) -> dict[str, dict]:
    """The measurements a tuning journal (a results log, bench.log) holds for `device_name`, the tuner's
    `candidates_digest` and the candidates measured (`only`: a held-out check's; None: all), by case_key (the last
    line of a case wins); a missing file holds none, and a line cut short by a killed run is left out."""
    from fuselab.bench.log import case_key, load_records

    return {
        case_key(entry["case"]): {k: entry[k] for k in ("case", "rank", "measurement")}
        for entry in load_records(path)
        if (entry.get("device"), entry.get("candidates"), entry.get("only")) == (device_name, candidates, only)
        and "measurement" in entry
    }


def tune(
    tuner: object,
    cases: Sequence[object],
    device: torch.device,
    quick: bool,
    compile_peer: bool,
    log: Callable[[str], None] = print,
    journal: Path | None = None,
    check_cases: Sequence[object] = (),
) -> Tuned | None:
    """Measure every case and choose. Under torchrun (bench.distributed active) the cases are split over the ranks
    by the tuner's cost, each rank measures its share on its own GPU, and rank 0 gathers every measurement and
    chooses from them in the cases' order, as one process would; the other ranks return None. A case whose measure
    raises is logged and listed in `failed` (and the evidence), not fatal to the rest. Without a group: every case
    here, in order. `journal` (FILE.jsonl): each case's measurement is appended as it is made, and the cases it
    already holds measured on this device by this tuner's candidates are taken from it, not measured again (a run
    cut short resumes; a journal of other candidates is measured again). `check_cases` (held-out cases, for a tuner
    that `checks_held_out`): the chosen candidates (evidence "chosen") are measured there too, alone beside the rules
    as they stand, and choose is asked again with those measurements; a held-out case that fails is listed in
    `failed` with "held_out": True."""
    from fuselab.bench import distributed
    from fuselab.bench.log import append_record, case_key, repair_log

    tag = f"[rank {distributed.rank()}] " if distributed.active() else ""
    cost = getattr(tuner, "cost", None)
    device_name = device_key(device.index) if device.type == "cuda" else device.type
    candidates = candidates_digest(tuner)
    if journal and distributed.is_main():
        repair_log(journal)  # a line cut short by a killed run goes, so the next append starts a line of its own

    def work(i: int, case: object, only: list[str] | None = None) -> dict:
        label = describe(tuner, case)
        start = time.perf_counter()
        try:
            measured = tuner.measure(case, device, quick, compile_peer, **({"only": only} if only else {}))
        except Exception as exc:  # a case that cannot run here (a compile error): reported, not fatal
            error = f"{type(exc).__name__}: {exc}"[:300]
            log(f"{tag}{label}: failed: {error}")
            return {"case": case, "rank": distributed.rank(), "error": error}
        line = tuner.summary(measured) if callable(getattr(tuner, "summary", None)) else "done"
        log(f"{tag}{label}: {line} ({time.perf_counter() - start:.1f} s)")
        result = {"case": case, "rank": distributed.rank(), "measurement": measured}
        if journal:  # one write per line: ranks append to one file without mixing lines
            append_record(journal, {"device": device_name, "candidates": candidates, **result,
                                    **({"only": only} if only else {})})  # fmt: skip
        return result

    def run(some: Sequence[object], only: list[str] | None) -> list[dict] | None:
        """Every case's result in order (rank 0; None elsewhere), those in the journal taken from it."""
        kept = read_journal(journal, device_name, candidates, only) if journal else {}
        todo = [case for case in some if case_key(case) not in kept]
        if kept and distributed.is_main():
            log(f"{len(some) - len(todo)} of {len(some)} case(s) taken from {journal}")
        measured = distributed.spread(todo, functools.partial(work, only=only), cost=cost)
        if measured is None:
            return None
        by_key = {**kept, **{case_key(r["case"]): r for r in measured}}
        return [by_key[case_key(case)] for case in some]

    results = run(cases, None)
    tuned = None if results is None else _choose(tuner, results)
    if check_cases:  # every rank measures its share of the held-out cases: rank 0 says which candidates
        only = distributed.broadcast(list(tuned.evidence.get("chosen", ())) if tuned else None)
        if only:
            if distributed.is_main():
                log(f"checking {' + '.join(only)} on {len(check_cases)} held-out case(s)")
            checked = run(check_cases, only)
            if checked is not None and tuned is not None:
                tuned = _choose(tuner, results, checked)
    return tuned


def _choose(tuner: object, results: Sequence[dict], checked: Sequence[dict] = ()) -> Tuned:
    """The tuner's choice from the cases' results (and the held-out cases' `checked`, if any), with the failures."""
    failed = [{k: r[k] for k in ("case", "rank", "error")} for r in results if "error" in r]
    failed += [{**{k: r[k] for k in ("case", "rank", "error")}, "held_out": True} for r in checked if "error" in r]
    measurements = [r["measurement"] for r in results if "error" not in r]
    ranks = [r["rank"] for r in results]
    if not measurements:
        return Tuned({}, {}, failed, ranks)
    held_out = [r["measurement"] for r in checked if "error" not in r]
    params, evidence = tuner.choose(measurements, held_out=held_out) if checked else tuner.choose(measurements)
    evidence = dict(evidence)
    if failed:
        evidence["failed"] = failed
    return Tuned(dict(params), evidence, failed, ranks)
