"""Qwen3-MoE in the engine: a tiny random checkpoint saved by transformers (and the same weights written as a GGUF
with gguf's writer) runs as transformers runs it — logits, routing, greedy tokens — batched as alone, its experts in
the quantized formats too, and each step records the experts it touched."""

from dataclasses import replace
from pathlib import Path

import gguf
import httpx
import numpy as np
import pytest
import torch
from gguf_factory import SPECIALS, byte_tokens
from serve_support import running_server
from test_batch_invariance import assert_batch_invariant
from test_decode_call import both_ways
from test_hf_models import PROMPT, save_random
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

from rooftop import LLM, SamplingParams
from rooftop.errors import ModelLoadError, UnsupportedModelError
from rooftop.loading.gguf_file import read_gguf
from rooftop.loading.model_files import load_model
from rooftop.models.kv_cache import KVCache
from rooftop.models.loader import build_model
from rooftop.models.mlp import SparseMoE, expert_plan, route
from rooftop.quant.gguf_quantize import quantize
from rooftop.quant.linear import WIDEN_ROWS, Q4Linear, Q8Linear, RowPlan
from rooftop.roofline.ops import step_ops

T = gguf.GGMLQuantizationType
VOCAB = 320
# 8 experts, 4 per token: a 256-token prefill chunk routes ~128 rows to each expert, past WIDEN_ROWS, so the
# experts' widened path runs too
CONFIG = dict(
    hidden_size=64,
    intermediate_size=128,
    moe_intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    vocab_size=VOCAB,
    num_experts=8,
    num_experts_per_tok=4,
    norm_topk_prob=True,
    max_position_embeddings=1024,
)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> tuple[Path, Qwen3MoeForCausalLM]:
    torch.manual_seed(0)
    model = Qwen3MoeForCausalLM(Qwen3MoeConfig(**CONFIG)).eval()
    return save_random(model, tmp_path_factory.mktemp("qwen3moe")), model


def rooftop_logits(path: Path, ids: list[int], weights: str = "float") -> torch.Tensor:
    model = build_model(load_model(path), torch.float32, "cpu", weights)
    cache = KVCache(model.config, capacity=len(ids), dtype=torch.float32, device="cpu")
    with torch.inference_mode():
        return model.logits(model.forward(torch.tensor(ids), cache, 0))


def test_logits_match_transformers(tiny):
    path, reference = tiny
    ids = load_model(path).tokenizer.encode(PROMPT)
    with torch.inference_mode():
        expected = reference(torch.tensor([ids])).logits[0, -1]
    assert (rooftop_logits(path, ids)[-1] - expected).abs().max().item() < 1e-4


def test_each_tokens_experts_and_weights_are_transformers_router(tiny):
    path, reference = tiny
    seen = {}
    hook = reference.model.layers[1].mlp.gate.register_forward_hook(
        lambda module, args, out: seen.update(x=args[0], weights=out[1], experts=out[2])
    )
    with torch.inference_mode():
        reference(torch.tensor([load_model(path).tokenizer.encode(PROMPT)]))
    hook.remove()
    ours = build_model(load_model(path), torch.float32, "cpu", "float").layers[1].mlp
    routing = route(seen["x"].reshape(-1, CONFIG["hidden_size"]), ours.router, ours.top_k, ours.normalize)
    assert torch.equal(routing.experts, seen["experts"])
    torch.testing.assert_close(routing.weights, seen["weights"])


@pytest.mark.parametrize(("experts", "k", "normalize"), [(8, 2, True), (128, 8, True), (128, 8, False), (60, 4, False)])
def test_the_routing_kernel_is_pytorchs_softmax_topk_and_renormalization(experts, k, normalize):
    """kernels/cpu.cpp's route_rows, which route() and the one call take on the CPU: the experts PyTorch's softmax and
    topk pick, in its order, their weights within float32 rounding, renormalized or not; a row's the same alone;
    equal probabilities to the lower expert first; a top_k past the experts refused."""
    from rooftop.kernels import cpu

    kernels = cpu.ops()
    if kernels is None:
        pytest.skip("rooftop's CPU kernels did not build on this machine")
    logits = torch.randn(7, experts, generator=torch.Generator().manual_seed(experts + k)) * 3
    weights, ids = kernels.route_rows(logits, k, normalize)
    expected, expected_ids = torch.topk(torch.softmax(logits, dim=-1), k, dim=-1)
    if normalize:
        expected = expected / expected.sum(dim=-1, keepdim=True)
    assert torch.equal(ids, expected_ids)
    torch.testing.assert_close(weights, expected, atol=1e-6, rtol=1e-5)
    alone = kernels.route_rows(logits[3:4].clone(), k, normalize)
    assert torch.equal(alone[0][0], weights[3]) and torch.equal(alone[1][0], ids[3])
    tied = torch.zeros(1, experts)
    tied[0, [experts - 1, 1, 5]] = 2.0
    assert kernels.route_rows(tied, 2, normalize)[1].tolist() == [[1, 5]]
    with pytest.raises(RuntimeError, match=f"top_k must be 1 to the {experts} experts, got {experts + 1}"):
        kernels.route_rows(logits, experts + 1, normalize)


def assert_greedy_as_transformers(path: Path, reference) -> None:
    """32 greedy tokens of the engine (float weights) equal transformers' generate on the same checkpoint."""
    ids = [5, 17, 42, 99, 3, 250, 7]
    out = LLM(model=str(path), weights="float").generate(
        [{"prompt_token_ids": ids}], SamplingParams(max_tokens=32, temperature=0, ignore_eos=True)
    )
    expected = reference.generate(torch.tensor([ids]), max_new_tokens=32, do_sample=False, eos_token_id=None)
    assert out[0].token_ids == expected[0, len(ids) :].tolist()


def test_greedy_tokens_match_transformers(tiny):
    assert_greedy_as_transformers(*tiny)


def test_an_expert_plans_its_rows_by_their_chunks():
    """Rows 0-299 are a 300-token chunk, 300-309 a 10-token one, 310+ decodes: the rows routed from the first
    widen (WIDEN_ROWS of them), those from the short chunk go narrow with the decodes."""
    plan = RowPlan((300, 10), 1)
    rows = torch.cat([torch.arange(0, 300, 2), torch.tensor([301, 305, 311, 312])])
    order, sub = expert_plan(plan, rows)
    assert sub.widen == (150,) and 150 >= WIDEN_ROWS
    assert rows[order].tolist() == list(range(0, 300, 2)) + [301, 305, 311, 312]
    few = torch.tensor([0, 4, 301, 311])
    order, sub = expert_plan(plan, few)
    assert sub.widen == () and few[order].tolist() == [0, 4, 301, 311]


@pytest.mark.parametrize("weights", ["float", "int8", "int4"])
def test_batched_requests_get_what_they_get_alone(tiny, weights):
    """Prefill chunks of several lengths (some widening their experts' weights), decodes and a tight budget share
    steps; then a pool too small for all, so the latest arrivals are preempted and recomputed."""
    assert_batch_invariant(LLM(model=str(tiny[0]), weights=weights), preempt=True)


@pytest.mark.parametrize("weights", ["float", "int8", "int4"])
def test_the_kernels_and_a_lone_rows_loop_give_the_regrouped_sum(tiny, weights):
    """A lone row (a decode at batch 1) runs its k experts on itself, without the regrouping of rows by expert
    that a batch needs: the same sum, bit for bit, in every weight format. Where the experts run in tiles, the
    kernels (RowExperts: the experts side by side on the threads, or in turn where there are more threads) give every
    row the same bits as Python's paths, one row or several, and count the experts they ran; an expert id out of
    range is refused."""
    model = build_model(load_model(tiny[0]), torch.float32, "cpu", weights)
    moe, ops = model.layers[1].mlp, model.ops
    assert (moe.row is None) == (weights == "float")  # float32 experts: Python
    for seed, rows in enumerate((1, 1, 5, 11)):
        x = torch.randn(rows, CONFIG["hidden_size"], generator=torch.Generator().manual_seed(seed))
        routing = route(x, moe.router, moe.top_k, moe.normalize)
        regrouped = moe._by_expert(x, routing, ops, RowPlan())
        distinct = len(routing.experts.unique())
        assert moe.touched == distinct
        if rows == 1:
            assert torch.equal(moe._one_row(x, routing, ops, RowPlan()), regrouped)
            assert moe.touched == CONFIG["num_experts_per_tok"]
        if moe.row is not None:
            out, touched = ops.experts_rows(moe.row, x, routing.experts, routing.weights)
            assert torch.equal(out, regrouped) and touched == distinct
            threads = torch.get_num_threads()
            torch.set_num_threads(16)  # more threads than experts: each expert on all of them, in turn
            try:
                assert torch.equal(ops.experts_rows(moe.row, x, routing.experts, routing.weights)[0], regrouped)
            finally:
                torch.set_num_threads(threads)
    if moe.row is not None:
        with pytest.raises(RuntimeError, match="expert 8 of 8"):
            ops.experts_rows(moe.row, x, torch.full_like(routing.experts, 8), routing.weights)


@pytest.mark.parametrize("weights", ["int8", "int4"])
def test_a_step_of_decodes_runs_in_one_call_with_the_layer_by_layer_bits(tiny, weights, monkeypatch):
    """Where the experts run on the kernels, a step of decodes runs in one call (kernels/decode.cpp): router,
    routing and experts, a lone row through its k experts and a step of several rows each expert once on its rows.
    Every token and logprob is the layer-by-layer path's, and each step records the experts it touched."""
    llm = LLM(model=str(tiny[0]), weights=weights)
    model = llm.engine.model
    greedy = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True, logprobs=2)
    seeded = SamplingParams(max_tokens=10, temperature=0.8, top_p=0.9, seed=3, ignore_eos=True, logprobs=1)

    def run(llm: LLM) -> tuple:
        alone = llm.generate(["xyz"], greedy, use_tqdm=False)
        touched = [r.shape.experts_touched for r in list(llm.step_records)[-9:]]
        batch = llm.generate(["ab", "a longer prompt", [5, 6, 7, 8]], [greedy, seeded, greedy], use_tqdm=False)
        wide = [r.shape.experts_touched for r in list(llm.step_records)[-9:]]
        return [(o.outputs[0].token_ids, o.outputs[0].logprobs) for o in alone + batch], touched, wide

    one_call, layered, calls = both_ways(llm, run, monkeypatch)
    assert calls == 18 and model.decode_call.moe.keys() == {0, 1}
    assert one_call == layered
    outputs, touched, wide = one_call
    assert touched == [CONFIG["num_experts_per_tok"]] * 9  # a lone row's k
    assert all(CONFIG["num_experts_per_tok"] <= n <= CONFIG["num_experts"] for n in wide) and max(wide) > 4


def test_the_router_runs_narrow_rows_on_the_kernel_and_chunks_as_one_matmul(tiny):
    """The router's logits pick the experts: a decode's rows run rooftop's fixed-order kernel on the float32
    weights (a row's logits never depend on the batch), a prefill chunk the float32 matmul; both are the float32
    product of the checkpoint's router within float32 rounding."""
    from rooftop.kernels import cpu
    from rooftop.quant.linear import RouterLinear, float_product

    router = build_model(load_model(tiny[0]), torch.float32, "cpu", "int8").layers[0].mlp.router
    assert isinstance(router, RouterLinear) and router.weight.dtype == torch.float32
    x = torch.randn(WIDEN_ROWS + 3, CONFIG["hidden_size"], generator=torch.Generator().manual_seed(1))
    reference = x.double() @ router.weight.double().T
    narrow = router(x)
    assert torch.equal(narrow, cpu.ops().f32_linear(x, router.weight))
    assert torch.equal(narrow[:1], router(x[:1]))
    planned = router(x, plan=RowPlan((WIDEN_ROWS,)))
    assert torch.equal(planned[:WIDEN_ROWS], float_product(x[:WIDEN_ROWS], router.weight, None))
    assert torch.equal(planned[WIDEN_ROWS:], narrow[WIDEN_ROWS:])
    for got in (narrow, planned):
        torch.testing.assert_close(got.double(), reference, atol=1e-5, rtol=1e-5)


def test_quantized_experts_run_on_the_kernels(tiny):
    path, _ = tiny
    ids = load_model(path).tokenizer.encode(PROMPT)
    exact = rooftop_logits(path, ids)
    for weights, kind in (("int8", Q8Linear), ("int4", Q4Linear)):
        moe = build_model(load_model(path), torch.float32, "cpu", weights).layers[0].mlp
        assert isinstance(moe, SparseMoE) and all(isinstance(lin, kind) for lin in moe.linears())
        assert moe.router.weight.dtype == torch.float32
        got = rooftop_logits(path, ids, weights)
        # a sanity bound, not parity: at 4 bits a routing near-tie flips a token's experts (the kernels' parity is in
        # test_kernels.py)
        assert ((got - exact).norm() / exact.norm()).item() < (0.1 if weights == "int8" else 0.5)


def test_each_step_records_the_experts_it_touched(tiny):
    """A decode touches exactly top-k experts per layer; the record's count replaces the op model's expectation."""
    llm = LLM(model=str(tiny[0]), weights="float")
    llm.generate([{"prompt_token_ids": list(range(5, 69))}], SamplingParams(max_tokens=4, temperature=0))
    prefill, *decodes = list(llm.step_records)[-4:]
    assert all(r.shape.experts_touched == CONFIG["num_experts_per_tok"] for r in decodes)
    assert CONFIG["num_experts_per_tok"] <= prefill.shape.experts_touched <= CONFIG["num_experts"]
    expert_bytes = lambda shape: sum(  # noqa: E731
        op.bytes_read for op in step_ops(llm.config, llm.precision, shape) if op.name.startswith("experts_")
    )
    assert expert_bytes(replace(prefill.shape, experts_touched=4.0)) < expert_bytes(prefill.shape)


def write_moe_gguf(path: Path, model: Qwen3MoeForCausalLM, expert_type: T, drop: str = "") -> Path:
    """The checkpoint's own weights in a qwen3moe GGUF as llama.cpp's converter names them: the experts stacked
    per layer (experts, rows, cols) in `expert_type`, everything else F32; a byte-level vocabulary padded to 320."""
    c = model.config
    w = gguf.GGUFWriter(str(path), "qwen3moe")
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_key_length(c.head_dim)
    w.add_value_length(c.head_dim)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_rope_freq_base(float(c.rope_parameters["rope_theta"]))
    w.add_expert_count(c.num_experts)
    w.add_expert_used_count(c.num_experts_per_tok)
    w.add_expert_feed_forward_length(c.moe_intermediate_size)
    tokens = SPECIALS + byte_tokens()
    tokens += [f"<unused{i}>" for i in range(VOCAB - len(tokens))]
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_types([3] * len(SPECIALS) + [1] * 256 + [5] * (VOCAB - 256 - len(SPECIALS)))
    w.add_token_merges([])
    w.add_eos_token_id(2)
    sd = {k: v.float().numpy() for k, v in model.state_dict().items()}

    def add(name: str, x: np.ndarray, qtype: T = T.F32) -> None:
        if name == drop:
            return
        if qtype == T.F32:
            w.add_tensor(name, x)
        else:
            rows = quantize(x.reshape(-1, x.shape[-1]), qtype)
            w.add_tensor(name, rows.reshape(*x.shape[:-1], -1), raw_dtype=qtype)

    add("token_embd.weight", sd["model.embed_tokens.weight"])
    add("output_norm.weight", sd["model.norm.weight"])
    add("output.weight", sd["lm_head.weight"])
    names = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm", "ffn_gate_inp": "mlp.gate"}
    names |= {f"attn_{g}": f"self_attn.{h}_proj" for g, h in (("q", "q"), ("k", "k"), ("v", "v"), ("output", "o"))}
    names |= {"attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"}
    for i in range(c.num_hidden_layers):
        for g, h in names.items():
            add(f"blk.{i}.{g}.weight", sd[f"model.layers.{i}.{h}.weight"])
        gate, up = np.split(sd[f"model.layers.{i}.mlp.experts.gate_up_proj"], 2, axis=1)  # in memory: fused
        for g, stacked in (("gate", gate), ("up", up), ("down", sd[f"model.layers.{i}.mlp.experts.down_proj"])):
            add(f"blk.{i}.ffn_{g}_exps.weight", np.ascontiguousarray(stacked), expert_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_a_gguf_of_the_same_weights_runs_as_the_safetensors(tiny, tmp_path):
    path, model = tiny
    ids = list(range(5, 45))
    file = write_moe_gguf(tmp_path / "moe.gguf", model, T.F32)
    config = load_model(file).config
    assert (config.architecture, config.num_experts, config.num_experts_per_tok, config.norm_topk_prob) == (
        "qwen3_moe",
        8,
        4,
        True,
    )
    torch.testing.assert_close(rooftop_logits(file, ids), rooftop_logits(path, ids), atol=1e-5, rtol=1e-5)


def test_a_gguf_with_quantized_experts_runs_them_as_stored(tiny, tmp_path):
    """Each expert's slice of the stacked Q8_0 tensor is its own Q8Linear holding the file's values; the model runs
    near its float path on the same file (int8 activations; a routing near-tie can flip, hence the loose bound)."""
    _, model = tiny
    ids = list(range(5, 45))
    file = write_moe_gguf(tmp_path / "moe-q8.gguf", model, T.Q8_0)
    moe = build_model(load_model(file), torch.float32, "cpu", "auto").layers[0].mlp
    assert all(isinstance(lin, Q8Linear) for lin in moe.linears())
    stacked = next(t for t in read_gguf(file).tensors if t.name == "blk.0.ffn_up_exps.weight")
    values = gguf.dequantize(stacked.data, stacked.qtype).reshape(stacked.shape)  # gguf's own reading
    ff = CONFIG["moe_intermediate_size"]
    torch.testing.assert_close(moe.experts[3].gate_up.dequantize()[ff:], torch.from_numpy(values[3]), rtol=0, atol=0)
    exact = rooftop_logits(file, ids, "float")  # the file's Q8_0 values widened
    got = rooftop_logits(file, ids, "auto")
    assert ((got - exact).norm() / exact.norm()).item() < 0.15


def test_a_missing_expert_tensor_and_dense_layers_are_named(tiny, tmp_path):
    _, model = tiny
    file = write_moe_gguf(tmp_path / "broken.gguf", model, T.F32, drop="blk.1.ffn_up_exps.weight")
    with pytest.raises(ModelLoadError, match=r"no tensor model\.layers\.1\.mlp\.experts\.0\.up_proj\.weight"):
        build_model(load_model(file), torch.float32, "cpu", "float")
    dense = Qwen3MoeConfig(**CONFIG, mlp_only_layers=[1])
    dense.save_pretrained(tmp_path / "dense")
    with pytest.raises(UnsupportedModelError, match=r"mlp_only_layers \[1\]"):
        load_model(tmp_path / "dense")


def test_rooftop_serve_serves_it(tiny):
    """The OpenAI-compatible server, unchanged: each completion is what LLM.generate gives for its prompt."""
    path, _ = tiny
    llm = LLM(model=str(path), weights="float")
    body = {"max_tokens": 6, "temperature": 0, "ignore_eos": True}
    expected = [
        llm.generate([p], SamplingParams(max_tokens=6, temperature=0, ignore_eos=True))[0].text for p in ("ab", "xyz")
    ]
    with running_server(path, llm=llm) as url, httpx.Client(base_url=url, timeout=60) as client:
        texts = [
            client.post("/v1/completions", json={**body, "prompt": p}).json()["choices"][0]["text"]
            for p in ("ab", "xyz")
        ]
    assert texts == expected
