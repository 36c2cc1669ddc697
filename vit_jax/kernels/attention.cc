// Multi-head attention in float32 for XLA:CPU through the XLA FFI, on the
// BLAS (the layout, the weights kept for the backward pass and the mask:
// attention.h).
#include <vector>

#include "attention.h"

namespace vit_jax {
namespace attention {
namespace {

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
    SoftmaxBackwardRows(p, ds, t, s, mask.at(b));
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
}  // namespace attention
}  // namespace vit_jax

XLA_FFI_DEFINE_HANDLER_SYMBOL(VitJaxAttentionForwardF32,
                              vit_jax::attention::AttentionForward,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<vit_jax::attention::Tensor4>()
                                  .Arg<vit_jax::attention::Tensor4>()
                                  .Arg<vit_jax::attention::Tensor4>()
                                  .RemainingArgs()
                                  .Ret<vit_jax::attention::Tensor4>()
                                  .Ret<vit_jax::attention::Tensor4>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(VitJaxAttentionInferenceF32,
                              vit_jax::attention::AttentionInference,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<vit_jax::attention::Tensor4>()
                                  .Arg<vit_jax::attention::Tensor4>()
                                  .Arg<vit_jax::attention::Tensor4>()
                                  .RemainingArgs()
                                  .Ret<vit_jax::attention::Tensor4>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(VitJaxAttentionBackwardF32,
                              vit_jax::attention::AttentionBackward,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<vit_jax::attention::Tensor4>()
                                  .Arg<vit_jax::attention::Tensor4>()
                                  .Arg<vit_jax::attention::Tensor4>()
                                  .Arg<vit_jax::attention::Tensor4>()
                                  .Arg<vit_jax::attention::Tensor4>()
                                  .RemainingArgs()
                                  .Ret<vit_jax::attention::Tensor4>()
                                  .Ret<vit_jax::attention::Tensor4>()
                                  .Ret<vit_jax::attention::Tensor4>());
