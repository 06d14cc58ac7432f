"""The measuring harness: timer, statistics, sweeps, device ceilings, results out. It knows nothing of ops."""

from fuselab.bench.ceilings import get_ceilings, measure_ceilings
from fuselab.bench.compiled import WatchedCompile
from fuselab.bench.env import environment
from fuselab.bench.record import Case, Row, Status
from fuselab.bench.sweep import Sweep, grid, load_records, run_sweep
from fuselab.bench.timer import (
    PITFALLS,
    CallCost,
    Measurement,
    Measurements,
    Timing,
    benchmark,
    benchmark_side_by_side,
    call_cost,
)

__all__ = [
    "PITFALLS",
    "CallCost",
    "Case",
    "Measurement",
    "Measurements",
    "Row",
    "Status",
    "Sweep",
    "Timing",
    "WatchedCompile",
    "benchmark",
    "benchmark_side_by_side",
    "call_cost",
    "environment",
    "get_ceilings",
    "grid",
    "load_records",
    "measure_ceilings",
    "run_sweep",
]
