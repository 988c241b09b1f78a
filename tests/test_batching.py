"""Continuous batching: batched greedy == alone (also with preemption, chunking, prefix hits), the engine API."""

import pytest
from near_ties import FLOAT_TIE, assert_parts_only_at_a_near_tie, rooftop_logits

from rooftop import SamplingParams
from rooftop.config import EngineConfig
from rooftop.engine.llm_engine import LLMEngine

GREEDY = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)
PROMPTS = [
    "The capital of France is",
    "1, 2, 3, 4,",
    "Once upon a time, in a land far away, there lived a",
    "def fibonacci(n):",
    "The three primary colours are",
    "Water boils at",
    "A haiku about the sea:",
    "Translate to French: good morning, my friend. How are you today? I hope the weather is fine where you are.",
    "Q: What is 12 times 12?\nA:",
    "The quick brown fox",
    "In machine learning, a transformer is a neural network architecture that",
    "List of planets:",
    "My favourite food is",
    "import numpy as np\nx = np.arange(10)\nprint(",
    "The largest ocean on Earth is the",
    "Roses are red, violets are blue,",
]


class RecordingEngine(LLMEngine):
    """The engine, keeping every step's record for the assertions below."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.records = []

    def step(self):
        out = super().step()
        if out.record is not None:
            self.records.append(out.record)
        return out


def engine(llm, **options):
    return RecordingEngine(llm.model, llm.tokenizer, EngineConfig(**options))


def run_all(eng, prompts, params=GREEDY, check=None):
    for i, p in enumerate(prompts):
        eng.add_request(str(i), p, params)
    outputs = {}
    while eng.has_unfinished():
        for d in eng.step().deltas:
            if d.finished:
                outputs[d.request_id] = d.output
        if check:
            check(eng)
    return [outputs[str(i)] for i in range(len(prompts))]


def assert_same_greedy(llm, outs, expected):
    """Each output has the tokens its prompt gets alone, but where float32 itself nearly ties: a batch, a chunk or a
    recomputation after preemption runs matmuls of other shapes, whose rounding the host's BLAS decides (these
    sequences hold near-ties down to 0.005)."""
    assert len(outs) == len(expected)
    for out, ref in zip(outs, expected, strict=True):
        assert len(out.token_ids) == len(ref)
        assert_parts_only_at_a_near_tie(rooftop_logits(llm), out.prompt_token_ids, out.token_ids, ref, FLOAT_TIE)


def assert_blocks_consistent(eng):
    """Every block's reference count equals the number of live block tables holding it (white-box: the engine's
    own request table and block pool)."""
    holders = {}
    for seq in eng._requests.values():
        for b in seq.block_table:
            holders[b] = holders.get(b, 0) + 1
    for block in eng._blocks.blocks:
        assert block.ref_count == holders.get(block.id, 0), block


def assert_all_released(eng):
    assert all(b.ref_count == 0 for b in eng._blocks.blocks)
    assert eng._blocks.num_free == eng._blocks.num_blocks
    assert len(eng._blocks.free_ids) + len(eng._blocks.evictable) == eng._blocks.num_blocks
    assert len(set(eng._blocks.free_ids) | set(eng._blocks.evictable)) == eng._blocks.num_blocks


@pytest.fixture(scope="module")
def alone(bundled_llm):
    """Each prompt's tokens with nothing beside it in its steps: one after the other in one engine without a prefix
    cache (a fresh engine each touched a fresh KV pool: ~0.25 s more per prompt)."""
    eng = engine(bundled_llm, enable_prefix_caching=False)
    return [run_all(eng, [p])[0].token_ids for p in PROMPTS]


@pytest.mark.slow
def test_batched_equals_alone(bundled_llm, alone):
    eng = engine(bundled_llm)
    outs = run_all(eng, PROMPTS, check=assert_blocks_consistent)
    assert_same_greedy(bundled_llm, outs, alone)
    assert max(r.shape.num_seqs for r in eng.records) == 16
    assert any(r.phase == "decode" and r.shape.num_seqs > 8 for r in eng.records)
    assert_all_released(eng)


@pytest.mark.slow
def test_preemption_keeps_outputs(bundled_llm, alone):
    eng = engine(bundled_llm, num_kv_blocks=12, block_size=4)  # 48 tokens for 16 requests of ~15-40
    outs = run_all(eng, PROMPTS, check=assert_blocks_consistent)
    assert eng.stats().preemptions > 0
    assert_same_greedy(bundled_llm, outs, alone)
    assert_all_released(eng)


@pytest.mark.slow
def test_chunked_prefill_keeps_outputs(bundled_llm, alone):
    eng = engine(bundled_llm, max_num_batched_tokens=7)
    outs = run_all(eng, PROMPTS, check=assert_blocks_consistent)
    assert_same_greedy(bundled_llm, outs, alone)
    assert all(r.shape.tokens <= 7 for r in eng.records)
    assert any(s.new > 1 and s.cached > 0 for r in eng.records for s in r.shape.seqs)  # a later chunk
    assert any(r.phase == "mixed" for r in eng.records)  # chunks and decodes in one step
    assert_all_released(eng)


@pytest.mark.slow
def test_shared_system_prompt_hits_the_prefix_cache(bundled_llm):
    """With batch invariance the cache is reused in whole chunks (here 32 tokens): a hit holds exactly the K/V the
    prompt's own chunks compute, so the outputs are those of an engine without a prefix cache, token for token."""
    system = "You are a careful assistant. " * 12  # about 70 tokens: several full blocks
    prompts = [
        bundled_llm.tokenizer.apply_chat_template(
            [{"role": "system", "content": system}, {"role": "user", "content": q}]
        )
        for q in ("Name a fruit.", "Name a colour.", "Name a city.", "Name a river.")
    ]
    uncached = engine(bundled_llm, enable_prefix_caching=False, chunked_prefill_size=32)
    expected = [run_all(uncached, [p])[0].token_ids for p in prompts]
    eng = engine(bundled_llm, chunked_prefill_size=32)
    first = run_all(eng, prompts[:1])
    assert eng.stats().prefix_hits == 0
    rest = run_all(eng, prompts[1:], check=assert_blocks_consistent)
    assert eng.stats().prefix_hits >= 2 * 32 * 3  # each later prompt found the system prompt's whole chunks
    assert [out.token_ids for out in first + rest] == expected
    hit_steps = [s for r in eng.records for s in r.shape.seqs if s.cached > 0 and s.new > 1]
    assert hit_steps, "prefills that start after cached blocks"
    assert_all_released(eng)
