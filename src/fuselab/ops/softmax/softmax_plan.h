// The CUDA softmax's plans: which kernel and how a row is cut into spans, as rules over rows, width, element size and
// the SM count. Plain C++ (no CUDA): softmax.cu launches by them, and tests/ops/test_softmax.py compiles
// them with a host compiler to check the rules without a GPU. The rules' parameters (`SpanRules`) are plan-table data
// (fuselab.ops.softmax.plans.DEFAULTS["cuda_spans"], overridden per GPU by plans/<device key>.json), handed to the
// launchers by the binding; the limits below are what the kernels are compiled for.
#pragma once

#include <algorithm>
#include <climits>
#include <cstdint>
#include <initializer_list>

namespace fuselab {
namespace softmax_plan {

constexpr int kSpanThreads = 1024;                // most threads of a span kernel's block
constexpr int kFullHoldThreads = 512;             // blocks up to this many threads: a thread holds up to the limits below
constexpr int kMaxElemsPerThread = 32;            // forward: fp32 values a thread holds at most
constexpr int kBackwardMaxElemsPerThread = 32;    // backward: values of y (and as many of dy) a thread holds at most
constexpr int64_t kWarpMaxWidth = 1024;           // forward rows up to this: the warp kernel
constexpr int64_t kBackwardWarpMaxWidth = 512;    // backward rows up to this: its warp kernel
constexpr int kBackwardWarpMaxElems = 16;         // ... whose rows a group of 32 lanes holds in 16 values a lane
constexpr int kStagedThreads = 256;               // threads of a staged kernel's block
constexpr int64_t kStagedMaxRowBytes = 2048;      // staged rows are at most this long (the warp kernels' widths)
constexpr int64_t kStagedMinTileBytes = 256;      // the rules' staged_tile_bytes: within these bounds
constexpr int64_t kStagedMaxTileBytes = 16384;
constexpr int kStagedMaxLaneColumns = 16;         // the rules' staged_lane_columns: at most this (values a lane)
constexpr int64_t kEdgeWarpMaxRowBytes = 4096;    // the rules' edge_warp_row_bytes: at most this (1024 fp32 columns)
constexpr int64_t kEdgeWarpLeastRowBytes = 512;   // edge warp rows: at least a 16-byte pack a lane

// Values a thread of a block of more than kFullHoldThreads threads holds at most: such kernels are compiled for
// 1024 threads, 64 registers a thread, and these are the most they keep without spilling at sm_90 (ptxas -v): packs
// of 16 bytes, forward 32 values, backward 16 fp32 values of y and 16 of dy, or 32 16-bit ones (8 to a pack, held as
// stored); read one by one (vec 1), 8.
constexpr int wide_hold(int vec, bool backward) {
  return vec == 1 ? 8 : backward ? (vec == 8 ? 32 : 16) : 32;
}

// The span rules' parameters (plan-table data; the binding checks them against the limits above).
struct SpanRules {
  int threads;                      // most threads of a span block: a power of 2 in 128..kSpanThreads
  int hold;                         // forward: values a thread holds at most (about as many given), <= 32
  int backward_hold;                // backward: 16-bit values of y (and of dy) a thread holds, <= 32; fp32 rows
                                    // half as many (blocks past 512 threads: 16 fp32 ones, `wide_hold`)
  int64_t min_span_bytes;           // few rows: spans no shorter than this
  int64_t split_row_bytes;          // few rows: rows at least this long are cut
  int64_t blocks_per_sm;            // few rows: cut into spans while at most this many blocks run per SM
  int64_t scalar_warp_width_fp32;   // fp32 rows read one element at a time: the warp kernels up to this width
  int64_t scalar_warp_width_16bit;  // fp16 and bf16 rows read one element at a time: the same
  int64_t staged_row_bytes_fp32;    // contiguous fp32 rows up to this long, no whole number of 16-byte packs: staged
  int64_t staged_row_bytes_16bit;   // ... fp16 and bf16 rows (0: none)
  int64_t staged_packed_row_bytes;  // ... rows of whole packs up to this long: staged too (0: none)
  int64_t staged_tile_bytes;        // about this many bytes of each tensor's rows a staged block
  int64_t staged_blocks_per_sm;     // ... fewer for a tensor of few rows, until about this many blocks per SM run
  int64_t edge_warp_row_bytes;      // rows of no whole number of packs up to this long: a warp each, with edges
  int64_t single_column_elementwise;  // 1: rows of one column elementwise (y = 1, or NaN), 0: as other rows
  int64_t one_wave;                 // 1: few rows whose spans' blocks would not all run at once are cut finer where
                                    // finer spans (smaller blocks, more of them an SM) make the grid one wave
  int64_t staged_lane_columns;      // staged forward rows of up to this many columns: one lane a row (0: none)
};

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

inline int next_pow2(int64_t n) {
  int p = 1;
  while (p < n) p *= 2;
  return p;
}

struct SpanPlan {
  int parts;     // spans per row (1: whole rows); 0: a row needs more spans than SMs (the looped kernels)
  int64_t span;  // columns per span, a multiple of the pack
  int threads;   // per block, 128..kSpanThreads
  int iters;     // packs per thread (the launcher rounds it up past 8)
};

// Values a thread of a block of `threads` holds at most: `hold`, and past kFullHoldThreads what wide_hold allows.
inline int hold_at(int threads, int hold, int vec, bool backward) {
  return threads <= kFullHoldThreads ? hold : std::min(hold, wide_hold(vec, backward));
}

// Blocks of `plan` that run at once on `sms` SMs, by registers alone: a span kernel is compiled for at most 64
// registers a thread (1024 threads an SM) where a thread's values fit them (`wide_hold`), else 128 (512 threads).
inline int64_t resident_blocks(const SpanPlan& plan, int vec, bool backward, int sms) {
  const int iters = plan.iters <= 8 ? plan.iters : plan.iters <= 16 ? 16 : 32;  // the instance the launcher runs
  const int64_t per_sm = (iters * vec <= wide_hold(vec, backward) ? 1024 : 512) / plan.threads;
  return per_sm * sms;
}

// A row cut into the fewest spans a block of at most kFullHoldThreads threads holds in registers (`hold` values a
// thread at most, about as many given), or left whole where one block of r.threads (past kFullHoldThreads: fewer
// values a thread, `hold_at`) holds it: such blocks only pay where they spare a meeting (where rows are cut anyway,
// blocks of 512 threads, two to an SM, took less time than blocks of 1024, one to an SM). Where rows are fewer than
// SMs and a row is either cut anyway or at least r.split_row_bytes long, it is cut finer, down to spans of
// r.min_span_bytes, while the grid stays within r.blocks_per_sm blocks per SM (rounded down: blocks past what runs at
// once would start only as the first ones leave, a second wave waiting out the first's meetings): a meeting costs its
// blocks a few microseconds, which only rows that long repay. Spans are at most `sms`, so a row's blocks all fit on
// the GPU at once and may wait for each other. `vec`: elements per pack (spans are whole packs).
inline SpanPlan span_plan(int64_t rows, int64_t width, int vec, int itemsize, int hold, bool backward, int sms,
                          const SpanRules& r) {
  const int full = std::min(r.threads, kFullHoldThreads);
  int64_t parts = ceil_div(width, (int64_t)full * hold);
  if (parts > 1 && width <= (int64_t)r.threads * hold_at(r.threads, hold, vec, backward)) parts = 1;
  const int64_t row_bytes = width * itemsize;
  // spans of `p` parts: the fewest threads (128 at least) that hold one, up to `full` at `hold` values each, else
  // r.threads
  const auto cut = [&](int64_t p) -> SpanPlan {
    const int64_t span = ceil_div(ceil_div(width, p), vec) * vec;
    const int64_t by_hold = std::max<int64_t>(128, next_pow2(ceil_div(span, hold)));
    const int64_t threads = by_hold <= full ? by_hold : r.threads;
    return {(int)p, span, (int)threads, (int)ceil_div(span, threads * vec)};
  };
  const bool few = rows < sms && (parts > 1 || row_bytes >= r.split_row_bytes);
  const int64_t finest = std::min(row_bytes / r.min_span_bytes, (int64_t)sms);
  if (few) parts = std::max(parts, std::min(r.blocks_per_sm * sms / rows, finest));
  if (parts > sms || rows * parts > INT_MAX) return {0, 0, 0, 0};
  SpanPlan plan = cut(parts);
  if (few && r.one_wave) {  // a grid past what runs at once: finer spans, where some make it one wave
    for (int64_t p = parts + 1; rows * plan.parts > resident_blocks(plan, vec, backward, sms) && p <= finest; ++p) {
      const SpanPlan finer = cut(p);
      if (rows * p <= resident_blocks(finer, vec, backward, sms)) plan = finer;
    }
  }
  return plan;
}

// The forward's plan for rows wider than kWarpMaxWidth (r.hold values a thread at most).
inline SpanPlan forward_plan(int64_t rows, int64_t width, int vec, int itemsize, int sms, const SpanRules& r) {
  return span_plan(rows, width, vec, itemsize, std::min(r.hold, kMaxElemsPerThread), false, sms, r);
}

// The backward's plan for rows wider than kBackwardWarpMaxWidth: r.backward_hold 16-bit values of y and of dy a thread,
// or half as many fp32 ones (the same registers: 16-bit packs are held as stored).
inline SpanPlan backward_plan(int64_t rows, int64_t width, int vec, int itemsize, int sms, const SpanRules& r) {
  const int hold = std::max(1, r.backward_hold * 2 / itemsize);
  return span_plan(rows, width, vec, itemsize, std::min(hold, kBackwardMaxElemsPerThread), true, sms, r);
}

// Whether rows of `width` go to the warp kernels: up to their limit where read in 16-byte packs (`vectorized`),
// else up to the rules' scalar warp width for the element size too (a warp reading a row of 513-1023 16-bit values
// one at a time took up to 1.6x the time of a span block reading the same row's aligned bulk in packs).
inline bool warp_rows(int64_t width, int itemsize, bool vectorized, bool backward, const SpanRules& r) {
  const int64_t limit = backward ? kBackwardWarpMaxWidth : kWarpMaxWidth;
  const int64_t scalar = itemsize == 4 ? r.scalar_warp_width_fp32 : r.scalar_warp_width_16bit;
  return width <= (vectorized ? limit : std::min(limit, scalar));
}

// A staged launch: `rows` rows a block (a multiple of 8, so every block's rows start on a 16-byte boundary), `group`
// threads a row in the math (a power of 2 <= 32), each holding `items` values in registers (a power of 2: <= 4
// where 1 < group < 32, <= kStagedMaxLaneColumns where group is 1, else <= 32); rows 0: not staged.
struct StagedPlan {
  int rows;
  int group;
  int items;
};

// Whether rows of `width` go through shared memory (the staged kernels): rows of no whole number of 16-byte packs,
// which the warp kernels would read one element at a time, up to r.staged_row_bytes_fp32 / _16bit long (past those,
// a thread holds so many values that the warp kernels win), and rows of whole packs up to r.staged_packed_row_bytes
// (the warp kernels read those in packs, but a row of one or two packs is little work for a thread). A block copies
// its rows, contiguous in memory, in 16-byte packs into shared memory (about r.staged_tile_bytes of each tensor, fewer
// where that leaves fewer than about r.staged_blocks_per_sm blocks per SM, and rows enough for every thread), does the
// math there (a row's values in its group's registers), and copies them out the same way. The launcher also asks for
// contiguous rows of 16-byte aligned tensors. A tensor of fewer rows than about r.staged_blocks_per_sm blocks per SM
// of a block's groups is not staged: it would wait out each block's copy in, math and copy out one after the other.
// docs/ops/softmax.md has the measurements the limits come from.
inline StagedPlan staged_plan(int64_t rows, int64_t width, int itemsize, int sms, const SpanRules& r,
                              bool backward = false) {
  const int64_t row_bytes = width * itemsize;
  const int64_t unpacked = itemsize == 4 ? r.staged_row_bytes_fp32 : r.staged_row_bytes_16bit;
  const int64_t most = row_bytes % 16 == 0 ? r.staged_packed_row_bytes : unpacked;
  if (width < 1 || row_bytes > std::min(most, kStagedMaxRowBytes)) return {0, 0, 0};
  // forward rows of up to r.staged_lane_columns columns: a lane a row (no shuffles; in SASS at sm_90 a row of 10 fp32
  // took 5.8 instructions a warp in the math, 13.2 on 4 lanes of 4 values); else groups of up to 4 values a lane
  const bool lane = !backward && width <= r.staged_lane_columns;
  const int group = lane ? 1 : std::min<int>(32, next_pow2(ceil_div(width, 4)));
  const int64_t least = kStagedThreads / group;
  const int64_t fill = ceil_div(rows, std::max<int64_t>(1, sms * r.staged_blocks_per_sm));
  if (fill < least) return {0, 0, 0};
  const int64_t block = std::max(least, std::min(r.staged_tile_bytes / row_bytes, fill));
  return {(int)(ceil_div(block, 8) * 8), group, next_pow2(ceil_div(width, group))};
}

// Shared memory bytes a staged block takes: its rows of x (backward: of y and of dy).
inline int64_t staged_smem_bytes(const StagedPlan& p, int64_t width, int itemsize, bool backward) {
  return (backward ? 2 : 1) * (int64_t)p.rows * width * itemsize;
}

// Whether rows of `width` go to the edge warp kernels (forward and backward): rows of no whole number of 16-byte
// packs (not `vectorized`) whose tensors' rows all start at one offset from a 16-byte boundary (`same_phase`), up to
// kWarpMaxWidth columns and r.edge_warp_row_bytes long. A warp per row reads its 16-byte aligned bulk in packs and its
// few edge elements one a lane, where the warp kernels would read the row one element at a time and the span kernels
// give it a block of at least 128 threads and block-wide reductions. Rows shorter than kEdgeWarpLeastRowBytes (a pack
// a lane) leave lanes idle and go to the kernels that share a warp between rows.
inline bool edge_warp_rows(int64_t width, int itemsize, bool vectorized, bool same_phase, const SpanRules& r) {
  const int64_t row_bytes = width * itemsize;
  return !vectorized && same_phase && width <= kWarpMaxWidth && row_bytes >= kEdgeWarpLeastRowBytes &&
         row_bytes <= r.edge_warp_row_bytes;
}

// Whether `r` is within what the kernels are compiled for (the binding refuses rules that are not).
inline bool valid_rules(const SpanRules& r) {
  const bool pow2 = r.threads > 0 && (r.threads & (r.threads - 1)) == 0;
  return pow2 && r.threads >= 128 && r.threads <= kSpanThreads && r.hold >= 1 && r.hold <= kMaxElemsPerThread &&
         r.backward_hold >= 1 && r.backward_hold <= kBackwardMaxElemsPerThread && r.min_span_bytes >= 16 &&
         r.split_row_bytes >= 1 && r.blocks_per_sm >= 1 && r.scalar_warp_width_fp32 >= 1 &&
         r.scalar_warp_width_fp32 <= kWarpMaxWidth && r.scalar_warp_width_16bit >= 1 &&
         r.scalar_warp_width_16bit <= kWarpMaxWidth && r.staged_row_bytes_fp32 >= 0 &&
         r.staged_row_bytes_fp32 <= kStagedMaxRowBytes && r.staged_row_bytes_16bit >= 0 &&
         r.staged_row_bytes_16bit <= kStagedMaxRowBytes && r.staged_packed_row_bytes >= 0 &&
         r.staged_packed_row_bytes <= kStagedMaxRowBytes && r.staged_tile_bytes >= kStagedMinTileBytes &&
         r.staged_tile_bytes <= kStagedMaxTileBytes && r.staged_blocks_per_sm >= 1 && r.edge_warp_row_bytes >= 0 &&
         r.edge_warp_row_bytes <= kEdgeWarpMaxRowBytes && r.single_column_elementwise >= 0 &&
         r.single_column_elementwise <= 1 && r.one_wave >= 0 && r.one_wave <= 1 && r.staged_lane_columns >= 0 &&
         r.staged_lane_columns <= kStagedMaxLaneColumns;
}

// Whether a pointer is 16-byte aligned.
inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Whether tensors of `itemsize`-byte elements are read in 16-byte packs by the warp and looped kernels: every row
// start 16-byte aligned, no pack across a row's end.
inline bool vectorizable(std::initializer_list<const void*> ptrs, std::initializer_list<int64_t> strides, int64_t width,
                         int itemsize) {
  const int64_t v = 16 / itemsize;
  bool ok = width % v == 0;
  for (const void* p : ptrs) ok = ok && aligned16(p);
  for (int64_t s : strides) ok = ok && s % v == 0;
  return ok;
}

// Whether every row of every tensor starts at the same offset from a 16-byte boundary, so the span kernels can read
// all of them in packs between the edges of the first tensor's row.
inline bool same_phase(std::initializer_list<const void*> ptrs, std::initializer_list<int64_t> strides, int itemsize) {
  const int64_t v = 16 / itemsize;
  const uintptr_t phase = reinterpret_cast<uintptr_t>(*ptrs.begin()) % 16;
  const int64_t stride_phase = *strides.begin() % v;
  bool ok = true;
  for (const void* p : ptrs) ok = ok && reinterpret_cast<uintptr_t>(p) % 16 == phase;
  for (int64_t s : strides) ok = ok && s % v == stride_phase;
  return ok;
}

// The kernels a launch runs (softmax.cu's header lists them).
enum class Kernels : int { single = 0, staged = 1, edge_warp = 2, warp = 3, spans = 4, looped = 5 };

// Where a launch over rows x width of these tensors goes: its kernels; whether rows are read in 16-byte packs by
// the warp and looped kernels (`vectorized`) and in packs between edges by the span kernels (`same_phase`); the
// staged plan (kernels staged) and the span plan (kernels spans).
struct Route {
  Kernels kernels;
  bool vectorized;
  bool same_phase;
  StagedPlan staged;
  SpanPlan spans;
};

// The route of a forward (backward: the backward) over tensors at `ptrs` with row strides `strides` (elements; x
// and y, or y, dy and dx), one place for the launchers and for the scratch they need:
// rows of one column elementwise (rules' single_column_elementwise); staged where staged_plan takes the rows and the
// tensors are 16-byte aligned and contiguous (a single row, or strides equal to the width); the edge warp kernels;
// the warp kernels; else the span plan, looped where it has no spans (parts 0).
inline Route route(std::initializer_list<const void*> ptrs, std::initializer_list<int64_t> strides, int64_t rows,
                   int64_t width, int itemsize, int sms, bool backward, const SpanRules& r) {
  Route out{Kernels::single, false, false, {0, 0, 0}, {0, 0, 0, 0}};
  if (width == 1 && r.single_column_elementwise) return out;
  out.staged = staged_plan(rows, width, itemsize, sms, r, backward);
  bool contiguous = out.staged.rows > 0;
  for (const void* p : ptrs) contiguous = contiguous && aligned16(p);
  for (int64_t s : strides) contiguous = contiguous && (rows == 1 || s == width);
  if (contiguous) {
    out.kernels = Kernels::staged;
    return out;
  }
  out.vectorized = vectorizable(ptrs, strides, width, itemsize);
  out.same_phase = same_phase(ptrs, strides, itemsize);
  if (edge_warp_rows(width, itemsize, out.vectorized, out.same_phase, r)) {
    out.kernels = Kernels::edge_warp;
  } else if (warp_rows(width, itemsize, out.vectorized, backward, r)) {
    out.kernels = Kernels::warp;
  } else {
    const int vec = out.same_phase ? 16 / itemsize : 1;
    out.spans = backward ? backward_plan(rows, width, vec, itemsize, sms, r)
                         : forward_plan(rows, width, vec, itemsize, sms, r);
    out.kernels = out.spans.parts == 0 ? Kernels::looped : Kernels::spans;
  }
  return out;
}

// Scratch elements a launch of `route` over `rows` rows needs: {int32 counters, float partials}; {0, 0} where its
// rows are not cut into spans that meet.
struct ScratchElems {
  int64_t counters, partials;
};

inline ScratchElems scratch_elems(int64_t rows, const Route& route) {
  if (route.kernels != Kernels::spans || route.spans.parts <= 1) return {0, 0};
  return {1 + rows, 2 * rows * route.spans.parts};
}

}  // namespace softmax_plan
}  // namespace fuselab
