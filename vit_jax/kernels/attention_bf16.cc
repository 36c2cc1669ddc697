// Multi-head attention in bfloat16 for XLA:CPU through the XLA FFI, on MKL's
// bfloat16 product (float32 accumulation): the scores and the softmax in
// float32, P kept in float32 for the backward pass and rounded to bfloat16
// where it is a product's operand (the layout and the mask: attention.h).
#include <vector>

#include "attention.h"

namespace vit_jax {
namespace attention {
namespace {

// `rows` rows of `length` floats (contiguous) rounded to bfloat16, into rows
// `ld` apart.
void RoundRows(const float* x, int64_t rows, int64_t length, uint16_t* out,
               int64_t ld) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < length; ++j) {
      out[r * ld + j] = RoundToBfloat16(x[r * length + j]);
    }
  }
}

// bfloat16 head n of example b: S = scale Q K^T from MKL's bfloat16 product
// (float32 accumulation), the softmax in float32 into `p` (T, S), P rounded to
// bfloat16 for O = P V (float32 accumulation), O rounded to bfloat16. The
// rounded P and O live in per-thread buffers.
void HeadForwardBf16(const Dims& d, const Mask& mask, int64_t b, int64_t n,
                     const uint16_t* q, const uint16_t* k, const uint16_t* v,
                     uint16_t* out, float* p) {
  const int64_t ld = d.row(), t = d.queries, s = d.keys, h = d.head_dim;
  thread_local std::vector<float> head_out;
  thread_local std::vector<uint16_t> probs;
  probs.resize(t * s);
  head_out.resize(t * h);
  gemm_bf16(kRowMajor, kNoTrans, kTrans, t, s, h, d.scale(), q + d.q_at(b, n),
            ld, k + d.kv_at(b, n), ld, 0.0f, p, s);
  SoftmaxRows(p, t, s, mask.at(b));
  for (int64_t i = 0; i < t * s; ++i) probs[i] = RoundToBfloat16(p[i]);
  gemm_bf16(kRowMajor, kNoTrans, kNoTrans, t, h, s, 1.0f, probs.data(), s,
            v + d.kv_at(b, n), ld, 0.0f, head_out.data(), h);
  RoundRows(head_out.data(), t, h, out + d.q_at(b, n), ld);
}

const uint16_t* Bits(const Tensor4Bf16& x) {
  return reinterpret_cast<const uint16_t*>(x.untyped_data());
}

uint16_t* Bits(Tensor4Bf16& x) {
  return reinterpret_cast<uint16_t*>(x.untyped_data());
}

// The bfloat16 forward pass of every (example, head) pair, with head (b, n)'s P
// at weights(d, b, n).
template <typename Weights>
void ForwardAllHeadsBf16(ffi::ThreadPool& pool, const Dims& d, const Mask& mask,
                         const Tensor4Bf16& q, const Tensor4Bf16& k,
                         const Tensor4Bf16& v, Tensor4Bf16& out,
                         const Weights& weights) {
  ParallelFor(pool, d.batch * d.heads, [&](int64_t item) {
    const int64_t b = item / d.heads, n = item % d.heads;
    HeadForwardBf16(d, mask, b, n, Bits(q), Bits(k), Bits(v), Bits(out),
                    weights(d, b, n));
  });
}

// bfloat16 without a backward pass: each head's P in a per-thread buffer.
void InferenceBf16(ffi::ThreadPool& pool, const Dims& d, const Mask& mask,
                   const Tensor4Bf16& q, const Tensor4Bf16& k,
                   const Tensor4Bf16& v, Tensor4Bf16& out) {
  ForwardAllHeadsBf16(pool, d, mask, q, k, v, out,
                      [](const Dims& d, int64_t, int64_t) {
                        thread_local std::vector<float> p;
                        p.resize(d.queries * d.keys);
                        return p.data();
                      });
}

// The bfloat16 training forward pass: returns P (B, N, T, S), float32.
void ForwardBf16(ffi::ThreadPool& pool, const Dims& d, const Mask& mask,
                 const Tensor4Bf16& q, const Tensor4Bf16& k,
                 const Tensor4Bf16& v, Tensor4Bf16& out, float* p) {
  ForwardAllHeadsBf16(pool, d, mask, q, k, v, out,
                      [p](const Dims& d, int64_t b, int64_t n) {
                        return p + d.p_at(b, n);
                      });
}

// The gradients of bfloat16 q, k and v from P (float32) and dO, on MKL's
// bfloat16 product: P and dS rounded to bfloat16 as its operands, dS itself
// computed in float32; each gradient rounded once.
void BackwardBf16(ffi::ThreadPool& pool, const Dims& d, const Mask& mask,
                  const Tensor4Bf16& q, const Tensor4Bf16& k,
                  const Tensor4Bf16& v, const Tensor4& probs,
                  const Tensor4Bf16& d_out, Tensor4Bf16& d_q, Tensor4Bf16& d_k,
                  Tensor4Bf16& d_v) {
  const int64_t ld = d.row(), t = d.queries, s = d.keys, h = d.head_dim;
  const float scale = d.scale();
  ParallelFor(pool, d.batch * d.heads, [&](int64_t item) {
    const int64_t b = item / d.heads, n = item % d.heads;
    thread_local std::vector<float> d_logits, grad;
    thread_local std::vector<uint16_t> rounded;
    d_logits.resize(t * s);
    rounded.resize(t * s);
    grad.resize(std::max(t, s) * h);
    float* ds = d_logits.data();
    uint16_t* r16 = rounded.data();
    const float* p = probs.typed_data() + d.p_at(b, n);
    const uint16_t* g = Bits(d_out) + d.q_at(b, n);
    // dV = P^T dO, (S, H); dP = dO V^T, (T, S).
    for (int64_t i = 0; i < t * s; ++i) r16[i] = RoundToBfloat16(p[i]);
    gemm_bf16(kRowMajor, kTrans, kNoTrans, s, h, t, 1.0f, r16, s, g, ld, 0.0f,
              grad.data(), h);
    RoundRows(grad.data(), s, h, Bits(d_v) + d.kv_at(b, n), ld);
    gemm_bf16(kRowMajor, kNoTrans, kTrans, t, s, h, 1.0f, g, ld,
              Bits(v) + d.kv_at(b, n), ld, 0.0f, ds, s);
    SoftmaxBackwardRows(p, ds, t, s, mask.at(b));
    for (int64_t i = 0; i < t * s; ++i) r16[i] = RoundToBfloat16(ds[i]);
    // dQ = scale dS K, (T, H); dK = scale dS^T Q, (S, H).
    gemm_bf16(kRowMajor, kNoTrans, kNoTrans, t, h, s, scale, r16, s,
              Bits(k) + d.kv_at(b, n), ld, 0.0f, grad.data(), h);
    RoundRows(grad.data(), t, h, Bits(d_q) + d.q_at(b, n), ld);
    gemm_bf16(kRowMajor, kTrans, kNoTrans, s, h, t, scale, r16, s,
              Bits(q) + d.q_at(b, n), ld, 0.0f, grad.data(), h);
    RoundRows(grad.data(), s, h, Bits(d_k) + d.kv_at(b, n), ld);
  });
}

// The handlers: each checks the shapes (and the mask's, if given) and runs
// its kernel.

ffi::Error AttentionInferenceBf16(ffi::ThreadPool pool, Tensor4Bf16 q,
                                  Tensor4Bf16 k, Tensor4Bf16 v,
                                  ffi::RemainingArgs mask_arg,
                                  ffi::Result<Tensor4Bf16> out) {
  Dims d;
  Mask mask;
  if (!GetDims(q, k, v, &d) || !GetMask(d, mask_arg, &mask)) return ShapeError();
  if (gemm_bf16 == nullptr) return NoBfloat16Product();
  InferenceBf16(pool, d, mask, q, k, v, *out);
  return ffi::Error::Success();
}

ffi::Error AttentionForwardBf16(ffi::ThreadPool pool, Tensor4Bf16 q,
                                Tensor4Bf16 k, Tensor4Bf16 v,
                                ffi::RemainingArgs mask_arg,
                                ffi::Result<Tensor4Bf16> out,
                                ffi::Result<Tensor4> probs) {
  Dims d;
  Mask mask;
  if (!GetDims(q, k, v, &d) || !GetMask(d, mask_arg, &mask)) return ShapeError();
  if (gemm_bf16 == nullptr) return NoBfloat16Product();
  ForwardBf16(pool, d, mask, q, k, v, *out, probs->typed_data());
  return ffi::Error::Success();
}

ffi::Error AttentionBackwardBf16(ffi::ThreadPool pool, Tensor4Bf16 q,
                                 Tensor4Bf16 k, Tensor4Bf16 v, Tensor4 probs,
                                 Tensor4Bf16 d_out, ffi::RemainingArgs mask_arg,
                                 ffi::Result<Tensor4Bf16> d_q,
                                 ffi::Result<Tensor4Bf16> d_k,
                                 ffi::Result<Tensor4Bf16> d_v) {
  Dims d;
  Mask mask;
  if (!GetDims(q, k, v, &d) || !GetMask(d, mask_arg, &mask)) return ShapeError();
  if (gemm_bf16 == nullptr) return NoBfloat16Product();
  BackwardBf16(pool, d, mask, q, k, v, probs, d_out, *d_q, *d_k, *d_v);
  return ffi::Error::Success();
}

}  // namespace
}  // namespace attention
}  // namespace vit_jax

XLA_FFI_DEFINE_HANDLER_SYMBOL(VitJaxAttentionInferenceBf16,
                              vit_jax::attention::AttentionInferenceBf16,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<vit_jax::attention::Tensor4Bf16>()
                                  .Arg<vit_jax::attention::Tensor4Bf16>()
                                  .Arg<vit_jax::attention::Tensor4Bf16>()
                                  .RemainingArgs()
                                  .Ret<vit_jax::attention::Tensor4Bf16>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(VitJaxAttentionForwardBf16,
                              vit_jax::attention::AttentionForwardBf16,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<vit_jax::attention::Tensor4Bf16>()
                                  .Arg<vit_jax::attention::Tensor4Bf16>()
                                  .Arg<vit_jax::attention::Tensor4Bf16>()
                                  .RemainingArgs()
                                  .Ret<vit_jax::attention::Tensor4Bf16>()
                                  .Ret<vit_jax::attention::Tensor4>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(VitJaxAttentionBackwardBf16,
                              vit_jax::attention::AttentionBackwardBf16,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<vit_jax::attention::Tensor4Bf16>()
                                  .Arg<vit_jax::attention::Tensor4Bf16>()
                                  .Arg<vit_jax::attention::Tensor4Bf16>()
                                  .Arg<vit_jax::attention::Tensor4>()
                                  .Arg<vit_jax::attention::Tensor4Bf16>()
                                  .RemainingArgs()
                                  .Ret<vit_jax::attention::Tensor4Bf16>()
                                  .Ret<vit_jax::attention::Tensor4Bf16>()
                                  .Ret<vit_jax::attention::Tensor4Bf16>());
