// Convolutions for XLA:CPU as products on the BLAS:
// out (B, OH, OW, F) = x (B, H, W, C) conv w (KH, KW, C, F), NHWC and HWIO,
// with strides and zero padding, no dilation, one feature group.
//
// The output's B * OH * OW rows are cut into panels spread over XLA's intra-op
// thread pool. Each thread gathers its panel's input patches (im2col) into a
// buffer that stays in its cache, (rows, KH * KW * C), and multiplies it with
// w read as (KH * KW * C, F): no patch matrix goes out to memory. float32 on
// sgemm; bfloat16 on MKL's bfloat16 product (float32 accumulation, rounded
// once), w packed once where MKL can. The weight gradient gathers the same
// patches and multiplies their transpose with the output's gradient, each task
// summing its panels in float32.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "blas.h"
#include "parallel_for.h"
#include "vector_math.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace vit_jax {
namespace {

struct Geometry {
  int64_t batch, height, width, channels;     // x
  int64_t kernel_h, kernel_w, features;       // w
  int64_t out_h, out_w;                       // out
  int64_t stride_h, stride_w, pad_top, pad_left;

  int64_t Rows() const { return batch * out_h * out_w; }
  int64_t Depth() const { return kernel_h * kernel_w * channels; }
};

// cols (rows, KH * KW * C) = the patches of output rows [first, first + rows),
// zero where a patch reaches into the padding.
template <typename T>
void GatherPatches(const T* x, const Geometry& g, int64_t first, int64_t rows, T* cols) {
  const int64_t run = g.kernel_w * g.channels;  // One kernel row: adjacent in x.
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t row = first + r;
    const int64_t b = row / (g.out_h * g.out_w);
    const int64_t oh = row / g.out_w % g.out_h, ow = row % g.out_w;
    const int64_t left = ow * g.stride_w - g.pad_left;
    T* dst = cols + r * g.Depth();
    for (int64_t i = 0; i < g.kernel_h; ++i, dst += run) {
      const int64_t ih = oh * g.stride_h - g.pad_top + i;
      if (ih < 0 || ih >= g.height) {
        std::memset(dst, 0, run * sizeof(T));
        continue;
      }
      const T* src = x + ((b * g.height + ih) * g.width) * g.channels;
      if (left >= 0 && left + g.kernel_w <= g.width) {
        std::memcpy(dst, src + left * g.channels, run * sizeof(T));
        continue;
      }
      for (int64_t j = 0; j < g.kernel_w; ++j) {
        const int64_t iw = left + j;
        T* tap = dst + j * g.channels;
        if (iw < 0 || iw >= g.width) {
          std::memset(tap, 0, g.channels * sizeof(T));
        } else {
          std::memcpy(tap, src + iw * g.channels, g.channels * sizeof(T));
        }
      }
    }
  }
}

// g from the dimensions of x, w and out and the attributes; an error if they do not fit,
// or if the BLAS lacks the product (`has_product` false).
ffi::Error ReadGeometry(ffi::Span<const int64_t> xd, ffi::Span<const int64_t> wd,
                        ffi::Span<const int64_t> od, int64_t stride_h, int64_t stride_w,
                        int64_t pad_top, int64_t pad_left, int64_t panel_rows,
                        bool has_product, Geometry* g) {
  if (!has_product) {
    return ffi::Error::InvalidArgument("vit_jax conv: the BLAS has no product of this type");
  }
  *g = {xd[0], xd[1], xd[2], xd[3], wd[0], wd[1], wd[3], od[1], od[2],
        stride_h, stride_w, pad_top, pad_left};
  if (wd[2] != g->channels || od[0] != g->batch || od[3] != g->features) {
    return ffi::Error::InvalidArgument("vit_jax conv: x, w and out do not fit");
  }
  if (stride_h < 1 || stride_w < 1 || pad_top < 0 || pad_left < 0 || panel_rows < 1) {
    return ffi::Error::InvalidArgument("vit_jax conv: bad strides, padding or panel_rows");
  }
  return ffi::Error::Success();
}

ffi::Error ConvF32(ffi::ThreadPool pool, ffi::Buffer<ffi::F32, 4> x,
                   ffi::Buffer<ffi::F32, 4> w, ffi::Result<ffi::Buffer<ffi::F32, 4>> out,
                   int64_t stride_h, int64_t stride_w, int64_t pad_top, int64_t pad_left,
                   int64_t panel_rows) {
  Geometry g;
  if (auto error = ReadGeometry(x.dimensions(), w.dimensions(), out->dimensions(), stride_h,
                                stride_w, pad_top, pad_left, panel_rows, sgemm != nullptr, &g);
      error.failure()) {
    return error;
  }
  const int64_t m = g.Rows(), k = g.Depth(), n = g.features;
  if (m == 0 || n == 0) return ffi::Error::Success();
  const float* x_data = x.typed_data();
  const float* w_data = w.typed_data();
  float* out_data = out->typed_data();
  ParallelFor(pool, (m + panel_rows - 1) / panel_rows, [&](int64_t panel) {
    const int64_t first = panel * panel_rows, rows = std::min(panel_rows, m - first);
    thread_local std::vector<float> cols;
    cols.resize(rows * k);
    GatherPatches(x_data, g, first, rows, cols.data());
    Gemm(false, false, rows, n, k, 1.0f, cols.data(), k, w_data, n, 0.0f,
         out_data + first * n, n);
  });
  return ffi::Error::Success();
}

ffi::Error ConvBf16(ffi::ThreadPool pool, ffi::Buffer<ffi::BF16, 4> x,
                    ffi::Buffer<ffi::BF16, 4> w, ffi::Result<ffi::Buffer<ffi::BF16, 4>> out,
                    int64_t stride_h, int64_t stride_w, int64_t pad_top, int64_t pad_left,
                    int64_t panel_rows) {
  Geometry g;
  if (auto error = ReadGeometry(x.dimensions(), w.dimensions(), out->dimensions(), stride_h,
                                stride_w, pad_top, pad_left, panel_rows,
                                gemm_bf16 != nullptr, &g);
      error.failure()) {
    return error;
  }
  const int64_t m = g.Rows(), k = g.Depth(), n = g.features;
  if (m == 0 || n == 0) return ffi::Error::Success();
  const auto* x_bits = reinterpret_cast<const uint16_t*>(x.untyped_data());
  const auto* w_bits = reinterpret_cast<const uint16_t*>(w.untyped_data());
  auto* out_bits = reinterpret_cast<uint16_t*>(out->untyped_data());
  const int64_t panels = (m + panel_rows - 1) / panel_rows;
  // w packed once for all panels, where MKL can and there is more than one.
  const bool pack = gemm_bf16_compute != nullptr && panels > 1;
  thread_local std::vector<uint16_t> packed;  // Read by every panel's thread.
  if (pack) {
    packed.resize(gemm_bf16_pack_size(kBMatrix, panel_rows, n, k) / sizeof(uint16_t) + 1);
    gemm_bf16_pack(kRowMajor, kBMatrix, kNoTrans, panel_rows, n, k, w_bits, n,
                   packed.data());
  }
  const uint16_t* packed_w = packed.data();
  ParallelFor(pool, panels, [&](int64_t panel) {
    const int64_t first = panel * panel_rows, rows = std::min(panel_rows, m - first);
    thread_local std::vector<uint16_t> cols;
    thread_local std::vector<float> c;
    cols.resize(rows * k);
    c.resize(rows * n);
    GatherPatches(x_bits, g, first, rows, cols.data());
    if (pack) {
      gemm_bf16_compute(kRowMajor, kNoTrans, kPacked, rows, n, k, 1.0f, cols.data(), k,
                        packed_w, n, 0.0f, c.data(), n);
    } else {
      gemm_bf16(kRowMajor, kNoTrans, kNoTrans, rows, n, k, 1.0f, cols.data(), k, w_bits, n,
                0.0f, c.data(), n);
    }
    uint16_t* o = out_bits + first * n;
    for (int64_t i = 0; i < rows * n; ++i) o[i] = RoundToBfloat16(c[i]);
  });
  return ffi::Error::Success();
}

// Threads' partial sums of the weight gradient: at most this many, each (KH * KW * C, F).
constexpr int64_t kMaxParts = 8;

// d_w (KH * KW * C, F) = patches(x)^T (KH * KW * C, rows) @ d_out (rows, F), in float32:
// the panels of output rows are split into `parts` contiguous runs, each accumulated by one
// task into its own float32 sum; the sums are added at the end.
template <typename T, typename Multiply>
void WeightGradient(ffi::ThreadPool& pool, const T* x, const Geometry& g, int64_t panel_rows,
                    const Multiply& multiply, float* d_w) {
  const int64_t m = g.Rows(), k = g.Depth(), n = g.features;
  const int64_t panels = (m + panel_rows - 1) / panel_rows;
  const int64_t parts = std::max<int64_t>(
      1, std::min<int64_t>({panels, pool.num_threads() + 1, kMaxParts}));
  std::vector<float> sums((parts - 1) * k * n);
  ParallelFor(pool, parts, [&](int64_t part) {
    float* sum = part == 0 ? d_w : sums.data() + (part - 1) * k * n;
    std::fill(sum, sum + k * n, 0.0f);
    thread_local std::vector<T> cols;
    for (int64_t panel = part * panels / parts; panel < (part + 1) * panels / parts; ++panel) {
      const int64_t first = panel * panel_rows, rows = std::min(panel_rows, m - first);
      cols.resize(rows * k);
      GatherPatches(x, g, first, rows, cols.data());
      multiply(cols.data(), first, rows, sum);  // sum += cols^T @ d_out[first:first + rows]
    }
  });
  for (int64_t part = 1; part < parts; ++part) {
    const float* sum = sums.data() + (part - 1) * k * n;
    for (int64_t i = 0; i < k * n; ++i) d_w[i] += sum[i];
  }
}

// sum (K, F) += cols^T (K, rows) @ grad (rows, F), in float32: sgemm for float32 operands,
// MKL's bfloat16 product for bfloat16 ones (their bits).
void AddTransposedProduct(int64_t k, int64_t n, int64_t rows, const float* cols,
                          const float* grad, float* sum) {
  Gemm(true, false, k, n, rows, 1.0f, cols, k, grad, n, 1.0f, sum, n);
}

void AddTransposedProduct(int64_t k, int64_t n, int64_t rows, const uint16_t* cols,
                          const uint16_t* grad, float* sum) {
  gemm_bf16(kRowMajor, kTrans, kNoTrans, k, n, rows, 1.0f, cols, k, grad, n, 1.0f, sum, n);
}

// The weight gradient of x and d_out of type kType (Element: float, or uint16_t for
// bfloat16's bits), in float32.
template <ffi::DataType kType, typename Element>
ffi::Error ConvWeightGrad(ffi::ThreadPool pool, ffi::Buffer<kType, 4> x,
                          ffi::Buffer<kType, 4> d_out,
                          ffi::Result<ffi::Buffer<ffi::F32, 4>> d_w, int64_t stride_h,
                          int64_t stride_w, int64_t pad_top, int64_t pad_left,
                          int64_t panel_rows) {
  constexpr bool kFloat32 = std::is_same_v<Element, float>;
  Geometry g;
  if (auto error = ReadGeometry(x.dimensions(), d_w->dimensions(), d_out.dimensions(),
                                stride_h, stride_w, pad_top, pad_left, panel_rows,
                                kFloat32 ? sgemm != nullptr : gemm_bf16 != nullptr, &g);
      error.failure()) {
    return error;
  }
  const auto* grad = reinterpret_cast<const Element*>(d_out.untyped_data());
  const int64_t k = g.Depth(), n = g.features;
  WeightGradient(pool, reinterpret_cast<const Element*>(x.untyped_data()), g, panel_rows,
                 [&](const Element* cols, int64_t first, int64_t rows, float* sum) {
                   AddTransposedProduct(k, n, rows, cols, grad + first * n, sum);
                 },
                 d_w->typed_data());
  return ffi::Error::Success();
}

}  // namespace
}  // namespace vit_jax

#define VIT_JAX_CONV_BINDING(kType)                   \
  ffi::Ffi::Bind()                                    \
      .Ctx<ffi::ThreadPool>()                         \
      .Arg<ffi::Buffer<kType, 4>>()                   \
      .Arg<ffi::Buffer<kType, 4>>()                   \
      .Ret<ffi::Buffer<kType, 4>>()                   \
      .Attr<int64_t>("stride_h")                      \
      .Attr<int64_t>("stride_w")                      \
      .Attr<int64_t>("pad_top")                       \
      .Attr<int64_t>("pad_left")                      \
      .Attr<int64_t>("panel_rows")

XLA_FFI_DEFINE_HANDLER_SYMBOL(VitJaxConvF32, vit_jax::ConvF32,
                              VIT_JAX_CONV_BINDING(ffi::F32));
XLA_FFI_DEFINE_HANDLER_SYMBOL(VitJaxConvBf16, vit_jax::ConvBf16,
                              VIT_JAX_CONV_BINDING(ffi::BF16));

// The weight gradient: x (B, H, W, C) and d_out (B, OH, OW, F) -> float32 (KH, KW, C, F).
#define VIT_JAX_CONV_WEIGHT_GRAD_BINDING(kType)      \
  ffi::Ffi::Bind()                                    \
      .Ctx<ffi::ThreadPool>()                         \
      .Arg<ffi::Buffer<kType, 4>>()                   \
      .Arg<ffi::Buffer<kType, 4>>()                   \
      .Ret<ffi::Buffer<ffi::F32, 4>>()                \
      .Attr<int64_t>("stride_h")                      \
      .Attr<int64_t>("stride_w")                      \
      .Attr<int64_t>("pad_top")                       \
      .Attr<int64_t>("pad_left")                      \
      .Attr<int64_t>("panel_rows")

XLA_FFI_DEFINE_HANDLER_SYMBOL(VitJaxConvWeightGradF32,
                              (vit_jax::ConvWeightGrad<ffi::F32, float>),
                              VIT_JAX_CONV_WEIGHT_GRAD_BINDING(ffi::F32));
XLA_FFI_DEFINE_HANDLER_SYMBOL(VitJaxConvWeightGradBf16,
                              (vit_jax::ConvWeightGrad<ffi::BF16, uint16_t>),
                              VIT_JAX_CONV_WEIGHT_GRAD_BINDING(ffi::BF16));
