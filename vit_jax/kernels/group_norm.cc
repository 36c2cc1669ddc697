// Group normalisation for XLA:CPU inference, as Flax's nn.GroupNorm computes it:
// x (B, S, C) in G groups of C / G channels; per (example, group), over the S
// positions and the group's channels, mean = E[x], var = max(0, E[x^2] - mean^2)
// in float32; out = (x - mean) * rsqrt(var + epsilon) * scale + bias, rounded
// once to the output type.
//
// XLA:CPU reduces a bfloat16 input by first writing it out in float32, then
// reading it once for each statistic; here the statistics take one pass over x
// and the normalisation one more, both spread over XLA's intra-op thread pool.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "parallel_for.h"
#include "vector_math.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace vit_jax {
namespace {

// Positions of one example that a task reduces or normalises.
constexpr int64_t kChunk = 256;

inline float Load(const float* x, int64_t i) { return x[i]; }
inline float Load(const uint16_t* x, int64_t i) {
  const uint32_t widened = static_cast<uint32_t>(x[i]) << 16;
  float v;
  std::memcpy(&v, &widened, sizeof(v));
  return v;
}
inline void Store(float* out, int64_t i, float v) { out[i] = v; }
inline void Store(uint16_t* out, int64_t i, float v) { out[i] = RoundToBfloat16(v); }

template <typename T>
ffi::Error GroupNorm(ffi::ThreadPool& pool, const T* x, const float* scale, const float* bias,
                     T* out, int64_t batch, int64_t positions, int64_t channels,
                     int64_t groups, float epsilon) {
  if (groups < 1 || channels % groups != 0) {
    return ffi::Error::InvalidArgument("vit_jax group_norm: groups must divide the channels");
  }
  if (batch * positions * channels == 0) return ffi::Error::Success();
  const int64_t chunks = (positions + kChunk - 1) / kChunk;
  // Per (example, chunk): each channel's sum and sum of squares.
  std::vector<float> sums(batch * chunks * channels * 2);
  ParallelFor(pool, batch * chunks, [&](int64_t item) {
    const int64_t b = item / chunks, first = item % chunks * kChunk;
    const int64_t last = std::min(positions, first + kChunk);
    float* sum = sums.data() + item * channels * 2;
    float* sum_sq = sum + channels;
    std::fill(sum, sum + 2 * channels, 0.0f);
    for (int64_t s = first; s < last; ++s) {
      const T* row = x + (b * positions + s) * channels;
      for (int64_t c = 0; c < channels; ++c) {
        const float v = Load(row, c);
        sum[c] += v;
        sum_sq[c] += v * v;
      }
    }
  });
  // Per (example, channel): out = (x - mean) * multiplier + bias.
  const int64_t width = channels / groups;
  const double count = static_cast<double>(positions) * width;
  std::vector<float> mean(batch * channels), multiplier(batch * channels);
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t g = 0; g < groups; ++g) {
      double total = 0.0, total_sq = 0.0;
      for (int64_t k = 0; k < chunks; ++k) {
        const float* sum = sums.data() + (b * chunks + k) * channels * 2;
        for (int64_t c = g * width; c < (g + 1) * width; ++c) {
          total += sum[c];
          total_sq += sum[channels + c];
        }
      }
      const float mu = static_cast<float>(total / count);
      const float var = std::max(0.0f, static_cast<float>(total_sq / count) - mu * mu);
      const float inverse = 1.0f / std::sqrt(var + epsilon);
      for (int64_t c = g * width; c < (g + 1) * width; ++c) {
        mean[b * channels + c] = mu;
        multiplier[b * channels + c] = inverse * scale[c];
      }
    }
  }
  ParallelFor(pool, batch * chunks, [&](int64_t item) {
    const int64_t b = item / chunks, first = item % chunks * kChunk;
    const int64_t last = std::min(positions, first + kChunk);
    const float* mu = mean.data() + b * channels;
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

template <ffi::DataType kType, typename Element>
ffi::Error GroupNormHandler(ffi::ThreadPool pool, ffi::Buffer<kType, 3> x,
                            ffi::Buffer<ffi::F32, 1> scale, ffi::Buffer<ffi::F32, 1> bias,
                            ffi::Result<ffi::Buffer<kType, 3>> out, int64_t groups,
                            float epsilon) {
  const auto d = x.dimensions();
  if (scale.dimensions()[0] != d[2] || bias.dimensions()[0] != d[2]) {
    return ffi::Error::InvalidArgument("vit_jax group_norm: scale and bias must have C entries");
  }
  return GroupNorm(pool, reinterpret_cast<const Element*>(x.untyped_data()),
                   scale.typed_data(), bias.typed_data(),
                   reinterpret_cast<Element*>(out->untyped_data()), d[0], d[1], d[2], groups,
                   epsilon);
}

}  // namespace
}  // namespace vit_jax

#define VIT_JAX_GROUP_NORM_BINDING(kType)  \
  ffi::Ffi::Bind()                         \
      .Ctx<ffi::ThreadPool>()              \
      .Arg<ffi::Buffer<kType, 3>>()        \
      .Arg<ffi::Buffer<ffi::F32, 1>>()     \
      .Arg<ffi::Buffer<ffi::F32, 1>>()     \
      .Ret<ffi::Buffer<kType, 3>>()        \
      .Attr<int64_t>("groups")             \
      .Attr<float>("epsilon")

XLA_FFI_DEFINE_HANDLER_SYMBOL(VitJaxGroupNormF32,
                              (vit_jax::GroupNormHandler<ffi::F32, float>),
                              VIT_JAX_GROUP_NORM_BINDING(ffi::F32));
XLA_FFI_DEFINE_HANDLER_SYMBOL(VitJaxGroupNormBf16,
                              (vit_jax::GroupNormHandler<ffi::BF16, uint16_t>),
                              VIT_JAX_GROUP_NORM_BINDING(ffi::BF16));
