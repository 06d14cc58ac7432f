// Softmax over the rows of a matrix, CUDA C++: launchers on raw pointers, free of torch headers.
//
// A matrix is `rows` x `width` elements with unit column stride and a row stride in elements (>= width, or 0 for
// a broadcast row). Launchers return the launch's cudaError_t; they do not synchronize. `sms` is the GPU's
// multiprocessor count and `rules` the span rules' parameters (softmax_plan.h's SpanRules, from the op's plan table):
// the launchers' plans depend on them. Where few or wide rows are cut into spans whose blocks
// meet, a launch needs scratch of softmax_forward_scratch_size(...) (backward: softmax_backward_scratch_size), asked
// with the launch's own arguments: counters that are zeros before the first launch (the launches leave them zeros, so
// one buffer serves every launch on a stream; launches on different streams at once need one each) and partials of
// any value (written before they are read). Where the size is {0, 0}, the pointers may be null.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "softmax_plan.h"

namespace fuselab {

enum class SoftmaxDType : int { f32 = 0, f16 = 1, bf16 = 2 };

struct SoftmaxScratch {
  int* counters;    // int32 zeros
  float* partials;  // 8-byte aligned
};

struct SoftmaxScratchSize {
  int64_t counters;  // elements
  int64_t partials;
};

using SoftmaxRules = softmax_plan::SpanRules;

// The scratch softmax_forward needs for these arguments (the launch's own route: softmax_plan.h's `route`).
SoftmaxScratchSize softmax_forward_scratch_size(const void* x, const void* y, int64_t rows, int64_t width,
                                                int64_t x_stride, int64_t y_stride, SoftmaxDType dtype, int sms,
                                                const SoftmaxRules& rules);

// The scratch softmax_backward needs for these arguments.
SoftmaxScratchSize softmax_backward_scratch_size(const void* y, const void* dy, const void* dx, int64_t rows,
                                                 int64_t width, int64_t y_stride, int64_t dy_stride, int64_t dx_stride,
                                                 SoftmaxDType dtype, int sms, const SoftmaxRules& rules);

// y[r, :] = softmax(x[r, :]), math in fp32.
cudaError_t softmax_forward(const void* x, void* y, int64_t rows, int64_t width, int64_t x_stride, int64_t y_stride,
                            SoftmaxDType dtype, int sms, const SoftmaxRules& rules, SoftmaxScratch scratch,
                            cudaStream_t stream);

// dx[r, :] = y[r, :] * (dy[r, :] - sum(dy[r, :] * y[r, :])), math in fp32.
cudaError_t softmax_backward(const void* y, const void* dy, void* dx, int64_t rows, int64_t width, int64_t y_stride,
                             int64_t dy_stride, int64_t dx_stride, SoftmaxDType dtype, int sms,
                             const SoftmaxRules& rules, SoftmaxScratch scratch, cudaStream_t stream);

}  // namespace fuselab
