"""One sweep run on 1 GPU and on N GPUs (`fuselab bench ... --out X.json`, then the same with `--gpus N`), compared:
every case present once in each log, rows per rank, whether the same impl wins each case, and the speed-ups.

A log is X.json's resumable log X.jsonl (every row written, retries included). A winner is the impl with the lowest
median per case (the sweep key without the impl); a case whose best two impls are within `close` (a fraction) is a
close call, counted apart: a tie is not a disagreement. Walls are seconds, measured by whoever ran the commands; a
`*_resume` wall is the same command run again once its log is complete (start-up, ceilings, table: the fixed cost),
so wall - resume is the sweep's own time.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from fuselab.bench.log import latest_by_key, load_records
from fuselab.bench.record import Case, Row
from fuselab.bench.results import row_is_noisy

CLOSE = 0.02  # a runner-up within 2% is a close call


@dataclass
class Winner:
    """The fastest impl of one case, the runner-up's margin (its median / the winner's - 1; None: no runner-up)."""

    impl: str
    margin: float | None
    close: bool


@dataclass
class Disagreement:
    """A case won by different impls on 1 and on N GPUs (the case: its sweep key without the impl)."""

    case: dict
    one: Winner
    many: Winner


@dataclass
class Walls:
    """Wall times, s, of the four commands (None: not given)."""

    one: float | None = None
    one_resume: float | None = None
    many: float | None = None
    many_resume: float | None = None

    @classmethod
    def parse(cls, text: str) -> Walls:
        """'one=83.1,one_resume=9.0,many=47.2,many_resume=14.0' -> Walls (ValueError naming a bad item)."""
        known = {f: None for f in cls.__dataclass_fields__}
        for item in filter(None, (s.strip() for s in text.split(","))):
            name, sep, value = item.partition("=")
            if not sep or name.strip() not in known:
                raise ValueError(f"--walls takes NAME=SECONDS with NAME in {', '.join(known)}, got {item!r}")
            try:
                known[name.strip()] = float(value)
            except ValueError:
                raise ValueError(f"--walls: {name.strip()} is not a number of seconds: {value!r}") from None
        return cls(**known)


@dataclass
class RunComparison:
    """What compare_runs found; speed-ups are 1-GPU time / N-GPU time (None where the walls were not given)."""

    cases: int
    every_case_once: bool
    errors_one: int
    errors_many: int
    rows_per_rank: dict[str, int]
    gpus: list[str]  # host:gpu_index of the N-GPU rows
    winners_agree: int
    winners_differ_close: int
    winners_differ: list[Disagreement]
    close: float
    walls: Walls = field(default_factory=Walls)
    speedup_wall: float | None = None
    speedup_sweep: float | None = None

    def to_json(self) -> dict:
        return asdict(self)

    def text(self) -> str:
        lines = [
            f"cases: {self.cases}, every case once in each log: {'yes' if self.every_case_once else 'NO'}",
            f"errors: {self.errors_one} on 1 GPU, {self.errors_many} on N",
            "rows per rank: " + ", ".join(f"{rank}: {n}" for rank, n in sorted(self.rows_per_rank.items())),
            f"winners: {self.winners_agree} agree, {self.winners_differ_close} differ within {self.close:.0%} "
            f"(close calls), {len(self.winners_differ)} differ",
        ]
        for d in self.winners_differ:
            lines.append(f"  {json.dumps(d.case, sort_keys=True)}: {d.one.impl} on 1 GPU, {d.many.impl} on N")
        if self.speedup_wall is not None:
            lines.append(f"speed-up, wall: {self.speedup_wall:.2f}x")
        if self.speedup_sweep is not None:
            lines.append(f"speed-up, the sweep alone (wall - resume): {self.speedup_sweep:.2f}x")
        return "\n".join(lines)


def load_log(path: Path) -> list[dict]:
    """The rows of X.json's resumable log X.jsonl (OSError naming it when it is missing)."""
    log = path.with_suffix(".jsonl")
    if not log.exists():
        raise OSError(f"no log {log} beside {path}: run `fuselab bench ... --out {path}` first")
    return load_records(log)


def _peers(row: dict) -> str:
    """The row's case without its impl: the rows that compete for a winner (a canonical JSON string)."""
    return json.dumps({k: v for k, v in json.loads(row["key"]).items() if k != "impl"}, sort_keys=True)


def winners(rows: list[dict], close: float = CLOSE) -> dict[str, Winner]:
    """Per case (without the impl): the fastest impl among rows without an error."""
    groups: dict[str, list[dict]] = {}
    for row in rows:
        if row.get("error") is None and row.get("median_ms"):
            groups.setdefault(_peers(row), []).append(row)
    out = {}
    for key, members in groups.items():
        ranked = sorted(members, key=lambda r: r["median_ms"])
        margin = ranked[1]["median_ms"] / ranked[0]["median_ms"] - 1 if len(ranked) > 1 else None
        out[key] = Winner(ranked[0]["impl"], margin, margin is not None and margin < close)
    return out


def compare_runs(one: list[dict], many: list[dict], walls: Walls | None = None, close: float = CLOSE) -> RunComparison:
    """Compare the rows of the 1-GPU log with those of the N-GPU log; see the module's docstring."""
    walls = walls or Walls()
    count_one, count_many = Counter(r["key"] for r in one), Counter(r["key"] for r in many)
    once = all(n == 1 for n in (*count_one.values(), *count_many.values()))
    w1, wn = winners(one, close), winners(many, close)
    shared = [k for k in w1 if k in wn]
    differ = [Disagreement(json.loads(k), w1[k], wn[k]) for k in shared if w1[k].impl != wn[k].impl]
    real = [d for d in differ if not (d.one.close or d.many.close)]
    speedup_wall = walls.one / walls.many if walls.one and walls.many else None
    speedup_sweep = None
    if None not in (walls.one, walls.one_resume, walls.many, walls.many_resume):
        sweep_many = walls.many - walls.many_resume
        speedup_sweep = (walls.one - walls.one_resume) / sweep_many if sweep_many > 0 else None
    return RunComparison(
        cases=len(count_one),
        every_case_once=once and set(count_one) == set(count_many),
        errors_one=sum(bool(r.get("error")) for r in one),
        errors_many=sum(bool(r.get("error")) for r in many),
        rows_per_rank=dict(Counter(str(r.get("rank", "-")) for r in many)),
        gpus=sorted({f"{r.get('host')}:{r.get('gpu_index')}" for r in many}),
        winners_agree=len(shared) - len(differ),
        winners_differ_close=len(differ) - len(real),
        winners_differ=real,
        close=close,
        walls=walls,
        speedup_wall=speedup_wall,
        speedup_sweep=speedup_sweep,
    )


# ---------------------------------------------------------------------------------------------- against a baseline


@dataclass(frozen=True)
class CaseChange:
    """One case measured now and in a baseline run: the case, both medians (ms), now / baseline (over 1: slower),
    whether that is past the threshold, and whether either timing was noisy."""

    case: Case
    baseline_ms: float
    now_ms: float
    ratio: float
    regressed: bool
    noisy: bool = False  # either timing was noisy (bench.results.row_is_noisy): the ratio is less sure


@dataclass(frozen=True)
class BaselineComparison:
    """This run's measured cases against a baseline's, matched by case (op, impl, dtype, shape, options, pass,
    layout), never by position; `threshold` a fraction (0.05: 5% slower is a regression). Devices are not part of
    a case: a baseline from another device is compared all the same, and `elsewhere` says so."""

    changes: list[CaseChange]
    only_now: int  # cases measured now that the baseline lacks
    only_baseline: int
    threshold: float
    elsewhere: str | None = None  # where the baseline ran on another device than this run, which and which

    @property
    def regressions(self) -> list[CaseChange]:
        return [c for c in self.changes if c.regressed]


def load_rows(path: Path) -> list[Row]:
    """A bench result to compare against: FILE.json (`--out`: its records) or a results log FILE.jsonl (the latest
    row of each case). OSError/ValueError naming the file when it is missing or not one."""
    path = Path(path)
    if not path.exists():
        raise OSError(f"no baseline {path}")
    if path.suffix == ".jsonl":
        return [Row.from_json(r) for r in latest_by_key(load_records(path)).values()]
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        hint = "give a `fuselab bench --out` file or its .jsonl log"
        raise ValueError(f"{path} is not JSON ({exc.msg}); {hint}") from None
    if not isinstance(data, dict) or not isinstance(data.get("records"), list):
        raise ValueError(f"{path} holds no bench records; give a `fuselab bench --out` file or its .jsonl log")
    return [Row.from_json(r) for r in data["records"]]


def compare_to_baseline(rows: list[Row], baseline: list[Row], threshold: float = 0.05) -> BaselineComparison:
    """Each case measured in both (rows without an error, matched by their case): now / baseline medians."""
    if threshold < 0:
        raise ValueError(f"the threshold is a fraction >= 0, got {threshold}")
    measured = lambda rs: {r.case: r for r in rs if r.measured and r.median_ms}  # noqa: E731
    now, before = measured(rows), measured(baseline)
    changes = []
    for case in now.keys() & before.keys():
        then_ms, now_ms = before[case].median_ms, now[case].median_ms
        ratio = now_ms / then_ms
        noisy = row_is_noisy(now[case]) or row_is_noisy(before[case])
        changes.append(CaseChange(case, then_ms, now_ms, ratio, ratio > 1 + threshold, noisy))
    changes.sort(key=lambda c: -c.ratio)
    here, there = _devices(now.values()), _devices(before.values())
    elsewhere = f"the baseline ran on {there}, this run on {here}" if here and there and here != there else None
    only_now, only_baseline = len(now.keys() - before.keys()), len(before.keys() - now.keys())
    return BaselineComparison(changes, only_now, only_baseline, threshold, elsewhere)


def _devices(rows: Iterable[Row]) -> str:
    """The devices rows ran on (the GPU's name, else the device), comma-separated."""
    return ", ".join(sorted({r.gpu or r.device for r in rows if r.gpu or r.device}))
