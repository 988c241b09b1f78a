// A step of decodes through a dense model's decoder layers in one call (models/decode_call.py). Python runs a layer
// as some ten kernel calls, and after each linear's weights have streamed through the caches the interpreter's code
// and objects between the calls come back from memory cold; here the same kernels run in the same order with the
// same arguments (models/blocks.py on models/ops.py's KernelOps), so every row's result is the same bits either way.
// Given `seconds`, each call's time is added to its op class there, as the calibration's op timer (engine/calibrate.py)
// adds the calls Python makes: the linears, attention (RoPE with it, as KernelOps.attention runs it), elementwise.

#include <chrono>

#include "kernels.h"

namespace {

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

}  // namespace

at::Tensor DecodeLayers::run(at::Tensor x, const at::Tensor& positions, const at::Tensor& slot_mapping,
                             const at::Tensor& tables, const at::Tensor& lengths, int64_t block_size,
                             std::vector<at::Tensor> k_pools, std::vector<at::Tensor> v_pools,
                             const std::vector<c10::optional<at::Tensor>>& k_scales,
                             const std::vector<c10::optional<at::Tensor>>& v_scales,
                             const c10::optional<at::Tensor>& seconds) const {
  const size_t layers = qk_norms.size();
  TORCH_CHECK(linears.size() == 4 * layers && norms.size() == 2 * layers + 1, "four linears and two norms per layer");
  TORCH_CHECK(k_pools.size() == layers && v_pools.size() == layers && k_scales.size() == layers &&
                  v_scales.size() == layers,
              "a K and a V pool (and their scales, or none) per layer");
  TORCH_CHECK(!seconds || (seconds->scalar_type() == at::kDouble && seconds->numel() == 3 && seconds->is_contiguous()),
              "seconds must be 3 contiguous float64: linears, attention, elementwise");
  double* clock = seconds ? seconds->data_ptr<double>() : nullptr;
  const auto linear = [&](const TiledWeights& w, const at::Tensor& in, const c10::optional<at::Tensor>& residual) {
    const auto& [q, dm, format, n, bias] = w;
    return timed(clock, LINEARS, [&] { return tiled_linear(in, q, dm, format, n, bias, residual, false); });
  };
  const auto norm = [&](const at::Tensor& in, const at::Tensor& weight) {
    return timed(clock, ELEMENTWISE, [&] { return rms_norm(in, weight, eps); });
  };
  for (size_t l = 0; l < layers; ++l) {
    const TiledWeights* w = &linears[4 * l];
    at::Tensor qkv = linear(w[0], norm(x, norms[2 * l]), c10::nullopt);
    const at::Tensor attended = timed(clock, ATTENTION, [&] {
      rope_(qkv, heads + kv_heads, head_dim, positions, cos, signed_sin, qk_norms[l], eps);
      return decode_attention(qkv, k_pools[l], v_pools[l], slot_mapping, tables, lengths, block_size, heads, kv_heads,
                              scale, k_scales[l], v_scales[l]);
    });
    x = linear(w[1], attended, x);
    const at::Tensor gate_up = linear(w[2], norm(x, norms[2 * l + 1]), c10::nullopt);
    x = linear(w[3], timed(clock, ELEMENTWISE, [&] { return silu_mul(gate_up); }), x);
  }
  return norm(x, norms.back());
}
