// bfloat16 Dense layers for XLA:CPU inference, on MKL's packed bfloat16
// product: out (M, N) = activation(x (M, K) @ w (K, N) + bias), accumulated in
// float32 and rounded once to bfloat16.
//
// w is packed once; the rows of x are cut into panels spread over XLA's
// intra-op thread pool, and each panel's float32 product stays in the thread's
// cache while the bias and the activation are applied, so no float32 (M, N)
// array goes out to memory and no separate pass reads it back. A single panel's
// worth of rows is multiplied unpacked.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "blas.h"
#include "parallel_for.h"
#include "vector_math.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace vit_jax {
namespace {

using Bf16Matrix = ffi::Buffer<ffi::BF16, 2>;
using Bf16Vector = ffi::Buffer<ffi::BF16, 1>;

// The activation attribute's values (vit_jax/kernels/blas_dense.py).
enum Activation : int32_t { kIdentity = 0, kGeluTanh = 1, kRelu = 2 };

// out rows = activation(c rows + bias), rounded to bfloat16.
template <int32_t kActivation>
void Epilogue(const float* c, const float* bias, int64_t rows, int64_t n,
              uint16_t* out) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* c_row = c + r * n;
    uint16_t* out_row = out + r * n;
    for (int64_t j = 0; j < n; ++j) {
      float v = c_row[j] + bias[j];
      if constexpr (kActivation == kGeluTanh) v = GeluTanh(v);
      if constexpr (kActivation == kRelu) v = std::max(v, 0.0f);
      out_row[j] = RoundToBfloat16(v);
    }
  }
}

ffi::Error DenseBf16(ffi::ThreadPool pool, Bf16Matrix x, Bf16Matrix w,
                     Bf16Vector bias, ffi::Result<Bf16Matrix> out,
                     int32_t activation, int64_t panel_rows) {
  const int64_t m = x.dimensions()[0], k = x.dimensions()[1],
                n = w.dimensions()[1];
  if (w.dimensions()[0] != k || bias.dimensions()[0] != n) {
    return ffi::Error::InvalidArgument("vit_jax dense: x, w and bias do not fit");
  }
  if (activation < kIdentity || activation > kRelu) {
    return ffi::Error::InvalidArgument("vit_jax dense: unknown activation");
  }
  if (panel_rows < 1) {
    return ffi::Error::InvalidArgument("vit_jax dense: panel_rows must be positive");
  }
  if (gemm_bf16_compute == nullptr) {
    return ffi::Error::InvalidArgument(
        "vit_jax dense: the BLAS has no packed bfloat16 product");
  }
  if (m == 0 || n == 0) return ffi::Error::Success();
  const auto* x_bits = reinterpret_cast<const uint16_t*>(x.untyped_data());
  const auto* w_bits = reinterpret_cast<const uint16_t*>(w.untyped_data());
  const auto* bias_bits = reinterpret_cast<const uint16_t*>(bias.untyped_data());
  auto* out_bits = reinterpret_cast<uint16_t*>(out->untyped_data());

  thread_local std::vector<float> bias_f32;
  bias_f32.resize(n);
  for (int64_t j = 0; j < n; ++j) bias_f32[j] = FromBfloat16(bias_bits[j]);
  // The other threads see this thread's buffers through these pointers (a
  // thread_local named in a lambda is the running thread's own).
  const float* bias_row = bias_f32.data();
  auto epilogue = [&](const float* c, int64_t first, int64_t rows) {
    uint16_t* o = out_bits + first * n;
    switch (activation) {
      case kGeluTanh: Epilogue<kGeluTanh>(c, bias_row, rows, n, o); break;
      case kRelu: Epilogue<kRelu>(c, bias_row, rows, n, o); break;
      default: Epilogue<kIdentity>(c, bias_row, rows, n, o);
    }
  };
  if (m <= panel_rows) {
    // One panel (a decoding step's few rows): packing w would cost more than
    // the product, which runs unpacked on the BLAS's own threads.
    thread_local std::vector<float> c;
    c.resize(m * n);
    gemm_bf16(kRowMajor, kNoTrans, kNoTrans, m, n, k, 1.0f, x_bits, k, w_bits, n,
              0.0f, c.data(), n);
    epilogue(c.data(), 0, m);
    return ffi::Error::Success();
  }
  thread_local std::vector<uint16_t> packed;  // Read by every panel's thread.
  packed.resize(gemm_bf16_pack_size(kBMatrix, m, n, k) / sizeof(uint16_t) + 1);
  gemm_bf16_pack(kRowMajor, kBMatrix, kNoTrans, m, n, k, w_bits, n, packed.data());
  const uint16_t* packed_w = packed.data();
  const int64_t panels = (m + panel_rows - 1) / panel_rows;
  ParallelFor(pool, panels, [&](int64_t panel) {
    const int64_t first = panel * panel_rows, rows = std::min(panel_rows, m - first);
    thread_local std::vector<float> c;
    c.resize(rows * n);
    gemm_bf16_compute(kRowMajor, kNoTrans, kPacked, rows, n, k, 1.0f,
                      x_bits + first * k, k, packed_w, n, 0.0f, c.data(), n);
    epilogue(c.data(), first, rows);
  });
  return ffi::Error::Success();
}

}  // namespace
}  // namespace vit_jax

XLA_FFI_DEFINE_HANDLER_SYMBOL(VitJaxDenseBf16, vit_jax::DenseBf16,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<vit_jax::Bf16Matrix>()
                                  .Arg<vit_jax::Bf16Matrix>()
                                  .Arg<vit_jax::Bf16Vector>()
                                  .Ret<vit_jax::Bf16Matrix>()
                                  .Attr<int32_t>("activation")
                                  .Attr<int64_t>("panel_rows"));
