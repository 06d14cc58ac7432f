// A torch-free CUDA source for the inspect tests: a scalar and a float4-vectorized copy-scale kernel.
#include <cstdint>

template <typename T>
__global__ void scale_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t n) {
  int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) y[i] = x[i] + x[i];
}

__global__ void scale4_kernel(const float4* __restrict__ x, float4* __restrict__ y, int64_t n4) {
  int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n4) {
    float4 v = x[i];
    y[i] = make_float4(2.f * v.x, 2.f * v.y, 2.f * v.z, 2.f * v.w);
  }
}

template __global__ void scale_kernel<float>(const float*, float*, int64_t);
