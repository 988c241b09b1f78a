"""The LLM API on the bundled model: outputs, seeds, stops, streaming, metrics, the cache, and bad input."""

import pytest
import torch
from near_ties import FLOAT_TIE, QUANTIZED_TIE, assert_parts_only_at_a_near_tie, rooftop_logits

from rooftop import InvalidRequestError, PromptTooLongError, SamplingParams
from rooftop.enums import Phase
from rooftop.models.kv_cache import KVCache

pytestmark = pytest.mark.slow

GREEDY = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)


def test_generate_returns_one_output_per_prompt_in_order(bundled_llm):
    prompts = ["The capital of France is", "1, 2, 3, 4,"]
    outs = bundled_llm.generate(prompts, GREEDY)
    assert [o.prompt for o in outs] == prompts
    for o in outs:
        assert len(o.token_ids) == 12 and o.finish_reason == "length" and o.finished
        assert o.text == bundled_llm.tokenizer.decode(o.token_ids)
        assert o.metrics.prompt_tokens == len(o.prompt_token_ids)
    assert outs[1].text.startswith(" 5")
    # the same prompt alone gives the same tokens, but where float32 nearly ties (a batch's matmuls round otherwise)
    alone = bundled_llm.generate(prompts[1], GREEDY)[0]
    assert len(alone.token_ids) == len(outs[1].token_ids)
    assert_parts_only_at_a_near_tie(
        rooftop_logits(bundled_llm), alone.prompt_token_ids, outs[1].token_ids, alone.token_ids, FLOAT_TIE
    )


def test_generate_accepts_token_ids_and_per_prompt_params(bundled_llm):
    ids = bundled_llm.tokenizer.encode("The capital of France is")
    outs = bundled_llm.generate([ids, ids], [GREEDY, SamplingParams(max_tokens=3, temperature=0)])
    assert outs[0].prompt is None and outs[0].prompt_token_ids == ids
    assert outs[1].token_ids == outs[0].token_ids[:3]


def test_generate_takes_vllms_prompt_dicts_and_refuses_other_shapes(bundled_llm):
    ids = bundled_llm.tokenizer.encode("The capital of France is")
    by_ids, by_text = bundled_llm.generate([{"prompt_token_ids": ids}, {"prompt": "The capital of France is"}], GREEDY)
    assert by_ids.prompt_token_ids == ids and by_ids.token_ids == bundled_llm.generate(ids, GREEDY)[0].token_ids
    assert by_text.prompt == "The capital of France is" and by_text.token_ids == by_ids.token_ids
    assert bundled_llm.generate({"prompt_token_ids": ids}, GREEDY)[0].token_ids == by_ids.token_ids
    with pytest.raises(InvalidRequestError, match="exactly one of 'prompt' .* got keys \\['prompt_ids'\\]"):
        bundled_llm.generate({"prompt_ids": ids}, GREEDY)
    with pytest.raises(InvalidRequestError, match="not int"):
        bundled_llm.stream(3, GREEDY)


def test_seed_reproduces_and_differs(bundled_llm):
    def run(seed):
        params = SamplingParams(max_tokens=16, temperature=1.0, seed=seed, ignore_eos=True)
        return bundled_llm.generate("Once upon a time", params)[0].token_ids

    assert run(1234) == run(1234)
    assert run(1234) != run(4321)


def test_stop_string_cuts_the_text(bundled_llm):
    full = bundled_llm.generate("1, 2, 3, 4,", GREEDY)[0]
    assert " 7" in full.text
    out = bundled_llm.generate("1, 2, 3, 4,", SamplingParams(max_tokens=12, temperature=0, stop=[" 7"]))[0]
    assert out.finish_reason == "stop"
    assert out.text == full.text[: full.text.index(" 7")]
    assert " 7" not in out.text


def test_stream_adds_up_to_the_final_text(bundled_llm):
    prompt = bundled_llm.apply_chat_template([{"role": "user", "content": "Say hello in Japanese and French."}])
    chunks = list(bundled_llm.stream(prompt, SamplingParams(max_tokens=40, temperature=0)))
    final = chunks[-1].output
    assert final.finished and chunks[-1].finished and not any(c.finished or c.output for c in chunks[:-1])
    assert [t for c in chunks for t in c.token_ids] == final.token_ids
    assert "".join(c.delta for c in chunks) == final.text
    assert all("\ufffd" not in c.delta for c in chunks)


def test_chat_applies_the_template(bundled_llm):
    out = bundled_llm.chat([{"role": "user", "content": "What is the weather in Lagos?"}], GREEDY)[0]
    assert out.prompt.startswith("<|im_start|>system") and out.prompt.endswith("<|im_start|>assistant\n")
    two = bundled_llm.chat([[{"role": "user", "content": "Hi"}], [{"role": "user", "content": "Bye"}]], GREEDY)
    assert len(two) == 2


def test_metrics_are_consistent_with_token_times(bundled_llm):
    out = bundled_llm.generate("Tell me a story.", SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))[0]
    m = out.metrics
    assert m.output_tokens == len(out.token_ids) == len(m.token_times) == 8
    assert m.first_scheduled_time >= m.arrival_time
    assert 0 < m.prefill_time <= m.ttft
    assert m.ttft == m.token_times[0] - m.arrival_time
    assert m.e2e == m.token_times[-1] - m.arrival_time
    assert m.tpot == pytest.approx((m.e2e - m.ttft) / 7)
    assert len(m.itl) == 7 and all(gap > 0 for gap in m.itl)
    assert sum(m.itl) == pytest.approx(m.e2e - m.ttft)
    assert m.prefill_tokens == m.prompt_tokens and m.decode_steps == 7
    assert 0 < m.decode_time <= m.e2e - m.ttft
    assert m.finished_time == m.token_times[-1]


def test_prefill_then_decode_equals_full_recompute(bundled_llm):
    model = bundled_llm.model
    ids = bundled_llm.tokenizer.encode("The quick brown fox jumps over the lazy dog because")
    k = len(ids) - 4
    cache = KVCache(bundled_llm.config, len(ids), torch.float32, "cpu")
    with torch.inference_mode():
        steps = [model.logits(model.forward(torch.tensor(ids[:k]), cache, 0)[-1:])[0]]
        for pos in range(k, len(ids)):
            steps.append(model.logits(model.forward(torch.tensor([ids[pos]]), cache, pos, Phase.DECODE))[0])
        full = model.logits(
            model.forward(torch.tensor(ids), KVCache(bundled_llm.config, len(ids), torch.float32, "cpu"), 0)
        )
    for offset, logits in enumerate(steps):
        torch.testing.assert_close(logits, full[k - 1 + offset], atol=1e-3, rtol=1e-4)


def test_prompt_longer_than_the_context_is_refused(bundled_llm):
    with pytest.raises(PromptTooLongError, match=r"the prompt has \d+ tokens; the context holds 8192"):
        bundled_llm.generate("hello " * 9000, GREEDY)


@pytest.mark.parametrize("prompt", ["", []])
def test_empty_prompt_is_refused(bundled_llm, prompt):
    with pytest.raises(InvalidRequestError, match="the prompt is empty"):
        bundled_llm.generate([prompt], GREEDY)


def test_out_of_range_token_ids_are_refused(bundled_llm):
    with pytest.raises(InvalidRequestError, match="out of range"):
        bundled_llm.generate([[1, 2, 10**6]], GREEDY)


def test_bfloat16_runs_and_mostly_agrees(bundled_llm):
    """bfloat16 moves the logits by ~0.1-0.3 (and rounds differently on CPUs with bfloat16 units): its greedy
    tokens may part from float32's only where float32 itself nearly ties."""
    from rooftop import LLM

    llm = LLM(dtype="bfloat16", weights="float")
    assert llm.model.embed.dtype == torch.bfloat16
    ids = bundled_llm.tokenizer.encode(bundled_llm.apply_chat_template([{"role": "user", "content": "Hi!"}]))
    ours = llm.generate([ids], SamplingParams(max_tokens=4, temperature=0))[0].token_ids
    ref = bundled_llm.generate([ids], SamplingParams(max_tokens=4, temperature=0))[0].token_ids
    assert_parts_only_at_a_near_tie(rooftop_logits(bundled_llm), ids, ours, ref, QUANTIZED_TIE)
