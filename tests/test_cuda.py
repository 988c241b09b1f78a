"""rooftop on a CUDA GPU (skipped without one; benchmarks/gpu_check.sh runs them on the device machine): the weight-only
kernels and the paged decode kernel against float references, a step's forward pass without a host sync, every
weight format's logits against the CPU's float32 model (HF and GGUF files), continuous batching and speculative
verify steps through the captured decode graphs, a hybrid model, and the probe."""

from pathlib import Path

import pytest
import torch
from gguf import GGMLQuantizationType as T
from gguf_factory import write_tiny_gguf
from near_ties import assert_parts_only_at_a_near_tie
from test_hf_models import PROMPT, write_tokenizer
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3_5ForCausalLM, Qwen3_5TextConfig

from rooftop import LLM, SamplingParams
from rooftop.enums import Phase
from rooftop.loading.model_files import load_model
from rooftop.models.kv_cache import KVCache
from rooftop.models.loader import build_model
from rooftop.quant.cuda_linear import (
    CudaInt4Linear,
    CudaInt8Linear,
    pack_int4,
    tinygemm_layout_matches,
    torch_pack_int4,
)
from rooftop.quant.linear import make_linear
from rooftop.quant.rows import RowPlan
from rooftop.roofline.probe import run_probe

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")]
GPU = torch.device("cuda")
# relative L2 error of a prompt's logits against the CPU's float32 model: bfloat16 activations, then the formats
TOLERANCE = {"float": 0.03, "int8": 0.05, "int4": 0.2}
# where two bfloat16 runs on the GPU (graphs or eager, batched or alone) may part: the CPU model's top two logits
# within this (the tiny models' logits spread ~1.6; bfloat16 moves them by a few hundredths)
BF16_TIE = 0.25


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def save_tiny(model, path: Path) -> Path:
    """`model` with seeded random matrices (std 0.1: logits spread ~1.6, so greedy tokens are rarely near-ties) and
    its own norm initialization, saved by transformers with the tests' byte-level tokenizer."""
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                p.uniform_(-1, 1)
            elif "norm" not in name:
                p.normal_(0.0, 0.1)
    model.save_pretrained(path)
    write_tokenizer(path)
    return path


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Path:
    config = LlamaConfig(
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=320,
        max_position_embeddings=512,
    )
    return save_tiny(LlamaForCausalLM(config).eval(), tmp_path_factory.mktemp("llama"))


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory) -> Path:
    config = Qwen3_5TextConfig(
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=4,  # three Gated DeltaNet layers, then gated attention
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        vocab_size=320,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=32,
        linear_value_head_dim=32,
        max_position_embeddings=512,
    )
    return save_tiny(Qwen3_5ForCausalLM(config).eval(), tmp_path_factory.mktemp("qwen3_5"))


def test_tinygemm_packs_as_rooftop_reads_it():
    assert tinygemm_layout_matches(GPU)
    q = torch.randint(0, 16, (64, 1024), generator=torch.Generator().manual_seed(0), dtype=torch.uint8).to(GPU)
    for tiles in (2, 4, 8):
        assert torch.equal(torch_pack_int4(q, tiles), pack_int4(q, tiles))


@pytest.mark.parametrize("rows", [1, 3, 16, 33, 64, 100, 300])
@pytest.mark.parametrize("kind", [CudaInt4Linear, CudaInt8Linear])
def test_weight_only_linears_compute_their_dequantized_matmul(kind, rows):
    """Rows under WIDEN_ROWS on the kernel, a widened chunk on cuBLAS: both the dequantized weights' product."""
    gen = torch.Generator(device=GPU).manual_seed(rows)
    weight = torch.randn(768, 1024, generator=gen, device=GPU, dtype=torch.bfloat16) * 0.05
    linear = make_linear(weight, None, "int4" if kind is CudaInt4Linear else "int8")
    assert isinstance(linear, kind)
    x = torch.randn(rows, 1024, generator=gen, device=GPU, dtype=torch.bfloat16)
    expected = x.double() @ linear.dequantize(torch.float64).T
    y = linear(x, plan=RowPlan((rows,)) if rows >= 96 else RowPlan())
    assert y.dtype == torch.bfloat16 and y.shape == (rows, 768)
    assert relative_error(y, expected) < 1e-2


@pytest.mark.parametrize("heads, kv_heads, head_dim", [(32, 8, 128), (24, 4, 256), (8, 8, 64)])
def test_paged_decode_attention_in_bfloat16(heads, kv_heads, head_dim):
    from rooftop.kernels import paged_attention as attention_kernels  # Triton: imported where a GPU is

    gen = torch.Generator(device=GPU).manual_seed(heads)
    page, blocks = 16, 64
    k_pool, v_pool = (
        torch.randn(blocks * page, kv_heads, head_dim, generator=gen, device=GPU, dtype=torch.bfloat16)
        for _ in range(2)
    )
    lengths = torch.tensor([1, 17, 300, 0, 1000], device=GPU)  # 0: a padded row
    tables = torch.randperm(blocks, generator=gen, device=GPU)[: 5 * 63].view(5, 63) % blocks
    q = torch.randn(5, heads, head_dim, generator=gen, device=GPU, dtype=torch.bfloat16)
    out = attention_kernels.decode_attention(q, k_pool, v_pool, tables, lengths, page, head_dim**-0.5, 132)
    for b, length in enumerate(lengths.tolist()):
        if length == 0:
            assert torch.equal(out[b], torch.zeros_like(out[b]))
            continue
        slots = (tables[b][:, None] * page + torch.arange(page, device=GPU)).flatten()[:length]
        keys, values = (p[slots].double().repeat_interleave(heads // kv_heads, 1) for p in (k_pool, v_pool))
        scores = torch.einsum("hd,thd->ht", q[b].double(), keys) * head_dim**-0.5
        assert relative_error(out[b], torch.einsum("ht,thd->hd", scores.softmax(-1), values)) < 1e-2


@pytest.mark.parametrize("weights", ["float", "int8", "int4"])
@pytest.mark.parametrize("which", ["llama", "hybrid"])
def test_a_step_never_waits_on_the_host(request, which, weights):
    """The forward pass of a prefill chunk and of a decode step, metadata built before it, runs with PyTorch's sync
    debug mode set to error: no .item(), .tolist() or blocking copy inside."""
    path = request.getfixturevalue(which)
    model = build_model(load_model(path), torch.bfloat16, GPU, weights)
    cache = KVCache(model.config, 64, torch.bfloat16, GPU)
    ids = torch.arange(3, 40, device=GPU)
    prefill = cache.metadata(0, len(ids))
    decode = cache.metadata(len(ids), 1, Phase.DECODE)
    positions = torch.arange(len(ids) + 1, device=GPU)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with torch.inference_mode():
            model.forward_batch(ids, positions[:-1], cache.pool, prefill)
            hidden = model.forward_batch(ids[-1:], positions[-1:], cache.pool, decode)
            model.logits(hidden, batch_invariant=False)
    finally:
        torch.cuda.set_sync_debug_mode("default")


def logits_on(path: Path, device: str, weights: str, ids: list[int], dtype=torch.bfloat16) -> torch.Tensor:
    """The model's logits after each of `ids` (one prefill), then after three decode steps, float32 on the CPU."""
    model = build_model(load_model(path), dtype, device, weights)
    cache = KVCache(model.config, len(ids) + 3, dtype, device)
    with torch.inference_mode():
        out = [model.logits(model.forward(torch.tensor(ids, device=device), cache, 0))]
        for i, token in enumerate(out[0][-1:].argmax(-1).tolist() * 3):
            step = model.forward(torch.tensor([token], device=device), cache, len(ids) + i, Phase.DECODE)
            out.append(model.logits(step))
    return torch.cat(out).float().cpu()


@pytest.mark.parametrize("weights", ["float", "int8", "int4"])
def test_every_format_matches_the_cpu_model(llama, weights):
    ids = load_model(llama).tokenizer.encode(PROMPT)
    reference = logits_on(llama, "cpu", "float", ids, torch.float32)
    assert relative_error(logits_on(llama, "cuda", weights, ids), reference) < TOLERANCE[weights]


@pytest.mark.parametrize(
    "qtype, weights", [(T.F32, "float"), (T.Q8_0, "auto"), (T.Q4_1, "auto"), (T.Q4_0, "int4"), (T.Q4_K, "int8")]
)
def test_gguf_files_are_repacked_for_cuda(tmp_path, qtype, weights):
    """A GGUF's Q8_0 and Q4_1 groups become the Q8_0 kernel's and tinygemm's (auto: the file's own format), Q4_0 the
    same values as int4; another block format is requantized to the policy's. Against the file's values in float32
    on the CPU."""
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, qtype=qtype)
    ids = load_model(path).tokenizer.encode(PROMPT)
    reference = logits_on(path, "cpu", "float", ids, torch.float32)
    model = build_model(load_model(path), torch.bfloat16, GPU, weights)
    expected_format = {T.F32: "bf16", T.Q8_0: "q8_0", T.Q4_1: "int4-g32", T.Q4_0: "int4-g32", T.Q4_K: "q8_0"}
    assert set(model.bytes_by_format()) == {expected_format[qtype]}
    policy = {"auto": {T.Q8_0: "int8", T.Q4_1: "int4"}.get(qtype), "float": "float"}.get(weights, weights)
    assert relative_error(logits_on(path, "cuda", weights, ids), reference) < TOLERANCE[policy]


def test_graphs_and_eager_steps_agree(llama):
    """The same decode step replayed from a graph (padded to 8 rows) and run eagerly: the same logits up to the
    kernels' rounding at another row count."""
    prompts = [[5 + i, 9, 13 + i, 2 * i + 1] * (i + 2) for i in range(5)]
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True, logprobs=1)
    options = dict(model=str(llama), device="cuda", dtype="bfloat16", max_num_seqs=8, cuda_graph_sizes=[1, 2, 4, 8])
    graphed, eager = LLM(**options), LLM(**options, enforce_eager=True)
    assert graphed.engine.decode_graphs is not None and eager.engine.decode_graphs is None
    assert sorted(graphed.engine.decode_graphs.graphs) == [1, 2, 4, 8]
    reference = rooftop_cpu(llama)
    for a, b, prompt in zip(graphed.generate(prompts, params), eager.generate(prompts, params), prompts, strict=True):
        assert len(a.token_ids) == len(b.token_ids) == 6
        assert_parts_only_at_a_near_tie(reference, prompt, a.token_ids, b.token_ids, BF16_TIE)


def rooftop_cpu(path: Path):
    """The CPU float32 model's logits after each of a list of ids: the near-tie judge."""
    model = build_model(load_model(path), torch.float32, "cpu", "float")

    def logits(ids: list[int]) -> torch.Tensor:
        with torch.inference_mode():
            return model.logits(
                model.forward(torch.tensor(ids), KVCache(model.config, len(ids), torch.float32, "cpu"), 0)
            )

    return logits


@pytest.mark.parametrize("which", ["llama", "hybrid"])
def test_continuous_batching_on_cuda(request, which):
    """Prompts of several lengths in chunks (a budget of 48 tokens), decodes sharing steps with them, all through the
    graphs once only decodes are left: each request gets its tokens, and greedy runs part from the request alone
    only at near-ties of the CPU model."""
    path = request.getfixturevalue(which)
    llm = LLM(model=str(path), device="cuda", dtype="bfloat16", max_num_seqs=4, max_num_batched_tokens=48,
              cuda_graph_sizes=[4])  # fmt: skip
    prompts = [list(range(3, 3 + n)) for n in (5, 70, 33, 120, 9)]
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    graphs, replayed = llm.engine.decode_graphs, []
    replay = graphs.replay
    graphs.replay = lambda *args: replayed.append(len(args[0])) or replay(*args)
    together = llm.generate(prompts, params)
    assert Phase.MIXED in {record.phase for record in llm.step_records} and replayed
    reference = rooftop_cpu(path)
    for prompt, out in zip(prompts, together, strict=True):
        alone = llm.generate([prompt], params)[0]
        assert len(out.token_ids) == 12
        assert_parts_only_at_a_near_tie(reference, prompt, out.token_ids, alone.token_ids, BF16_TIE)


def test_speculative_verify_steps_replay_graphs(llama):
    """n-gram drafts make verify steps of 1 + k rows per sequence; they replay the graphs (decode rows) and keep
    the greedy tokens of a run without drafts, up to near-ties."""
    prompt = [7, 8, 9, 10, 11] * 8
    params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    spec = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 2}
    options = dict(model=str(llama), device="cuda", dtype="bfloat16", cuda_graph_sizes=[4, 8])
    drafted = LLM(**options, speculative_config=spec).generate([prompt], params)[0]
    plain = LLM(**options).generate([prompt], params)[0]
    assert drafted.metrics.spec_decode.draft_tokens > 0
    assert_parts_only_at_a_near_tie(rooftop_cpu(llama), prompt, drafted.token_ids, plain.token_ids, BF16_TIE)


def test_hybrid_matches_the_cpu_model(hybrid):
    ids = load_model(hybrid).tokenizer.encode(PROMPT) * 2  # past one 64-token chunk of the delta rule
    reference = logits_on(hybrid, "cpu", "float", ids, torch.float32)
    assert relative_error(logits_on(hybrid, "cuda", "float", ids), reference) < TOLERANCE["float"]


def test_float32_on_cuda_is_the_cpu_model(llama):
    """float32 activations: the kernels' float32 paths (IEEE dots) against the CPU's float32."""
    ids = load_model(llama).tokenizer.encode(PROMPT)
    reference = logits_on(llama, "cpu", "float", ids, torch.float32)
    assert relative_error(logits_on(llama, "cuda", "float", ids, torch.float32), reference) < 1e-3


def test_probe_measures_the_gpu():
    from rooftop.engine.probe import ENGINE_KERNELS

    result = run_probe("cuda", quick=True, engine=ENGINE_KERNELS)
    assert result.bf16_flops > 0 and result.read_bandwidth > 0 and result.copy_bandwidth > 0
    assert result.int8_weight_only_flops and result.int4_weight_only_flops
    assert result.engine_formats == {"float": "bf16", "int8": "q8_0", "int4": "int4-g32"}
    assert "GB/s" in result.notes["int8_weight_only"]
