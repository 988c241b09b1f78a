"""Sampling: validation of SamplingParams, the support each filter keeps, penalties and seeded draws."""

import math

import pytest
import torch

from rooftop import InvalidRequestError, SamplingParams
from rooftop.engine.sampler import (
    SamplingRow,
    apply_logit_bias,
    apply_presence_frequency_penalties,
    apply_repetition_penalty,
    filter_logits,
    sample,
    token_logprob,
)

PROBS = torch.tensor([0.5, 0.3, 0.15, 0.05])
LOGITS = PROBS.log()


def filter_one(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    return filter_logits(logits[None], [params])[0]


def sample_one(logits, params, seen=(), generator=None, output_ids=()) -> int:
    return sample(logits[None], [SamplingRow(params, generator, seen, output_ids)])[0]


def support(logits: torch.Tensor) -> set[int]:
    return set(torch.nonzero(torch.isfinite(logits)).flatten().tolist())


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"max_tokens": 0}, "max_tokens must be an integer >= 1"),
        ({"temperature": -0.1}, "temperature must be a finite number >= 0"),
        ({"top_p": 0.0}, r"top_p must be in \(0, 1\]"),
        ({"top_p": 1.5}, r"top_p must be in \(0, 1\]"),
        ({"top_k": -2}, "top_k must be an integer >= 0"),
        ({"min_p": -0.1}, r"min_p must be in \[0, 1\]"),
        ({"min_p": 1.5}, r"min_p must be in \[0, 1\]"),
        ({"repetition_penalty": 0.0}, "repetition_penalty must be a finite number > 0"),
        ({"stop": [""]}, "stop must be a non-empty string or a list of them"),
        # values of the wrong type, and non-finite ones, were let through to fail (or mislead) inside a step
        ({"stop": 123}, "stop must be a non-empty string or a list of them, got 123"),
        ({"stop_token_ids": ["a", 5]}, r"stop_token_ids must be a list of token ids \(integers >= 0\)"),
        ({"stop_token_ids": [-1]}, "stop_token_ids must be a list of token ids"),
        ({"stop_token_ids": 5}, "stop_token_ids must be a list of token ids"),
        ({"logprobs": True}, r"logprobs must be an integer in \[0, 20\], got True"),
        ({"temperature": float("inf")}, "temperature must be a finite number"),
        ({"temperature": "a"}, "temperature must be a finite number"),
        ({"temperature": None}, "temperature must be a finite number"),
        ({"repetition_penalty": float("inf")}, "repetition_penalty must be a finite number"),
        ({"max_tokens": True}, "max_tokens must be an integer >= 1 or None"),
        ({"seed": True}, "seed must be an integer"),
        ({"ignore_eos": "yes"}, "ignore_eos must be true or false, got 'yes'"),
        ({"logit_bias": {5: 101}}, r"biases in \[-100, 100\]"),
        ({"logit_bias": {-1: 1}}, "logit_bias maps token ids"),
        ({"logit_bias": {"5": 1}}, "logit_bias maps token ids"),
        ({"logit_bias": {5: float("nan")}}, "logit_bias maps token ids"),
    ],
)
def test_invalid_params_raise_typed_errors(kwargs, message):
    with pytest.raises(InvalidRequestError, match=message):
        SamplingParams(**kwargs)


def test_single_stop_string_becomes_a_list():
    assert SamplingParams(stop="###").stop == ["###"]


def test_vllms_spellings_of_off_and_of_no_limit_are_taken():
    """top_k -1 is vLLM's "consider all tokens" (its old default), max_tokens None its "until EOS or the context's
    end": both were refused."""
    assert SamplingParams(top_k=-1).top_k == 0
    assert SamplingParams(seed=-1).seed is None  # vLLM's "no seed": it was a fixed seed
    assert SamplingParams(max_tokens=None, min_tokens=3).max_tokens is None


def test_top_k_keeps_the_k_largest():
    logits = torch.tensor([0.1, 3.0, -1.0, 2.0, 5.0, 0.0])
    assert support(filter_one(logits, SamplingParams(top_k=3))) == {1, 3, 4}


@pytest.mark.parametrize(
    "top_p, expected", [(0.4, {0}), (0.7, {0, 1}), (0.8, {0, 1}), (0.81, {0, 1, 2}), (1.0, {0, 1, 2, 3})]
)
def test_top_p_keeps_the_smallest_set_covering_p(top_p, expected):
    assert support(filter_one(LOGITS, SamplingParams(top_p=top_p))) == expected


@pytest.mark.parametrize("min_p, expected", [(0.2, {0, 1, 2}), (0.5, {0, 1}), (0.9, {0}), (0.0, {0, 1, 2, 3})])
def test_min_p_drops_tokens_below_a_fraction_of_the_top(min_p, expected):
    assert support(filter_one(LOGITS, SamplingParams(min_p=min_p))) == expected


def test_temperature_scales_logits():
    out = filter_one(torch.tensor([2.0, -4.0]), SamplingParams(temperature=2.0))
    assert out.tolist() == [1.0, -2.0]


def test_draws_stay_inside_the_filtered_support():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(100, generator=torch.Generator().manual_seed(1))
    params = SamplingParams(top_k=5, temperature=1.5)
    allowed = support(filter_one(logits, params))
    draws = {sample_one(logits, params, [], gen) for _ in range(300)}
    assert draws <= allowed and len(draws) > 1


def test_top_p_draws_follow_the_renormalized_nucleus():
    """The nucleus found among the top candidates and the draw among the kept tokens give the same distribution
    as sorting the whole vocabulary and drawing over all of it."""
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    params = SamplingParams(top_p=0.8, temperature=1.0)
    gen = torch.Generator().manual_seed(3)
    draws = [sample_one(logits, params, [], gen) for _ in range(4000)]
    assert set(draws) == {0, 1}  # 0.5 + 0.3 covers 0.8: tokens 2 and 3 are dropped
    assert abs(draws.count(0) / 4000 - 0.5 / 0.8) < 0.03


def test_a_flat_top_p_nucleus_beyond_the_candidates_is_exact():
    from rooftop.engine.sampler import TOP_P_CANDIDATES

    logits = torch.zeros(4 * TOP_P_CANDIDATES)  # uniform: the nucleus is 90% of the vocabulary
    kept = support(filter_one(logits, SamplingParams(top_p=0.9)))
    assert len(kept) == int(0.9 * len(logits)) + 1 or len(kept) == int(0.9 * len(logits))


def nucleus(logits: torch.Tensor, top_p: float) -> set[int]:
    """The top-p support by sorting the whole row: the reference."""
    probs, ids = torch.sort(logits.softmax(-1), descending=True)
    return set(ids[(probs.cumsum(-1) - probs) < top_p].tolist())


def test_a_nucleus_of_thousands_is_found_exactly_without_sorting_the_vocabulary():
    """A row whose nucleus needs thousands of tokens (a real model at temperature 1, top_p 0.95) is filtered
    exactly, from a topk a few times the nucleus, not the whole vocabulary; a row with top-k but no top-p beside it
    needs nothing more than its k (it had sent the batch to a full sort at every step)."""
    from rooftop.engine.sampler import candidates

    logits = torch.randn(2, 49152, generator=torch.Generator().manual_seed(6)) * 4
    params = [SamplingParams(top_p=0.95), SamplingParams(top_k=40)]
    c = candidates(logits, params)
    expected = nucleus(logits[0], 0.95)
    assert 256 < len(expected) < 8192 and c.ids.shape[1] < logits.shape[1] // 2
    assert set(c.ids[0][c.keep[0]].tolist()) == expected
    assert set(c.ids[1][c.keep[1]].tolist()) == set(torch.topk(logits[1], 40).indices.tolist())
    narrow = torch.randn(2, 49152, generator=torch.Generator().manual_seed(7)) * 20  # nuclei of a few tokens
    assert candidates(narrow, params).ids.shape[1] == 256
    empty = torch.cat([logits[:1], torch.full((1, 49152), float("-inf"))])  # a row with no token: NaN probabilities
    c = candidates(empty, [params[0], params[0]])
    assert set(c.ids[0][c.keep[0]].tolist()) == expected


def test_same_seed_same_draws():
    logits = torch.randn(1000, generator=torch.Generator().manual_seed(2))
    params = SamplingParams(temperature=1.0)

    def draws(seed):
        gen = torch.Generator().manual_seed(seed)
        return [sample_one(logits, params, [], gen) for _ in range(20)]

    assert draws(7) == draws(7)
    assert draws(7) != draws(8)


def test_greedy_is_argmax():
    logits = torch.tensor([0.1, 0.7, 0.3])
    assert sample_one(logits, SamplingParams(temperature=0), [], None) == 1


def test_repetition_penalty_divides_positive_and_multiplies_negative():
    logits = torch.tensor([2.0, -2.0, 1.0])
    out = apply_repetition_penalty(logits, torch.tensor([0, 1]), 2.0)
    assert out.tolist() == [1.0, -4.0, 1.0]


def test_repetition_penalty_changes_greedy_choice():
    logits = torch.tensor([1.0, 0.9, -math.inf])
    params = SamplingParams(temperature=0, repetition_penalty=1.5)
    assert sample_one(logits, params, [0], None) == 1
    assert sample_one(logits, SamplingParams(temperature=0), [0], None) == 0


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"presence_penalty": 2.5}, r"presence_penalty must be in \[-2, 2\]"),
        ({"frequency_penalty": -3.0}, r"frequency_penalty must be in \[-2, 2\]"),
        ({"logprobs": 21}, r"logprobs must be an integer in \[0, 20\]"),
        ({"logprobs": -1}, r"logprobs must be an integer in \[0, 20\]"),
    ],
)
def test_invalid_penalties_and_logprobs_raise(kwargs, message):
    with pytest.raises(InvalidRequestError, match=message):
        SamplingParams(**kwargs)


def test_presence_and_frequency_penalties_count_generated_tokens():
    out = apply_presence_frequency_penalties(torch.tensor([1.0, 1.0, 1.0]), [0, 0, 1], presence=0.5, frequency=0.25)
    assert out.tolist() == [0.0, 0.25, 1.0]


def test_presence_penalty_changes_greedy_choice_and_spares_the_prompt():
    logits = torch.tensor([1.0, 0.9, -math.inf])
    params = SamplingParams(temperature=0, presence_penalty=0.5)
    assert sample_one(logits, params, [0], None) == 0  # 0 was only in the prompt
    assert sample_one(logits, params, [0], None, output_ids=[0]) == 1


def test_token_logprob_is_the_log_softmax_with_the_top_k_best_first():
    logits = torch.tensor([2.0, 0.5, 3.0, -1.0])
    entry = token_logprob(logits, 1, 2)
    expected = logits.log_softmax(-1)
    assert entry.token_id == 1 and entry.logprob == pytest.approx(float(expected[1]))
    assert [i for i, _ in entry.top] == [2, 0]
    assert entry.top[0][1] == pytest.approx(float(expected[2]))
    assert token_logprob(logits, 1, 0).top == []
    assert len(token_logprob(logits, 1, 20).top) == 4  # never more than the vocabulary


BATCH_PARAMS = [
    SamplingParams(temperature=0),
    SamplingParams(top_k=3),
    SamplingParams(top_p=0.8, temperature=0.7),
    SamplingParams(min_p=0.2),
    SamplingParams(temperature=1.3),
    SamplingParams(top_k=50, top_p=0.5, min_p=0.05),
]


def test_a_batch_is_filtered_as_each_row_alone():
    logits = torch.randn(len(BATCH_PARAMS), 300, generator=torch.Generator().manual_seed(3)) * 3
    batched = filter_logits(logits, BATCH_PARAMS)
    for i, params in enumerate(BATCH_PARAMS[1:], start=1):
        alone = filter_one(logits[i], params)
        assert support(batched[i]) == support(alone), params
        assert torch.equal(batched[i][torch.isfinite(alone)], alone[torch.isfinite(alone)])


def test_a_seeded_row_draws_the_same_tokens_whatever_shares_its_batch():
    logits = torch.randn(len(BATCH_PARAMS), 300, generator=torch.Generator().manual_seed(4)) * 2

    def seeded_draws(neighbours: bool) -> list[int]:
        gen = torch.Generator().manual_seed(11)
        row = SamplingRow(SamplingParams(top_p=0.9), gen)
        draws = []
        for _ in range(30):
            if neighbours:
                rows = [SamplingRow(p) for p in BATCH_PARAMS] + [row]
                draws.append(sample(torch.cat([logits, logits[2:3]]), rows)[-1])
            else:
                draws.append(sample(logits[2:3], [row])[0])
        return draws

    alone = seeded_draws(neighbours=False)
    assert seeded_draws(neighbours=True) == alone and len(set(alone)) > 1


def test_batched_draws_stay_inside_each_rows_support():
    logits = torch.randn(len(BATCH_PARAMS), 300, generator=torch.Generator().manual_seed(5)) * 3
    rows = [SamplingRow(p, torch.Generator().manual_seed(i)) for i, p in enumerate(BATCH_PARAMS)]
    supports = [support(filter_one(logits[i], p)) for i, p in enumerate(BATCH_PARAMS)]
    for _ in range(50):
        tokens = sample(logits, rows)
        assert tokens[0] == int(logits[0].argmax())
        assert all(t in allowed for t, allowed in zip(tokens[1:], supports[1:], strict=True))


def test_extreme_accepted_values_still_sample():
    """A top_p that float32 rounds to 0 keeps the most likely token; a repetition penalty that float32 rounds to 0 or
    inf pushes the seen tokens to the ends of the finite range instead of making the row NaN."""
    logits = torch.tensor([0.5, 2.0, -1.0, 1.0])
    gen = torch.Generator().manual_seed(0)
    assert {sample_one(logits, SamplingParams(top_p=1e-46), generator=gen) for _ in range(20)} == {1}
    assert sample_one(logits, SamplingParams(temperature=0, repetition_penalty=1e-300), seen=[2]) == 1
    boosted = apply_repetition_penalty(logits, torch.tensor([0, 2]), 1e-300)
    assert torch.isfinite(boosted).all() and boosted[0] == torch.finfo(torch.float32).max
    damped = apply_repetition_penalty(logits, torch.tensor([1, 2]), 1e300)
    assert torch.isfinite(damped).all() and damped[1] == 0 and damped[2] == -torch.finfo(torch.float32).max


def test_logit_bias_is_added_to_its_own_rows_only():
    logits = torch.randn(3, 300, generator=torch.Generator().manual_seed(6))
    rows = [SamplingRow(SamplingParams(logit_bias={7: 2.5, 9: -100})), SamplingRow(SamplingParams())]
    rows.append(SamplingRow(SamplingParams(temperature=0, logit_bias={7: 100})))
    biased = apply_logit_bias(logits, rows)
    expected = logits.clone()
    expected[0, 7] += 2.5
    expected[0, 9] -= 100
    expected[2, 7] += 100
    assert torch.equal(biased, expected) and apply_logit_bias(logits, rows[1:2]) is logits
    # +100 all but forces a token, -100 all but bans one, greedy or drawn
    assert sample(logits, rows)[2] == 7
    gen = torch.Generator().manual_seed(1)
    best = int(logits[1].argmax())
    banned = SamplingParams(temperature=0.5, logit_bias={best: -100})
    assert best not in {sample_one(logits[1], banned, generator=gen) for _ in range(50)}
