// The kernels' entry points, for the module's bindings (cpu.cpp) and for the decode step run in one call
// (decode.cpp), which calls them as Python does.

#pragma once

#include <ATen/core/Tensor.h>

#include <tuple>
#include <utility>
#include <vector>

// RMSNorm, RoPE (after Qwen3's per-head norm where given) and SiLU-mul of float32 rows (cpu.cpp).
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);
void rope_(at::Tensor& qkv, int64_t heads, int64_t head_dim, const at::Tensor& positions, const at::Tensor& cos,
           const at::Tensor& signed_sin, const c10::optional<at::Tensor>& norm, double eps);
at::Tensor silu_mul(const at::Tensor& gate_up);
// Each row's top k of softmax(logits) and their experts (an MoE router's), renormalized where asked (cpu.cpp).
std::tuple<at::Tensor, at::Tensor> route_rows(const at::Tensor& logits, int64_t top_k, bool normalize);
// One head of `dim` values in place: RMSNorm with `norm` (none: skipped), then rotate-half RoPE on its first `rotary`
// values with the position's rows of the tables; `scratch` holds `dim` floats.
void norm_rope_head(float* v, int64_t dim, const float* norm, float eps, const float* cos, const float* signed_sin,
                    int64_t rotary, float* scratch);
// positions (rows,) int64 inside the tables; cos and signed_sin float32 (positions, rotary), rotary even, <= head_dim.
void check_rope_tables(const at::Tensor& positions, int64_t rows, const at::Tensor& cos, const at::Tensor& signed_sin,
                       int64_t head_dim);

// Each of `rows` decodes' slot, length and blocks within a pool of `pool_slots` slots (attention.cpp).
void check_decode_rows(int64_t rows, int64_t pool_slots, const at::Tensor& slot_mapping, const at::Tensor& tables,
                       const at::Tensor& lengths, int64_t block_size);
// Each of `rows` state slots inside a pool of `pool` slots, none given twice (delta_rule.cpp).
void check_slots(const at::Tensor& slots, int64_t rows, int64_t pool);

// Decode attention over the paged KV pool, float32, bfloat16, float16, int8 or fp8 e4m3 (attention.cpp).
at::Tensor decode_attention(const at::Tensor& qkv, at::Tensor& k_pool, at::Tensor& v_pool, const at::Tensor& slot_mapping,
                            const at::Tensor& tables, const at::Tensor& lengths, int64_t block_size, int64_t heads,
                            int64_t kv_heads, double scale, const c10::optional<at::Tensor>& k_scale,
                            const c10::optional<at::Tensor>& v_scale);
// The same for a gated attention layer (Qwen3.5's), from its fused projection's rows: q and k normed and rotated
// (partial RoPE), attention, the output gate's sigmoid (attention.cpp).
at::Tensor gated_decode_attention(const at::Tensor& proj, const at::Tensor& q_norm, const at::Tensor& k_norm,
                                  const at::Tensor& positions, const at::Tensor& cos, const at::Tensor& signed_sin,
                                  double eps, at::Tensor& k_pool, at::Tensor& v_pool, const at::Tensor& slot_mapping,
                                  const at::Tensor& tables, const at::Tensor& lengths, int64_t block_size, int64_t heads,
                                  int64_t kv_heads, double scale, const c10::optional<at::Tensor>& k_scale,
                                  const c10::optional<at::Tensor>& v_scale);

// The gated delta rule's decode step, each sequence's state updated in place in the layer's pool (delta_rule.cpp).
at::Tensor delta_rule_decode(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& g,
                             const at::Tensor& beta, at::Tensor& states, const at::Tensor& slots);

// A Gated DeltaNet layer's decodes from its fused projection's rows to what its out_proj takes: the gates, the
// convolution (its inputs kept in place at each slot), SiLU, q and k normalized per key head, the rule, the gated
// RMSNorm (delta_rule.cpp).
at::Tensor delta_net_decode(const at::Tensor& proj, const at::Tensor& conv, at::Tensor& conv_states,
                            const at::Tensor& neg_a, const at::Tensor& dt_bias, const at::Tensor& norm, double eps,
                            at::Tensor& states, const at::Tensor& slots, int64_t key_heads, bool tiled);

// Prefill attention of one sequence's chunk over its cached and new keys, causal (prefill_attention.cpp).
at::Tensor prefill_attention(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values, int64_t cached,
                             double scale);

// GGUF's block formats in tiles of 16 output rows (tiles.cpp).
at::Tensor tiled_linear(const at::Tensor& x, const at::Tensor& q, const at::Tensor& dm, int64_t format, int64_t n,
                        const c10::optional<at::Tensor>& bias, const c10::optional<at::Tensor>& residual,
                        bool super_blocks);
at::Tensor tiled_dequantize(const at::Tensor& q, const at::Tensor& dm, int64_t format, int64_t n, bool bf16);
at::Tensor tiled_rows(const at::Tensor& q, const at::Tensor& dm, int64_t format, int64_t n, const at::Tensor& ids);
int64_t stream_read(const at::Tensor& data, int64_t streams);

// A GGUF block-format matrix repacked in tiles at load, and the shapes it fills (repack.cpp).
void tile_blocks(const std::vector<at::Tensor>& parts, const c10::optional<at::Tensor>& order, int64_t format, int64_t k,
                 at::Tensor& q, at::Tensor& dm);
std::pair<std::vector<int64_t>, std::vector<int64_t>> tiled_shapes(int64_t format, int64_t n, int64_t k);

// bfloat16 or float32 weights, float32 activations, in one fixed order (bf16.cpp).
at::Tensor bf16_linear(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& bias,
                       const c10::optional<at::Tensor>& residual, bool loops);
at::Tensor f32_linear(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& bias,
                      const c10::optional<at::Tensor>& residual, bool loops);

// One linear's weights: tiled (q, dm, format, output features, bias) as tiled_linear takes them, or bfloat16 (the
// weight, no dm, format -1, output features, bias) as bf16_linear does.
using LinearPart = std::tuple<at::Tensor, c10::optional<at::Tensor>, int64_t, int64_t, c10::optional<at::Tensor>>;

// An MoE layer's experts whose linears are all tiled or bfloat16, each its gate-up's and its down's parts, for rows
// routed to them without widening (decode.cpp).
struct RowExperts {
  std::vector<std::vector<LinearPart>> gate_ups, downs;  // per expert

  at::Tensor rows(const at::Tensor& x, const at::Tensor& experts, const at::Tensor& weights, int64_t& touched) const;
};

// A gated attention layer's own tensors (Qwen3.5's; models/hybrid.py's GatedAttentionBlock), as
// gated_decode_attention takes them.
struct GatedLayer {
  at::Tensor q_norm, k_norm, cos, signed_sin;  // (head_dim,) each; the partial rotary tables (positions, rotary dims)
};

// A Gated DeltaNet layer's own tensors and shapes (models/hybrid.py's DeltaNetBlock), as delta_net_decode takes
// them; `index` is its place among the model's linear-attention layers, in the state pools.
struct DeltaNetLayer {
  at::Tensor conv, neg_a, dt_bias, norm;
  int64_t key_heads, index;
  bool tiled;
};

// A model's decoder layers whose linears are all tiled or bfloat16, their MLP half dense or a mixture of experts
// (Qwen3-MoE), or a hybrid's (Qwen3.5: gated attention and Gated DeltaNet layers, dense MLPs), run for a step of
// decodes in one call (decode.cpp).
struct DecodeLayers {
  std::vector<std::vector<LinearPart>> linears;  // per layer: qkv, o, gate_up, down (none for an MoE), each of parts
  std::vector<at::Tensor> norms;  // per layer: attention's, then the MLP's; last, the model's final norm
  std::vector<c10::optional<at::Tensor>> qk_norms;  // per layer: Qwen3's q and k norms, or none
  at::Tensor cos, signed_sin;  // RoPE's tables
  int64_t heads, kv_heads, head_dim;
  double scale, eps;
  std::vector<c10::optional<at::Tensor>> routers;  // per layer: an MoE layer's float32 router, or none (dense)
  std::vector<c10::optional<RowExperts>> experts;  // per layer: an MoE layer's experts, or none
  int64_t top_k;  // experts per token
  bool normalize;  // the top k's weights renormalized to sum to 1 (norm_topk_prob)
  std::vector<c10::optional<GatedLayer>> gated;  // per layer: a gated attention layer's, or none
  std::vector<c10::optional<DeltaNetLayer>> delta_nets;  // per layer: a Gated DeltaNet layer's, or none
  // per layer: Qwen3-Next's shared expert's gate (1, hidden) float32, the expert's gate-up and down being the
  // layer's MLP linears; or none
  std::vector<c10::optional<at::Tensor>> shared_gates;

  // The pools: K and V (and their scales) per attention layer, in order; a hybrid's state pools (conv_states:
  // (linear layers, slots, channels, K - 1); states: (linear layers, slots, heads, key dim, value dim)) and each
  // row's slot in them.
  at::Tensor run(at::Tensor x, const at::Tensor& positions, const at::Tensor& slot_mapping, const at::Tensor& tables,
                 const at::Tensor& lengths, int64_t block_size, std::vector<at::Tensor> k_pools,
                 std::vector<at::Tensor> v_pools, const std::vector<c10::optional<at::Tensor>>& k_scales,
                 const std::vector<c10::optional<at::Tensor>>& v_scales, const c10::optional<at::Tensor>& seconds,
                 const c10::optional<at::Tensor>& touched, c10::optional<at::Tensor> conv_states,
                 c10::optional<at::Tensor> states, const c10::optional<at::Tensor>& state_slots) const;
};
