// The CBLAS routines the kernels call, handed over from Python as function
// pointers (ILP64: 64-bit sizes), so that one build works with MKL or OpenBLAS.
#ifndef VIT_JAX_KERNELS_BLAS_H_
#define VIT_JAX_KERNELS_BLAS_H_

#include <cstddef>
#include <cstdint>

namespace vit_jax {

constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112;

// sgemm(layout, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc).
using Sgemm = void (*)(int, int, int, int64_t, int64_t, int64_t, float,
                       const float*, int64_t, const float*, int64_t, float,
                       float*, int64_t);
// cblas_gemm_bf16bf16f32(layout, trans_a, trans_b, m, n, k, alpha, a, lda, b,
// ldb, beta, c, ldc): bfloat16 operands (their bits), float32 accumulation and
// result (MKL has it; on CPUs with AMX it runs on the tile units).
using GemmBf16 = void (*)(int, int, int, int64_t, int64_t, int64_t, float,
                          const uint16_t*, int64_t, const uint16_t*, int64_t,
                          float, float*, int64_t);
// MKL_Set_Num_Threads_Local: threads of this thread's BLAS calls; returns the
// previous setting (0: the global one).
using SetThreadsLocal = int (*)(int);
// MKL's packed bfloat16 product: cblas_gemm_bf16bf16f32_pack_get_size(identifier,
// m, n, k) bytes hold op(B) packed by cblas_gemm_bf16bf16f32_pack(layout,
// identifier, trans, m, n, k, src, ld, dest), which
// cblas_gemm_bf16bf16f32_compute(layout, trans_a, packed, m, n, k, alpha, a, lda,
// dest, ldb, beta, c, ldc) multiplies.
constexpr int kPacked = 151, kBMatrix = 162;
using GemmBf16PackSize = std::size_t (*)(int, int64_t, int64_t, int64_t);
using GemmBf16Pack = void (*)(int, int, int, int64_t, int64_t, int64_t,
                              const uint16_t*, int64_t, uint16_t*);
using GemmBf16Compute = void (*)(int, int, int, int64_t, int64_t, int64_t, float,
                                 const uint16_t*, int64_t, const uint16_t*,
                                 int64_t, float, float*, int64_t);

extern Sgemm sgemm;                        // Required.
extern SetThreadsLocal set_threads_local;  // Optional (MKL has it).
extern GemmBf16 gemm_bf16;                 // Optional (MKL has it).
extern GemmBf16PackSize gemm_bf16_pack_size;  // Optional, all three or none.
extern GemmBf16Pack gemm_bf16_pack;
extern GemmBf16Compute gemm_bf16_compute;

// Row-major C = alpha op(A) op(B) + beta C.
inline void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                 float alpha, const float* a, int64_t lda, const float* b,
                 int64_t ldb, float beta, float* c, int64_t ldc) {
  sgemm(kRowMajor, trans_a ? kTrans : kNoTrans, trans_b ? kTrans : kNoTrans, m,
        n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

}  // namespace vit_jax

#endif  // VIT_JAX_KERNELS_BLAS_H_
