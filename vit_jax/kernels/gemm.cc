// Matrix products for XLA:CPU through the XLA FFI, computed by the CBLAS that
// Python registers (MKL or OpenBLAS): float32 by sgemm, bfloat16 operands with
// float32 accumulation by MKL's cblas_gemm_bf16bf16f32. Either operand may be
// read transposed, so the backward pass needs no transposed copies. Where MKL
// has its packed bfloat16 product, op(b) is packed first, then multiplied.
#include <cstdint>
#include <vector>

#include "blas.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace vit_jax {

Sgemm sgemm = nullptr;
SetThreadsLocal set_threads_local = nullptr;
GemmBf16 gemm_bf16 = nullptr;
GemmBf16PackSize gemm_bf16_pack_size = nullptr;
GemmBf16Pack gemm_bf16_pack = nullptr;
GemmBf16Compute gemm_bf16_compute = nullptr;

using Matrix = ffi::Buffer<ffi::F32, 2>;
using Bf16Matrix = ffi::Buffer<ffi::BF16, 2>;

// c (M, N) = op(a) @ op(b) on the registered routine: sgemm for float32
// operands, gemm_bf16 for bfloat16 ones (their bits); false if none is.
static bool Multiply(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k,
                     const float* a, int64_t lda, const float* b, int64_t ldb, float* c) {
  if (sgemm == nullptr) return false;
  Gemm(transpose_a, transpose_b, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, n);
  return true;
}

// Products of at most this many rows multiply unpacked (as dense.cc's single panel).
constexpr int64_t kUnpackedMaxRows = 128;

static bool Multiply(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k,
                     const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb, float* c) {
  if (gemm_bf16 == nullptr) return false;
  if (gemm_bf16_compute != nullptr && m > kUnpackedMaxRows) {
    // Packing op(b) once, then multiplying, measured faster than the unpacked call
    // on most of the ViTs' products (the backward pass's most); for a few rows (a
    // decoding step's) packing costs more than the product.
    thread_local std::vector<uint16_t> packed;
    packed.resize(gemm_bf16_pack_size(kBMatrix, m, n, k) / sizeof(uint16_t) + 1);
    gemm_bf16_pack(kRowMajor, kBMatrix, transpose_b ? kTrans : kNoTrans, m, n, k, b, ldb,
                   packed.data());
    gemm_bf16_compute(kRowMajor, transpose_a ? kTrans : kNoTrans, kPacked, m, n, k, 1.0f, a,
                      lda, packed.data(), ldb, 0.0f, c, n);
    return true;
  }
  gemm_bf16(kRowMajor, transpose_a ? kTrans : kNoTrans, transpose_b ? kTrans : kNoTrans, m, n,
            k, 1.0f, a, lda, b, ldb, 0.0f, c, n);
  return true;
}

// out (M, N) = op(a) @ op(b) in float32; op(a) is (M, K), op(b) is (K, N).
// Element is the operands' C++ type: float, or uint16_t for bfloat16's bits.
template <ffi::DataType kType, typename Element>
static ffi::Error GemmHandler(ffi::Buffer<kType, 2> a, ffi::Buffer<kType, 2> b,
                              ffi::Result<Matrix> out, bool transpose_a, bool transpose_b) {
  auto a_dims = a.dimensions(), b_dims = b.dimensions();
  int64_t m = transpose_a ? a_dims[1] : a_dims[0];
  int64_t k = transpose_a ? a_dims[0] : a_dims[1];
  int64_t n = transpose_b ? b_dims[0] : b_dims[1];
  if ((transpose_b ? b_dims[1] : b_dims[0]) != k) {
    return ffi::Error::InvalidArgument("vit_jax gemm: contraction sizes differ");
  }
  if (!Multiply(transpose_a, transpose_b, m, n, k,
                reinterpret_cast<const Element*>(a.untyped_data()), a_dims[1],
                reinterpret_cast<const Element*>(b.untyped_data()), b_dims[1],
                out->typed_data())) {
    return ffi::Error::InvalidArgument("vit_jax: no gemm for these operands was registered");
  }
  return ffi::Error::Success();
}

}  // namespace vit_jax

extern "C" void vit_jax_set_blas(void* sgemm, void* set_threads_local, void* gemm_bf16,
                                 void* pack_size, void* pack, void* compute) {
  vit_jax::sgemm = reinterpret_cast<vit_jax::Sgemm>(sgemm);
  vit_jax::set_threads_local =
      reinterpret_cast<vit_jax::SetThreadsLocal>(set_threads_local);
  vit_jax::gemm_bf16 = reinterpret_cast<vit_jax::GemmBf16>(gemm_bf16);
  const bool packing = pack_size && pack && compute;
  vit_jax::gemm_bf16_pack_size =
      packing ? reinterpret_cast<vit_jax::GemmBf16PackSize>(pack_size) : nullptr;
  vit_jax::gemm_bf16_pack = packing ? reinterpret_cast<vit_jax::GemmBf16Pack>(pack) : nullptr;
  vit_jax::gemm_bf16_compute =
      packing ? reinterpret_cast<vit_jax::GemmBf16Compute>(compute) : nullptr;
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(VitJaxGemmF32, (vit_jax::GemmHandler<ffi::F32, float>),
                              ffi::Ffi::Bind()
                                  .Arg<vit_jax::Matrix>()
                                  .Arg<vit_jax::Matrix>()
                                  .Ret<vit_jax::Matrix>()
                                  .Attr<bool>("transpose_a")
                                  .Attr<bool>("transpose_b"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(VitJaxGemmBf16, (vit_jax::GemmHandler<ffi::BF16, uint16_t>),
                              ffi::Ffi::Bind()
                                  .Arg<vit_jax::Bf16Matrix>()
                                  .Arg<vit_jax::Bf16Matrix>()
                                  .Ret<vit_jax::Matrix>()
                                  .Attr<bool>("transpose_a")
                                  .Attr<bool>("transpose_b"));
