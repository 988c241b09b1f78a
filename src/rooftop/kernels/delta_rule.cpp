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

#include "kernels.h"

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>

#include <cmath>
#include <vector>

// q, k: (B, H, dk) float32, q scaled; v: (B, H, dv); g, beta: (B, H); states: (slots, H, dk, dv) float32, the pool
// of one layer, updated in place at slots (B,) int64. Returns the outputs (B, H, dv).
at::Tensor delta_rule_decode(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& g,
                             const at::Tensor& beta, at::Tensor& states, const at::Tensor& slots) {
  TORCH_CHECK(states.dim() == 4 && states.scalar_type() == at::kFloat && states.is_contiguous() && states.device().is_cpu(),
              "states must be contiguous float32 (slots, heads, key dim, value dim) on the CPU");
  const int64_t heads = states.size(1), dk = states.size(2), dv = states.size(3), rows = q.size(0);
  for (const at::Tensor* t : {&q, &k})
    TORCH_CHECK(t->scalar_type() == at::kFloat && t->is_contiguous() && t->dim() == 3 && t->size(0) == rows &&
                    t->size(1) == heads && t->size(2) == dk,
                "q and k must be contiguous float32 (rows, heads, key dim)");
  TORCH_CHECK(v.scalar_type() == at::kFloat && v.is_contiguous() && v.dim() == 3 && v.size(0) == rows &&
                  v.size(1) == heads && v.size(2) == dv,
              "v must be contiguous float32 (rows, heads, value dim)");
  for (const at::Tensor* t : {&g, &beta})
    TORCH_CHECK(t->scalar_type() == at::kFloat && t->is_contiguous() && t->dim() == 2 && t->size(0) == rows &&
                    t->size(1) == heads,
                "g and beta must be contiguous float32 (rows, heads)");
  TORCH_CHECK(slots.scalar_type() == at::kLong && slots.dim() == 1 && slots.size(0) == rows && slots.is_contiguous(),
              "slots must be contiguous int64 (rows,)");
  const int64_t* slot = slots.data_ptr<int64_t>();
  for (int64_t r = 0; r < rows; ++r) {  // each state is one sequence's, updated by one task
    TORCH_CHECK(slot[r] >= 0 && slot[r] < states.size(0), "slot ", slot[r], " is outside the pool's ", states.size(0));
    for (int64_t other = 0; other < r; ++other) TORCH_CHECK(slot[other] != slot[r], "slot ", slot[r], " given twice");
  }
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
    }
  });
  return out;
}
