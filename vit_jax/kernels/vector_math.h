// Elementwise float math that GCC vectorises (check with -fopt-info-vec): exp,
// the tanh-form GELU, and conversions to and from bfloat16.
#ifndef VIT_JAX_KERNELS_VECTOR_MATH_H_
#define VIT_JAX_KERNELS_VECTOR_MATH_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace vit_jax {

// exp(x) for x <= 0 (softmax after subtracting the row maximum): 2^n * p(r)
// with a degree-6 polynomial (Cephes' expf, within 1 ulp), written so that the
// compiler vectorises the loops that call it: n is rounded by adding and
// subtracting 1.5 * 2^23, as GCC does not vectorise floorf (check with
// -fopt-info-vec).
inline float ExpNonPositive(float x) {
  constexpr float kRoundToInteger = 12582912.0f;  // 1.5 * 2^23.
  x = std::max(x, -87.0f);
  const float n = (x * 1.44269504088896341f + kRoundToInteger) - kRoundToInteger;
  const float r = x - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

// GELU, tanh form: 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3), as
// x sigmoid(2u), with the exponential taken of -2|u| <= 0 only.
inline float GeluTanh(float x) {
  const float u = 0.7978845608028654f * (x + 0.044715f * x * x * x);
  const float t = ExpNonPositive(-2.0f * std::abs(u));  // e^(-2|u|)
  return x * (u >= 0.0f ? 1.0f : t) / (1.0f + t);
}

// The float32 value of bfloat16 bits.
inline float FromBfloat16(uint16_t bits) {
  const uint32_t widened = static_cast<uint32_t>(bits) << 16;
  float x;
  std::memcpy(&x, &widened, sizeof(x));
  return x;
}

// The bfloat16 nearest to x (its bits), ties to even; NaN stays NaN.
inline uint16_t RoundToBfloat16(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  const uint32_t rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
  const bool nan = (bits & 0x7FFFFFFFu) > 0x7F800000u;
  return static_cast<uint16_t>(nan ? (bits >> 16) | 0x40u : rounded);
}

// Element i of a float32 or bfloat16 (its bits) array as float32, and stored
// from float32 (bfloat16: rounded).
inline float Load(const float* x, int64_t i) { return x[i]; }
inline float Load(const uint16_t* x, int64_t i) { return FromBfloat16(x[i]); }
inline void Store(float* out, int64_t i, float v) { out[i] = v; }
inline void Store(uint16_t* out, int64_t i, float v) { out[i] = RoundToBfloat16(v); }

}  // namespace vit_jax

#endif  // VIT_JAX_KERNELS_VECTOR_MATH_H_
