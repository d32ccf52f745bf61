#include "dist/device_comm.hpp"

#include <unistd.h>

#include "dist/cuda_util.hpp"

namespace ctxpar {

size_t dev_dtype_bytes(DevDType t) {
  switch (t) {
    case DevDType::f32: return 4;
    case DevDType::f64: return 8;
    case DevDType::i32: return 4;
    case DevDType::i64: return 8;
    case DevDType::u8: return 1;
    case DevDType::bf16: return 2;
    case DevDType::f16: return 2;
  }
  return 1;
}

const char* dev_dtype_name(DevDType t) {
  switch (t) {
    case DevDType::f32: return "f32";
    case DevDType::f64: return "f64";
    case DevDType::i32: return "i32";
    case DevDType::i64: return "i64";
    case DevDType::u8: return "u8";
    case DevDType::bf16: return "bf16";
    case DevDType::f16: return "f16";
  }
  return "?";
}

namespace dist_detail {

std::string host_name() {
  char h[256] = {0};
  if (gethostname(h, sizeof h - 1) != 0) return "?";
  return h;
}

}  // namespace dist_detail

}  // namespace ctxpar
