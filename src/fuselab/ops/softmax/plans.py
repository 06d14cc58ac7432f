"""The Triton softmax's launch plans: which kernel, tile and warps for rows of a width, chosen by rules (and the CUDA
impl's span rules' parameters, "cuda_spans", which its C++ launchers apply: softmax_plan.h).

The rules read bytes per row, element size, alignment and the SM count, never a table of tuned widths; their
parameters (`DEFAULTS`, for a GPU never tuned) are the data a GPU's plan table (plans/<device key>.json, written by
`fuselab tune softmax`) overrides; figures behind the values are in docs/ops/softmax.md. Pure functions: testable
without a GPU.

- padded width (next power of 2) <= row_max: `rows`, rows held whole in registers, several short rows to a program
  (a tile of about tile_bytes). Parameters keyed by the padded width ("held_bf16", "maxnreg", "ahead") belong to the
  compiled tile, not to a user's width: every width padding to that tile gets them.
- wider, where programs can wait for each other (a GPU, not the interpreter): `split` (`split_pairs` for bf16 rows
  of even width), a row cut into equal spans of at most `split[itemsize]` columns, one program each, as long as a
  row's programs fit on the GPU at once (spans <= SMs); finer for a tensor of few rows (`split_fill`).
- otherwise: `looped`, an online softmax (reads the row twice).
- rows of one column, in both directions: `single`, elementwise (y is 1, or NaN where x is not finite).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from fuselab.ops import tuning

FOLDER = Path(__file__).parent

DEFAULTS: dict[str, object] = {
    "row_max": 32768,  # widest padded row held whole by one program (forward)
    "backward_row_max": 16384,  # the backward holds y and dy
    "tile_bytes": {"4": 4096, "2": 4096},  # short rows: rows per program so that a tile moves about this many bytes
    "least_rows": {"4": 1, "2": 1},  # ... and at least this many rows of at most tile_bytes to a tile, by element size
    "short_warps": {"4": 1, "2": 4},  # warps for a tile of tile_bytes, by element size
    "mid_bytes": 8192,  # tiles up to this: mid_warps
    "mid_warps": 4,
    "wide_warps": {"4": 16, "2": 16},  # tiles above mid_bytes, by element size
    "widest_fp32": [16384, 32],  # fp32 rows of at least this many columns: these warps
    "split": {"4": [16384, 16], "2": [8192, 8]},  # (columns, warps) per program of a split row, by element size
    "split_pairs": [8192, 4],  # bf16 rows of even width held as int32 pairs
    # Split rows of a tensor of few rows: spans halved, down to split_fill[1] columns, while the grid holds fewer than
    # split_fill[0] programs per SM (0: never); a row's spans still fit on the GPU at once
    "split_fill": [0, 4096],
    "loop": [4096, 8],  # looped kernel: (columns per step, warps)
    # Fitted to one GPU's registers and SMs, so none by default (plans/nvidia-h200-sm90.json has the H200's):
    "ahead": {},  # {"itemsize": [padded width, warps]}: fp16 rows from that width run persistent, a row ahead
    # {"itemsize:padded width": [warps, registers]}: the forward rows kernel's warps and cap on registers per thread,
    # fitted together (the cap on fewer warps, each thread holding more values, spilled: 3.16x on the H200)
    "maxnreg": {},
    "held_bf16": {},  # {"padded width": [warps, cap or None]}: bf16 rows held in bf16 between the passes
    "edge_min_bytes": 128,  # misaligned rows at least this long: an aligned bulk of 16-byte vectors + edges
    "edge_warp_bytes": 4096,  # rows read with edges, shorter than a tile: at most one warp per this many tile bytes
    "scalar_tile": [512, 4],  # rows read element by element (misaligned, under edge_min_bytes): (elements, warps)
    "scalar_wide": [64, 1],  # ... those padded to at least this many columns: tiles on this many warps
    # ... and a tensor of many such rows, loaded two elements or more at a time: rows per program doubled while a
    # thread holds at most scalar_grow[0] values and the grid keeps at least scalar_grow[1] programs per SM (0: never)
    "scalar_grow": [16, 0],
    # Rows of one column, elementwise (`single`): (input bytes per program, warps); 0 bytes: the rows kernels instead
    "single_column": [4096, 4],
    # Rows tiles of a small tensor: rows per program halved (down to 1) until the grid holds this many warps per SM
    "fill_warps_per_sm": 6,
    # Backward of wide rows, fewer than below_rows_per_sm per SM: a row split over programs of `blocks` columns (the
    # smallest giving programs_per_sm programs per SM, within [min, max]), partial sums of y * dy met in a second kernel
    "backward_split": {"below_rows_per_sm": 2, "programs_per_sm": 4, "blocks": [1024, 4096]},
    # The CUDA impl's span rules (softmax_plan.h's SpanRules, handed to its launchers by cuda.configure): a row wider
    # than its warp kernels take is cut into the fewest spans a block of at most `threads` holds (`hold` values a thread
    # forward, `backward_hold` 16-bit values of y and of dy backward, half as many fp32 ones); where rows are fewer than
    # SMs and a row is cut anyway or at least `split_row_bytes` long, finer, down to spans of `min_span_bytes`, while at
    # most `blocks_per_sm` blocks per SM run. Blocks of up to 512 threads cut rows; one of more (fewer values a thread:
    # softmax_plan.h's wide_hold, 64 registers) is used where it holds a row whole. Rows read one element at a time go
    # to the warp kernels up to `scalar_warp_width_fp32` / `_16bit` columns. Contiguous rows of no whole number of
    # 16-byte packs, up to `staged_row_bytes_fp32` / `_16bit` long (0: none), and of whole packs up to
    # `staged_packed_row_bytes`, are staged: a block copies about `staged_tile_bytes` of each tensor's rows (fewer where
    # that leaves fewer than `staged_blocks_per_sm` blocks per SM) into shared memory in packs and back. Rows of no
    # whole number of packs, whose tensors' rows all start at one offset from a 16-byte boundary, from 512 bytes up to
    # 1024 columns and `edge_warp_row_bytes` (0: none), go to the edge warp kernels: a warp a row, its aligned bulk in
    # packs and its edges one element a lane. Rows of one column run elementwise (y = 1, or NaN where x is not finite)
    # where `single_column_elementwise` is 1. With `one_wave` 1, few rows whose spans' blocks would not all run at once
    # (a second wave, mostly idle, waiting out the first) are cut finer where smaller blocks, more of them an SM, make
    # the grid one wave (softmax_plan.h's resident_blocks: by registers alone). Staged forward rows of up to
    # `staged_lane_columns` columns (at most 16) go one to a lane (no shuffles), wider ones to groups of lanes holding
    # up to 4 values each (0: all to groups).
    # The kernels are compiled for threads <= 1024, hold <= 32, backward_hold <= 32, scalar warp widths <= 1024,
    # staged rows <= 2048 bytes, staged tiles of 256-16384 bytes and edge warp rows <= 4096 bytes.
    "cuda_spans": {
        "threads": 1024,
        "hold": 32,
        "backward_hold": 32,
        "min_span_bytes": 8192,
        "split_row_bytes": 131072,
        "blocks_per_sm": 2,
        "scalar_warp_width_fp32": 1024,
        "scalar_warp_width_16bit": 512,
        "staged_row_bytes_fp32": 128,
        "staged_row_bytes_16bit": 768,
        "staged_packed_row_bytes": 0,
        "staged_tile_bytes": 8192,
        "staged_blocks_per_sm": 4,
        "edge_warp_row_bytes": 0,
        "single_column_elementwise": 0,
        "one_wave": 0,
        "staged_lane_columns": 0,
    },
}

READS = ("vectors", "edges", "scalars")  # how a launch reads its rows (launch.reads): the rows plans depend on it


@dataclass(frozen=True)
class Plan:
    """How one launch covers the rows.

    kernel: a name in launch.FORWARD or launch.BACKWARD ("rows", "rows_ahead", "split", "split_pairs", "looped",
    "single").
    block: columns per tile (rows: the padded row; split: the most columns of one program's span; looped: one step;
    single: rows per program).
    rows: rows per program (rows kernels). num_warps: warps per program. maxnreg: registers per thread at most (ptxas
    spills the rest), so more programs fit on an SM; None: no cap. hold: rows kernel, 16-bit rows held in their
    storage type between the passes (half the registers).
    """

    kernel: str
    block: int
    rows: int = 1
    num_warps: int = 4
    maxnreg: int | None = None
    hold: bool = False


def rule_params(key: str | None) -> dict:
    """The rules' parameters for GPU `key` (its plan table over DEFAULTS; None: DEFAULTS)."""
    return tuning.params(DEFAULTS, FOLDER, key)


def next_power_of_2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def warps(elements: int, itemsize: int, p: dict) -> int:
    """Warps for a program holding `elements` values of `itemsize` bytes."""
    nbytes = elements * itemsize
    if nbytes <= p["tile_bytes"][str(itemsize)]:
        return p["short_warps"][str(itemsize)]
    if nbytes <= p["mid_bytes"]:
        return p["mid_warps"]
    widest, widest_warps = p["widest_fp32"]
    return widest_warps if itemsize == 4 and elements >= widest else p["wide_warps"][str(itemsize)]


def rows_plan(block: int, itemsize: int, p: dict, reads: str = "vectors") -> Plan:
    """Whole rows of padded width `block`, several to a program up to a tile of tile_bytes[itemsize], and at least
    least_rows[itemsize] where a row fits in a tile (16-bit rows of 524-601 alone in a 2 KiB tile took 1.05-1.14x the
    time of two in 4 KiB on the H200, where rows of 129-325 took 0.76-0.94x in 2 KiB tiles); where `reads` is
    "scalars", a tile of scalar_tile's elements and warps (four elements a thread: on the H200 as fast as torch's
    or faster at widths 1-52, where tiles of 4 KiB on one warp took up to 1.6x its time), and rows wider than that
    tile one to a program on the warps a row read in vectors gets (on scalar_wide's warps, fp32 sliced rows of 9248
    held 512 values a thread and took 8.6x their contiguous time on the H200). Rows read with "edges"
    that are shorter than edge_warp_bytes run on at most one warp per edge_warp_bytes of tile, whatever the tile
    (a tile of several such rows took up to 4x as long on four warps as on one; a 16-bit row of 524-999 alone in a
    2 KiB tile 1.7-2.7x); rows read element by element and padded to at least
    scalar_wide[0] columns (16-bit rows of 33-63) on scalar_wide[1] warps (half the time of four at 39-55 columns).
    docs/ops/softmax.md has the figures."""
    if reads == "scalars":
        elements, num_warps = p["scalar_tile"]
        if block > elements:
            return Plan("rows", block, 1, warps(block, itemsize, p))
        wide_block, wide_warps = p["scalar_wide"]
        return Plan("rows", block, elements // block, wide_warps if block >= wide_block else num_warps)
    tile, row_bytes = p["tile_bytes"][str(itemsize)], block * itemsize
    rows = max(tile // row_bytes, p["least_rows"][str(itemsize)]) if row_bytes <= tile else 1
    num_warps = warps(block * rows, itemsize, p)
    if reads == "edges" and block * itemsize < p["edge_warp_bytes"]:
        num_warps = min(num_warps, max(1, block * rows * itemsize // p["edge_warp_bytes"]))
    return Plan("rows", block, rows, num_warps)


def choose_forward(width: int, itemsize: int, bf16: bool, sms: int | None, p: dict, reads: str = "vectors") -> Plan:
    """The forward plan for rows of `width` elements of `itemsize` bytes (bf16: bfloat16 storage). sms: the GPU's
    SM count where programs can wait for each other (split rows), None where they cannot (the interpreter). reads:
    how the rows are read (READS); the register caps (`maxnreg`) and rows one ahead (`ahead`, which has no edges
    path: it would read a misaligned row element by element) hold for rows read in vectors only; a cap brings the
    warps it was fitted at."""
    if width == 1 and (single := single_plan(itemsize, p)):
        return single
    block = next_power_of_2(width)
    if block <= p["row_max"]:
        if bf16 and str(block) in p["held_bf16"]:
            num_warps, cap = p["held_bf16"][str(block)]
            return Plan("rows", block, 1, num_warps, cap, hold=True)
        ahead = p["ahead"].get(str(itemsize)) if not bf16 and reads == "vectors" else None
        if ahead and block >= ahead[0]:
            return Plan("rows_ahead", block, 1, ahead[1])
        plan = rows_plan(block, itemsize, p, reads)
        cap = p["maxnreg"].get(f"{itemsize}:{block}") if reads == "vectors" else None
        return replace(plan, num_warps=cap[0], maxnreg=cap[1]) if cap else plan
    if bf16 and width % 2 == 0:
        kernel, (chunk, num_warps) = "split_pairs", p["split_pairs"]
    else:
        kernel, (chunk, num_warps) = "split", p["split"][str(itemsize)]
    if sms is not None and ceil_div(width, chunk) <= sms:
        return Plan(kernel, chunk, 1, num_warps)
    return Plan("looped", *p["loop"][:1], 1, p["loop"][1])


def choose_backward(width: int, itemsize: int, p: dict, reads: str = "vectors") -> Plan:
    """The backward plan: whole rows up to backward_row_max, else looped (which splits a row over programs where
    there are few rows: `backward_split_block`)."""
    if width == 1 and (single := single_plan(itemsize, p)):
        return single
    block = next_power_of_2(width)
    if block <= p["backward_row_max"]:
        return rows_plan(block, itemsize, p, reads)
    return Plan("looped", p["loop"][0], 1, p["loop"][1])


def single_plan(itemsize: int, p: dict) -> Plan | None:
    """Rows of one column run elementwise, single_column[0] bytes of input a program on single_column[1] warps (a
    row of one value needs no reduction: the rows kernels read one element a row, in tiles of 512 rows); None where
    single_column[0] is 0."""
    block_bytes, num_warps = p["single_column"]
    return Plan("single", max(16, block_bytes // itemsize), 1, num_warps) if block_bytes else None


def fill_rows(rows: int, num_warps: int, n_rows: int, sms: int, p: dict) -> int:
    """Rows per program of a rows plan (`rows` a power of 2, on `num_warps` warps) for a tensor of `n_rows` rows:
    halved, down to 1, while the grid would hold fewer than fill_warps_per_sm warps per SM. A small tensor's few
    tiles leave most SMs idle: 3694 x 71 bf16 took 3.3 us in tiles of 16 rows on one warp (231 warps), 2.0 in tiles
    of 4 (docs/ops/softmax.md)."""
    least = p["fill_warps_per_sm"] * sms
    while rows > 1 and ceil_div(n_rows, rows) * num_warps < least:
        rows //= 2
    return rows


def grow_rows(rows: int, block: int, num_warps: int, align: int, n_rows: int, sms: int, p: dict) -> int:
    """Rows per program of a rows plan over rows read element by element (`rows` of padded width `block` on
    `num_warps` warps, loads of `align` elements: the width's and strides' common factor) for a tensor of `n_rows`
    rows: where loads are of two elements or more, doubled while a thread holds at most scalar_grow[0] values and the
    grid keeps at least scalar_grow[1] programs per SM. Each thread then has more loads in flight (bf16 1 553 741 x 12
    took 0.70x the time on the H200); rows loaded one element at a time keep their tiles (600 001 x 27 took 1.08x
    grown, 14 380 100 x 1 2.4x), and so does a small tensor (docs/ops/softmax.md)."""
    most, per_sm = p["scalar_grow"]
    while (
        align > 1
        and per_sm
        and 2 * rows * block <= most * 32 * num_warps
        and ceil_div(n_rows, 2 * rows) >= per_sm * sms
    ):
        rows *= 2
    return rows


def split_chunk(chunk: int, n_rows: int, width: int, sms: int, p: dict) -> int:
    """Columns per program of a split plan (spans of at most `chunk`) for a tensor of `n_rows` rows of `width`: halved,
    down to split_fill[1], while the grid would hold fewer than split_fill[0] programs per SM, as long as a row's spans
    stay at most `sms`. Few rows of fp32 36 799 ran in 0.78x the time on spans of 8192 (not 16 384) on the H200, 591
    rows of 43 468 in 1.31x (docs/ops/softmax.md)."""
    per_sm, smallest = p["split_fill"]
    while chunk // 2 >= smallest and ceil_div(width, chunk // 2) <= sms:
        if n_rows * ceil_div(width, chunk) >= per_sm * sms:
            break
        chunk //= 2
    return chunk


def backward_split_block(rows: int, width: int, sms: int, p: dict) -> int | None:
    """Columns per program where a backward of `rows` rows of `width` splits its rows over programs (fewer rows
    than below_rows_per_sm per SM), else None (one looped program per row). The block is the largest power of 2 in
    backward_split["blocks"] that still gives programs_per_sm programs per SM."""
    q = p["backward_split"]
    if rows >= q["below_rows_per_sm"] * sms:
        return None
    smallest, largest = q["blocks"]
    block = largest
    while block > smallest and rows * ceil_div(width, block) < q["programs_per_sm"] * sms:
        block //= 2
    return block


def split_spans(width: int, chunk: int, vec: int) -> tuple[int, int, int]:
    """(programs per row, columns per program, padded tile) for a row of `width` split into equal spans of at most
    `chunk` columns, each a multiple of `vec` (so every span starts on a vector boundary of an aligned row)."""
    parts = ceil_div(width, chunk)
    span = min(chunk, ceil_div(ceil_div(width, parts), vec) * vec)
    parts = ceil_div(width, span)
    return parts, span, next_power_of_2(span)


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)
