// Layer normalisation for XLA:CPU, forward and backward, as Flax's nn.LayerNorm
// with its defaults: per row of x (R, C), mean = E[x], var = max(0, E[x^2] -
// mean^2) in float32; out = (x - mean) * (rsqrt(var + epsilon) * scale) + bias,
// rounded once to the output type; the forward pass also returns mean and rstd
// per row for the backward pass. Each row is read once for its statistics and
// once more, from cache, to normalise; the backward pass likewise. Rows are
// spread over XLA's intra-op pool; the column sums of the scale's and the
// bias's gradients are summed per block of rows and then in block order, so
// they do not depend on which threads ran.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "parallel_for.h"
#include "vector_math.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace vit_jax {
namespace {

// Rows a task takes at a time.
constexpr int64_t kRowsPerBlock = 16;
// Independent partial sums, so that the row sums vectorise.
constexpr int kLanes = 16;

// Sums over a row of f(c), in kLanes partial sums.
template <typename F>
float RowSum(int64_t length, F f) {
  float acc[kLanes] = {};
  int64_t c = 0;
  for (; c + kLanes <= length; c += kLanes) {
    for (int lane = 0; lane < kLanes; ++lane) acc[lane] += f(c + lane);
  }
  for (; c < length; ++c) acc[0] += f(c);
  float total = 0.0f;
  for (int lane = 0; lane < kLanes; ++lane) total += acc[lane];
  return total;
}

template <typename T>
void Forward(ffi::ThreadPool& pool, const T* x, const float* scale, const float* bias,
             T* out, float* mean, float* rstd, int64_t rows, int64_t channels,
             float epsilon) {
  const int64_t blocks = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
  ParallelFor(pool, blocks, [&](int64_t block) {
    const int64_t last = std::min(rows, (block + 1) * kRowsPerBlock);
    for (int64_t r = block * kRowsPerBlock; r < last; ++r) {
      const T* x_row = x + r * channels;
      T* out_row = out + r * channels;
      const float mu = RowSum(channels, [&](int64_t c) { return Load(x_row, c); }) /
                       static_cast<float>(channels);
      const float mean_sq = RowSum(channels, [&](int64_t c) {
        const float v = Load(x_row, c);
        return v * v;
      }) / static_cast<float>(channels);
      const float inverse = 1.0f / std::sqrt(std::max(0.0f, mean_sq - mu * mu) + epsilon);
      mean[r] = mu;
      rstd[r] = inverse;
      for (int64_t c = 0; c < channels; ++c) {
        Store(out_row, c, (Load(x_row, c) - mu) * (inverse * scale[c]) + bias[c]);
      }
    }
  });
}

// The gradients of Forward's out: per row, with x_hat = (x - mean) * rstd,
// g = scale * d_out, m1 = mean(g) and m2 = mean(g * x_hat),
//   d_x = rstd * (g - m1 - x_hat * m2);
// d_scale = the column sums of d_out * x_hat, d_bias = of d_out.
template <typename T>
void Backward(ffi::ThreadPool& pool, const T* x, const T* d_out, const float* scale,
              const float* mean, const float* rstd, T* d_x, float* d_scale,
              float* d_bias, int64_t rows, int64_t channels) {
  const int64_t blocks = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
  std::vector<float> partial(blocks * channels * 2, 0.0f);
  ParallelFor(pool, blocks, [&](int64_t block) {
    float* scale_sums = partial.data() + block * channels * 2;
    float* bias_sums = scale_sums + channels;
    const int64_t last = std::min(rows, (block + 1) * kRowsPerBlock);
    for (int64_t r = block * kRowsPerBlock; r < last; ++r) {
      const T* x_row = x + r * channels;
      const T* g_row = d_out + r * channels;
      T* d_row = d_x + r * channels;
      const float mu = mean[r], inverse = rstd[r];
      const float m1 = RowSum(channels, [&](int64_t c) {
        return scale[c] * Load(g_row, c);
      }) / static_cast<float>(channels);
      const float m2 = RowSum(channels, [&](int64_t c) {
        return scale[c] * Load(g_row, c) * (Load(x_row, c) - mu) * inverse;
      }) / static_cast<float>(channels);
      for (int64_t c = 0; c < channels; ++c) {
        const float g = Load(g_row, c);
        const float x_hat = (Load(x_row, c) - mu) * inverse;
        Store(d_row, c, inverse * (scale[c] * g - m1 - x_hat * m2));
        scale_sums[c] += g * x_hat;
        bias_sums[c] += g;
      }
    }
  });
  std::fill(d_scale, d_scale + channels, 0.0f);
  std::fill(d_bias, d_bias + channels, 0.0f);
  for (int64_t block = 0; block < blocks; ++block) {
    const float* sums = partial.data() + block * channels * 2;
    for (int64_t c = 0; c < channels; ++c) {
      d_scale[c] += sums[c];
      d_bias[c] += sums[channels + c];
    }
  }
}

template <ffi::DataType kType, typename Element>
ffi::Error ForwardHandler(ffi::ThreadPool pool, ffi::Buffer<kType, 2> x,
                          ffi::Buffer<ffi::F32, 1> scale, ffi::Buffer<ffi::F32, 1> bias,
                          ffi::Result<ffi::Buffer<kType, 2>> out,
                          ffi::Result<ffi::Buffer<ffi::F32, 1>> mean,
                          ffi::Result<ffi::Buffer<ffi::F32, 1>> rstd, float epsilon) {
  const auto d = x.dimensions();
  if (scale.dimensions()[0] != d[1] || bias.dimensions()[0] != d[1] ||
      mean->dimensions()[0] != d[0]) {
    return ffi::Error::InvalidArgument("vit_jax layer_norm: x, scale, bias and out do not fit");
  }
  Forward(pool, reinterpret_cast<const Element*>(x.untyped_data()), scale.typed_data(),
          bias.typed_data(), reinterpret_cast<Element*>(out->untyped_data()),
          mean->typed_data(), rstd->typed_data(), d[0], d[1], epsilon);
  return ffi::Error::Success();
}

template <ffi::DataType kType, typename Element>
ffi::Error BackwardHandler(ffi::ThreadPool pool, ffi::Buffer<kType, 2> x,
                           ffi::Buffer<kType, 2> d_out, ffi::Buffer<ffi::F32, 1> scale,
                           ffi::Buffer<ffi::F32, 1> mean, ffi::Buffer<ffi::F32, 1> rstd,
                           ffi::Result<ffi::Buffer<kType, 2>> d_x,
                           ffi::Result<ffi::Buffer<ffi::F32, 1>> d_scale,
                           ffi::Result<ffi::Buffer<ffi::F32, 1>> d_bias) {
  const auto d = x.dimensions();
  if (d_out.dimensions()[0] != d[0] || d_out.dimensions()[1] != d[1] ||
      scale.dimensions()[0] != d[1] || mean.dimensions()[0] != d[0]) {
    return ffi::Error::InvalidArgument("vit_jax layer_norm: x, d_out and scale do not fit");
  }
  Backward(pool, reinterpret_cast<const Element*>(x.untyped_data()),
           reinterpret_cast<const Element*>(d_out.untyped_data()), scale.typed_data(),
           mean.typed_data(), rstd.typed_data(), reinterpret_cast<Element*>(d_x->untyped_data()),
           d_scale->typed_data(), d_bias->typed_data(), d[0], d[1]);
  return ffi::Error::Success();
}

}  // namespace
}  // namespace vit_jax

#define VIT_JAX_LAYER_NORM_FORWARD(kType) \
  ffi::Ffi::Bind()                         \
      .Ctx<ffi::ThreadPool>()              \
      .Arg<ffi::Buffer<kType, 2>>()        \
      .Arg<ffi::Buffer<ffi::F32, 1>>()     \
      .Arg<ffi::Buffer<ffi::F32, 1>>()     \
      .Ret<ffi::Buffer<kType, 2>>()        \
      .Ret<ffi::Buffer<ffi::F32, 1>>()     \
      .Ret<ffi::Buffer<ffi::F32, 1>>()     \
      .Attr<float>("epsilon")
#define VIT_JAX_LAYER_NORM_BACKWARD(kType) \
  ffi::Ffi::Bind()                          \
      .Ctx<ffi::ThreadPool>()               \
      .Arg<ffi::Buffer<kType, 2>>()         \
      .Arg<ffi::Buffer<kType, 2>>()         \
      .Arg<ffi::Buffer<ffi::F32, 1>>()      \
      .Arg<ffi::Buffer<ffi::F32, 1>>()      \
      .Arg<ffi::Buffer<ffi::F32, 1>>()      \
      .Ret<ffi::Buffer<kType, 2>>()         \
      .Ret<ffi::Buffer<ffi::F32, 1>>()      \
      .Ret<ffi::Buffer<ffi::F32, 1>>()

XLA_FFI_DEFINE_HANDLER_SYMBOL(VitJaxLayerNormF32,
                              (vit_jax::ForwardHandler<ffi::F32, float>),
                              VIT_JAX_LAYER_NORM_FORWARD(ffi::F32));
XLA_FFI_DEFINE_HANDLER_SYMBOL(VitJaxLayerNormBf16,
                              (vit_jax::ForwardHandler<ffi::BF16, uint16_t>),
                              VIT_JAX_LAYER_NORM_FORWARD(ffi::BF16));
XLA_FFI_DEFINE_HANDLER_SYMBOL(VitJaxLayerNormBackwardF32,
                              (vit_jax::BackwardHandler<ffi::F32, float>),
                              VIT_JAX_LAYER_NORM_BACKWARD(ffi::F32));
XLA_FFI_DEFINE_HANDLER_SYMBOL(VitJaxLayerNormBackwardBf16,
                              (vit_jax::BackwardHandler<ffi::BF16, uint16_t>),
                              VIT_JAX_LAYER_NORM_BACKWARD(ffi::BF16));
