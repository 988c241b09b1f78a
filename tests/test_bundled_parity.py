"""The bundled SmolLM2 GGUF against transformers loading the same file: logits, greedy tokens, tokenizer, template."""

import functools
from pathlib import Path

import pytest
import torch
from near_ties import FLOAT_TIE, assert_parts_only_at_a_near_tie

from rooftop.models.kv_cache import KVCache

pytestmark = pytest.mark.slow

LAGOS = [{"role": "user", "content": "What is the weather in Lagos?"}]
CORPUS = [
    "Hello, world!",
    "What is the weather in Lagos?",
    "  leading spaces and trailing   ",
    "Digits: 0 12 345 6789 3.14159 1,000,000 2024-11-29",
    "naïve café, Straße, ñandú, Ελληνικά, русский, 日本語のテキスト, 한국어",
    "emoji 🌍🚀👩‍💻 and symbols ∑ ≤ → ©",
    "tabs\tand\nnewlines\n\n\nand\r\nwindows",
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
    "<|im_start|>user\nspecial tokens inline<|im_end|>",
    "URLs like https://example.com/a?b=c&d=e#f and e-mails a.b@c.org",
    "ALL CAPS, MiXeD cAsE, don't, we'll, they're",
]


@pytest.fixture(scope="module")
def reference():
    """transformers' model and tokenizer from the bundled file. transformers parses the file once for the config,
    once for the weights and once for the tokenizer, and builds gguf's tensor-name map for each of the model's ~400 submodules (~35 s of the
    suite's time): the same reader and map, each made once here, give it the same objects in ~15 s."""
    import gguf
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rooftop.loading.bundled import bundled_model_path

    path = bundled_model_path()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gguf, "GGUFReader", functools.cache(gguf.GGUFReader))
        patch.setattr(gguf, "get_tensor_name_map", functools.cache(gguf.get_tensor_name_map))
        model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    return model.eval(), tokenizer


def last_logits(llm, ids):
    cache = KVCache(llm.config, len(ids), torch.float32, llm.device)
    with torch.inference_mode():
        return llm.model.logits(llm.model.forward(torch.tensor(ids), cache, start=0)[-1:])[0]


def test_logits_match_transformers(bundled_llm, reference):
    model, _ = reference
    prompts = [CORPUS[0], CORPUS[3], CORPUS[7], bundled_llm.apply_chat_template(LAGOS)]
    for prompt in prompts:
        ids = bundled_llm.tokenizer.encode(prompt)
        ours = last_logits(bundled_llm, ids)
        with torch.no_grad():
            theirs = model(torch.tensor([ids])).logits[0, -1]
        torch.testing.assert_close(ours, theirs, atol=2e-3, rtol=1e-4)
        assert ours.argmax() == theirs.argmax()


def test_greedy_lagos_tokens_match_transformers(bundled_llm, reference):
    """The same 32 greedy tokens, but where transformers' own logits nearly tie: rooftop's kernels and PyTorch's
    round differently, and which way a near-tie breaks follows the host."""
    model, _ = reference
    out = bundled_llm.chat(LAGOS, _greedy(32))[0]
    ids = torch.tensor([out.prompt_token_ids])
    with torch.no_grad():
        theirs = model.generate(ids, max_new_tokens=32, do_sample=False)[0, ids.shape[1] :].tolist()

    def their_logits(token_ids: list[int]) -> torch.Tensor:
        with torch.no_grad():
            return model(torch.tensor([token_ids])).logits[0]

    assert len(out.token_ids) == len(theirs) == 32
    assert_parts_only_at_a_near_tie(their_logits, out.prompt_token_ids, out.token_ids, theirs, FLOAT_TIE)
    assert "Lagos" in out.text


def test_token_ids_match_transformers_tokenizer(bundled_llm, reference):
    _, tokenizer = reference
    for text in CORPUS:
        assert bundled_llm.tokenizer.encode(text) == tokenizer(text)["input_ids"], text
        ids = bundled_llm.tokenizer.encode(text)
        assert bundled_llm.tokenizer.decode(ids, skip_special_tokens=False) == tokenizer.decode(ids)


@pytest.mark.parametrize(
    "messages",
    [
        LAGOS,
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        [
            {"role": "user", "content": "Name a colour."},
            {"role": "assistant", "content": "Blue."},
            {"role": "user", "content": "Another?"},
        ],
    ],
)
def test_chat_template_renders_like_transformers(bundled_llm, reference, messages):
    _, tokenizer = reference
    expected = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert bundled_llm.apply_chat_template(messages) == expected


def test_bundled_model_path_is_the_gguf(bundled_llm):
    assert Path(bundled_llm.model_path).name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    c = bundled_llm.config
    assert (c.architecture, c.num_layers, c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim) == (
        "llama",
        30,
        576,
        9,
        3,
        64,
    )
    assert c.tie_word_embeddings and c.eos_token_ids == [2]


def _greedy(n):
    from rooftop import SamplingParams

    return SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)
