// Unmasked multi-head attention for XLA:CPU through the XLA FFI, on the BLAS.
//
// q (B, T, N, H), k and v (B, S, N, H) stay in the layout the projections
// produce: head n of example b is a (T, H) matrix with row stride N*H, which
// the BLAS reads in place, so no transposes to head-major order are needed.
// The forward pass also returns the attention weights P (B, N, T, S), which
// the backward pass reuses instead of recomputing the softmax.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "blas.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace vit_jax {

using Tensor4 = ffi::Buffer<ffi::F32, 4>;

struct Dims {
  int64_t batch, queries, keys, heads, head_dim;
  int64_t row() const { return heads * head_dim; }  // Row stride of q, k, v.
};

static bool GetDims(const Tensor4& q, const Tensor4& k, const Tensor4& v,
                    Dims* dims) {
  auto qd = q.dimensions(), kd = k.dimensions(), vd = v.dimensions();
  *dims = {qd[0], qd[1], kd[1], qd[2], qd[3]};
  for (int i : {0, 2, 3}) {
    if (kd[i] != qd[i] || vd[i] != qd[i]) return false;
  }
  return kd[1] == vd[1];
}

// Rows of `logits` (rows, length) -> softmax, in place.
static void Softmax(float* logits, int64_t rows, int64_t length) {
  for (int64_t r = 0; r < rows; ++r) {
    float* row = logits + r * length;
    float max = *std::max_element(row, row + length);
    float sum = 0.0f;
    for (int64_t s = 0; s < length; ++s) {
      row[s] = std::exp(row[s] - max);
      sum += row[s];
    }
    const float inv = 1.0f / sum;
    for (int64_t s = 0; s < length; ++s) row[s] *= inv;
  }
}

static ffi::Error AttentionForward(Tensor4 q, Tensor4 k, Tensor4 v,
                                   ffi::Result<Tensor4> out,
                                   ffi::Result<Tensor4> probs, float scale) {
  Dims d;
  if (!GetDims(q, k, v, &d)) {
    return ffi::Error::InvalidArgument("vit_jax attention: q/k/v shapes differ");
  }
  const int64_t ld = d.row(), t = d.queries, s = d.keys, h = d.head_dim;
  for (int64_t b = 0; b < d.batch; ++b) {
    const float* qb = q.typed_data() + b * t * ld;
    const float* kb = k.typed_data() + b * s * ld;
    const float* vb = v.typed_data() + b * s * ld;
    float* pb = probs->typed_data() + b * d.heads * t * s;  // (N, T, S)
    float* ob = out->typed_data() + b * t * ld;
    // Logits of every head: scale * Q_n K_n^T, (T, S).
    GemmBatch(false, true, t, s, h, scale, qb, ld, h, kb, ld, h, 0.0f, pb, s,
              t * s, d.heads);
    Softmax(pb, d.heads * t, s);
    // O_n = P_n V_n, (T, H), written straight into (T, N, H).
    GemmBatch(false, false, t, h, s, 1.0f, pb, s, t * s, vb, ld, h, 0.0f, ob,
              ld, h, d.heads);
  }
  return ffi::Error::Success();
}

static ffi::Error AttentionBackward(Tensor4 q, Tensor4 k, Tensor4 v,
                                    Tensor4 probs, Tensor4 d_out,
                                    ffi::Result<Tensor4> d_q,
                                    ffi::Result<Tensor4> d_k,
                                    ffi::Result<Tensor4> d_v, float scale) {
  Dims d;
  if (!GetDims(q, k, v, &d)) {
    return ffi::Error::InvalidArgument("vit_jax attention: q/k/v shapes differ");
  }
  const int64_t ld = d.row(), t = d.queries, s = d.keys, h = d.head_dim;
  std::vector<float> d_logits(d.heads * t * s);  // One example's, reused.
  for (int64_t b = 0; b < d.batch; ++b) {
    const float* qb = q.typed_data() + b * t * ld;
    const float* kb = k.typed_data() + b * s * ld;
    const float* vb = v.typed_data() + b * s * ld;
    const float* pb = probs.typed_data() + b * d.heads * t * s;
    const float* gb = d_out.typed_data() + b * t * ld;
    float* ds = d_logits.data();
    // dV_n = P_n^T dO_n, (S, H).
    GemmBatch(true, false, s, h, t, 1.0f, pb, s, t * s, gb, ld, h, 0.0f,
              d_v->typed_data() + b * s * ld, ld, h, d.heads);
    // dP_n = dO_n V_n^T, (T, S).
    GemmBatch(false, true, t, s, h, 1.0f, gb, ld, h, vb, ld, h, 0.0f, ds, s,
              t * s, d.heads);
    // Through the softmax: dS = P * (dP - rowsum(P * dP)).
    for (int64_t r = 0; r < d.heads * t; ++r) {
      const float* p = pb + r * s;
      float* g = ds + r * s;
      float dot = 0.0f;
      for (int64_t j = 0; j < s; ++j) dot += p[j] * g[j];
      for (int64_t j = 0; j < s; ++j) g[j] = p[j] * (g[j] - dot);
    }
    // dQ_n = scale dS_n K_n, (T, H); dK_n = scale dS_n^T Q_n, (S, H).
    GemmBatch(false, false, t, h, s, scale, ds, s, t * s, kb, ld, h, 0.0f,
              d_q->typed_data() + b * t * ld, ld, h, d.heads);
    GemmBatch(true, false, s, h, t, scale, ds, s, t * s, qb, ld, h, 0.0f,
              d_k->typed_data() + b * s * ld, ld, h, d.heads);
  }
  return ffi::Error::Success();
}

}  // namespace vit_jax

XLA_FFI_DEFINE_HANDLER_SYMBOL(VitJaxAttentionForwardF32,
                              vit_jax::AttentionForward,
                              ffi::Ffi::Bind()
                                  .Arg<vit_jax::Tensor4>()
                                  .Arg<vit_jax::Tensor4>()
                                  .Arg<vit_jax::Tensor4>()
                                  .Ret<vit_jax::Tensor4>()
                                  .Ret<vit_jax::Tensor4>()
                                  .Attr<float>("scale"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(VitJaxAttentionBackwardF32,
                              vit_jax::AttentionBackward,
                              ffi::Ffi::Bind()
                                  .Arg<vit_jax::Tensor4>()
                                  .Arg<vit_jax::Tensor4>()
                                  .Arg<vit_jax::Tensor4>()
                                  .Arg<vit_jax::Tensor4>()
                                  .Arg<vit_jax::Tensor4>()
                                  .Ret<vit_jax::Tensor4>()
                                  .Ret<vit_jax::Tensor4>()
                                  .Ret<vit_jax::Tensor4>()
                                  .Attr<float>("scale"));
