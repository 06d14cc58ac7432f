"""torch.compile, watched: compile time apart from run time, and recompiles or eager fallbacks flagged.

A sweep over many shapes through one compiled function hits dynamo's recompile limit and then silently runs
eager code. WatchedCompile resets dynamo and compiles for one shape (dynamic=False), counts the graphs the
backend receives, and says when the count is not the one graph expected.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator

import torch


class WatchedCompile:
    """torch.compile(fn) through inductor, with `compile_s` (first call) and `graphs` (graphs compiled)."""

    def __init__(self, fn: Callable, *, reset: bool = True, **compile_kwargs: object) -> None:
        if reset:
            torch._dynamo.reset()  # a fresh cache per case: the recompile limit never silently bites
        self.graphs = 0
        self.graphs_after_first_call: int | None = None
        self.compile_s: float | None = None
        self.compiled = torch.compile(fn, backend=self._backend, dynamic=False, **compile_kwargs)

    def _backend(self, gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
        from torch._inductor.compile_fx import compile_fx

        self.graphs += 1
        return compile_fx(gm, example_inputs)

    def __call__(self, *args: object, **kwargs: object) -> object:
        if self.compile_s is not None:
            return self.compiled(*args, **kwargs)
        start = time.perf_counter()
        out = self.compiled(*args, **kwargs)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self.compile_s = time.perf_counter() - start
        self.graphs_after_first_call = self.graphs
        return out

    @property
    def flags(self) -> list[str]:
        """What went differently from 'compiled once into one graph, then reused'."""
        flags = []
        if self.graphs == 0 and self.compile_s is not None:
            flags.append("fell back to eager: dynamo compiled no graph")
        elif self.graphs_after_first_call is not None and self.graphs_after_first_call > 1:
            flags.append(f"graph breaks: {self.graphs_after_first_call} graphs")
        if self.graphs_after_first_call is not None and self.graphs > self.graphs_after_first_call:
            flags.append(f"recompiled {self.graphs - self.graphs_after_first_call} time(s) after the first call")
        return flags


CACHE_OUTCOMES = ("hit", "miss", "bypass")


def cache_lookups_so_far() -> dict[str, int]:
    """Inductor's FX graph cache lookups in this process so far, {"hit": n, "miss": n, "bypass": n}, from torch's
    counters: every graph Inductor compiles is looked up there first (hit: read from the on-disk cache, no code
    generated or compiled; miss: compiled and saved; bypass: not cacheable)."""
    from torch._dynamo.utils import counters

    return {outcome: int(counters["inductor"][f"fxgraph_cache_{outcome}"]) for outcome in CACHE_OUTCOMES}


@contextlib.contextmanager
def cache_lookups() -> Iterator[dict[str, int]]:
    """The FX graph cache lookups made inside the block (`cache_lookups_so_far`): the dict yielded is filled on exit
    (`with cache_lookups() as lookups: bench_op(...)`, then lookups["miss"] is how many graphs it compiled itself)."""
    before = cache_lookups_so_far()
    lookups: dict[str, int] = dict.fromkeys(CACHE_OUTCOMES, 0)
    try:
        yield lookups
    finally:
        after = cache_lookups_so_far()
        lookups.update({k: after[k] - before[k] for k in CACHE_OUTCOMES})
