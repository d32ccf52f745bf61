// The 16-bit float types of the CUDA headers in ctxpar's DType (kernels/dtype.hpp). Included by
// every CUDA-aware header that moves or computes on them (kernels/cuda/ops_cuda.hpp,
// src/dist/comm_device.hpp), so the specializations exist once.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "dtype.hpp"

namespace ctxpar {
template <> struct DTypeOf<__nv_bfloat16> { static constexpr DType value = DType::bf16; };
template <> struct DTypeOf<__half> { static constexpr DType value = DType::f16; };
}  // namespace ctxpar
