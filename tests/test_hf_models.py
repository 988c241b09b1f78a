"""Tiny random Llama/Qwen2/Qwen3 checkpoints saved by transformers: rooftop's logits equal transformers' logits."""

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from rooftop import LLM, SamplingParams
from rooftop.enums import Phase
from rooftop.errors import InvalidRequestError, ModelLoadError, UnsupportedModelError
from rooftop.loading.model_files import load_model
from rooftop.models.kv_cache import KVCache
from rooftop.models.loader import build_model
from rooftop.models.transformer import Transformer

VOCAB = 320
CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "A tiny model reads a tiny prompt and writes one token at a time.",
    "Rotary embeddings turn positions into angles; the cache keeps keys and values.",
    "Hello, world! 0123456789 tokens, merges and bytes.",
]
PROMPT = "The lazy fox reads keys and values, then writes a prompt of angles. Hello bytes!"
SHAPE = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=VOCAB,
    max_position_embeddings=128,
)
# original_max_position_embeddings=64 puts one of the 8 frequencies in the interpolated band, the rest either side.
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
    "rope_theta": 500000.0,
}
VARIANTS = {
    "qwen3": (Qwen3ForCausalLM, Qwen3Config(**SHAPE, head_dim=32), None),
    "qwen2-sharded": (Qwen2ForCausalLM, Qwen2Config(**SHAPE), "50KB"),
    "llama-tied": (LlamaForCausalLM, LlamaConfig(**SHAPE, tie_word_embeddings=True), None),
    "llama3-rope": (LlamaForCausalLM, LlamaConfig(**SHAPE, rope_parameters=LLAMA3_ROPE), None),
}
ATOL = 1e-4


@dataclass
class Built:
    path: Path
    ids: list[int]
    expected: torch.Tensor  # transformers' logits (T, vocab) for `ids`


def write_tokenizer(path: Path) -> None:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(CORPUS, trainer)
    tok.save(str(path / "tokenizer.json"))


def save_random(model, path: Path, seed: int = 0) -> Path:
    """`model` with large random weights (near-uniform logits or routing would hide a wrong term; a Gated
    DeltaNet's A_log in a range whose decays neither vanish nor stay at 1), saved by transformers with a tokenizer."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.uniform_(-1, 1) if name.endswith("A_log") else p.normal_(0.0, 0.4)
    model.save_pretrained(path)
    write_tokenizer(path)
    return path


def build(path: Path, model_cls, config, max_shard_size) -> Built:
    torch.manual_seed(0)
    model = model_cls(config).eval()
    # Default init gives near-uniform logits; large random weights (biases and norms too) make every term matter.
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.4)
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(path, safe_serialization=True, **kwargs)
    write_tokenizer(path)
    ids = load_model(path).tokenizer.encode(PROMPT)
    with torch.inference_mode():
        expected = model(torch.tensor([ids])).logits[0].float()
    return Built(path, ids, expected)


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, Built]:
    return {name: build(tmp_path_factory.mktemp(name), *spec) for name, spec in VARIANTS.items()}


def rooftop_model(path: Path) -> Transformer:
    loaded = load_model(path)
    return build_model(loaded, torch.float32, "cpu", "float")


def new_cache(model: Transformer) -> KVCache:
    return KVCache(model.config, capacity=64, dtype=torch.float32, device="cpu")


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


def test_prompt_is_long_enough_and_in_vocab(built):
    ids = built["qwen3"].ids
    # Long enough for Llama-3's slowed low frequencies to turn visibly, short enough for the 64-token caches.
    assert 40 <= len(ids) <= 64
    assert max(ids) < VOCAB


def test_config_comes_from_config_json(built):
    qwen3 = load_model(built["qwen3"].path).config
    assert (qwen3.architecture, qwen3.head_dim, qwen3.qk_norm) == ("qwen3", 32, True)
    llama = load_model(built["llama3-rope"].path).config
    assert llama.rope_theta == 500000.0
    assert llama.rope_scaling.rope_type == "llama3" and llama.rope_scaling.original_max_position_embeddings == 64
    assert load_model(built["llama-tied"].path).config.tie_word_embeddings
    assert not llama.tie_word_embeddings


@pytest.mark.parametrize("name", VARIANTS)
def test_prefill_logits_match_transformers(built, name):
    b = built[name]
    model = rooftop_model(b.path)
    with torch.inference_mode():
        logits = model.logits(model.forward(torch.tensor(b.ids), new_cache(model), start=0))
    assert logits.dtype == torch.float32 and logits.shape == b.expected.shape
    assert b.expected.std() > 1.0  # the comparison would be weak on near-uniform logits
    assert max_diff(logits, b.expected) < ATOL


@pytest.mark.parametrize("name", VARIANTS)
def test_decode_steps_match_full_recompute(built, name):
    b = built[name]
    model, k = rooftop_model(b.path), len(b.ids) - 6
    cache = new_cache(model)
    with torch.inference_mode():
        prefill = model.logits(model.forward(torch.tensor(b.ids[:k]), cache, start=0))
        assert max_diff(prefill[-1], b.expected[k - 1]) < ATOL
        for pos in range(k, len(b.ids)):
            step = model.logits(model.forward(torch.tensor([b.ids[pos]]), cache, start=pos, phase=Phase.DECODE))
            assert step.shape == (1, VOCAB)
            assert max_diff(step[0], b.expected[pos]) < ATOL, f"position {pos}"


@pytest.mark.parametrize("name", VARIANTS)
def test_chunked_prefill_matches_full_recompute(built, name):
    b = built[name]
    model = rooftop_model(b.path)
    cache, k = new_cache(model), 11
    with torch.inference_mode():
        first = model.logits(model.forward(torch.tensor(b.ids[:k]), cache, start=0))
        rest = model.logits(model.forward(torch.tensor(b.ids[k:]), cache, start=k))
    assert max_diff(torch.cat([first, rest]), b.expected) < ATOL


def test_sharded_checkpoint_has_index_and_shards(built):
    path = built["qwen2-sharded"].path
    index = json.loads((path / "model.safetensors.index.json").read_text())
    shards = set(index["weight_map"].values())
    assert len(shards) > 1
    assert sorted(p.name for p in path.glob("*.safetensors")) == sorted(shards)


def copy_model(src: Path, dst: Path, skip: str | None = None) -> Path:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(skip) if skip else None)
    return dst


def test_a_draft_directory_without_tokenizer_files_drafts_with_the_targets(built, tmp_path):
    """vLLM's draft model takes the target's tokenizer (it exchanges ids only): a draft checkpoint saved by
    transformers without tokenizer files was refused ("no tokenizer.json"). A missing draft is refused by name,
    before the target loads."""
    from rooftop import LLM, SamplingParams
    from rooftop.errors import InvalidRequestError

    target = next(iter(built.values())).path
    draft = copy_model(target, tmp_path / "draft", skip="tokenizer*")
    assert not (draft / "tokenizer.json").exists()
    spec = {"method": "draft", "model": str(draft), "num_speculative_tokens": 3}
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    plain = LLM(model=str(target), weights="float").generate(["ab"], params)[0].token_ids
    llm = LLM(model=str(target), weights="float", speculative_config=spec)
    assert llm.generate(["ab"], params)[0].token_ids == plain  # the same weights draft: all accepted
    assert llm.engine.stats().spec_decode.accepted_tokens > 0
    missing = spec | {"model": str(tmp_path / "nowhere")}
    with pytest.raises(InvalidRequestError, match=r"speculative_config model .*nowhere: no such file or directory"):
        LLM(model=str(target), speculative_config=missing)


def test_missing_config_json(tmp_path):
    with pytest.raises(ModelLoadError, match="config.json"):
        load_model(tmp_path)


def test_missing_weights(built, tmp_path):
    path = copy_model(built["llama-tied"].path, tmp_path / "m", skip="*.safetensors")
    with pytest.raises(ModelLoadError, match="safetensors"):
        load_model(path)


def test_missing_shard(built, tmp_path):
    path = copy_model(built["qwen2-sharded"].path, tmp_path / "m")
    next(path.glob("model-*.safetensors")).unlink()
    with pytest.raises(ModelLoadError, match="missing"):
        load_model(path)


def test_unsupported_architecture(built, tmp_path):
    path = copy_model(built["llama-tied"].path, tmp_path / "m")
    cfg = json.loads((path / "config.json").read_text())
    cfg["architectures"] = ["GPT2LMHeadModel"]
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedModelError, match="GPT2LMHeadModel"):
        load_model(path)


def test_truncated_safetensors(built, tmp_path):
    path = copy_model(built["llama-tied"].path, tmp_path / "m")
    weights = path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(ModelLoadError, match="model.safetensors"):
        load_model(path)


def test_missing_tokenizer_json(built, tmp_path):
    path = copy_model(built["llama-tied"].path, tmp_path / "m", skip="tokenizer.json")
    with pytest.raises(ModelLoadError, match="tokenizer.json"):
        load_model(path)


def test_config_json_that_is_not_an_object(tmp_path):
    (tmp_path / "config.json").write_text("[1, 2, 3]")
    with pytest.raises(ModelLoadError, match="expected a JSON object, got list"):
        load_model(tmp_path)


def test_config_with_zero_heads(tmp_path):
    (tmp_path / "config.json").write_text(
        '{"architectures": ["LlamaForCausalLM"], "vocab_size": 10, "hidden_size": 8, "intermediate_size": 8, '
        '"num_hidden_layers": 1, "num_attention_heads": 0}'
    )
    with pytest.raises(ModelLoadError, match="inconsistent values"):
        load_model(tmp_path)


@pytest.mark.parametrize("name", ["qwen3", "qwen2-sharded"])
def test_qk_norms_and_biases_decode_the_same_bits_in_one_call(built, name):
    """Qwen3's q/k norms and Qwen2's QKV biases in the one-call decode (models/decode_call.py), tiled at int8."""
    llm = LLM(model=str(built[name].path), weights="int8")
    model = llm.engine.model
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True, logprobs=2)

    def run() -> list:
        outs = llm.generate([PROMPT, "Hello"], params, use_tqdm=False)
        return [(o.outputs[0].token_ids, o.outputs[0].logprobs) for o in outs]

    one = model.decode_call
    assert one is not None
    one_call = run()
    model.decode_call = None
    assert run() == one_call


def edited(src: Path, dst: Path, config: dict | None = None, tensors=None) -> Path:
    """A copy of checkpoint `src` with config.json's fields updated by `config` and its tensors (all of them, in one
    file) passed through `tensors(dict) -> dict`."""
    from safetensors.torch import load_file, save_file

    path = copy_model(src, dst)
    if config:
        cfg = json.loads((path / "config.json").read_text())
        (path / "config.json").write_text(json.dumps(cfg | config))
    if tensors is not None:
        state = {}
        for f in sorted(path.glob("*.safetensors")):
            state |= load_file(f)
            f.unlink()
        (path / "model.safetensors.index.json").unlink(missing_ok=True)
        save_file(tensors(state), path / "model.safetensors")
    return path


@pytest.mark.parametrize(
    "config, error, words",
    [
        ({"hidden_act": "gelu"}, UnsupportedModelError, "hidden_act 'gelu' is not supported"),
        ({"mlp_bias": True}, UnsupportedModelError, "mlp_bias true is not supported"),
        ({"quantization_config": {"quant_method": "fp8"}}, UnsupportedModelError, "a fp8-quantized checkpoint"),
    ],
)
def test_a_config_the_engine_would_run_as_another_model_is_refused(built, tmp_path, config, error, words):
    """A gelu MLP, MLP biases and an fp8 checkpoint's scales were ignored: the model ran, computing something else."""
    path = edited(built["llama-tied"].path, tmp_path / "m", config)
    with pytest.raises(error, match=words):
        rooftop_model(path)


def test_what_a_checkpoints_tensors_leave_out_or_add_is_named(built, tmp_path):
    """A missing k bias dropped all three (q and v too), an integer tensor was cast to float, an untied model
    without its lm_head took the embedding table, and a tensor the model does not use went unmentioned."""
    qwen2 = built["qwen2-sharded"].path
    no_k = edited(
        qwen2, tmp_path / "no_k", tensors=lambda s: {k: v for k, v in s.items() if "0.self_attn.k_proj.b" not in k}
    )
    with pytest.raises(ModelLoadError, match=r"no tensor model.layers.0.self_attn.k_proj.bias, beside the other"):
        rooftop_model(no_k)
    as_int = edited(qwen2, tmp_path / "int", tensors=lambda s: s | {"lm_head.weight": s["lm_head.weight"].int()})
    with pytest.raises(UnsupportedModelError, match="tensor lm_head.weight is int32"):
        rooftop_model(as_int)
    no_head = edited(
        qwen2, tmp_path / "no_head", tensors=lambda s: {k: v for k, v in s.items() if k != "lm_head.weight"}
    )
    with pytest.raises(
        ModelLoadError, match="no tensor lm_head.weight, and config.json says tie_word_embeddings false"
    ):
        load_model(no_head)
    extra = edited(qwen2, tmp_path / "extra", tensors=lambda s: s | {"foo.bar": torch.zeros(2)})
    loaded = load_model(extra)
    build_model(loaded, torch.float32, "cpu", "float")
    assert loaded.notes[-1] == "1 tensor of the file not used by the model: foo.bar"


def test_a_bos_added_by_the_tokenizers_post_processor_is_added(built, tmp_path):
    """Llama 3's tokenizer_config.json has no add_bos_token: its BOS comes from tokenizer.json's post-processor,
    which transformers and vLLM run; rooftop left it out."""
    from tokenizers import processors

    path = copy_model(built["llama-tied"].path, tmp_path / "m")
    tok = Tokenizer.from_file(str(path / "tokenizer.json"))
    bos = tok.token_to_id("<|endoftext|>")
    tok.post_processor = processors.TemplateProcessing(
        single="<|endoftext|> $A", special_tokens=[("<|endoftext|>", bos)]
    )
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").unlink(missing_ok=True)
    encoded = load_model(path).tokenizer.encode(PROMPT)
    assert encoded == tok.encode(PROMPT).ids and encoded[0] == bos


def test_text_the_model_has_no_ids_for_is_refused(tmp_path):
    """A bare config.json of a small vocabulary runs on SmolLM2's tokenizer (dummy weights): its text became ids the
    embedding has no rows for, an IndexError from inside the forward pass."""
    cfg = {**SHAPE, "architectures": ["LlamaForCausalLM"], "vocab_size": 100}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    llm = LLM(model=str(tmp_path / "config.json"), load_format="dummy", num_kv_blocks=16)
    with pytest.raises(InvalidRequestError, match=r"the tokenizer makes token ids the model's vocabulary \(100\)"):
        llm.generate("Hello there", SamplingParams(max_tokens=1))
    assert len(llm.generate([[5, 6]], SamplingParams(max_tokens=2, ignore_eos=True))[0].token_ids) == 2


def test_one_file_of_a_checkpoint_is_pointed_to_its_directory(built):
    """-m model.safetensors was "not a valid GGUF file", -m tokenizer.json "a model's config holds no weights"."""
    path = built["llama-tied"].path
    with pytest.raises(ModelLoadError, match=f"one file of a Hugging Face checkpoint: pass its directory, {path}"):
        load_model(path / "model.safetensors")
    with pytest.raises(ModelLoadError, match=f"not a model file: pass its checkpoint's directory, {path}"):
        load_model(path / "tokenizer.json")
