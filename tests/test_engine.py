"""The engine API on a tiny model: add while running, deltas, abort, errors, step records, exact metrics."""

import pytest

from rooftop import InvalidRequestError, SamplingParams
from rooftop.config import EngineConfig
from rooftop.engine.llm_engine import LLMEngine

PARAMS = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)


@pytest.fixture
def eng(tiny_llm):
    return LLMEngine(tiny_llm.model, tiny_llm.tokenizer, EngineConfig(num_kv_blocks=32, block_size=4))


def drain(eng):
    deltas = []
    while eng.has_unfinished():
        deltas += eng.step()
    return deltas


def test_requests_added_while_others_run(eng):
    eng.add_request("a", "hello there", PARAMS)
    first = eng.step()
    assert [d.request_id for d in first] == ["a"] and first[0].new_token_ids and not first[0].finished
    eng.add_request("b", "another prompt", PARAMS)
    deltas = first + drain(eng)
    for rid in ("a", "b"):
        mine = [d for d in deltas if d.request_id == rid]
        assert sum(len(d.new_token_ids) for d in mine) == 6
        assert "".join(d.text for d in mine) == mine[-1].output.text
        assert mine[-1].finished and mine[-1].finish_reason == "length"
        assert not any(d.finished for d in mine[:-1])
    assert any(r.shape.num_seqs == 2 for r in eng.step_records)


def test_abort_frees_blocks_and_unknown_abort_is_a_no_op(eng):
    eng.add_request("a", "hello there, a long-ish prompt", SamplingParams(max_tokens=20))
    eng.add_request("b", "short", SamplingParams(max_tokens=20))
    eng.step()
    assert eng.blocks.num_free < eng.blocks.num_blocks
    eng.abort("a")
    eng.abort("a")
    eng.abort("never-seen")
    drain(eng)
    assert eng.blocks.num_free == eng.blocks.num_blocks
    assert all(b.ref_count == 0 for b in eng.blocks.blocks)


def test_duplicate_request_id(eng):
    eng.add_request("x", "hi", PARAMS)
    with pytest.raises(InvalidRequestError, match="request id 'x' is already in use"):
        eng.add_request("x", "hi again", PARAMS)


def test_a_request_that_can_never_fit_fails_alone(tiny_llm):
    eng = LLMEngine(tiny_llm.model, tiny_llm.tokenizer, EngineConfig(num_kv_blocks=8, block_size=4))
    eng.add_request("ok", "fine", PARAMS)
    with pytest.raises(InvalidRequestError, match="needs up to 63 tokens of KV cache; the pool holds 32"):
        eng.add_request("big", "x" * 50, SamplingParams(max_tokens=13))
    deltas = drain(eng)
    assert deltas[-1].request_id == "ok" and deltas[-1].finished


def test_prompt_longer_than_context(tiny_llm):
    eng = LLMEngine(tiny_llm.model, tiny_llm.tokenizer, EngineConfig())
    with pytest.raises(InvalidRequestError, match="the prompt has 70 tokens; the context holds 64"):
        eng.add_request("long", "y" * 70, PARAMS)


def test_prefill_chunks_that_sample_nothing_need_no_logits(tiny_llm):
    eng = LLMEngine(tiny_llm.model, tiny_llm.tokenizer, EngineConfig(max_num_batched_tokens=4))
    eng.add_request("a", "abcdefghij", PARAMS)  # 10 prompt tokens: chunks of 4, 4, 2
    drain(eng)
    chunks = [r.shape.seqs[0] for r in list(eng.step_records)[:3]]
    assert [(s.new, s.cached, s.needs_logits) for s in chunks] == [(4, 0, False), (4, 4, False), (2, 8, True)]


def test_step_records_carry_the_step_shape(eng):
    eng.add_request("a", "abcdefgh", PARAMS)  # 8 prompt tokens
    drain(eng)
    first, second = eng.step_records[0], eng.step_records[1]
    assert first.phase == "prefill" and [(s.new, s.cached) for s in first.shape.seqs] == [(8, 0)]
    assert second.phase == "decode" and [(s.new, s.cached) for s in second.shape.seqs] == [(1, 8)]
    assert all(r.seconds > 0 for r in eng.step_records)
    assert len(eng.step_records) == 6


def test_metrics_are_exact_under_batching(eng):
    for i in range(4):
        eng.add_request(str(i), f"prompt number {i}", PARAMS, arrival_time=None)
    drain(eng)
    # drained requests are gone from eng.requests: rebuild from the final deltas instead
    eng2_outputs = []
    for i in range(4):
        eng.add_request(f"r{i}", f"prompt number {i}", PARAMS)
    for d in drain(eng):
        if d.finished:
            eng2_outputs.append(d.output)
    for out in eng2_outputs:
        m = out.metrics
        assert m.output_tokens == 6 and len(m.itl) == 5
        assert m.ttft == m.token_times[0] - m.arrival_time >= m.queue_time >= 0
        assert m.tpot == pytest.approx((m.e2e - m.ttft) / 5)
        assert m.decode_steps == 5 and m.prefill_tokens >= 1


def test_engine_config_is_validated():
    with pytest.raises(InvalidRequestError, match="max_num_seqs must be an integer >= 1"):
        EngineConfig(max_num_seqs=0)
    with pytest.raises(InvalidRequestError, match="num_kv_blocks must be an integer >= 1"):
        EngineConfig(num_kv_blocks=-3)


def test_max_num_seqs_limits_the_batch(tiny_llm):
    eng = LLMEngine(tiny_llm.model, tiny_llm.tokenizer, EngineConfig(max_num_seqs=2))
    for i in range(5):
        eng.add_request(str(i), f"p{i}", PARAMS)
    drain(eng)
    assert max(r.shape.num_seqs for r in eng.step_records) == 2


def test_interleaved_streams_and_generate_each_get_all_their_tokens(tiny_llm):
    params = SamplingParams(max_tokens=4, temperature=0)
    stream = tiny_llm.stream("hello", params)
    first = next(stream)
    other = tiny_llm.generate(["xyz"], SamplingParams(max_tokens=8, temperature=0))[0]
    rest = list(stream)
    assert len(other.token_ids) == 8 and other.finish_reason == "length"
    assert len([first, *rest]) == 4 and rest[-1].output.finished
    assert "".join(c.delta for c in [first, *rest]) == rest[-1].output.text
    a, b = tiny_llm.stream("aaa", params), tiny_llm.stream("bbb", params)
    pairs = list(zip(a, b, strict=False))
    assert [len(x.output.token_ids) for x, _ in pairs] == [1, 2, 3, 4]
    assert not tiny_llm.engine.requests and tiny_llm.engine.blocks.num_free == tiny_llm.engine.blocks.num_blocks


def test_a_stream_closed_early_frees_its_blocks(tiny_llm):
    stream = tiny_llm.stream("hello", SamplingParams(max_tokens=20, temperature=0))
    next(stream)
    assert tiny_llm.engine.requests
    stream.close()
    assert not tiny_llm.engine.requests and tiny_llm.engine.blocks.num_free == tiny_llm.engine.blocks.num_blocks


def test_bad_prompt_raises_when_the_stream_is_created(tiny_llm):
    with pytest.raises(InvalidRequestError, match="the prompt is empty"):
        tiny_llm.stream("", PARAMS)


def test_a_tiny_temperature_is_greedy(tiny_llm):
    greedy = tiny_llm.generate("hi", SamplingParams(max_tokens=4, temperature=0))[0]
    tiny = tiny_llm.generate("hi", SamplingParams(max_tokens=4, temperature=1e-45))[0]
    assert tiny.token_ids == greedy.token_ids and tiny.finish_reason == "length"


def test_sampling_steps_are_recorded_as_needing_logits(eng):
    eng.add_request("a", "abcdefgh", PARAMS)
    drain(eng)
    assert all(s.needs_logits for r in eng.step_records for s in r.shape.seqs)
    assert all(r.shape.logits_rows == 1 for r in eng.step_records)


def test_logprobs_are_recorded_per_output_token(eng):
    eng.add_request("a", "hello there", SamplingParams(max_tokens=5, temperature=0, ignore_eos=True, logprobs=3))
    eng.add_request("b", "no logprobs", PARAMS)
    deltas = drain(eng)
    mine = [d for d in deltas if d.request_id == "a"]
    entries = [e for d in mine for e in d.new_logprobs]
    assert [e.token_id for e in entries] == mine[-1].output.token_ids
    assert mine[-1].output.logprobs == entries
    for e in entries:  # greedy: the chosen token is the most likely one
        assert len(e.top) == 3 and e.top[0] == (e.token_id, e.logprob) and e.logprob <= 0
    assert all(not d.new_logprobs for d in deltas if d.request_id == "b")


def test_prefix_cache_hit_tokens_are_counted_per_request(eng):
    prompt = "a shared prompt of some length"  # 30 byte tokens: 7 full blocks of 4
    eng.add_request("first", prompt, PARAMS)
    first = drain(eng)[-1].output.metrics
    eng.add_request("second", prompt, PARAMS)
    second = drain(eng)[-1].output.metrics
    assert first.prefix_cache_hit_tokens == 0
    assert second.prefix_cache_hit_tokens == 28


def test_decode_metadata_masks_only_when_some_sequence_is_padded():
    """Batched decode pads shorter caches and masks the padding; with none to mask, no mask is built."""
    import torch

    from rooftop.models.kv_cache import build_metadata

    same = build_metadata([([0, 1], 20, 1), ([2, 3], 20, 1)], 16, torch.device("cpu"))
    assert same.decode_mask is None and same.decode_slots.shape == (2, 21)
    assert same.decode_slots[1].tolist() == list(range(32, 48)) + list(range(48, 53))
    mixed = build_metadata([([0, 1], 20, 1), ([2], 5, 1)], 16, torch.device("cpu"))
    assert mixed.decode_mask.shape == (2, 1, 1, 21) and int(mixed.decode_mask[1].sum()) == 6
    assert mixed.decode_slots[1, :6].tolist() == list(range(32, 38)) and mixed.decode_slots[1, 6:].eq(0).all()
