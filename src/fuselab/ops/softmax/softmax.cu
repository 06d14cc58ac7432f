// Softmax over rows in CUDA C++ (no torch headers: `nvcc -arch=sm_90 -c softmax.cu` checks it anywhere).
//
// Forward kernels, chosen by softmax_plan.h's `route` (forward_typed launches what it picks):
//   rows of one column    softmax_single_kernel (rules' single_column_elementwise): elementwise, 1 or NaN.
//   short rows, staged    softmax_staged_kernel: contiguous rows of no whole number of 16-byte packs, up to the
//                         rules' staged_row_bytes_fp32 / _16bit (`staged_plan`): a block copies its rows into shared
//                         memory in 16-byte packs, a group of threads per row does the math (the row in registers)
//                         and writes it back there, and the block copies the rows out.
//   width <= 1024, rows   softmax_edge_warp_kernel: rows of no whole number of packs, all tensors' rows one offset
//   off 16-byte bounds    from a boundary, up to the rules' edge_warp_row_bytes (`edge_warp_rows`): a warp per row,
//                         the aligned bulk in packs and the edges one element a lane.
//   width <= 1024         softmax_warp_kernel: a group of GROUP <= 32 threads per row (a sub-warp for tiny rows),
//                         the row in registers, warp-shuffle reductions; rows a thread holds in one 16-byte pack
//                         (<= 128 fp32, <= 256 fp16/bf16 columns) go two per group. Rows read one element at a
//                         time, only up to the rules' scalar warp width (`warp_rows`).
//   wider                 softmax_span_kernel: a block (128..1024 threads) per span of a row, the span in registers
//                         (blocks past 512 threads: kernels compiled for 64 registers a thread, `wide_hold`).
//                         A row is one span where it fits and rows are many; else it is cut into `parts` spans whose
//                         blocks meet through global memory (each publishes its span's max and sum, waits for the
//                         row's others, combines them in a fixed order), so few wide rows still fill the GPU.
//   wider than SMs spans  softmax_looped_kernel: one block per row; one pass for max and sum together (online
//                         softmax), then a pass that writes, from the end of the row back (that part is still in L2).
// The backward has the same six: softmax_backward_single_kernel, softmax_backward_staged_kernel,
// softmax_backward_edge_warp_kernel, softmax_backward_warp_kernel (rows up to 512 columns, y and dy in registers),
// softmax_backward_span_kernel (the spans' partial sums of y * dy meet as the forward's do), and the looped
// softmax_backward_kernel. Span plans are rules over rows, width, element size and the SM count (`span_plan`), whose
// parameters (`SpanRules`) come from the op's plan table through the binding.
// The warp kernels read 16 bytes at a time where rows are 16-byte aligned, else one element at a time; the span
// kernels read a row's 16-byte aligned bulk in packs and its few edge elements (before the first 16-byte boundary
// and after the last) one by one, wherever all the tensors' rows start at the same offset from a boundary. Math in
// fp32; grids stride over rows (or take tickets), so any number of rows works. The max is subtracted first: -inf
// entries give 0, a row that is all -inf (or holds +inf or NaN) gives NaN, as torch.softmax does.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <climits>
#include <initializer_list>
#include <type_traits>

#include "../_cuda/elements.h"
#include "softmax.h"
#include "softmax_plan.h"

namespace fuselab {
namespace {

using namespace softmax_plan;  // the plans' rules and limits (softmax_plan.h)

constexpr float kNegInf = -INFINITY;
constexpr int kWarpKernelThreads = 128;
constexpr int kLoopThreads = 512;
constexpr int kUnroll = 4;  // packs in flight per thread in the looped kernels

template <typename T, int VEC>
__device__ __forceinline__ void load(const T* __restrict__ p, float* out) {
  const Pack<T, VEC> pack = *reinterpret_cast<const Pack<T, VEC>*>(p);
#pragma unroll
  for (int i = 0; i < VEC; ++i) out[i] = to_float(pack.v[i]);
}

// One store per pack: a 16-byte pack goes out as one st.global.v4 (in the span and looped kernels, whose columns
// start at a row's first 16-byte boundary, nvcc 13 split the Pack's copy into 4- or 2-byte stores, which cost the
// 16-bit kernels up to 4x their time).
template <typename T, int VEC>
__device__ __forceinline__ void store(T* __restrict__ p, const float* in, float scale) {
  Pack<T, VEC> pack;
#pragma unroll
  for (int i = 0; i < VEC; ++i) pack.v[i] = from_float<T>(in[i] * scale);
  if constexpr (sizeof(pack) == 16) {
    unsigned w[4];
    memcpy(w, &pack, sizeof(w));
    asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(w[0]), "r"(w[1]), "r"(w[2]), "r"(w[3])
                 : "memory");
  } else {
    *reinterpret_cast<Pack<T, VEC>*>(p) = pack;
  }
}

// Loads the pack at `col` of a row, or -inf past its end (VEC > 1 only when width % VEC == 0: no partial packs).
template <typename T, int VEC>
__device__ __forceinline__ void load_or(const T* __restrict__ row, int64_t col, int64_t width, float* out,
                                        float fill) {
  if (col < width) {
    load<T, VEC>(row + col, out);
  } else {
#pragma unroll
    for (int i = 0; i < VEC; ++i) out[i] = fill;
  }
}

struct Max {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct Sum {
  __device__ __forceinline__ float operator()(float a, float b) const { return a + b; }
};

// Reduces over groups of WIDTH consecutive lanes (a power of 2 <= 32); every lane gets its group's result.
template <int WIDTH, typename Op>
__device__ __forceinline__ float warp_reduce(float v, Op op) {
#pragma unroll
  for (int offset = WIDTH / 2; offset > 0; offset /= 2) v = op(v, __shfl_xor_sync(0xffffffffu, v, offset, WIDTH));
  return v;
}

// Reduces over the block (blockDim.x a multiple of 32); every thread gets the result. All threads must call it.
template <typename Op>
__device__ __forceinline__ float block_reduce(float v, Op op, float identity) {
  __shared__ float partial[32];
  v = warp_reduce<32>(v, op);
  const int lane = threadIdx.x % 32;
  __syncthreads();  // an earlier call's readers are done with `partial`
  if (lane == 0) partial[threadIdx.x / 32] = v;
  __syncthreads();
  return warp_reduce<32>(lane < blockDim.x / 32 ? partial[lane] : identity, op);
}

// exp(x - max) in place over N values and their sum; `max` is the row's. All -inf rows give NaN, as in torch.
template <int N>
__device__ __forceinline__ float exp_and_sum(float* v, float max) {
  float sum = 0.f;
#pragma unroll
  for (int i = 0; i < N; ++i) {
    v[i] = __expf(v[i] - max);
    sum += v[i];
  }
  return sum;
}

template <int N>
__device__ __forceinline__ float max_of(const float* v) {
  float m = kNegInf;
#pragma unroll
  for (int i = 0; i < N; ++i) m = fmaxf(m, v[i]);
  return m;
}

// Rows per thread group in the warp kernel: two when each thread holds a single 16-byte pack of a row (so a 128-thread
// block moves 4 KiB or more), else one. (Two rows of 256 fp32, 8 KiB a block, were 1.4% slower than torch.softmax.)
template <typename T>
__host__ __device__ constexpr int rows_per_group(int elems_per_thread) {
  return elems_per_thread * (int)sizeof(T) <= 16 ? 2 : 1;
}

// GROUP threads per row, each holding ITERS packs of VEC elements at columns (it * GROUP + lane) * VEC, so the group
// reads contiguous memory; short rows go BATCH to a group for more bytes in flight. Block: kWarpKernelThreads.
template <typename T, int VEC, int GROUP, int ITERS>
__global__ void __launch_bounds__(kWarpKernelThreads)
    softmax_warp_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t rows, int width, int64_t x_stride,
                        int64_t y_stride) {
  constexpr int N = ITERS * VEC;
  constexpr int BATCH = rows_per_group<T>(N);
  constexpr int ROWS_PER_BLOCK = kWarpKernelThreads / GROUP * BATCH;
  constexpr int GROUPS = kWarpKernelThreads / GROUP;  // a group's rows are GROUPS apart, so a warp's loads of
                                                     // its b-th rows are contiguous (rows of a whole pack: 512 bytes)
  const int lane = threadIdx.x % GROUP;
  // The loop bounds are the same for the whole block: every lane of a warp must join every shuffle.
  for (int64_t block_row = (int64_t)blockIdx.x * ROWS_PER_BLOCK; block_row < rows;
       block_row += (int64_t)gridDim.x * ROWS_PER_BLOCK) {
    const int64_t first = block_row + threadIdx.x / GROUP;
    float v[BATCH][N];
#pragma unroll
    for (int b = 0; b < BATCH; ++b) {
      // a row past the end reads the last row (its results are not stored): no branch on the row between a group's
      // loads (16-bit rows of one pack a lane: ptxas issued the second row's load once the first's had arrived)
      const int64_t row = first + b * GROUPS < rows ? first + b * GROUPS : rows - 1;
#pragma unroll
      for (int it = 0; it < ITERS; ++it) {
        const int col = (it * GROUP + lane) * VEC;
        load_or<T, VEC>(x + row * x_stride, col, width, &v[b][it * VEC], kNegInf);
      }
    }
    float inv_sum[BATCH];
#pragma unroll
    for (int b = 0; b < BATCH; ++b) {
      const float max = warp_reduce<GROUP>(max_of<N>(v[b]), Max{});
      inv_sum[b] = 1.f / warp_reduce<GROUP>(exp_and_sum<N>(v[b], max), Sum{});
    }
#pragma unroll
    for (int b = 0; b < BATCH; ++b) {
      const int64_t row = first + b * GROUPS;
      if (row >= rows) continue;
#pragma unroll
      for (int it = 0; it < ITERS; ++it) {
        const int col = (it * GROUP + lane) * VEC;
        if (col < width) store<T, VEC>(y + row * y_stride + col, &v[b][it * VEC], inv_sum[b]);
      }
    }
  }
}

// ---- rows cut into spans, one block each ----

// A row's columns as read by the span kernels: the first 16-byte boundary is `head` columns in, then `bulk` columns
// of whole VEC-element packs, then `tail` columns (head, tail < VEC). VEC 1: the whole row is bulk.
struct RowEdges {
  int head;
  int64_t bulk;
  int tail;
};

template <typename T, int VEC>
__device__ __forceinline__ RowEdges edges_of(const T* row, int64_t width) {
  const int head = (int)((VEC - reinterpret_cast<uintptr_t>(row) / sizeof(T) % VEC) % VEC);
  if (head >= width) return {(int)width, 0, 0};
  const int64_t bulk = (width - head) / VEC * VEC;
  return {head, bulk, (int)(width - head - bulk)};
}

// The edge column thread t reads (fewer than 2 * VEC edge columns, fewer than the threads), or -1.
__device__ __forceinline__ int64_t edge_column(const RowEdges& e, int t) {
  return t < e.head ? t : t < e.head + e.tail ? e.head + e.bulk + (t - e.head) : -1;
}

// One block's share of a row: bulk columns [head + part * span, head + min(bulk, (part + 1) * span)), thread t's
// packs at (it * blockDim.x + t) * VEC from its start; part 0 also takes the row's edges.
struct Span {
  int64_t begin, end;  // columns; end <= begin where the row's bulk ends before this span
  int64_t edge;        // this thread's edge column, or -1
};

template <typename T, int VEC>
__device__ __forceinline__ Span span_of(const T* row, int64_t width, int64_t span, int part) {
  const RowEdges e = edges_of<T, VEC>(row, width);
  const int64_t begin = e.head + part * span;
  const int64_t end = e.head + ((part + 1) * span < e.bulk ? (part + 1) * span : e.bulk);
  return {begin, end, part == 0 ? edge_column(e, threadIdx.x) : -1};
}

// Thread t's packs of span s: pack `it` at column first + it * blockDim.x * VEC (first = s.begin + t * VEC), for
// it < count (the packs before the span's end). A column and a count rather than a 64-bit column tested against the
// span's end for each pack: far fewer registers, so more blocks fit on an SM (docs/ops/softmax.md, "Registers").
struct ThreadPacks {
  int64_t first;  // column of pack 0
  int count;      // packs of this thread within the span
};

// The count is a 32-bit division: what is left of a span past a thread's first column is at most what the block
// holds, and a 64-bit division is a called routine (two calls and 230 more instructions a kernel of one pack a
// thread: docs/ops/softmax.md, "The same map on the graph-scratch series").
template <int VEC>
__device__ __forceinline__ ThreadPacks packs_of(const Span& s) {
  const int64_t first = s.begin + (int64_t)threadIdx.x * VEC;
  const int64_t left = s.end - first;
  const unsigned held = (unsigned)(left < INT_MAX ? left : INT_MAX);
  return {first, left > 0 ? (int)((held - 1u) / (blockDim.x * VEC) + 1u) : 0};
}

template <typename T, int VEC, int ITERS>
__device__ __forceinline__ void load_span(const T* row, const ThreadPacks& t, float* v, float fill) {
  const T* p = row + t.first;
#pragma unroll
  for (int it = 0; it < ITERS; ++it) {
    if (it < t.count) {
      load<T, VEC>(p + it * blockDim.x * VEC, &v[it * VEC]);
    } else {
#pragma unroll
      for (int i = 0; i < VEC; ++i) v[it * VEC + i] = fill;
    }
  }
}

template <typename T, int VEC, int ITERS>
__device__ __forceinline__ void store_span(T* row, const ThreadPacks& t, const float* v, float scale) {
  T* p = row + t.first;
#pragma unroll
  for (int it = 0; it < ITERS; ++it) {
    if (it < t.count) store<T, VEC>(p + it * blockDim.x * VEC, &v[it * VEC], scale);
  }
}

__device__ __forceinline__ int load_acquire(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void add_release(int* p, int v) {
  asm volatile("red.release.gpu.global.add.s32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// Scratch of a launch whose rows are cut into `parts` spans (softmax.h's SoftmaxScratch): counters[0] hands out
// tickets, counters[1 + row] counts the row's blocks that have published their partial (a float2 at
// partials[row * parts + part]). The kernels leave the counters zeros, so one buffer of zeros serves launch after
// launch on a stream.
struct Meeting {
  int* counters;
  float2* partials;
};

// (row, part) of this block, by ticket: tickets are taken in the order blocks start running, so every block of a row
// but the last row begun is running, and a row never waits on blocks that cannot start, as long as `parts` blocks
// fit on the GPU at once (span_plan keeps parts <= SMs). The last ticket's taker sets the ticket counter back to 0.
__device__ __forceinline__ void take_ticket(const Meeting& m, int parts, int64_t* row, int* part) {
  __shared__ unsigned ticket;
  if (threadIdx.x == 0) {
    ticket = atomicAdd(reinterpret_cast<unsigned*>(m.counters), 1u);
    if (ticket == gridDim.x - 1) atomicExch(m.counters, 0);
  }
  __syncthreads();
  *row = ticket / parts;
  *part = (int)(ticket % parts);
}

// Publishes this block's partial for its row, waits until every block of the row has, and returns once they can all
// be read (`partial_of`). The row's last block to leave sets its counter back to 0 (the others have stopped
// reading it by then). All threads must call it.
__device__ __forceinline__ void meet(const Meeting& m, int64_t row, int part, int parts, float2 mine) {
  if (threadIdx.x == 0) {
    int* arrived = m.counters + 1 + row;
    __stcg(m.partials + row * parts + part, mine);
    add_release(arrived, 1);
    while (load_acquire(arrived) < parts) {
    }
    __threadfence();  // the block's reads of the partials (after the barrier below) come after the wait
    if (atomicAdd(arrived, 1) == 2 * parts - 1) atomicExch(arrived, 0);
  }
  __syncthreads();
}

__device__ __forceinline__ float2 partial_of(const Meeting& m, int64_t row, int parts, int i) {
  return __ldcg(m.partials + row * parts + i);
}

// A row's max and 1 / sum of exp(x - max) from its spans' partials (max, sum of exp(x - max of the span)); a span of
// only -inf adds nothing (its sum is 0, and exp(0 - max) is inf for a row max below about -88.7: 0 * inf would be
// NaN). Every block of the row computes them in the same order, so they agree to the bit.
__device__ __forceinline__ float2 combine_max_sum(const Meeting& m, int64_t row, int parts) {
  float mx = kNegInf;
  for (int i = threadIdx.x; i < parts; i += blockDim.x) mx = fmaxf(mx, partial_of(m, row, parts, i).x);
  mx = block_reduce(mx, Max{}, kNegInf);
  float sum = 0.f;
  for (int i = threadIdx.x; i < parts; i += blockDim.x) {
    const float2 p = partial_of(m, row, parts, i);
    if (p.x != kNegInf) sum += p.y * __expf(p.x - mx);
  }
  return {mx, 1.f / block_reduce(sum, Sum{}, 0.f)};
}

// softmax of one span of a row (parts > 1: meeting the row's other spans' blocks; parts == 1: the whole row).
template <typename T, int VEC, int ITERS>
__device__ __forceinline__ void forward_span(const T* xr, T* yr, int64_t width, int64_t span, int64_t row, int part,
                                             int parts, const Meeting& m) {
  constexpr int N = ITERS * VEC;
  const Span s = span_of<T, VEC>(xr, width, span, part);
  const ThreadPacks t = packs_of<VEC>(s);
  float v[N];
  load_span<T, VEC, ITERS>(xr, t, v, kNegInf);
  float ev = s.edge >= 0 ? to_float(xr[s.edge]) : kNegInf;
  const float mx = block_reduce(fmaxf(max_of<N>(v), ev), Max{}, kNegInf);
  const float shift = parts > 1 && mx == kNegInf ? 0.f : mx;  // an all -inf span's sum is 0 (an all -inf row: NaN)
  ev = __expf(ev - shift);
  const float sum = block_reduce(exp_and_sum<N>(v, shift) + ev, Sum{}, 0.f);
  float scale = 1.f / sum;
  if (parts > 1) {
    meet(m, row, part, parts, make_float2(mx, sum));
    const float2 row_max_inv = combine_max_sum(m, row, parts);
    // a span of only -inf in a row that is not: zeros (its values are exp(-inf) = 0, and exp(0 - row max) may be inf)
    scale = mx == kNegInf && row_max_inv.x != kNegInf ? 0.f : __expf(shift - row_max_inv.x) * row_max_inv.y;
  }
  store_span<T, VEC, ITERS>(yr, t, v, scale);
  if (s.edge >= 0) yr[s.edge] = from_float<T>(ev * scale);
}

// Most threads of a span kernel's block: kSpanThreads where a thread's values fit 64 registers (`wide_hold`), else
// kFullHoldThreads (up to 128 registers a thread).
template <typename T, int VEC, int ITERS, bool BACKWARD>
constexpr int span_bound() {
  return VEC * ITERS <= wide_hold(VEC, BACKWARD) ? kSpanThreads : kFullHoldThreads;
}

// A block (blockDim.x <= span_bound) per span of `span` columns (a multiple of VEC) of a row, ITERS packs of VEC
// per thread; parts == 1: grid-stride over whole rows, else rows * parts blocks by ticket (`take_ticket`).
// WHOLE: launched for parts == 1 only, so the instance has no meeting path: ptxas gives a kernel the registers of its
// hungrier path, and the meeting's took the whole rows' 16-bit 8 x 2 instance from 39 to 41 registers (48 allocated:
// 10 blocks of 128 threads an SM, not 12; 16-bit forward at 1.7 k columns 1.09x).
template <typename T, int VEC, int ITERS, bool WHOLE>
__global__ void __launch_bounds__(span_bound<T, VEC, ITERS, false>())
    softmax_span_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t rows, int64_t width, int64_t x_stride,
                        int64_t y_stride, int64_t span, int parts, Meeting m) {
  if (WHOLE || parts == 1) {
    for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
      forward_span<T, VEC, ITERS>(x + row * x_stride, y + row * y_stride, width, span, row, 0, 1, m);
    }
    return;
  }
  int64_t row;
  int part;
  take_ticket(m, parts, &row, &part);
  forward_span<T, VEC, ITERS>(x + row * x_stride, y + row * y_stride, width, span, row, part, parts, m);
}

// Two 16-bit values held in one 32-bit word, as fp32: `unpack` for y * dy's sum, `unpack_again` for dx. They give the
// same values by different instructions (byte permutes), so that ptxas does not keep the first's results live across
// the block's reduction (twice the registers of the words) in place of converting again: a backward block of 1024
// threads then holds 32 16-bit values of y and of dy a thread in 64 registers (with one conversion ptxas spilled
// 192-302 bytes a thread).
__device__ __forceinline__ float2 unpack(unsigned w, __nv_bfloat16) {
  return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
}
__device__ __forceinline__ float2 unpack_again(unsigned w, __nv_bfloat16) {
  return make_float2(__uint_as_float(__byte_perm(w, 0, 0x1044)), __uint_as_float(__byte_perm(w, 0, 0x3244)));
}
__device__ __forceinline__ float2 unpack(unsigned w, __half) {
  __half2 h;
  memcpy(&h, &w, sizeof(h));
  return __half22float2(h);
}
__device__ __forceinline__ float2 unpack_again(unsigned w, __half) {
  return make_float2(__half2float(__ushort_as_half((unsigned short)__byte_perm(w, 0, 0x4410))),
                     __half2float(__ushort_as_half((unsigned short)__byte_perm(w, 0, 0x4432))));
}

// Thread t's packs of a span as stored, as 32-bit words (zeros past the span's end).
template <typename T, int VEC, int ITERS>
__device__ __forceinline__ void load_span_words(const T* row, const ThreadPacks& t, unsigned (*w)[VEC / 2]) {
  const T* p = row + t.first;
#pragma unroll
  for (int it = 0; it < ITERS; ++it) {
    if (it < t.count) {  // one access a pack (a memcpy from p itself went out as byte loads: 1.3-1.6x the time)
      const Pack<T, VEC> pack = *reinterpret_cast<const Pack<T, VEC>*>(p + it * blockDim.x * VEC);
      memcpy(w[it], &pack, sizeof(w[it]));
    } else {
#pragma unroll
      for (int i = 0; i < VEC / 2; ++i) w[it][i] = 0u;
    }
  }
}

// dx = y * (dy - dot) of 16-bit packs held as words, the values in the order the fp32 path takes them (the same sum
// and the same results, bit for bit).
template <typename T, int VEC, int ITERS>
__device__ __forceinline__ float sum_of_words(const unsigned (*a)[VEC / 2], const unsigned (*g)[VEC / 2], float dot) {
#pragma unroll
  for (int it = 0; it < ITERS; ++it) {
#pragma unroll
    for (int i = 0; i < VEC / 2; ++i) {
      const float2 y = unpack(a[it][i], T{}), dy = unpack(g[it][i], T{});
      dot += y.x * dy.x;
      dot += y.y * dy.y;
    }
  }
  return dot;
}

template <typename T, int VEC, int ITERS>
__device__ __forceinline__ void store_span_words(T* row, const ThreadPacks& t, const unsigned (*a)[VEC / 2],
                                                 const unsigned (*g)[VEC / 2], float dot) {
  T* p = row + t.first;
#pragma unroll
  for (int it = 0; it < ITERS; ++it) {
    if (it < t.count) {
      float out[VEC];
#pragma unroll
      for (int i = 0; i < VEC / 2; ++i) {
        const float2 y = unpack_again(a[it][i], T{}), dy = unpack_again(g[it][i], T{});
        out[2 * i] = y.x * (dy.x - dot);
        out[2 * i + 1] = y.y * (dy.y - dot);
      }
      store<T, VEC>(p + it * blockDim.x * VEC, out, 1.f);
    }
  }
}

// The row's sum of y * dy from this thread's share of its span (`dot`): over the block, then, where the row is cut
// (parts > 1), over the row's spans, met in a fixed order.
__device__ __forceinline__ float row_dot(float dot, const Meeting& m, int64_t row, int part, int parts) {
  dot = block_reduce(dot, Sum{}, 0.f);
  if (parts > 1) {
    meet(m, row, part, parts, make_float2(dot, 0.f));
    float total = 0.f;
    for (int i = threadIdx.x; i < parts; i += blockDim.x) total += partial_of(m, row, parts, i).x;
    dot = block_reduce(total, Sum{}, 0.f);
  }
  return dot;
}

// dx = y * (dy - sum(y * dy)) over one span of a row, the span's partial sum meeting the row's others (parts > 1).
// 16-bit packs are held as stored (half the registers of their fp32 values: `wide_hold`), other values as fp32.
template <typename T, int VEC, int ITERS>
__device__ __forceinline__ void backward_span(const T* yr, const T* dyr, T* dxr, int64_t width, int64_t span,
                                              int64_t row, int part, int parts, const Meeting& m) {
  const Span s = span_of<T, VEC>(yr, width, span, part);
  const ThreadPacks t = packs_of<VEC>(s);
  float ea, eg, dot;
  if constexpr (sizeof(T) == 2 && VEC >= 2) {
    unsigned a[ITERS][VEC / 2], g[ITERS][VEC / 2];
    load_span_words<T, VEC, ITERS>(yr, t, a);
    load_span_words<T, VEC, ITERS>(dyr, t, g);
    ea = s.edge >= 0 ? to_float(yr[s.edge]) : 0.f;
    eg = s.edge >= 0 ? to_float(dyr[s.edge]) : 0.f;
    dot = row_dot(sum_of_words<T, VEC, ITERS>(a, g, ea * eg), m, row, part, parts);
    store_span_words<T, VEC, ITERS>(dxr, t, a, g, dot);
  } else {
    constexpr int N = ITERS * VEC;
    float a[N], g[N];
    load_span<T, VEC, ITERS>(yr, t, a, 0.f);
    load_span<T, VEC, ITERS>(dyr, t, g, 0.f);
    ea = s.edge >= 0 ? to_float(yr[s.edge]) : 0.f;
    eg = s.edge >= 0 ? to_float(dyr[s.edge]) : 0.f;
    dot = ea * eg;
#pragma unroll
    for (int i = 0; i < N; ++i) dot += a[i] * g[i];
    dot = row_dot(dot, m, row, part, parts);
#pragma unroll
    for (int i = 0; i < N; ++i) a[i] *= g[i] - dot;
    store_span<T, VEC, ITERS>(dxr, t, a, 1.f);
  }
  if (s.edge >= 0) dxr[s.edge] = from_float<T>(ea * (eg - dot));
}

template <typename T, int VEC, int ITERS>
__global__ void __launch_bounds__(span_bound<T, VEC, ITERS, true>())
    softmax_backward_span_kernel(const T* __restrict__ y, const T* __restrict__ dy, T* __restrict__ dx, int64_t rows,
                                 int64_t width, int64_t y_stride, int64_t dy_stride, int64_t dx_stride, int64_t span,
                                 int parts, Meeting m) {
  if (parts == 1) {
    for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
      backward_span<T, VEC, ITERS>(y + row * y_stride, dy + row * dy_stride, dx + row * dx_stride, width, span, row, 0,
                                   1, m);
    }
    return;
  }
  int64_t row;
  int part;
  take_ticket(m, parts, &row, &part);
  backward_span<T, VEC, ITERS>(y + row * y_stride, dy + row * dy_stride, dx + row * dx_stride, width, span, row, part,
                               parts, m);
}

// The backward of short rows: GROUP threads per row as in softmax_warp_kernel, y and dy in registers.
template <typename T, int VEC, int GROUP, int ITERS>
__global__ void __launch_bounds__(kWarpKernelThreads)
    softmax_backward_warp_kernel(const T* __restrict__ y, const T* __restrict__ dy, T* __restrict__ dx, int64_t rows,
                                 int width, int64_t y_stride, int64_t dy_stride, int64_t dx_stride) {
  constexpr int N = ITERS * VEC;
  constexpr int BATCH = rows_per_group<T>(N);
  constexpr int ROWS_PER_BLOCK = kWarpKernelThreads / GROUP * BATCH;
  constexpr int GROUPS = kWarpKernelThreads / GROUP;  // a group's rows GROUPS apart, as in softmax_warp_kernel
  const int lane = threadIdx.x % GROUP;
  for (int64_t block_row = (int64_t)blockIdx.x * ROWS_PER_BLOCK; block_row < rows;
       block_row += (int64_t)gridDim.x * ROWS_PER_BLOCK) {
    const int64_t first = block_row + threadIdx.x / GROUP;
    float a[BATCH][N], g[BATCH][N];
#pragma unroll
    for (int b = 0; b < BATCH; ++b) {
      const int64_t row = first + b * GROUPS < rows ? first + b * GROUPS : rows - 1;  // past the end: not stored
#pragma unroll
      for (int it = 0; it < ITERS; ++it) {
        const int col = (it * GROUP + lane) * VEC;
        load_or<T, VEC>(y + row * y_stride, col, width, &a[b][it * VEC], 0.f);
        load_or<T, VEC>(dy + row * dy_stride, col, width, &g[b][it * VEC], 0.f);
      }
    }
#pragma unroll
    for (int b = 0; b < BATCH; ++b) {
      float dot = 0.f;
#pragma unroll
      for (int i = 0; i < N; ++i) dot += a[b][i] * g[b][i];
      dot = warp_reduce<GROUP>(dot, Sum{});
#pragma unroll
      for (int i = 0; i < N; ++i) a[b][i] *= g[b][i] - dot;
    }
#pragma unroll
    for (int b = 0; b < BATCH; ++b) {
      const int64_t row = first + b * GROUPS;
      if (row >= rows) continue;
#pragma unroll
      for (int it = 0; it < ITERS; ++it) {
        const int col = (it * GROUP + lane) * VEC;
        if (col < width) store<T, VEC>(dx + row * dx_stride + col, &a[b][it * VEC], 1.f);
      }
    }
  }
}

// ---- rows read by a warp with edges ----

// A row as a warp reads it (edge_warp_rows): lane l holds the packs at head + (it * 32 + l) * VEC of the row's
// 16-byte aligned bulk and at most one edge element (`edge_column`: fewer than 2 * VEC < 32 of them). The row pointer
// it is made from fixes the edges; the other tensors' rows start at the same offset from a boundary (same_phase).
template <typename T, int VEC>
struct WarpRow {
  RowEdges e;
  int lane;
  int first;  // the column of this lane's pack 0
  int count;  // this lane's packs within the bulk (a count, as in ThreadPacks: fewer registers)
  __device__ __forceinline__ WarpRow(const T* row, int width, int lane_)
      : e(edges_of<T, VEC>(row, width)), lane(lane_), first(e.head + lane_ * VEC), count(packs(e, first)) {}
  static __device__ __forceinline__ int packs(const RowEdges& e, int first) {
    const int end = e.head + (int)e.bulk;
    return first < end ? (end - first + 32 * VEC - 1) / (32 * VEC) : 0;
  }
  // This lane's edge column, or -1.
  __device__ __forceinline__ int64_t edge() const { return edge_column(e, lane); }
  // The column of this lane's pack `it` (it < count).
  __device__ __forceinline__ int pack(int it) const { return first + it * 32 * VEC; }
  // This lane's ITERS packs of `row` (a row of this phase) into v, `fill` for packs past the bulk.
  template <int ITERS>
  __device__ __forceinline__ void load(const T* __restrict__ row, float* v, float fill) const {
#pragma unroll
    for (int it = 0; it < ITERS; ++it) {
      if (it < count) {
        fuselab::load<T, VEC>(row + pack(it), &v[it * VEC]);
      } else {
#pragma unroll
        for (int i = 0; i < VEC; ++i) v[it * VEC + i] = fill;
      }
    }
  }
};

// A warp per row (edge_warp_rows, WarpRow): the row pointer of x fixes the edges. Block: kWarpKernelThreads.
template <typename T, int VEC, int ITERS>
__global__ void __launch_bounds__(kWarpKernelThreads)
    softmax_edge_warp_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t rows, int width, int64_t x_stride,
                             int64_t y_stride) {
  constexpr int N = ITERS * VEC;
  constexpr int ROWS_PER_BLOCK = kWarpKernelThreads / 32;
  const int lane = threadIdx.x % 32;
  // A warp's row is the same for all its lanes: every lane joins every shuffle.
  for (int64_t row = (int64_t)blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / 32; row < rows;
       row += (int64_t)gridDim.x * ROWS_PER_BLOCK) {
    const T* xr = x + row * x_stride;
    const WarpRow<T, VEC> r(xr, width, lane);
    float v[N];
    r.template load<ITERS>(xr, v, kNegInf);
    const int64_t edge_col = r.edge();
    float edge = edge_col >= 0 ? to_float(xr[edge_col]) : kNegInf;
    const float max = warp_reduce<32>(fmaxf(max_of<N>(v), edge), Max{});
    float sum = exp_and_sum<N>(v, max);
    edge = __expf(edge - max);
    const float inv_sum = 1.f / warp_reduce<32>(edge_col >= 0 ? sum + edge : sum, Sum{});
    T* yr = y + row * y_stride;
#pragma unroll
    for (int it = 0; it < ITERS; ++it) {
      if (it < r.count) store<T, VEC>(yr + r.pack(it), &v[it * VEC], inv_sum);
    }
    if (edge_col >= 0) yr[edge_col] = from_float<T>(edge * inv_sum);
  }
}

// dx = y * (dy - sum(y * dy)), a warp per row read as in softmax_edge_warp_kernel (y's row pointer fixes the edges).
template <typename T, int VEC, int ITERS>
__global__ void __launch_bounds__(kWarpKernelThreads)
    softmax_backward_edge_warp_kernel(const T* __restrict__ y, const T* __restrict__ dy, T* __restrict__ dx,
                                      int64_t rows, int width, int64_t y_stride, int64_t dy_stride,
                                      int64_t dx_stride) {
  constexpr int N = ITERS * VEC;
  constexpr int ROWS_PER_BLOCK = kWarpKernelThreads / 32;
  const int lane = threadIdx.x % 32;
  for (int64_t row = (int64_t)blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / 32; row < rows;
       row += (int64_t)gridDim.x * ROWS_PER_BLOCK) {
    const T* yr = y + row * y_stride;
    const T* dyr = dy + row * dy_stride;
    const WarpRow<T, VEC> r(yr, width, lane);
    float yv[N], dyv[N];
    r.template load<ITERS>(yr, yv, 0.f);
    r.template load<ITERS>(dyr, dyv, 0.f);
    const int64_t edge_col = r.edge();
    const float y_edge = edge_col >= 0 ? to_float(yr[edge_col]) : 0.f;
    const float dy_edge = edge_col >= 0 ? to_float(dyr[edge_col]) : 0.f;
    float dot = y_edge * dy_edge;
#pragma unroll
    for (int i = 0; i < N; ++i) dot += yv[i] * dyv[i];
    dot = warp_reduce<32>(dot, Sum{});
    T* dxr = dx + row * dx_stride;
#pragma unroll
    for (int it = 0; it < ITERS; ++it) {
      if (it < r.count) {
        float g[VEC];
#pragma unroll
        for (int i = 0; i < VEC; ++i) g[i] = yv[it * VEC + i] * (dyv[it * VEC + i] - dot);
        store<T, VEC>(dxr + r.pack(it), g, 1.f);
      }
    }
    if (edge_col >= 0) dxr[edge_col] = from_float<T>(y_edge * (dy_edge - dot));
  }
}

// ---- rows of one column ----

constexpr int kSingleThreads = 256;

// softmax of a row of one element: 1 where it is finite, NaN where it is +-inf or NaN (as torch.softmax: exp(x - x)),
// told from its exponent bits (no float arithmetic a compiler could fold).
__device__ __forceinline__ float softmax_of_one(float v) {
  return (__float_as_uint(v) & 0x7f800000u) != 0x7f800000u ? 1.f : __int_as_float(0x7fc00000);
}

// Rows of one column, elementwise, grid-stride: VEC > 1, x and y contiguous and 16-byte aligned, packs of VEC rows
// and the last rows % VEC one by one; VEC 1, any row strides. Block: kSingleThreads.
template <typename T, int VEC>
__global__ void __launch_bounds__(kSingleThreads)
    softmax_single_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t rows, int64_t x_stride,
                          int64_t y_stride) {
  const int64_t first = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  for (int64_t p = first; p < rows / VEC; p += (int64_t)gridDim.x * blockDim.x) {
    float v[VEC];
    load<T, VEC>(x + p * VEC * x_stride, v);
#pragma unroll
    for (int i = 0; i < VEC; ++i) v[i] = softmax_of_one(v[i]);
    store<T, VEC>(y + p * VEC * y_stride, v, 1.f);
  }
  if (VEC > 1 && first < rows % VEC) {
    const int64_t row = rows / VEC * VEC + first;
    y[row] = from_float<T>(softmax_of_one(to_float(x[row])));
  }
}

// dx = y * (dy - y * dy) for rows of one column, elementwise as softmax_single_kernel.
template <typename T, int VEC>
__global__ void __launch_bounds__(kSingleThreads)
    softmax_backward_single_kernel(const T* __restrict__ y, const T* __restrict__ dy, T* __restrict__ dx,
                                   int64_t rows, int64_t y_stride, int64_t dy_stride, int64_t dx_stride) {
  const int64_t first = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  for (int64_t p = first; p < rows / VEC; p += (int64_t)gridDim.x * blockDim.x) {
    float yv[VEC], dyv[VEC];
    load<T, VEC>(y + p * VEC * y_stride, yv);
    load<T, VEC>(dy + p * VEC * dy_stride, dyv);
#pragma unroll
    for (int i = 0; i < VEC; ++i) yv[i] = yv[i] * (dyv[i] - yv[i] * dyv[i]);
    store<T, VEC>(dx + p * VEC * dx_stride, yv, 1.f);
  }
  if (VEC > 1 && first < rows % VEC) {
    const int64_t row = rows / VEC * VEC + first;
    const float yr = to_float(y[row]), dyr = to_float(dy[row]);
    dx[row] = from_float<T>(yr * (dyr - yr * dyr));
  }
}

// ---- short rows staged in shared memory ----

// Copies n elements between 16-byte aligned addresses, 16 bytes a thread at a time, kCopyBatch packs a thread in
// flight (then the last few elements one by one).
constexpr int kCopyBatch = 4;

template <typename T>
__device__ __forceinline__ void copy_block(const T* __restrict__ from, T* __restrict__ to, int n) {
  constexpr int V = 16 / sizeof(T);
  const int packs = n / V;
  const uint4* src = reinterpret_cast<const uint4*>(from);
  uint4* dst = reinterpret_cast<uint4*>(to);
  for (int first = threadIdx.x; first < packs; first += kCopyBatch * blockDim.x) {
    uint4 batch[kCopyBatch];
#pragma unroll
    for (int k = 0; k < kCopyBatch; ++k) {
      const int i = first + k * blockDim.x;
      if (i < packs) batch[k] = src[i];
    }
#pragma unroll
    for (int k = 0; k < kCopyBatch; ++k) {
      const int i = first + k * blockDim.x;
      if (i < packs) dst[i] = batch[k];
    }
  }
  for (int i = packs * V + (int)threadIdx.x; i < n; i += blockDim.x) to[i] = from[i];
}

// Contiguous short rows (staged_plan): a block copies `block_rows` rows (contiguous, starting on a 16-byte boundary)
// into shared memory in packs, GROUP threads a row take its values into registers (ITEMS each, columns lane +
// k * GROUP) and write the results back there, and the block copies the rows out the same way. Block:
// kStagedThreads; dynamic shared memory block_rows * width elements.
template <typename T, int GROUP, int ITEMS>
__global__ void __launch_bounds__(kStagedThreads)
    softmax_staged_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t rows, int width, int block_rows) {
  extern __shared__ uint4 staged_smem[];
  T* tile = reinterpret_cast<T*>(staged_smem);
  const int lane = threadIdx.x % GROUP;
  for (int64_t first = (int64_t)blockIdx.x * block_rows; first < rows; first += (int64_t)gridDim.x * block_rows) {
    const int count = (int)(rows - first < block_rows ? rows - first : block_rows);
    copy_block<T>(x + first * width, tile, count * width);
    __syncthreads();
    // every lane of a warp joins every shuffle: the loop bounds are the block's, rows past `count` touch no memory
#pragma unroll 2
    for (int base = 0; base < count; base += kStagedThreads / GROUP) {
      const int r = base + (int)threadIdx.x / GROUP;
      T* row = tile + (int64_t)(r < count ? r : 0) * width;
      const int end = r < count ? width : 0;
      float v[ITEMS];
#pragma unroll
      for (int k = 0; k < ITEMS; ++k) v[k] = lane + k * GROUP < end ? to_float(row[lane + k * GROUP]) : kNegInf;
      const float mx = warp_reduce<GROUP>(max_of<ITEMS>(v), Max{});
      const float inv = 1.f / warp_reduce<GROUP>(exp_and_sum<ITEMS>(v, mx), Sum{});
#pragma unroll
      for (int k = 0; k < ITEMS; ++k) {
        if (lane + k * GROUP < end) row[lane + k * GROUP] = from_float<T>(v[k] * inv);
      }
    }
    __syncthreads();
    copy_block<T>(tile, y + first * width, count * width);
    __syncthreads();  // the tile is read out before the next rows come in
  }
}

// The backward of staged rows: y's and dy's rows side by side in shared memory (2 * block_rows * width), dx written
// over y's.
template <typename T, int GROUP, int ITEMS>
__global__ void __launch_bounds__(kStagedThreads)
    softmax_backward_staged_kernel(const T* __restrict__ y, const T* __restrict__ dy, T* __restrict__ dx,
                                   int64_t rows, int width, int block_rows) {
  extern __shared__ uint4 staged_smem[];
  T* y_tile = reinterpret_cast<T*>(staged_smem);
  T* dy_tile = y_tile + block_rows * width;
  const int lane = threadIdx.x % GROUP;
  for (int64_t first = (int64_t)blockIdx.x * block_rows; first < rows; first += (int64_t)gridDim.x * block_rows) {
    const int count = (int)(rows - first < block_rows ? rows - first : block_rows);
    copy_block<T>(y + first * width, y_tile, count * width);
    copy_block<T>(dy + first * width, dy_tile, count * width);
    __syncthreads();
#pragma unroll 2
    for (int base = 0; base < count; base += kStagedThreads / GROUP) {
      const int r = base + (int)threadIdx.x / GROUP;
      const int64_t at = (int64_t)(r < count ? r : 0) * width;
      const int end = r < count ? width : 0;
      float a[ITEMS], g[ITEMS];
      float dot = 0.f;
#pragma unroll
      for (int k = 0; k < ITEMS; ++k) {
        const bool in = lane + k * GROUP < end;
        a[k] = in ? to_float(y_tile[at + lane + k * GROUP]) : 0.f;
        g[k] = in ? to_float(dy_tile[at + lane + k * GROUP]) : 0.f;
        dot += a[k] * g[k];
      }
      dot = warp_reduce<GROUP>(dot, Sum{});
#pragma unroll
      for (int k = 0; k < ITEMS; ++k) {
        if (lane + k * GROUP < end) y_tile[at + lane + k * GROUP] = from_float<T>(a[k] * (g[k] - dot));
      }
    }
    __syncthreads();
    copy_block<T>(y_tile, dx + first * width, count * width);
    __syncthreads();
  }
}

// One block per row (grid-stride). Each thread keeps a running max m and sum s of exp(x - m) over its columns,
// kUnroll packs a step; the block then merges them and writes the row from its end back.
template <typename T, int VEC>
__global__ void __launch_bounds__(kLoopThreads)
    softmax_looped_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t rows, int64_t width, int64_t x_stride,
                          int64_t y_stride) {
  constexpr int N = kUnroll * VEC;
  const int64_t pack_step = (int64_t)blockDim.x * VEC;  // columns between a thread's consecutive packs
  const int64_t step = pack_step * kUnroll;
  const int64_t first = (int64_t)threadIdx.x * VEC;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* xr = x + row * x_stride;
    float m = kNegInf, s = 0.f;
    for (int64_t base = 0; base < width; base += step) {
      float v[N];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) load_or<T, VEC>(xr, base + u * pack_step + first, width, &v[u * VEC], kNegInf);
      const float m_new = fmaxf(m, max_of<N>(v));
      const float shift = m_new == kNegInf ? 0.f : m_new;  // while only -inf was seen, s stays 0 (not NaN)
      s = s * __expf(m - shift) + exp_and_sum<N>(v, shift);
      m = m_new;
    }
    const float max = block_reduce(m, Max{}, kNegInf);
    const float inv_sum = 1.f / block_reduce(s * __expf(m - max), Sum{}, 0.f);
    for (int64_t base = (width - 1) / step * step; base >= 0; base -= step) {
      float v[N];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) load_or<T, VEC>(xr, base + u * pack_step + first, width, &v[u * VEC], kNegInf);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t col = base + u * pack_step + first;
        if (col < width) {
          exp_and_sum<VEC>(&v[u * VEC], max);
          store<T, VEC>(y + row * y_stride + col, &v[u * VEC], inv_sum);
        }
      }
    }
  }
}

// dx = y * (dy - sum(y * dy)), one block per row (grid-stride), reading y and dy twice: rows too wide to cut into
// at most SMs spans.
template <typename T, int VEC>
__global__ void __launch_bounds__(kLoopThreads)
    softmax_backward_kernel(const T* __restrict__ y, const T* __restrict__ dy, T* __restrict__ dx, int64_t rows,
                            int64_t width, int64_t y_stride, int64_t dy_stride, int64_t dx_stride) {
  const int64_t step = (int64_t)blockDim.x * VEC;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* yr = y + row * y_stride;
    const T* dyr = dy + row * dy_stride;
    float dot = 0.f;
    for (int64_t col = threadIdx.x * VEC; col < width; col += step) {
      float a[VEC], b[VEC];
      load<T, VEC>(yr + col, a);
      load<T, VEC>(dyr + col, b);
#pragma unroll
      for (int i = 0; i < VEC; ++i) dot += a[i] * b[i];
    }
    dot = block_reduce(dot, Sum{}, 0.f);
    for (int64_t col = threadIdx.x * VEC; col < width; col += step) {
      float a[VEC], b[VEC];
      load<T, VEC>(yr + col, a);
      load<T, VEC>(dyr + col, b);
#pragma unroll
      for (int i = 0; i < VEC; ++i) a[i] *= b[i] - dot;
      store<T, VEC>(dx + row * dx_stride + col, a, 1.f);
    }
  }
}

// ---- launchers ----

unsigned grid_for(int64_t blocks) { return (unsigned)(blocks < INT_MAX ? blocks : INT_MAX); }

// Calls f(std::integral_constant<int, n>{}) for n in 1, 2, 4, ..., 32.
template <typename F>
cudaError_t with_pow2(int n, F&& f) {
  switch (n) {
    case 1: return f(std::integral_constant<int, 1>{});
    case 2: return f(std::integral_constant<int, 2>{});
    case 4: return f(std::integral_constant<int, 4>{});
    case 8: return f(std::integral_constant<int, 8>{});
    case 16: return f(std::integral_constant<int, 16>{});
    case 32: return f(std::integral_constant<int, 32>{});
    default: return cudaErrorInvalidValue;
  }
}

// Calls f(std::integral_constant<int, m>{}) for m = n where n <= 8, else n rounded up to 16 or 32.
template <typename F>
cudaError_t with_count(int n, F&& f) {
  switch (n) {
    case 1: return f(std::integral_constant<int, 1>{});
    case 2: return f(std::integral_constant<int, 2>{});
    case 3: return f(std::integral_constant<int, 3>{});
    case 4: return f(std::integral_constant<int, 4>{});
    case 5: return f(std::integral_constant<int, 5>{});
    case 6: return f(std::integral_constant<int, 6>{});
    case 7: return f(std::integral_constant<int, 7>{});
    case 8: return f(std::integral_constant<int, 8>{});
    default: return n <= 16 ? f(std::integral_constant<int, 16>{}) : f(std::integral_constant<int, 32>{});
  }
}

// ---- forward ----

template <typename T, int VEC, int GROUP, int ITERS>
cudaError_t launch_warp(const T* x, T* y, int64_t rows, int64_t width, int64_t xs, int64_t ys, cudaStream_t stream) {
  if constexpr (ITERS * VEC > kMaxElemsPerThread) {
    return cudaErrorInvalidValue;
  } else {
    constexpr int ROWS_PER_BLOCK = kWarpKernelThreads / GROUP * rows_per_group<T>(ITERS * VEC);
    softmax_warp_kernel<T, VEC, GROUP, ITERS>
        <<<grid_for(ceil_div(rows, ROWS_PER_BLOCK)), kWarpKernelThreads, 0, stream>>>(x, y, rows, (int)width, xs, ys);
    return cudaGetLastError();
  }
}

// Rows up to kWarpMaxWidth: a group of threads per row; at most 32 packs per group (2..32 threads), else a warp.
template <typename T, int VEC>
cudaError_t forward_warp(const T* x, T* y, int64_t rows, int64_t width, int64_t xs, int64_t ys, cudaStream_t stream) {
  const int64_t packs = ceil_div(width, VEC);
  if (packs <= 32) {
    return with_pow2(next_pow2(packs), [&](auto group) {
      return launch_warp<T, VEC, decltype(group)::value, 1>(x, y, rows, width, xs, ys, stream);
    });
  }
  return with_pow2(next_pow2(ceil_div(packs, 32)), [&](auto iters) {
    return launch_warp<T, VEC, 32, decltype(iters)::value>(x, y, rows, width, xs, ys, stream);
  });
}

template <typename T, int VEC>
cudaError_t forward_spans(const T* x, T* y, int64_t rows, int64_t width, int64_t xs, int64_t ys, const SpanPlan& p,
                          Meeting m, cudaStream_t stream) {
  return with_count(p.iters, [&](auto iters) {
    constexpr int ITERS = decltype(iters)::value;
    if constexpr (ITERS * VEC > kMaxElemsPerThread) {
      return cudaErrorInvalidValue;
    } else {
      if (p.threads > span_bound<T, VEC, ITERS, false>()) return cudaErrorInvalidValue;
      if (p.parts == 1) {
        softmax_span_kernel<T, VEC, ITERS, true>
            <<<grid_for(rows), p.threads, 0, stream>>>(x, y, rows, width, xs, ys, p.span, 1, m);
      } else {
        softmax_span_kernel<T, VEC, ITERS, false>
            <<<grid_for(rows * p.parts), p.threads, 0, stream>>>(x, y, rows, width, xs, ys, p.span, p.parts, m);
      }
      return cudaGetLastError();
    }
  });
}

// Calls f(group, items) as integral constants for a staged plan's (group, items): items <= MOST below a warp
// (staged_plan: 4, and forward up to kStagedMaxLaneColumns on one lane, the rules' staged_lane_columns).
template <int MOST, typename F>
cudaError_t with_staged(const StagedPlan& p, F&& f) {
  return with_pow2(p.group, [&](auto group) {
    return with_pow2(p.items, [&](auto items) {
      constexpr int GROUP = decltype(group)::value;
      constexpr int ITEMS = decltype(items)::value;
      if constexpr (GROUP < 32 && ITEMS > MOST) {
        return cudaErrorInvalidValue;
      } else {
        return f(group, items);
      }
    });
  });
}

template <typename T>
cudaError_t forward_staged(const T* x, T* y, int64_t rows, int64_t width, const StagedPlan& p, cudaStream_t stream) {
  const int64_t smem = staged_smem_bytes(p, width, sizeof(T), false);
  return with_staged<kStagedMaxLaneColumns>(p, [&](auto group, auto items) {
    softmax_staged_kernel<T, decltype(group)::value, decltype(items)::value>
        <<<grid_for(ceil_div(rows, p.rows)), kStagedThreads, smem, stream>>>(x, y, rows, (int)width, p.rows);
    return cudaGetLastError();
  });
}

// Rows of at most kWarpMaxWidth columns read by a warp with edges (edge_warp_rows): packs of the bulk a lane.
template <typename T>
cudaError_t forward_edge_warp(const T* x, T* y, int64_t rows, int64_t width, int64_t xs, int64_t ys,
                              cudaStream_t stream) {
  constexpr int V = 16 / sizeof(T);
  return with_count((int)ceil_div(width, 32 * V), [&](auto iters) {
    constexpr int ITERS = decltype(iters)::value;
    if constexpr (ITERS * V > kMaxElemsPerThread) {
      return cudaErrorInvalidValue;
    } else {
      softmax_edge_warp_kernel<T, V, ITERS><<<grid_for(ceil_div(rows, kWarpKernelThreads / 32)), kWarpKernelThreads,
                                              0, stream>>>(x, y, rows, (int)width, xs, ys);
      return cudaGetLastError();
    }
  });
}

// Blocks for an elementwise launch over `n` items: enough for every SM several times over, no more than the items need.
unsigned single_blocks(int64_t n, int sms) {
  return grid_for(std::max<int64_t>(1, std::min(ceil_div(n, kSingleThreads), (int64_t)sms * 8)));
}

template <typename T>
cudaError_t forward_single(const T* x, T* y, int64_t rows, int64_t xs, int64_t ys, int sms, cudaStream_t stream) {
  constexpr int V = 16 / sizeof(T);
  if (xs == 1 && ys == 1 && aligned16(x) && aligned16(y)) {
    softmax_single_kernel<T, V><<<single_blocks(ceil_div(rows, V), sms), kSingleThreads, 0, stream>>>(x, y, rows, 1, 1);
  } else {
    softmax_single_kernel<T, 1><<<single_blocks(rows, sms), kSingleThreads, 0, stream>>>(x, y, rows, xs, ys);
  }
  return cudaGetLastError();
}

template <typename T>
cudaError_t forward_typed(const void* x, void* y, int64_t rows, int64_t width, int64_t xs, int64_t ys, int sms,
                          const SpanRules& rules, SoftmaxScratch scratch, cudaStream_t stream) {
  constexpr int V = 16 / sizeof(T);
  const T* xt = static_cast<const T*>(x);
  T* yt = static_cast<T*>(y);
  const Route r = route({x, y}, {xs, ys}, rows, width, sizeof(T), sms, false, rules);
  switch (r.kernels) {
    case Kernels::single:
      return forward_single<T>(xt, yt, rows, xs, ys, sms, stream);
    case Kernels::staged:
      return forward_staged<T>(xt, yt, rows, width, r.staged, stream);
    case Kernels::edge_warp:
      return forward_edge_warp<T>(xt, yt, rows, width, xs, ys, stream);
    case Kernels::warp:
      return r.vectorized ? forward_warp<T, V>(xt, yt, rows, width, xs, ys, stream)
                          : forward_warp<T, 1>(xt, yt, rows, width, xs, ys, stream);
    case Kernels::looped:
      if (r.vectorized) {
        softmax_looped_kernel<T, V><<<grid_for(rows), kLoopThreads, 0, stream>>>(xt, yt, rows, width, xs, ys);
      } else {
        softmax_looped_kernel<T, 1><<<grid_for(rows), kLoopThreads, 0, stream>>>(xt, yt, rows, width, xs, ys);
      }
      return cudaGetLastError();
    case Kernels::spans:
      break;
  }
  if (r.spans.parts > 1 && (scratch.counters == nullptr || scratch.partials == nullptr)) return cudaErrorInvalidValue;
  const Meeting m{scratch.counters, reinterpret_cast<float2*>(scratch.partials)};
  return r.same_phase ? forward_spans<T, V>(xt, yt, rows, width, xs, ys, r.spans, m, stream)
                      : forward_spans<T, 1>(xt, yt, rows, width, xs, ys, r.spans, m, stream);
}

// ---- backward ----

template <typename T, int VEC>
cudaError_t backward_warp(const T* y, const T* dy, T* dx, int64_t rows, int64_t width, int64_t ys, int64_t dys,
                          int64_t dxs, cudaStream_t stream) {
  const int64_t packs = ceil_div(width, VEC);
  const bool short_row = packs <= 32;
  return with_pow2(short_row ? next_pow2(packs) : 32, [&](auto group) {
    constexpr int GROUP = decltype(group)::value;
    return with_pow2(short_row ? 1 : next_pow2(ceil_div(packs, 32)), [&](auto iters) {
      constexpr int ITERS = decltype(iters)::value;
      if constexpr (ITERS * VEC > kBackwardWarpMaxElems || (GROUP < 32 && ITERS > 1)) {
        return cudaErrorInvalidValue;
      } else {
        constexpr int ROWS_PER_BLOCK = kWarpKernelThreads / GROUP * rows_per_group<T>(ITERS * VEC);
        softmax_backward_warp_kernel<T, VEC, GROUP, ITERS>
            <<<grid_for(ceil_div(rows, ROWS_PER_BLOCK)), kWarpKernelThreads, 0, stream>>>(y, dy, dx, rows, (int)width,
                                                                                         ys, dys, dxs);
        return cudaGetLastError();
      }
    });
  });
}

template <typename T, int VEC>
cudaError_t backward_spans(const T* y, const T* dy, T* dx, int64_t rows, int64_t width, int64_t ys, int64_t dys,
                           int64_t dxs, const SpanPlan& p, Meeting m, cudaStream_t stream) {
  return with_count(p.iters, [&](auto iters) {
    constexpr int ITERS = decltype(iters)::value;
    if constexpr (ITERS * VEC > kBackwardMaxElemsPerThread) {
      return cudaErrorInvalidValue;
    } else {
      if (p.threads > span_bound<T, VEC, ITERS, true>()) return cudaErrorInvalidValue;
      const int64_t blocks = p.parts == 1 ? rows : rows * p.parts;
      softmax_backward_span_kernel<T, VEC, ITERS><<<grid_for(blocks), p.threads, 0, stream>>>(
          y, dy, dx, rows, width, ys, dys, dxs, p.span, p.parts, m);
      return cudaGetLastError();
    }
  });
}

// Staged backward blocks take up to 2 x 32 KiB of shared memory (staged_plan's bounds): past the 48 KiB a launch
// gets unasked, the kernel is allowed more once.
template <typename T, int GROUP, int ITEMS>
cudaError_t allow_staged_smem() {
  static const cudaError_t allowed = cudaFuncSetAttribute(softmax_backward_staged_kernel<T, GROUP, ITEMS>,
                                                          cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                          (int)(4 * kStagedMaxTileBytes));
  return allowed;
}

template <typename T>
cudaError_t backward_staged(const T* y, const T* dy, T* dx, int64_t rows, int64_t width, const StagedPlan& p,
                            cudaStream_t stream) {
  const int64_t smem = staged_smem_bytes(p, width, sizeof(T), true);
  return with_staged<4>(p, [&](auto group, auto items) {
    constexpr int GROUP = decltype(group)::value;
    constexpr int ITEMS = decltype(items)::value;
    if (smem > 48 * 1024) {
      const cudaError_t allowed = allow_staged_smem<T, GROUP, ITEMS>();
      if (allowed != cudaSuccess) return allowed;
    }
    softmax_backward_staged_kernel<T, GROUP, ITEMS>
        <<<grid_for(ceil_div(rows, p.rows)), kStagedThreads, smem, stream>>>(y, dy, dx, rows, (int)width, p.rows);
    return cudaGetLastError();
  });
}

template <typename T>
cudaError_t backward_edge_warp(const T* y, const T* dy, T* dx, int64_t rows, int64_t width, int64_t ys, int64_t dys,
                               int64_t dxs, cudaStream_t stream) {
  constexpr int V = 16 / sizeof(T);
  return with_count((int)ceil_div(width, 32 * V), [&](auto iters) {
    constexpr int ITERS = decltype(iters)::value;
    if constexpr (ITERS * V > kMaxElemsPerThread) {
      return cudaErrorInvalidValue;
    } else {
      softmax_backward_edge_warp_kernel<T, V, ITERS>
          <<<grid_for(ceil_div(rows, kWarpKernelThreads / 32)), kWarpKernelThreads, 0, stream>>>(
              y, dy, dx, rows, (int)width, ys, dys, dxs);
      return cudaGetLastError();
    }
  });
}

template <typename T>
cudaError_t backward_single(const T* y, const T* dy, T* dx, int64_t rows, int64_t ys, int64_t dys, int64_t dxs,
                            int sms, cudaStream_t stream) {
  constexpr int V = 16 / sizeof(T);
  if (ys == 1 && dys == 1 && dxs == 1 && aligned16(y) && aligned16(dy) && aligned16(dx)) {
    softmax_backward_single_kernel<T, V>
        <<<single_blocks(ceil_div(rows, V), sms), kSingleThreads, 0, stream>>>(y, dy, dx, rows, 1, 1, 1);
  } else {
    softmax_backward_single_kernel<T, 1>
        <<<single_blocks(rows, sms), kSingleThreads, 0, stream>>>(y, dy, dx, rows, ys, dys, dxs);
  }
  return cudaGetLastError();
}

template <typename T>
cudaError_t backward_typed(const void* y, const void* dy, void* dx, int64_t rows, int64_t width, int64_t ys,
                           int64_t dys, int64_t dxs, int sms, const SpanRules& rules, SoftmaxScratch scratch,
                           cudaStream_t stream) {
  constexpr int V = 16 / sizeof(T);
  const T* yt = static_cast<const T*>(y);
  const T* dyt = static_cast<const T*>(dy);
  T* dxt = static_cast<T*>(dx);
  const Route r = route({y, dy, dx}, {ys, dys, dxs}, rows, width, sizeof(T), sms, true, rules);
  switch (r.kernels) {
    case Kernels::single:
      return backward_single<T>(yt, dyt, dxt, rows, ys, dys, dxs, sms, stream);
    case Kernels::staged:
      return backward_staged<T>(yt, dyt, dxt, rows, width, r.staged, stream);
    case Kernels::edge_warp:
      return backward_edge_warp<T>(yt, dyt, dxt, rows, width, ys, dys, dxs, stream);
    case Kernels::warp:
      return r.vectorized ? backward_warp<T, V>(yt, dyt, dxt, rows, width, ys, dys, dxs, stream)
                          : backward_warp<T, 1>(yt, dyt, dxt, rows, width, ys, dys, dxs, stream);
    case Kernels::looped:
      if (r.vectorized) {
        softmax_backward_kernel<T, V><<<grid_for(rows), kLoopThreads, 0, stream>>>(yt, dyt, dxt, rows, width, ys,
                                                                                   dys, dxs);
      } else {
        softmax_backward_kernel<T, 1><<<grid_for(rows), kLoopThreads, 0, stream>>>(yt, dyt, dxt, rows, width, ys,
                                                                                   dys, dxs);
      }
      return cudaGetLastError();
    case Kernels::spans:
      break;
  }
  if (r.spans.parts > 1 && (scratch.counters == nullptr || scratch.partials == nullptr)) return cudaErrorInvalidValue;
  const Meeting m{scratch.counters, reinterpret_cast<float2*>(scratch.partials)};
  return r.same_phase ? backward_spans<T, V>(yt, dyt, dxt, rows, width, ys, dys, dxs, r.spans, m, stream)
                      : backward_spans<T, 1>(yt, dyt, dxt, rows, width, ys, dys, dxs, r.spans, m, stream);
}

int itemsize_of(SoftmaxDType dtype) { return dtype == SoftmaxDType::f32 ? 4 : 2; }

}  // namespace

SoftmaxScratchSize softmax_forward_scratch_size(const void* x, const void* y, int64_t rows, int64_t width,
                                                int64_t x_stride, int64_t y_stride, SoftmaxDType dtype, int sms,
                                                const SoftmaxRules& rules) {
  if (rows <= 0 || width <= 0 || sms < 1) return {0, 0};
  const Route r = route({x, y}, {x_stride, y_stride}, rows, width, itemsize_of(dtype), sms, false, rules);
  const ScratchElems e = scratch_elems(rows, r);
  return {e.counters, e.partials};
}

SoftmaxScratchSize softmax_backward_scratch_size(const void* y, const void* dy, const void* dx, int64_t rows,
                                                 int64_t width, int64_t y_stride, int64_t dy_stride, int64_t dx_stride,
                                                 SoftmaxDType dtype, int sms, const SoftmaxRules& rules) {
  if (rows <= 0 || width <= 0 || sms < 1) return {0, 0};
  const Route r = route({y, dy, dx}, {y_stride, dy_stride, dx_stride}, rows, width, itemsize_of(dtype), sms, true,
                        rules);
  const ScratchElems e = scratch_elems(rows, r);
  return {e.counters, e.partials};
}

cudaError_t softmax_forward(const void* x, void* y, int64_t rows, int64_t width, int64_t x_stride, int64_t y_stride,
                            SoftmaxDType dtype, int sms, const SoftmaxRules& rules, SoftmaxScratch scratch,
                            cudaStream_t stream) {
  if (rows < 0 || width < 0 || sms < 1 || !valid_rules(rules)) return cudaErrorInvalidValue;
  if (rows == 0 || width == 0) return cudaSuccess;
  switch (dtype) {
    case SoftmaxDType::f32:
      return forward_typed<float>(x, y, rows, width, x_stride, y_stride, sms, rules, scratch, stream);
    case SoftmaxDType::f16:
      return forward_typed<__half>(x, y, rows, width, x_stride, y_stride, sms, rules, scratch, stream);
    case SoftmaxDType::bf16:
      return forward_typed<__nv_bfloat16>(x, y, rows, width, x_stride, y_stride, sms, rules, scratch, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t softmax_backward(const void* y, const void* dy, void* dx, int64_t rows, int64_t width, int64_t y_stride,
                             int64_t dy_stride, int64_t dx_stride, SoftmaxDType dtype, int sms,
                             const SoftmaxRules& rules, SoftmaxScratch scratch, cudaStream_t stream) {
  if (rows < 0 || width < 0 || sms < 1 || !valid_rules(rules)) return cudaErrorInvalidValue;
  if (rows == 0 || width == 0) return cudaSuccess;
  switch (dtype) {
    case SoftmaxDType::f32:
      return backward_typed<float>(y, dy, dx, rows, width, y_stride, dy_stride, dx_stride, sms, rules, scratch,
                                   stream);
    case SoftmaxDType::f16:
      return backward_typed<__half>(y, dy, dx, rows, width, y_stride, dy_stride, dx_stride, sms, rules, scratch,
                                    stream);
    case SoftmaxDType::bf16:
      return backward_typed<__nv_bfloat16>(y, dy, dx, rows, width, y_stride, dy_stride, dx_stride, sms, rules,
                                           scratch, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace fuselab
