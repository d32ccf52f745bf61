// The element types and devices of ctxpar's tensors and messages, declared once for every module:
// the attention descriptor (attn_params.hpp), the GEMMs, and the communicator (src/dist/comm.hpp)
// all speak this DType. Header only, no dependencies; compiles as C++17 under nvcc.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

// The CUDA runtime's stream handle is `CUstream_st*`; naming the struct here lets host-only code
// carry a stream without the CUDA headers.
struct CUstream_st;
struct CUevent_st;

namespace ctxpar {

enum class DType : int32_t { f32, f64, i32, i64, u8, bf16, f16 };

constexpr size_t dtype_bytes(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::f64: return 8;
    case DType::i32: return 4;
    case DType::i64: return 8;
    case DType::u8: return 1;
    case DType::bf16: return 2;
    case DType::f16: return 2;
  }
  return 1;
}

constexpr const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f64: return "f64";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
    case DType::u8: return "u8";
    case DType::bf16: return "bf16";
    case DType::f16: return "f16";
  }
  return "?";
}

// The bf16 bits of x rounded to nearest, ties to even (finite x; the upper 16 bits of the fp32
// pattern after rounding), for host code that builds bf16 tensors.
inline uint16_t bf16_bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

// Where a buffer lives and where a call runs. A CUDA stream goes with Device::cuda (null = the
// legacy default stream).
enum class Device : int32_t { cpu, cuda };
using Stream = CUstream_st*;
using Event = CUevent_st*;  // a CUDA event (cudaEvent_t)

// dtype_of<T>(): the DType of a C++ element type. The 16-bit float types of the CUDA headers are
// added by kernels/dtype_cuda.hpp (included by the CUDA-aware headers).
template <class T> struct DTypeOf;
template <> struct DTypeOf<float> { static constexpr DType value = DType::f32; };
template <> struct DTypeOf<double> { static constexpr DType value = DType::f64; };
template <> struct DTypeOf<int32_t> { static constexpr DType value = DType::i32; };
template <> struct DTypeOf<int64_t> { static constexpr DType value = DType::i64; };
template <> struct DTypeOf<uint8_t> { static constexpr DType value = DType::u8; };
template <> struct DTypeOf<std::byte> { static constexpr DType value = DType::u8; };
template <class T> constexpr DType dtype_of() { return DTypeOf<std::remove_cv_t<T>>::value; }

}  // namespace ctxpar
