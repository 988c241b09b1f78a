// A step of decodes through a dense model's decoder layers in one call (models/decode_call.py). Python runs a layer
// as some ten kernel calls, and after each linear's weights have streamed through the caches the interpreter's code
// and objects between the calls come back from memory cold; here the same kernels run in the same order with the
// same arguments (models/blocks.py on models/ops.py's KernelOps), so every row's result is the same bits either way.

#include "kernels.h"

at::Tensor DecodeLayers::run(at::Tensor x, const at::Tensor& positions, const at::Tensor& slot_mapping,
                             const at::Tensor& tables, const at::Tensor& lengths, int64_t block_size,
                             std::vector<at::Tensor> k_pools, std::vector<at::Tensor> v_pools,
                             const std::vector<c10::optional<at::Tensor>>& k_scales,
                             const std::vector<c10::optional<at::Tensor>>& v_scales) const {
  const size_t layers = qk_norms.size();
  TORCH_CHECK(linears.size() == 4 * layers && norms.size() == 2 * layers + 1, "four linears and two norms per layer");
  TORCH_CHECK(k_pools.size() == layers && v_pools.size() == layers && k_scales.size() == layers &&
                  v_scales.size() == layers,
              "a K and a V pool (and their scales, or none) per layer");
  const auto linear = [](const TiledWeights& w, const at::Tensor& in, const c10::optional<at::Tensor>& residual) {
    const auto& [q, dm, format, n, bias] = w;
    return tiled_linear(in, q, dm, format, n, bias, residual, false);
  };
  for (size_t l = 0; l < layers; ++l) {
    const TiledWeights* w = &linears[4 * l];
    at::Tensor qkv = linear(w[0], rms_norm(x, norms[2 * l], eps), c10::nullopt);
    rope_(qkv, heads + kv_heads, head_dim, positions, cos, signed_sin, qk_norms[l], eps);
    const at::Tensor attended = decode_attention(qkv, k_pools[l], v_pools[l], slot_mapping, tables, lengths, block_size,
                                                 heads, kv_heads, scale, k_scales[l], v_scales[l]);
    x = linear(w[1], attended, x);
    const at::Tensor gate_up = linear(w[2], rms_norm(x, norms[2 * l + 1], eps), c10::nullopt);
    x = linear(w[3], silu_mul(gate_up), x);
  }
  return rms_norm(x, norms.back(), eps);
}
