"""Greedy runs compared across paths whose float rounding differs (a quantized format, bfloat16, rooftop's kernels
against PyTorch's ops, transformers, a batch against a request alone): they may part where the reference's own top
two logits nearly tie, and only there. Which way a near-tie breaks follows the host's rounding (its vector width,
its BLAS), so a fixed token index at which two runs must still agree holds on one host and not the next; whether a
position is a near-tie is the reference's own margin, which no host moves by more than the paths' tolerance."""

from __future__ import annotations

from collections.abc import Callable

import torch

# int8/int4 weights with int8 activations, or bfloat16, move the bundled model's logits by ~0.1-0.3
QUANTIZED_TIE = 0.5
# two float32 paths: logits within ~4e-3 of each other (test_bundled_parity's tolerance), so margins within ~8e-3
FLOAT_TIE = 0.01

Logits = Callable[[list[int]], torch.Tensor]  # token ids -> the logits for the token after each, (len(ids), vocab)


def rooftop_logits(llm) -> Logits:
    """`llm`'s logits at every position of `ids`: one float32 prefill into a fresh cache, nothing reused."""
    from rooftop.models.kv_cache import KVCache

    def logits(ids: list[int]) -> torch.Tensor:
        with torch.inference_mode():
            model = llm.model
            return model.logits(
                model.forward(torch.tensor(ids), KVCache(llm.config, len(ids), torch.float32, "cpu"), 0)
            )

    return logits


def first_difference(own: list[int], ref: list[int]) -> int | None:
    return next((i for i, (a, b) in enumerate(zip(own, ref, strict=False)) if a != b), None)


def parting(logits_of: Logits, prompt_ids: list[int], own: list[int], ref: list[int]) -> tuple[int, float] | None:
    """Where greedy run `own` first parts from the reference's greedy run `ref` (both continue `prompt_ids`), with
    the reference's margin there: its logit for its own token over `own`'s (at least its top-1 minus its top-2).
    None where they agree throughout."""
    i = first_difference(own, ref)
    if i is None:
        return None
    logits = logits_of(prompt_ids + ref[:i])[-1]
    return i, float(logits[ref[i]] - logits[own[i]])


def assert_parts_only_at_a_near_tie(
    logits_of: Logits, prompt_ids: list[int], own: list[int], ref: list[int], tie: float
) -> None:
    found = parting(logits_of, prompt_ids, own, ref)
    assert found is None or found[1] < tie, f"parted at token {found[0]}, where the reference leads by {found[1]:.4f}"


def greedy_partings(logits_of: Logits, llm, prompt_ids: list[int], ref: list[int]) -> list[tuple[int, float]]:
    """Every place where `llm`'s greedy run parts from the reference's `ref`, each with the reference's margin as
    `parting` gives it: after each parting `llm` goes on from the reference's token, so all of `ref` is compared."""
    from rooftop import SamplingParams

    found, start, reference = [], 0, None
    while start < len(ref):
        params = SamplingParams(max_tokens=len(ref) - start, temperature=0, ignore_eos=True)
        own = llm.generate([prompt_ids + ref[:start]], params)[0].token_ids
        i = first_difference(own, ref[start:])
        if i is None:
            break
        if reference is None:  # the reference's logits at each of its tokens, once
            reference = logits_of(prompt_ids + ref)[len(prompt_ids) - 1 :]
        found.append((start + i, float(reference[start + i, ref[start + i]] - reference[start + i, own[i]])))
        start += i + 1
    return found
