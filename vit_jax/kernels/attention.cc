// Multi-head attention for XLA:CPU through the XLA FFI, on the BLAS.
//
// q (B, T, N, H), k and v (B, S, N, H) stay in the layout the projections
// produce: head n of example b is a (T, H) matrix with row stride N*H, which
// the BLAS reads and writes in place, so nothing is transposed to head-major
// order. The B*N (example, head) pairs are spread over XLA's intra-op thread
// pool, each computed by single-threaded BLAS calls with its weights in cache.
// The forward pass also returns the attention weights P (B, N, T, S), which
// the backward pass reuses instead of recomputing the softmax. bfloat16
// inputs have a forward-only kernel on MKL's bfloat16 product. Each kernel
// takes an optional last argument, a boolean mask M (B or 1, T, S), the same
// for every head: key s is hidden from query t where M[t, s] is false, as
// where(M, scores, lowest float) before the softmax hides it (its weight is 0;
// a query that sees no key weighs all keys equally, and its scores get no
// gradient).
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
namespace {

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
bool GetMask(const Dims& d, const ffi::RemainingArgs& args, Mask* out) {
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

ffi::Error ShapeError() {
  return ffi::Error::InvalidArgument(
      "vit_jax attention: q/k/v shapes differ or the mask is not (B or 1, T, S)");
}

template <typename Tensor>
bool GetDims(const Tensor& q, const Tensor& k, const Tensor& v, Dims* dims) {
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
float Reduce(int64_t length, float init, Step step) {
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
void SoftmaxRows(float* logits, int64_t rows, int64_t length,
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

// Head n of example b: P = softmax(scale Q K^T) under the mask, (T, S), into
// `p`; O = P V, (T, H), into `out` (T, N, H).
void HeadForward(const Dims& d, const Mask& mask, int64_t b, int64_t n,
                 const float* q, const float* k, const float* v, float* out,
                 float* p) {
  const int64_t ld = d.row(), t = d.queries, s = d.keys, h = d.head_dim;
  Gemm(false, true, t, s, h, d.scale(), q + d.q_at(b, n), ld, k + d.kv_at(b, n),
       ld, 0.0f, p, s);
  SoftmaxRows(p, t, s, mask.at(b));
  Gemm(false, false, t, h, s, 1.0f, p, s, v + d.kv_at(b, n), ld, 0.0f,
       out + d.q_at(b, n), ld);
}

// Runs HeadForward for every (example, head) pair, with head (b, n)'s P at
// weights(b, n).
template <typename Weights>
void ForwardAllHeads(ffi::ThreadPool& pool, const Dims& d, const Mask& mask,
                     const Tensor4& q, const Tensor4& k, const Tensor4& v,
                     float* out, const Weights& weights) {
  ParallelFor(pool, d.batch * d.heads, [&](int64_t item) {
    const int64_t b = item / d.heads, n = item % d.heads;
    HeadForward(d, mask, b, n, q.typed_data(), k.typed_data(), v.typed_data(),
                out, weights(d, b, n));
  });
}

// The training forward pass: returns P (B, N, T, S) for the backward pass.
void Forward(ffi::ThreadPool& pool, const Dims& d, const Mask& mask,
             const Tensor4& q, const Tensor4& k, const Tensor4& v, float* out,
             float* p) {
  ForwardAllHeads(pool, d, mask, q, k, v, out,
                  [p](const Dims& d, int64_t b, int64_t n) {
                    return p + d.p_at(b, n);
                  });
}

// Without a backward pass: each head's P lives in a per-thread buffer that
// stays in cache, instead of going out to memory.
void Inference(ffi::ThreadPool& pool, const Dims& d, const Mask& mask,
               const Tensor4& q, const Tensor4& k, const Tensor4& v,
               float* out) {
  ForwardAllHeads(pool, d, mask, q, k, v, out,
                  [](const Dims& d, int64_t, int64_t) {
                    thread_local std::vector<float> p;
                    p.resize(d.queries * d.keys);
                    return p.data();
                  });
}

// bfloat16 head n of example b, forward only: S = scale Q K^T from MKL's
// bfloat16 product (float32 accumulation), the softmax in float32, P rounded to
// bfloat16 for O = P V (float32 accumulation), O rounded to bfloat16. S, P and
// O live in per-thread buffers.
void HeadInferenceBf16(const Dims& d, const Mask& mask, int64_t b, int64_t n,
                       const uint16_t* q, const uint16_t* k, const uint16_t* v,
                       uint16_t* out) {
  const int64_t ld = d.row(), t = d.queries, s = d.keys, h = d.head_dim;
  thread_local std::vector<float> scores, head_out;
  thread_local std::vector<uint16_t> probs;
  scores.resize(t * s);
  probs.resize(t * s);
  head_out.resize(t * h);
  gemm_bf16(kRowMajor, kNoTrans, kTrans, t, s, h, d.scale(), q + d.q_at(b, n),
            ld, k + d.kv_at(b, n), ld, 0.0f, scores.data(), s);
  SoftmaxRows(scores.data(), t, s, mask.at(b));
  for (int64_t i = 0; i < t * s; ++i) probs[i] = RoundToBfloat16(scores[i]);
  gemm_bf16(kRowMajor, kNoTrans, kNoTrans, t, h, s, 1.0f, probs.data(), s,
            v + d.kv_at(b, n), ld, 0.0f, head_out.data(), h);
  uint16_t* o = out + d.q_at(b, n);
  for (int64_t r = 0; r < t; ++r) {
    for (int64_t j = 0; j < h; ++j) {
      o[r * ld + j] = RoundToBfloat16(head_out[r * h + j]);
    }
  }
}

void InferenceBf16(ffi::ThreadPool& pool, const Dims& d, const Mask& mask,
                   const Tensor4Bf16& q, const Tensor4Bf16& k,
                   const Tensor4Bf16& v, Tensor4Bf16& out) {
  auto bits = [](const Tensor4Bf16& x) {
    return reinterpret_cast<const uint16_t*>(x.untyped_data());
  };
  uint16_t* o = reinterpret_cast<uint16_t*>(out.untyped_data());
  ParallelFor(pool, d.batch * d.heads, [&](int64_t item) {
    HeadInferenceBf16(d, mask, item / d.heads, item % d.heads, bits(q), bits(k),
                      bits(v), o);
  });
}

// The gradients of q, k and v from P and dO; masked scores get none (where a
// query keeps some keys, their P is 0 already; where it keeps none, P is not).
void Backward(ffi::ThreadPool& pool, const Dims& d, const Mask& mask,
              const Tensor4& q, const Tensor4& k, const Tensor4& v,
              const Tensor4& probs, const Tensor4& d_out, Tensor4& d_q,
              Tensor4& d_k, Tensor4& d_v) {
  const int64_t ld = d.row(), t = d.queries, s = d.keys, h = d.head_dim;
  const float scale = d.scale();
  ParallelFor(pool, d.batch * d.heads, [&](int64_t item) {
    const int64_t b = item / d.heads, n = item % d.heads;
    thread_local std::vector<float> d_logits;
    d_logits.resize(t * s);
    float* ds = d_logits.data();
    const float* p = probs.typed_data() + d.p_at(b, n);
    const float* g = d_out.typed_data() + d.q_at(b, n);
    // dV = P^T dO, (S, H); dP = dO V^T, (T, S).
    Gemm(true, false, s, h, t, 1.0f, p, s, g, ld, 0.0f,
         d_v.typed_data() + d.kv_at(b, n), ld);
    Gemm(false, true, t, s, h, 1.0f, g, ld, v.typed_data() + d.kv_at(b, n), ld,
         0.0f, ds, s);
    // Through the softmax: dS = P * (dP - rowsum(P * dP)), 0 where masked.
    const bool* keep = mask.at(b);
    for (int64_t r = 0; r < t; ++r) {
      const float* p_row = p + r * s;
      float* g_row = ds + r * s;
      const float dot = Reduce(s, 0.0f, DotOf{p_row, g_row});
      for (int64_t j = 0; j < s; ++j) g_row[j] = p_row[j] * (g_row[j] - dot);
      if (keep != nullptr) {
        const bool* keep_row = keep + r * s;
        for (int64_t j = 0; j < s; ++j) g_row[j] = keep_row[j] ? g_row[j] : 0.0f;
      }
    }
    // dQ = scale dS K, (T, H); dK = scale dS^T Q, (S, H).
    Gemm(false, false, t, h, s, scale, ds, s, k.typed_data() + d.kv_at(b, n),
         ld, 0.0f, d_q.typed_data() + d.q_at(b, n), ld);
    Gemm(true, false, s, h, t, scale, ds, s, q.typed_data() + d.q_at(b, n), ld,
         0.0f, d_k.typed_data() + d.kv_at(b, n), ld);
  });
}

// The handlers: each checks the shapes (and the mask's, if given) and runs
// its kernel.

ffi::Error AttentionForward(ffi::ThreadPool pool, Tensor4 q, Tensor4 k,
                            Tensor4 v, ffi::RemainingArgs mask_arg,
                            ffi::Result<Tensor4> out,
                            ffi::Result<Tensor4> probs) {
  Dims d;
  Mask mask;
  if (!GetDims(q, k, v, &d) || !GetMask(d, mask_arg, &mask)) return ShapeError();
  Forward(pool, d, mask, q, k, v, out->typed_data(), probs->typed_data());
  return ffi::Error::Success();
}

ffi::Error AttentionInference(ffi::ThreadPool pool, Tensor4 q, Tensor4 k,
                              Tensor4 v, ffi::RemainingArgs mask_arg,
                              ffi::Result<Tensor4> out) {
  Dims d;
  Mask mask;
  if (!GetDims(q, k, v, &d) || !GetMask(d, mask_arg, &mask)) return ShapeError();
  Inference(pool, d, mask, q, k, v, out->typed_data());
  return ffi::Error::Success();
}

ffi::Error AttentionInferenceBf16(ffi::ThreadPool pool, Tensor4Bf16 q,
                                  Tensor4Bf16 k, Tensor4Bf16 v,
                                  ffi::RemainingArgs mask_arg,
                                  ffi::Result<Tensor4Bf16> out) {
  Dims d;
  Mask mask;
  if (!GetDims(q, k, v, &d) || !GetMask(d, mask_arg, &mask)) return ShapeError();
  if (gemm_bf16 == nullptr) {
    return ffi::Error::InvalidArgument(
        "vit_jax attention: the BLAS has no bfloat16 product");
  }
  InferenceBf16(pool, d, mask, q, k, v, *out);
  return ffi::Error::Success();
}

ffi::Error AttentionBackward(ffi::ThreadPool pool, Tensor4 q, Tensor4 k,
                             Tensor4 v, Tensor4 probs, Tensor4 d_out,
                             ffi::RemainingArgs mask_arg,
                             ffi::Result<Tensor4> d_q, ffi::Result<Tensor4> d_k,
                             ffi::Result<Tensor4> d_v) {
  Dims d;
  Mask mask;
  if (!GetDims(q, k, v, &d) || !GetMask(d, mask_arg, &mask)) return ShapeError();
  Backward(pool, d, mask, q, k, v, probs, d_out, *d_q, *d_k, *d_v);
  return ffi::Error::Success();
}

}  // namespace
}  // namespace vit_jax

XLA_FFI_DEFINE_HANDLER_SYMBOL(VitJaxAttentionForwardF32,
                              vit_jax::AttentionForward,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<vit_jax::Tensor4>()
                                  .Arg<vit_jax::Tensor4>()
                                  .Arg<vit_jax::Tensor4>()
                                  .RemainingArgs()
                                  .Ret<vit_jax::Tensor4>()
                                  .Ret<vit_jax::Tensor4>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(VitJaxAttentionInferenceF32,
                              vit_jax::AttentionInference,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<vit_jax::Tensor4>()
                                  .Arg<vit_jax::Tensor4>()
                                  .Arg<vit_jax::Tensor4>()
                                  .RemainingArgs()
                                  .Ret<vit_jax::Tensor4>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(VitJaxAttentionInferenceBf16,
                              vit_jax::AttentionInferenceBf16,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<vit_jax::Tensor4Bf16>()
                                  .Arg<vit_jax::Tensor4Bf16>()
                                  .Arg<vit_jax::Tensor4Bf16>()
                                  .RemainingArgs()
                                  .Ret<vit_jax::Tensor4Bf16>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(VitJaxAttentionBackwardF32,
                              vit_jax::AttentionBackward,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<vit_jax::Tensor4>()
                                  .Arg<vit_jax::Tensor4>()
                                  .Arg<vit_jax::Tensor4>()
                                  .Arg<vit_jax::Tensor4>()
                                  .Arg<vit_jax::Tensor4>()
                                  .RemainingArgs()
                                  .Ret<vit_jax::Tensor4>()
                                  .Ret<vit_jax::Tensor4>()
                                  .Ret<vit_jax::Tensor4>());
