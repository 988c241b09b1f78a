// The gated delta rule's decode step (models/delta_net.py's recurrent form, one token per sequence), in place in the
// state pool. PyTorch's form gathers each sequence's state (value heads x key dim x value dim, 3 MB a layer at
// Qwen3.5's sizes), and passes over it six times, each a new tensor: decayed, times k, summed, the outer product,
// added, times q, summed; then scatters it back. Here each head's state is read from the pool and written back once
// each pass of two, and the second pass reads it from the core's cache:
//   pass 1, over the key dim i: S[i] *= exp(g); kS += k[i] * S[i]      (S[i]: the state's row i, value dim wide)
//   u = (v - kS) * beta
//   pass 2, over i:             S[i] += k[i] * u;  o += q[i] * S[i]
// Every sum runs over i in order for each value lane j, one fused multiply-add at a time, so a sequence's numbers
// do not depend on which others share the call, and the compiler's vector loops (over j) are the plain loops' bits.

#include "exp.h"
#include "kernels.h"

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>

#include <algorithm>
#include <cmath>
#include <vector>

// slots: contiguous int64 (rows,), each inside a pool of `pool` slots and none given twice (each state is one
// sequence's, updated by one task).
void check_slots(const at::Tensor& slots, int64_t rows, int64_t pool) {
  TORCH_CHECK(slots.scalar_type() == at::kLong && slots.dim() == 1 && slots.size(0) == rows && slots.is_contiguous(),
              "slots must be contiguous int64 (rows,)");
  const int64_t* slot = slots.data_ptr<int64_t>();
  for (int64_t r = 0; r < rows; ++r) {
    TORCH_CHECK(slot[r] >= 0 && slot[r] < pool, "slot ", slot[r], " is outside the pool's ", pool);
    for (int64_t other = 0; other < r; ++other) TORCH_CHECK(slot[other] != slot[r], "slot ", slot[r], " given twice");
  }
}

namespace {

// states: (slots, heads, key dim, value dim) float32 on the CPU; slots inside `pool` (the smallest of the pools the
// caller updates) and none given twice. Checked before anything is updated.
void check_states(const at::Tensor& states, const at::Tensor& slots, int64_t rows, int64_t pool) {
  TORCH_CHECK(states.dim() == 4 && states.scalar_type() == at::kFloat && states.is_contiguous() && states.device().is_cpu(),
              "states must be contiguous float32 (slots, heads, key dim, value dim) on the CPU");
  check_slots(slots, rows, pool);
}

// The output gate's RMSNorm (models/delta_net.py's gated_rms_norm) on each head's output as the rule leaves it:
// o = norm * (o / rms(o)) * silu(z), z at row r and head h from z + r * z_stride + h * value dim.
struct OutputGate {
  const float* z;
  int64_t z_stride;
  const float* norm;  // (value dim,)
  float eps;
};

// The rule on inputs already checked: q, k (B, H, dk), q scaled; v (B, H, dv); g, beta (B, H); states and slots as
// check_states; with `gate`, each head's output through the output gate's RMSNorm.
at::Tensor rule(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& g,
                const at::Tensor& beta, at::Tensor& states, const at::Tensor& slots, const OutputGate* gate = nullptr) {
  const int64_t heads = states.size(1), dk = states.size(2), dv = states.size(3), rows = q.size(0);
  const int64_t* slot = slots.data_ptr<int64_t>();
  auto out = at::empty({rows, heads, dv}, q.options());
  const float *qp = q.data_ptr<float>(), *kp = k.data_ptr<float>(), *vp = v.data_ptr<float>();
  const float *gp = g.data_ptr<float>(), *bp = beta.data_ptr<float>();
  float* sp = states.data_ptr<float>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, rows * heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> ks(dv), u(dv);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t r = task / heads, h = task % heads;
      float* s = sp + (slot[r] * heads + h) * dk * dv;
      const float *qi = qp + task * dk, *ki = kp + task * dk, *vi = vp + task * dv;
      float* o = op + task * dv;
      const float decay = std::exp(gp[task]), b = bp[task];
      std::fill(ks.begin(), ks.end(), 0.f);
      for (int64_t i = 0; i < dk; ++i) {
        float* row = s + i * dv;
        for (int64_t j = 0; j < dv; ++j) {
          row[j] *= decay;
          ks[j] = std::fma(ki[i], row[j], ks[j]);
        }
      }
      for (int64_t j = 0; j < dv; ++j) {
        u[j] = (vi[j] - ks[j]) * b;
        o[j] = 0.f;
      }
      for (int64_t i = 0; i < dk; ++i) {
        float* row = s + i * dv;
        for (int64_t j = 0; j < dv; ++j) {
          row[j] = std::fma(ki[i], u[j], row[j]);
          o[j] = std::fma(qi[i], row[j], o[j]);
        }
      }
      if (gate) {
        float squares = 0.f;
        for (int64_t j = 0; j < dv; ++j) squares = std::fma(o[j], o[j], squares);
        const float inverse = 1.f / std::sqrt(squares / dv + gate->eps);
        std::copy_n(gate->z + r * gate->z_stride + h * dv, dv, u.data());  // u is spent: it takes silu(z)
        silu_in_place(u.data(), dv);
        for (int64_t j = 0; j < dv; ++j) o[j] = gate->norm[j] * (o[j] * inverse) * u[j];
      }
    }
  });
  return out;
}

}  // namespace

// q, k: (B, H, dk) float32, q scaled; v: (B, H, dv); g, beta: (B, H); states: (slots, H, dk, dv) float32, the pool
// of one layer, updated in place at slots (B,) int64. Returns the outputs (B, H, dv).
at::Tensor delta_rule_decode(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& g,
                             const at::Tensor& beta, at::Tensor& states, const at::Tensor& slots) {
  const int64_t rows = q.size(0);
  check_states(states, slots, rows, states.size(0));
  const int64_t heads = states.size(1), dk = states.size(2), dv = states.size(3);
  for (const at::Tensor* t : {&g, &beta})
    TORCH_CHECK(t->scalar_type() == at::kFloat && t->is_contiguous() && t->dim() == 2 && t->size(0) == rows &&
                    t->size(1) == heads,
                "g and beta must be contiguous float32 (rows, heads)");
  for (const at::Tensor* t : {&q, &k})
    TORCH_CHECK(t->scalar_type() == at::kFloat && t->is_contiguous() && t->dim() == 3 && t->size(0) == rows &&
                    t->size(1) == heads && t->size(2) == dk,
                "q and k must be contiguous float32 (rows, heads, key dim)");
  TORCH_CHECK(v.scalar_type() == at::kFloat && v.is_contiguous() && v.dim() == 3 && v.size(0) == rows &&
                  v.size(1) == heads && v.size(2) == dv,
              "v must be contiguous float32 (rows, heads, value dim)");
  return rule(q, k, v, g, beta, states, slots);
}

// A Gated DeltaNet layer's decodes from its fused projection's rows, up to its out_proj (models/hybrid.py's
// DeltaNetBlock; its PyTorch form, TorchOps.delta_net_decode, is some 40 small ops a layer). A row of `proj` holds the
// convolution's channels (q, k and v of every head), the output gate z (value heads x value dim), then b and a (one per
// value head). Per row: beta = sigmoid(b) and g = neg_a * softplus(a + dt_bias); the causal convolution over the
// sequence's last K - 1 inputs (kept at its slot in conv_states, moved on by one in place) and its new one, SiLU; q and
// k L2-normalized per key head (q then scaled by key dim^-1/2) and given to the value heads that read them (consecutive
// ones, or with `tiled` every key_heads-th, as llama.cpp orders them); the rule (delta_rule_decode); each head's output
// through the gated RMSNorm with `norm` and z. Every sum runs in order with one fused multiply-add at a time and every
// product stands alone, and the SiLUs' runs of channels never depend on the threads, so each row's numbers are its own,
// whatever shares the call; the SiLUs take exp.h's vector exp where it is built, so the portable build's differ in the
// last bits. proj: (B, width) float32 rows (their stride may be wider); conv: (channels, K) float32; conv_states:
// (slots, channels, K - 1); neg_a, dt_bias: (value heads,); norm: (value dim,); states and slots as delta_rule_decode.
// Returns (B, value heads * value dim), what out_proj takes.
at::Tensor delta_net_decode(const at::Tensor& proj, const at::Tensor& conv, at::Tensor& conv_states,
                            const at::Tensor& neg_a, const at::Tensor& dt_bias, const at::Tensor& norm, double eps,
                            at::Tensor& states, const at::Tensor& slots, int64_t key_heads, bool tiled) {
  TORCH_CHECK(proj.dim() == 2 && proj.scalar_type() == at::kFloat && proj.stride(1) == 1 && proj.device().is_cpu(),
              "proj must be float32 rows (rows, width) on the CPU");
  TORCH_CHECK(conv.dim() == 2 && conv.scalar_type() == at::kFloat && conv.is_contiguous() && conv.size(1) >= 1,
              "conv must be contiguous float32 (channels, kernel)");
  const int64_t rows = proj.size(0), channels = conv.size(0);
  const int64_t width = conv.size(1) - 1;  // the inputs each sequence keeps
  TORCH_CHECK(conv_states.dim() == 3 && conv_states.scalar_type() == at::kFloat && conv_states.is_contiguous() &&
                  conv_states.size(1) == channels && conv_states.size(2) == width,
              "conv_states must be contiguous float32 (slots, channels, kernel - 1)");
  // all checked before the kept inputs move
  check_states(states, slots, rows, std::min(conv_states.size(0), states.size(0)));
  const int64_t heads = states.size(1), dk = states.size(2), dv = states.size(3);
  TORCH_CHECK(key_heads >= 1 && heads % key_heads == 0 && channels == 2 * key_heads * dk + heads * dv,
              "channels must be q and k of ", key_heads, " key heads of ", dk, " and v of ", heads, " heads of ", dv,
              ", got ", channels);
  TORCH_CHECK(proj.size(1) == channels + heads * dv + 2 * heads, "proj must hold ", channels, " channels, z (",
              heads * dv, "), b and a (", heads, " each), got a width of ", proj.size(1));
  for (const at::Tensor* t : {&neg_a, &dt_bias})
    TORCH_CHECK(t->scalar_type() == at::kFloat && t->is_contiguous() && t->numel() == heads,
                "neg_a and dt_bias must be contiguous float32 (", heads, ",)");
  TORCH_CHECK(norm.scalar_type() == at::kFloat && norm.is_contiguous() && norm.numel() == dv,
              "norm must be contiguous float32 (", dv, ",)");
  const int64_t repeat = heads / key_heads;
  const float scale = static_cast<float>(std::pow(static_cast<double>(dk), -0.5));  // Python's key_dim ** -0.5
  auto q = at::empty({rows, heads, dk}, proj.options()), k = at::empty({rows, heads, dk}, proj.options());
  auto v = at::empty({rows, heads, dv}, proj.options());
  auto g = at::empty({rows, heads}, proj.options()), beta = at::empty({rows, heads}, proj.options());
  const int64_t* slot = slots.data_ptr<int64_t>();
  const float *w = conv.data_ptr<float>(), *na = neg_a.data_ptr<float>(), *bias = dt_bias.data_ptr<float>();
  // the convolution and SiLU, split over the threads by row and by CHANNELS channels (a lone row's too), a whole
  // number of any vector width so that no channel's SiLU depends on the split
  constexpr int64_t CHANNELS = 512;
  const int64_t pieces = (channels + CHANNELS - 1) / CHANNELS;
  auto y = at::empty({rows, channels}, proj.options());
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, rows * pieces, 1, [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task) {
      const int64_t r = task / pieces, c0 = task % pieces * CHANNELS, c1 = std::min(channels, c0 + CHANNELS);
      const float* in = proj.data_ptr<float>() + r * proj.stride(0);
      float* kept = conv_states.data_ptr<float>() + slot[r] * channels * width;
      for (int64_t c = c0; c < c1; ++c) {
        float* last = kept + c * width;
        const float* wc = w + c * (width + 1);
        float acc = 0.f;
        for (int64_t j = 0; j < width; ++j) acc = std::fma(last[j], wc[j], acc);
        yp[r * channels + c] = std::fma(in[c], wc[width], acc);
        if (width > 0) {
          for (int64_t j = 0; j + 1 < width; ++j) last[j] = last[j + 1];
          last[width - 1] = in[c];
        }
      }
      silu_in_place(yp + r * channels + c0, c1 - c0);
    }
  });
  for (int64_t r = 0; r < rows; ++r) {  // the gates, q and k's norms and the heads: a few thousand values a row
    const float* ba = proj.data_ptr<float>() + r * proj.stride(0) + channels + heads * dv;  // b, then a
    for (int64_t h = 0; h < heads; ++h) {
      beta.data_ptr<float>()[r * heads + h] = 1.f / (1.f + std::exp(-ba[h]));
      const float x = ba[heads + h] + bias[h];
      g.data_ptr<float>()[r * heads + h] = na[h] * (x > 20.f ? x : std::log1p(std::exp(x)));  // softplus
    }
    const float* yr = yp + r * channels;
    for (int64_t part = 0; part < 2; ++part) {  // q, then k
      float* out = (part == 0 ? q : k).data_ptr<float>() + r * heads * dk;
      for (int64_t kh = 0; kh < key_heads; ++kh) {
        const float* x = yr + (part * key_heads + kh) * dk;
        float squares = 0.f;
        for (int64_t i = 0; i < dk; ++i) squares = std::fma(x[i], x[i], squares);
        const float inverse = 1.f / std::sqrt(squares + 1e-6f);
        for (int64_t j = 0; j < repeat; ++j) {
          float* head = out + (tiled ? kh + j * key_heads : kh * repeat + j) * dk;
          for (int64_t i = 0; i < dk; ++i) head[i] = part == 0 ? x[i] * inverse * scale : x[i] * inverse;
        }
      }
    }
    std::copy(yr + 2 * key_heads * dk, yr + channels, v.data_ptr<float>() + r * heads * dv);
  }
  const OutputGate gate{proj.data_ptr<float>() + channels, proj.stride(0), norm.data_ptr<float>(),
                        static_cast<float>(eps)};
  return rule(q, k, v, g, beta, states, slots, &gate).view({rows, heads * dv});
}
