// GELU forward and backward CUDA kernels, fp32 math for fp32/fp16/bf16 data (see gelu.h for the launchers).
//
// Memory-bound by design: each thread moves kUnroll 16-byte vectors per array (float4, or 8 halves/bfloat16s),
// all loads issued before any math; consecutive threads touch consecutive vectors (coalesced). One vector per
// thread, a block of 256 threads covering 4 KiB per array, as the Triton kernel's block-size sweep chose
// (docs/ops/gelu.md has the measurements). The < 16 bytes left after the last whole vector go one element per
// thread in the last block; inputs that are not 16-byte aligned (a view's offset) take gelu_rows_kernel as one row
// (`launch`). Indices are int64_t throughout. Inputs that are not one flat run of memory (a slice of wider
// rows, a stride through 1-D) take gelu_rows_kernel: each thread writes one 16-byte vector of the contiguous output
// and reads its elements through the input's row and column strides.
//
// The tanh form is computed as x * sigmoid(2u) = x / (1 + 2^(x (c0 + c1 x^2))) with the MUFU instructions
// ex2.approx and rcp.approx (relative error ~1e-7, about 1 ulp of fp32 over the range that matters), which
// also gives F.gelu's special values: +inf -> inf, -inf -> -inf * 0 = NaN, NaN -> NaN.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <climits>

#include "../_cuda/elements.h"
#include "gelu.h"

namespace fuselab::gelu {
namespace {

constexpr int kThreads = 256;
constexpr int kUnroll = 1;  // vectors per thread and array

// 2^(x (kC0 + kC1 x^2)) = exp(-2u), u = sqrt(2/pi) (x + 0.044715 x^3)
constexpr float kC0 = -2.302208198144325f;   // -2 log2(e) sqrt(2/pi)
constexpr float kC1 = -0.1029432395800235f;  // kC0 * 0.044715
constexpr float kD0 = 1.5957691216057308f;   // 2 sqrt(2/pi)
constexpr float kD1 = 0.21406444881780076f;  // 6 sqrt(2/pi) 0.044715
constexpr float kSqrt1_2 = 0.7071067811865476f;
constexpr float kInvSqrt2Pi = 0.3989422804014327f;
constexpr float kNegHalfLog2e = -0.7213475204444817f;

__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

template <Form F>
__device__ __forceinline__ float gelu(float x) {
  if constexpr (F == Form::kTanh) {
    return __fdividef(x, 1.0f + fast_exp2(x * fmaf(kC1, x * x, kC0)));
  } else {
    return 0.5f * x * (1.0f + erff(x * kSqrt1_2));
  }
}

template <Form F>
__device__ __forceinline__ float gelu_grad(float x) {
  if constexpr (F == Form::kTanh) {
    const float s = __fdividef(1.0f, 1.0f + fast_exp2(x * fmaf(kC1, x * x, kC0)));  // sigmoid(2u)
    return s * (1.0f + (1.0f - s) * x * fmaf(kD1, x * x, kD0));
  } else {
    return 0.5f * (1.0f + erff(x * kSqrt1_2)) + x * kInvSqrt2Pi * fast_exp2(kNegHalfLog2e * x * x);
  }
}

// out = gelu(x), or out = dy * gelu'(x) when kBackward. All arrays hold n elements; dy is unused forward.
template <typename T, int kVec, Form F, bool kBackward>
__global__ void __launch_bounds__(kThreads)
    gelu_kernel(const T* __restrict__ x, const T* __restrict__ dy, T* __restrict__ out, int64_t n) {
  using V = Pack<T, kVec>;
  const int64_t n_vec = n / kVec;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * (kThreads * kUnroll) + threadIdx.x;

  V xv[kUnroll];
  V gv[kBackward ? kUnroll : 1];
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const int64_t i = first + u * kThreads;
    if (i < n_vec) {
      xv[u] = reinterpret_cast<const V*>(x)[i];
      if constexpr (kBackward) gv[u] = reinterpret_cast<const V*>(dy)[i];
    }
  }
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const int64_t i = first + u * kThreads;
    if (i < n_vec) {
      V yv;
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        const float xf = to_float(xv[u].v[k]);
        if constexpr (kBackward) {
          yv.v[k] = from_float<T>(to_float(gv[u].v[k]) * gelu_grad<F>(xf));
        } else {
          yv.v[k] = from_float<T>(gelu<F>(xf));
        }
      }
      reinterpret_cast<V*>(out)[i] = yv;
    }
  }

  if (kVec > 1 && blockIdx.x == gridDim.x - 1) {  // the n % kVec elements after the last whole vector
    const int64_t i = n_vec * kVec + threadIdx.x;
    if (i < n) {
      const float xf = to_float(x[i]);
      if constexpr (kBackward) {
        out[i] = from_float<T>(to_float(dy[i]) * gelu_grad<F>(xf));
      } else {
        out[i] = from_float<T>(gelu<F>(xf));
      }
    }
  }
}

template <typename T, int kVec, Form F, bool kBackward>
cudaError_t launch_vec(const void* x, const void* dy, void* out, int64_t n, cudaStream_t stream) {
  constexpr int64_t kPerBlock = int64_t{kThreads} * kUnroll;
  const int64_t n_vec = n / kVec;
  const int64_t blocks = n_vec > 0 ? (n_vec + kPerBlock - 1) / kPerBlock : 1;  // >= 1 block for the tail
  if (blocks > INT_MAX) return cudaErrorInvalidConfiguration;
  gelu_kernel<T, kVec, F, kBackward><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      static_cast<const T*>(x), static_cast<const T*>(dy), static_cast<T*>(out), n);
  return cudaGetLastError();
}

// out[i] = gelu(x[r, c]), or dy[r, c] * gelu'(x[r, c]) when kBackward, i = r * cols + c < n = rows * cols. A thread
// takes kVec consecutive i (one 16-byte vector of out): one division finds its first (r, c), then it steps along the
// row. Index: the division's type (32 bits where n fits, which is several times cheaper than 64).
template <typename T, int kVec, Form F, bool kBackward, typename Index>
__global__ void __launch_bounds__(kThreads)
    gelu_rows_kernel(Rows x, Rows dy, T* __restrict__ out, Index cols, int64_t n) {
  const int64_t first = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) * kVec;
  if (first >= n) return;
  Index row = static_cast<Index>(first) / cols;
  Index col = static_cast<Index>(first) - row * cols;
  Pack<T, kVec> yv;
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    if (first + k < n) {
      const int64_t at = static_cast<int64_t>(row) * x.row_stride + static_cast<int64_t>(col) * x.col_stride;
      const float xf = to_float(static_cast<const T*>(x.data)[at]);
      if constexpr (kBackward) {
        const int64_t dy_at = static_cast<int64_t>(row) * dy.row_stride + static_cast<int64_t>(col) * dy.col_stride;
        yv.v[k] = from_float<T>(to_float(static_cast<const T*>(dy.data)[dy_at]) * gelu_grad<F>(xf));
      } else {
        yv.v[k] = from_float<T>(gelu<F>(xf));
      }
    }
    if (++col == cols) {
      col = 0;
      ++row;
    }
  }
  if (first + kVec <= n) {
    reinterpret_cast<Pack<T, kVec>*>(out)[first / kVec] = yv;
  } else {
    for (int k = 0; first + k < n; ++k) out[first + k] = yv.v[k];
  }
}

template <typename T, Form F, bool kBackward>
cudaError_t launch_rows(Rows x, Rows dy, void* out, int64_t rows, int64_t cols, cudaStream_t stream) {
  constexpr int kVec = 16 / sizeof(T);
  const int64_t n = rows * cols;
  const int64_t blocks = (n + int64_t{kThreads} * kVec - 1) / (int64_t{kThreads} * kVec);
  if (blocks > INT_MAX || reinterpret_cast<uintptr_t>(out) % 16 != 0) return cudaErrorInvalidConfiguration;
  if (n <= UINT32_MAX) {
    gelu_rows_kernel<T, kVec, F, kBackward, uint32_t><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
        x, dy, static_cast<T*>(out), static_cast<uint32_t>(cols), n);
  } else {
    gelu_rows_kernel<T, kVec, F, kBackward, uint64_t><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
        x, dy, static_cast<T*>(out), static_cast<uint64_t>(cols), n);
  }
  return cudaGetLastError();
}

// The flat launch: 16-byte vectors where every pointer is 16-byte aligned; inputs off that boundary (a view's
// offset: x[1:]) into an aligned output as one row of n, read element by element into the output's 16-byte vectors
// (gelu_rows_kernel: on the H200 one element a thread of 256 took 1.6x (fp32) to 3.3x (16-bit) the aligned time,
// docs/ops/gelu.md); an output off it too, one element a thread.
template <typename T, Form F, bool kBackward>
cudaError_t launch(const void* x, const void* dy, void* out, int64_t n, cudaStream_t stream) {
  const auto inputs = reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(dy);  // dy is null forward
  if (reinterpret_cast<uintptr_t>(out) % 16 != 0) return launch_vec<T, 1, F, kBackward>(x, dy, out, n, stream);
  if (inputs % 16 == 0) return launch_vec<T, 16 / sizeof(T), F, kBackward>(x, dy, out, n, stream);
  return launch_rows<T, F, kBackward>(Rows{x, 0, 1}, Rows{dy, 0, 1}, out, 1, n, stream);
}

template <bool kBackward>
cudaError_t dispatch_rows(Rows x, Rows dy, void* out, int64_t rows, int64_t cols, DType dtype, Form form,
                          cudaStream_t stream) {
  if (rows < 0 || cols < 0) return cudaErrorInvalidValue;
  if (rows == 0 || cols == 0) return cudaSuccess;
  const bool tanh = form == Form::kTanh;
  switch (dtype) {
    case DType::kFloat32:
      return tanh ? launch_rows<float, Form::kTanh, kBackward>(x, dy, out, rows, cols, stream)
                  : launch_rows<float, Form::kErf, kBackward>(x, dy, out, rows, cols, stream);
    case DType::kFloat16:
      return tanh ? launch_rows<__half, Form::kTanh, kBackward>(x, dy, out, rows, cols, stream)
                  : launch_rows<__half, Form::kErf, kBackward>(x, dy, out, rows, cols, stream);
    case DType::kBFloat16:
      return tanh ? launch_rows<__nv_bfloat16, Form::kTanh, kBackward>(x, dy, out, rows, cols, stream)
                  : launch_rows<__nv_bfloat16, Form::kErf, kBackward>(x, dy, out, rows, cols, stream);
  }
  return cudaErrorInvalidValue;
}

template <bool kBackward>
cudaError_t dispatch(const void* x, const void* dy, void* out, int64_t n, DType dtype, Form form,
                     cudaStream_t stream) {
  if (n < 0) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  const bool tanh = form == Form::kTanh;
  switch (dtype) {
    case DType::kFloat32:
      return tanh ? launch<float, Form::kTanh, kBackward>(x, dy, out, n, stream)
                  : launch<float, Form::kErf, kBackward>(x, dy, out, n, stream);
    case DType::kFloat16:
      return tanh ? launch<__half, Form::kTanh, kBackward>(x, dy, out, n, stream)
                  : launch<__half, Form::kErf, kBackward>(x, dy, out, n, stream);
    case DType::kBFloat16:
      return tanh ? launch<__nv_bfloat16, Form::kTanh, kBackward>(x, dy, out, n, stream)
                  : launch<__nv_bfloat16, Form::kErf, kBackward>(x, dy, out, n, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace

cudaError_t gelu_forward(const void* x, void* y, int64_t n, DType dtype, Form form, cudaStream_t stream) {
  return dispatch<false>(x, nullptr, y, n, dtype, form, stream);
}

cudaError_t gelu_backward(const void* dy, const void* x, void* dx, int64_t n, DType dtype, Form form,
                          cudaStream_t stream) {
  return dispatch<true>(x, dy, dx, n, dtype, form, stream);
}

cudaError_t gelu_forward_rows(Rows x, void* y, int64_t rows, int64_t cols, DType dtype, Form form,
                              cudaStream_t stream) {
  return dispatch_rows<false>(x, Rows{nullptr, 0, 0}, y, rows, cols, dtype, form, stream);
}

cudaError_t gelu_backward_rows(Rows dy, Rows x, void* dx, int64_t rows, int64_t cols, DType dtype, Form form,
                               cudaStream_t stream) {
  return dispatch_rows<true>(x, dy, dx, rows, cols, dtype, form, stream);
}

}  // namespace fuselab::gelu
