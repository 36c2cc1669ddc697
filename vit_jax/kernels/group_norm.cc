// Group normalisation for XLA:CPU, forward and backward, as Flax's nn.GroupNorm:
// x (B, S, C) in G groups of C / G channels; per (example, group), over the S
// positions and the group's channels, mean = E[x], var = max(0, E[x^2] - mean^2)
// in float32; out = (x - mean) * rsqrt(var + epsilon) * scale + bias, rounded
// once to the output type; the forward pass also returns mean and rstd =
// rsqrt(var + epsilon) per (example, group) for the backward pass.
//
// XLA:CPU reduces a bfloat16 input by first writing it out in float32, then
// reading it once for each statistic; here the statistics take one pass over x
// and the normalisation one more, both spread over XLA's intra-op thread pool;
// the backward pass likewise reads x and the output's gradient twice.
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

// Positions of one example that a task reduces or normalises.
constexpr int64_t kChunk = 256;

// Sums over [first, last) positions of example b, per channel: of a, and of a * b_values
// (or of a * a where b_values is null).
template <typename T>
void ChannelSums(const T* a, const T* b_values, int64_t b, int64_t first, int64_t last,
                 int64_t positions, int64_t channels, float* sum, float* sum_product) {
  std::fill(sum, sum + channels, 0.0f);
  std::fill(sum_product, sum_product + channels, 0.0f);
  for (int64_t s = first; s < last; ++s) {
    const int64_t row = (b * positions + s) * channels;
    for (int64_t c = 0; c < channels; ++c) {
      const float v = Load(a + row, c);
      const float w = b_values ? Load(b_values + row, c) : v;
      sum[c] += v;
      sum_product[c] += v * w;
    }
  }
}

// Per (example, channel), the two channel sums of ChannelSums over all positions, in
// float64 from float32 sums of chunks spread over the pool.
template <typename T>
void ExampleSums(ffi::ThreadPool& pool, const T* a, const T* b_values, int64_t batch,
                 int64_t positions, int64_t channels, std::vector<double>* sum,
                 std::vector<double>* sum_product) {
  const int64_t chunks = (positions + kChunk - 1) / kChunk;
  std::vector<float> partial(batch * chunks * channels * 2);
  ParallelFor(pool, batch * chunks, [&](int64_t item) {
    const int64_t b = item / chunks, first = item % chunks * kChunk;
    float* out = partial.data() + item * channels * 2;
    ChannelSums(a, b_values, b, first, std::min(positions, first + kChunk), positions,
                channels, out, out + channels);
  });
  sum->assign(batch * channels, 0.0);
  sum_product->assign(batch * channels, 0.0);
  for (int64_t item = 0; item < batch * chunks; ++item) {
    const int64_t b = item / chunks;
    const float* in = partial.data() + item * channels * 2;
    for (int64_t c = 0; c < channels; ++c) {
      (*sum)[b * channels + c] += in[c];
      (*sum_product)[b * channels + c] += in[channels + c];
    }
  }
}

// out = (x - mean) * rstd * scale + bias, with mean and rstd per (example, group).
template <typename T>
ffi::Error Forward(ffi::ThreadPool& pool, const T* x, const float* scale, const float* bias,
                   T* out, float* mean, float* rstd, int64_t batch, int64_t positions,
                   int64_t channels, int64_t groups, float epsilon) {
  if (groups < 1 || channels % groups != 0) {
    return ffi::Error::InvalidArgument("vit_jax group_norm: groups must divide the channels");
  }
  if (batch * positions * channels == 0) return ffi::Error::Success();
  std::vector<double> sum, sum_sq;
  ExampleSums<T>(pool, x, nullptr, batch, positions, channels, &sum, &sum_sq);
  const int64_t width = channels / groups;
  const double count = static_cast<double>(positions) * width;
  std::vector<float> shift(batch * channels), multiplier(batch * channels);
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t g = 0; g < groups; ++g) {
      double total = 0.0, total_sq = 0.0;
      for (int64_t c = g * width; c < (g + 1) * width; ++c) {
        total += sum[b * channels + c];
        total_sq += sum_sq[b * channels + c];
      }
      const float mu = static_cast<float>(total / count);
      const float var = std::max(0.0f, static_cast<float>(total_sq / count) - mu * mu);
      const float inverse = 1.0f / std::sqrt(var + epsilon);
      mean[b * groups + g] = mu;
      rstd[b * groups + g] = inverse;
      for (int64_t c = g * width; c < (g + 1) * width; ++c) {
        shift[b * channels + c] = mu;
        multiplier[b * channels + c] = inverse * scale[c];
      }
    }
  }
  const int64_t chunks = (positions + kChunk - 1) / kChunk;
  ParallelFor(pool, batch * chunks, [&](int64_t item) {
    const int64_t b = item / chunks, first = item % chunks * kChunk;
    const int64_t last = std::min(positions, first + kChunk);
    const float* mu = shift.data() + b * channels;
    const float* mul = multiplier.data() + b * channels;
    for (int64_t s = first; s < last; ++s) {
      const int64_t row = (b * positions + s) * channels;
      for (int64_t c = 0; c < channels; ++c) {
        Store(out + row, c, (Load(x + row, c) - mu[c]) * mul[c] + bias[c]);
      }
    }
  });
  return ffi::Error::Success();
}

// The gradients of Forward's out: with x_hat = (x - mean) * rstd and, per (example,
// group) over its N = positions * width values, m1 = mean(scale * d_out) and
// m2 = mean(scale * d_out * x_hat):
//   d_x = rstd * (scale * d_out - m1 - x_hat * m2),
//   d_scale = sum over examples and positions of d_out * x_hat, d_bias = of d_out.
template <typename T>
void Backward(ffi::ThreadPool& pool, const T* x, const T* d_out, const float* scale,
              const float* mean, const float* rstd, T* d_x, float* d_scale, float* d_bias,
              int64_t batch, int64_t positions, int64_t channels, int64_t groups) {
  std::fill(d_scale, d_scale + channels, 0.0f);
  std::fill(d_bias, d_bias + channels, 0.0f);
  if (batch * positions * channels == 0) return;
  std::vector<double> sum_d, sum_dx;  // Per (example, channel): d_out, d_out * x.
  ExampleSums<T>(pool, d_out, x, batch, positions, channels, &sum_d, &sum_dx);
  const int64_t width = channels / groups;
  const double count = static_cast<double>(positions) * width;
  // d_x = a * d_out + k * (x - mean) + h, a per (example, channel), k and h per group.
  std::vector<float> a(batch * channels), shift(batch * channels), k(batch * channels),
      h(batch * channels);
  std::vector<double> scale_sum(channels, 0.0), bias_sum(channels, 0.0);
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t g = 0; g < groups; ++g) {
      const double mu = mean[b * groups + g], r = rstd[b * groups + g];
      double m1 = 0.0, m2 = 0.0;
      for (int64_t c = g * width; c < (g + 1) * width; ++c) {
        const int64_t i = b * channels + c;
        const double d_hat = r * (sum_dx[i] - mu * sum_d[i]);  // sum of d_out * x_hat.
        scale_sum[c] += d_hat;
        bias_sum[c] += sum_d[i];
        m1 += scale[c] * sum_d[i];
        m2 += scale[c] * d_hat;
      }
      m1 /= count;
      m2 /= count;
      for (int64_t c = g * width; c < (g + 1) * width; ++c) {
        const int64_t i = b * channels + c;
        a[i] = static_cast<float>(r * scale[c]);
        shift[i] = static_cast<float>(mu);
        k[i] = static_cast<float>(-r * r * m2);
        h[i] = static_cast<float>(-r * m1);
      }
    }
  }
  for (int64_t c = 0; c < channels; ++c) {
    d_scale[c] = static_cast<float>(scale_sum[c]);
    d_bias[c] = static_cast<float>(bias_sum[c]);
  }
  const int64_t chunks = (positions + kChunk - 1) / kChunk;
  ParallelFor(pool, batch * chunks, [&](int64_t item) {
    const int64_t b = item / chunks, first = item % chunks * kChunk;
    const int64_t last = std::min(positions, first + kChunk);
    const int64_t o = b * channels;
    for (int64_t s = first; s < last; ++s) {
      const int64_t row = (b * positions + s) * channels;
      for (int64_t c = 0; c < channels; ++c) {
        const float v = a[o + c] * Load(d_out + row, c) +
                        k[o + c] * (Load(x + row, c) - shift[o + c]) + h[o + c];
        Store(d_x + row, c, v);
      }
    }
  });
}

template <ffi::DataType kType, typename Element>
ffi::Error ForwardHandler(ffi::ThreadPool pool, ffi::Buffer<kType, 3> x,
                          ffi::Buffer<ffi::F32, 1> scale, ffi::Buffer<ffi::F32, 1> bias,
                          ffi::Result<ffi::Buffer<kType, 3>> out,
                          ffi::Result<ffi::Buffer<ffi::F32, 2>> mean,
                          ffi::Result<ffi::Buffer<ffi::F32, 2>> rstd, int64_t groups,
                          float epsilon) {
  const auto d = x.dimensions();
  if (scale.dimensions()[0] != d[2] || bias.dimensions()[0] != d[2] ||
      mean->dimensions()[0] != d[0] || mean->dimensions()[1] != groups) {
    return ffi::Error::InvalidArgument("vit_jax group_norm: x, scale, bias and out do not fit");
  }
  return Forward(pool, reinterpret_cast<const Element*>(x.untyped_data()), scale.typed_data(),
                 bias.typed_data(), reinterpret_cast<Element*>(out->untyped_data()),
                 mean->typed_data(), rstd->typed_data(), d[0], d[1], d[2], groups, epsilon);
}

template <ffi::DataType kType, typename Element>
ffi::Error BackwardHandler(ffi::ThreadPool pool, ffi::Buffer<kType, 3> x,
                           ffi::Buffer<kType, 3> d_out, ffi::Buffer<ffi::F32, 1> scale,
                           ffi::Buffer<ffi::F32, 2> mean, ffi::Buffer<ffi::F32, 2> rstd,
                           ffi::Result<ffi::Buffer<kType, 3>> d_x,
                           ffi::Result<ffi::Buffer<ffi::F32, 1>> d_scale,
                           ffi::Result<ffi::Buffer<ffi::F32, 1>> d_bias) {
  const auto d = x.dimensions();
  const int64_t groups = mean.dimensions()[1];
  if (groups < 1 || d[2] % groups != 0 || scale.dimensions()[0] != d[2]) {
    return ffi::Error::InvalidArgument("vit_jax group_norm: x, scale and statistics do not fit");
  }
  Backward(pool, reinterpret_cast<const Element*>(x.untyped_data()),
           reinterpret_cast<const Element*>(d_out.untyped_data()), scale.typed_data(),
           mean.typed_data(), rstd.typed_data(), reinterpret_cast<Element*>(d_x->untyped_data()),
           d_scale->typed_data(), d_bias->typed_data(), d[0], d[1], d[2], groups);
  return ffi::Error::Success();
}

}  // namespace
}  // namespace vit_jax

#define VIT_JAX_GROUP_NORM_FORWARD(kType) \
  ffi::Ffi::Bind()                         \
      .Ctx<ffi::ThreadPool>()              \
      .Arg<ffi::Buffer<kType, 3>>()        \
      .Arg<ffi::Buffer<ffi::F32, 1>>()     \
      .Arg<ffi::Buffer<ffi::F32, 1>>()     \
      .Ret<ffi::Buffer<kType, 3>>()        \
      .Ret<ffi::Buffer<ffi::F32, 2>>()     \
      .Ret<ffi::Buffer<ffi::F32, 2>>()     \
      .Attr<int64_t>("groups")             \
      .Attr<float>("epsilon")
#define VIT_JAX_GROUP_NORM_BACKWARD(kType) \
  ffi::Ffi::Bind()                          \
      .Ctx<ffi::ThreadPool>()               \
      .Arg<ffi::Buffer<kType, 3>>()         \
      .Arg<ffi::Buffer<kType, 3>>()         \
      .Arg<ffi::Buffer<ffi::F32, 1>>()      \
      .Arg<ffi::Buffer<ffi::F32, 2>>()      \
      .Arg<ffi::Buffer<ffi::F32, 2>>()      \
      .Ret<ffi::Buffer<kType, 3>>()         \
      .Ret<ffi::Buffer<ffi::F32, 1>>()      \
      .Ret<ffi::Buffer<ffi::F32, 1>>()

XLA_FFI_DEFINE_HANDLER_SYMBOL(VitJaxGroupNormF32,
                              (vit_jax::ForwardHandler<ffi::F32, float>),
                              VIT_JAX_GROUP_NORM_FORWARD(ffi::F32));
XLA_FFI_DEFINE_HANDLER_SYMBOL(VitJaxGroupNormBf16,
                              (vit_jax::ForwardHandler<ffi::BF16, uint16_t>),
                              VIT_JAX_GROUP_NORM_FORWARD(ffi::BF16));
XLA_FFI_DEFINE_HANDLER_SYMBOL(VitJaxGroupNormBackwardF32,
                              (vit_jax::BackwardHandler<ffi::F32, float>),
                              VIT_JAX_GROUP_NORM_BACKWARD(ffi::F32));
XLA_FFI_DEFINE_HANDLER_SYMBOL(VitJaxGroupNormBackwardBf16,
                              (vit_jax::BackwardHandler<ffi::BF16, uint16_t>),
                              VIT_JAX_GROUP_NORM_BACKWARD(ffi::BF16));
