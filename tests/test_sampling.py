"""Sampling: validation of SamplingParams, the support each filter keeps, penalties and seeded draws."""

import math

import pytest
import torch

from rooftop import InvalidRequestError, SamplingParams
from rooftop.engine.sampler import apply_repetition_penalty, filter_logits, sample

PROBS = torch.tensor([0.5, 0.3, 0.15, 0.05])
LOGITS = PROBS.log()


def support(logits: torch.Tensor) -> set[int]:
    return set(torch.nonzero(torch.isfinite(logits)).flatten().tolist())


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"max_tokens": 0}, "max_tokens must be an integer >= 1"),
        ({"temperature": -0.1}, "temperature must be >= 0"),
        ({"top_p": 0.0}, r"top_p must be in \(0, 1\]"),
        ({"top_p": 1.5}, r"top_p must be in \(0, 1\]"),
        ({"top_k": -1}, "top_k must be an integer >= 0"),
        ({"min_p": -0.1}, r"min_p must be in \[0, 1\]"),
        ({"min_p": 1.5}, r"min_p must be in \[0, 1\]"),
        ({"repetition_penalty": 0.0}, "repetition_penalty must be > 0"),
        ({"stop": [""]}, "stop strings must be non-empty"),
    ],
)
def test_invalid_params_raise_typed_errors(kwargs, message):
    with pytest.raises(InvalidRequestError, match=message):
        SamplingParams(**kwargs)


def test_single_stop_string_becomes_a_list():
    assert SamplingParams(stop="###").stop == ["###"]


def test_top_k_keeps_the_k_largest():
    logits = torch.tensor([0.1, 3.0, -1.0, 2.0, 5.0, 0.0])
    assert support(filter_logits(logits, SamplingParams(top_k=3))) == {1, 3, 4}


@pytest.mark.parametrize("top_p, expected", [(0.4, {0}), (0.7, {0, 1}), (0.8, {0, 1}), (0.81, {0, 1, 2}), (1.0, {0, 1, 2, 3})])
def test_top_p_keeps_the_smallest_set_covering_p(top_p, expected):
    assert support(filter_logits(LOGITS, SamplingParams(top_p=top_p))) == expected


@pytest.mark.parametrize("min_p, expected", [(0.2, {0, 1, 2}), (0.5, {0, 1}), (0.9, {0}), (0.0, {0, 1, 2, 3})])
def test_min_p_drops_tokens_below_a_fraction_of_the_top(min_p, expected):
    assert support(filter_logits(LOGITS, SamplingParams(min_p=min_p))) == expected


def test_temperature_scales_logits():
    out = filter_logits(torch.tensor([2.0, -4.0]), SamplingParams(temperature=2.0))
    assert out.tolist() == [1.0, -2.0]


def test_draws_stay_inside_the_filtered_support():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(100, generator=torch.Generator().manual_seed(1))
    params = SamplingParams(top_k=5, temperature=1.5)
    allowed = support(filter_logits(logits, params))
    draws = {sample(logits, params, [], gen) for _ in range(300)}
    assert draws <= allowed and len(draws) > 1


def test_same_seed_same_draws():
    logits = torch.randn(1000, generator=torch.Generator().manual_seed(2))
    params = SamplingParams(temperature=1.0)

    def draws(seed):
        gen = torch.Generator().manual_seed(seed)
        return [sample(logits, params, [], gen) for _ in range(20)]

    assert draws(7) == draws(7)
    assert draws(7) != draws(8)


def test_greedy_is_argmax():
    logits = torch.tensor([0.1, 0.7, 0.3])
    assert sample(logits, SamplingParams(temperature=0), [], None) == 1


def test_repetition_penalty_divides_positive_and_multiplies_negative():
    logits = torch.tensor([2.0, -2.0, 1.0])
    out = apply_repetition_penalty(logits, torch.tensor([0, 1]), 2.0)
    assert out.tolist() == [1.0, -4.0, 1.0]


def test_repetition_penalty_changes_greedy_choice():
    logits = torch.tensor([1.0, 0.9, -math.inf])
    params = SamplingParams(temperature=0, repetition_penalty=1.5)
    assert sample(logits, params, [0], None) == 1
    assert sample(logits, SamplingParams(temperature=0), [0], None) == 0
