"""Batch invariance, in every weight format the engine runs here: a request's token ids and logprobs are exactly
those it gets alone, whatever shares its steps — prefill chunks of other lengths (some widened to float matmuls,
some on the integer kernels), decodes, a tight token budget, a prefix cache hit, a preemption."""

import pytest
from engine_support import run

from rooftop import LLM, SamplingParams
from rooftop.config import EngineConfig
from rooftop.engine.llm_engine import LLMEngine

FORMATS = [("float32", "float"), ("bfloat16", "float"), ("float32", "int8"), ("float32", "int4")]
# prompt lengths in byte tokens: on the narrow path (< 96), widened (96..256), and 256-token chunks and a rest
LENGTHS = [3, 17, 95, 96, 130, 300, 520]
GREEDY = dict(temperature=0, max_tokens=8, ignore_eos=True, logprobs=1)
POOL = dict(num_kv_blocks=256)  # 4096 tokens: room for all of them, without zeroing the default 1 GiB per engine


def prompt(i: int, n: int) -> str:
    return "".join(chr(97 + (i * 7 + k * k) % 26) for k in range(n))


@pytest.fixture(scope="module", params=FORMATS, ids=["fp32", "bf16", "int8", "int4"])
def llm(request, long_gguf):
    dtype, weights = request.param
    return LLM(model=long_gguf, dtype=dtype, weights=weights)


def requests(sampling: dict) -> list[tuple[str, str, SamplingParams]]:
    return [
        (f"r{i}", prompt(i, n), SamplingParams(**sampling, seed=None if sampling["temperature"] == 0 else 100 + i))
        for i, n in enumerate(LENGTHS)
    ]


def alone(llm, reqs) -> dict:
    """Each request on its own, on an engine without a prefix cache: nothing shares its steps or its K/V."""
    out = {}
    for r in reqs:
        out |= run(LLMEngine(llm.model, llm.tokenizer, EngineConfig(enable_prefix_caching=False, **POOL)), [r])
    return out


def assert_batch_invariant(llm, preempt: bool) -> None:
    """For the architecture tests: prompts of 3-300 tokens (a 300-token one in two chunks, some widened, some on the
    narrow path) sharing steps of a 300-token budget with decodes, each getting what it gets alone; and with
    `preempt`, four 100-character prompts in a pool too small for them all, the latest preempted and recomputed."""
    greedy = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=1)
    reqs = [(f"r{i}", prompt(i, n), greedy) for i, n in enumerate([3, 40, 130, 300])]
    eng = LLMEngine(llm.model, llm.tokenizer, EngineConfig(max_num_batched_tokens=300, **POOL))
    assert_same(run(eng, reqs), alone(llm, reqs))
    if preempt:
        long = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True, logprobs=1)
        reqs = [(f"p{i}", prompt(i, 100), long) for i in range(4)]
        eng = LLMEngine(llm.model, llm.tokenizer, EngineConfig(num_kv_blocks=30, block_size=16))
        assert_same(run(eng, reqs), alone(llm, reqs))
        assert eng.stats().preemptions > 0


def assert_same(batched: dict, reference: dict) -> None:
    assert batched.keys() == reference.keys()
    for rid, out in batched.items():
        ref = reference[rid]
        assert out.token_ids == ref.token_ids, rid
        assert [e.logprob for e in out.logprobs] == [e.logprob for e in ref.logprobs], rid


@pytest.mark.parametrize("sampling", [GREEDY, dict(GREEDY, temperature=0.8, top_p=0.9)], ids=["greedy", "seeded"])
def test_batched_requests_get_what_they_get_alone(llm, sampling):
    """All at once and arriving one by one, in steps of at most 300 tokens: a 256-token chunk waits for a
    step it fits in, decodes and short prefills fill the rest; then again on the same engine, now finding their
    own whole chunks in the prefix cache."""
    reqs = requests(sampling)
    reference = alone(llm, reqs)
    eng = LLMEngine(llm.model, llm.tokenizer, EngineConfig(max_num_batched_tokens=300, **POOL))
    assert_same(run(eng, reqs), reference)
    assert eng.stats().prefix_hits == 0
    assert_same(
        run(eng, [(f"again-{rid}", p, params) for rid, p, params in reqs], arrive_every=2),
        {f"again-{rid}": out for rid, out in reference.items()},
    )
    assert eng.stats().prefix_hits >= 256 + 512  # the 300- and 520-token prompts' whole chunks


def test_a_preempted_request_gets_what_it_gets_alone(llm):
    """A pool too small for all of them: the latest arrivals are preempted, recomputed in their own chunks and
    their generated tokens replayed one decode each, so nothing they return changes."""
    params = SamplingParams(**dict(GREEDY, max_tokens=32))
    reqs = [(f"r{i}", prompt(i, 100), params) for i in range(4)]  # 7 blocks each at admission, 9 when done
    reference = alone(llm, reqs)
    eng = LLMEngine(llm.model, llm.tokenizer, EngineConfig(num_kv_blocks=30, block_size=16))
    assert_same(run(eng, reqs), reference)
    assert eng.stats().preemptions > 0


def test_without_batch_invariance_the_engine_still_serves(llm):
    """--no-batch-invariant: chunks end where the budget does and whole steps widen; every request completes with
    the tokens it asked for (which may differ from its alone run in the last bits: not asserted)."""
    eng = LLMEngine(llm.model, llm.tokenizer, EngineConfig(max_num_batched_tokens=300, batch_invariant=False, **POOL))
    out = run(eng, requests(GREEDY))
    assert sorted(out) == sorted(f"r{i}" for i in range(len(LENGTHS)))
    assert all(len(o.token_ids) == GREEDY["max_tokens"] for o in out.values())
