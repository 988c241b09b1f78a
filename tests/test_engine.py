"""The engine API on a tiny model: add while running, deltas, abort, errors, step records, stats, exact metrics,
and the phase each sequence runs in (decided by the scheduler, read by everything downstream)."""

import pytest
import torch

from rooftop import InvalidRequestError, SamplingParams
from rooftop.config import EngineConfig
from rooftop.engine.llm_engine import LLMEngine

PARAMS = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)


@pytest.fixture
def eng(tiny_llm):
    return LLMEngine(tiny_llm.model, tiny_llm.tokenizer, EngineConfig(num_kv_blocks=32, block_size=4))


def drain(eng):
    deltas, _ = run_all(eng)
    return deltas


def run_all(eng):
    """Step until every request is done: all deltas, and the step records in order."""
    deltas, records = [], []
    while eng.has_unfinished():
        step = eng.step()
        deltas += step.deltas
        records.append(step.record)
    return deltas, records


def is_idle(stats):
    return stats.running == 0 and stats.waiting == 0 and stats.kv_blocks_used == 0


def test_requests_added_while_others_run(eng):
    eng.add_request("a", "hello there", PARAMS)
    first = eng.step().deltas
    assert [d.request_id for d in first] == ["a"] and first[0].new_token_ids and not first[0].finished
    eng.add_request("b", "another prompt", PARAMS)
    deltas, records = run_all(eng)
    deltas = first + deltas
    for rid in ("a", "b"):
        mine = [d for d in deltas if d.request_id == rid]
        assert all(len(d.new_token_ids) == 1 for d in mine)  # each delta carries its own token, not the history
        assert [t for d in mine for t in d.new_token_ids] == mine[-1].output.token_ids
        assert "".join(d.text for d in mine) == mine[-1].output.text
        assert mine[-1].finished and mine[-1].finish_reason == "length"
        assert not any(d.finished or d.output is not None for d in mine[:-1])
    assert any(r.shape.num_seqs == 2 for r in records)


def test_abort_frees_blocks_and_unknown_abort_is_a_no_op(eng):
    eng.add_request("a", "hello there, a long-ish prompt", SamplingParams(max_tokens=20))
    eng.add_request("b", "short", SamplingParams(max_tokens=20))
    eng.step()
    assert eng.stats().kv_blocks_used > 0
    aborted = eng.abort("a")
    assert aborted.finish_reason == "abort" and aborted.request_id == "a" and len(aborted.token_ids) == 1
    assert eng.abort("a") is None and eng.abort("never-seen") is None
    drain(eng)
    assert is_idle(eng.stats())


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
    _, records = run_all(eng)
    chunks = [r.shape.seqs[0] for r in records[:3]]
    assert [(s.new, s.cached, s.needs_logits) for s in chunks] == [(4, 0, False), (4, 4, False), (2, 8, True)]


def test_step_records_carry_the_step_shape(eng):
    eng.add_request("a", "abcdefgh", PARAMS)  # 8 prompt tokens
    _, records = run_all(eng)
    first, second = records[0], records[1]
    assert first.phase == "prefill" and [(s.new, s.cached) for s in first.shape.seqs] == [(8, 0)]
    assert second.phase == "decode" and [(s.new, s.cached) for s in second.shape.seqs] == [(1, 8)]
    assert all(r.seconds > 0 for r in records)
    assert len(records) == 6


def test_a_cached_prompt_that_computes_one_token_is_a_prefill(tiny_llm):
    """A 9-token prompt sent twice with blocks of 4: the second finds 8 tokens in the prefix cache and computes one.
    That step computes a prompt token and yields the first output token: a prefill, in the step record, the
    request's metrics and the attention metadata alike; its next step is a decode."""
    config = EngineConfig(num_kv_blocks=32, block_size=4, chunked_prefill_size=4)  # the cache reused per block
    eng = LLMEngine(tiny_llm.model, tiny_llm.tokenizer, config)
    prompt = "abcdefghi"  # 9 byte tokens
    params = SamplingParams(max_tokens=3, temperature=0, ignore_eos=True)
    eng.add_request("first", prompt, params)
    drain(eng)
    eng.add_request("second", prompt, params)
    deltas, records = run_all(eng)
    assert [(s.new, s.cached, s.phase) for s in records[0].shape.seqs] == [(1, 8, "prefill")]
    assert records[0].phase == "prefill" and [r.phase for r in records[1:]] == ["decode", "decode"]
    m = deltas[-1].output.metrics
    assert (m.prefix_cache_hit_tokens, m.prefill_tokens, m.decode_steps) == (8, 1, 2)
    assert m.prefill_time == records[0].seconds and m.decode_time == pytest.approx(
        records[1].seconds + records[2].seconds
    )


def test_the_runner_lays_out_prefills_first_and_attention_reads_the_scheduled_phase(tiny_llm, monkeypatch):
    """In a step shared by a decode and a one-token prefill, the metadata's decode rows are exactly the decodes."""
    from rooftop.engine import runner

    seen = []
    original = runner.build_metadata

    def spy(seqs, block_size, device, batch_invariant):
        meta = original(seqs, block_size, device, batch_invariant)
        seen.append(([s.phase for s in seqs], [(c.start, c.end, c.cached) for c in meta.prefills], meta))
        return meta

    monkeypatch.setattr(runner, "build_metadata", spy)
    config = EngineConfig(num_kv_blocks=32, block_size=4, chunked_prefill_size=4)
    eng = LLMEngine(tiny_llm.model, tiny_llm.tokenizer, config)
    params = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
    eng.add_request("warm", "abcdefghi", params)
    drain(eng)  # "abcdefghi" now has two cached blocks
    eng.add_request("long", "a long prompt", params)
    for _ in range(4):
        eng.step()  # its prefill, in chunks of 4, 4, 4 and 1 tokens
    eng.add_request("cached", "abcdefghi", params)
    seen.clear()
    eng.step()  # "long" decodes while "cached" prefills its one uncached prompt token
    phases, prefills, meta = seen[0]
    assert phases == ["prefill", "decode"]
    assert prefills == [(0, 1, 8)] and meta.num_prefill_rows == 1 and meta.decode_lengths.tolist() == [14]


def test_metrics_are_exact_under_batching(eng):
    for i in range(4):
        eng.add_request(str(i), f"prompt number {i}", PARAMS, arrival_time=None)
    drain(eng)
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
    _, records = run_all(eng)
    assert max(r.shape.num_seqs for r in records) == 2


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
    pairs = list(zip(a, b, strict=True))
    assert [len(x.token_ids) for x, _ in pairs] == [1, 1, 1, 1] and pairs[-1][0].output.finished
    assert [t for x, _ in pairs for t in x.token_ids] == pairs[-1][0].output.token_ids
    assert is_idle(tiny_llm.engine.stats())


def test_a_stream_closed_early_frees_its_blocks(tiny_llm):
    stream = tiny_llm.stream("hello", SamplingParams(max_tokens=20, temperature=0))
    next(stream)
    assert tiny_llm.engine.stats().running == 1
    stream.close()
    assert is_idle(tiny_llm.engine.stats())


def test_bad_prompt_raises_when_the_stream_is_created(tiny_llm):
    with pytest.raises(InvalidRequestError, match="the prompt is empty"):
        tiny_llm.stream("", PARAMS)


def test_a_tiny_temperature_is_greedy(tiny_llm):
    greedy = tiny_llm.generate("hi", SamplingParams(max_tokens=4, temperature=0))[0]
    tiny = tiny_llm.generate("hi", SamplingParams(max_tokens=4, temperature=1e-45))[0]
    assert tiny.token_ids == greedy.token_ids and tiny.finish_reason == "length"


def test_sampling_steps_are_recorded_as_needing_logits(eng):
    eng.add_request("a", "abcdefgh", PARAMS)
    _, records = run_all(eng)
    assert all(s.needs_logits for r in records for s in r.shape.seqs)
    assert all(r.shape.logits_rows == 1 for r in records)


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


def test_prefix_cache_hit_tokens_are_counted_per_request(tiny_llm):
    config = EngineConfig(num_kv_blocks=32, block_size=4, chunked_prefill_size=4)  # the cache reused per block
    eng = LLMEngine(tiny_llm.model, tiny_llm.tokenizer, config)
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

    from rooftop.enums import Phase
    from rooftop.models.kv_cache import AttentionSeq, build_metadata

    def decodes(*seqs):
        return [AttentionSeq(table, cached, 1, Phase.DECODE) for table, cached in seqs]

    same = build_metadata(decodes(([0, 1], 20), ([2, 3], 20)), 16, torch.device("cpu"))
    assert same.decode_mask is None and same.decode_slots.shape == (2, 21)
    assert same.decode_slots[1].tolist() == list(range(32, 48)) + list(range(48, 53))
    mixed = build_metadata(decodes(([0, 1], 20), ([2], 5)), 16, torch.device("cpu"))
    assert mixed.decode_mask.shape == (2, 1, 1, 21) and int(mixed.decode_mask[1].sum()) == 6
    assert mixed.decode_slots[1, :6].tolist() == list(range(32, 38)) and mixed.decode_slots[1, 6:].eq(0).all()


def test_non_finite_logits_end_only_their_own_request(eng, monkeypatch):
    """Sampling runs batched; a row the model got wrong fails its request with `error`, and the others go on."""
    logits = eng.model.logits

    def one_row_broken(hidden, batch_invariant):
        out = logits(hidden, batch_invariant)
        out[0, 5] = float("nan")
        return out

    eng.add_request("broken", "first prompt", PARAMS)
    eng.add_request("fine", "second prompt", PARAMS)
    monkeypatch.setattr(eng.model, "logits", one_row_broken)
    first = {d.request_id: d for d in eng.step().deltas}
    monkeypatch.setattr(eng.model, "logits", logits)
    broken = [d for d in first.values() if d.finished]
    assert len(broken) == 1 and broken[0].finish_reason == "error"
    assert broken[0].output.error == "the model produced non-finite logits" and not broken[0].new_token_ids
    rest = drain(eng)
    assert rest[-1].finished and rest[-1].finish_reason == "length" and rest[-1].request_id != broken[0].request_id
    assert is_idle(eng.stats())


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_constraints_that_leave_no_token_end_only_their_own_request(eng, temperature):
    """min_tokens bans the end-of-sequence ids that allowed_token_ids allows alone: that request ends with an error
    saying so (it failed every request in its step: multinomial raised on its row), and a request sharing its steps
    runs on; at temperature 0 it ended at once on the banned token (argmax of a row of -inf)."""
    eos = eng.tokenizer.eos_token_ids
    stuck = SamplingParams(max_tokens=4, temperature=temperature, allowed_token_ids=list(eos), min_tokens=1)
    eng.add_request("stuck", "first prompt", stuck)
    eng.add_request(
        "fine", "second prompt", SamplingParams(max_tokens=6, temperature=temperature, seed=0, ignore_eos=True)
    )
    deltas = drain(eng)
    ended = {d.request_id: d for d in deltas if d.finished}
    assert ended["stuck"].finish_reason == "error" and "leave no token to sample" in ended["stuck"].output.error
    assert ended["stuck"].output.token_ids == []
    assert ended["fine"].finish_reason == "length" and len(ended["fine"].output.token_ids) == 6
    assert is_idle(eng.stats())


def test_logits_too_large_to_sum_are_still_sampled(eng, monkeypatch):
    """Finite logits whose row sum overflows float32 are finite: the request samples its argmax, with no error."""
    logits = eng.model.logits

    def huge(hidden, batch_invariant):
        out = logits(hidden, batch_invariant)
        out[:] = 3e38
        out[0, 7] = 3.4e38
        return out

    eng.add_request("huge", "first prompt", PARAMS)
    monkeypatch.setattr(eng.model, "logits", huge)
    delta = eng.step().deltas[0]
    monkeypatch.setattr(eng.model, "logits", logits)
    assert not delta.finished and delta.new_token_ids == [7]
    drain(eng)


def test_threads_set_the_intra_op_pool_and_default_to_the_cores_we_may_use(tiny_gguf):
    import torch

    from rooftop import LLM
    from rooftop.roofline.probe import available_cores

    try:
        LLM(model=tiny_gguf, threads=1)
        assert torch.get_num_threads() == 1
        LLM(model=tiny_gguf)
        assert torch.get_num_threads() == available_cores() >= 1
    finally:
        torch.set_num_threads(available_cores())


def test_the_engine_warms_up_then_starts_empty(tiny_llm):
    """Construction runs two requests through every part of a step, so that the first real request's TTFT carries
    no first-use costs, then forgets them: no queue, block, counter or cached prefix is left, and the process's
    random numbers are not drawn from (its random request has a seed of its own)."""
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    eng = LLMEngine(tiny_llm.model, tiny_llm.tokenizer, EngineConfig(num_kv_blocks=32, block_size=4))
    assert torch.equal(torch.rand(3), expected)
    assert eng.warm_up_seconds > 0
    stats = eng.stats()
    assert is_idle(stats) and (stats.prefix_queries, stats.prefix_hits, stats.preemptions) == (0, 0, 0)
    assert eng._blocks.cached == {} and eng._blocks.num_free == 32
    eng.add_request("first", "hello", PARAMS)
    out = drain(eng)[-1].output
    assert out.metrics.prefix_cache_hit_tokens == 0 and len(out.token_ids) == 6


def test_a_pool_too_small_for_the_warm_up_skips_it(tiny_llm):
    eng = LLMEngine(tiny_llm.model, tiny_llm.tokenizer, EngineConfig(num_kv_blocks=2, block_size=2))
    assert eng.warm_up_seconds == 0 and is_idle(eng.stats())


def test_a_models_load_shows_its_layers_built_on_a_terminal(tiny_gguf, monkeypatch):
    """The load's bar: the layers built out of all, drawn while the model is built and removed after; off a
    terminal nothing is drawn."""
    import io

    from rich.console import Console

    import rooftop.engine.progress as progress
    from rooftop import LLM

    screen = io.StringIO()
    monkeypatch.setattr(progress, "Console", lambda stderr: Console(file=screen, force_terminal=True, width=160))
    shown = []
    monkeypatch.setattr(
        progress.LoadProgress, "__exit__", lambda self, *exc: shown.append(self) or self.progress.stop()
    )
    llm = LLM(model=tiny_gguf)
    task = shown[0].progress.tasks[0]
    assert task.total == llm.config.num_layers == 2 and task.completed == 2
    assert "Loading the model's layers" in screen.getvalue() and "2/2" in screen.getvalue()
    screen.seek(0)
    screen.truncate()
    monkeypatch.setattr(progress, "Console", lambda stderr: Console(file=screen, force_terminal=False))
    LLM(model=tiny_gguf)
    assert screen.getvalue() == "" and shown[1].progress.tasks[0].completed == 2


def test_generate_shows_vllms_progress_bar_on_a_terminal(tiny_llm, monkeypatch):
    """`use_tqdm` (vLLM's name): prompts finished out of all and the tokens per second, counted as each request
    finishes; off, or off a terminal, nothing is drawn. Anything but a bool is refused by name."""
    import io

    from rich.console import Console

    import rooftop.engine.progress as progress

    screen = io.StringIO()
    monkeypatch.setattr(progress, "Console", lambda stderr: Console(file=screen, force_terminal=True, width=160))
    shown = []
    monkeypatch.setattr(
        progress.PromptProgress, "__exit__", lambda self, *exc: shown.append(self) or self.progress.stop()
    )
    prompts = ["one", "two two", "three three three"]
    outs = tiny_llm.generate(prompts, PARAMS)
    bar = shown[0]
    assert bar.progress.tasks[0].completed == 3 and bar.progress.tasks[0].total == 3
    assert bar.input_tokens == sum(o.metrics.prompt_tokens for o in outs)
    assert bar.output_tokens == 3 * 6
    assert "Processed prompts" in screen.getvalue() and "3/3" in screen.getvalue()
    screen.seek(0)
    screen.truncate()
    assert [o.token_ids for o in tiny_llm.generate(prompts, PARAMS, use_tqdm=False)] == [o.token_ids for o in outs]
    assert screen.getvalue() == "" and len(shown) == 1
    tiny_llm.generate(prompts, SamplingParams(n=2, max_tokens=6, temperature=0, ignore_eos=True))
    twice = shown[1]  # a prompt counts once, when both of its outputs are done
    assert twice.progress.tasks[0].completed == 3 and twice.progress.tasks[0].total == 3
    assert twice.output_tokens == 3 * 2 * 6 and "3/3" in screen.getvalue()
    with pytest.raises(InvalidRequestError, match="use_tqdm must be True, False or a tqdm-like bar's constructor"):
        tiny_llm.generate(prompts, PARAMS, use_tqdm="yes")


def test_use_tqdm_takes_a_bars_constructor_as_vllm_does(tiny_llm):
    """vLLM's use_tqdm may be a tqdm-like class (tqdm.auto.tqdm, a notebook's): it is called as vLLM calls it and
    drawn instead of rooftop's bar; it was refused."""
    made = []

    class Bar:
        def __init__(self, **options):
            self.options, self.done, self.closed, self.postfix = options, 0, False, None
            made.append(self)

        def update(self, n):
            self.done += n

        def close(self):
            self.closed = True

    tiny_llm.generate(["a", "b"], PARAMS, use_tqdm=Bar)
    [bar] = made
    assert bar.options == {"total": 2, "desc": "Processed prompts", "dynamic_ncols": True, "postfix": ""}
    assert bar.done == 2 and bar.closed and bar.postfix.startswith("input ")


def test_a_second_warm_up_keeps_what_requests_left(tiny_llm):
    """The server warms its engine thread up again before its first step; an engine that has run requests by then
    keeps its prefix cache and counters (they are the server's metrics)."""
    eng = LLMEngine(tiny_llm.model, tiny_llm.tokenizer, EngineConfig(num_kv_blocks=32, block_size=4))
    eng.warm_up()  # still fresh: warms up again and forgets again
    assert eng.warm_up_seconds > 0 and eng.stats().prefix_queries == 0
    eng.add_request("a", "a shared prompt", PARAMS)
    drain(eng)
    before = eng.stats()
    eng.warm_up()
    assert eng.stats() == before and before.prefix_queries > 0


def test_generate_returns_vllms_outputs_and_n_outputs_per_prompt(tiny_llm):
    """vLLM's `output.outputs[i]` (CompletionOutput): one per `n`, each its own request with output i seeded with
    seed + i, exactly what that request alone gives; the first's fields flattened beside them. n outside [1, 128],
    or n > 1 on the engine's one-output paths, is refused by name."""
    one = tiny_llm.generate(["hello"], PARAMS, use_tqdm=False)[0]
    assert [(c.index, c.text, c.token_ids, c.finish_reason) for c in one.outputs] == [
        (0, one.text, one.token_ids, one.finish_reason)
    ]
    assert one.outputs[0].cumulative_logprob is None
    sampled = SamplingParams(n=3, max_tokens=6, temperature=1.0, seed=7, ignore_eos=True, logprobs=0)
    outs = tiny_llm.generate(["hello", "bye"], sampled, use_tqdm=False)
    assert len(outs) == 2 and all(len(o.outputs) == 3 for o in outs)
    for prompt, out in zip(["hello", "bye"], outs, strict=True):
        assert [c.index for c in out.outputs] == [0, 1, 2]
        assert out.text == out.outputs[0].text and out.token_ids == out.outputs[0].token_ids
        for i, c in enumerate(out.outputs):
            alone = SamplingParams(max_tokens=6, temperature=1.0, seed=7 + i, ignore_eos=True, logprobs=0)
            assert c.token_ids == tiny_llm.generate([prompt], alone, use_tqdm=False)[0].token_ids
            assert c.cumulative_logprob == pytest.approx(sum(t.logprob for t in c.logprobs))
        assert len({tuple(c.token_ids) for c in out.outputs}) > 1  # different seeds, different samples
    for bad in (0, 129, 1.5):
        with pytest.raises(InvalidRequestError, match=r"n must be in \[1, 128\]"):
            SamplingParams(n=bad)
    with pytest.raises(InvalidRequestError, match="seed \\+ n - 1 must be at most"):
        SamplingParams(n=2, seed=2**64 - 1)
    with pytest.raises(InvalidRequestError, match="the engine and LLM.stream take one output per request"):
        tiny_llm.stream("hello", SamplingParams(n=2))
