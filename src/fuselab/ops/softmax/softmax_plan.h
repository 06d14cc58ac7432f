// The CUDA softmax's plans: which kernel and how a row is cut into spans, as rules over rows, width, element size and
// the SM count. Plain C++ (no CUDA): softmax.cu launches by them, and tests/ops/test_softmax.py compiles
// them with a host compiler to check the rules without a GPU. The rules' parameters (`SpanRules`) are plan-table data
// (fuselab.ops.softmax.plans.DEFAULTS["cuda_spans"], overridden per GPU by plans/<device key>.json), handed to the
// launchers by the binding; the limits below are what the kernels are compiled for.
#pragma once

#include <algorithm>
#include <climits>
#include <cstdint>

namespace fuselab {
namespace softmax_plan {

constexpr int kSpanThreads = 512;                 // most threads of a span kernel's block (its launch bounds)
constexpr int kMaxElemsPerThread = 32;            // forward: fp32 values a thread holds at most
constexpr int kBackwardMaxElemsPerThread = 16;    // backward: values of y (and as many of dy) a thread holds at most
constexpr int64_t kWarpMaxWidth = 1024;           // forward rows up to this: the warp kernel
constexpr int64_t kBackwardWarpMaxWidth = 512;    // backward rows up to this: its warp kernel

// The span rules' parameters (plan-table data; the binding checks them against the limits above).
struct SpanRules {
  int threads;              // most threads of a span block: a power of 2 in 128..kSpanThreads
  int hold;                 // forward: values a thread holds at most (about as many given), <= kMaxElemsPerThread
  int backward_hold;        // backward: values of y (and of dy) a thread holds, <= kBackwardMaxElemsPerThread
  int64_t min_span_bytes;   // few rows: spans no shorter than this
  int64_t split_row_bytes;  // few rows: rows at least this long are cut
  int64_t blocks_per_sm;    // few rows: cut into spans until about this many blocks run per SM
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

// A row cut into the fewest spans a block of at most `r.threads` holds in registers (`hold` values a thread at most,
// about as many given). Where rows are fewer than SMs and a row is either cut anyway or at least r.split_row_bytes
// long, it is cut finer, down to spans of r.min_span_bytes, until about r.blocks_per_sm blocks per SM run: a meeting
// costs its blocks a few microseconds, which only rows that long repay. Spans are at most `sms`, so a row's blocks
// all fit on the GPU at once and may wait for each other. `vec`: elements per pack (spans are whole packs).
inline SpanPlan span_plan(int64_t rows, int64_t width, int vec, int itemsize, int hold, int sms, const SpanRules& r) {
  int64_t parts = ceil_div(width, (int64_t)r.threads * hold);
  const int64_t row_bytes = width * itemsize;
  if (rows < sms && (parts > 1 || row_bytes >= r.split_row_bytes)) {
    const int64_t fill = ceil_div(r.blocks_per_sm * sms, rows);
    parts = std::max(parts, std::min({fill, row_bytes / r.min_span_bytes, (int64_t)sms}));
  }
  if (parts > sms || rows * parts > INT_MAX) return {0, 0, 0, 0};
  const int64_t span = ceil_div(ceil_div(width, parts), vec) * vec;
  const int64_t threads = std::min<int64_t>(r.threads, std::max<int64_t>(128, next_pow2(ceil_div(span, hold))));
  return {(int)parts, span, (int)threads, (int)ceil_div(span, threads * vec)};
}

// The forward's plan for rows wider than kWarpMaxWidth (r.hold values a thread at most).
inline SpanPlan forward_plan(int64_t rows, int64_t width, int vec, int itemsize, int sms, const SpanRules& r) {
  return span_plan(rows, width, vec, itemsize, std::min(r.hold, kMaxElemsPerThread), sms, r);
}

// The backward's plan for rows wider than kBackwardWarpMaxWidth (r.backward_hold values of y and of dy a thread).
inline SpanPlan backward_plan(int64_t rows, int64_t width, int vec, int itemsize, int sms, const SpanRules& r) {
  return span_plan(rows, width, vec, itemsize, std::min(r.backward_hold, kBackwardMaxElemsPerThread), sms, r);
}

// Whether `r` is within what the kernels are compiled for (the binding refuses rules that are not).
inline bool valid_rules(const SpanRules& r) {
  const bool pow2 = r.threads > 0 && (r.threads & (r.threads - 1)) == 0;
  return pow2 && r.threads >= 128 && r.threads <= kSpanThreads && r.hold >= 1 && r.hold <= kMaxElemsPerThread &&
         r.backward_hold >= 1 && r.backward_hold <= kBackwardMaxElemsPerThread && r.min_span_bytes >= 16 &&
         r.split_row_bytes >= 1 && r.blocks_per_sm >= 1;
}

// Scratch elements a launch needs: {int32 counters, float partials}; {0, 0} where rows are not cut.
struct ScratchElems {
  int64_t counters, partials;
};

inline ScratchElems scratch_elems(int64_t rows, int64_t width, int itemsize, int sms, bool backward,
                                  const SpanRules& r) {
  if (rows <= 0 || sms < 1 || width <= (backward ? kBackwardWarpMaxWidth : kWarpMaxWidth)) return {0, 0};
  const SpanPlan p =
      backward ? backward_plan(rows, width, 1, itemsize, sms, r) : forward_plan(rows, width, 1, itemsize, sms, r);
  if (p.parts <= 1) return {0, 0};
  return {1 + rows, 2 * rows * p.parts};
}

}  // namespace softmax_plan
}  // namespace fuselab
