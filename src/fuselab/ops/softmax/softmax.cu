// Softmax over rows in CUDA C++ (no torch headers: `nvcc -arch=sm_90 -c softmax.cu` checks it anywhere).
//
// Three forward kernels, chosen by width in `forward_vec`:
//   width <= 1024         softmax_warp_kernel: a group of GROUP <= 32 threads per row (a sub-warp for tiny rows),
//                         the row in registers, warp-shuffle reductions; rows a thread holds in one 16-byte pack
//                         (<= 128 fp32, <= 256 fp16/bf16 columns) go two per group.
//   width <= 16384        softmax_block_kernel: one block (128..512 threads) per row, the row in registers,
//                         block reductions (shuffles, then one value per warp through shared memory).
//   wider                 softmax_looped_kernel: one block per row; one pass for max and sum together (online
//                         softmax), then a pass that writes, from the end of the row back (that part is still in L2).
// Every kernel reads 16 bytes at a time where rows are 16-byte aligned, else one element at a time; math in fp32;
// grids stride over rows, so any number of rows works. The max is subtracted first: -inf entries give 0, a row that
// is all -inf (or holds +inf or NaN) gives NaN, as torch.softmax does.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <climits>
#include <initializer_list>
#include <type_traits>

#include "../_cuda/elements.h"
#include "softmax.h"

namespace fuselab {
namespace {

constexpr float kNegInf = -INFINITY;
constexpr int kWarpKernelThreads = 128;
constexpr int kMaxBlockThreads = 512;
constexpr int kLoopThreads = 512;
constexpr int kMaxElemsPerThread = 32;  // a row held in registers: at most this many fp32 values per thread
constexpr int kUnroll = 4;              // packs in flight per thread in the looped kernels

template <typename T, int VEC>
__device__ __forceinline__ void load(const T* __restrict__ p, float* out) {
  const Pack<T, VEC> pack = *reinterpret_cast<const Pack<T, VEC>*>(p);
#pragma unroll
  for (int i = 0; i < VEC; ++i) out[i] = to_float(pack.v[i]);
}

template <typename T, int VEC>
__device__ __forceinline__ void store(T* __restrict__ p, const float* in, float scale) {
  Pack<T, VEC> pack;
#pragma unroll
  for (int i = 0; i < VEC; ++i) pack.v[i] = from_float<T>(in[i] * scale);
  *reinterpret_cast<Pack<T, VEC>*>(p) = pack;
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
  const int lane = threadIdx.x % GROUP;
  // The loop bounds are the same for the whole block: every lane of a warp must join every shuffle.
  for (int64_t block_row = (int64_t)blockIdx.x * ROWS_PER_BLOCK; block_row < rows;
       block_row += (int64_t)gridDim.x * ROWS_PER_BLOCK) {
    const int64_t first = block_row + threadIdx.x / GROUP * BATCH;
    float v[BATCH][N];
#pragma unroll
    for (int b = 0; b < BATCH; ++b) {
      const bool valid = first + b < rows;
#pragma unroll
      for (int it = 0; it < ITERS; ++it) {
        const int col = (it * GROUP + lane) * VEC;
        load_or<T, VEC>(x + (first + b) * x_stride, valid ? col : width, width, &v[b][it * VEC], kNegInf);
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
      if (first + b >= rows) continue;
#pragma unroll
      for (int it = 0; it < ITERS; ++it) {
        const int col = (it * GROUP + lane) * VEC;
        if (col < width) store<T, VEC>(y + (first + b) * y_stride + col, &v[b][it * VEC], inv_sum[b]);
      }
    }
  }
}

// One block per row (grid-stride), each thread holding ITERS packs of VEC elements at (it * blockDim.x + tid) * VEC.
template <typename T, int VEC, int ITERS>
__global__ void __launch_bounds__(kMaxBlockThreads)
    softmax_block_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t rows, int width, int64_t x_stride,
                         int64_t y_stride) {
  constexpr int N = ITERS * VEC;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    float v[N];
#pragma unroll
    for (int it = 0; it < ITERS; ++it) {
      load_or<T, VEC>(x + row * x_stride, (it * blockDim.x + threadIdx.x) * VEC, width, &v[it * VEC], kNegInf);
    }
    const float max = block_reduce(max_of<N>(v), Max{}, kNegInf);
    const float inv_sum = 1.f / block_reduce(exp_and_sum<N>(v, max), Sum{}, 0.f);
#pragma unroll
    for (int it = 0; it < ITERS; ++it) {
      const int col = (it * blockDim.x + threadIdx.x) * VEC;
      if (col < width) store<T, VEC>(y + row * y_stride + col, &v[it * VEC], inv_sum);
    }
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

// dx = y * (dy - sum(y * dy)). WARP: one warp per row (blockDim.x / 32 rows per block), else one block per row.
template <typename T, int VEC, bool WARP>
__global__ void __launch_bounds__(kLoopThreads)
    softmax_backward_kernel(const T* __restrict__ y, const T* __restrict__ dy, T* __restrict__ dx, int64_t rows,
                            int64_t width, int64_t y_stride, int64_t dy_stride, int64_t dx_stride) {
  const int threads = WARP ? 32 : blockDim.x;
  const int tid = WARP ? threadIdx.x % 32 : threadIdx.x;
  const int64_t rows_per_block = WARP ? blockDim.x / 32 : 1;
  const int64_t step = (int64_t)threads * VEC;
  for (int64_t block_row = (int64_t)blockIdx.x * rows_per_block; block_row < rows;
       block_row += (int64_t)gridDim.x * rows_per_block) {
    const int64_t row = block_row + (WARP ? threadIdx.x / 32 : 0);
    const bool valid = row < rows;  // (WARP) a warp past the last row still goes round the block's loop
    const T* yr = y + row * y_stride;
    const T* dyr = dy + row * dy_stride;
    float dot = 0.f;
    for (int64_t col = tid * VEC; valid && col < width; col += step) {
      float a[VEC], b[VEC];
      load<T, VEC>(yr + col, a);
      load<T, VEC>(dyr + col, b);
#pragma unroll
      for (int i = 0; i < VEC; ++i) dot += a[i] * b[i];
    }
    dot = WARP ? warp_reduce<32>(dot, Sum{}) : block_reduce(dot, Sum{}, 0.f);
    for (int64_t col = tid * VEC; valid && col < width; col += step) {
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

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

int next_pow2(int64_t n) {
  int p = 1;
  while (p < n) p *= 2;
  return p;
}

unsigned grid_for(int64_t blocks) { return (unsigned)(blocks < INT_MAX ? blocks : INT_MAX); }

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

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

template <typename T, int VEC, int ITERS>
cudaError_t launch_block(const T* x, T* y, int64_t rows, int64_t width, int64_t xs, int64_t ys, int threads,
                         cudaStream_t stream) {
  if constexpr (ITERS * VEC > kMaxElemsPerThread) {
    return cudaErrorInvalidValue;
  } else {
    softmax_block_kernel<T, VEC, ITERS><<<grid_for(rows), threads, 0, stream>>>(x, y, rows, (int)width, xs, ys);
    return cudaGetLastError();
  }
}

template <typename T, int VEC>
cudaError_t forward_vec(const T* x, T* y, int64_t rows, int64_t width, int64_t xs, int64_t ys, cudaStream_t stream) {
  const int64_t packs = ceil_div(width, VEC);
  // Short rows: a group of threads per row; at most 32 packs per group, 2..32 threads, up to 1024 columns.
  if (packs <= 32) {
    return with_pow2(next_pow2(packs), [&](auto group) {
      return launch_warp<T, VEC, decltype(group)::value, 1>(x, y, rows, width, xs, ys, stream);
    });
  }
  const int64_t warp_iters = ceil_div(packs, 32);
  if (warp_iters * VEC <= kMaxElemsPerThread) {
    return with_pow2(next_pow2(warp_iters), [&](auto iters) {
      return launch_warp<T, VEC, 32, decltype(iters)::value>(x, y, rows, width, xs, ys, stream);
    });
  }
  // Rows that fit in a block's registers: about 16 elements per thread, 128..512 threads, up to 16384 columns.
  const int threads = (int)std::min<int64_t>(kMaxBlockThreads, std::max<int64_t>(128, next_pow2(ceil_div(width, 16))));
  const int64_t block_iters = ceil_div(packs, threads);
  if (block_iters * VEC <= kMaxElemsPerThread) {
    return with_pow2(next_pow2(block_iters), [&](auto iters) {
      return launch_block<T, VEC, decltype(iters)::value>(x, y, rows, width, xs, ys, threads, stream);
    });
  }
  softmax_looped_kernel<T, VEC><<<grid_for(rows), kLoopThreads, 0, stream>>>(x, y, rows, width, xs, ys);
  return cudaGetLastError();
}

template <typename T, int VEC>
cudaError_t backward_vec(const T* y, const T* dy, T* dx, int64_t rows, int64_t width, int64_t ys, int64_t dys,
                         int64_t dxs, cudaStream_t stream) {
  if (width <= 1024) {  // a warp per row, kWarpKernelThreads / 32 rows per block
    constexpr int rows_per_block = kWarpKernelThreads / 32;
    softmax_backward_kernel<T, VEC, true><<<grid_for(ceil_div(rows, rows_per_block)), kWarpKernelThreads, 0, stream>>>(
        y, dy, dx, rows, width, ys, dys, dxs);
  } else {
    softmax_backward_kernel<T, VEC, false><<<grid_for(rows), kLoopThreads, 0, stream>>>(y, dy, dx, rows, width, ys,
                                                                                         dys, dxs);
  }
  return cudaGetLastError();
}

// 16-byte accesses when every row start is 16-byte aligned and no pack crosses a row's end.
template <typename T>
bool vectorizable(std::initializer_list<const void*> ptrs, std::initializer_list<int64_t> strides, int64_t width) {
  constexpr int V = 16 / sizeof(T);
  bool ok = width % V == 0;
  for (const void* p : ptrs) ok = ok && aligned16(p);
  for (int64_t s : strides) ok = ok && s % V == 0;
  return ok;
}

template <typename T>
cudaError_t forward_typed(const void* x, void* y, int64_t rows, int64_t width, int64_t xs, int64_t ys,
                          cudaStream_t stream) {
  constexpr int V = 16 / sizeof(T);
  const T* xt = static_cast<const T*>(x);
  T* yt = static_cast<T*>(y);
  return vectorizable<T>({x, y}, {xs, ys}, width) ? forward_vec<T, V>(xt, yt, rows, width, xs, ys, stream)
                                                   : forward_vec<T, 1>(xt, yt, rows, width, xs, ys, stream);
}

template <typename T>
cudaError_t backward_typed(const void* y, const void* dy, void* dx, int64_t rows, int64_t width, int64_t ys,
                           int64_t dys, int64_t dxs, cudaStream_t stream) {
  constexpr int V = 16 / sizeof(T);
  const T* yt = static_cast<const T*>(y);
  const T* dyt = static_cast<const T*>(dy);
  T* dxt = static_cast<T*>(dx);
  return vectorizable<T>({y, dy, dx}, {ys, dys, dxs}, width)
             ? backward_vec<T, V>(yt, dyt, dxt, rows, width, ys, dys, dxs, stream)
             : backward_vec<T, 1>(yt, dyt, dxt, rows, width, ys, dys, dxs, stream);
}

}  // namespace

cudaError_t softmax_forward(const void* x, void* y, int64_t rows, int64_t width, int64_t x_stride, int64_t y_stride,
                            SoftmaxDType dtype, cudaStream_t stream) {
  if (rows < 0 || width < 0) return cudaErrorInvalidValue;
  if (rows == 0 || width == 0) return cudaSuccess;
  switch (dtype) {
    case SoftmaxDType::f32: return forward_typed<float>(x, y, rows, width, x_stride, y_stride, stream);
    case SoftmaxDType::f16: return forward_typed<__half>(x, y, rows, width, x_stride, y_stride, stream);
    case SoftmaxDType::bf16: return forward_typed<__nv_bfloat16>(x, y, rows, width, x_stride, y_stride, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t softmax_backward(const void* y, const void* dy, void* dx, int64_t rows, int64_t width, int64_t y_stride,
                             int64_t dy_stride, int64_t dx_stride, SoftmaxDType dtype, cudaStream_t stream) {
  if (rows < 0 || width < 0) return cudaErrorInvalidValue;
  if (rows == 0 || width == 0) return cudaSuccess;
  switch (dtype) {
    case SoftmaxDType::f32:
      return backward_typed<float>(y, dy, dx, rows, width, y_stride, dy_stride, dx_stride, stream);
    case SoftmaxDType::f16:
      return backward_typed<__half>(y, dy, dx, rows, width, y_stride, dy_stride, dx_stride, stream);
    case SoftmaxDType::bf16:
      return backward_typed<__nv_bfloat16>(y, dy, dx, rows, width, y_stride, dy_stride, dx_stride, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace fuselab
