"""Sweeps over many GPUs (and hosts) with torch.distributed: one process per GPU, launched by torchrun.

    torchrun --nproc-per-node 8 -m fuselab bench softmax --out results/softmax.json
    fuselab bench softmax --gpus all --out results/softmax.json        (the same, torchrun launched for you)

How a sweep runs when a process group of more than one rank is up (`session` starts it from torchrun's
environment; one rank alone, or no torchrun, is today's single-process sweep, unchanged):

- rank 0 takes the log's lock (`X.jsonl.lock`, fcntl.flock: a second run on the same log stops at once with the
  holder's pid), merges what earlier runs left in part files into `X.jsonl`, and reads every finished case as done;
- the cases not done are grouped (cases that must be timed together stay on one rank) and split over the ranks by
  estimated cost, greedily, longest first (LPT), so the ranks finish together; the costliest (compile-heavy)
  groups are placed first and so land on different ranks;
- each rank measures its share on its own GPU (cuda:LOCAL_RANK) and appends each finished row at once to its own
  part file `X.rank<k>.jsonl`, with its rank, host and GPU;
- all rows are gathered (all_gather_object, over gloo) so every rank returns the same rows; rank 0 merges the part
  files into `X.jsonl` and deletes them. A rank that dies leaves its finished rows in its part file and its other
  cases to the rerun, which may use any number of ranks.

`--isolate` (`set_isolate`): the harness's timed regions take turns across the ranks (a ticket lock kept in the
process group's store), so one GPU times while the others prepare, compile and warm up; the default lets all time
at once (throughput). benchmarks/interference.py measures what the difference is.
This module knows no op: costs come from the caller (`case_cost` helps turn bytes, FLOPs and compiles into seconds).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import re
import socket
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import torch
import torch.distributed as dist

from fuselab.bench.log import append_record, case_key, latest_by_key, load_records

Case = dict[str, object]
DEFAULT_TIMEOUT_S = 12 * 3600  # a rank that finished waits at the gather for the slowest; sweeps may take hours
COMPILE_PRIOR_S = 20.0  # a compiled case's compile time, before any is measured (a prior; only its weight matters)


class LogBusy(RuntimeError):
    """Another run holds a results log's lock; the message names its pid and host."""


# ---------------------------------------------------------------------------------------------- the group


def world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def active() -> bool:
    """True when sweeps are spread: a process group of more than one rank is up."""
    return world_size() > 1


def is_main() -> bool:
    """True on rank 0 (and in a single process): the rank that prints and writes the outputs."""
    return rank() == 0


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


def where() -> dict[str, object]:
    """What a row records of where it was measured: rank, host, and the GPU (index, name) or None on the CPU."""
    on_gpu = torch.cuda.is_available()
    index = torch.cuda.current_device() if on_gpu else None
    return {
        "rank": rank(),
        "host": socket.gethostname(),
        "gpu_index": index,
        "gpu_name": torch.cuda.get_device_name(index) if on_gpu else None,
    }


@contextlib.contextmanager
def session(timeout_s: float | None = None) -> Iterator[None]:
    """Start the process group torchrun asked for (WORLD_SIZE > 1 in the environment), end it on exit.

    Each rank takes cuda:LOCAL_RANK as its current device. The default group is gloo (rows and plans are small
    host objects; CI runs the same path on CPU ranks); NCCL groups for device data are made where needed
    (interconnect). NVLink multicast is left off (NCCL_NVLS_ENABLE=0) unless the environment says otherwise.
    Without torchrun, or with one rank, nothing happens.
    """
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size <= 1 or not dist.is_available() or dist.is_initialized():
        yield
        return
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    if torch.cuda.is_available():
        count = torch.cuda.device_count()
        if local_rank() >= count:
            raise ValueError(f"LOCAL_RANK {local_rank()} but this host has {count} GPU(s): start fewer processes")
        torch.cuda.set_device(local_rank())
    timeout = dt.timedelta(seconds=timeout_s or float(os.environ.get("FUSELAB_DIST_TIMEOUT_S", DEFAULT_TIMEOUT_S)))
    dist.init_process_group("gloo", timeout=timeout)
    try:
        yield
    finally:
        _turns.clear()
        dist.destroy_process_group()


def gpus_requested(value: str) -> int:
    """`--gpus N|all` as a process count: all = every visible GPU. Errors name what is accepted."""
    count = torch.cuda.device_count()
    if value.strip().lower() == "all":
        n = count
    else:
        try:
            n = int(value)
        except ValueError:
            raise ValueError(f"--gpus takes a count or 'all', got {value!r}") from None
    if n < 1:
        raise ValueError(f"--gpus needs at least one GPU; this host has {count}")
    if n > count:
        raise ValueError(
            f"--gpus {value}: this host has {count} GPU(s); for CPU ranks run torchrun --nproc-per-node {n} -m fuselab"
        )
    return n


def launch(argv: Sequence[str], nproc: int, *, module: str = "fuselab") -> int:
    """Run `python -m module argv...` in `nproc` processes on this host under torchrun (torch.distributed.run,
    standalone rendezvous on a free port). Returns 0, or 1 when a rank failed (torchrun reports which)."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    args = parse_args(["--standalone", "--nproc-per-node", str(nproc), "-m", module, *argv])
    try:
        run(args)
    except ChildFailedError as exc:
        print(f"fuselab: a rank failed under torchrun:\n{exc}", file=sys.stderr)
        return 1
    return 0


def pop_gpus(argv: Sequence[str]) -> tuple[list[str], str | None]:
    """argv without `--gpus N` / `--gpus=N` (anywhere), and N (None when absent)."""
    rest: list[str] = []
    value = None
    items = list(argv)
    i = 0
    while i < len(items):
        item = items[i]
        if item == "--gpus":
            if i + 1 >= len(items):
                raise ValueError("--gpus takes a count or 'all'")
            value = items[i + 1]
            i += 2
            continue
        if item.startswith("--gpus="):
            value = item.split("=", 1)[1]
        else:
            rest.append(item)
        i += 1
    return rest, value


def broadcast(value: object) -> object:
    """Rank 0's value on every rank (the value itself without a group)."""
    if not active():
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def barrier() -> None:
    if active():
        dist.barrier()


def gather(value: object) -> list[object] | None:
    """Every rank's `value`, in rank order, on rank 0; None on the other ranks ([value] without a group)."""
    if not active():
        return [value]
    box: list[object] | None = [None] * world_size() if is_main() else None
    dist.gather_object(value, box, dst=0)
    return box


def spread(
    items: Sequence[object], work: Callable[[int, object], object], *, cost: Callable[[object], float] | None = None
) -> list[object] | None:
    """work(i, item) for every item, the items split over the ranks by estimated `cost(item)` (LPT, `split_by_cost`;
    default one each), each rank working through its share in order. Rank 0 returns every result in the items'
    order; the other ranks return None. Every rank calls it with the same items (broadcast them from rank 0 if in
    doubt). Without a group: every item here, in order. `work` should catch what must not stop the others."""
    costs = [float(cost(item)) if cost else 1.0 for item in items]
    mine = split_by_cost(costs, world_size())[rank()]
    done = {i: work(i, items[i]) for i in mine}
    parts = gather(done)
    if parts is None:
        return None
    results: dict[int, object] = {}
    for part in parts:
        results.update(part)  # type: ignore[arg-type]
    return [results[i] for i in range(len(items))]


# ---------------------------------------------------------------------------------------------- the split


def case_cost(
    *,
    impls: int = 1,
    compiled: int = 0,
    timing_s: float = 0.7,
    nbytes: int = 0,
    flops: int = 0,
    compile_s: float = COMPILE_PRIOR_S,
    bytes_per_s: float = 20e9,
    flops_per_s: float = 5e12,
) -> float:
    """Estimated seconds to run one group of cases: each impl's timing budget (warm-up + repetitions), a compile for
    each compiled impl, and the work that scales with size (inputs, the float64 reference, the check): bytes and
    FLOPs at deliberately low rates. Only the ratios between groups matter for the split."""
    return impls * timing_s + compiled * compile_s + nbytes / bytes_per_s + flops / flops_per_s


def split_by_cost(costs: Sequence[float], parts: int) -> list[list[int]]:
    """Indices of `costs` split into `parts` lists: longest first, each to the least-loaded part (LPT; the result is
    within 4/3 of the best). Deterministic (ties by index); each list is in ascending index order."""
    if parts < 1:
        raise ValueError(f"parts must be at least 1, got {parts}")
    loads = [0.0] * parts
    out: list[list[int]] = [[] for _ in range(parts)]
    for i in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        best = min(range(parts), key=lambda p: (loads[p], len(out[p]), p))
        out[best].append(i)
        loads[best] += costs[i]
    return [sorted(part) for part in out]


def plan(
    todo: Sequence[Case],
    parts: int,
    *,
    cost: Callable[[Case], float] | None = None,
    group: Callable[[Case], str] | None = None,
) -> list[list[int]]:
    """Indices of `todo` per rank: cases with the same `group` key go together (in their order), groups are split by
    their summed `cost` (default: one per case)."""
    groups: dict[str, list[int]] = {}
    for i, case in enumerate(todo):
        groups.setdefault(group(case) if group else str(i), []).append(i)
    members = list(groups.values())
    costs = [sum(cost(todo[i]) if cost else 1.0 for i in m) for m in members]
    return [sorted(i for g in part for i in members[g]) for part in split_by_cost(costs, parts)]


# ---------------------------------------------------------------------------------------------- the log


def part_path(log: Path, k: int) -> Path:
    """Rank k's part file beside `log`: X.jsonl -> X.rank<k>.jsonl."""
    return log.with_name(f"{log.stem}.rank{k}{log.suffix}")


def part_files(log: Path) -> list[Path]:
    pattern = re.compile(re.escape(log.stem) + r"\.rank(\d+)" + re.escape(log.suffix) + "$")
    found = [(int(m.group(1)), p) for p in log.parent.glob("*") if (m := pattern.match(p.name))]
    return [p for _, p in sorted(found)]


def merge_parts(log: Path) -> int:
    """Append the rows of every part file beside `log` that `log` lacks, then delete the parts; returns the count.
    Idempotent: a merge cut short and redone appends no row twice. Call it holding the lock."""

    parts = part_files(log)
    if not parts:
        return 0
    seen = {json.dumps(r, sort_keys=True, default=str) for r in load_records(log)}
    added = 0
    for part in parts:
        for record in load_records(part):
            text = json.dumps(record, sort_keys=True, default=str)
            if text not in seen:
                append_record(log, record)
                seen.add(text)
                added += 1
    for part in parts:
        part.unlink(missing_ok=True)
    return added


class LogLock:
    """An exclusive lock on a results log, held by one run at a time: flock on `X.jsonl.lock`, which records the
    holder's pid and host. Not re-entrant: a second acquire, even from the same process, fails with LogBusy."""

    def __init__(self, log: Path) -> None:
        self.log = Path(log)
        self.path = self.log.with_name(self.log.name + ".lock")
        self._fd: int | None = None

    def acquire(self) -> None:
        try:
            import fcntl
        except ImportError:  # no flock (Windows): runs are not guarded
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise LogBusy(
                f"{self.log} is being written by another run ({holder}); wait for it, or stop that process"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        """Drop the lock and remove its file (no stray .lock files are left behind)."""
        if self._fd is not None:
            self.path.unlink(missing_ok=True)  # while still held: no other run can be holding this file
            os.close(self._fd)  # closing drops the flock
            self._fd = None

    def __enter__(self) -> LogLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


# ---------------------------------------------------------------------------------------------- the sweep


class Spread:
    """The sweep over every rank (see the module's doc), as a context every rank enters with the same cases.

    Entering takes the log's lock on rank 0, merges the part files a killed run left and shares with every rank the
    rows already done (`kept`, those done_ok accepts) and each rank's share of the rest (`mine`: (key, case) pairs,
    `part`: this rank's part file, `extra`: where it runs, for its rows; `shares`: how many cases each rank runs).
    `gather(rows)` collects every rank's {key: row} into `rows`; leaving merges the parts and releases the lock.
    """

    def __init__(
        self,
        cases: Sequence[Case],
        out: Path | None,
        *,
        done_ok: Callable[[dict], bool],
        cost: Callable[[Case], float] | None = None,
        group: Callable[[Case], str] | None = None,
    ) -> None:
        self.cases, self.out, self.done_ok, self.cost, self.group = list(cases), out, done_ok, cost, group
        self.lock = LogLock(out) if out is not None and is_main() else None
        self.kept: dict[str, dict] = {}
        self.mine: list[tuple[str, Case]] = []
        self.part = part_path(out, rank()) if out is not None else None
        self.extra = where()
        self.rows: dict[str, dict] = {}
        self.shares: list[int] = []  # how many of the cases left each rank runs, in rank order

    def __enter__(self) -> Spread:
        setup: dict[str, object] = {"error": None}
        try:
            if is_main():
                try:
                    if self.lock is not None:
                        self.lock.acquire()
                        merge_parts(self.out)
                    done = latest_by_key(load_records(self.out)) if self.out is not None else {}
                    keys = [case_key(c) for c in self.cases]
                    kept = {k: done[k] for k in keys if k in done and self.done_ok(done[k])}
                    todo = [c for c, k in zip(self.cases, keys, strict=True) if k not in kept]
                    chosen = plan(todo, world_size(), cost=self.cost, group=self.group)
                    setup = {"error": None, "kept": kept, "todo": todo, "plan": chosen}
                except LogBusy as exc:
                    setup = {"error": str(exc)}
            setup = broadcast(setup)  # type: ignore[assignment]
            if setup["error"]:
                raise LogBusy(setup["error"])
        except BaseException:
            self.__exit__()
            raise
        todo: list[Case] = setup["todo"]  # type: ignore[assignment]
        self.mine = [(case_key(todo[i]), todo[i]) for i in setup["plan"][rank()]]  # type: ignore[index]
        self.kept = dict(setup["kept"])  # type: ignore[arg-type]
        self.shares = [len(part) for part in setup["plan"]]  # type: ignore[union-attr]
        return self

    def gather(self, mine: dict[str, dict]) -> None:
        """Every rank's rows (this rank's `mine`) with the kept ones, on every rank, in `rows`."""
        gathered: list[dict[str, dict] | None] = [None] * world_size()
        dist.all_gather_object(gathered, mine)
        self.rows = dict(self.kept)
        for theirs in gathered:
            self.rows.update(theirs or {})

    def __exit__(self, *exc: object) -> None:
        if self.lock is not None:
            try:
                if exc and exc[0] is None:
                    merge_parts(self.out)
            finally:
                self.lock.release()


# ---------------------------------------------------------------------------------------------- isolation

_turns: dict[str, object] = {}


def set_isolate(on: bool) -> None:
    """Isolation on or off: with it, the harness's timed regions take turns across the ranks (one GPU times while the
    others prepare). Call it on every rank, after the group is up; a no-op without one."""
    _turns.clear()
    if on and active():
        store = dist.PrefixStore("fuselab-turns/", dist.distributed_c10d._get_default_store())
        if is_main():
            store.set("turn/1", "go")
        barrier()
        _turns["store"] = store


@contextlib.contextmanager
def timed_region() -> Iterator[None]:
    """Around a measurement's timed part: with isolation, wait for this rank's turn (tickets in arrival order) and
    pass the turn on after; without it, nothing."""
    store = _turns.get("store")
    if store is None:
        yield
        return
    ticket = store.add("ticket", 1)  # type: ignore[attr-defined]
    timeout = dt.timedelta(seconds=float(os.environ.get("FUSELAB_DIST_TIMEOUT_S", DEFAULT_TIMEOUT_S)))
    store.wait([f"turn/{ticket}"], timeout)  # type: ignore[attr-defined]
    try:
        yield
    finally:
        store.set(f"turn/{ticket + 1}", "go")  # type: ignore[attr-defined]
