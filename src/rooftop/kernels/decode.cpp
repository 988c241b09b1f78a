// A step of decodes through a model's decoder layers in one call (models/decode_call.py): attention layers (a hybrid's
// gated attention too) and a hybrid's Gated DeltaNet layers, each MLP half dense or a mixture of experts. Python runs a
// layer as some ten kernel calls (a mixture of experts' layer as some twenty, with its routing's), and after each
// linear's weights have streamed through the caches the interpreter's code and objects between the calls come back from
// memory cold; here the same kernels and PyTorch ops run in the same order with the same arguments (models/blocks.py
// and models/mlp.py on models/ops.py's KernelOps), so every row's result is the same bits either way.
// Given `seconds`, each call's time is added to its op class there, as the calibration's op timer (engine/calibrate.py)
// adds the calls Python makes: the linears, attention (RoPE with it, as KernelOps.attention runs it), elementwise.

#include <ATen/EmptyTensor.h>
#include <ATen/ops/constant_pad_nd.h>
#include <ATen/ops/zeros_like.h>

#include <chrono>
#include <cstring>

#include "kernels.h"
#include "quantized.h"

namespace {

// The op classes in the order of roofline/calibration.py's KERNEL_CLASSES, which the op timer reads `seconds` in.
enum OpClass { LINEARS, ATTENTION, ELEMENTWISE };

// call(), its time added to clock[which] where there is a clock.
template <typename Call>
at::Tensor timed(double* clock, OpClass which, Call&& call) {
  if (clock == nullptr) return call();
  const auto start = std::chrono::steady_clock::now();
  at::Tensor result = call();
  clock[which] += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

// in @ W^T (+ residual) for a linear of one part, tiled or bfloat16, or of several (a fused projection whose parts a
// file stores in different formats): each part's outputs side by side, then the residual added, as quant/linear.py's
// ConcatLinear has them.
at::Tensor linear(const std::vector<LinearPart>& parts, const at::Tensor& in, const c10::optional<at::Tensor>& residual) {
  const auto part = [&](const LinearPart& w, const c10::optional<at::Tensor>& res) {
    const auto& [q, dm, format, n, bias] = w;
    return dm ? tiled_linear(in, q, *dm, format, n, bias, res, false) : bf16_linear(in, q, bias, res, false);
  };
  if (parts.size() == 1) return part(parts[0], residual);
  std::vector<at::Tensor> outs;
  int64_t width = 0;
  for (const LinearPart& w : parts) {
    outs.push_back(part(w, c10::nullopt));
    width += std::get<3>(w);
  }
  const int64_t rows = in.size(0);
  at::Tensor out(at::detail::empty_cpu({rows, width}, in.options()));
  float* o = out.data_ptr<float>();
  int64_t at = 0;
  for (const at::Tensor& y : outs) {
    const int64_t n = y.size(1);
    for (int64_t r = 0; r < rows; ++r) std::memcpy(o + r * width + at, y.data_ptr<float>() + r * n, n * sizeof(float));
    at += n;
  }
  if (residual) {
    const float* res = residual->data_ptr<float>();
    for (int64_t i = 0; i < rows * width; ++i) o[i] += res[i];
  }
  return out;
}

// The weighted sum of the experts each of rows h picks, as models/mlp.py's route and SparseMoE compute it: the
// router's float32 logits on f32_linear (RouterLinear's narrow rows), their top k (route_rows); then the experts on
// the rows routed to them. The experts count as linears, as the op timer counts their call from Python.
at::Tensor mixture(const at::Tensor& router, const RowExperts& experts, int64_t top_k, bool normalize,
                   const at::Tensor& h, double* clock, int64_t& touched) {
  const at::Tensor logits =
      timed(clock, LINEARS, [&] { return f32_linear(h, router, c10::nullopt, c10::nullopt, false); });
  const auto [weights, ids] = route_rows(logits, top_k, normalize);
  return timed(clock, LINEARS, [&] { return experts.rows(h, ids, weights, touched); });
}

}  // namespace

at::Tensor DecodeLayers::run(at::Tensor x, const at::Tensor& positions, const at::Tensor& slot_mapping,
                             const at::Tensor& tables, const at::Tensor& lengths, int64_t block_size,
                             std::vector<at::Tensor> k_pools, std::vector<at::Tensor> v_pools,
                             const std::vector<c10::optional<at::Tensor>>& k_scales,
                             const std::vector<c10::optional<at::Tensor>>& v_scales,
                             const c10::optional<at::Tensor>& seconds,
                             const c10::optional<at::Tensor>& touched, c10::optional<at::Tensor> conv_states,
                             c10::optional<at::Tensor> states, const c10::optional<at::Tensor>& state_slots) const {
  const size_t layers = qk_norms.size();
  TORCH_CHECK(linears.size() == 4 * layers && norms.size() == 2 * layers + 1, "four linears and two norms per layer");
  TORCH_CHECK(routers.size() == layers && experts.size() == layers && gated.size() == layers &&
                  delta_nets.size() == layers && shared_gates.size() == layers,
              "a router and experts, a shared expert's gate, a gated attention's and a Gated DeltaNet's tensors (or "
              "none) per layer");
  size_t attention_layers = 0;
  for (size_t l = 0; l < layers; ++l) {
    if (!delta_nets[l]) ++attention_layers;
    TORCH_CHECK(!delta_nets[l] || (conv_states && states && state_slots),
                "a Gated DeltaNet layer needs the state pools and the rows' slots");
  }
  TORCH_CHECK(!touched || (touched->scalar_type() == at::kLong && touched->numel() == static_cast<int64_t>(layers) &&
                           touched->is_contiguous()),
              "touched must be an int64 per layer");
  TORCH_CHECK(k_pools.size() == attention_layers && v_pools.size() == attention_layers &&
                  k_scales.size() == attention_layers && v_scales.size() == attention_layers,
              "a K and a V pool (and their scales, or none) per attention layer");
  TORCH_CHECK(!seconds || (seconds->scalar_type() == at::kDouble && seconds->numel() == 3 && seconds->is_contiguous()),
              "seconds must be 3 contiguous float64: linears, attention, elementwise");
  // What the layers' kernels check, checked before the first of them moves a state or writes a pool: the positions
  // in every rotary table, the rows' KV slots, blocks and lengths, and their state slots.
  const int64_t rows = x.size(0);
  bool plain = false;
  for (size_t l = 0; l < layers; ++l) {
    if (const auto& g = gated[l]) check_rope_tables(positions, rows, g->cos, g->signed_sin, head_dim);
    plain = plain || (!gated[l] && !delta_nets[l]);
    if (const auto& d = delta_nets[l])
      TORCH_CHECK(conv_states->dim() == 4 && states->dim() == 5 && d->index >= 0 && d->index < conv_states->size(0) &&
                      d->index < states->size(0),
                  "layer ", l, ": its state index ", d->index, " is outside the state pools");
  }
  if (plain) check_rope_tables(positions, rows, cos, signed_sin, head_dim);
  if (attention_layers > 0) check_decode_rows(rows, k_pools[0].size(0), slot_mapping, tables, lengths, block_size);
  if (attention_layers < layers) check_slots(*state_slots, rows, std::min(conv_states->size(1), states->size(1)));
  double* clock = seconds ? seconds->data_ptr<double>() : nullptr;
  const auto project = [&](const std::vector<LinearPart>& parts, const at::Tensor& in,
                           const c10::optional<at::Tensor>& residual) {
    return timed(clock, LINEARS, [&] { return linear(parts, in, residual); });
  };
  const auto norm = [&](const at::Tensor& in, const at::Tensor& weight) {
    return timed(clock, ELEMENTWISE, [&] { return rms_norm(in, weight, eps); });
  };
  size_t a = 0;  // the attention layers' index into the pools
  for (size_t l = 0; l < layers; ++l) {
    const std::vector<LinearPart>* w = &linears[4 * l];
    at::Tensor qkv = project(w[0], norm(x, norms[2 * l]), c10::nullopt);
    const at::Tensor attended = timed(clock, ATTENTION, [&] {
      if (const auto& d = delta_nets[l]) {
        at::Tensor kept = conv_states->select(0, d->index), state = states->select(0, d->index);
        return delta_net_decode(qkv, d->conv, kept, d->neg_a, d->dt_bias, d->norm, eps, state, *state_slots,
                                d->key_heads, d->tiled);
      }
      const size_t pool = a++;
      if (const auto& g = gated[l]) {
        return gated_decode_attention(qkv, g->q_norm, g->k_norm, positions, g->cos, g->signed_sin, eps, k_pools[pool],
                                      v_pools[pool], slot_mapping, tables, lengths, block_size, heads, kv_heads, scale,
                                      k_scales[pool], v_scales[pool]);
      }
      rope_(qkv, heads + kv_heads, head_dim, positions, cos, signed_sin, qk_norms[l], eps);
      return decode_attention(qkv, k_pools[pool], v_pools[pool], slot_mapping, tables, lengths, block_size, heads,
                              kv_heads, scale, k_scales[pool], v_scales[pool]);
    });
    x = project(w[1], attended, x);
    const at::Tensor h = norm(x, norms[2 * l + 1]);
    if (routers[l]) {
      const auto& shared_gate = shared_gates[l];
      TORCH_CHECK(experts[l] && w[2].empty() == !shared_gate && w[3].empty() == !shared_gate && top_k >= 1,
                  "layer ", l, ": a router, its experts, top_k >= 1 and no dense MLP but a shared expert's");
      int64_t count = 0;
      at::Tensor out = mixture(*routers[l], *experts[l], top_k, normalize, h, clock, count);
      if (shared_gate) {  // + sigmoid(shared_gate(h)) * shared(h), the sigmoid on a row padded as rowwise pads it
        const at::Tensor logit =
            timed(clock, LINEARS, [&] { return f32_linear(h, *shared_gate, c10::nullopt, c10::nullopt, false); });
        const at::Tensor gate = at::constant_pad_nd(logit, {0, 63}, 0).sigmoid().narrow(1, 0, 1);
        const at::Tensor gate_up = project(w[2], h, c10::nullopt);
        const at::Tensor shared =
            project(w[3], timed(clock, ELEMENTWISE, [&] { return silu_mul(gate_up); }), c10::nullopt);
        out = out.add(gate.mul(shared));
      }
      x = x.add(out);  // SparseMoE's residual + out
      if (touched) touched->data_ptr<int64_t>()[l] = count;
      continue;
    }
    const at::Tensor gate_up = project(w[2], h, c10::nullopt);
    x = project(w[3], timed(clock, ELEMENTWISE, [&] { return silu_mul(gate_up); }), x);
  }
  return norm(x, norms.back());
}

// Rows x (T, hidden), each with its k experts (T, k) and their routing weights (T, k), as models/mlp.py's SparseMoE
// runs them: each expert once (its weights read once a step) on the rows routed to it, its output times each row's
// routing weight added into that row, the experts in ascending order; for a lone row the same as its k experts
// straight (`_one_row`). A row's linears do not depend on the rows beside it (batch invariance) nor on the threads,
// and the multiplies and adds are PyTorch's float32 ones in PyTorch's order, so each row's sum is the same bits as
// Python's paths. Where there are at least as many experts as threads they run side by side, each on one thread:
// a decode's experts are small matrices (a Qwen3-30B-A3B's ~3 MB each in Q4_K_M), where splitting each one's tiles
// over the threads started and joined them twice an expert; fewer (a lone row on a host of many cores) each run on
// all the threads in turn. A tile's result does not depend on the thread that runs it, so the bits are the same.
// `touched`: the distinct experts run.
at::Tensor RowExperts::rows(const at::Tensor& x, const at::Tensor& experts, const at::Tensor& weights,
                            int64_t& touched) const {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(), "x must be contiguous float32 rows");
  TORCH_CHECK(experts.dim() == 2 && experts.scalar_type() == at::kLong && experts.size(0) == x.size(0) &&
                  weights.sizes() == experts.sizes() && weights.scalar_type() == at::kFloat,
              "experts must be int64 (rows, k) with float32 weights of the same shape");
  const int64_t rows = x.size(0), k = experts.size(1), hidden = x.size(1), count = static_cast<int64_t>(gate_ups.size());
  const at::Tensor ids = experts.contiguous(), scales = weights.contiguous();
  const int64_t* id = ids.data_ptr<int64_t>();
  const float* scale = scales.data_ptr<float>();
  std::vector<std::vector<int64_t>> pairs(count);  // per expert, its (row, slot) pairs as flat indices, ascending
  for (int64_t i = 0; i < rows * k; ++i) {
    TORCH_CHECK(id[i] >= 0 && id[i] < count, "expert ", id[i], " of ", count);
    pairs[id[i]].push_back(i);
  }
  std::vector<int64_t> active;  // the experts some row was routed to, ascending
  for (int64_t e = 0; e < count; ++e) {
    if (!pairs[e].empty()) active.push_back(e);
  }
  touched = static_cast<int64_t>(active.size());
  std::vector<at::Tensor> outs(active.size());  // each active expert's weighted outputs, one per routed row
  const float* in = x.data_ptr<float>();
  const auto experts_from = [&](int64_t a0, int64_t a1) {
    for (int64_t a = a0; a < a1; ++a) {
      const std::vector<int64_t>& routed = pairs[active[a]];
      const int64_t n = static_cast<int64_t>(routed.size());
      at::Tensor gathered = cpu_empty({n, hidden}, x.options());
      for (int64_t j = 0; j < n; ++j) {
        std::memcpy(gathered.data_ptr<float>() + j * hidden, in + routed[j] / k * hidden, hidden * sizeof(float));
      }
      at::Tensor y = linear(downs[active[a]], silu_mul(linear(gate_ups[active[a]], gathered, c10::nullopt)),
                            c10::nullopt);
      TORCH_CHECK(y.size(1) == hidden, "expert ", active[a], " gives ", y.size(1), " outputs for ", hidden, " inputs");
      float* row = y.data_ptr<float>();
      for (int64_t j = 0; j < n; ++j, row += hidden) {
        for (int64_t c = 0; c < hidden; ++c) row[c] *= scale[routed[j]];
      }
      outs[a] = y;
    }
  };
  if (touched >= at::get_num_threads()) {
    at::parallel_for(0, touched, 1, experts_from);
  } else {
    experts_from(0, touched);  // not from parallel_for, whose one task would hold every linear to one thread
  }
  at::Tensor out = at::zeros_like(x);
  float* sum = out.data_ptr<float>();
  for (int64_t a = 0; a < touched; ++a) {  // in a pass of its own: a product and its sum, each rounded (no FMA)
    const std::vector<int64_t>& routed = pairs[active[a]];
    const float* y = outs[a].data_ptr<float>();
    for (size_t j = 0; j < routed.size(); ++j, y += hidden) {
      float* o = sum + routed[j] / k * hidden;
      for (int64_t c = 0; c < hidden; ++c) o[c] += y[c];
    }
  }
  return out;
}
