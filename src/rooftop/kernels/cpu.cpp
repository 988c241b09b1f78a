// rooftop's CPU kernels: the decode step's work in few calls, on float32 activations.
//
// Decode reads every weight once per token, so its time is the weight bytes and the overhead around them.
// The linears (tiles.cpp: GGUF's block formats, Q4_0 to Q6_K, in tiles of 16 output rows) dot the weights with the
// activations quantized to int8 per group of 32, as llama.cpp does: AVX2's maddubs (VNNI's dpbusd) multiplies
// byte pairs, so the nibbles are never widened to floats; bf16.cpp's takes bfloat16 weights against float32
// activations (a bf16 checkpoint's values at half float32's bytes). The small ops around them (RMSNorm, RoPE,
// SiLU-mul, and attention over the paged cache in attention.cpp) are one call each instead of a handful of PyTorch's.
// Compiled on first use by rooftop/kernels/cpu.py with -march=native; without AVX2 and F16C plain loops run.

#include <torch/csrc/utils/pybind.h>  // pybind11 with its tensor casters, for the module below (torch/extension.h: 25 s to parse)

#include "exp.h"
#include "kernels.h"

// weight * x / rms(x) per row, float32 (T, D).
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(), "x must be contiguous float32 (T, D)");
  const int64_t t = x.size(0), dim = x.size(1);
  TORCH_CHECK(weight.scalar_type() == at::kFloat && weight.numel() == dim && weight.is_contiguous(), "weight must be float32 (D,)");
  auto out = cpu_empty(x.sizes(), x.options());
  const float* in = x.data_ptr<float>();
  const float* w = weight.data_ptr<float>();
  float* o = out.data_ptr<float>();
  at::parallel_for(0, t, std::max<int64_t>(1, 16384 / dim), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* v = in + r * dim;
      float ss = 0.f;
#pragma omp simd reduction(+ : ss)
      for (int64_t i = 0; i < dim; ++i) ss += v[i] * v[i];
      const float inv = 1.f / std::sqrt(ss / dim + static_cast<float>(eps));
#pragma omp simd
      for (int64_t i = 0; i < dim; ++i) o[r * dim + i] = w[i] * (v[i] * inv);
    }
  });
  return out;
}

void norm_rope_head(float* v, int64_t dim, const float* norm, float eps, const float* cos, const float* signed_sin,
                    int64_t rotary, float* scratch) {
  std::memcpy(scratch, v, dim * sizeof(float));
  if (norm) {
    float ss = 0.f;
    for (int64_t j = 0; j < dim; ++j) ss += scratch[j] * scratch[j];
    const float inv = 1.f / std::sqrt(ss / dim + eps);
    for (int64_t j = 0; j < dim; ++j) scratch[j] = norm[j] * (scratch[j] * inv);
  }
  const int64_t half = rotary / 2;
  for (int64_t j = 0; j < rotary; ++j) v[j] = scratch[j] * cos[j] + scratch[(j + half) % rotary] * signed_sin[j];
  if (norm) std::memcpy(v + rotary, scratch + rotary, (dim - rotary) * sizeof(float));
}

void check_rope_tables(const at::Tensor& positions, int64_t rows, const at::Tensor& cos, const at::Tensor& signed_sin,
                       int64_t head_dim) {
  TORCH_CHECK(positions.scalar_type() == at::kLong && positions.is_contiguous() && positions.numel() == rows,
              "positions must be contiguous int64 (T,)");
  TORCH_CHECK(cos.scalar_type() == at::kFloat && signed_sin.scalar_type() == at::kFloat && cos.is_contiguous() &&
                  signed_sin.is_contiguous() && cos.dim() == 2 && cos.sizes() == signed_sin.sizes() &&
                  cos.size(1) <= head_dim && cos.size(1) % 2 == 0,
              "cos/sin tables must be float32 (positions, rotary dims), an even number of dims up to head_dim");
  const int64_t* pos = positions.data_ptr<int64_t>();
  for (int64_t r = 0; r < rows; ++r)
    TORCH_CHECK(pos[r] >= 0 && pos[r] < cos.size(0), "position ", pos[r], " is past the RoPE table");
}

// In place on the first `heads` heads of each row of qkv (T, ...): an optional per-head RMSNorm (Qwen3's q/k
// norm, weights (heads, D)), then rotate-half RoPE on the first rotary dims (the tables' width: head_dim but for
// partial rotary embeddings) at the row's position.
void rope_(at::Tensor& qkv, int64_t heads, int64_t head_dim, const at::Tensor& positions, const at::Tensor& cos,
           const at::Tensor& signed_sin, const c10::optional<at::Tensor>& norm, double eps) {
  TORCH_CHECK(qkv.dim() == 2 && qkv.scalar_type() == at::kFloat && qkv.is_contiguous(), "qkv must be contiguous float32 (T, W)");
  TORCH_CHECK(heads * head_dim <= qkv.size(1) && head_dim % 2 == 0, "heads * head_dim exceeds the row");
  check_rope_tables(positions, qkv.size(0), cos, signed_sin, head_dim);
  TORCH_CHECK(!norm || (norm->scalar_type() == at::kFloat && norm->is_contiguous() && norm->numel() == heads * head_dim),
              "norm must be float32 (heads, head_dim)");
  const int64_t t = qkv.size(0), width = qkv.size(1), rotary = cos.size(1);
  const int64_t* pos = positions.data_ptr<int64_t>();
  float* data = qkv.data_ptr<float>();
  const float* c = cos.data_ptr<float>();
  const float* s = signed_sin.data_ptr<float>();
  const float* nw = norm ? norm->data_ptr<float>() : nullptr;
  at::parallel_for(0, t * heads, std::max<int64_t>(1, 8192 / head_dim), [&](int64_t i0, int64_t i1) {
    std::vector<float> x(head_dim);
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t r = i / heads, h = i % heads;
      norm_rope_head(data + r * width + h * head_dim, head_dim, nw ? nw + h * head_dim : nullptr,
                     static_cast<float>(eps), c + pos[r] * rotary, s + pos[r] * rotary, rotary, x.data());
    }
  });
}

// silu(gate) * up for gate_up (T, 2F) -> (T, F).
at::Tensor silu_mul(const at::Tensor& gate_up) {
  TORCH_CHECK(gate_up.dim() == 2 && gate_up.scalar_type() == at::kFloat && gate_up.is_contiguous() && gate_up.size(1) % 2 == 0,
              "gate_up must be contiguous float32 (T, 2F)");
  const int64_t t = gate_up.size(0), f = gate_up.size(1) / 2;
  auto out = cpu_empty({t, f}, gate_up.options());
  const float* in = gate_up.data_ptr<float>();
  float* o = out.data_ptr<float>();
  at::parallel_for(0, t, std::max<int64_t>(1, 4096 / f), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* g = in + r * 2 * f;
      float* y = o + r * f;
      int64_t i = 0;
#ifdef ROOFTOP_AVX2
      for (; i + 8 <= f; i += 8) {
        const __m256 gate = _mm256_loadu_ps(g + i);
        const __m256 sig = _mm256_div_ps(gate, _mm256_add_ps(_mm256_set1_ps(1.f), exp_ps(_mm256_sub_ps(_mm256_setzero_ps(), gate))));
        _mm256_storeu_ps(y + i, _mm256_mul_ps(sig, _mm256_loadu_ps(g + f + i)));
      }
#endif
      for (; i < f; ++i) y[i] = g[i] / (1.f + std::exp(-g[i])) * g[f + i];
    }
  });
  return out;
}

// f(row, vocab) for each row of float32 logits (B, vocab), as a (B,) tensor of `dtype` (Out its C++ type).
template <typename Out, typename F>
at::Tensor per_logit_row(const at::Tensor& logits, at::ScalarType dtype, F f) {
  TORCH_CHECK(logits.dim() == 2 && logits.scalar_type() == at::kFloat && logits.is_contiguous() && logits.size(1) > 0,
              "logits must be contiguous float32 (B, vocab)");
  const int64_t b_count = logits.size(0), vocab = logits.size(1);
  auto out = cpu_empty({b_count}, logits.options().dtype(dtype));
  const float* in = logits.data_ptr<float>();
  Out* o = out.data_ptr<Out>();
  for (int64_t b = 0; b < b_count; ++b) o[b] = f(in + b * vocab, vocab);
  return out;
}

// The index of each row's largest value, as torch.argmax gives it (the first of equal maxima; a NaN is the
// largest, the first one): greedy decoding's pick. PyTorch's CPU argmax tracks an index per element; this finds
// the maximum with vector compares, then its first index, in two passes over the row.
at::Tensor argmax_rows(const at::Tensor& logits) {
  return per_logit_row<int64_t>(logits, at::kLong, [](const float* row, int64_t vocab) {
    float top = row[0];
    bool nan = false;
    int64_t i = 0;
#ifdef ROOFTOP_AVX2
    __m256 tops = _mm256_set1_ps(row[0]), unordered = _mm256_setzero_ps();
    for (; i + 8 <= vocab; i += 8) {
      const __m256 v = _mm256_loadu_ps(row + i);
      tops = _mm256_max_ps(tops, v);
      unordered = _mm256_or_ps(unordered, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    }
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, tops);
    for (float lane : lanes) top = std::max(top, lane);
    nan = _mm256_movemask_ps(unordered) != 0;
#endif
    for (; i < vocab; ++i) {
      nan = nan || std::isnan(row[i]);
      top = std::max(top, row[i]);
    }
    int64_t at = 0;
    if (nan) {
      while (!std::isnan(row[at])) ++at;
    } else {
      while (row[at] != top) ++at;
    }
    return at;
  });
}

// Whether each row holds only finite values (no NaN, no infinity), as torch.isfinite(logits).all(-1): the engine's
// check before it samples a row. One pass: PyTorch's isfinite is several elementwise ops, each a pass over the
// logits, and the sum it replaced also flagged finite rows whose sum overflowed.
at::Tensor finite_rows(const at::Tensor& logits) {
  return per_logit_row<bool>(logits, at::kBool, [](const float* row, int64_t vocab) {
    bool finite = true;
    int64_t i = 0;
#ifdef ROOFTOP_AVX2
    // x * 0 is 0 for every finite x, NaN for a NaN or an infinity
    __m256 zeros = _mm256_setzero_ps();
    for (; i + 8 <= vocab; i += 8) zeros = _mm256_or_ps(zeros, _mm256_mul_ps(_mm256_loadu_ps(row + i), _mm256_setzero_ps()));
    finite = _mm256_movemask_ps(_mm256_cmp_ps(zeros, _mm256_setzero_ps(), _CMP_NEQ_UQ)) == 0;
#endif
    for (; i < vocab; ++i) finite = finite && std::isfinite(row[i]);
    return finite;
  });
}

// Each row's top k of softmax(logits) (models/mlp.py's route: an MoE layer's experts): the k largest probabilities,
// largest first (the lower expert first among equals), and their experts; where `normalize`, the k divided by their
// sum (norm_topk_prob). One pass a row, where PyTorch's softmax, topk and division are three calls.
// Each row's numbers are its own, whatever rows share the call.
std::tuple<at::Tensor, at::Tensor> route_rows(const at::Tensor& logits, int64_t top_k, bool normalize) {
  TORCH_CHECK(logits.dim() == 2 && logits.scalar_type() == at::kFloat && logits.is_contiguous() && logits.device().is_cpu(),
              "logits must be contiguous float32 (rows, experts) on the CPU");
  const int64_t rows = logits.size(0), n = logits.size(1);
  TORCH_CHECK(top_k >= 1 && top_k <= n, "top_k must be 1 to the ", n, " experts, got ", top_k);
  auto weights = cpu_empty({rows, top_k}, logits.options());
  auto experts = cpu_empty({rows, top_k}, logits.options().dtype(at::kLong));
  const float* in = logits.data_ptr<float>();
  float* w = weights.data_ptr<float>();
  int64_t* ids = experts.data_ptr<int64_t>();
  at::parallel_for(0, rows, 16, [&](int64_t r0, int64_t r1) {
    std::vector<float> p(n);
    std::vector<char> taken(n);
    for (int64_t r = r0; r < r1; ++r) {
      const float* l = in + r * n;
      float top = l[0];
      for (int64_t e = 1; e < n; ++e) top = std::max(top, l[e]);
      float sum = 0.f;
      for (int64_t e = 0; e < n; ++e) sum += p[e] = std::exp(l[e] - top);
      for (int64_t e = 0; e < n; ++e) p[e] /= sum;
      std::fill(taken.begin(), taken.end(), 0);
      float chosen = 0.f;
      for (int64_t j = 0; j < top_k; ++j) {
        int64_t best = -1;
        for (int64_t e = 0; e < n; ++e)
          if (!taken[e] && (best < 0 || p[e] > p[best])) best = e;
        taken[best] = 1;
        w[r * top_k + j] = p[best], ids[r * top_k + j] = best;
        chosen += p[best];
      }
      if (normalize)
        for (int64_t j = 0; j < top_k; ++j) w[r * top_k + j] /= chosen;
    }
  });
  return {weights, experts};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("tiled_linear", &tiled_linear, "x @ tiled block-format weights^T (+bias) (+residual)", py::arg("x"),
        py::arg("q"), py::arg("dm"), py::arg("format"), py::arg("n"), py::arg("bias") = py::none(),
        py::arg("residual") = py::none(), py::arg("super_blocks") = false);
  m.def("tiled_dequantize", &tiled_dequantize, "tiled block-format weights -> float32 or bfloat16 (N, K)",
        py::arg("q"), py::arg("dm"), py::arg("format"), py::arg("n"), py::arg("bf16") = false);
  m.def("tiled_rows", &tiled_rows, "rows ids of tiled block-format weights as float32 (an embedding's lookup)",
        py::arg("q"), py::arg("dm"), py::arg("format"), py::arg("n"), py::arg("ids"));
  m.def("tile_blocks", &tile_blocks, "a GGUF block-format matrix's rows of blocks -> tiled q and dm, written in place",
        py::arg("parts"), py::arg("order"), py::arg("format"), py::arg("k"), py::arg("q"), py::arg("dm"));
  m.def("tiled_shapes", &tiled_shapes, "the shapes of q and dm for n rows of k inputs in a tiled format",
        py::arg("format"), py::arg("n"), py::arg("k"));
  m.def("bf16_linear", &bf16_linear, "x @ bfloat16 weights^T (+bias) (+residual), float32, in a fixed order",
        py::arg("x"), py::arg("w"), py::arg("bias") = py::none(), py::arg("residual") = py::none(),
        py::arg("loops") = false);
  m.def("f32_linear", &f32_linear, "x @ float32 weights^T (+bias) (+residual), in bf16_linear's fixed order",
        py::arg("x"), py::arg("w"), py::arg("bias") = py::none(), py::arg("residual") = py::none(),
        py::arg("loops") = false);
  m.def("delta_rule_decode", &delta_rule_decode,
        "the gated delta rule's decode step: outputs (rows, heads, value dim), states updated in place at slots",
        py::arg("q"), py::arg("k"), py::arg("v"), py::arg("g"), py::arg("beta"), py::arg("states"), py::arg("slots"));
  m.def("delta_net_decode", &delta_net_decode,
        "a Gated DeltaNet layer's decodes from its fused projection's rows: the gates, the convolution (its inputs "
        "kept in place at slots), SiLU, q and k normalized per key head, the rule, the gated RMSNorm; outputs "
        "(rows, heads * value dim)",
        py::arg("proj"), py::arg("conv"), py::arg("conv_states"), py::arg("neg_a"), py::arg("dt_bias"),
        py::arg("norm"), py::arg("eps"), py::arg("states"), py::arg("slots"), py::arg("key_heads"),
        py::arg("tiled") = false);
  m.def("stream_read", &stream_read, "the sum of a uint8 tensor's 64-bit words, read as the tiled linears read",
        py::arg("data"), py::arg("streams") = 1);
  // module_local: builds for other flags (the tests' portable and AVX2 ones, kernel_ab's) load beside this one
  py::class_<DecodeLayers>(m, "DecodeLayers", py::module_local(),
                           "a model's decoder layers whose linears are all tiled or bfloat16, for decode steps")
      .def(py::init([](std::vector<std::vector<LinearPart>> linears, std::vector<at::Tensor> norms,
                       std::vector<c10::optional<at::Tensor>> qk_norms, at::Tensor cos, at::Tensor signed_sin,
                       int64_t heads, int64_t kv_heads, int64_t head_dim, double scale, double eps,
                       std::vector<c10::optional<at::Tensor>> routers, std::vector<c10::optional<RowExperts>> experts,
                       int64_t top_k, bool normalize, std::vector<c10::optional<GatedLayer>> gated,
                       std::vector<c10::optional<DeltaNetLayer>> delta_nets,
                       std::vector<c10::optional<at::Tensor>> shared_gates) {
             return DecodeLayers{linears, norms,   qk_norms, cos,   signed_sin, heads,     kv_heads,   head_dim, scale,
                                 eps,     routers, experts,  top_k, normalize,  gated,     delta_nets, shared_gates};
           }),
           py::arg("linears"), py::arg("norms"), py::arg("qk_norms"), py::arg("cos"), py::arg("signed_sin"),
           py::arg("heads"), py::arg("kv_heads"), py::arg("head_dim"), py::arg("scale"), py::arg("eps"),
           py::arg("routers"), py::arg("experts"), py::arg("top_k"), py::arg("normalize"), py::arg("gated"),
           py::arg("delta_nets"), py::arg("shared_gates"))
      // without the GIL: a step's kernels touch no Python object, and a server's event loop runs meanwhile
      .def("run", &DecodeLayers::run, "a step of decodes through every layer and the final norm",
           py::call_guard<py::gil_scoped_release>(), py::arg("x"),
           py::arg("positions"), py::arg("slot_mapping"), py::arg("tables"), py::arg("lengths"), py::arg("block_size"),
           py::arg("k_pools"), py::arg("v_pools"), py::arg("k_scales"), py::arg("v_scales"),
           py::arg("seconds") = py::none(), py::arg("touched") = py::none(), py::arg("conv_states") = py::none(),
           py::arg("states") = py::none(), py::arg("state_slots") = py::none());
  py::class_<GatedLayer>(m, "GatedLayer", py::module_local(), "a gated attention layer's norms and rotary tables")
      .def(py::init([](at::Tensor q_norm, at::Tensor k_norm, at::Tensor cos, at::Tensor signed_sin) {
             return GatedLayer{q_norm, k_norm, cos, signed_sin};
           }),
           py::arg("q_norm"), py::arg("k_norm"), py::arg("cos"), py::arg("signed_sin"));
  py::class_<DeltaNetLayer>(m, "DeltaNetLayer", py::module_local(),
                            "a Gated DeltaNet layer's convolution, gates' and norm's tensors and its shapes")
      .def(py::init([](at::Tensor conv, at::Tensor neg_a, at::Tensor dt_bias, at::Tensor norm, int64_t key_heads,
                       int64_t index, bool tiled) {
             return DeltaNetLayer{conv, neg_a, dt_bias, norm, key_heads, index, tiled};
           }),
           py::arg("conv"), py::arg("neg_a"), py::arg("dt_bias"), py::arg("norm"), py::arg("key_heads"),
           py::arg("index"), py::arg("tiled"));
  py::class_<RowExperts>(m, "RowExperts", py::module_local(),
                         "an MoE layer's experts whose linears are all tiled or bfloat16, for rows not widened")
      .def(py::init([](std::vector<std::vector<LinearPart>> gate_ups, std::vector<std::vector<LinearPart>> downs) {
             return RowExperts{gate_ups, downs};
           }),
           py::arg("gate_ups"), py::arg("downs"))
      .def(
          "rows",
          [](const RowExperts& self, const at::Tensor& x, const at::Tensor& experts, const at::Tensor& weights) {
            int64_t touched = 0;
            at::Tensor out = self.rows(x, experts, weights, touched);
            return std::make_tuple(out, touched);
          },
          "rows' weighted sums over their experts (rows, k) and the distinct experts run",
          py::call_guard<py::gil_scoped_release>(), py::arg("x"), py::arg("experts"), py::arg("weights"));
  m.def("rms_norm", &rms_norm, "RMSNorm of float32 rows");
  m.def("argmax_rows", &argmax_rows, "torch.argmax(logits, -1) for float32 rows");
  m.def("finite_rows", &finite_rows, "torch.isfinite(logits).all(-1) for float32 rows");
  m.def("rope_", &rope_, "optional per-head RMSNorm, then RoPE, in place", py::arg("qkv"), py::arg("heads"),
        py::arg("head_dim"), py::arg("positions"), py::arg("cos"), py::arg("signed_sin"), py::arg("norm") = py::none(),
        py::arg("eps") = 1e-6);
  m.def("silu_mul", &silu_mul, "silu(gate) * up");
  m.def("route_rows", &route_rows, "each row's top k of softmax(logits) and their experts, renormalized if asked",
        py::arg("logits"), py::arg("top_k"), py::arg("normalize"));
  m.def("decode_attention", &decode_attention,
        "decode attention over the paged KV pool: float32, bfloat16, float16, or int8 / fp8 e4m3 with a scale per "
        "(slot, KV head)",
        py::arg("qkv"), py::arg("k_pool"), py::arg("v_pool"), py::arg("slot_mapping"), py::arg("tables"),
        py::arg("lengths"), py::arg("block_size"), py::arg("heads"), py::arg("kv_heads"), py::arg("scale"),
        py::arg("k_scale") = py::none(), py::arg("v_scale") = py::none());
  m.def("gated_decode_attention", &gated_decode_attention,
        "a gated attention layer's decodes from its fused projection's rows: q and k normed and rotated, attention "
        "over the paged KV pool as decode_attention's, the output times sigmoid(gate)",
        py::arg("proj"), py::arg("q_norm"), py::arg("k_norm"), py::arg("positions"), py::arg("cos"),
        py::arg("signed_sin"), py::arg("eps"), py::arg("k_pool"), py::arg("v_pool"), py::arg("slot_mapping"),
        py::arg("tables"), py::arg("lengths"), py::arg("block_size"), py::arg("heads"), py::arg("kv_heads"),
        py::arg("scale"), py::arg("k_scale") = py::none(), py::arg("v_scale") = py::none());
  m.def("prefill_attention", &prefill_attention,
        "causal attention of a chunk's queries (n, heads, dim) over its sequence's cached + n keys and values",
        py::arg("q"), py::arg("keys"), py::arg("values"), py::arg("cached"), py::arg("scale"));
}
