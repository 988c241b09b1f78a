"""benchmarks/make_gguf.py: random-weight GGUFs of the presets (dense, MoE, hybrid), read back by rooftop, by gguf's
reader and dequantizers (the K-quant mixes, tensor by tensor) and, where the bench extra is installed, by llama.cpp."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from rooftop.config import LinearAttention
from rooftop.loading.bundled import bundled_model_path
from rooftop.loading.gguf_file import read_gguf
from rooftop.loading.model_files import load_model
from rooftop.loading.tokenizer import Tokenizer
from rooftop.roofline.presets import find_preset

sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))
import make_gguf  # noqa: E402

T = gguf.GGMLQuantizationType
TEXT = "The roofline of a GPU, in 12 words: compute or bandwidth?"


def as_float(w) -> np.ndarray:
    return (w.dequantize() if hasattr(w, "dequantize") else w).to(torch.float32).numpy()


def rms(x: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(x, dtype=np.float64))))


def hf_values(name: str, shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    """A matrix as drawn, before llama's Q/K permutation: what a loader that undoes it must give back."""
    return make_gguf.values(make_gguf.Tensor(name, shape), seed)


def small_config(preset: str, layers: int = 8):
    """The preset with small shapes, its other fields (architecture, rope, tied embeddings) as published."""
    config = make_gguf.model_config(preset, 300, layers)
    config.hidden_size, config.intermediate_size, config.num_heads, config.num_kv_heads = 256, 512, 4, 2
    return config


@pytest.mark.parametrize("qtype, vocab", [("q8_0", 49152), ("q4_0", 1000)])
def test_rooftop_loads_what_it_wrote(tmp_path, qtype, vocab):
    path = make_gguf.main(
        [
            "--preset",
            "smollm2-135m",
            "--layers",
            "2",
            "--type",
            qtype,
            "--vocab",
            str(vocab),
            "--out",
            str(tmp_path / "m.gguf"),
        ]
    )
    loaded = load_model(path)
    c, preset = loaded.config, find_preset("smollm2-135m")
    assert (c.architecture, c.num_layers, c.vocab_size, c.tie_word_embeddings) == ("llama", 2, vocab, True)
    for field in ("hidden_size", "intermediate_size", "num_heads", "num_kv_heads", "head_dim", "rms_norm_eps"):
        assert getattr(c, field) == pytest.approx(getattr(preset, field)), field
    assert (c.max_position_embeddings, c.rope_theta) == (8192, 100000.0)
    assert read_gguf(path).metadata["general.file_type"] == gguf.LlamaFileType[f"MOSTLY_{qtype.upper()}"]
    bundled = load_model(bundled_model_path()).tokenizer
    ids = loaded.tokenizer.encode(TEXT)
    assert loaded.tokenizer.decode(ids) == TEXT and loaded.tokenizer.chat_template == bundled.chat_template
    assert ids == bundled.encode(TEXT) or vocab < 49152  # a cut vocabulary keeps fewer merges
    assert loaded.tokenizer.eos_token_ids == bundled.eos_token_ids
    # Q/K were permuted on the way in: rooftop's loader undoes it, giving the drawn values back
    q = as_float(loaded.weights["model.layers.1.self_attn.q_proj.weight"])
    want = hf_values("blk.1.attn_q.weight", (576, 576))
    assert rms(q - want) < (0.01 if qtype == "q8_0" else 0.15) * rms(want)
    np.testing.assert_array_equal(as_float(loaded.weights["model.norm.weight"]), np.ones(576, np.float32))


def test_q4_k_m_follows_llama_cpp_rules(tmp_path):
    config = small_config("llama-3.2-1b")
    path = tmp_path / "m.gguf"
    counts = make_gguf.write_gguf(config, "q4_k_m", path)
    r = gguf.GGUFReader(path)
    types = {t.name: T(t.tensor_type) for t in r.tensors}
    assert "output.weight" not in types and types["token_embd.weight"] == T.Q6_K  # tied: the embedding is the output
    widened = {i for i in range(8) if types[f"blk.{i}.attn_v.weight"] == T.Q6_K}
    assert widened == {i for i in range(8) if types[f"blk.{i}.ffn_down.weight"] == T.Q6_K} == {0, 3, 6, 7}
    assert types["blk.2.attn_q.weight"] == types["blk.2.ffn_up.weight"] == T.Q4_K
    assert types["blk.2.attn_norm.weight"] == types["rope_freqs.weight"] == T.F32
    assert counts == {"Q4_K": 8 * 7 - 8, "Q6_K": 9, "F32": 8 * 2 + 2}
    meta = {k: f.contents() for k, f in r.fields.items() if not k.startswith("tokenizer.ggml.")}
    assert meta["llama.context_length"] == 131072 and meta["llama.rope.freq_base"] == 500000.0
    assert meta["llama.attention.head_count_kv"] == 2 and "llama.attention.key_length" not in meta
    assert meta["general.file_type"] == gguf.LlamaFileType.MOSTLY_Q4_K_M
    for t in r.tensors:
        got = gguf.quants.dequantize(t.data, T(t.tensor_type)).reshape(tuple(reversed(t.shape.tolist())))
        want = make_gguf.values(next(x for x in make_gguf.tensors(config) if x.name == t.name), 0)
        assert rms(got - want) <= 0.1 * rms(want), t.name


def test_llama3_rope_factors():
    """Llama 3.2-1B's rope_freqs, as llama.cpp's converter computes them: 1 for the short wavelengths, the
    factor 32 for the long ones, a blend between."""
    f = make_gguf.rope_factors(find_preset("llama-3.2-1b"))
    assert f.shape == (32,) and f[0] == 1.0 and f[-1] == 32.0
    assert np.all(np.diff(f) >= 0) and 1 < f[np.argmax(f > 1)] < 32


def test_qwen3_has_qk_norms_and_no_permutation(tmp_path):
    config = small_config("qwen3-0.6b", layers=1)
    config.head_dim = 128  # wider than hidden/heads, as Qwen3's are
    path = tmp_path / "m.gguf"
    make_gguf.write_gguf(config, "q6_k", path)
    r = gguf.GGUFReader(path)
    names = {t.name: t for t in r.tensors}
    assert names["blk.0.attn_q_norm.weight"].shape.tolist() == [128] and "rope_freqs.weight" not in names
    assert r.fields["qwen3.attention.key_length"].contents() == 128
    q = names["blk.0.attn_q.weight"]
    got = gguf.quants.dequantize(q.data, T.Q6_K).reshape(512, 256)
    want = hf_values("blk.0.attn_q.weight", (512, 256))
    assert rms(got - want) < 0.03 * rms(want)


def test_single_types_fall_back_where_rows_are_not_super_blocks():
    def typ(choice, k):
        return make_gguf.tensor_type(make_gguf.Tensor("blk.0.attn_q.weight", (64, k), layer=0), choice, 2, True)

    assert typ("q4_k", 576) == T.Q5_0 and typ("q6_k", 576) == T.Q8_0 and typ("iq4_xs", 576) == T.IQ4_NL
    assert typ("q4_k", 1024) == T.Q4_K and typ("q8_0", 48) == T.F16 and typ("bf16", 48) == T.BF16


def test_vocabulary_pads_and_cuts_cleanly():
    padded = make_gguf.smollm2_vocabulary(49160)
    assert padded.tokens[49152:] == [f"<id:{i}>" for i in range(49152, 49160)]
    assert set(padded.token_types[49152:]) == {gguf.TokenType.UNUSED}
    cut = make_gguf.smollm2_vocabulary(1000)
    assert len(cut.tokens) == 1000 and 0 < len(cut.merges) < 1000
    kept = set(cut.tokens)
    assert all({*m.split(" "), m.replace(" ", "")} <= kept for m in cut.merges)
    meta = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": cut.tokens, "tokenizer.ggml.merges": cut.merges}
    tok = Tokenizer.from_gguf_metadata({**meta, "tokenizer.ggml.token_type": cut.token_types})
    assert tok.decode(tok.encode(TEXT)) == TEXT  # every byte still spells
    with pytest.raises(SystemExit, match="at least 252"):
        make_gguf.smollm2_vocabulary(100)


def small_moe():
    """Qwen3-30B-A3B's layout (q/k norms, untied output, top-k renormalized) at 8 experts of 256, 2 per token."""
    config = small_config("qwen3-30b-a3b", layers=2)
    config.head_dim, config.num_experts, config.num_experts_per_tok, config.moe_intermediate_size = 64, 8, 2, 256
    return config


def small_hybrid():
    """Qwen3.6-27B's layout (three Gated DeltaNet layers, then gated full attention with a quarter of its head
    rotated) at small shapes; llama.cpp's qwen35 takes the DeltaNet's key and value heads of one size."""
    config = small_config("qwen3.6-27b", layers=4)
    config.head_dim = 64
    config.linear_attention = LinearAttention(
        num_key_heads=2, num_value_heads=4, key_head_dim=64, value_head_dim=64, conv_kernel_dim=4
    )
    return config


def test_an_moe_file_stacks_each_layers_experts_and_keeps_the_router_f32(tmp_path):
    config, path = small_moe(), tmp_path / "moe.gguf"
    counts = make_gguf.write_gguf(config, "q4_k_m", path)
    r = gguf.GGUFReader(path)
    assert r.fields["general.architecture"].contents() == "qwen3moe"
    meta = {
        k: r.fields[f"qwen3moe.{k}"].contents()
        for k in ("expert_count", "expert_used_count", "expert_feed_forward_length")
    }
    assert meta == {"expert_count": 8, "expert_used_count": 2, "expert_feed_forward_length": 256}
    tensors = {t.name: t for t in r.tensors}
    assert tensors["blk.1.ffn_gate_exps.weight"].shape.tolist() == [256, 256, 8]  # GGUF's order: row length first
    types = {name: T(t.tensor_type) for name, t in tensors.items()}
    assert types["blk.0.ffn_gate_inp.weight"] == T.F32 and types["blk.0.ffn_up_exps.weight"] == T.Q4_K
    # the last layer's down projections widened as a dense ffn_down is (use_more_bits), and the output
    assert [types[f"blk.{i}.ffn_down_exps.weight"] for i in (0, 1)] == [T.Q4_K, T.Q6_K]
    assert counts == {"Q4_K": 13, "Q6_K": 3, "F32": 11}
    loaded = load_model(path)
    c = loaded.config
    assert (c.architecture, c.num_experts, c.num_experts_per_tok, c.moe_intermediate_size) == ("qwen3_moe", 8, 2, 256)
    stack = make_gguf.values(make_gguf.Tensor("blk.1.ffn_down_exps.weight", (8, 256, 256)), 0)
    down = as_float(loaded.weights["model.layers.1.mlp.experts.5.down_proj.weight"])
    assert rms(down - stack[5]) < 0.03 * rms(stack[5])  # Q6_K of expert 5's own slice
    router = make_gguf.values(make_gguf.Tensor("blk.0.ffn_gate_inp.weight", (8, 256)), 0)
    np.testing.assert_array_equal(as_float(loaded.weights["model.layers.0.mlp.gate.weight"]), router)


def test_a_hybrid_file_has_qwen35s_layers_and_keys(tmp_path):
    config, path = small_hybrid(), tmp_path / "hybrid.gguf"
    counts = make_gguf.write_gguf(config, "q4_k_m", path)
    r = gguf.GGUFReader(path)
    key = lambda k: r.fields[f"qwen35.{k}"].contents()  # noqa: E731
    assert (key("full_attention_interval"), key("rope.dimension_count"), key("rope.dimension_sections")) == (
        4,
        16,
        [3, 3, 2, 0],
    )
    assert (key("ssm.group_count"), key("ssm.time_step_rank"), key("ssm.state_size"), key("ssm.inner_size")) == (
        2,
        4,
        64,
        256,
    )
    types = {t.name: T(t.tensor_type) for t in r.tensors}
    assert types["blk.0.ssm_conv1d.weight"] == types["blk.0.ssm_a"] == T.F32
    # llama.cpp classes attn_qkv with attn_v: Q6_K in the layers use_more_bits picks (of 4: the third, the last)
    assert [types[f"blk.{i}.attn_qkv.weight"] for i in range(3)] == [T.Q4_K, T.Q4_K, T.Q6_K]
    assert "blk.2.attn_q.weight" not in types and "blk.3.attn_qkv.weight" not in types
    assert counts == {"Q4_K": 28, "F32": 23, "Q6_K": 5}
    c = load_model(path).config
    assert c.layer_types == ["linear_attention"] * 3 + ["full_attention"] and c.attn_output_gate
    assert (c.partial_rotary_factor, c.linear_attention) == (0.25, config.linear_attention)
    from rooftop import LLM, SamplingParams

    out = LLM(model=str(path)).generate([[5, 6, 7]], SamplingParams(max_tokens=3, temperature=0, ignore_eos=True))
    assert len(out[0].token_ids) == 3


@pytest.mark.parametrize("layout", [small_moe, small_hybrid])
def test_llama_cpp_and_rooftop_read_the_file_alike(tmp_path, layout):
    """The same F32 file through llama.cpp (the bench extra) and rooftop: the same next-token log-probabilities,
    so the layout is the one llama.cpp's converter writes."""
    llama_cpp = pytest.importorskip("llama_cpp")
    from rooftop import LLM, SamplingParams

    path = tmp_path / "m.gguf"
    make_gguf.write_gguf(layout(), "f32", path)
    ids = list(range(40, 80))
    peer = llama_cpp.Llama(model_path=str(path), logits_all=True, n_ctx=64, verbose=False, n_threads=2)
    peer.eval(ids)
    expected = torch.log_softmax(torch.tensor(peer.scores[len(ids) - 1]), -1)
    params = SamplingParams(max_tokens=1, temperature=0, logprobs=10)
    got = LLM(model=str(path)).generate([ids], params)[0].logprobs[0]
    assert max(abs(expected[t].item() - got[t].logprob) for t in got) < 1e-3  # 2e-4 observed


@pytest.mark.parametrize("qtype, name", [("q4_k_m", "q4_k+q6_k"), ("q4_k", "q4_k"), ("q2_k", "q2_k")])
def test_the_analyzer_costs_a_gguf_by_the_types_its_blocks_hold(tmp_path, qtype, name):
    """A Q4_K or Q4_K_M file's general.file_type is no format the analyzer names, and it costed such files as bf16
    (3.5x their bytes). It now reads the blocks' matrices: their formats by bytes, most first, the bytes exactly the
    file's; a type the loader converts (Q2_K) as stored on a datasheet device (as the Q4_1 it becomes on this
    machine's probe: tests/test_roofline_auto_weights.py); `rooftop roofline` reports the same."""
    from typer.testing import CliRunner

    from rooftop.cli import app
    from rooftop.roofline.api import resolve_model

    path = tmp_path / "m.gguf"
    make_gguf.write_gguf(small_config("llama-3.2-1b"), qtype, path)
    blocks = [t for t in gguf.GGUFReader(path).tensors if t.name.startswith("blk.") and len(t.shape) >= 2]
    _, fmt = resolve_model(path)
    assert fmt.name == name
    stored = sum(int(t.n_bytes) for t in blocks)
    costed = sum(fmt.linear_bytes(int(t.shape[0]), int(t.n_elements) // int(t.shape[0])) for t in blocks)  # K first
    assert costed == pytest.approx(stored, rel=1e-9)
    r = CliRunner(env={"COLUMNS": "200"}).invoke(app, ["roofline", "-m", str(path), "-H", "rtx4090", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["weights_format"] == name


def test_a_k_quant_that_falls_back_says_so(tmp_path, capsys):
    """SmolLM2's 576 inputs are not whole 256-value super-blocks: those matrices are Q5_0 in a --type q4_k file, as
    llama.cpp writes them, and the script says so instead of leaving a "Q4_K" file that is mostly Q5_0."""
    make_gguf.main(
        ["--preset", "smollm2-135m", "--layers", "1", "--type", "q4_k", "--vocab", "1000"]
        + ["--out", str(tmp_path / "m.gguf")]
    )
    out = " ".join(capsys.readouterr().out.split())
    assert "tensors per type: 7 Q5_0, 3 F32, 1 Q4_K" in out
    assert "note: 7 Q5_0 instead of Q4_K: their rows are not whole 256-value blocks" in out


def test_a_mix_that_falls_back_says_so(tmp_path, capsys):
    make_gguf.main(
        ["--preset", "smollm2-135m", "--layers", "1", "--type", "q4_k_m", "--vocab", "1000"]
        + ["--out", str(tmp_path / "m.gguf")]
    )
    out = " ".join(capsys.readouterr().out.split())
    assert "note: 5 Q5_0, 2 Q8_0 instead of Q4_K or Q6_K: their rows are not whole 256-value blocks" in out


@pytest.mark.parametrize(
    "args, words",
    [
        (["--preset", "nope"], "unknown model preset 'nope'; known: smollm2-135m"),
        (["--preset", "smollm2-135m", "--seed", "-1"], "--seed -1: must be >= 0"),
        (
            ["--preset", "smollm2-135m", "--out", "/nonexistent/m.gguf"],
            "--out /nonexistent/m.gguf: no folder /nonexistent",
        ),
    ],
)
def test_bad_arguments_are_one_line_before_anything_is_written(args, words, capsys):
    with pytest.raises(SystemExit) as stop:
        make_gguf.main([*args, "--type", "q4_0"])
    assert stop.value.code == 2 and words in capsys.readouterr().err
