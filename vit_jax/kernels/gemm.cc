// Float32 matrix product for XLA:CPU through the XLA FFI, computed by a CBLAS
// sgemm (MKL or OpenBLAS) that Python hands over as a function pointer.
// Either operand may be read transposed, so the backward pass needs no copies.
#include <cstdint>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

// ILP64 CBLAS sgemm: (layout, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb,
// beta, c, ldc).
using Sgemm = void (*)(int, int, int, int64_t, int64_t, int64_t, float,
                       const float*, int64_t, const float*, int64_t, float,
                       float*, int64_t);
constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112;

using Matrix = ffi::Buffer<ffi::F32, 2>;

static Sgemm sgemm = nullptr;

extern "C" void vit_jax_set_sgemm(void* fn) {
  sgemm = reinterpret_cast<Sgemm>(fn);
}

// out (M, N) = op(a) @ op(b); op(a) is (M, K), op(b) is (K, N).
static ffi::Error Gemm(Matrix a, Matrix b, ffi::Result<Matrix> out,
                       bool transpose_a, bool transpose_b) {
  if (sgemm == nullptr) {
    return ffi::Error::InvalidArgument("vit_jax: no sgemm was registered");
  }
  auto a_dims = a.dimensions(), b_dims = b.dimensions();
  int64_t m = transpose_a ? a_dims[1] : a_dims[0];
  int64_t k = transpose_a ? a_dims[0] : a_dims[1];
  int64_t n = transpose_b ? b_dims[0] : b_dims[1];
  if ((transpose_b ? b_dims[1] : b_dims[0]) != k) {
    return ffi::Error::InvalidArgument("vit_jax gemm: contraction sizes differ");
  }
  sgemm(kRowMajor, transpose_a ? kTrans : kNoTrans,
        transpose_b ? kTrans : kNoTrans, m, n, k, 1.0f, a.typed_data(),
        a_dims[1], b.typed_data(), b_dims[1], 0.0f, out->typed_data(), n);
  return ffi::Error::Success();
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(VitJaxGemmF32, Gemm,
                              ffi::Ffi::Bind()
                                  .Arg<Matrix>()
                                  .Arg<Matrix>()
                                  .Ret<Matrix>()
                                  .Attr<bool>("transpose_a")
                                  .Attr<bool>("transpose_b"));
