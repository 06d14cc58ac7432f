// Softmax over the rows of a matrix, CUDA C++: launchers on raw pointers, free of torch headers.
//
// A matrix is `rows` x `width` elements with unit column stride and a row stride in elements (>= width, or 0 for
// a broadcast row). Launchers return the launch's cudaError_t; they do not synchronize.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace fuselab {

enum class SoftmaxDType : int { f32 = 0, f16 = 1, bf16 = 2 };

// y[r, :] = softmax(x[r, :]), math in fp32.
cudaError_t softmax_forward(const void* x, void* y, int64_t rows, int64_t width, int64_t x_stride, int64_t y_stride,
                            SoftmaxDType dtype, cudaStream_t stream);

// dx[r, :] = y[r, :] * (dy[r, :] - sum(dy[r, :] * y[r, :])), math in fp32.
cudaError_t softmax_backward(const void* y, const void* dy, void* dx, int64_t rows, int64_t width, int64_t y_stride,
                             int64_t dy_stride, int64_t dx_stride, SoftmaxDType dtype, cudaStream_t stream);

}  // namespace fuselab
