// Which instruction set the CPU kernels run (kernels/ops.hpp, KernelIsa): read from CPUID once,
// or from CTXPAR_ISA. Never from a timing: the choice fixes the order of the kernels' sums, and a
// choice made from a measured rate could differ between ranks or runs under load.
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "ops.hpp"

namespace ctxpar {

namespace {

bool cpu_has_avx2() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

bool cpu_has_avx512() {
  __builtin_cpu_init();
  return cpu_has_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
}

// CTXPAR_ISA parsed: the ISA it names, or the message that says what is wrong with it.
struct Request {
  bool set = false;
  KernelIsa isa = KernelIsa::scalar;
  std::string error;
};

Request read_request() {
  Request r;
  const char* v = std::getenv("CTXPAR_ISA");
  if (!v || !*v) return r;
  r.set = true;
  const std::string s = v;
  if (s == "scalar") r.isa = KernelIsa::scalar;
  else if (s == "avx2") r.isa = KernelIsa::avx2;
  else if (s == "avx512") r.isa = KernelIsa::avx512;
  else {
    r.error = "CTXPAR_ISA = '" + s + "' is not an instruction set of the CPU kernels; valid: scalar, avx2, avx512 "
              "(or unset: the widest this CPU runs, " + std::string(kernel_isa_name(kernel_isa_widest())) + ")";
    return r;
  }
  if (int(r.isa) > int(kernel_isa_widest()))
    r.error = "CTXPAR_ISA = '" + s + "' but this CPU runs at most " + kernel_isa_name(kernel_isa_widest()) +
              "; valid: scalar" + (kernel_isa_widest() != KernelIsa::scalar ? ", avx2" : "") +
              (kernel_isa_widest() == KernelIsa::avx512 ? ", avx512" : "") + " or unset";
  return r;
}

const Request& request() {
  static const Request r = read_request();
  return r;
}

}  // namespace

KernelIsa kernel_isa_widest() {
  static const KernelIsa w = cpu_has_avx512() ? KernelIsa::avx512 : cpu_has_avx2() ? KernelIsa::avx2 : KernelIsa::scalar;
  return w;
}

bool kernel_isa_forced() { return request().set && request().error.empty(); }

std::string kernel_isa_error() { return request().error; }

KernelIsa kernel_isa() {
  const Request& r = request();
  if (!r.error.empty()) throw std::invalid_argument(r.error);
  return r.set ? r.isa : kernel_isa_widest();
}

const char* kernel_isa_name(KernelIsa isa) {
  switch (isa) {
    case KernelIsa::scalar: return "scalar";
    case KernelIsa::avx2: return "avx2";
    case KernelIsa::avx512: return "avx512";
  }
  return "?";
}

}  // namespace ctxpar
