"""vLLM's output controls in SamplingParams: min_tokens, include_stop_str_in_output, skip_special_tokens,
spaces_between_special_tokens, allowed_token_ids and bad_words, checked when built and honoured by generate and stream (the tiny model: a byte
vocabulary, id = byte + 3 after <|endoftext|>, <|im_start|> and <|im_end|>, its EOS; logit_bias forces a token)."""

from __future__ import annotations

import re

import pytest
import torch

from rooftop import LLM, SamplingParams
from rooftop.engine.sampler import SamplingRow, apply_bans, bad_word_token_ids
from rooftop.enums import FinishReason
from rooftop.errors import InvalidRequestError

IM_START, EOS = 1, 2
Z = ord("z") + 3
FORCE = 100.0


def greedy(llm, prompt: str = "hi", **fields):
    return llm.generate([prompt], SamplingParams(**{"temperature": 0, "max_tokens": 8, **fields}))[0].outputs[0]


@pytest.mark.parametrize(
    ("fields", "param", "message"),
    [
        ({"min_tokens": -1}, "min_tokens", "min_tokens must be an integer >= 0, got -1"),
        ({"min_tokens": 1.5}, "min_tokens", "min_tokens must be an integer >= 0, got 1.5"),
        ({"min_tokens": True}, "min_tokens", "min_tokens must be an integer >= 0, got True"),
        ({"min_tokens": 5, "max_tokens": 4}, "min_tokens", "min_tokens must be at most max_tokens (4), got 5"),
        (
            {"include_stop_str_in_output": 1},
            "include_stop_str_in_output",
            "include_stop_str_in_output must be true or false, got 1",
        ),
        ({"skip_special_tokens": "no"}, "skip_special_tokens", "skip_special_tokens must be true or false, got 'no'"),
        (
            {"spaces_between_special_tokens": None},
            "spaces_between_special_tokens",
            "spaces_between_special_tokens must be true or false, got None",
        ),
        (
            {"allowed_token_ids": []},
            "allowed_token_ids",
            "allowed_token_ids must be a non-empty list of token ids (integers >= 0), got []",
        ),
        (
            {"allowed_token_ids": [3, -1]},
            "allowed_token_ids",
            "allowed_token_ids must be a non-empty list of token ids (integers >= 0), got [3, -1]",
        ),
        (
            {"bad_words": ["ok", " "]},
            "bad_words",
            "bad_words must be a list of strings, each with text other than spaces, got ['ok', ' ']",
        ),
        ({"bad_words": "word"}, "bad_words", "bad_words must be a list of strings"),
    ],
)
def test_bad_values_are_refused_naming_the_field(fields, param, message):
    with pytest.raises(InvalidRequestError, match=re.escape(message)) as e:
        SamplingParams(**fields)
    assert e.value.param == param


def test_min_tokens_holds_back_eos_and_stop_tokens(tiny_llm):
    plain = greedy(tiny_llm, ignore_eos=True).token_ids
    assert greedy(tiny_llm, logit_bias={EOS: FORCE}).token_ids == [EOS]
    held = greedy(tiny_llm, logit_bias={EOS: FORCE}, min_tokens=3)
    assert held.token_ids == [*plain[:3], EOS] and (held.finish_reason, held.stop_reason) == (FinishReason.STOP, None)
    held = greedy(tiny_llm, logit_bias={Z: FORCE}, stop_token_ids=[Z], min_tokens=2)
    assert held.token_ids == [*plain[:2], Z] and held.stop_reason == Z


def test_min_tokens_ignores_stop_strings_that_end_before_it(tiny_llm):
    """Every token is "z": a stop string counts once it ends in the text after the min_tokens-th token."""
    zs = {"logit_bias": {Z: FORCE}}
    cut = greedy(tiny_llm, stop=["zz"], **zs)
    assert (cut.text, cut.token_ids) == ("", [Z] * 2)
    held = greedy(tiny_llm, stop=["zz"], min_tokens=3, **zs)
    assert (held.text, held.token_ids, held.stop_reason) == ("zz", [Z] * 4, "zz")
    whole = greedy(tiny_llm, stop=["z"], min_tokens=4, max_tokens=4, **zs)
    assert (whole.text, whole.finish_reason) == ("zzzz", FinishReason.LENGTH)


def test_batched_rows_with_min_tokens_and_bans_get_what_they_get_alone(tiny_llm):
    params = [
        SamplingParams(temperature=0, max_tokens=6, min_tokens=3, logit_bias={EOS: FORCE}),
        SamplingParams(temperature=0, max_tokens=6, logit_bias={EOS: FORCE}),
        SamplingParams(temperature=0.8, seed=1, max_tokens=6, min_tokens=5, stop_token_ids=[Z]),
        SamplingParams(temperature=0.8, seed=1, max_tokens=6, stop_token_ids=[Z]),
        SamplingParams(temperature=0.8, seed=2, max_tokens=6, allowed_token_ids=[Z, Z - 1, Z - 2]),
        SamplingParams(temperature=0, max_tokens=6, bad_words=["zz"], logit_bias={Z: FORCE}),
    ]
    prompts = ["hi", "ab", "xyz", "Q", "hi", "ab"]
    batched = [o.outputs[0].token_ids for o in tiny_llm.generate(prompts, params)]
    alone = [tiny_llm.generate([p], q)[0].outputs[0].token_ids for p, q in zip(prompts, params, strict=True)]
    assert batched == alone and len(batched[0]) == 4 and batched[1] == [EOS]


def test_include_stop_str_in_output_keeps_the_stop_string_and_streams_it(tiny_llm):
    zs = {"logit_bias": {Z: FORCE}}
    assert greedy(tiny_llm, stop=["zz"], **zs).text == ""
    kept = greedy(tiny_llm, stop=["zz"], include_stop_str_in_output=True, **zs)
    assert (kept.text, kept.stop_reason) == ("zz", "zz")
    params = SamplingParams(
        temperature=0, max_tokens=8, stop=["zz"], min_tokens=3, include_stop_str_in_output=True, **zs
    )
    chunks = list(tiny_llm.stream("hi", params))
    assert "".join(c.delta for c in chunks) == chunks[-1].output.text == "zzzz"


def test_include_stop_str_in_output_keeps_a_stop_tokens_text(tiny_llm):
    params = {"logit_bias": {Z: FORCE}, "stop_token_ids": [Z]}
    assert greedy(tiny_llm, **params).text == ""
    assert greedy(tiny_llm, include_stop_str_in_output=True, **params).text == "z"


def test_skip_special_tokens_false_shows_them_never_spaced(tiny_llm):
    starts = {"logit_bias": {IM_START: FORCE}, "max_tokens": 2}
    assert greedy(tiny_llm, **starts).text == ""
    for spaces in (True, False):
        shown = greedy(tiny_llm, skip_special_tokens=False, spaces_between_special_tokens=spaces, **starts)
        assert shown.text == "<|im_start|><|im_start|>"


def test_min_tokens_holds_under_speculative_decoding(tiny_gguf):
    """The n-gram proposer drafts "z" after "z"s: each verify row is held back as its position's decode step is."""
    llm = LLM(
        model=tiny_gguf, speculative_config={"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1}
    )
    params = SamplingParams(temperature=0, max_tokens=10, min_tokens=4, logit_bias={EOS: FORCE, Z: FORCE - 1})
    assert llm.generate(["zzzzzzzz"], params)[0].outputs[0].token_ids == [Z] * 4 + [EOS]
    params = SamplingParams(
        temperature=0, max_tokens=10, min_tokens=5, stop=["zz"], include_stop_str_in_output=True, logit_bias={Z: FORCE}
    )
    assert llm.generate(["zzzzzzzz"], params)[0].outputs[0].text == "z" * 6
    assert llm.engine.stats().spec_decode.accepted_tokens > 0


def test_allowed_token_ids_restrict_every_token(tiny_llm):
    drawn = greedy(tiny_llm, ignore_eos=True, allowed_token_ids=[ord("a") + 3, ord("b") + 3], temperature=1.0, seed=0)
    assert set(drawn.text) <= {"a", "b"} and len(drawn.token_ids) == 8
    with pytest.raises(InvalidRequestError, match=re.escape("allowed_token_ids out of range [0, 259): [259]")) as e:
        greedy(tiny_llm, allowed_token_ids=[3, 259])
    assert e.value.param == "allowed_token_ids"


def test_bad_words_ban_the_last_token_after_the_others(tiny_llm):
    """ "z" all but forced and "y" next: banning "zz" makes every other token "y"; a one-token word is banned
    everywhere."""
    zy = {"logit_bias": {Z: FORCE, Z - 1: FORCE / 2}, "ignore_eos": True}
    assert greedy(tiny_llm, **zy).text == "z" * 8
    assert greedy(tiny_llm, bad_words=["zz"], **zy).text == "zy" * 4
    assert greedy(tiny_llm, bad_words=["zzy"], **zy).text == "z" * 8
    assert "z" not in greedy(tiny_llm, bad_words=["z"], **zy).text


def test_a_bad_word_is_banned_with_a_leading_space_where_that_is_another_token_of_the_same_count():
    vocab = {"hi": [5], " hi": [7], "two words": [8, 9], " two words": [10, 11, 9], "x": [3], " x": [3]}
    assert bad_word_token_ids(["hi", "  two words", "x"], vocab.__getitem__) == [[5], [7], [8, 9], [3]]


def test_each_rows_bans_are_its_own():
    """min_tokens bans the stop tokens and EOS (not with ignore_eos) while short of it; a bad word bans its last
    token after its others; allowed_token_ids bans the rest; a row with none keeps everything."""
    rows = [
        SamplingRow(SamplingParams(min_tokens=2, stop_token_ids=[5]), output_ids=[1], eos_token_ids=[9]),
        SamplingRow(SamplingParams(min_tokens=2, ignore_eos=True), output_ids=[1], eos_token_ids=[9]),
        SamplingRow(SamplingParams(min_tokens=1, stop_token_ids=[5]), output_ids=[1], eos_token_ids=[9]),
        SamplingRow(SamplingParams(), output_ids=[3, 4], bad_words=[[3, 4, 7], [3, 6], [8]]),
        SamplingRow(SamplingParams(allowed_token_ids=[0, 2])),
        SamplingRow(SamplingParams()),
    ]
    banned = apply_bans(torch.zeros(len(rows), 10), rows).isinf()
    assert [row.nonzero().flatten().tolist() for row in banned] == [
        [5, 9],
        [],
        [],
        [7, 8],
        [1, 3, 4, 5, 6, 7, 8, 9],
        [],
    ]
