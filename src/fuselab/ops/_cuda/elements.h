// Element helpers shared by the ops' CUDA kernels (no torch headers): fp32 math on fp32, fp16 and bf16 data, and
// packs of consecutive elements read and written as one access (16 bytes when VEC = 16 / sizeof(T)).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace fuselab {

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) { return v; }
template <>
__device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// VEC consecutive elements, loaded and stored as one access.
template <typename T, int VEC>
struct alignas(sizeof(T) * VEC) Pack {
  T v[VEC];
};

}  // namespace fuselab
