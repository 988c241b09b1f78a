"""`--load-format dummy`: configs from presets, config.json, HF directories and GGUF headers, seeded random weights
made only when the model builds, the `<id:N>` placeholder, and the CLI."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as T
from gguf_factory import write_tiny_gguf
from test_cli import assert_user_error, rooftop_in_process

from rooftop import LLM, SamplingParams
from rooftop.config import is_runnable
from rooftop.engine.detokenizer import IncrementalDetokenizer
from rooftop.errors import InvalidRequestError, ModelLoadError, UnsupportedModelError
from rooftop.kernels import cpu
from rooftop.loading import dummy
from rooftop.loading.dummy import load_dummy
from rooftop.loading.gguf_file import read_gguf
from rooftop.loading.model_files import load_model
from rooftop.loading.shard import Shard
from rooftop.models.loader import build_model
from rooftop.quant.gguf_blocks import STORED_TYPES, dequantize
from rooftop.quant.weights import BlockWeight, Int4Weight, Int8GroupWeight
from rooftop.roofline.presets import PRESETS

CPU, META = torch.device("cpu"), torch.device("meta")
GREEDY = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)  # a random model may emit EOS at once


def tiny_config(architecture: str = "LlamaForCausalLM", **fields) -> dict:
    return {
        "architectures": [architecture],
        "vocab_size": 512,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 128,
        "tie_word_embeddings": False,
        "eos_token_id": 7,
        **fields,
    }


def write_config(path: Path, cfg: dict) -> Path:
    path.write_text(json.dumps(cfg))
    return path


@pytest.fixture
def no_tensors(monkeypatch):
    """Any tensor made from here on fails the test: loading must only describe the weights."""

    def refuse(*args):
        raise AssertionError(f"a dummy tensor was made at load time: {args[0]}")

    monkeypatch.setattr(dummy, "random_weight", refuse)


@pytest.mark.parametrize("name", list(PRESETS))
def test_every_preset_loads_its_config_and_no_tensor(name, no_tensors):
    loaded = load_dummy(name, "auto", CPU, torch.float32)
    assert loaded.config == PRESETS[name]
    if not is_runnable(loaded.config):  # hybrid: the config loads, the engine refuses it as it always did
        assert len(loaded.weights) == 0
        with pytest.raises(UnsupportedModelError, match="can be analyzed .* but not run"):
            build_model(loaded, torch.float32, CPU)
        return
    c = loaded.config
    mlp = 1 + 3 * c.num_experts if c.is_moe else 3  # Qwen3-MoE: the router and each expert's three matrices
    per_layer = 6 + mlp + 2 * c.qk_norm + 3 * c.attention_bias
    if c.architecture == "qwen3_5":  # 2 norms + the MLP's 3, then DeltaNet's 9 tensors or gated attention's 6
        per_layer = 5 + (9 * c.num_linear_attention_layers + 6 * c.num_full_attention_layers) / c.num_layers
    assert len(loaded.weights) == 2 + (not c.tie_word_embeddings) + c.num_layers * per_layer


@pytest.mark.parametrize("name", [n for n, c in PRESETS.items() if is_runnable(c)])
def test_every_runnable_preset_builds_on_the_meta_device(name):
    """The shapes are the ones build_model takes, for every preset, without a byte of weights."""
    model = build_model(load_dummy(name, "auto", META, torch.bfloat16), torch.bfloat16, META)
    assert model.embed.device.type == "meta" and model.layers[0].linears()[0].weight.device.type == "meta"


def rss_bytes() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * 4096


def test_a_27b_model_builds_its_shapes_without_allocating():
    """dense-27b in bfloat16 is 54 GB: the LoadedModel holds only readers, and the model builds on meta."""
    before = rss_bytes()
    loaded = load_dummy("dense-27b", "auto", META, torch.bfloat16)
    model = build_model(loaded, torch.bfloat16, META)
    linears = [m for layer in model.layers for m in layer.linears()]
    params = model.embed.numel() + sum(m.weight.numel() for m in linears)
    assert 27.0e9 < params < 27.5e9  # tied embeddings: the lm_head is the embedding
    assert model.precision.weights.name == "bf16"
    assert rss_bytes() - before < 1 << 30


def test_a_27b_model_loads_lazily_on_the_cpu(no_tensors):
    loaded = load_dummy("dense-27b", "float", CPU, torch.bfloat16)
    assert loaded.config.num_layers == 46 and len(loaded.weights) == 1 + 1 + 46 * 9


def test_weights_are_made_in_the_requested_format():
    int4 = load_dummy("smollm2-135m", "int4", CPU, torch.float32).weights
    assert isinstance(int4["model.layers.0.mlp.down_proj.weight"], Int4Weight)
    assert isinstance(int4["model.embed_tokens.weight"], Int8GroupWeight)  # the tied lm_head's Q8_0 groups
    int8 = load_dummy("smollm2-135m", "int8", CPU, torch.float32).weights
    assert isinstance(int8["model.layers.0.self_attn.q_proj.weight"], Int8GroupWeight)
    bf16 = load_dummy("smollm2-135m", "float", CPU, torch.bfloat16).weights["model.layers.0.self_attn.q_proj.weight"]
    assert bf16.dtype == torch.bfloat16 and 0.01 < bf16.float().std() < 0.03


@pytest.mark.parametrize("weights, fmt", [("int4", "q4_1"), ("float", "fp32")])
def test_smollm2_preset_generates_greedily(weights, fmt):
    llm = LLM(model="smollm2-135m", load_format="dummy", weights=weights)
    assert llm.precision.weights.name == fmt
    out = llm.generate([[1, 2, 3, 4, 5]], GREEDY)[0]
    assert len(out.token_ids) == 4 and all(0 <= i < 49152 for i in out.token_ids)


def test_dummy_floats_take_the_checkpoints_values_so_auto_runs_the_real_weights_path(tmp_path):
    """A preset's checkpoints are bf16 (as the analyzer costs them), and so is a config.json that says so: their
    dummy floats are bfloat16 tensors, which `auto` holds as bf16-fp32 on the CPU as it would the real weights; a
    config.json in float32 keeps float32 draws, and `--weights float` float32 linears."""
    name = "model.layers.0.mlp.up_proj.weight"
    preset = load_dummy("smollm2-135m", "auto", CPU, torch.float32).weights[name]
    assert preset.dtype == torch.bfloat16  # as a bf16 checkpoint's tensor is read: the model widens it where needed
    assert 0.01 < preset.float().std() < 0.03
    if cpu.ops() is not None:  # the kernel bf16-fp32 runs on
        assert LLM(model="smollm2-135m", load_format="dummy").precision.weights.name == "bf16-fp32"
    fp32 = write_config(tmp_path / "config.json", tiny_config(torch_dtype="float32"))
    drawn = load_dummy(fp32, "auto", CPU, torch.float32).weights[name]
    assert not torch.equal(drawn, drawn.bfloat16().float())
    assert LLM(model=fp32, load_format="dummy").precision.weights.name == "fp32"
    bf16 = write_config(tmp_path / "bf16.json", tiny_config(torch_dtype="bfloat16"))
    assert LLM(model=bf16, load_format="dummy", weights="float").precision.weights.name == "fp32"


def test_a_config_json_runs_and_the_seed_decides_the_weights(tmp_path):
    path = write_config(tmp_path / "config.json", tiny_config())
    a, b = (LLM(model=path, load_format="dummy", weights="float", dummy_seed=1) for _ in range(2))
    prompt = [[3, 1, 4, 1, 5, 9, 2, 6]]
    assert a.generate(prompt, GREEDY)[0].token_ids == b.generate(prompt, GREEDY)[0].token_ids
    name = "model.layers.1.mlp.up_proj.weight"
    one, two = (load_dummy(path, "float", CPU, torch.float32, seed).weights[name] for seed in (1, 2))
    assert torch.equal(one, load_dummy(path, "float", CPU, torch.float32, 1).weights[name])
    assert not torch.equal(one, two)
    assert a.tokenizer.eos_token_ids == [7]  # the config's EOS, not SmolLM2's


@pytest.mark.parametrize(
    "architecture, names",
    [
        ("Qwen2ForCausalLM", ["model.layers.0.self_attn.q_proj.bias", "model.layers.1.self_attn.v_proj.bias"]),
        ("Qwen3ForCausalLM", ["model.layers.0.self_attn.q_norm.weight", "model.layers.1.self_attn.k_norm.weight"]),
    ],
)
def test_qwen_flags_give_their_tensors_and_run(tmp_path, architecture, names):
    path = write_config(tmp_path / "config.json", tiny_config(architecture, tie_word_embeddings=True))
    llm = LLM(model=path, load_format="dummy", weights="int8")
    loaded = load_dummy(path, "int8", CPU, torch.float32)
    assert all(n in loaded.weights for n in names) and "lm_head.weight" not in loaded.weights
    assert len(llm.generate([[5, 6, 7]], GREEDY)[0].token_ids) == 4


def test_an_hf_directory_is_read_for_its_config_only(tmp_path):
    write_config(tmp_path / "config.json", tiny_config())
    (tmp_path / "model.safetensors").write_bytes(b"not safetensors")  # reading it would fail
    with pytest.raises(ModelLoadError, match="unreadable safetensors"):
        load_model(tmp_path)
    llm = LLM(model=tmp_path, load_format="dummy", weights="float")
    assert llm.config.vocab_size == 512 and len(llm.generate([[1, 2]], GREEDY)[0].token_ids) == 4


def test_a_gguf_gives_its_header_config_tokenizer_and_format(tiny_gguf):
    real = load_model(tiny_gguf)
    loaded = load_dummy(tiny_gguf, "auto", CPU, torch.float32)
    assert loaded.config == real.config and loaded.native_format == real.native_format
    assert loaded.tokenizer.encode("hello") == real.tokenizer.encode("hello")
    name = "model.layers.0.self_attn.q_proj.weight"
    assert loaded.weights[name].shape == real.weights[name].shape
    assert not torch.equal(loaded.weights[name], real.weights[name])


def test_unknown_names_and_bad_formats_fail_clearly(tmp_path):
    with pytest.raises(ModelLoadError, match="no such file or directory, and unknown model preset 'qwen3-9b'"):
        load_dummy("qwen3-9b", "auto", CPU, torch.float32)
    with pytest.raises(ModelLoadError, match="no config.json"):
        load_dummy(tmp_path, "auto", CPU, torch.float32)
    with pytest.raises(
        InvalidRequestError, match=r"load_format \(--load-format\) must be one of auto, dummy; got 'pt'"
    ):
        LLM(model="smollm2-135m", load_format="pt")
    with pytest.raises(InvalidRequestError, match="got 'gguf' \\(a GGUF reads with auto\\)"):
        LLM(load_format="gguf")
    with pytest.raises(InvalidRequestError, match=r"dummy_seed \(--dummy-seed\) 3 seeds load_format 'dummy'"):
        LLM(dummy_seed=3)  # the file's weights: a seed would change nothing


def test_cli_refuses_a_dummy_seed_without_dummy_weights():
    assert_user_error(
        rooftop_in_process("generate", "hi", "--dummy-seed", "3"),
        "dummy_seed (--dummy-seed) 3 seeds load_format 'dummy' (--load-format dummy) only; with 'auto' the weights are",
    )


def test_ids_outside_the_vocabulary_detokenize_as_placeholders():
    tokenizer = dummy.bundled_tokenizer(PRESETS["qwen3-8b"])
    hello = tokenizer.encode("Hello world")
    ids = [*hello, 151000, *tokenizer.encode(" again")]
    assert tokenizer.decode(ids) == "Hello world<id:151000> again"
    stream = IncrementalDetokenizer(tokenizer)
    text = "".join(stream.add(i) for i in ids) + stream.flush()
    assert text == "Hello world<id:151000> again"


def test_cli_generate_runs_a_dummy_preset_and_says_so():
    """A text prompt, through SmolLM2's tokenizer and chat template (the preset has no tokenizer of its own)."""
    args = ["generate", "Hi", "--model", "smollm2-135m", "--load-format", "dummy", "--max-tokens", "4"]
    r = rooftop_in_process(*args, "--no-roofline", "--temperature", "0")
    assert r.returncode == 0, r.stderr
    assert "from smollm2-135m (dummy weights, seed 0)" in " ".join(r.stderr.split())


def test_a_preset_name_without_dummy_weights_gets_the_option_named():
    assert_user_error(
        rooftop_in_process("generate", "hi", "--model", "smollm2-135m"),
        "smollm2-135m: no such file or directory (smollm2-135m is a preset: --load-format dummy runs it",
    )


def test_cli_rejects_a_bad_load_format_before_loading():
    assert_user_error(
        rooftop_in_process("generate", "hi", "--load-format", "safetensors"),
        "load_format (--load-format) must be one of auto, dummy",
    )


def test_dummy_weights_too_big_for_the_device_are_refused_before_any_tensor(monkeypatch, no_tensors):
    """dense-27b in bfloat16 is 54.5 GB: with less memory available the run stops with the analyzer's count before
    the first tensor is made (it was built until the kernel killed the process). The memory is set here, so the test
    holds on any host; int4's 17 GB fit in 20 GB, and on the meta device nothing is checked."""
    monkeypatch.setattr(dummy, "available_bytes", lambda device: None if device.type == "meta" else 20 * 10**9)
    args = ["generate", "Hi", "--model", "dense-27b", "--load-format", "dummy", "--no-roofline"]
    assert_user_error(
        rooftop_in_process(*args),
        "dense-27b: its float weights take at least 54.5 GB (as bf16), but 20.0 GB of memory is available on cpu",
        "--weights int4",
        "`rooftop roofline -m dense-27b`",
    )
    with pytest.raises(ModelLoadError, match=r"its int8 weights take at least 28\.9 GB \(as q8_0\)"):
        LLM(model="dense-27b", load_format="dummy", weights="int8")
    # float weights a choice names are the model's dtype: float32's twice bf16's bytes
    with pytest.raises(ModelLoadError, match=r"its float weights take at least 108\.9 GB \(as fp32\)"):
        LLM(model="dense-27b", load_format="dummy", weights="float", dtype="float32")
    with pytest.raises(ModelLoadError, match=r"available on cpu; tensor parallelism over GPUs or a bigger device"):
        LLM(model="llama-3.1-70b", load_format="dummy", weights="int4")  # no --weights int4 hint to int4 itself
    # a mixture of experts, which tensor parallelism does not split, is not told to use it
    with pytest.raises(ModelLoadError, match=r"on cpu; fewer bits per weight \(--weights int4\) or a bigger device"):
        LLM(model="qwen3-30b-a3b", load_format="dummy")
    dummy.check_fits(load_dummy("dense-27b", "int4", CPU, torch.float32), "int4", CPU, torch.float32)  # 17 GB fit
    dummy.check_fits(load_dummy("dense-27b", "float", META, torch.bfloat16), "float", META, torch.bfloat16)


def test_a_k_quant_gguf_dummy_is_counted_in_the_files_own_formats(tmp_path, monkeypatch, no_tensors):
    """Under auto a GGUF's matrices are held as the file holds them (Q4_K: 4.5 bits per weight), so check_fits counts
    them so (it counted them as Q4_1's 5 bits and refused a Q4_K model that fit by a tenth); --weights int4 makes
    every one Q4_1 and is still counted as that."""
    path = tmp_path / "q4_k.gguf"
    write_tiny_gguf(path, qtype=lambda name: T.Q4_K)  # the embedding too
    file_bytes = sum(t.data.nbytes for t in read_gguf(path).tensors if len(t.shape) == 2)
    monkeypatch.setattr(dummy, "available_bytes", lambda device: 1.05 * file_bytes)
    auto = load_dummy(path, "auto", CPU, torch.float32)
    assert dummy.held_formats(auto.weights.matrices) == {"q4_k": pytest.approx(file_bytes)}
    dummy.check_fits(auto, "auto", CPU, torch.float32)  # fits
    with pytest.raises(ModelLoadError, match=r"its int4 weights take at least .* \(as q4_1\)"):
        dummy.check_fits(load_dummy(path, "int4", CPU, torch.float32), "int4", CPU, torch.float32)


def test_a_dummy_tensor_with_no_memory_left_for_it_is_refused_by_name(monkeypatch):
    """Memory that runs out while the weights are made (check_fits passed: 1 TB then, 1 MB once building starts):
    the first tensor that cannot be made stops the run by name instead of the kernel killing the process. The
    embedding is drawn in bfloat16, the preset checkpoint's dtype: 49152 x 576 x 2 bytes."""
    left = iter([10**12])
    monkeypatch.setattr(dummy, "available_bytes", lambda device: next(left, 10**6))
    with pytest.raises(
        ModelLoadError, match=r"model.embed_tokens.weight: making this dummy tensor needs 0.06 GB on cpu, and 0.00 GB"
    ):
        LLM(model="smollm2-135m", load_format="dummy")


@pytest.mark.parametrize("form", ["float", "int4", "int8"])
def test_a_dummy_tensor_is_the_same_on_any_number_of_threads(form):
    """The CPU draws a matrix's blocks of rows on several threads, each block from its own generator: the values
    are the seed's and the shape's, not the threads'. Rows past the last whole block, and a tensor of fewer rows
    than a block, are drawn too."""
    threads = torch.get_num_threads()
    made = []
    try:
        for n in (1, 3):
            torch.set_num_threads(n)
            made.append(dummy.random_weight("w", (2 * dummy.DRAW_ROWS + 5, 64), form, torch.float32, CPU, 3))
    finally:
        torch.set_num_threads(threads)
    one, three = (w if form == "float" else w.q for w in made)
    assert torch.equal(one, three)
    blocks = one.split(dummy.DRAW_ROWS)
    assert not torch.equal(blocks[0], blocks[1])  # each block its own draw
    assert blocks[-1].float().std() > 0
    small = dummy.random_weight("w", (7, 64), "float", torch.float32, CPU, 3, values=torch.bfloat16)
    assert small.dtype == torch.bfloat16 and small.float().std() > 0


def q4_k_m_like(name: str) -> T:
    """A mixed file as llama.cpp's Q4_K_M lays one out (Q8_0 embedding, Q6_K for half the V and down matrices), with
    a Q5_0, a Q4_1 and a Q3_K (converted to Q4_1 at load) besides."""
    special = {
        "token_embd.weight": T.Q8_0,
        "blk.0.attn_v.weight": T.Q6_K,
        "blk.1.ffn_down.weight": T.Q6_K,
        "blk.0.attn_k.weight": T.Q5_0,
        "blk.1.attn_k.weight": T.Q4_1,
        "blk.1.attn_output.weight": T.Q3_K,
    }
    return special.get(name, T.Q4_K)


@pytest.mark.parametrize("types", [T.Q4_K, q4_k_m_like], ids=["q4_k", "q4_k_m"])
def test_a_gguf_dummy_holds_each_matrix_in_the_form_a_load_of_the_file_gives_it(tmp_path, types):
    """The file's block formats as BlockWeight, its Q8_0/Q4_1 (and what is converted to Q4_1) as integer groups, its
    floats as float tensors: built, the dummy runs and reports the formats the real file does."""
    path = tmp_path / "model.gguf"
    write_tiny_gguf(path, qtype=types)
    real, made = load_model(path), load_dummy(path, "auto", CPU, torch.float32)
    assert (
        made.converted_types
        == real.converted_types
        == ({} if types == T.Q4_K else {"model.layers.1.self_attn.o_proj.weight": "Q3_K"})
    )
    for name, w in real.weights.items():
        if name in real.converted_types:  # the file's float values; the dummy's made as auto holds them (Q4_1)
            assert isinstance(w, torch.Tensor) and isinstance(made.weights[name], Int4Weight)
            continue
        d = made.weights[name]
        assert (type(d), getattr(d, "format", None), d.shape) == (type(w), getattr(w, "format", None), w.shape), name
        assert not isinstance(d, torch.Tensor) or d.dtype == w.dtype
    q_proj = made.weights["model.layers.0.self_attn.q_proj.weight"]
    assert isinstance(q_proj, BlockWeight) and q_proj.format == "q4_k"
    real_llm, dummy_llm = LLM(model=path), LLM(model=path, load_format="dummy")
    assert dummy_llm.precision.weights.name == real_llm.precision.weights.name
    assert dummy_llm.model.bytes_by_format() == real_llm.model.bytes_by_format()
    assert dummy_llm.model.conversions == real_llm.model.conversions
    assert real_llm.model.conversions == (
        {} if types == T.Q4_K else {"model.layers.1.self_attn.o_proj.weight": "Q3_K -> Q4_1"}
    )
    if cpu.ops() is not None:  # the kernels that run the blocks as stored
        assert real_llm.precision.weights.name == ("q4_k" if types == T.Q4_K else "q4_k+q6_k+q4_1+q5_0")
    assert len(dummy_llm.generate([[5, 6, 7]], GREEDY)[0].token_ids) == 4


@pytest.mark.parametrize("qtype", list(STORED_TYPES), ids=lambda t: t.name)
def test_random_blocks_decode_to_finite_weights_centred_on_zero_with_dummy_spread(qtype):
    """gguf's own dequantizer reads the random blocks as weights of mean about 0 and standard deviation about STD,
    in every row's worth of blocks: no NaN or infinite scale, no offset a deep random model would pile up."""
    fmt = STORED_TYPES[qtype]
    w = dummy.random_weight("w", (dummy.DRAW_ROWS + 16, 512), fmt, torch.float32, CPU, 0)
    assert isinstance(w, BlockWeight) and w.format == fmt and w.shape == (dummy.DRAW_ROWS + 16, 512)
    assert w.q.shape[1] == 512 // GGML_QUANT_SIZES[qtype][0] * GGML_QUANT_SIZES[qtype][1]
    values = dequantize(w.q.numpy(), qtype, w.shape)
    assert torch.isfinite(values).all()
    assert abs(values.mean()) < 0.05 * dummy.STD and 0.8 * dummy.STD < values.std() < 1.25 * dummy.STD
    assert values.mean(1).abs().max() < 0.25 * dummy.STD  # no row offset
    assert torch.equal(w.dequantize(), values)


def test_random_blocks_are_the_seeds_and_the_names():
    make = lambda name, seed: dummy.random_weight(name, (40, 256), "q4_k", torch.float32, CPU, seed).q  # noqa: E731
    one = make("blk.q", 1)
    assert torch.equal(one, make("blk.q", 1))
    assert not torch.equal(one, make("blk.k", 1)) and not torch.equal(one, make("blk.q", 2))


def test_a_shard_of_random_blocks_is_the_part_of_the_whole():
    """Under tensor parallelism a rank's rows or whole blocks of columns are cut from the same whole matrix."""
    whole = dummy.random_weight("w", (32, 512), "q6_k", torch.float32, CPU, 0).dequantize()
    rows = dummy.random_weight("w", (32, 512), "q6_k", torch.float32, CPU, 0, Shard(0, 16, 32, 32))
    columns = dummy.random_weight("w", (32, 512), "q6_k", torch.float32, CPU, 0, Shard(1, 256, 512, 512))
    assert torch.equal(rows.dequantize(), whole[16:]) and torch.equal(columns.dequantize(), whole[:, 256:])


def test_a_bf16_gguf_dummy_runs_as_the_file_does(tmp_path):
    """A BF16 file's matrices are drawn in bfloat16 as its tensors are read, so `auto` holds them as the real load
    does (bf16-fp32 on the CPU where the kernels built); on the meta device only the shapes exist."""
    path = tmp_path / "bf16.gguf"
    write_tiny_gguf(path, qtype=T.BF16)
    name = "model.layers.0.mlp.up_proj.weight"
    up = load_dummy(path, "auto", CPU, torch.float32).weights[name]
    assert up.dtype == torch.bfloat16 and 0.01 < up.float().std() < 0.03
    real, made = LLM(model=path), LLM(model=path, load_format="dummy")
    assert made.precision.weights.name == real.precision.weights.name
    if cpu.ops() is not None:
        assert made.precision.weights.name == "bf16-fp32"
    model = build_model(load_dummy(path, "auto", META, torch.float32), torch.float32, META)
    assert model.layers[0].linears()[0].weight.device.type == "meta"


def test_a_float32_gguf_dummy_keeps_its_float_draws(tiny_gguf):
    """An F32 file's matrices are float draws in the model's dtype, as they were: its quantized policies quantize
    them at build, as they do the file's."""
    name = "model.layers.0.self_attn.q_proj.weight"
    w = load_dummy(tiny_gguf, "int4", CPU, torch.float32).weights[name]
    assert isinstance(w, torch.Tensor) and w.dtype == torch.float32
    assert np.isclose(w.std().item(), dummy.STD, rtol=0.2)
