"""The quantized KV cache (--kv-cache-dtype): int8 values with a float32 scale per (slot, KV head), quantized as
each token is written; the C++ decode kernel and the PyTorch path read them as stored; capacity follows the
stored width; bad values are refused."""

import pytest
import torch
from test_batch_invariance import assert_same, prompt, run
from test_cli import assert_user_error, rooftop_in_process

from rooftop import LLM, SamplingParams
from rooftop.config import EngineConfig, ModelConfig
from rooftop.enums import Phase
from rooftop.errors import InvalidRequestError
from rooftop.kernels import cpu
from rooftop.models.attention import paged_attention
from rooftop.models.kv_cache import AttentionSeq, KVPool, build_metadata, dequantize_int8, quantize_int8

kernels = cpu.ops()
HEADS, KV_HEADS, DIM, BLOCK = 9, 3, 32, 4
CONFIG = ModelConfig("llama", 8, HEADS * DIM, 8, 1, HEADS, KV_HEADS, DIM, 64)


def test_int8_round_trip_is_within_half_a_scale_per_element():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(37, 3, 64, generator=gen) * torch.rand(37, 3, 1, generator=gen) * 10
    x[0, 1] = 0  # an all-zero row: scale 0, values 0
    q, scale = quantize_int8(x)
    assert q.dtype == torch.int8 and scale.dtype == torch.float32 and scale.shape == x.shape[:-1]
    torch.testing.assert_close(scale, x.abs().amax(-1) / 127)
    reference = torch.round(x / scale.clamp_min(1e-30)[..., None]).clamp(-127, 127)
    assert torch.equal(q[scale > 0].float(), reference[scale > 0])
    error = (dequantize_int8(q, scale) - x).abs()
    assert bool((error <= scale[..., None] / 2 * (1 + 1e-5) + 1e-7).all())
    assert not dequantize_int8(q, scale)[0, 1].any()
    assert dequantize_int8(q, scale, torch.bfloat16).dtype == torch.bfloat16


def scattered_pools(count: int) -> list[KVPool]:
    pools = []
    for _ in range(count):
        pool = KVPool(CONFIG, 16, BLOCK, torch.int8, torch.device("cpu"))
        torch.manual_seed(2)
        pool.k_layers[0].index_copy_(0, torch.arange(64), torch.randn(64, KV_HEADS, DIM))
        pool.v_layers[0].index_copy_(0, torch.arange(64), torch.randn(64, KV_HEADS, DIM))
        pools.append(pool)
    return pools


def decode_step():
    seqs = [
        AttentionSeq(table, cached, 1, Phase.DECODE)
        for table, cached in (([9, 2, 14], 10), ([5], 2), ([0, 11, 3, 7], 14))  # odd lengths 11, 3, 15
    ]
    meta = build_metadata(seqs, BLOCK, torch.device("cpu"))
    qkv = torch.randn(3, (HEADS + 2 * KV_HEADS) * DIM, generator=torch.Generator().manual_seed(3))
    return meta, qkv


def float_reference(pool: KVPool, meta, qkv) -> torch.Tensor:
    """Attention on the dequantized pool, the step's new K/V quantized into it first (as the int8 pool stores)."""
    q, k, v = qkv.view(3, -1, DIM).split([HEADS, KV_HEADS, KV_HEADS], dim=1)
    kf, vf = dequantize_int8(pool.k[0], pool.k_scale[0]), dequantize_int8(pool.v[0], pool.v_scale[0])
    k, v = dequantize_int8(*quantize_int8(k)), dequantize_int8(*quantize_int8(v))
    return paged_attention(q, k, v, kf, vf, meta).reshape(3, -1)


def test_the_pytorch_path_on_an_int8_pool_is_attention_on_the_dequantized_pool():
    (pool,) = scattered_pools(1)
    meta, qkv = decode_step()
    expected = float_reference(pool, meta, qkv)
    q, k, v = qkv.view(3, -1, DIM).split([HEADS, KV_HEADS, KV_HEADS], dim=1)
    got = paged_attention(q, k, v, pool.k_layers[0], pool.v_layers[0], meta).reshape(3, -1)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(kernels is None, reason="rooftop's CPU kernels did not build on this machine")
def test_the_kernel_on_an_int8_pool_is_attention_on_the_dequantized_pool():
    kernel_pool, torch_pool = scattered_pools(2)
    meta, qkv = decode_step()
    expected = float_reference(torch_pool, meta, qkv)
    q, k, v = qkv.view(3, -1, DIM).split([HEADS, KV_HEADS, KV_HEADS], dim=1)
    paged_attention(q, k, v, torch_pool.k_layers[0], torch_pool.v_layers[0], meta)  # writes the new K/V
    kp, vp = kernel_pool.k_layers[0], kernel_pool.v_layers[0]
    args = (meta.slot_mapping, meta.decode_tables, meta.decode_lengths, BLOCK, HEADS, KV_HEADS, DIM**-0.5)
    got = kernels.decode_attention_q8(qkv, kp.values, kp.scale, vp.values, vp.scale, *args)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    # the kernel quantizes the new K/V into their slots exactly as the PyTorch write does
    assert torch.equal(kernel_pool.k, torch_pool.k) and torch.equal(kernel_pool.v, torch_pool.v)
    assert torch.equal(kernel_pool.k_scale, torch_pool.k_scale) and torch.equal(kernel_pool.v_scale, torch_pool.v_scale)


def test_the_same_bytes_hold_more_int8_tokens_by_the_stored_width():
    """int8: hd bytes and a 4-byte scale per head, against 4 * hd for float32."""
    fp32, int8 = (KVPool.bytes_per_block(CONFIG, 16, d) // 16 for d in (torch.float32, torch.int8))
    heads = 2 * CONFIG.num_full_attention_layers * CONFIG.num_kv_heads
    assert fp32 == heads * 4 * DIM and int8 == heads * (DIM + 4)
    pool = KVPool(CONFIG, 10, 16, torch.int8, torch.device("cpu"))
    assert pool.nbytes == 10 * KVPool.bytes_per_block(CONFIG, 16, torch.int8)


def test_an_int8_engine_holds_more_tokens_in_the_same_bytes_and_says_its_dtype(bundled_llm):
    from rooftop.engine.llm_engine import LLMEngine

    c = bundled_llm.model.config
    budget = 1 << 26
    engines = {
        name: LLMEngine(
            bundled_llm.model, bundled_llm.tokenizer, EngineConfig(kv_cache_bytes=budget, kv_cache_dtype=name)
        )
        for name in ("auto", "int8")
    }
    tokens = {name: eng.kv_cache_tokens for name, eng in engines.items()}
    per_token = 2 * c.num_full_attention_layers * c.num_kv_heads  # heads of K and V per token
    assert tokens["auto"] == budget // (16 * per_token * 4 * c.head_dim) * 16
    assert tokens["int8"] == budget // (16 * per_token * (c.head_dim + 4)) * 16
    assert tokens["int8"] / tokens["auto"] == pytest.approx(4 * c.head_dim / (c.head_dim + 4), rel=0.02)
    assert engines["int8"].stats().kv_cache_dtype == "int8"
    assert engines["auto"].stats().kv_cache_dtype == "float32"


@pytest.mark.parametrize("kv", ["int8", "bfloat16", "float16"])
def test_batched_greedy_with_quantized_kv_is_what_each_gets_alone(bundled_llm, kv):
    from rooftop.engine.llm_engine import LLMEngine

    llm = bundled_llm
    greedy = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logprobs=1)
    reqs = [(f"r{i}", prompt(i, n), greedy) for i, n in enumerate([3, 17, 40])]
    config = dict(num_kv_blocks=64, kv_cache_dtype=kv)
    model, tok = llm.model, llm.tokenizer
    batched_engine = LLMEngine(model, tok, EngineConfig(max_num_batched_tokens=64, **config))
    assert batched_engine.kv_cache_dtype == kv
    batched = run(batched_engine, reqs)
    alone = {}
    for r in reqs:
        alone |= run(LLMEngine(model, tok, EngineConfig(enable_prefix_caching=False, **config)), [r])
    assert_same(batched, alone)


def test_bad_kv_cache_dtypes_are_refused_with_the_valid_ones():
    with pytest.raises(InvalidRequestError, match="auto, float32, bfloat16, float16, int8, fp8_e4m3"):
        EngineConfig(kv_cache_dtype="x")
    with pytest.raises(InvalidRequestError, match="fp8_e4m3 is not supported yet"):
        EngineConfig(kv_cache_dtype="fp8_e4m3")
    with pytest.raises(InvalidRequestError, match="kv_cache_dtype"):
        LLM(kv_cache_dtype="x")


def test_a_float_kv_dtype_other_than_the_models_is_stored_as_named(bundled_llm):
    from rooftop.engine.llm_engine import LLMEngine

    eng = LLMEngine(bundled_llm.model, bundled_llm.tokenizer, EngineConfig(num_kv_blocks=4, kv_cache_dtype="float16"))
    assert eng.kv_cache_dtype == "float16" and eng.stats().kv_cache_bytes == 4 * KVPool.bytes_per_block(
        bundled_llm.model.config, 16, torch.float16
    )
    pool = KVPool(CONFIG, 4, BLOCK, torch.bfloat16, torch.device("cpu"))  # activations float32
    x = torch.randn(5, KV_HEADS, DIM)
    pool.k_layers[0].index_copy_(0, torch.arange(5), x)
    assert pool.k.dtype == torch.bfloat16
    got = pool.k_layers[0].index_select(0, torch.arange(5))
    assert got.dtype == torch.float32 and torch.equal(got, x.bfloat16().float())


def test_another_kv_dtype_under_a_bfloat16_model_is_refused_for_now():
    from rooftop.models.kv_cache import kv_storage_dtype

    assert kv_storage_dtype("auto", torch.bfloat16) == kv_storage_dtype("bfloat16", torch.bfloat16) == torch.bfloat16
    with pytest.raises(InvalidRequestError, match="int8 is not supported yet with a bfloat16 model"):
        kv_storage_dtype("int8", torch.bfloat16)


def test_the_cli_refuses_a_bad_kv_cache_dtype(tiny_gguf):
    r = rooftop_in_process("generate", "hi", "--model", str(tiny_gguf), "--kv-cache-dtype", "int3")
    assert_user_error(r, "kv_cache_dtype", "int3", "int8")


def test_the_analyzer_takes_the_engines_names_and_counts_int8_scales(bundled_llm):
    from rooftop.roofline.ops import kv_bytes_per_token
    from rooftop.roofline.precision import precision

    c = bundled_llm.model.config
    per_token = 2 * c.num_full_attention_layers * c.num_kv_heads
    assert precision("fp32", "auto").kv_bytes == precision("fp32", "float32").kv_bytes == 4
    assert precision("fp32", "bfloat16").kv_bytes == precision("fp32", "bf16").kv_bytes == 2
    assert kv_bytes_per_token(c, precision("fp32", "int8")) == per_token * (c.head_dim + 4)
    assert kv_bytes_per_token(c, precision("fp32", "fp32")) == per_token * 4 * c.head_dim
    with pytest.raises(InvalidRequestError, match="int8x"):
        precision("fp32", "int8x")


def test_the_attribution_counts_the_kv_the_engine_stores():
    llm = LLM(dtype="float32", weights="float", kv_cache_dtype="int8", num_kv_blocks=8)
    assert llm.engine.kv_cache_dtype == "int8"
    assert (llm.precision.kv_bytes, llm.precision.kv_scale_bytes) == (1, 4)
    assert len(llm.generate("hello", SamplingParams(temperature=0, max_tokens=3))[0].token_ids) == 3


def test_teacher_forced_int8_decodes_mostly_agree_with_float_kv(bundled_llm):
    """A loose bound, not the accuracy measurement: a 16-token prompt then 48 decodes of fixed tokens, each
    decode reading the int8 cache through the kernel; top-1 agrees with the float cache at >= 90% of them."""
    from rooftop.models.kv_cache import KVCache

    model = bundled_llm.model
    ids = bundled_llm.tokenizer.encode("The quick brown fox jumps over the lazy dog. " * 6)[:64]
    tops = {}
    for kv in (torch.float32, torch.int8):
        cache = KVCache(model.config, len(ids), torch.float32, "cpu", kv_dtype=kv)
        with torch.inference_mode():
            rows = [model.forward(torch.tensor(ids[:16]), cache, 0)[-1:]]
            rows += [model.forward(torch.tensor([t]), cache, p, Phase.DECODE) for p, t in enumerate(ids[16:], 16)]
            tops[kv] = model.logits(torch.cat(rows)).argmax(-1)
    assert (tops[torch.int8] == tops[torch.float32]).float().mean() >= 0.9
