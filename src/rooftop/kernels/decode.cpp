// A step of decodes through a dense model's decoder layers in one call (models/decode_call.py). Python runs a layer
// as some ten kernel calls, and after each linear's weights have streamed through the caches the interpreter's code
// and objects between the calls come back from memory cold; here the same kernels run in the same order with the
// same arguments (models/blocks.py on models/ops.py's KernelOps), so every row's result is the same bits either way.
// Given `seconds`, each call's time is added to its op class there, as the calibration's op timer (engine/calibrate.py)
// adds the calls Python makes: the linears, attention (RoPE with it, as KernelOps.attention runs it), elementwise.

#include <ATen/EmptyTensor.h>
#include <ATen/ops/zeros_like.h>

#include <chrono>
#include <cstring>

#include "kernels.h"

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
  const auto project = [&](const std::vector<LinearPart>& parts, const at::Tensor& in,
                           const c10::optional<at::Tensor>& residual) {
    return timed(clock, LINEARS, [&] { return linear(parts, in, residual); });
  };
  const auto norm = [&](const at::Tensor& in, const at::Tensor& weight) {
    return timed(clock, ELEMENTWISE, [&] { return rms_norm(in, weight, eps); });
  };
  for (size_t l = 0; l < layers; ++l) {
    const std::vector<LinearPart>* w = &linears[4 * l];
    at::Tensor qkv = project(w[0], norm(x, norms[2 * l]), c10::nullopt);
    const at::Tensor attended = timed(clock, ATTENTION, [&] {
      rope_(qkv, heads + kv_heads, head_dim, positions, cos, signed_sin, qk_norms[l], eps);
      return decode_attention(qkv, k_pools[l], v_pools[l], slot_mapping, tables, lengths, block_size, heads, kv_heads,
                              scale, k_scales[l], v_scales[l]);
    });
    x = project(w[1], attended, x);
    const at::Tensor gate_up = project(w[2], norm(x, norms[2 * l + 1]), c10::nullopt);
    x = project(w[3], timed(clock, ELEMENTWISE, [&] { return silu_mul(gate_up); }), x);
  }
  return norm(x, norms.back());
}

// x (one row) through `experts` in the order given (ascending expert ids, as models/mlp.py's SparseMoE._one_row
// takes them): each expert's gate-up, SiLU-mul and down, its output times its routing weight added to the sum with
// PyTorch's own multiply and add, as Python's loop does them: the same bits, without a Python call per op.
at::Tensor RowExperts::run(const at::Tensor& x, const std::vector<int64_t>& experts, const at::Tensor& weights) const {
  TORCH_CHECK(weights.dim() == 1 && weights.size(0) == static_cast<int64_t>(experts.size()),
              "one routing weight per expert: ", experts.size(), " experts, weights of shape ", weights.sizes());
  at::Tensor out = at::zeros_like(x);
  for (size_t i = 0; i < experts.size(); ++i) {
    const int64_t e = experts[i];
    TORCH_CHECK(e >= 0 && e < static_cast<int64_t>(gate_ups.size()), "expert ", e, " of ", gate_ups.size());
    const at::Tensor y = linear(downs[e], silu_mul(linear(gate_ups[e], x, c10::nullopt)), c10::nullopt);
    out.add_(y.mul(weights.select(0, static_cast<int64_t>(i))));
  }
  return out;
}
