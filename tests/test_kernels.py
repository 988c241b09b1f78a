"""rooftop's CPU kernels (kernels/cpu.cpp) against PyTorch references: the quantized linears exactly (given the
same int8 activations) and against the float matmul, the small ops, decode attention over a scattered paged pool,
bad inputs, and the whole model with and without them."""

import pytest
import torch
import torch.nn.functional as F
from near_ties import FLOAT_TIE, parting, rooftop_logits

from rooftop.kernels import cpu
from rooftop.models.rope import apply_rope
from rooftop.quant.linear import Q4Linear, Q8Linear
from rooftop.quant.weights import quantize_int4, quantize_int8_groups

kernels = cpu.ops()
pytestmark = pytest.mark.skipif(kernels is None, reason="rooftop's CPU kernels did not build on this machine")


def quantized_activations(x: torch.Tensor) -> torch.Tensor:
    """What the kernels dot the weights with: x rounded to int8 per group of 32 (scale max|x| / 127)."""
    groups = x.reshape(x.shape[0], -1, 32)
    scale = groups.abs().amax(-1, keepdim=True) / 127
    return (torch.round(groups / torch.where(scale > 0, scale, 1)) * scale).reshape(x.shape)


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 9])
@pytest.mark.parametrize("k", [32, 96, 224, 576])
def test_q4_linear_is_its_dequantized_matmul_on_the_quantized_activations(rows, k):
    gen = torch.Generator().manual_seed(rows * k)
    # 40 output rows: two tiles of 16 and a part-filled third
    w, bias = torch.randn(40, k, generator=gen), torch.randn(40, generator=gen)
    x, residual = torch.randn(rows, k, generator=gen), torch.randn(rows, 40, generator=gen)
    lin = Q4Linear.from_weight(quantize_int4(w), bias)
    dense = lin.dequantize()
    torch.testing.assert_close(dense, quantize_int4(w).dequantize(), atol=1e-5, rtol=1e-5)
    exact = (quantized_activations(x).double() @ dense.double().t() + bias.double() + residual.double()).float()
    torch.testing.assert_close(lin(x, residual=residual), exact, atol=1e-4, rtol=1e-4)
    ref = F.linear(x, w, bias)
    assert float((lin(x) - ref).norm() / ref.norm()) < 0.12  # 4-bit weights: the rounding is the error


@pytest.mark.parametrize("rows", [1, 4, 7])
def test_q8_linear_is_its_dequantized_matmul_on_the_quantized_activations(rows):
    gen = torch.Generator().manual_seed(rows)
    w, x = torch.randn(72, 160, generator=gen), torch.randn(rows, 160, generator=gen) * 3
    lin = Q8Linear.from_weight(w, None)
    dense = lin.dequantize()
    assert torch.equal(dense, quantize_int8_groups(w).dequantize())
    exact = (quantized_activations(x).double() @ dense.double().t()).float()
    torch.testing.assert_close(lin(x), exact, atol=1e-4, rtol=1e-4)
    ref = x @ w.t()
    assert float((lin(x) - ref).norm() / ref.norm()) < 0.01  # 8 bits on both sides


@pytest.mark.parametrize("native_bf16", [True, False])
def test_the_kernel_linears_take_any_leading_shape_and_dtype_and_widen_the_planned_rows(native_bf16, monkeypatch):
    """Where the host has AMX a planned prefill chunk widens to one bfloat16 matmul; elsewhere (AVX2 and
    AVX512-BF16 hosts, where the kernels run prefill rows faster than a widened matmul) every row runs the kernel."""
    from rooftop.quant import linear
    from rooftop.quant.linear import WIDEN_ROWS, RowPlan

    monkeypatch.setattr(linear, "widen_dtype", lambda: torch.bfloat16 if native_bf16 else None)
    gen = torch.Generator().manual_seed(7)
    lin = Q4Linear.from_weight(quantize_int4(torch.randn(64, 128, generator=gen)), None)
    x = torch.randn(2, 3, 128, generator=gen)
    torch.testing.assert_close(lin(x), lin(x.reshape(6, 128)).reshape(2, 3, 64))
    assert lin(x.bfloat16()).dtype == torch.bfloat16
    many = torch.randn(WIDEN_ROWS, 128, generator=gen)
    widened = lin(many, plan=RowPlan((WIDEN_ROWS - 8,)))  # one matmul on the widened weights, then the kernel
    assert torch.equal(widened[-8:], lin(many[-8:]))
    if native_bf16:
        bf16 = torch.bfloat16
        torch.testing.assert_close(widened[:-8], F.linear(many[:-8].to(bf16), lin.dequantize(bf16)).float())
        assert lin.widen_rows == WIDEN_ROWS
    else:
        assert torch.equal(widened, lin(many)) and lin.widen_rows is None


@pytest.mark.parametrize("kind", [Q4Linear, Q8Linear])
def test_a_row_gives_the_same_bits_at_any_batch_size(kind):
    """The tiled kernels pass over a tile's weights for up to 8 activation rows at once: each row's result must not
    depend on how many rows share the call or where it sits among them (batch invariance, speculative verify)."""
    gen = torch.Generator().manual_seed(3)
    w, x = torch.randn(48, 256, generator=gen), torch.randn(19, 256, generator=gen)
    lin = kind.from_weight(quantize_int4(w) if kind is Q4Linear else w, None)
    alone = torch.cat([lin(x[i : i + 1]) for i in range(19)])
    for rows in (2, 3, 4, 5, 8, 9, 19):  # up to 4: two tiles in turn per thread; from 5, one tile's pass
        assert torch.equal(lin(x[:rows]), alone[:rows])
    assert torch.equal(lin(x[3:11]), alone[3:11])
    assert kernels.tiled_linear(x[:0], lin.q, lin.dm, lin.kernel_format, 48, None, None).shape == (0, 48)


def test_bad_kernel_inputs_are_refused_with_the_reason():
    w = Q8Linear.from_weight(torch.randn(8, 64), None)
    with pytest.raises(RuntimeError, match="K must be a multiple of 32"):
        kernels.tiled_linear(torch.randn(1, 48), w.q, w.dm, 2, 8, None, None)
    with pytest.raises(RuntimeError, match="x has 96 inputs, the weights 64"):
        kernels.tiled_linear(torch.randn(1, 96), w.q, w.dm, 2, 8, None, None)
    with pytest.raises(RuntimeError, match="x must be contiguous float32"):
        kernels.tiled_linear(torch.randn(1, 64).double(), w.q, w.dm, 2, 8, None, None)
    with pytest.raises(RuntimeError, match="residual must be contiguous float32"):
        kernels.tiled_linear(torch.randn(2, 64), w.q, w.dm, 2, 8, None, torch.randn(1, 8))
    with pytest.raises(RuntimeError, match=r"dm must be float16 \(ceil\(N/16\), K/32, 2, 16\)"):
        kernels.tiled_linear(torch.randn(1, 64), w.q, w.dm, 1, 8, None, None)  # Q4_1 has two parts
    with pytest.raises(RuntimeError, match=r"format must be 0 \(Q4_0\), .* or 7 \(Q6_K\)"):
        kernels.tiled_dequantize(w.q, w.dm, 8, 8)


def test_rms_norm_and_silu_mul_match_pytorch():
    from rooftop.models.ops import rms_norm

    gen = torch.Generator().manual_seed(8)
    x, w = torch.randn(5, 576, generator=gen) * 3, torch.randn(576, generator=gen)
    torch.testing.assert_close(kernels.rms_norm(x, w, 1e-5), rms_norm(x, w, 1e-5))
    gate_up = torch.randn(3, 2 * 1539, generator=gen) * 6  # not a multiple of 8: the vector loop's tail
    gate, up = gate_up.chunk(2, dim=-1)
    torch.testing.assert_close(kernels.silu_mul(gate_up), F.silu(gate) * up, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("with_norm", [False, True])
def test_rope_in_place_matches_pytorch(with_norm):
    from rooftop.models.ops import rms_norm
    from rooftop.models.rope import apply_rope

    gen = torch.Generator().manual_seed(9)
    heads, kv_heads, dim = 4, 2, 16
    qkv = torch.randn(3, (heads + 2 * kv_heads) * dim, generator=gen)
    cos, sin = torch.randn(50, dim, generator=gen), torch.randn(50, dim, generator=gen)
    positions = torch.tensor([7, 0, 49])
    norm = torch.randn(heads + kv_heads, dim, generator=gen) if with_norm else None
    qk = qkv[:, : (heads + kv_heads) * dim].reshape(3, heads + kv_heads, dim)
    if norm is not None:
        qk = rms_norm(qk, norm, 1e-6)
    expected = apply_rope(qk, cos[positions, None], sin[positions, None]).reshape(3, -1)
    got = qkv.clone()
    kernels.rope_(got, heads + kv_heads, dim, positions, cos, sin, norm, 1e-6)
    torch.testing.assert_close(got[:, : (heads + kv_heads) * dim], expected)
    torch.testing.assert_close(got[:, (heads + kv_heads) * dim :], qkv[:, (heads + kv_heads) * dim :])  # v untouched
    with pytest.raises(RuntimeError, match="position 50 is past the RoPE table"):
        kernels.rope_(got, heads, dim, torch.tensor([1, 2, 50]), cos, sin, None, 1e-6)


@pytest.mark.parametrize("heads, kv_heads, dim", [(6, 2, 32), (9, 3, 64), (10, 2, 64), (4, 2, 48)])
def test_decode_attention_reads_the_paged_pool_like_the_pytorch_path(heads, kv_heads, dim):
    """Five sequences of different lengths in scattered blocks (past the kernel's 64-key parts, attended in parts and
    merged), grouped-query heads (groups of 3, 5: scored four and one at a time, 2; head sizes that are and are not a
    multiple of 16): the kernel writes each new K/V to its slot and attends like the gather +
    scaled_dot_product_attention path."""
    from rooftop.config import ModelConfig
    from rooftop.enums import Phase
    from rooftop.models.attention import paged_attention
    from rooftop.models.kv_cache import AttentionSeq, KVPool, build_metadata

    gen = torch.Generator().manual_seed(10)
    block = 4
    config = ModelConfig("llama", 8, heads * dim, 8, 1, heads, kv_heads, dim, 1024)
    pools = [KVPool(config, 160, block, torch.float32, torch.device("cpu")) for _ in range(2)]
    for pool in pools:
        torch.manual_seed(11)
        pool.k.normal_()
        pool.v.normal_()
    seqs = [
        AttentionSeq(table, cached, 1, Phase.DECODE)
        for table, cached in (
            ([9, 2, 14], 9),
            ([5], 2),
            ([0, 11, 3, 7], 13),
            ([*range(20, 60)], 150),
            ([*range(159, 19, -1)], 530),
        )
    ]
    meta = build_metadata(seqs, block, torch.device("cpu"))
    qkv = torch.randn(5, (heads + 2 * kv_heads) * dim, generator=gen)
    args = (meta.slot_mapping, meta.decode_tables, meta.decode_lengths, block, heads, kv_heads, dim**-0.5)
    got = kernels.decode_attention(qkv, pools[0].k[0], pools[0].v[0], *args)
    q, k, v = qkv.view(5, -1, dim).split([heads, kv_heads, kv_heads], dim=1)
    expected = paged_attention(q, k, v, pools[1].k[0], pools[1].v[0], meta).reshape(5, -1)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(pools[0].k, pools[1].k)  # the same slots written
    torch.testing.assert_close(pools[0].v, pools[1].v)


@pytest.mark.parametrize(
    "n, cached, heads, kv_heads, dim",
    [
        (37, 0, 4, 2, 64),
        (70, 130, 8, 8, 80),
        (5, 40, 6, 3, 48),
        (1, 0, 2, 1, 64),
        (33, 100, 9, 3, 128),
        (20, 3, 4, 1, 24),
    ],
)
def test_prefill_attention_is_pytorchs_causal_attention_over_the_cached_and_new_keys(n, cached, heads, kv_heads, dim):
    """A chunk of n queries after `cached` tokens: across key blocks, the causal edge inside a block, grouped
    heads, head dims the vector loops take in parts or leave to the plain loops, and q a view of the step's qkv
    rows (its rows apart), as the model passes it."""
    from rooftop.models.attention import prefill_attention

    gen = torch.Generator().manual_seed(n + cached)
    qkv = torch.randn(n, (heads + 2 * kv_heads) * dim, generator=gen)
    q = qkv.view(n, -1, dim)[:, :heads]
    keys, values = (torch.randn(cached + n, kv_heads, dim, generator=gen) for _ in range(2))
    got = kernels.prefill_attention(q, keys, values, cached, dim**-0.5)
    torch.testing.assert_close(got, prefill_attention(q, keys, values, cached), atol=1e-5, rtol=1e-5)
    with pytest.raises(RuntimeError, match="q must be float32"):
        kernels.prefill_attention(q.double(), keys, values, cached, 1.0)
    with pytest.raises(RuntimeError, match=r"keys and values must be contiguous float32 \(cached \+ n"):
        kernels.prefill_attention(q, keys[1:], values[1:], cached, 1.0)
    if kv_heads > 1:
        with pytest.raises(RuntimeError, match="heads must be a multiple of kv_heads"):
            kernels.prefill_attention(q[:, :1], keys, values, cached, 1.0)


@pytest.mark.parametrize("backend", ["kernels", "torch"])
def test_a_decode_runs_the_same_attention_whatever_shares_its_step(backend):
    """The phase decides the attention path, not the step's mix: a decode's output is bit for bit the same in a
    decode-only step and in a step shared with a prefill chunk, on either op backend."""
    from rooftop.config import ModelConfig
    from rooftop.enums import Phase
    from rooftop.models.kv_cache import AttentionSeq, KVPool, build_metadata
    from rooftop.models.ops import KernelOps, TorchOps
    from rooftop.models.rope import cos_sin_table

    heads, kv_heads, dim, block = 6, 2, 32, 4
    config = ModelConfig("llama", 8, heads * dim, 8, 1, heads, kv_heads, dim, 64)
    cos, sin = cos_sin_table(config, 64, torch.float32, torch.device("cpu"))
    ops = KernelOps(kernels, config, cos, sin) if backend == "kernels" else TorchOps(config, cos, sin)

    def attend(seqs, qkv, positions):
        pool = KVPool(config, 16, block, torch.float32, torch.device("cpu"))
        torch.manual_seed(12)
        pool.k.normal_()
        pool.v.normal_()
        meta = build_metadata(seqs, block, torch.device("cpu"))
        rope = ops.rope(torch.tensor(positions))
        return ops.attention(qkv.clone(), None, rope, pool.k[0], pool.v[0], meta)

    gen = torch.Generator().manual_seed(13)
    width = (heads + 2 * kv_heads) * dim
    decodes = [AttentionSeq([9, 2, 14], 9, 1, Phase.DECODE), AttentionSeq([5, 6], 6, 1, Phase.DECODE)]
    prefill = AttentionSeq([0, 11], 2, 5, Phase.PREFILL)  # a chunk of 5 after 2 cached tokens
    decode_qkv, prefill_qkv = torch.randn(2, width, generator=gen), torch.randn(5, width, generator=gen)
    alone = attend(decodes, decode_qkv, [9, 6])
    mixed = attend([prefill, *decodes], torch.cat([prefill_qkv, decode_qkv]), [2, 3, 4, 5, 6, 9, 6])
    assert mixed.shape == (7, heads * dim)
    assert torch.equal(mixed[5:], alone)
    assert torch.equal(mixed[:5], attend([prefill], prefill_qkv, [2, 3, 4, 5, 6]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int8, torch.float8_e4m3fn])
def test_a_decode_that_shares_its_prefix_blocks_gets_the_bits_it_gets_alone(dtype):
    """Decode attention copies a task's slots before attending, but a sequence whose blocks an earlier sequence of the
    step reads too (a shared prefix) attends from the pool where they lie: its output must be the same bits either
    way, for every pool format."""
    from rooftop.models.kv_cache import quantize_kv

    heads, kv_heads, dim, block = 8, 2, 64, 4
    gen = torch.Generator().manual_seed(14)
    keys, values = torch.randn(160, kv_heads, dim, generator=gen), torch.randn(160, kv_heads, dim, generator=gen)
    if dtype in (torch.int8, torch.float8_e4m3fn):
        (kq, ks), (vq, vs) = quantize_kv(keys, dtype), quantize_kv(values, dtype)
        pool = (kq, vq, ks, vs)
    else:
        pool = (keys.to(dtype), values.to(dtype), None, None)
    prefix = list(range(1, 38))  # 148 shared keys, then a block of each sequence's own
    tables = torch.tensor([[*prefix, 38], [*prefix, 39]])
    lengths = torch.tensor([150, 150])
    slots = tables[:, 37] * block + 1  # each writes its new key into its own last block
    qkv = torch.randn(2, (heads + 2 * kv_heads) * dim, generator=gen)

    def attend(rows: list[int]) -> torch.Tensor:
        k, v, ks, vs = (t.clone() if t is not None else None for t in pool)
        return kernels.decode_attention(
            qkv[rows], k, v, slots[rows], tables[rows], lengths[rows], block, heads, kv_heads, dim**-0.5, ks, vs
        )

    both = attend([0, 1])
    assert torch.equal(both[1], attend([1])[0])
    assert torch.equal(both[0], attend([0])[0])


def test_the_loader_can_be_switched_off(monkeypatch):
    monkeypatch.setenv("ROOFTOP_CPU_KERNELS", "0")
    assert cpu.ops.__wrapped__() is None
    monkeypatch.setenv("ROOFTOP_CPU_KERNELS", "1")
    assert cpu.ops.__wrapped__() is not None  # built already: loading it again is quick


@pytest.mark.slow
def test_the_bundled_model_gives_the_same_logits_with_and_without_the_small_kernels(bundled_llm, monkeypatch):
    """Float weights, so only the small ops differ (RMSNorm, RoPE, SiLU-mul, decode attention): prefill then 8
    decode steps, kernels against PyTorch ops. The same tokens, but where PyTorch's own logits nearly tie (which
    way a near-tie breaks follows the host's vector width), and the same logprobs while the contexts agree."""
    prompt = bundled_llm.apply_chat_template([{"role": "user", "content": "Name three rivers."}])
    from rooftop import SamplingParams

    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True, logprobs=3)
    from rooftop.models.ops import KernelOps, TorchOps

    model = bundled_llm.model
    assert isinstance(model.ops, KernelOps)  # picked once, when the float32 CPU model was built
    with_kernels = bundled_llm.generate(prompt, params)[0]
    monkeypatch.setattr(model, "ops", TorchOps(model.config, model.ops.cos, model.ops.sin))
    without = bundled_llm.generate(prompt, params)[0]
    part = parting(rooftop_logits(bundled_llm), without.prompt_token_ids, with_kernels.token_ids, without.token_ids)
    assert part is None or part[1] < FLOAT_TIE, part  # the margin from PyTorch's ops: cpu.ops is still off
    same = len(without.token_ids) if part is None else part[0] + 1  # up to the parting, the same context
    for a, b in zip(with_kernels.logprobs[:same], without.logprobs[:same], strict=True):
        theirs = dict(b.top)
        assert all(abs(logprob - theirs[token]) < 1e-3 for token, logprob in a.top if token in theirs)
        assert a.token_id in theirs


def tiled_calls() -> list:
    """tiled_linear (with a bias and a residual) and tiled_dequantize of every format, on random weights: Q4_1 and
    Q8_0 groups, and random blocks of every stored block format (48 rows: three tiles; K = 768: whole 256-blocks;
    224 for the 32-blocks: seven groups; 9 activation rows: a pass of 8 and a single; 1 to 4 rows: a decode's two
    streams, tiles 0 and 1 together and tile 2 alone); the K-quants also in their prefill chunks' form (super_blocks:
    activations per 256, each super-block summed in integers)."""
    from gguf import GGMLQuantizationType as QType
    from test_block_formats import random_blocks

    from rooftop.quant.gguf_blocks import stored_blocks
    from rooftop.quant.linear import BlockLinear
    from rooftop.quant.weights import BLOCK_FORMATS

    gen = torch.Generator().manual_seed(13)
    w = torch.randn(48, 224, generator=gen)
    linears = [Q4Linear.from_weight(quantize_int4(w), torch.randn(48, generator=gen)), Q8Linear.from_weight(w, None)]
    for seed, name in enumerate(BLOCK_FORMATS):
        k = 768 if name.endswith("_k") else 224
        blocks = stored_blocks(random_blocks(QType[name.upper()], 48, k, seed), QType[name.upper()], (48, k))
        linears.append(BlockLinear.from_weight(blocks, torch.randn(48, generator=gen)))
    calls = []
    for lin in linears:
        k = lin.q.shape[1] * 32
        x, residual = torch.randn(9, k, generator=gen), torch.randn(9, 48, generator=gen)
        chunk_forms = (False, True) if lin.format.endswith("_k") else (False,)  # a prefill chunk's super-block sums
        for rows in (9, 4, 3, 2, 1):
            for super_blocks in chunk_forms:
                calls.append(
                    lambda m, lin=lin, x=x[:rows], r=residual[:rows], s=super_blocks: m.tiled_linear(
                        x, lin.q, lin.dm, lin.kernel_format, 48, lin.bias, r, s
                    )
                )
        calls.append(lambda m, lin=lin: m.tiled_dequantize(lin.q, lin.dm, lin.kernel_format, 48))
    return calls


def decode_attention_calls() -> list:
    """decode_attention on float32, bfloat16, float16, int8 and fp8 e4m3 pools (fresh ones per call: the kernel writes the new K/V),
    head_dim 64 (the 512-bit loops where the host has them; query heads in groups of 3, and of 5: four scored together,
    then one) and 48 (the plain loops' tails), over sequences of odd lengths around the key blocks, past one and several
    64-key parts (attended in parts, merged)."""
    from rooftop.models.kv_cache import quantize_kv

    calls = []
    for heads, kv_heads, dim in ((9, 3, 64), (10, 2, 64), (6, 3, 48)):
        gen = torch.Generator().manual_seed(dim)
        keys, values = (
            torch.randn(640, kv_heads, dim, generator=gen) * 3,
            torch.randn(640, kv_heads, dim, generator=gen),
        )
        qkv = torch.randn(4, (heads + 2 * kv_heads) * dim, generator=gen)
        tables = torch.tensor(
            [[9, 2, 14, *[0] * 137], [5, *[0] * 139], [*range(20, 60), *[0] * 100], [*range(20, 160)]]
        )
        lengths = torch.tensor([11, 3, 151, 531])
        slots = torch.tensor([int(tables[b, (n - 1) // 4]) * 4 + (n - 1) % 4 for b, n in enumerate(lengths.tolist())])
        args = (slots, tables, lengths, 4, heads, kv_heads, dim**-0.5)
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            k16, v16 = keys.to(dtype), values.to(dtype)
            calls.append(lambda m, k=k16, v=v16, q=qkv, a=args: m.decode_attention(q, k.clone(), v.clone(), *a))
        for dtype in (torch.int8, torch.float8_e4m3fn):
            (kq, ks), (vq, vs) = quantize_kv(keys, dtype), quantize_kv(values, dtype)

            def call(m, kq=kq, ks=ks, vq=vq, vs=vs, q=qkv, a=args):
                return m.decode_attention(q, kq.clone(), vq.clone(), *a, k_scale=ks.clone(), v_scale=vs.clone())

            calls.append(call)
    return calls


@pytest.mark.slow
@pytest.mark.skipif(
    not {"avx512_vnni", "avx_vnni"} & set(open("/proc/cpuinfo").read().split()), reason="needs a CPU with VNNI"
)
def test_the_avx2_dot_products_match_vnni():
    """On a VNNI host the kernels' integer dots are one dpbusd; AVX2 hosts multiply byte pairs into int16 first
    (maddubs). Built here without VNNI (~30 s, cached), every format's tiled linear and decode attention over int8
    keys must give the same integer dots and then do the same float operations in the same order at either width:
    the same bits, and so must the dequantizations and decode attention on every pool. On an AVX-512 host the
    256-bit loops with dpbusd (hosts with AVX-VNNI and no AVX-512 run them) are built and compared too."""
    avx2 = cpu.build(f"rooftop_cpu_avx2_{cpu.sources_version()}", "-march=native -mno-avx512vnni -mno-avxvnni")
    for call in tiled_calls():
        assert torch.equal(call(avx2), call(kernels))
    gen = torch.Generator().manual_seed(21)  # bfloat16 weights: the sums in 256-bit halves, the same bits
    w, x = torch.randn(37, 2080, generator=gen).bfloat16(), torch.randn(6, 2080, generator=gen)
    assert torch.equal(avx2.bf16_linear(x, w), kernels.bf16_linear(x, w))
    w = torch.randn(37, 2080, generator=gen)  # float32 weights (a router's): their halves reordered, the same sums
    assert torch.equal(avx2.f32_linear(x, w), kernels.f32_linear(x, w))
    for call in decode_attention_calls():  # the same integer dots, and the same FMAs per output float at any width
        assert torch.equal(call(avx2), call(kernels))
    if "avx512_vnni" in open("/proc/cpuinfo").read().split():  # the 256-bit loops on dpbusd (AVX-VNNI hosts'), ~30 s
        vnni256 = cpu.build(f"rooftop_cpu_vnni256_{cpu.sources_version()}", "-march=native -mno-avx512bw")
        for call in tiled_calls():
            assert torch.equal(call(vnni256), call(kernels))


@pytest.mark.slow
@pytest.mark.skipif(
    torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"), reason="needs an x86 CPU with AVX2"
)
def test_the_streaming_read_sums_every_word_and_refuses_what_it_cannot_read():
    """The probe's read roof is timed on `stream_read`: it must read every byte it is given, as one stream or two
    per thread, on any split between threads (odd ranges too), and say what it needs."""
    data = torch.randint(0, 256, (64 * 1037,), generator=torch.Generator().manual_seed(5), dtype=torch.uint8)
    words = [int.from_bytes(data[i : i + 8].numpy().tobytes(), "little") for i in range(0, data.numel(), 8)]
    expected = sum(words) % (1 << 64)
    for lines in (1037, 1, 3):
        part = data[: 64 * lines]
        assert kernels.stream_read(part) % (1 << 64) == sum(words[: 8 * lines]) % (1 << 64)
        assert kernels.stream_read(part, 2) % (1 << 64) == sum(words[: 8 * lines]) % (1 << 64)
    assert kernels.stream_read(data, streams=2) % (1 << 64) == expected
    with pytest.raises(RuntimeError, match="streams must be 1 or 2, not 3"):
        kernels.stream_read(data, 3)
    with pytest.raises(RuntimeError, match="data must be contiguous uint8, a multiple of 64 bytes"):
        kernels.stream_read(data[:100])
    with pytest.raises(RuntimeError, match="data must be contiguous uint8"):
        kernels.stream_read(torch.zeros(64, dtype=torch.int16))


def test_the_portable_loops_match_the_vector_kernels():
    """Without AVX2 and F16C (an ARM machine, an old x86) cpu.cpp compiles to plain C++ loops: built here for
    baseline x86-64, every kernel must give what the vector code gives. At -O1 (~20 s on 2 cores, -O3's ~45): the
    loops' IEEE arithmetic is the same at any level (no -ffast-math, and ISO C++ contracts no FMAs)."""
    portable = cpu.build(f"rooftop_cpu_portable_{cpu.sources_version()}", "-march=x86-64 -O1")
    gen = torch.Generator().manual_seed(12)
    w = torch.randn(48, 224, generator=gen)
    x = torch.randn(5, 224, generator=gen)
    for same_bits in tiled_calls():  # the same integer dots and float operations in the same order as the vector loops
        assert torch.equal(same_bits(portable), same_bits(kernels))
    bf16 = w.bfloat16()  # bfloat16 weights: the same fused multiply-adds in the same order
    res = x[:, :48].contiguous()
    bias = w[1, :48].contiguous()
    assert torch.equal(portable.bf16_linear(x, bf16, bias, res), kernels.bf16_linear(x, bf16, bias, res))
    assert torch.equal(portable.f32_linear(x, w, bias, res), kernels.f32_linear(x, w, bias, res))
    states = [
        w.flatten()[: 5 * 2 * 16 * 48].reshape(5, 2, 16, 48).clone() for _ in range(2)
    ]  # the delta rule's loops, vectorized or not
    rule = (
        x[:, :32].reshape(5, 2, 16).contiguous(),
        x[:, 32:64].reshape(5, 2, 16).contiguous(),
        x[:, 64:160].reshape(5, 2, 48).contiguous(),
    )
    gates = (-x[:, 160:162].abs().contiguous(), x[:, 162:164].sigmoid().contiguous())
    slots = torch.tensor([4, 0, 3, 1, 2])
    outs = [k.delta_rule_decode(*rule, *gates, s, slots) for k, s in zip((portable, kernels), states, strict=True)]
    assert torch.equal(outs[0], outs[1]) and torch.equal(states[0], states[1])
    kept = [w.flatten()[: 5 * 128 * 3].reshape(5, 128, 3).clone() for _ in range(2)]  # and the layer's decode,
    conv = w.flatten()[:512].reshape(128, 4).contiguous()
    proj = torch.cat([x[:, :128], x[:, 128:224], x[:, :4]], dim=1)  # the channels, z, b and a
    layer = (w[2, :2].contiguous(), w[3, :2].contiguous(), w[4, :48].contiguous(), 1e-6)  # neg_a, dt_bias, norm, eps
    outs = [
        k.delta_net_decode(proj, conv, c, *layer, s, slots, 1, False)
        for k, c, s in zip((portable, kernels), kept, states, strict=True)
    ]  # whose SiLUs take exp_ps's vectors: the last bits differ, the kept inputs move the same
    torch.testing.assert_close(outs[0], outs[1], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(states[0], states[1], atol=1e-5, rtol=1e-5)
    assert torch.equal(kept[0], kept[1])
    for module_call in (
        lambda k: k.rms_norm(x, w[0], 1e-5),
        lambda k: k.silu_mul(torch.cat([x, x], dim=1)),
        lambda k: k.argmax_rows(x),
        lambda k: k.finite_rows(x),
        lambda k: torch.tensor(k.stream_read(torch.arange(64 * 40, dtype=torch.uint8))),
        lambda k: torch.tensor(k.stream_read(torch.arange(64 * 41, dtype=torch.uint8), 2)),
    ):
        torch.testing.assert_close(module_call(portable), module_call(kernels), atol=1e-4, rtol=1e-4)
    qkv = torch.randn(2, (4 + 2 * 2) * 16, generator=gen)
    cos, sin = torch.randn(8, 16, generator=gen), torch.randn(8, 16, generator=gen)
    rotated = [qkv.clone(), qkv.clone()]
    for k, out in zip((portable, kernels), rotated, strict=False):
        k.rope_(
            out,
            6,
            16,
            torch.tensor([3, 5]),
            cos,
            sin,
            torch.randn(6, 16, generator=torch.Generator().manual_seed(1)),
            1e-6,
        )
    torch.testing.assert_close(rotated[0], rotated[1])
    turned = rotated[1].clone()
    for k, out in zip((portable, kernels), rotated, strict=False):  # partial RoPE: the first 8 of 16 dims
        k.rope_(out, 6, 16, torch.tensor([3, 5]), cos[:, :8].contiguous(), sin[:, :8].contiguous(), None, 1e-6)
    torch.testing.assert_close(rotated[0], rotated[1])
    heads = turned.view(2, 8, 16)[:, :6]  # models/rope.py's rotate-half on the first 8 dims, the others as they were
    expected = torch.cat([apply_rope(heads[..., :8], cos[[3, 5], None, :8], sin[[3, 5], None, :8]), heads[..., 8:]], -1)
    torch.testing.assert_close(rotated[1].view(2, 8, 16)[:, :6], expected)
    pools = [
        (
            torch.randn(64, 2, 16, generator=torch.Generator().manual_seed(2)),
            torch.randn(64, 2, 16, generator=torch.Generator().manual_seed(3)),
        )
        for _ in range(2)
    ]
    args = (torch.tensor([21, 40]), torch.tensor([[0, 1], [2, 0]]), torch.tensor([22, 9]), 16, 4, 2, 0.25)
    attended = [k.decode_attention(qkv, kp, vp, *args) for k, (kp, vp) in zip((portable, kernels), pools, strict=False)]
    torch.testing.assert_close(attended[0], attended[1], atol=1e-5, rtol=1e-5)
    norms = (torch.randn(16, generator=gen), torch.randn(16, generator=gen))
    gated = [  # a gated attention layer's decodes from its projection: per head q then its gate, then k and v
        k.gated_decode_attention(
            torch.randn(2, 12 * 16, generator=torch.Generator().manual_seed(4)),
            *norms,
            torch.tensor([3, 5]),  # positions in the 8-row tables
            cos[:, :8].contiguous(),
            sin[:, :8].contiguous(),
            1e-6,
            kp,
            vp,
            *args,
        )
        for k, (kp, vp) in zip((portable, kernels), pools, strict=False)
    ]
    torch.testing.assert_close(gated[0], gated[1], atol=1e-5, rtol=1e-5)
    for call in decode_attention_calls():  # the same integer dots on int8 pools; softmax's exp differs in the last bits
        torch.testing.assert_close(call(portable), call(kernels), atol=1e-5, rtol=1e-5)
    q, keys = torch.randn(40, 4, 32, generator=gen), torch.randn(2, 90, 2, 32, generator=gen)
    chunks = [k.prefill_attention(q, keys[0], keys[1], 50, 32**-0.5) for k in (portable, kernels)]
    torch.testing.assert_close(chunks[0], chunks[1], atol=1e-5, rtol=1e-5)


def test_argmax_rows_is_torch_argmax_with_ties_infinities_and_nans():
    """Greedy decoding's pick: the first of equal maxima, all -inf gives 0, a NaN wins (the first one), any width."""
    gen = torch.Generator().manual_seed(5)
    rows = torch.randn(6, 1003, generator=gen)
    rows[1, 17] = rows[1, 900] = rows[1].max() + 1  # a tie: the first index
    rows[2] = float("-inf")
    rows[3, 5], rows[3, 700] = float("inf"), float("inf")
    rows[4, 999], rows[4, 12] = float("nan"), float("nan")
    rows[5, 1002] = 50.0  # in the scalar tail
    assert kernels.argmax_rows(rows).tolist() == rows.argmax(-1).tolist() == [int(rows[0].argmax()), 17, 0, 5, 12, 1002]
    for width in (1, 7, 8, 9, 49152):
        x = torch.randn(3, width, generator=gen)
        assert torch.equal(kernels.argmax_rows(x), x.argmax(-1))


def test_finite_rows_is_torch_isfinite_all_at_any_width():
    """The check before sampling: a NaN, +inf or -inf anywhere (the scalar tail too) makes a row non-finite; finite
    values however large do not, where a row's sum overflows to inf (the check it replaced flagged those)."""
    gen = torch.Generator().manual_seed(6)
    rows = torch.randn(7, 1003, generator=gen)
    rows[1, 17] = float("nan")
    rows[2, 500] = float("inf")
    rows[3, 0] = float("-inf")
    rows[4, 1002] = float("nan")  # in the scalar tail
    rows[5] = 3e38  # finite; its sum is inf
    rows[6, :] = -0.0
    expected = [True, False, False, False, False, True, True]
    assert kernels.finite_rows(rows).tolist() == torch.isfinite(rows).all(-1).tolist() == expected
    assert not torch.isfinite(rows[5].sum())
    for width in (1, 7, 8, 9, 49152):
        x = torch.randn(3, width, generator=gen)
        x[1, width - 1] = float("inf")
        assert kernels.finite_rows(x).tolist() == [True, False, True]


def test_a_build_killed_midway_leaves_no_lock_that_hangs_the_next_start():
    """PyTorch's build lock is a file that only the process that made it deletes: a first start of rooftop killed
    while it compiled the kernels left it, and every later start waited on it for ever, saying nothing. A start now
    finds it under rooftop's own lock (one the OS frees when its holder dies), removes it, says so and goes on."""
    import subprocess
    import sys

    if cpu.ops() is None:
        pytest.skip("rooftop's CPU kernels do not build here")
    directory = cpu.build_directory(cpu.ops().__name__)
    with cpu.build_lock(directory):  # what a build killed inside PyTorch's lock leaves behind
        (directory / "lock").touch()
    start = [sys.executable, "-c", "from rooftop.kernels import cpu; assert cpu.ops() is not None"]
    done = subprocess.run(start, capture_output=True, text=True, timeout=600)  # a hang, not a race: the build is done
    assert done.returncode == 0, done.stderr
    assert "left by an interrupted build" in done.stderr and not (directory / "lock").exists()


def test_a_start_runs_the_ninja_package_whatever_other_ninja_path_finds_first(tmp_path):
    """Two ninja versions (the package's in .venv/bin, a system one) keep build logs the other cannot read: a start
    from an activated shell and one from .venv/bin/python each compiled every kernel again (~45 s, shown as the
    model's load). A start must run the package's ninja even with another first on PATH (here one that fails and
    leaves a mark)."""
    import os
    import subprocess
    import sys

    pytest.importorskip("ninja")
    if cpu.ops() is None:
        pytest.skip("rooftop's CPU kernels do not build here")
    mark = tmp_path / "ran"
    other = tmp_path / "bin" / "ninja"
    other.parent.mkdir()
    other.write_text(f"#!/bin/sh\ntouch {mark}\nexit 1\n")
    other.chmod(0o755)
    env = {**os.environ, "PATH": f"{other.parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    start = [sys.executable, "-c", "from rooftop.kernels import cpu; assert cpu.ops() is not None"]
    done = subprocess.run(start, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr
    assert not mark.exists()


def test_two_checkouts_with_the_same_sources_build_apart(tmp_path, monkeypatch):
    """ninja names each source by its path: two checkouts (or environments) of the same sources built in one folder
    found each other's build out of date, and each switch compiled every kernel again. Each sources' folder builds in
    its own; the same folder, however named, in the same one."""
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    here = cpu.build_directory("rooftop_cpu_x")
    assert here == cpu.build_directory("rooftop_cpu_x", cpu.SOURCES[0].parent / ".." / "kernels")
    assert here != cpu.build_directory("rooftop_cpu_x", tmp_path / "another" / "kernels")
    assert here.parent.parent == tmp_path and here.name.startswith("rooftop_cpu_x-")


def test_a_start_says_when_it_compiles_the_kernels_and_when_it_waits_for_another_that_does(
    tmp_path, monkeypatch, capsys
):
    """The first start on a machine compiles for tens of seconds, and a second start meanwhile waits on the first:
    each says so on stderr instead of sitting silent; a start with the module built says nothing."""
    import subprocess
    import sys
    import threading
    import time

    from torch.utils import cpp_extension

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setattr(cpp_extension, "load", lambda **kwargs: kwargs["name"])  # the compiler is not what is tested
    assert cpu.build("rooftop_cpu_test", "-march=native") == "rooftop_cpu_test"
    assert "compiling its CPU kernels for this machine" in capsys.readouterr().err
    (cpu.build_directory("rooftop_cpu_test") / "rooftop_cpu_test.so").touch()
    cpu.build("rooftop_cpu_test", "-march=native")
    assert capsys.readouterr().err == ""

    directory = cpu.build_directory("rooftop_cpu_waits")
    script = f"from pathlib import Path; from rooftop.kernels import cpu\nwith cpu.build_lock(Path({str(directory)!r})): pass"
    with cpu.build_lock(directory):
        waiter = subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE, text=True)
        said: list[str] = []
        reader = threading.Thread(target=lambda: said.extend(iter(waiter.stderr.readline, "")), daemon=True)
        reader.start()
        deadline = time.monotonic() + 600  # a hang detector, not a race: the waiter blocks until this lock goes
        while not any("waiting for another process" in line for line in said):
            assert waiter.poll() is None and time.monotonic() < deadline, said
            reader.join(0.05)
    assert waiter.wait(timeout=600) == 0, said


def test_a_short_wait_on_anothers_lock_says_nothing(tmp_path, monkeypatch, capsys):
    """Every rank of a tensor-parallel group checks the build is up to date under the lock, about a second each:
    each start printed "waiting for another process that is compiling" though nothing compiled. A wait within the
    quiet window (made long here, so the test holds the lock well inside it) is silent."""
    import threading

    monkeypatch.setattr(cpu, "QUIET_WAIT_S", 600.0)
    directory = tmp_path / "rooftop_cpu_quiet"
    held, release = threading.Event(), threading.Event()

    def hold():
        with cpu.build_lock(directory):
            held.set()
            release.wait(600)

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    held.wait(600)
    threading.Timer(0.2, release.set).start()
    with cpu.build_lock(directory):  # a second open file: flock makes it wait for the holder's
        pass
    holder.join(600)
    assert "waiting for another process" not in capsys.readouterr().err
