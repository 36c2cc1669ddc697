// Float32 matrix product for XLA:CPU through the XLA FFI, computed by the
// CBLAS sgemm (MKL or OpenBLAS) that Python registers. Either operand may be
// read transposed, so the backward pass needs no transposed copies.
#include <cstdint>

#include "blas.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace vit_jax {

Sgemm sgemm = nullptr;
SetThreadsLocal set_threads_local = nullptr;

using Matrix = ffi::Buffer<ffi::F32, 2>;

// out (M, N) = op(a) @ op(b); op(a) is (M, K), op(b) is (K, N).
static ffi::Error GemmHandler(Matrix a, Matrix b, ffi::Result<Matrix> out,
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
  Gemm(transpose_a, transpose_b, m, n, k, 1.0f, a.typed_data(), a_dims[1],
       b.typed_data(), b_dims[1], 0.0f, out->typed_data(), n);
  return ffi::Error::Success();
}

}  // namespace vit_jax

extern "C" void vit_jax_set_blas(void* sgemm, void* set_threads_local) {
  vit_jax::sgemm = reinterpret_cast<vit_jax::Sgemm>(sgemm);
  vit_jax::set_threads_local =
      reinterpret_cast<vit_jax::SetThreadsLocal>(set_threads_local);
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(VitJaxGemmF32, vit_jax::GemmHandler,
                              ffi::Ffi::Bind()
                                  .Arg<vit_jax::Matrix>()
                                  .Arg<vit_jax::Matrix>()
                                  .Ret<vit_jax::Matrix>()
                                  .Attr<bool>("transpose_a")
                                  .Attr<bool>("transpose_b"));
