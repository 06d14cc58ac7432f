"""The Triton softmax's launches as a GPU's plan table and SM count make them, compiled without that GPU.

For each (rows x width) and dtype, the forward and backward launch under Triton's interpreter with the launches
intercepted (not run), planned with the table's rules (default: the H200's) and its SM count; each launched kernel is
compiled for the target as Triton's JIT would specialize it, and ptxas counts its registers. Prints, per launch:
warps, registers a thread, spilled bytes, programs an SM (by registers, warps and shared memory), the grid, the waves
it takes, and its widest global load in bytes; `--sass` also how many of its global loads the SASS issues before its
first warp shuffle (its first reduction): a one-warp program that issues them all first waits on memory once. What it
found (docs/ops/softmax.md): split rows read 4 bytes at a time where the width was no multiple of 16, looped backward
rows of odd widths read element by element, and an edge mask that split the fp32 rows backward's loads in four.

    python scripts/softmax_offline_audit.py --dtype fp32 163x47692 278x17729
    python scripts/softmax_offline_audit.py --sass --dtype fp32 168140x39
    python scripts/softmax_offline_audit.py --dtype bf16 \
        --map benchmarks/results/h200/explorations/softmax_map_seed2041.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import torch

import fuselab  # noqa: F401  (TRITON_INTERPRET=1 without a GPU, before a kernel is defined)
from fuselab.bench.dtypes import parse_dtype
from fuselab.ops import tuning
from fuselab.ops.softmax import launch
from fuselab.profile import asm, inspect_triton
from fuselab.profile.inspect_triton import InterceptedLaunch


@contextlib.contextmanager
def planned_as(key: str, sms: int, overrides: dict) -> Iterator[None]:
    """Within the block, the launcher plans as GPU `key` with `sms` SMs would (`tuning.planning_as`), its table's
    rules with `overrides` (a variant to audit)."""
    table = launch.params
    if overrides:
        launch.params = lambda device: {**table(device), **overrides}
    try:
        with tuning.planning_as(tuning.GPUModel(key, sms, 9)):
            yield
    finally:
        launch.params = table


def intercept(shapes: list[tuple[int, int]], dtype: torch.dtype) -> dict[tuple[int, int], list[InterceptedLaunch]]:
    """Each shape's forward and backward launches, intercepted under the interpreter."""

    def run(rows: int, width: int) -> None:
        x = torch.empty(rows, width, dtype=dtype)
        y = torch.empty_like(x)
        launch.launch_forward(x, y)
        launch.launch_backward(y, x, torch.empty_like(x))

    return {(rows, width): inspect_triton.intercept(partial(run, rows, width)) for rows, width in shapes}


def map_shapes(path: Path, dtype: torch.dtype) -> list[tuple[int, int]]:
    """The shapes of a map file's rows of `dtype` (explorations/softmax_map_*.json)."""
    rows = json.loads(path.read_text())["rows"]
    name = str(dtype).removeprefix("torch.")
    return sorted({tuple(int(n) for n in r["shape"].split("x")) for r in rows if r["dtype"] == name})


def loads_before_shuffle(cubin: bytes | None) -> str:
    """Of a compiled kernel's global loads in its SASS, how many come before its first warp shuffle, as "k/n"; "-"
    where there is no cubin or no cuobjdump (`asm.find_tool`: Triton ships one)."""
    sass = asm.cubin_sass(cubin)[0] if cubin else None
    if sass is None:
        return "-"
    loads = re.compile(r"\bLDG")
    return f"{len(loads.findall(sass.partition('SHFL')[0]))}/{len(loads.findall(sass))}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("shapes", nargs="*", help="rows x width, e.g. 163x47692")
    parser.add_argument("--dtype", default="fp32", help="fp32, bf16, fp16 (default fp32)")
    parser.add_argument("--map", type=Path, help="also every shape of this map file (its rows of --dtype)")
    parser.add_argument("--gpu", default=tuning.key_of("NVIDIA H200", 9, 0), help="plan table key (default: H200)")
    parser.add_argument("--sms", type=int, default=132, help="the GPU's SM count (default 132)")
    parser.add_argument("--rules", type=json.loads, default={}, help="overrides of the table's rules, as JSON")
    parser.add_argument("--sass", action="store_true", help="also the global loads issued before the first shuffle")
    args = parser.parse_args()
    dtype = parse_dtype(args.dtype)
    shapes = [tuple(int(n) for n in s.split("x")) for s in args.shapes]
    if args.map:
        shapes += map_shapes(args.map, dtype)
    if not shapes:
        parser.error("give shapes or --map")
    with planned_as(args.gpu, args.sms, args.rules):
        by_shape = intercept(shapes, dtype)
    compiled = inspect_triton.compile_launches([one.job for launches in by_shape.values() for one in launches], 90)
    sass_column = " loads_before_shuffle" if args.sass else ""
    print(f"shape kernel warps registers spilled_bytes programs_per_sm grid waves widest_load_bytes{sass_column}")
    for (rows, width), launches in by_shape.items():
        for one in launches:
            c = compiled[one.job]
            held = inspect_triton.programs_per_sm(c, one.warps)
            waves = one.grid / (held * args.sms)
            print(f"{rows}x{width} {c.name} {one.warps} {c.registers} {c.spills} {held} {one.grid} {waves:.2f} "
                  f"{c.widest_load}{' ' + loads_before_shuffle(c.cubin) if args.sass else ''}")  # fmt: skip


if __name__ == "__main__":
    main()
