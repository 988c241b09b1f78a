"""int8 weight-only linears: quantization round trip, the kernel against a float matmul, the model end to end."""

import pytest
import torch

from rooftop import InvalidRequestError, SamplingParams
from rooftop.quant.linear import FloatLinear, Int8Linear, make_linear, quantize_int8


def test_int8_round_trip_is_within_half_a_step():
    w = torch.randn(64, 256, generator=torch.Generator().manual_seed(0)) * torch.linspace(0.01, 3, 64)[:, None]
    q, scales = quantize_int8(w)
    assert q.dtype == torch.int8 and scales.dtype == torch.bfloat16 and scales.shape == (64,)
    assert int(q.abs().max()) <= 127
    assert (q.float() * scales.float()[:, None] - w).abs().le(scales.float()[:, None] * 0.5 + 1e-6).all()


def test_int8_linear_matches_the_float_matmul():
    gen = torch.Generator().manual_seed(1)
    w, b = torch.randn(96, 128, generator=gen), torch.randn(96, generator=gen)
    x = torch.randn(5, 128, generator=gen)
    ref = torch.nn.functional.linear(x, w, b)
    lin = make_linear(w, b, "int8")
    assert isinstance(lin, Int8Linear) and lin.nbytes == 96 * 128 + 96 * 2
    out = lin(x)
    assert out.dtype == torch.float32 and out.shape == (5, 96)
    assert float((out - ref).norm() / ref.norm()) < 0.02  # int8 weights and bfloat16 activations
    assert isinstance(make_linear(w, b, "float"), FloatLinear)
    torch.testing.assert_close(lin(x[None]), out[None])  # leading dimensions pass through


def test_unknown_weight_format(tiny_gguf):
    from rooftop import LLM

    with pytest.raises(InvalidRequestError, match="weight format must be one of float, int8, int4; got 'int3'"):
        LLM(model=tiny_gguf, weights="int3")


def test_int8_model_keeps_no_float_copy_of_its_linears(tiny_gguf):
    from rooftop import LLM

    llm = LLM(model=tiny_gguf, weights="int8")
    layer = llm.model.layers[0]
    for lin in (layer.qkv, layer.o, layer.gate_up, layer.down, llm.model.lm_head):
        assert isinstance(lin, Int8Linear) and lin.qweight.dtype == torch.int8
    assert llm.precision.weights.name == "int8" and llm.precision.activation_bytes == 4


@pytest.mark.slow
def test_int8_bundled_model_agrees_with_float32(bundled_llm):
    """Measured with benchmarks/accuracy.py: 95.9% teacher-forced top-1 agreement, mean |error| 4% of the logits' std."""
    from rooftop import LLM

    int8 = LLM(weights="int8")
    prompt = bundled_llm.apply_chat_template([{"role": "user", "content": "What is the weather in Lagos?"}])
    ref = bundled_llm.generate(prompt, SamplingParams(max_tokens=48, temperature=0, ignore_eos=True))[0]
    ids = torch.tensor(ref.prompt_token_ids + ref.token_ids)
    from rooftop.engine.kv_cache import KVCache

    logits = {}
    for name, llm in (("float", bundled_llm), ("int8", int8)):
        with torch.inference_mode():
            logits[name] = llm.model.logits(llm.model.forward(ids, KVCache(llm.config, len(ids), torch.float32, "cpu"), 0))
    start = len(ref.prompt_token_ids) - 1
    a, b = logits["int8"][start:-1], logits["float"][start:-1]
    assert float((a.argmax(-1) == b.argmax(-1)).float().mean()) >= 0.9
    assert float((a - b).abs().mean() / b.std()) < 0.08
    own = int8.generate(prompt, SamplingParams(max_tokens=16, temperature=0, ignore_eos=True))[0]
    assert own.token_ids[:12] == ref.token_ids[:12]  # the first divergence measured is at token 28


def test_gguf_q4_blocks_become_int4_exactly():
    """Q4_1's d·q + m is (q - 8)·d + (m + 8d): the same values, before the kernel rounds s and z to bfloat16."""
    import gguf
    import numpy as np

    from rooftop.loading.gguf import int4_weight
    from rooftop.loading.gguf_file import TensorInfo

    data = np.random.default_rng(0).normal(size=(16, 64)).astype(np.float32)
    for qtype in (gguf.GGMLQuantizationType.Q4_1, gguf.GGMLQuantizationType.Q4_0):
        raw = gguf.quants.quantize(data, qtype)
        w = int4_weight(TensorInfo("t", (16, 64), qtype, raw.reshape(-1)))
        expected = torch.from_numpy(gguf.quants.dequantize(raw, qtype))
        torch.testing.assert_close(w.dequantize(), expected, atol=1e-6, rtol=1e-6)
        assert w.q.dtype == torch.uint8 and int(w.q.max()) <= 15


def test_int4_linear_matches_its_dequantized_matmul():
    import gguf
    import numpy as np

    from rooftop.loading.gguf import int4_weight
    from rooftop.loading.gguf_file import TensorInfo
    from rooftop.quant.linear import Int4Linear

    raw = gguf.quants.quantize(np.random.default_rng(1).normal(size=(96, 128)).astype(np.float32), gguf.GGMLQuantizationType.Q4_1)
    w = int4_weight(TensorInfo("t", (96, 128), gguf.GGMLQuantizationType.Q4_1, raw.reshape(-1)))
    lin = Int4Linear.from_weight(w, None)
    x = torch.randn(3, 128, generator=torch.Generator().manual_seed(2))
    ref = x @ w.dequantize().t()
    assert float((lin(x) - ref).norm() / ref.norm()) < 0.01  # bfloat16 activations, scales and zeros
    assert lin.nbytes == 96 * 64 + (128 // 32) * 96 * 2 * 2


@pytest.mark.slow
def test_int4_from_the_bundled_gguf_keeps_its_4_bits_and_agrees(bundled_llm):
    """Measured with benchmarks/accuracy.py: 99.1% teacher-forced top-1 agreement with float32."""
    from rooftop import LLM
    from rooftop.quant.linear import Int4Linear

    llm = LLM(weights="int4")
    layer = llm.model.layers[0]
    assert all(isinstance(lin, Int4Linear) for lin in (layer.qkv, layer.o, layer.gate_up, layer.down))
    assert isinstance(llm.model.lm_head, Int8Linear)  # the file holds it (the tied embedding) as Q8_0
    prompt = bundled_llm.apply_chat_template([{"role": "user", "content": "Write a haiku about the sea."}])
    ref = bundled_llm.generate(prompt, SamplingParams(max_tokens=24, temperature=0, ignore_eos=True))[0]
    own = llm.generate(prompt, SamplingParams(max_tokens=24, temperature=0, ignore_eos=True))[0]
    assert own.token_ids == ref.token_ids
