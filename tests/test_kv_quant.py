"""The quantized KV cache (--kv-cache-dtype int8 | fp8_e4m3): values with a float32 scale per (slot, KV head),
quantized as each token is written; the C++ decode kernel and the PyTorch path read them as stored (and bfloat16 /
float16 pools under a float32 model); capacity follows the stored width; batch invariance, prefix caching, chunked
prefill, preemption and speculative rollback hold on it; /metrics, the dashboard and the analyzer say what is
stored; bad values are refused."""

import random

import httpx
import pytest
import torch
from serve_support import metrics, running_server
from test_batch_invariance import assert_same, prompt, run
from test_cli import assert_user_error, rooftop_in_process
from test_speculative import NGRAM, noisy_drafts

from rooftop import LLM, SamplingParams
from rooftop.config import EngineConfig, ModelConfig
from rooftop.engine.llm_engine import LLMEngine
from rooftop.enums import Phase
from rooftop.errors import InvalidRequestError
from rooftop.kernels import cpu
from rooftop.models.attention import paged_attention
from rooftop.models.kv_cache import (
    AttentionSeq,
    KVCache,
    KVPool,
    build_metadata,
    dequantize_kv,
    kv_storage_dtype,
    quantize_kv,
    rotate_heads,
)

kernels = cpu.ops()
needs_kernels = pytest.mark.skipif(kernels is None, reason="rooftop's CPU kernels did not build on this machine")
QUANTIZED = {"int8": torch.int8, "fp8_e4m3": torch.float8_e4m3fn}
BLOCK = 4
# query heads, KV heads, head_dim: 64 takes the 512-bit loops where the host has them, 32 the 256-bit ones, 48 the
# plain loops' tails
SHAPES = [(9, 3, 64), (8, 2, 32), (6, 3, 48)]
# decodes over scattered blocks, of odd lengths around the kernel's 8-key groups and 64-key tiles, and one of more
# than 512 keys (attended in parts, merged)
DECODES = [([9, 2, 14], 10), ([5], 2), ([0, 11, 3, 7], 14), ([*range(20, 60)], 150), ([*range(159, 19, -1)], 530)]


def config(heads: int, kv_heads: int, dim: int) -> ModelConfig:
    return ModelConfig("llama", 8, heads * dim, 8, 1, heads, kv_heads, dim, 1024)


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t


def hadamard(n: int) -> torch.Tensor:
    """Sylvester's construction, normalized: H_2n = [[H, H], [H, -H]] / sqrt(2)."""
    h = torch.ones(1, 1)
    while h.shape[0] < n:
        h = torch.kron(torch.tensor([[1.0, 1.0], [1.0, -1.0]]), h)
    return h / n**0.5


@pytest.mark.parametrize("dim", [64, 48, 32], ids=["64", "48", "32"])
def test_the_rotation_is_the_normalized_hadamard_matrix_per_power_of_two_block(dim):
    """64 and 32: one Hadamard matrix over the head; 48: one per 16 channels (48's largest power-of-two divisor).
    Orthonormal and its own inverse, so q . k and the weighted sums of values come back unchanged."""
    x = torch.randn(5, 3, dim, generator=torch.Generator().manual_seed(5))
    n = dim & -dim
    matrix = torch.block_diag(*[hadamard(n)] * (dim // n))
    torch.testing.assert_close(rotate_heads(x), x @ matrix.T)
    torch.testing.assert_close(rotate_heads(rotate_heads(x)), x)
    torch.testing.assert_close(rotate_heads(x).norm(dim=-1), x.norm(dim=-1))


def outlier_heads(seed: int) -> torch.Tensor:
    """Heads of varied size with two channels that dwarf the rest, as RoPE's slow pairs do in real keys."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(37, 3, 64, generator=gen) * torch.rand(37, 3, 1, generator=gen) * 10
    x[..., 7] *= 20
    x[..., 39] *= 20
    x[0, 1] = 0  # an all-zero row: scale 0, values 0
    return x


def test_int8_round_trip_is_within_half_a_scale_of_the_rotated_values():
    """Values are the rotated head over max|rotated head| / 127, rounded; the rotation is orthonormal, so the error
    back in the head's own channels is at most sqrt(hd) / 2 scales in L2, and with outlier channels several times
    smaller than quantizing the head unrotated."""
    x = outlier_heads(1)
    q, scale = quantize_kv(x, torch.int8)
    assert q.dtype == torch.int8 and scale.dtype == torch.float32 and scale.shape == x.shape[:-1]
    rotated = rotate_heads(x)
    assert torch.equal(scale, rotated.abs().amax(-1) / 127)
    reference = torch.round(rotated / scale.clamp_min(1e-30)[..., None]).clamp(-127, 127)
    assert torch.equal(q[scale > 0].float(), reference[scale > 0])
    back = dequantize_kv(q, scale)
    assert torch.equal(back, rotate_heads(q.float() * scale[..., None]))
    error = (back - x).norm(dim=-1)
    assert bool((error <= 64**0.5 * scale / 2 * (1 + 1e-4) + 1e-6).all())
    unrotated_scale = x.abs().amax(-1, keepdim=True) / 127
    unrotated = (torch.round(x / unrotated_scale.clamp_min(1e-30)) * unrotated_scale - x).norm(dim=-1)
    assert float(error.sum()) < float(unrotated.sum()) / 3
    assert not back[0, 1].any()
    assert dequantize_kv(q, scale, torch.bfloat16).dtype == torch.bfloat16


def test_fp8_round_trip_keeps_e4m3s_three_mantissa_bits():
    """scale = max|rotated x| / 448 (e4m3's largest value), so each head's largest rotated element lands on 448; an
    element keeps 3 mantissa bits (error <= 1/16 of it) down to e4m3's smallest normal, 2^-6 scales, and below that
    is within half of its subnormal step, 2^-10 scales."""
    x = outlier_heads(4)
    rotated = rotate_heads(x)
    rotated[..., 5] *= 1e-4  # some elements far below their head's largest: subnormal in e4m3
    x = rotate_heads(rotated)
    rotated = rotate_heads(x)
    q, scale = quantize_kv(x, torch.float8_e4m3fn)
    assert q.dtype == torch.float8_e4m3fn and scale.shape == x.shape[:-1]
    assert torch.equal(scale, rotated.abs().amax(-1) / 448)
    reference = (rotated / scale.clamp_min(1e-30)[..., None]).clamp(-448, 448).to(torch.float8_e4m3fn)
    assert torch.equal(bits(q)[scale > 0], bits(reference)[scale > 0])
    assert bool((q.float().abs().amax(-1)[scale > 0] == 448).all())
    s = scale[..., None]
    stored, back = q.float() * s, dequantize_kv(q, scale)
    assert torch.equal(back, rotate_heads(stored))
    normal = rotated.abs() >= s * 2**-6
    error = (stored - rotated).abs()
    assert bool((error[normal] <= rotated.abs()[normal] / 16 * (1 + 1e-5)).all())
    assert bool((error <= (s * 2**-10 * (1 + 1e-5) + 1e-7).expand_as(x))[~normal].all())
    assert normal.any() and (~normal & (rotated != 0)).any()
    assert not back[0, 1].any()


def filled_pools(shape: tuple[int, int, int], dtype: torch.dtype, count: int) -> list[KVPool]:
    """`count` identical quantized pools of 160 blocks, every slot written through the PyTorch path."""
    heads, kv_heads, dim = shape
    pools = []
    for _ in range(count):
        pool = KVPool(config(*shape), 160, BLOCK, dtype, torch.device("cpu"))
        gen = torch.Generator().manual_seed(2)
        pool.k_layers[0].index_copy_(0, torch.arange(640), torch.randn(640, kv_heads, dim, generator=gen) * 3)
        pool.v_layers[0].index_copy_(0, torch.arange(640), torch.randn(640, kv_heads, dim, generator=gen))
        pools.append(pool)
    return pools


def step(shape: tuple[int, int, int], seqs: list[AttentionSeq]):
    """The step's metadata, and its rows' qkv (RoPE applied) split into q, k, v."""
    heads, kv_heads, dim = shape
    meta = build_metadata(seqs, BLOCK, torch.device("cpu"))
    rows = sum(s.new for s in seqs)
    qkv = torch.randn(rows, (heads + 2 * kv_heads) * dim, generator=torch.Generator().manual_seed(3)) * 2
    return meta, qkv, qkv.view(rows, -1, dim).split([heads, kv_heads, kv_heads], dim=1)


def as_the_kernel_reads(q: torch.Tensor, kv: str) -> torch.Tensor:
    """Keys are stored rotated, so the kernel rotates q: int8 keys meet the rotated q rounded to int16 per head
    (scale max|q| / 32767) in exact integer dots, which is the reference's q rounded so, rotated back; fp8 keys meet
    q."""
    if kv != "int8":
        return q
    rotated = rotate_heads(q)
    scale = rotated.abs().amax(-1, keepdim=True) / 32767
    return rotate_heads(torch.round(rotated / scale.clamp_min(1e-30)) * scale)


def on_the_dequantized_pool(pool: KVPool, meta, q, k, v) -> torch.Tensor:
    """Float attention on the pool's dequantized values, the step's k and v written as the pool stores them."""
    dtype = pool.dtype
    keys, values = dequantize_kv(pool.k[0], pool.k_scale[0]), dequantize_kv(pool.v[0], pool.v_scale[0])
    k, v = dequantize_kv(*quantize_kv(k, dtype)), dequantize_kv(*quantize_kv(v, dtype))
    return paged_attention(q, k, v, keys, values, meta).reshape(q.shape[0], -1)


@needs_kernels
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}x{s[2]}")
@pytest.mark.parametrize("kv", QUANTIZED)
def test_the_decode_kernel_on_a_quantized_pool_is_attention_on_the_dequantized_pool(kv, shape):
    """The reference attends with q as the kernel reads it (as_the_kernel_reads). The new K/V are quantized into
    their slots exactly as the PyTorch write does."""
    heads, kv_heads, dim = shape
    kernel_pool, torch_pool = filled_pools(shape, QUANTIZED[kv], 2)
    meta, qkv, (q, k, v) = step(shape, [AttentionSeq(table, cached, 1, Phase.DECODE) for table, cached in DECODES])
    paged_attention(q, k, v, torch_pool.k_layers[0], torch_pool.v_layers[0], meta)  # the PyTorch write
    expected = on_the_dequantized_pool(torch_pool, meta, as_the_kernel_reads(q, kv), k, v)
    kp, vp = kernel_pool.k_layers[0], kernel_pool.v_layers[0]
    args = (meta.slot_mapping, meta.decode_tables, meta.decode_lengths, BLOCK, heads, kv_heads, dim**-0.5)
    got = kernels.decode_attention(qkv, kp.values, vp.values, *args, k_scale=kp.scale, v_scale=vp.scale)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert torch.equal(bits(kernel_pool.k), bits(torch_pool.k)) and torch.equal(bits(kernel_pool.v), bits(torch_pool.v))
    assert torch.equal(kernel_pool.k_scale, torch_pool.k_scale) and torch.equal(kernel_pool.v_scale, torch_pool.v_scale)


@needs_kernels
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}x{s[2]}")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bfloat16", "float16"])
def test_the_decode_kernel_on_a_16_bit_pool_is_attention_on_the_widened_pool(dtype, shape):
    """--kv-cache-dtype bfloat16 / float16 under a float32 model (a CastPool): the kernel rounds the new K/V into
    their slots as the PyTorch write does (to nearest even) and attends over the rows widened to float32."""
    heads, kv_heads, dim = shape
    pools = [KVPool(config(*shape), 160, BLOCK, dtype, torch.device("cpu"), act_dtype=torch.float32) for _ in range(2)]
    for pool in pools:
        gen = torch.Generator().manual_seed(2)
        pool.k_layers[0].index_copy_(0, torch.arange(640), torch.randn(640, kv_heads, dim, generator=gen) * 3)
        pool.v_layers[0].index_copy_(0, torch.arange(640), torch.randn(640, kv_heads, dim, generator=gen))
    kernel_pool, torch_pool = pools
    meta, qkv, (q, k, v) = step(shape, [AttentionSeq(table, cached, 1, Phase.DECODE) for table, cached in DECODES])
    expected = paged_attention(q, k, v, torch_pool.k_layers[0], torch_pool.v_layers[0], meta).reshape(q.shape[0], -1)
    args = (meta.slot_mapping, meta.decode_tables, meta.decode_lengths, BLOCK, heads, kv_heads, dim**-0.5)
    got = kernels.decode_attention(qkv, kernel_pool.k_layers[0].values, kernel_pool.v_layers[0].values, *args)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert torch.equal(kernel_pool.k, torch_pool.k) and torch.equal(kernel_pool.v, torch_pool.v)


@pytest.mark.parametrize("kv", QUANTIZED)
def test_the_pytorch_path_on_a_quantized_pool_is_attention_on_the_dequantized_pool(kv):
    """A step of a prefill chunk after cached tokens and decodes: the chunk attends its context (its own new K/V
    included) dequantized from the pool, the decodes theirs, as float attention on the dequantized pool does."""
    shape = SHAPES[0]
    (pool,) = filled_pools(shape, QUANTIZED[kv], 1)
    seqs = [AttentionSeq([0, 1, 2], 5, 6, Phase.PREFILL)]
    seqs += [AttentionSeq(table, cached, 1, Phase.DECODE) for table, cached in DECODES]
    meta, _, (q, k, v) = step(shape, seqs)
    expected = on_the_dequantized_pool(pool, meta, q, k, v)
    got = paged_attention(q, k, v, pool.k_layers[0], pool.v_layers[0], meta).reshape(q.shape[0], -1)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert pool.k_layers[0].index_select(0, meta.slot_mapping).dtype == torch.float32


@needs_kernels
def test_the_decode_kernel_refuses_a_pool_without_its_scales():
    heads, kv_heads, dim = shape = SHAPES[1]
    (pool,) = filled_pools(shape, torch.int8, 1)
    meta, qkv, _ = step(shape, [AttentionSeq([5], 2, 1, Phase.DECODE)])
    args = (meta.slot_mapping, meta.decode_tables, meta.decode_lengths, BLOCK, heads, kv_heads, dim**-0.5)
    with pytest.raises(RuntimeError, match="an int8 or fp8 pool needs its scales"):
        kernels.decode_attention(qkv, pool.k[0], pool.v[0], *args)
    with pytest.raises(RuntimeError, match="pool has no scales"):
        floats = torch.zeros(pool.k[0].shape)
        kernels.decode_attention(qkv, floats, floats.clone(), *args, k_scale=pool.k_scale[0], v_scale=pool.v_scale[0])
    with pytest.raises(RuntimeError, match="both float32, bfloat16, float16, int8 or float8_e4m3fn"):
        kernels.decode_attention(qkv, pool.k[0], pool.v[0].float(), *args)


@pytest.mark.parametrize("kv", QUANTIZED)
def test_the_same_bytes_hold_more_quantized_tokens_by_the_stored_width(kv):
    """int8 and fp8: hd bytes and a 4-byte scale per head, against 4 * hd for float32."""
    c = config(*SHAPES[1])
    fp32, quantized = (KVPool.bytes_per_block(c, 16, d) // 16 for d in (torch.float32, QUANTIZED[kv]))
    heads = 2 * c.num_full_attention_layers * c.num_kv_heads
    assert fp32 == heads * 4 * c.head_dim and quantized == heads * (c.head_dim + 4)
    pool = KVPool(c, 10, 16, QUANTIZED[kv], torch.device("cpu"))
    assert pool.nbytes == 10 * KVPool.bytes_per_block(c, 16, QUANTIZED[kv])


def test_a_quantized_engine_holds_more_tokens_in_the_same_bytes_and_says_its_dtype(bundled_llm):
    c = bundled_llm.model.config
    budget = 1 << 26
    engines = {
        name: LLMEngine(
            bundled_llm.model, bundled_llm.tokenizer, EngineConfig(kv_cache_bytes=budget, kv_cache_dtype=name)
        )
        for name in ("auto", "int8", "fp8_e4m3")
    }
    tokens = {name: eng.kv_cache_tokens for name, eng in engines.items()}
    per_token = 2 * c.num_full_attention_layers * c.num_kv_heads  # heads of K and V per token
    assert tokens["auto"] == budget // (16 * per_token * 4 * c.head_dim) * 16
    assert tokens["int8"] == tokens["fp8_e4m3"] == budget // (16 * per_token * (c.head_dim + 4)) * 16
    assert tokens["int8"] / tokens["auto"] == pytest.approx(4 * c.head_dim / (c.head_dim + 4), rel=0.02)
    assert [eng.stats().kv_cache_dtype for eng in engines.values()] == ["float32", "int8", "fp8_e4m3"]


@pytest.mark.parametrize("kv", ["int8", "fp8_e4m3", "bfloat16", "float16"])
def test_batched_greedy_with_quantized_kv_is_what_each_gets_alone(bundled_llm, kv):
    llm = bundled_llm
    greedy = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logprobs=1)
    reqs = [(f"r{i}", prompt(i, n), greedy) for i, n in enumerate([3, 17, 40])]
    options = dict(num_kv_blocks=64, kv_cache_dtype=kv)
    model, tok = llm.model, llm.tokenizer
    batched_engine = LLMEngine(model, tok, EngineConfig(max_num_batched_tokens=64, **options))
    assert batched_engine.kv_cache_dtype == kv
    batched = run(batched_engine, reqs)
    alone = {}
    for r in reqs:
        alone |= run(LLMEngine(model, tok, EngineConfig(enable_prefix_caching=False, **options)), [r])
    assert_same(batched, alone)


@pytest.fixture(scope="module", params=["float32", "bfloat16"], ids=["kernels", "torch-ops"])
def tiny_long(request, long_gguf):
    """The tiny model with a long context on rooftop's decode kernel (float32) and PyTorch's attention (bfloat16)."""
    return LLM(model=long_gguf, dtype=request.param, weights="float")


@pytest.mark.parametrize("kv", QUANTIZED)
def test_chunked_prefill_prefix_hits_and_preemption_on_quantized_kv_give_what_each_gets_alone(tiny_long, kv):
    """Prompts of 3 to 300 tokens in 32-token chunks under a 300-token budget, two of them sharing a 96-token prefix
    (the second reuses the first's quantized blocks, three whole chunks); then four requests in a pool too small for
    all, the latest preempted and recomputed: every request's tokens and logprobs are exactly those it gets alone."""
    greedy = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=1)
    shared = prompt(7, 96)
    texts = [prompt(0, 3), shared + prompt(1, 40), prompt(2, 130), prompt(3, 300), shared + prompt(4, 20)]
    reqs = [(f"r{i}", text, greedy) for i, text in enumerate(texts)]
    options = dict(kv_cache_dtype=kv, num_kv_blocks=256, block_size=16, chunked_prefill_size=32)

    def alone(requests):
        out = {}
        for r in requests:
            out |= run(LLMEngine(tiny_long.model, tiny_long.tokenizer, EngineConfig(**options, enable_prefix_caching=False)), [r])  # fmt: skip
        return out

    eng = LLMEngine(tiny_long.model, tiny_long.tokenizer, EngineConfig(max_num_batched_tokens=300, **options))
    assert_same(run(eng, reqs[:4]) | run(eng, reqs[4:]), alone(reqs))
    assert eng.stats().prefix_hits >= 96
    long = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True, logprobs=1)
    reqs = [(f"p{i}", prompt(i, 100), long) for i in range(4)]
    eng = LLMEngine(tiny_long.model, tiny_long.tokenizer, EngineConfig(**{**options, "num_kv_blocks": 30}))
    assert_same(run(eng, reqs), alone(reqs))
    assert eng.stats().preemptions > 0


@pytest.mark.parametrize("kv", QUANTIZED)
def test_speculative_rollback_on_quantized_kv_never_changes_greedy_tokens(tiny_long, kv, monkeypatch):
    """Drafts half right, half noise: a verify step writes every draft token's K/V into the quantized pool, the
    rejected ones are rolled back and their slots written again; the tokens are those of plain decoding."""
    rnd = random.Random(0)
    reqs = [(f"t{i}", "abcabcabc"[: 3 + i], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=1)) for i in range(4)]  # fmt: skip

    def engine(speculative):
        config = EngineConfig(num_kv_blocks=64, block_size=4, kv_cache_dtype=kv, speculative_config=speculative)
        return LLMEngine(tiny_long.model, tiny_long.tokenizer, config)

    plain = run(engine(None), reqs)
    eng = engine(NGRAM)
    guesses = [plain[rid].token_ids for rid, _, _ in reqs]

    monkeypatch.setattr(eng._proposer, "propose", noisy_drafts(guesses, rnd))
    assert_same(run(eng, reqs), plain)
    assert 0 < eng.stats().spec_decode.accepted_tokens < eng.stats().spec_decode.draft_tokens


def test_bad_kv_cache_dtypes_are_refused_with_the_valid_ones():
    with pytest.raises(InvalidRequestError, match="auto, float32, bfloat16, float16, int8, fp8_e4m3"):
        EngineConfig(kv_cache_dtype="x")
    with pytest.raises(InvalidRequestError, match="kv_cache_dtype"):
        LLM(kv_cache_dtype="x")
    assert EngineConfig(kv_cache_dtype="fp8_e4m3").kv_cache_dtype == "fp8_e4m3"


def test_every_kv_dtype_is_stored_as_named_under_any_model_dtype():
    """A float32 or bfloat16 model takes any KV dtype (the cause of the old refusal under bfloat16 was the model's
    narrow bfloat16 matmuls, not the KV cache: tests/test_batch_invariance.py); auto is the model's."""
    from rooftop.config import KV_CACHE_DTYPES
    from rooftop.models.kv_cache import kv_dtype_name

    for model_dtype in (torch.float32, torch.bfloat16):
        assert kv_storage_dtype("auto", model_dtype) == model_dtype
        for name in KV_CACHE_DTYPES[1:]:
            assert kv_dtype_name(kv_storage_dtype(name, model_dtype)) == name


def test_a_float_kv_dtype_other_than_the_models_is_stored_as_named(bundled_llm):
    eng = LLMEngine(bundled_llm.model, bundled_llm.tokenizer, EngineConfig(num_kv_blocks=4, kv_cache_dtype="float16"))
    assert eng.kv_cache_dtype == "float16" and eng.stats().kv_cache_bytes == 4 * KVPool.bytes_per_block(
        bundled_llm.model.config, 16, torch.float16
    )
    pool = KVPool(config(*SHAPES[1]), 4, BLOCK, torch.bfloat16, torch.device("cpu"))  # activations float32
    x = torch.randn(5, 2, 32)
    pool.k_layers[0].index_copy_(0, torch.arange(5), x)
    assert pool.k.dtype == torch.bfloat16
    got = pool.k_layers[0].index_select(0, torch.arange(5))
    assert got.dtype == torch.float32 and torch.equal(got, x.bfloat16().float())


def test_the_cli_refuses_a_bad_kv_cache_dtype(tiny_gguf):
    r = rooftop_in_process("generate", "hi", "--model", str(tiny_gguf), "--kv-cache-dtype", "int3")
    assert_user_error(r, "kv_cache_dtype", "int3", "int8", "fp8_e4m3")


def test_generate_says_the_kv_dtype(tiny_gguf):
    r = rooftop_in_process("generate", "hi", "--model", str(tiny_gguf), "-n", "2", "--kv-cache-dtype", "fp8_e4m3")
    assert r.returncode == 0, r.stderr
    assert "tokens, fp8_e4m3," in r.stderr  # the KV cache line: blocks, tokens, dtype, MiB


@pytest.mark.parametrize("kv", QUANTIZED)
def test_the_analyzer_takes_the_engines_names_and_counts_the_scales(bundled_llm, kv):
    from rooftop.roofline.ops import kv_bytes_per_token
    from rooftop.roofline.precision import precision

    c = bundled_llm.model.config
    per_token = 2 * c.num_full_attention_layers * c.num_kv_heads
    assert precision("fp32", "auto").kv_bytes == precision("fp32", "float32").kv_bytes == 4
    assert precision("fp32", "bfloat16").kv_bytes == precision("fp32", "bf16").kv_bytes == 2
    assert kv_bytes_per_token(c, precision("fp32", kv)) == per_token * (c.head_dim + 4)
    assert kv_bytes_per_token(c, precision("fp32", "fp32")) == per_token * 4 * c.head_dim
    with pytest.raises(InvalidRequestError, match="int8x"):
        precision("fp32", "int8x")


def test_the_attribution_counts_the_kv_the_engine_stores(tiny_gguf):
    llm = LLM(model=tiny_gguf, kv_cache_dtype="fp8_e4m3", num_kv_blocks=8)
    assert llm.engine.kv_cache_dtype == "fp8_e4m3"
    assert (llm.precision.kv_bytes, llm.precision.kv_scale_bytes) == (1, 4)
    assert len(llm.generate("hello", SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))[0].token_ids) == 3


def test_metrics_and_the_dashboard_say_the_kv_dtype(long_gguf):
    """vLLM's cache_config_info (rooftop_ prefix) carries the stored dtype and block size from startup on."""
    with running_server(long_gguf, {"kv_cache_dtype": "int8", "max_model_len": 256}) as url:
        assert metrics(url)['rooftop_cache_config_info{block_size="16",cache_dtype="int8"}'] == 1
        state = httpx.get(f"{url}/dashboard/state").json()
        assert state["kv_cache_dtype"] == "int8" and state["kv_blocks_total"] > 0


@pytest.mark.parametrize("kv", QUANTIZED)
def test_teacher_forced_quantized_decodes_mostly_agree_with_float_kv(bundled_llm, kv):
    """A loose bound, not the accuracy measurement (benchmarks/kv_accuracy.py): a 16-token prompt then 48 decodes of
    fixed tokens, each decode reading the quantized cache through the kernel; top-1 agrees with the float cache at
    >= 90% of them."""
    model = bundled_llm.model
    ids = bundled_llm.tokenizer.encode("The quick brown fox jumps over the lazy dog. " * 6)[:64]
    tops = {}
    for dtype in (torch.float32, QUANTIZED[kv]):
        cache = KVCache(model.config, len(ids), torch.float32, "cpu", kv_dtype=dtype)
        with torch.inference_mode():
            rows = [model.forward(torch.tensor(ids[:16]), cache, 0)[-1:]]
            rows += [model.forward(torch.tensor([t]), cache, p, Phase.DECODE) for p, t in enumerate(ids[16:], 16)]
            tops[dtype] = model.logits(torch.cat(rows)).argmax(-1)
    assert (tops[QUANTIZED[kv]] == tops[torch.float32]).float().mean() >= 0.9
