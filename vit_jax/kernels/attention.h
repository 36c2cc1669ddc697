// What the attention kernels share (attention.cc: float32; attention_bf16.cc:
// bfloat16 on MKL's bfloat16 product): the shapes, the optional mask, row
// reductions that GCC vectorises, and the softmax forward and backward.
//
// q (B, T, N, H), k and v (B, S, N, H) stay in the layout the projections
// produce: head n of example b is a (T, H) matrix with row stride N*H, which
// the BLAS reads and writes in place, so nothing is transposed to head-major
// order. The B*N (example, head) pairs are spread over XLA's intra-op thread
// pool, each computed by single-threaded BLAS calls with its weights in cache.
// The forward pass also returns the attention weights P (B, N, T, S), float32,
// which the backward pass reuses instead of recomputing the softmax. Each
// kernel takes an optional last argument, a boolean mask M (B or 1, T, S), the
// same for every head: key s is hidden from query t where M[t, s] is false, as
// where(M, scores, lowest float) before the softmax hides it (its weight is 0;
// a query that sees no key weighs all keys equally, and its scores get no
// gradient).
#ifndef VIT_JAX_KERNELS_ATTENTION_H_
#define VIT_JAX_KERNELS_ATTENTION_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "blas.h"
#include "parallel_for.h"
#include "vector_math.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace vit_jax {
namespace attention {

using Tensor4 = ffi::Buffer<ffi::F32, 4>;
using Tensor4Bf16 = ffi::Buffer<ffi::BF16, 4>;
using MaskBuffer = ffi::Buffer<ffi::PRED, 3>;

struct Dims {
  int64_t batch, queries, keys, heads, head_dim;
  int64_t row() const { return heads * head_dim; }  // Row stride of q, k, v.
  float scale() const {  // 1/sqrt(H), rounded once from double.
    return static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim)));
  }
  // Offsets of head n of example b in q/out, in k/v, and in P.
  int64_t q_at(int64_t b, int64_t n) const { return b * queries * row() + n * head_dim; }
  int64_t kv_at(int64_t b, int64_t n) const { return b * keys * row() + n * head_dim; }
  int64_t p_at(int64_t b, int64_t n) const { return (b * heads + n) * queries * keys; }
};

// The rows of M for example b: (T, S) booleans, or null where unmasked.
struct Mask {
  const bool* data = nullptr;
  int64_t batch_stride = 0;  // 0 where one (T, S) mask serves every example.
  const bool* at(int64_t b) const {
    return data == nullptr ? nullptr : data + b * batch_stride;
  }
};

// The kernels' optional last argument M as a Mask (none: unmasked); false if
// it is not one (B or 1, T, S) boolean array.
inline bool GetMask(const Dims& d, const ffi::RemainingArgs& args, Mask* out) {
  *out = Mask{};
  if (args.size() == 0) return true;
  auto mask = args.get<MaskBuffer>(0);
  if (args.size() > 1 || !mask.has_value()) return false;
  auto md = mask->dimensions();
  if ((md[0] != 1 && md[0] != d.batch) || md[1] != d.queries || md[2] != d.keys) {
    return false;
  }
  *out = {mask->typed_data(), md[0] == 1 ? 0 : d.queries * d.keys};
  return true;
}

inline ffi::Error ShapeError() {
  return ffi::Error::InvalidArgument(
      "vit_jax attention: q/k/v shapes differ or the mask is not (B or 1, T, S)");
}

inline ffi::Error NoBfloat16Product() {
  return ffi::Error::InvalidArgument(
      "vit_jax attention: the BLAS has no bfloat16 product");
}

template <typename Tensor>
inline bool GetDims(const Tensor& q, const Tensor& k, const Tensor& v, Dims* dims) {
  auto qd = q.dimensions(), kd = k.dimensions(), vd = v.dimensions();
  *dims = {qd[0], qd[1], kd[1], qd[2], qd[3]};
  for (int i : {0, 2, 3}) {
    if (kd[i] != qd[i] || vd[i] != qd[i]) return false;
  }
  return kd[1] == vd[1];
}

// Reductions over a row in kLanes independent partial results, which the
// compiler vectorises without reassociating float additions.
constexpr int kLanes = 16;

template <typename Step>
inline float Reduce(int64_t length, float init, Step step) {
  float acc[kLanes];
  std::fill(acc, acc + kLanes, init);
  int64_t i = 0;
  for (; i + kLanes <= length; i += kLanes) {
    for (int lane = 0; lane < kLanes; ++lane) acc[lane] = step(acc[lane], i + lane);
  }
  for (; i < length; ++i) acc[0] = step(acc[0], i);
  float result = acc[0];
  for (int lane = 1; lane < kLanes; ++lane) {
    result = step.combine(result, acc[lane]);
  }
  return result;
}

struct MaxOf {
  const float* x;
  float operator()(float acc, int64_t i) const { return std::max(acc, x[i]); }
  float combine(float a, float b) const { return std::max(a, b); }
};

struct DotOf {
  const float* x;
  const float* y;
  float operator()(float acc, int64_t i) const { return acc + x[i] * y[i]; }
  float combine(float a, float b) const { return a + b; }
};

struct MaskedMaxOf {
  const float* x;
  const bool* keep;
  float operator()(float acc, int64_t i) const {
    return keep[i] ? std::max(acc, x[i]) : acc;
  }
  float combine(float a, float b) const { return std::max(a, b); }
};

struct SumOf {
  const float* x;
  float operator()(float acc, int64_t i) const { return acc + x[i]; }
  float combine(float a, float b) const { return a + b; }
};

struct CountOf {
  const bool* keep;
  float operator()(float acc, int64_t i) const { return acc + (keep[i] ? 1.0f : 0.0f); }
  float combine(float a, float b) const { return a + b; }
};

// Each of `rows` rows of `logits` (length S) becomes its softmax; with `mask`
// (rows, S), over the kept entries only, the others 0 (a row that keeps none:
// 1/S everywhere).
inline void SoftmaxRows(float* logits, int64_t rows, int64_t length,
                 const bool* mask = nullptr) {
  for (int64_t r = 0; r < rows; ++r) {
    float* row = logits + r * length;
    const bool* keep = mask == nullptr ? nullptr : mask + r * length;
    if (keep == nullptr) {
      const float max = Reduce(length, -3.0e38f, MaxOf{row});
      for (int64_t s = 0; s < length; ++s) row[s] = ExpNonPositive(row[s] - max);
    } else if (Reduce(length, 0.0f, CountOf{keep}) == 0.0f) {
      std::fill(row, row + length, 1.0f / static_cast<float>(length));
      continue;
    } else {
      const float max = Reduce(length, -3.0e38f, MaskedMaxOf{row, keep});
      for (int64_t s = 0; s < length; ++s) {
        row[s] = keep[s] ? ExpNonPositive(row[s] - max) : 0.0f;
      }
    }
    const float inv = 1.0f / Reduce(length, 0.0f, SumOf{row});
    for (int64_t s = 0; s < length; ++s) row[s] *= inv;
  }
}

// Through the softmax, row by row: dP (rows, S) becomes
// dS = P * (dP - rowsum(P * dP)), 0 where `mask` (rows, S) hides a key.
inline void SoftmaxBackwardRows(const float* p, float* d_logits, int64_t rows,
                         int64_t length, const bool* mask = nullptr) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* p_row = p + r * length;
    float* g_row = d_logits + r * length;
    const float dot = Reduce(length, 0.0f, DotOf{p_row, g_row});
    for (int64_t j = 0; j < length; ++j) g_row[j] = p_row[j] * (g_row[j] - dot);
    if (mask != nullptr) {
      const bool* keep_row = mask + r * length;
      for (int64_t j = 0; j < length; ++j) g_row[j] = keep_row[j] ? g_row[j] : 0.0f;
    }
  }
}

}  // namespace attention
}  // namespace vit_jax

#endif  // VIT_JAX_KERNELS_ATTENTION_H_
