// A test double of kernels/cuda/gemm_cublaslt.cu for builds on the CUDA runtime double
// (ctxpar_cuda_emu_streams, ctxpar_emu): the same entry points (kernels/cuda/ops_cuda.hpp, "GEMM"),
// each call enqueued on its stream (cudaLaunchHostFunc) as a host GEMM on fp32 copies of the
// operands (ctxpar::sgemm), the result rounded to C's type once. "Device" memory is host memory
// there. It stands in for cuBLASLt so that the code around GEMMs runs in CI; cuBLASLt itself is
// checked only on a GPU (tests/gpu/test_cuda_ops.cpp, CudaGemm).
#include <cuda_runtime_api.h>

#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "cuda/ops_cuda.hpp"
#include "ops.hpp"

namespace ctxpar::cuda {
namespace {

float load(const void* p, DType t, int64_t i) {
  if (t == DType::f32) return static_cast<const float*>(p)[i];
  const uint32_t u = uint32_t(static_cast<const uint16_t*>(p)[i]) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
void store(void* p, DType t, int64_t i, float v) {
  if (t == DType::f32) static_cast<float*>(p)[i] = v;
  else static_cast<uint16_t*>(p)[i] = bf16_bits(v);
}

struct Job {
  bool ta, tb;
  int64_t M, N, K;
  float alpha, beta;
  const void* A;
  DType at;
  int64_t lda;
  const void* B;
  DType bt;
  int64_t ldb;
  void* C;
  DType ct;
  int64_t ldc;
  void run() const {
    const int64_t ar = ta ? K : M, ac = ta ? M : K, br = tb ? N : K, bc = tb ? K : N;
    std::vector<float> a(size_t(ar * ac)), b(size_t(br * bc)), c(size_t(M * N));
    for (int64_t i = 0; i < ar; ++i)
      for (int64_t j = 0; j < ac; ++j) a[size_t(i * ac + j)] = load(A, at, i * lda + j);
    for (int64_t i = 0; i < br; ++i)
      for (int64_t j = 0; j < bc; ++j) b[size_t(i * bc + j)] = load(B, bt, i * ldb + j);
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) c[size_t(i * N + j)] = beta == 0.f ? 0.f : load(C, ct, i * ldc + j);
    ctxpar::sgemm(ta, tb, M, N, K, alpha, a.data(), ac, b.data(), bc, beta, c.data(), N);
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) store(C, ct, i * ldc + j, c[size_t(i * N + j)]);
  }
};

}  // namespace

void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const void* A, DType a_type,
          int64_t lda, const void* B, DType b_type, int64_t ldb, float beta, void* C, DType c_type, int64_t ldc,
          cudaStream_t stream) {
  const bool ok = (a_type == DType::f32 && b_type == DType::f32 && c_type == DType::f32) ||
                  (a_type == DType::bf16 && b_type == DType::bf16 && (c_type == DType::bf16 || c_type == DType::f32));
  if (!ok) throw std::invalid_argument("ctxpar::cuda: gemm: unsupported type combination");
  if (M == 0 || N == 0) return;
  auto* job = new Job{trans_a, trans_b, M, N, K, alpha, beta, A, a_type, lda, B, b_type, ldb, C, c_type, ldc};
  const cudaError_t e = cudaLaunchHostFunc(
      stream,
      [](void* u) {
        auto* j = static_cast<Job*>(u);
        j->run();
        delete j;
      },
      job);
  if (e != cudaSuccess) throw std::runtime_error("gemm double: cudaLaunchHostFunc failed");
}

void sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
           const float* B, int64_t ldb, float beta, float* C, int64_t ldc, cudaStream_t stream) {
  gemm(trans_a, trans_b, M, N, K, alpha, A, DType::f32, lda, B, DType::f32, ldb, beta, C, DType::f32, ldc, stream);
}

void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const bf16* A, int64_t lda,
               const bf16* B, int64_t ldb, float beta, bf16* C, int64_t ldc, cudaStream_t stream) {
  gemm(trans_a, trans_b, M, N, K, alpha, A, DType::bf16, lda, B, DType::bf16, ldb, beta, C, DType::bf16, ldc, stream);
}

void gemm_bf16_f32(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const bf16* A,
                   int64_t lda, const bf16* B, int64_t ldb, float beta, float* C, int64_t ldc, cudaStream_t stream) {
  gemm(trans_a, trans_b, M, N, K, alpha, A, DType::bf16, lda, B, DType::bf16, ldb, beta, C, DType::f32, ldc, stream);
}

const char* gemm_library_name() { return "host GEMM on the CUDA runtime double (cuBLASLt not emulated)"; }

void gemm_release() {}

}  // namespace ctxpar::cuda
