// The CBLAS routines the kernels call, handed over from Python as function
// pointers (ILP64: 64-bit sizes), so that one build works with MKL or OpenBLAS.
#ifndef VIT_JAX_KERNELS_BLAS_H_
#define VIT_JAX_KERNELS_BLAS_H_

#include <cstdint>
#include <vector>

namespace vit_jax {

constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112;

// sgemm(layout, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc).
using Sgemm = void (*)(int, int, int, int64_t, int64_t, int64_t, float,
                       const float*, int64_t, const float*, int64_t, float,
                       float*, int64_t);
// The same for `batch` products whose operands lie `stride_*` floats apart.
using SgemmBatchStrided = void (*)(int, int, int, int64_t, int64_t, int64_t,
                                   float, const float*, int64_t, int64_t,
                                   const float*, int64_t, int64_t, float,
                                   float*, int64_t, int64_t, int64_t);

extern Sgemm sgemm;                              // Required.
extern SgemmBatchStrided sgemm_batch_strided;  // Optional (MKL has it).

// `batch` row-major products C_i = alpha op(A_i) op(B_i) + beta C_i, the i-th
// operands `stride_*` floats after the previous ones.
inline void GemmBatch(bool trans_a, bool trans_b, int64_t m, int64_t n,
                      int64_t k, float alpha, const float* a, int64_t lda,
                      int64_t stride_a, const float* b, int64_t ldb,
                      int64_t stride_b, float beta, float* c, int64_t ldc,
                      int64_t stride_c, int64_t batch) {
  const int ta = trans_a ? kTrans : kNoTrans, tb = trans_b ? kTrans : kNoTrans;
  if (sgemm_batch_strided != nullptr && stride_c >= ldc * m) {
    sgemm_batch_strided(kRowMajor, ta, tb, m, n, k, alpha, a, lda, stride_a, b,
                        ldb, stride_b, beta, c, ldc, stride_c, batch);
    return;
  }
  if (sgemm_batch_strided != nullptr) {
    // Interleaved outputs (e.g. heads of a (T, N, H) tensor), which the batched
    // call refuses: compute into contiguous scratch, then add into place.
    thread_local std::vector<float> scratch;
    scratch.resize(batch * m * n);
    sgemm_batch_strided(kRowMajor, ta, tb, m, n, k, alpha, a, lda, stride_a, b,
                        ldb, stride_b, 0.0f, scratch.data(), n, m * n, batch);
    for (int64_t i = 0; i < batch; ++i) {
      for (int64_t r = 0; r < m; ++r) {
        const float* from = scratch.data() + (i * m + r) * n;
        float* to = c + i * stride_c + r * ldc;
        for (int64_t j = 0; j < n; ++j) to[j] = from[j] + (beta == 0.0f ? 0.0f : beta * to[j]);
      }
    }
    return;
  }
  for (int64_t i = 0; i < batch; ++i) {
    sgemm(kRowMajor, ta, tb, m, n, k, alpha, a + i * stride_a, lda,
          b + i * stride_b, ldb, beta, c + i * stride_c, ldc);
  }
}

}  // namespace vit_jax

#endif  // VIT_JAX_KERNELS_BLAS_H_
