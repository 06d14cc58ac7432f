"""A Chrome trace written by torch.profiler, read into what the tables and timelines need.

torch.profiler (Kineto) writes complete events (`"ph": "X"`, `ts` and `dur` in microseconds) whose `cat` says
what they are:

- `cpu_op`: a PyTorch operator on a CPU thread (`pid` the process, `tid` the thread);
- `user_annotation`: a named range (record_function, fuselab.profile.range) on a CPU thread;
- `cuda_runtime` / `cuda_driver`: a CUDA API call on a CPU thread (cudaLaunchKernel, cuLaunchKernelEx,
  cudaMemcpyAsync, cudaStreamSynchronize, ...);
- `kernel`, `gpu_memcpy`, `gpu_memset`: work on the GPU (`pid` the device, `tid` the stream);
- `gpu_user_annotation`: a range projected onto the GPU work it enclosed.

An API call and the GPU work it started carry the same `args["correlation"]`. That link, and which operator
was running on the thread when the call was made, is how GPU time is attributed to operators here.
"""

from __future__ import annotations

import bisect
import gzip
import json
from collections import defaultdict
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

CPU_OP = "cpu_op"
RANGE = "user_annotation"
GPU_RANGE = "gpu_user_annotation"
API_CATS = ("cuda_runtime", "cuda_driver")
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
SYNC_CALLS = frozenset(
    {
        "cudaDeviceSynchronize",
        "cudaStreamSynchronize",
        "cudaEventSynchronize",
        "cudaMemcpy",  # the synchronous copy
        "cuCtxSynchronize",
        "cuStreamSynchronize",
        "cuEventSynchronize",
    }
)
DTOH = "DtoH copy"

Thread = tuple[Any, Any]  # (pid, tid): a CPU thread, or (device, stream) on the GPU


@dataclass(frozen=True)
class Event:
    """One complete event; times in microseconds as in the file."""

    name: str
    cat: str
    ts: float
    dur: float
    pid: Any
    tid: Any
    args: dict = field(default_factory=dict, compare=False, hash=False)

    @property
    def end(self) -> float:
        return self.ts + self.dur

    @property
    def thread(self) -> Thread:
        return (self.pid, self.tid)

    @property
    def correlation(self) -> int | None:
        return self.args.get("correlation")

    @property
    def kind(self) -> str:
        """'kernel', 'memcpy' or 'memset' for GPU work; 'launch', 'sync' or 'api' for CUDA API calls; else cat."""
        if self.cat in GPU_CATS:
            return self.cat.removeprefix("gpu_")
        if self.cat in API_CATS:
            if self.name in SYNC_CALLS:
                return "sync"
            return "launch" if "Launch" in self.name or "Memcpy" in self.name or "Memset" in self.name else "api"
        return self.cat


@dataclass(frozen=True)
class Sync:
    """A point where the CPU waited for the GPU: a synchronize call or a device-to-host copy."""

    kind: str  # the API call's name, or DTOH
    ts: float  # µs, when the CPU started waiting
    dur: float  # µs
    thread: Thread


@dataclass
class Lane:
    """A row of the timeline: `events` with their nesting depth (0 = outermost)."""

    label: str
    kind: str  # "range", "cpu", "api", "gpu", "gpu_range"
    events: list[tuple[Event, int]]


class Trace:
    """The complete events of a torch.profiler Chrome trace, sorted by start time."""

    def __init__(self, events: list[Event], *, path: Path | None = None, meta: dict | None = None) -> None:
        self.events = sorted(events, key=lambda e: (e.ts, -e.dur))
        self.path = path
        self.meta = meta or {}
        self._by_cat: dict[str, list[Event]] = defaultdict(list)
        for e in self.events:
            self._by_cat[e.cat].append(e)

    # reading

    @classmethod
    def load(cls, path: str | Path) -> Trace:
        """Read a trace file (.json or .json.gz) as written by `prof.export_chrome_trace`."""
        path = Path(path)
        opener = gzip.open if path.suffix == ".gz" else open
        # torch's Python tracer sometimes writes stray non-UTF-8 bytes into "Call stack" args
        with opener(path, "rt", encoding="utf-8", errors="replace") as f:
            data = json.load(f)
        return cls.from_json(data, path=path)

    @classmethod
    def from_json(cls, data: dict | list, *, path: Path | None = None) -> Trace:
        raw = data.get("traceEvents", []) if isinstance(data, dict) else data
        events = [
            Event(
                name=str(e.get("name", "")),
                cat=str(e.get("cat", "")),
                ts=float(e["ts"]),
                dur=float(e.get("dur", 0.0)),
                pid=e.get("pid"),
                tid=e.get("tid"),
                args=e.get("args") or {},
            )
            for e in raw
            if e.get("ph") == "X" and "ts" in e
        ]
        meta = {k: v for k, v in data.items() if k != "traceEvents"} if isinstance(data, dict) else {}
        return cls(events, path=path, meta=meta)

    # the events by kind

    def of(self, *cats: str) -> list[Event]:
        if len(cats) == 1:
            return self._by_cat.get(cats[0], [])
        return sorted((e for c in cats for e in self._by_cat.get(c, [])), key=lambda e: e.ts)

    @property
    def ops(self) -> list[Event]:
        return self.of(CPU_OP)

    @property
    def ranges(self) -> list[Event]:
        return self.of(RANGE)

    @property
    def api(self) -> list[Event]:
        return self.of(*API_CATS)

    @property
    def gpu(self) -> list[Event]:
        return self.of(*GPU_CATS)

    @property
    def has_gpu(self) -> bool:
        return bool(self.gpu)

    @property
    def start(self) -> float:
        """µs; the first event of the profiled window (Python-tracer events excluded)."""
        times = [e.ts for e in self.events if e.cat != "python_function"]
        return min(times) if times else 0.0

    @property
    def end(self) -> float:
        times = [e.end for e in self.events if e.cat != "python_function"]
        return max(times) if times else 0.0

    def ms(self, ts: float) -> float:
        """A trace time (µs) as milliseconds since the start of the trace."""
        return (ts - self.start) / 1000.0

    # links between CPU and GPU

    @cached_property
    def _api_by_corr(self) -> dict[int, Event]:
        return {e.correlation: e for e in self.api if e.correlation is not None}

    @cached_property
    def _gpu_by_corr(self) -> dict[int, list[Event]]:
        out: dict[int, list[Event]] = defaultdict(list)
        for e in self.gpu:
            if e.correlation is not None:
                out[e.correlation].append(e)
        return out

    def launch_of(self, gpu_event: Event) -> Event | None:
        """The CUDA API call (cudaLaunchKernel, cuLaunchKernelEx, cudaMemcpyAsync, ...) that started this GPU work."""
        corr = gpu_event.correlation
        return self._api_by_corr.get(corr) if corr is not None else None

    @cached_property
    def _cpu_by_external_id(self) -> dict[int, Event]:
        return {e.args["External id"]: e for e in self.of(CPU_OP, RANGE) if "External id" in e.args}

    def linked_cpu_event(self, gpu_event: Event) -> Event | None:
        """The operator (or range) Kineto linked this GPU work to: the innermost one at its launch."""
        ext = gpu_event.args.get("External id")
        return self._cpu_by_external_id.get(ext) if ext else None

    def gpu_work_of(self, api_event: Event) -> list[Event]:
        corr = api_event.correlation
        return self._gpu_by_corr.get(corr, []) if corr is not None else []

    def launches(self) -> list[tuple[Event, Event]]:
        """(API call, GPU event) pairs for every GPU event whose launch is in the trace."""
        pairs = [(self.launch_of(g), g) for g in self.gpu]
        return [(a, g) for a, g in pairs if a is not None]

    # nesting on CPU threads

    @cached_property
    def _threads(self) -> dict[tuple[str, Thread], _Intervals]:
        groups: dict[tuple[str, Thread], list[Event]] = defaultdict(list)
        for e in self.ops:
            groups[(CPU_OP, e.thread)].append(e)
        for e in self.ranges:
            groups[(RANGE, e.thread)].append(e)
        return {key: _Intervals(evs) for key, evs in groups.items()}

    def top_level_ops(self) -> list[Event]:
        """The operators not called from inside another operator on the same thread."""
        return sorted(
            (e for (cat, _), iv in self._threads.items() if cat == CPU_OP for e in iv.top), key=lambda e: e.ts
        )

    def enclosing(self, cat: str, thread: Thread, ts: float) -> list[Event]:
        """Events of `cat` (CPU_OP or RANGE) on `thread` that contain time `ts`, outermost first."""
        iv = self._threads.get((cat, thread))
        return iv.containing(ts) if iv else []

    # synchronizations

    def syncs(self) -> list[Sync]:
        """Every time the CPU waited for the GPU: synchronize calls, and copies from the device to the host."""
        out = []
        for e in self.api:
            if e.name in SYNC_CALLS:
                out.append(Sync(e.name, e.ts, e.dur, e.thread))
            elif "Memcpy" in e.name and any("DtoH" in g.name for g in self.gpu_work_of(e)):
                out.append(Sync(DTOH, e.ts, e.dur, e.thread))
        return out

    # lanes for the timeline

    def lanes(self) -> list[Lane]:
        """Timeline rows, top to bottom: per CPU thread its ranges, operators and CUDA API calls; then the GPU
        ranges and each GPU stream's work."""
        lanes: list[Lane] = []
        threads = sorted({e.thread for e in (*self.ops, *self.ranges, *self.api)}, key=str)
        many = len(threads) > 1
        for i, th in enumerate(threads):
            suffix = f" (thread {i})" if many else ""
            for cat, kind, label in ((RANGE, "range", "ranges"), (CPU_OP, "cpu", "CPU ops")):
                evs = [e for e in self.of(cat) if e.thread == th]
                if evs:
                    lanes.append(Lane(label + suffix, kind, _with_depth(evs)))
            api = [e for e in self.api if e.thread == th]
            if api:
                lanes.append(Lane("CUDA API" + suffix, "api", [(e, 0) for e in api]))
        gpu_ranges = self.of(GPU_RANGE)
        if gpu_ranges:
            lanes.append(Lane("GPU ranges", "gpu_range", _with_depth(gpu_ranges)))
        streams = sorted({e.thread for e in self.gpu}, key=lambda t: (str(t[0]), str(t[1])))
        for device, stream in streams:
            evs = [e for e in self.gpu if e.thread == (device, stream)]
            lanes.append(Lane(f"GPU {device} stream {stream}", "gpu", [(e, 0) for e in evs]))
        return lanes


class _Intervals:
    """Nested intervals of one thread (events sorted by start, longest first), for containment queries."""

    def __init__(self, events: list[Event]) -> None:
        self.events = sorted(events, key=lambda e: (e.ts, -e.dur))
        self.top: list[Event] = []
        for e in self.events:
            if not self.top or e.ts >= self.top[-1].end:
                self.top.append(e)
        self._top_starts = [e.ts for e in self.top]
        self._children: dict[int, list[Event]] = defaultdict(list)  # index of top-level event -> its events
        t = -1
        for e in self.events:
            while t + 1 < len(self.top) and self.top[t + 1].ts <= e.ts:
                t += 1
            self._children[t].append(e)

    def containing(self, ts: float) -> list[Event]:
        t = bisect.bisect_right(self._top_starts, ts) - 1
        if t < 0 or ts > self.top[t].end:
            return []
        return [e for e in self._children[t] if e.ts <= ts <= e.end]


def _with_depth(events: list[Event]) -> list[tuple[Event, int]]:
    """Each event with how many events of the list (on its thread) enclose it."""
    out = []
    stacks: dict[Thread, list[Event]] = defaultdict(list)
    for e in sorted(events, key=lambda e: (e.ts, -e.dur)):
        stack = stacks[e.thread]
        while stack and e.ts >= stack[-1].end:
            stack.pop()
        out.append((e, len(stack)))
        stack.append(e)
    return out
