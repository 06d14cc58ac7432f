// The CUDA softmax's plans: which kernel and how a row is cut into spans, as rules over rows, width, element size and
// the SM count. Plain C++ (no CUDA): softmax.cu launches by them, and tests/ops/test_softmax.py compiles
// them with a host compiler to check the rules without a GPU.
#pragma once

#include <algorithm>
#include <climits>
#include <cstdint>

namespace fuselab {
namespace softmax_plan {

constexpr int kSpanThreads = 512;                 // most threads of a span kernel's block
constexpr int kMaxElemsPerThread = 32;            // forward: fp32 values a thread holds at most
constexpr int kBackwardMaxElemsPerThread = 16;    // backward: values of y (and as many of dy) a thread holds at most
constexpr int64_t kWarpMaxWidth = 1024;           // forward rows up to this: the warp kernel
constexpr int64_t kBackwardWarpMaxWidth = 512;    // backward rows up to this: its warp kernel
constexpr int64_t kMinSpanBytes = 8192;           // few rows: spans no shorter than this
constexpr int64_t kSplitRowBytes = 131072;        // few rows: rows at least this long are cut
constexpr int64_t kBlocksPerSm = 2;               // few rows: cut into spans until about this many blocks run per SM

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

// A row cut into the fewest spans a block holds in registers (`hold` values a thread at most, about `per_thread`
// given). Where rows are fewer than SMs and a row is either cut anyway or at least kSplitRowBytes long, it is cut
// finer, down to spans of kMinSpanBytes, until about kBlocksPerSm blocks per SM run: a meeting costs its blocks a few
// microseconds, which only rows that long repay. Spans are at most `sms`, so a row's blocks all fit on the GPU at
// once and may wait for each other. `vec`: elements per pack (spans are whole packs).
inline SpanPlan span_plan(int64_t rows, int64_t width, int vec, int itemsize, int hold, int per_thread, int sms) {
  int64_t parts = ceil_div(width, (int64_t)kSpanThreads * hold);
  const int64_t row_bytes = width * itemsize;
  if (rows < sms && (parts > 1 || row_bytes >= kSplitRowBytes)) {
    const int64_t fill = ceil_div(kBlocksPerSm * sms, rows);
    parts = std::max(parts, std::min({fill, row_bytes / kMinSpanBytes, (int64_t)sms}));
  }
  if (parts > sms || rows * parts > INT_MAX) return {0, 0, 0, 0};
  const int64_t span = ceil_div(ceil_div(width, parts), vec) * vec;
  const int64_t threads =
      std::min<int64_t>(kSpanThreads, std::max<int64_t>(128, next_pow2(ceil_div(span, per_thread))));
  return {(int)parts, span, (int)threads, (int)ceil_div(span, threads * vec)};
}

// The forward's plan for rows wider than kWarpMaxWidth (32 values a thread at most, about 32 given).
inline SpanPlan forward_plan(int64_t rows, int64_t width, int vec, int itemsize, int sms) {
  return span_plan(rows, width, vec, itemsize, kMaxElemsPerThread, 32, sms);
}

// The backward's plan for rows wider than kBackwardWarpMaxWidth (16 values of y and of dy a thread at most).
inline SpanPlan backward_plan(int64_t rows, int64_t width, int vec, int itemsize, int sms) {
  return span_plan(rows, width, vec, itemsize, kBackwardMaxElemsPerThread, 16, sms);
}

// Scratch elements a launch needs: {int32 counters, float partials}; {0, 0} where rows are not cut.
struct ScratchElems {
  int64_t counters, partials;
};

inline ScratchElems scratch_elems(int64_t rows, int64_t width, int itemsize, int sms, bool backward) {
  if (rows <= 0 || sms < 1 || width <= (backward ? kBackwardWarpMaxWidth : kWarpMaxWidth)) return {0, 0};
  const SpanPlan p = backward ? backward_plan(rows, width, 1, itemsize, sms) : forward_plan(rows, width, 1, itemsize, sms);
  if (p.parts <= 1) return {0, 0};
  return {1 + rows, 2 * rows * p.parts};
}

}  // namespace softmax_plan
}  // namespace fuselab
