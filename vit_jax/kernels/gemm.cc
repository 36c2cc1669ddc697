// Matrix products for XLA:CPU through the XLA FFI, computed by the CBLAS that
// Python registers (MKL or OpenBLAS): float32 by sgemm, bfloat16 operands with
// float32 accumulation by MKL's cblas_gemm_bf16bf16f32. Either operand may be
// read transposed, so the backward pass needs no transposed copies.
#include <cstdint>

#include "blas.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace vit_jax {

Sgemm sgemm = nullptr;
SetThreadsLocal set_threads_local = nullptr;
GemmBf16 gemm_bf16 = nullptr;

using Matrix = ffi::Buffer<ffi::F32, 2>;
using Bf16Matrix = ffi::Buffer<ffi::BF16, 2>;

struct Sizes {
  int64_t m, n, k;
};

// The sizes of op(a) (M, K) @ op(b) (K, N), or an error if K differs.
template <typename A, typename B>
static ffi::ErrorOr<Sizes> ProductSizes(const A& a, const B& b, bool transpose_a,
                                        bool transpose_b) {
  auto a_dims = a.dimensions(), b_dims = b.dimensions();
  Sizes sizes{transpose_a ? a_dims[1] : a_dims[0], transpose_b ? b_dims[0] : b_dims[1],
              transpose_a ? a_dims[0] : a_dims[1]};
  if ((transpose_b ? b_dims[1] : b_dims[0]) != sizes.k) {
    return ffi::Unexpected(ffi::Error::InvalidArgument("vit_jax gemm: contraction sizes differ"));
  }
  return sizes;
}

// out (M, N) = op(a) @ op(b); op(a) is (M, K), op(b) is (K, N).
static ffi::Error GemmHandler(Matrix a, Matrix b, ffi::Result<Matrix> out,
                              bool transpose_a, bool transpose_b) {
  if (sgemm == nullptr) {
    return ffi::Error::InvalidArgument("vit_jax: no sgemm was registered");
  }
  auto sizes = ProductSizes(a, b, transpose_a, transpose_b);
  if (sizes.has_error()) return sizes.error();
  Gemm(transpose_a, transpose_b, sizes->m, sizes->n, sizes->k, 1.0f, a.typed_data(),
       a.dimensions()[1], b.typed_data(), b.dimensions()[1], 0.0f, out->typed_data(),
       sizes->n);
  return ffi::Error::Success();
}

// The same with bfloat16 operands; the result is float32.
static ffi::Error GemmBf16Handler(Bf16Matrix a, Bf16Matrix b, ffi::Result<Matrix> out,
                                  bool transpose_a, bool transpose_b) {
  if (gemm_bf16 == nullptr) {
    return ffi::Error::InvalidArgument("vit_jax: no bfloat16 gemm was registered");
  }
  auto sizes = ProductSizes(a, b, transpose_a, transpose_b);
  if (sizes.has_error()) return sizes.error();
  gemm_bf16(kRowMajor, transpose_a ? kTrans : kNoTrans, transpose_b ? kTrans : kNoTrans,
            sizes->m, sizes->n, sizes->k, 1.0f,
            reinterpret_cast<const uint16_t*>(a.untyped_data()), a.dimensions()[1],
            reinterpret_cast<const uint16_t*>(b.untyped_data()), b.dimensions()[1], 0.0f,
            out->typed_data(), sizes->n);
  return ffi::Error::Success();
}

}  // namespace vit_jax

extern "C" void vit_jax_set_blas(void* sgemm, void* set_threads_local, void* gemm_bf16) {
  vit_jax::sgemm = reinterpret_cast<vit_jax::Sgemm>(sgemm);
  vit_jax::set_threads_local =
      reinterpret_cast<vit_jax::SetThreadsLocal>(set_threads_local);
  vit_jax::gemm_bf16 = reinterpret_cast<vit_jax::GemmBf16>(gemm_bf16);
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(VitJaxGemmF32, vit_jax::GemmHandler,
                              ffi::Ffi::Bind()
                                  .Arg<vit_jax::Matrix>()
                                  .Arg<vit_jax::Matrix>()
                                  .Ret<vit_jax::Matrix>()
                                  .Attr<bool>("transpose_a")
                                  .Attr<bool>("transpose_b"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(VitJaxGemmBf16, vit_jax::GemmBf16Handler,
                              ffi::Ffi::Bind()
                                  .Arg<vit_jax::Bf16Matrix>()
                                  .Arg<vit_jax::Bf16Matrix>()
                                  .Ret<vit_jax::Matrix>()
                                  .Attr<bool>("transpose_a")
                                  .Attr<bool>("transpose_b"));
