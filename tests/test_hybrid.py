"""Qwen3.5 (Gated DeltaNet + gated attention) in the engine: the delta rule's two forms against each other and
against transformers' reference functions, a tiny random checkpoint saved by transformers run as transformers runs
it (logits, greedy tokens, chunk continuations), batched as alone under chunked prefill and preemption, and its
state beside the KV cache."""

from pathlib import Path

import pytest
import torch
from test_batch_invariance import POOL, assert_batch_invariant
from test_decode_call import both_ways, outputs, sampling
from test_hf_models import PROMPT, save_random
from test_moe import assert_greedy_as_transformers, rooftop_logits
from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig, Qwen3NextConfig, Qwen3NextForCausalLM
from transformers.models.qwen3_5 import modeling_qwen3_5 as reference_rules

from rooftop import LLM
from rooftop.config import EngineConfig
from rooftop.engine.llm_engine import LLMEngine
from rooftop.enums import Phase
from rooftop.errors import ModelLoadError
from rooftop.loading.model_files import load_model
from rooftop.models import delta_net
from rooftop.models.hybrid import DeltaNetBlock, GatedAttentionBlock
from rooftop.models.kv_cache import KVCache
from rooftop.models.loader import build_model

CONFIG = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=4,  # three Gated DeltaNet layers, then one gated attention layer
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    vocab_size=320,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=16,
    linear_value_head_dim=16,
    max_position_embeddings=1024,
)


def random_rule_inputs(T: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    H, dk, dv = 4, 16, 24
    q, k = torch.randn(T, H, dk, generator=gen), torch.randn(T, H, dk, generator=gen)
    v = torch.randn(T, H, dv, generator=gen)
    g, beta = -torch.rand(T, H, generator=gen), torch.rand(T, H, generator=gen)
    return q, k, v, g, beta, torch.randn(H, dk, dv, generator=gen) * 0.1


@pytest.mark.parametrize("T", [1, 63, 64, 150])
def test_the_chunked_rule_is_the_recurrent_rule_and_transformers(T):
    q, k, v, g, beta, s0 = random_rule_inputs(T)
    qn, kn = delta_net.l2norm(q) * q.shape[-1] ** -0.5, delta_net.l2norm(k)
    out, state = delta_net.chunked(qn, kn, v, g, beta, s0)
    out_r, state_r = delta_net.recurrent(qn, kn, v, g, beta, s0)
    torch.testing.assert_close(out, out_r, atol=2e-6, rtol=1e-5)
    torch.testing.assert_close(state, state_r, atol=2e-6, rtol=1e-5)
    ref, ref_state = reference_rules.torch_chunk_gated_delta_rule(
        *(x[None] for x in (q, k, v, g, beta)),
        initial_state=s0[None],
        output_final_state=True,
        use_qk_l2norm_in_kernel=True,
    )
    torch.testing.assert_close(out, ref[0], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(state, ref_state[0], atol=1e-6, rtol=1e-5)


def test_a_batch_of_one_token_sequences_is_each_alone():
    q, k, v, g, beta, _ = random_rule_inputs(5, seed=1)
    states = torch.randn(5, 4, 16, 24, generator=torch.Generator().manual_seed(2))
    out, new = delta_net.recurrent(q, k, v, g, beta, states)
    for b in range(5):
        one, state = delta_net.recurrent(
            q[b : b + 1], k[b : b + 1], v[b : b + 1], g[b : b + 1], beta[b : b + 1], states[b]
        )
        assert torch.equal(out[b], one[0]) and torch.equal(new[b], state)


def test_the_decode_kernel_updates_each_state_in_place_as_the_rule_does():
    """kernels/delta_rule.cpp: a step's decodes, each state read and written in place at its pool slot; the rule's
    outputs and states within float32 rounding over steps, the other slots untouched, a sequence's bits the same
    alone or among others, and a slot outside the pool refused."""
    from rooftop.kernels import cpu

    kernels = cpu.ops()
    if kernels is None:
        pytest.skip("rooftop's CPU kernels did not build on this machine")
    gen = torch.Generator().manual_seed(3)
    pool = torch.randn(4, 4, 16, 24, generator=gen) * 0.1
    reference, slots = pool.clone(), torch.tensor([3, 1])
    for step in range(6):
        q, k, v, g, beta, _ = random_rule_inputs(2, seed=10 + step)
        q, k = delta_net.l2norm(q) * 16**-0.5, delta_net.l2norm(k)
        out = kernels.delta_rule_decode(q, k, v, g, beta, pool, slots)
        expected, reference[slots] = delta_net.recurrent(q, k, v, g, beta, reference[slots])
        torch.testing.assert_close(out, expected, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(pool, reference, atol=1e-6, rtol=1e-5)
    assert torch.equal(pool[[0, 2]], reference[[0, 2]])
    alone, together = pool.clone(), pool.clone()
    one = kernels.delta_rule_decode(q[:1], k[:1], v[:1], g[:1], beta[:1], alone, slots[:1])
    both = kernels.delta_rule_decode(q, k, v, g, beta, together, slots)
    assert torch.equal(one[0], both[0]) and torch.equal(alone[3], together[3])
    with pytest.raises(RuntimeError, match="slot 4 is outside the pool's 4"):
        kernels.delta_rule_decode(q, k, v, g, beta, pool, torch.tensor([4, 0]))
    with pytest.raises(RuntimeError, match="slot 1 given twice"):
        kernels.delta_rule_decode(q, k, v, g, beta, pool, torch.tensor([1, 1]))


@pytest.mark.parametrize(("tiled", "width"), [(False, 4), (True, 4), (False, 1)])
def test_the_layer_decode_kernel_is_pytorchs_form_in_one_call(tiled, width):
    """kernels/delta_rule.cpp's delta_net_decode: a step's decodes from a layer's fused projection (a strided view of
    its rows, as the layer passes them) through the gates, the convolution, SiLU, the heads, the rule and the gated
    RMSNorm, the kept inputs and states updated in place at their slots: within float32 rounding of PyTorch's form
    (TorchOps) over six steps, the other slots untouched, a row's bits the same alone, and bad inputs refused before
    anything moves."""
    from rooftop.config import LinearAttention
    from rooftop.kernels import cpu
    from rooftop.models.ops import TorchOps

    kernels = cpu.ops()
    if kernels is None:
        pytest.skip("rooftop's CPU kernels did not build on this machine")
    la = LinearAttention(num_key_heads=2, num_value_heads=4, key_head_dim=16, value_head_dim=24, conv_kernel_dim=width)
    gen = torch.Generator().manual_seed(5)
    conv = torch.randn(la.conv_channels, la.conv_kernel_dim, generator=gen) * 0.5
    neg_a, dt_bias = -torch.rand(4, generator=gen).exp(), torch.randn(4, generator=gen)
    norm = 1 + torch.randn(24, generator=gen) * 0.2
    block = DeltaNetBlock(
        None, None, conv, neg_a, dt_bias, norm, *[None] * 3, shapes=la, index=0, eps=1e-6, tiled=tiled
    )
    conv_pool = torch.randn(5, la.conv_channels, la.conv_kernel_dim - 1, generator=gen)
    pool = torch.randn(5, 4, 16, 24, generator=gen) * 0.1
    conv_ref, ref, slots = conv_pool.clone(), pool.clone(), torch.tensor([3, 0])
    torch_ops = TorchOps(None, None, None)
    width = la.conv_channels + 4 * 24 + 2 * 4  # the channels, z, b and a

    def call(proj, conv_states, states, rows=slots, heads=2, a=neg_a, bias=dt_bias):
        return kernels.delta_net_decode(proj, conv, conv_states, a, bias, norm, 1e-6, states, rows, heads, tiled)

    for _ in range(6):
        proj = torch.randn(2, width + 7, generator=gen)[:, 3 : 3 + width]  # a strided view
        proj[:, -8:] *= 4  # b and a across the sigmoid's and softplus's range (softplus is linear past 20)
        proj[0, -1] = 30.0
        out = call(proj, conv_pool, pool)
        expected = torch_ops.delta_net_decode(block, proj, conv_ref, ref, slots)
        assert out.shape == (2, 4 * 24)
        torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-4)
    assert torch.equal(conv_pool, conv_ref)  # the kept inputs are moved, not computed
    torch.testing.assert_close(pool, ref, atol=1e-5, rtol=1e-4)
    assert torch.equal(pool[[1, 2, 4]], ref[[1, 2, 4]])
    alone = [conv_pool.clone(), pool.clone()]
    one = call(proj[:1], alone[0], alone[1], slots[:1])
    both = call(proj, conv_pool, pool)
    assert torch.equal(one[0], both[0]) and torch.equal(alone[1][3], pool[3]) and torch.equal(alone[0][3], conv_pool[3])
    before = conv_pool.clone()
    with pytest.raises(RuntimeError, match="slot 5 is outside the pool's 5"):
        call(proj, conv_pool, pool, torch.tensor([0, 5]))
    with pytest.raises(RuntimeError, match="channels must be q and k of 4 key heads"):
        call(proj, conv_pool, pool, heads=4)
    with pytest.raises(RuntimeError, match=f"proj must hold {la.conv_channels} channels"):
        call(proj[:, :-1], conv_pool, pool)
    with pytest.raises(RuntimeError, match="neg_a and dt_bias must be contiguous float32"):
        call(proj, conv_pool, pool, bias=dt_bias[:3])
    with pytest.raises(RuntimeError, match="slot 3 is outside the pool's 3"):
        call(proj, conv_pool, pool[:3])
    assert torch.equal(conv_pool, before)


def test_the_layer_decode_kernel_gives_each_row_its_bits_on_any_number_of_threads():
    """Past 512 channels the convolution's SiLU is split over the threads in runs of 512: 656 channels give the same
    bits on one thread and on two, a row the same alone as in a batch of three, within float32 rounding of
    PyTorch's form."""
    from rooftop.config import LinearAttention
    from rooftop.kernels import cpu
    from rooftop.models.ops import TorchOps

    kernels = cpu.ops()
    if kernels is None:
        pytest.skip("rooftop's CPU kernels did not build on this machine")
    la = LinearAttention(num_key_heads=2, num_value_heads=4, key_head_dim=64, value_head_dim=100, conv_kernel_dim=4)
    assert la.conv_channels == 656
    gen = torch.Generator().manual_seed(9)
    conv = torch.randn(656, 4, generator=gen) * 0.5
    neg_a, dt_bias, norm = -torch.rand(4, generator=gen).exp(), torch.randn(4, generator=gen), torch.rand(100) + 0.5
    block = DeltaNetBlock(None, None, conv, neg_a, dt_bias, norm, *[None] * 3, shapes=la, index=0, eps=1e-6)
    proj = torch.randn(3, 656 + 400 + 8, generator=gen)
    kept, states = torch.randn(3, 656, 3, generator=gen), torch.randn(3, 4, 64, 100, generator=gen) * 0.1
    slots = torch.tensor([2, 0, 1])

    def call(rows: slice, threads: int) -> tuple:
        pools = kept.clone(), states.clone()
        saved = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            out = kernels.delta_net_decode(
                proj[rows], conv, pools[0], neg_a, dt_bias, norm, 1e-6, pools[1], slots[rows], 2
            )
        finally:
            torch.set_num_threads(saved)
        return out, *pools

    one, two = call(slice(None), 1), call(slice(None), 2)
    assert all(torch.equal(a, b) for a, b in zip(one, two, strict=True))
    alone = call(slice(1, 2), 2)
    assert torch.equal(alone[0][0], two[0][1]) and torch.equal(alone[2][0], two[2][0])
    expected = TorchOps(None, None, None).delta_net_decode(block, proj, kept.clone(), states.clone(), slots)
    torch.testing.assert_close(two[0], expected, atol=1e-5, rtol=1e-4)


def test_the_gated_attention_kernel_is_pytorchs_form_in_one_call():
    """kernels/attention.cpp's gated_decode_attention: a step's decodes from a gated attention layer's fused
    projection (a strided view of its rows; per head q then its gate) through the q/k norms, RoPE on the first 8 of
    16 dims, decode attention over the paged pool and the output gate: within float32 rounding of PyTorch's form
    (GatedAttentionBlock.project, decode_attention on its q, k and v, GatedAttentionBlock.gated), the new K/V in the
    pool likewise, a row's bits the same alone, and a bad width or position refused."""
    from rooftop.kernels import cpu

    kernels = cpu.ops()
    if kernels is None:
        pytest.skip("rooftop's CPU kernels did not build on this machine")
    gen = torch.Generator().manual_seed(8)
    angles = torch.rand(64, 4, generator=gen) * 6
    cos, signed_sin = torch.cat([angles.cos()] * 2, 1), torch.cat([-angles.sin(), angles.sin()], 1)
    q_norm, k_norm = 1 + torch.randn(16, generator=gen) * 0.2, 1 + torch.randn(16, generator=gen) * 0.2
    block = GatedAttentionBlock(*[None] * 3, q_norm, k_norm, *[None] * 2, cos, signed_sin, 4, 2, 16, 1e-6)
    proj = torch.randn(2, (2 * 4 + 2 * 2) * 16 + 5, generator=gen)[:, 5:]  # a strided view
    positions = torch.tensor([21, 8])
    pools = [torch.randn(64, 2, 16, generator=gen) for _ in range(2)]
    ref_pools = [p.clone() for p in pools]
    steps = (torch.tensor([21, 40]), torch.tensor([[0, 1], [2, 0]]), positions + 1, 16, 4, 2, 0.25)

    def call(rows=slice(None), at=positions, kv=pools, width=proj.shape[1]):
        step = (steps[0][rows], steps[1][rows], steps[2][rows], *steps[3:])
        args = (block.q_norm, block.k_norm, at[rows], cos, signed_sin, 1e-6, *kv, *step)
        return kernels.gated_decode_attention(proj[rows, :width], *args)

    q, k, v, gate = block.project(proj, positions)
    attended = kernels.decode_attention(torch.cat([t.flatten(1) for t in (q, k, v)], 1), *ref_pools, *steps)
    expected = block.gated(attended, gate)
    out = call()
    assert out.shape == (2, 64)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-4)
    for pool, ref in zip(pools, ref_pools, strict=True):
        torch.testing.assert_close(pool, ref, atol=1e-5, rtol=1e-5)
    alone = [p.clone() for p in pools]
    assert torch.equal(call(slice(1, 2), kv=alone)[0], call()[1])
    before = [p.clone() for p in pools]
    with pytest.raises(RuntimeError, match="proj width must be .* = 192, got 191"):
        call(width=191)
    with pytest.raises(RuntimeError, match="position 64 is past the RoPE table"):
        call(at=torch.tensor([64, 8]))
    assert all(torch.equal(p, b) for p, b in zip(pools, before, strict=True))  # refused before anything is written


def test_a_state_pool_holds_memory_only_for_the_slots_written():
    """Qwen3.6-27B's 64 state slots are 9.7 GB: on the CPU the pool reads as zeros and takes memory as slots are
    written, not all at the start."""
    from test_dummy_weights import rss_bytes

    from rooftop.loading.dummy import load_dummy
    from rooftop.models.kv_cache import StatePool

    config = load_dummy("qwen3.6-27b", "auto", torch.device("meta"), torch.bfloat16).config
    before = rss_bytes()
    pool = StatePool(config, 64, torch.device("cpu"))
    assert pool.nbytes > 9e9 and rss_bytes() - before < 1 << 28
    pool.recurrent[:, 5].fill_(1.0)  # one sequence's slot in every layer: ~150 MB
    grown = rss_bytes() - before
    assert 1 << 27 < grown < 1 << 29
    assert pool.recurrent[0, 4].abs().sum() == 0 and pool.conv[3, 63].abs().sum() == 0


def test_the_convolution_carries_its_state_across_pieces():
    gen = torch.Generator().manual_seed(3)
    x, weight = torch.randn(20, 8, generator=gen), torch.randn(8, 4, generator=gen)
    whole, _ = delta_net.causal_conv(x, weight, torch.zeros(8, 3))
    first, state = delta_net.causal_conv(x[:7], weight, torch.zeros(8, 3))
    rest, _ = delta_net.causal_conv(x[7:], weight, state)
    torch.testing.assert_close(torch.cat([first, rest]), whole)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> tuple[Path, Qwen3_5ForCausalLM]:
    torch.manual_seed(0)
    model = Qwen3_5ForCausalLM(Qwen3_5TextConfig(**CONFIG)).eval()
    return save_random(model, tmp_path_factory.mktemp("qwen3_5")), model


def test_logits_match_transformers_and_chunks_continue_the_state(tiny):
    path, reference = tiny
    ids = load_model(path).tokenizer.encode(PROMPT) * 3  # 150 tokens: the delta rule's 64-token chunks and a rest
    with torch.inference_mode():
        expected = reference(torch.tensor([ids])).logits[0]
    model = build_model(load_model(path), torch.float32, "cpu", "float")
    assert [type(b) for b in model.layers] == [DeltaNetBlock] * 3 + [GatedAttentionBlock]
    cache = KVCache(model.config, capacity=len(ids), dtype=torch.float32, device="cpu")
    with torch.inference_mode():
        whole = model.logits(model.forward(torch.tensor(ids), cache, 0))
        assert (whole[-1] - expected[-1]).abs().max().item() < 1e-4
        cache = KVCache(model.config, capacity=len(ids), dtype=torch.float32, device="cpu")
        model.forward(torch.tensor(ids[:70]), cache, 0)  # a chunk, then another from the state it left
        model.forward(torch.tensor(ids[70:100]), cache, 70)
        steps = [
            model.logits(model.forward(torch.tensor([t]), cache, i, Phase.DECODE))
            for i, t in enumerate(ids)
            if i >= 100
        ]
    torch.testing.assert_close(torch.cat(steps), expected[100:], atol=2e-4, rtol=1e-4)


def test_greedy_tokens_match_transformers(tiny):
    assert_greedy_as_transformers(*tiny)


@pytest.mark.parametrize("weights", ["float", "int8"])
def test_batched_requests_get_what_they_get_alone(tiny, weights):
    """Chunks of several lengths (a 300-token prompt in two chunks), decodes and a tight budget share steps; then a
    pool too small for all: the latest arrivals are preempted, their slots given back, and recomputed."""
    assert_batch_invariant(LLM(model=str(tiny[0]), weights=weights), preempt=True)


@pytest.fixture(scope="module")
def tiny8(tmp_path_factory) -> Path:
    """Eight layers: DeltaNet layers 4-6 are the state pools' 3-5, and two attention layers hold KV pools."""
    torch.manual_seed(2)
    model = Qwen3_5ForCausalLM(Qwen3_5TextConfig(**CONFIG | {"num_hidden_layers": 8})).eval()
    return save_random(model, tmp_path_factory.mktemp("qwen3_5_8"))


@pytest.mark.parametrize(("weights", "kv"), [("int8", "auto"), ("int4", "int8"), ("int8", "fp8_e4m3")])
def test_a_step_of_decodes_runs_in_one_call_with_the_layer_by_layer_bits(tiny8, weights, kv, monkeypatch):
    """Where every linear runs in tiles, a step of decodes runs its gated attention and Gated DeltaNet layers in one
    call (kernels/decode.cpp), each DeltaNet layer from its place in the state pools and each attention layer from
    its KV pool (an int8 or fp8 one with its scales): the tokens and logprobs of layer by layer, greedy and seeded,
    three sequences of different lengths; a step the call refuses moves no state."""
    llm = LLM(model=str(tiny8), weights=weights, kv_cache_dtype=kv)
    one_call, layered, calls = both_ways(llm, lambda m: outputs(m, sampling()), monkeypatch)
    assert one_call == layered and calls == 11
    model, pool = llm.engine.model, llm.engine._pool
    before = pool.states.conv.clone(), pool.states.recurrent.clone()
    x = torch.zeros(1, CONFIG["hidden_size"])
    with pytest.raises(RuntimeError, match="position 1024 is past the RoPE table"):
        model.decode_call.layers.run(
            x, torch.tensor([1024]), torch.tensor([0]), torch.zeros(1, 1, dtype=torch.int64), torch.tensor([1]), 16,
            *pool.kernel_layers, None, None, pool.states.conv, pool.states.recurrent, torch.tensor([0]),
        )  # fmt: skip
    assert torch.equal(pool.states.conv, before[0]) and torch.equal(pool.states.recurrent, before[1])


def test_prefix_caching_is_off_and_the_state_is_constant_in_the_context(tiny):
    llm = LLM(model=str(tiny[0]), weights="float")
    engine = LLMEngine(llm.model, llm.tokenizer, EngineConfig(max_num_seqs=4, **POOL))
    assert not engine.config.enable_prefix_caching
    states = engine._pool.states
    # per sequence and linear layer: 4 value heads of 16 x 16 float32, and the convolution's last 3 of 128 inputs
    assert states.recurrent.shape == (3, 4, 4, 16, 16) and states.conv.shape == (3, 4, 128, 3)
    assert engine._pool.k.shape[0] == 1  # the KV pool holds the one full-attention layer


def test_bad_hybrid_inputs_are_named(tiny, tmp_path):
    with pytest.raises(
        ModelLoadError, match=r"config\.json: .*unknown layer types in \['linear_attention', 'sliding_attention'\]"
    ):
        Qwen3_5TextConfig(**CONFIG, layer_types=["linear_attention", "sliding_attention"] * 2).save_pretrained(tmp_path)
        load_model(tmp_path)
    path, _ = tiny
    from safetensors.torch import load_file, save_file

    broken = tmp_path / "broken"
    broken.mkdir()
    tensors = load_file(path / "model.safetensors")
    del tensors["model.layers.1.linear_attn.A_log"]
    save_file(tensors, broken / "model.safetensors")
    for name in ("config.json", "tokenizer.json"):
        (broken / name).write_bytes((path / name).read_bytes())
    with pytest.raises(ModelLoadError, match=r"no tensor model\.layers\.1\.linear_attn\.A_log"):
        build_model(load_model(broken), torch.float32, "cpu", "float")


def test_a_multimodal_checkpoint_runs_its_text_model_and_says_what_it_left_out(tiny, tmp_path):
    """Qwen3_5ForConditionalGeneration's layout: the language model under model.language_model., a vision tower
    and an MTP layer beside it, the text config under text_config."""
    import json

    from safetensors.torch import load_file, save_file

    path, _ = tiny
    tensors = {
        (name.replace("model.", "model.language_model.", 1) if name.startswith("model.") else name): t
        for name, t in load_file(path / "model.safetensors").items()
    }
    tensors |= {"model.visual.patch_embed.proj.weight": torch.zeros(4, 4), "mtp.fc.weight": torch.zeros(4, 4)}
    save_file(tensors, tmp_path / "model.safetensors")
    text = json.loads((path / "config.json").read_text())
    wrapper = {"architectures": ["Qwen3_5ForConditionalGeneration"], "text_config": text, "vision_config": {}}
    (tmp_path / "config.json").write_text(json.dumps(wrapper))
    (tmp_path / "tokenizer.json").write_bytes((path / "tokenizer.json").read_bytes())
    loaded = load_model(tmp_path)
    assert loaded.notes == ["text model only: 2 tensors of the vision tower and multi-token prediction not read"]
    ids = list(range(5, 40))
    assert torch.equal(rooftop_logits(tmp_path, ids), rooftop_logits(path, ids))


NEXT = dict(
    CONFIG,
    moe_intermediate_size=32,
    shared_expert_intermediate_size=64,
    num_experts=8,
    num_experts_per_tok=2,
    norm_topk_prob=True,
)


@pytest.fixture(scope="module")
def tiny_next(tmp_path_factory) -> tuple[Path, Qwen3NextForCausalLM]:
    torch.manual_seed(1)
    model = Qwen3NextForCausalLM(Qwen3NextConfig(**NEXT)).eval()
    return save_random(model, tmp_path_factory.mktemp("qwen3_next"), seed=1), model


def test_qwen3_next_matches_transformers(tiny_next):
    """Its DeltaNet projections grouped by key head (reordered at load), its experts with a gated shared expert."""
    path, reference = tiny_next
    ids = load_model(path).tokenizer.encode(PROMPT) * 2
    with torch.inference_mode():
        expected = reference(torch.tensor([ids])).logits[0, -1]
    model = build_model(load_model(path), torch.float32, "cpu", "float")
    assert model.layers[0].mlp.shared is not None
    cache = KVCache(model.config, capacity=len(ids), dtype=torch.float32, device="cpu")
    with torch.inference_mode():
        got = model.logits(model.forward(torch.tensor(ids), cache, 0))[-1]
    assert (got - expected).abs().max().item() < 1e-4
    assert_greedy_as_transformers(path, reference)


def test_qwen3_next_batched_requests_get_what_they_get_alone(tiny_next):
    assert_batch_invariant(LLM(model=str(tiny_next[0]), weights="int8"), preempt=False)


@pytest.mark.parametrize("weights", ["int8", "int4"])
def test_qwen3_next_decodes_in_one_call_with_the_layer_by_layer_bits(tiny_next, weights, monkeypatch):
    """Qwen3-Next's layers in the one call: its DeltaNet and gated attention layers, the experts and the shared
    expert scaled by the sigmoid of its gate, each token and logprob as layer by layer."""
    llm = LLM(model=str(tiny_next[0]), weights=weights)
    assert llm.engine.model.layers[0].mlp.shared is not None
    one_call, layered, calls = both_ways(llm, lambda m: outputs(m, sampling()), monkeypatch)
    assert one_call == layered and calls == 11


def tiled(x: torch.Tensor, dim: int, key_heads: int, head_dim: int) -> torch.Tensor:
    """llama.cpp's converter's value-head order: grouped by key head [G0v0, G0v1, G1v0, ...] to tiled
    [G0v0, G1v0, G0v1, ...] along `dim`."""
    shape = list(x.shape)
    per_key = shape[dim] // key_heads // head_dim
    x = x.reshape(*shape[:dim], key_heads, per_key, head_dim, *shape[dim + 1 :])
    return x.transpose(dim, dim + 1).reshape(shape)


def write_hybrid_gguf(path: Path, model, arch: str = "qwen35") -> Path:
    """The checkpoint as llama.cpp's convert_hf_to_gguf.py writes a Qwen3.5 (`qwen35`) or a Qwen3-Next
    (`qwen3next`): norms stored plus one, A_log as -exp(A_log), the convolution squeezed; Qwen3.5's DeltaNet value
    heads tiled, Qwen3-Next's in_proj_qkvz split into q, k, v and z, its experts stacked; F32; a byte-level
    vocabulary."""
    import gguf
    import numpy as np
    from gguf_factory import SPECIALS, byte_tokens

    c = model.config
    hk, hv, dk, dv = c.linear_num_key_heads, c.linear_num_value_heads, c.linear_key_head_dim, c.linear_value_head_dim
    w = gguf.GGUFWriter(str(path), arch)
    rotary = int(c.head_dim * c.rope_parameters["partial_rotary_factor"])
    keys = [
        (w.add_block_count, c.num_hidden_layers),
        (w.add_context_length, c.max_position_embeddings),
        (w.add_embedding_length, c.hidden_size),
        (w.add_feed_forward_length, c.intermediate_size),
        (w.add_head_count, c.num_attention_heads),
        (w.add_head_count_kv, c.num_key_value_heads),
        (w.add_key_length, c.head_dim),
        (w.add_value_length, c.head_dim),
        (w.add_layer_norm_rms_eps, c.rms_norm_eps),
        (w.add_rope_freq_base, float(c.rope_parameters["rope_theta"])),
        (w.add_rope_dimension_count, rotary),
        (w.add_ssm_conv_kernel, c.linear_conv_kernel_dim),
        (w.add_ssm_state_size, dk),
        (w.add_ssm_group_count, hk),
        (w.add_ssm_time_step_rank, hv),
        (w.add_ssm_inner_size, hv * dv),
        (w.add_full_attention_interval, 4),
    ]
    if arch == "qwen35":
        keys.append((w.add_rope_dimension_sections, [rotary // 4, rotary // 4, 0, 0]))  # text positions: any split
    else:
        keys += [
            (w.add_expert_count, c.num_experts),
            (w.add_expert_used_count, c.num_experts_per_tok),
            (w.add_expert_feed_forward_length, c.moe_intermediate_size),
            (w.add_expert_shared_feed_forward_length, c.shared_expert_intermediate_size),
        ]
    for add, value in keys:
        add(value)
    tokens = SPECIALS + byte_tokens()
    tokens += ["ab"] + [f"<unused{i}>" for i in range(c.vocab_size - len(tokens) - 1)]
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_types([3] * len(SPECIALS) + [1] * 257 + [5] * (c.vocab_size - 257 - len(SPECIALS)))
    w.add_token_merges(["a b"])  # llama.cpp refuses a BPE vocabulary without merges
    w.add_eos_token_id(2)
    sd = {k: v.float() for k, v in model.state_dict().items()}

    def add(name: str, x: torch.Tensor) -> None:
        w.add_tensor(name, np.ascontiguousarray(x.numpy()))

    # Qwen3.5 tiles the value heads; Qwen3-Next keeps them grouped by key head
    order = (lambda x, dim, head_dim: tiled(x, dim, hk, head_dim)) if arch == "qwen35" else (lambda x, dim, head_dim: x)
    add("token_embd.weight", sd["model.embed_tokens.weight"])
    add("output_norm.weight", sd["model.norm.weight"] + 1)
    add("output.weight", sd["lm_head.weight"])
    for i, kind in enumerate(c.layer_types):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        add(b + "attn_norm.weight", sd[p + "input_layernorm.weight"] + 1)
        add(b + "post_attention_norm.weight", sd[p + "post_attention_layernorm.weight"] + 1)
        if arch == "qwen35":
            for g, h in (("gate", "gate_proj"), ("up", "up_proj"), ("down", "down_proj")):
                add(f"{b}ffn_{g}.weight", sd[f"{p}mlp.{h}.weight"])
        else:
            add(b + "ffn_gate_inp.weight", sd[p + "mlp.gate.weight"])
            gate, up = sd[p + "mlp.experts.gate_up_proj"].chunk(2, dim=1)  # in memory: fused
            for g, x in (("gate", gate), ("up", up), ("down", sd[p + "mlp.experts.down_proj"])):
                add(f"{b}ffn_{g}_exps.weight", x)
            for g, h in (("gate", "gate_proj"), ("up", "up_proj"), ("down", "down_proj")):
                add(f"{b}ffn_{g}_shexp.weight", sd[f"{p}mlp.shared_expert.{h}.weight"])
            add(b + "ffn_gate_inp_shexp.weight", sd[p + "mlp.shared_expert_gate.weight"])
        if kind == "full_attention":
            a = p + "self_attn."
            for g, h in (("q", "q_proj"), ("k", "k_proj"), ("v", "v_proj"), ("output", "o_proj")):
                add(f"{b}attn_{g}.weight", sd[f"{a}{h}.weight"])
            add(b + "attn_q_norm.weight", sd[a + "q_norm.weight"] + 1)
            add(b + "attn_k_norm.weight", sd[a + "k_norm.weight"] + 1)
            continue
        a, qk = p + "linear_attn.", 2 * hk * dk
        if arch == "qwen35":
            qkv, z = sd[a + "in_proj_qkv.weight"], sd[a + "in_proj_z.weight"]
            add(b + "ssm_beta.weight", order(sd[a + "in_proj_b.weight"], 0, 1))
            add(b + "ssm_alpha.weight", order(sd[a + "in_proj_a.weight"], 0, 1))
        else:  # per key head [q, k, v, z] rows -> all q, all k, all v; and z
            r = hv // hk
            heads = sd[a + "in_proj_qkvz.weight"].reshape(hk, 2 * dk + 2 * r * dv, -1)
            q, k, v, z = heads.split([dk, dk, r * dv, r * dv], dim=1)
            qkv, z = torch.cat([t.reshape(-1, c.hidden_size) for t in (q, k, v)]), z.reshape(-1, c.hidden_size)
            add(b + "ssm_ba.weight", sd[a + "in_proj_ba.weight"])
        add(b + "attn_qkv.weight", torch.cat([qkv[:qk], order(qkv[qk:], 0, dv)]))
        add(b + "attn_gate.weight", order(z, 0, dv))
        add(b + "ssm_a", order(-sd[a + "A_log"].exp(), 0, 1))
        add(b + "ssm_dt.bias", order(sd[a + "dt_bias"], 0, 1))
        conv = sd[a + "conv1d.weight"][:, 0]
        add(b + "ssm_conv1d.weight", torch.cat([conv[:qk], order(conv[qk:], 0, dv)]))
        add(b + "ssm_norm.weight", sd[a + "norm.weight"])
        add(b + "ssm_out.weight", order(sd[a + "out_proj.weight"], 1, dv))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("arch", ["qwen35", "qwen3next"])
def test_a_gguf_of_the_same_weights_runs_as_the_safetensors(tiny, tiny_next, tmp_path, arch):
    path, model = tiny if arch == "qwen35" else tiny_next
    file = write_hybrid_gguf(tmp_path / f"{arch}.gguf", model, arch)
    c = load_model(file).config
    assert (c.layer_types, c.partial_rotary_factor) == (["linear_attention"] * 3 + ["full_attention"], 0.25)
    assert (c.num_experts, c.shared_expert_intermediate_size) == ((0, 0) if arch == "qwen35" else (8, 64))
    ids = list(range(5, 45))
    # the norms stored plus one and A_log through exp and log round in the last bits
    torch.testing.assert_close(rooftop_logits(file, ids), rooftop_logits(path, ids), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("arch", ["qwen35", "qwen3next"])
def test_a_dummy_of_the_gguf_holds_the_tensors_a_load_of_it_holds(tiny, tiny_next, tmp_path, arch):
    """--load-format dummy on a hybrid GGUF lays its tensors out as the file does (Qwen3-Next's in_proj split into
    in_proj_qkv and in_proj_z, Qwen3.5's value heads tiled), so the model builds the file's path, and it runs."""
    from rooftop import LLM, SamplingParams
    from rooftop.loading.dummy import load_dummy

    _, model = tiny if arch == "qwen35" else tiny_next
    file = write_hybrid_gguf(tmp_path / f"{arch}.gguf", model, arch)
    real, made = load_model(file), load_dummy(file, "auto", torch.device("cpu"), torch.float32)
    assert made.linear_value_order == real.linear_value_order
    assert {n: w.shape for n, w in made.weights.items()} == {n: w.shape for n, w in real.weights.items()}
    params = SamplingParams(max_tokens=3, temperature=0, ignore_eos=True)
    assert len(LLM(model=file, load_format="dummy").generate([[5, 6, 7]], params)[0].token_ids) == 3


@pytest.mark.parametrize("arch", ["qwen35", "qwen3next"])
def test_llama_cpp_reads_the_written_gguf_as_transformers_runs_the_weights(tiny, tiny_next, tmp_path, arch):
    """The writer above follows llama.cpp's converter: llama.cpp itself (the bench extra) gives transformers'
    logits on the file, so rooftop's reading of it is a reading of llama.cpp's layout."""
    llama_cpp = pytest.importorskip("llama_cpp")
    model = (tiny if arch == "qwen35" else tiny_next)[1]
    file = write_hybrid_gguf(tmp_path / f"{arch}.gguf", model, arch)
    llm = llama_cpp.Llama(model_path=str(file), logits_all=True, n_ctx=64, verbose=False, n_threads=2)
    ids = list(range(5, 45))
    llm.eval(ids)
    with torch.inference_mode():
        expected = model(torch.tensor([ids])).logits[0, -1]
    got = torch.tensor(llm.scores[len(ids) - 1])
    assert (got - expected).abs().max().item() < 1e-3  # llama.cpp's own float32 rounding: 2.5e-4 observed
