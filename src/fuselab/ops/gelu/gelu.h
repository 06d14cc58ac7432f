// GELU CUDA kernels: launchers on raw device pointers. No torch headers here or in gelu.cu, so that
// `nvcc -arch=sm_90 -c gelu.cu` checks the kernels on any machine; gelu_binding.cpp is the torch side.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace fuselab::gelu {

enum class DType : int { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };
enum class Form : int { kTanh = 0, kErf = 1 };  // F.gelu's approximate="tanh" / "none"

// y[i] = gelu(x[i]) for 0 <= i < n. x, y: device pointers to n contiguous elements of `dtype` (any alignment;
// 16-byte aligned pointers take the vectorized path, a misaligned x into an aligned y is read element by element
// into y's 16-byte vectors). Enqueued on `stream`; returns the launch's error.
cudaError_t gelu_forward(const void* x, void* y, int64_t n, DType dtype, Form form, cudaStream_t stream);

// dx[i] = dy[i] * gelu'(x[i]) for 0 <= i < n; dy, x, dx as above, all of `dtype`.
cudaError_t gelu_backward(const void* dy, const void* x, void* dx, int64_t n, DType dtype, Form form,
                          cudaStream_t stream);

// A (rows, cols) matrix of elements in memory: its address and strides, in elements.
struct Rows {
  const void* data;
  int64_t row_stride;
  int64_t col_stride;
};

// y[r * cols + c] = gelu(x[r, c]) for a (rows, cols) x of any strides; y: contiguous, 16-byte aligned.
cudaError_t gelu_forward_rows(Rows x, void* y, int64_t rows, int64_t cols, DType dtype, Form form,
                              cudaStream_t stream);

// dx[r * cols + c] = dy[r, c] * gelu'(x[r, c]); dy, x: (rows, cols) of their own strides; dx as y above.
cudaError_t gelu_backward_rows(Rows dy, Rows x, void* dx, int64_t rows, int64_t cols, DType dtype, Form form,
                               cudaStream_t stream);

}  // namespace fuselab::gelu
