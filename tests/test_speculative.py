"""Speculative decoding (n-gram prompt lookup, a draft model, a self-draft): the same tokens as without it — greedy, seeded, with penalties,
batched with sequences that propose nothing, under preemption — the acceptance rule's distribution, KV rollback
in the block pool, stop strings and max_tokens inside an accepted run, the counts, and refused options."""

import random
import time

import openai
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rooftop import LLM, InvalidRequestError, SamplingParams
from rooftop.config import EngineConfig, SpeculativeConfig
from rooftop.engine.block_manager import BlockManager
from rooftop.engine.llm_engine import LLMEngine
from rooftop.engine.metrics import RequestMetrics, SpecDecodeCounts
from rooftop.engine.output_processor import OutputProcessor
from rooftop.engine.sampler import SamplingRow, sample
from rooftop.engine.scheduler import Scheduler
from rooftop.engine.sequence import Sequence
from rooftop.engine.speculative import accepted_run, ngram_draft

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
PARAGRAPH = (
    "The old lighthouse stood at the edge of the cliff. Every night its keeper climbed the stairs, "
    "lit the lamp and watched the ships pass safely through the narrow channel below."
)
PROMPTS = [
    f"Repeat this paragraph exactly:\n\n{PARAGRAPH}",
    f"Correct the spelling in this text and write it out again:\n\n{PARAGRAPH.replace('the', 'teh')}",
    "Rewrite this code with the variable x renamed to count:\n\ndef total(items):\n    x = 0\n"
    "    for item in items:\n        x += item\n    return x\n",
    "What is the capital of France?",
    "Write a short poem about rain.",
    f"Quote the sentence about the keeper from this text: {PARAGRAPH}",
]


@pytest.fixture(scope="module")
def bundled():
    """The bundled model in its own format (Q4_1 on the integer kernels); its own engine speculates, and the tests
    build engines with and without speculation on its model."""
    return LLM(num_kv_blocks=256, speculative_config=NGRAM)


def chat(llm, text: str) -> str:
    return llm.apply_chat_template([{"role": "user", "content": text}])


def run(eng: LLMEngine, requests: list[tuple[str, str, SamplingParams]], arrive_every: int = 0):
    """Add the requests (one more every `arrive_every` steps, else all at once) and step until done: the outputs by
    request id, and every step's shape."""
    pending, outputs, shapes, step = list(requests), {}, [], 0
    while pending or eng.has_unfinished():
        while pending and (arrive_every == 0 or step % arrive_every == 0):
            eng.add_request(*pending.pop(0))
            if arrive_every:
                break
        result = eng.step()
        if result.record is not None:
            shapes.append(result.record.shape)
        for delta in result.deltas:
            if delta.finished:
                outputs[delta.request_id] = delta.output
        step += 1
    return outputs, shapes


def engine(llm, speculative: dict | None = None, **options) -> LLMEngine:
    config = EngineConfig(**{"num_kv_blocks": 256, **options}, speculative_config=speculative)
    return LLMEngine(llm.model, llm.tokenizer, config)


def assert_same(spec: dict, plain: dict) -> None:
    assert spec.keys() == plain.keys()
    for rid, out in spec.items():
        assert out.token_ids == plain[rid].token_ids, rid
        assert out.text == plain[rid].text, rid
        assert [e.logprob for e in out.logprobs] == [e.logprob for e in plain[rid].logprobs], rid


def test_ngram_draft_continues_the_latest_longest_match():
    tokens = [1, 2, 3, 9, 1, 2, 3, 4, 5, 6, 7, 1, 2, 3]
    assert ngram_draft(tokens, 3, 4, 2) == [4, 5, 6]  # "1 2 3" last occurred before 4 5 6
    assert ngram_draft(tokens, 10, 4, 2) == [4, 5, 6, 7, 1, 2, 3]  # up to the end of what followed
    assert ngram_draft([5, 6, 7, 8], 3, 4, 2) == []  # no earlier occurrence
    assert ngram_draft([4, 4], 3, 4, 2) == []  # too short for a 2-gram with a successor
    assert ngram_draft([4, 4, 4], 3, 4, 2) == [4]


SAMPLING = [
    dict(temperature=0),
    dict(temperature=0.8, top_p=0.9, seed=7),
    dict(temperature=0.7, top_k=40, min_p=0.05, repetition_penalty=1.1, presence_penalty=0.2, seed=3),
]
# greedy, seeded and seeded with penalties, in turn; each runs to max_tokens, so the lengths, and so whether a small
# pool preempts, are the same on every host (where a model's EOS lands is not)
REQUESTS = [
    (f"r{i}", p, SamplingParams(max_tokens=32, logprobs=1, ignore_eos=True, **SAMPLING[i % 3]))
    for i, p in enumerate(PROMPTS)
]


@pytest.fixture(scope="module")
def requests(bundled):
    return [(rid, chat(bundled, p), params) for rid, p, params in REQUESTS]


@pytest.fixture(scope="module")
def plain(bundled, requests):
    """The requests' outputs without speculation (batch invariance: the same as each alone)."""
    return run(engine(bundled), requests)[0]


def test_speculation_gives_the_tokens_decoding_gives(bundled, requests, plain):
    """Greedy, seeded, and seeded with penalties; arriving one by one, so that verify steps share steps with
    prefills and plain decodes of sequences that propose nothing: every request's tokens, text and logprobs are
    those without speculation."""
    eng = engine(bundled, NGRAM)
    spec, shapes = run(eng, requests, arrive_every=3)
    assert_same(spec, plain)
    counts = eng.stats().spec_decode
    assert counts.drafts > 0 and counts.accepted_tokens > 0
    verify = [any(s.phase == "decode" and s.new > 1 for s in shape.seqs) for shape in shapes]
    plain_decode = [any(s.phase == "decode" and s.new == 1 for s in shape.seqs) for shape in shapes]
    assert any(v and d for v, d in zip(verify, plain_decode, strict=True))  # verify and plain decode share steps
    assert any(v and shape.phase == "mixed" for v, shape in zip(verify, shapes, strict=True))


def test_speculation_under_preemption_gives_the_same_tokens(bundled, requests, plain):
    """A pool too small for all of them: the latest arrival is preempted, recomputed and replayed, its drafts
    dropped; nothing any request returns changes."""
    eng = engine(bundled, NGRAM, num_kv_blocks=20, block_size=16)
    spec, _ = run(eng, requests[:4])
    assert_same(spec, {rid: plain[rid] for rid in spec})
    assert eng.stats().preemptions > 0 and eng.stats().spec_decode.accepted_tokens > 0
    assert eng.stats().kv_blocks_used == 0


def test_stop_strings_and_max_tokens_cut_inside_an_accepted_run(bundled, requests, plain):
    rid, prompt, _ = requests[0]
    full = plain[rid]
    stop = full.text[full.text.index("keeper") :][:12]  # ends inside the copied paragraph
    reqs = [
        ("stop", prompt, SamplingParams(temperature=0, max_tokens=32, stop=[stop])),
        ("length", prompt, SamplingParams(temperature=0, max_tokens=23)),
    ]
    eng = engine(bundled, NGRAM)
    spec, _ = run(eng, reqs)
    assert eng.stats().spec_decode.accepted_tokens > 0
    assert spec["stop"].finish_reason == "stop" and spec["stop"].text == full.text[: full.text.index(stop)]
    assert spec["stop"].token_ids == full.token_ids[: len(spec["stop"].token_ids)]
    assert spec["length"].finish_reason == "length" and spec["length"].token_ids == full.token_ids[:23]


def test_the_output_processor_takes_a_run_token_by_token(tiny_llm):
    """A verify step's tokens are appended one at a time: a stop string or max_tokens inside the run ends the
    request there and the rest of the run is discarded; the delta carries the tokens it kept."""
    ids = tiny_llm.tokenizer.encode("abcdef")

    def feed(params):
        processor = OutputProcessor(tiny_llm.tokenizer, [2], 1000)
        seq = Sequence("0", "p", [10, 11], params, RequestMetrics(0.0))
        processor.add(seq)
        return processor.on_tokens(seq, ids, None, now=1.0), seq

    delta, seq = feed(SamplingParams(max_tokens=10, stop=["cd"]))
    assert delta.finish_reason == "stop" and delta.output.text == "ab" and seq.output_token_ids == ids[:4]
    delta, seq = feed(SamplingParams(max_tokens=3))
    assert delta.finish_reason == "length" and delta.new_token_ids == ids[:3] and delta.text == "abc"
    delta, _ = feed(SamplingParams(max_tokens=10))
    assert delta.new_token_ids == ids and not delta.finished


def test_streaming_sends_several_tokens_per_verify_step(bundled):
    chunks = list(bundled.stream(chat(bundled, PROMPTS[0]), SamplingParams(temperature=0, max_tokens=32)))
    assert max(len(c.token_ids) for c in chunks) > 1
    out = chunks[-1].output
    assert sum(len(c.token_ids) for c in chunks) == len(out.token_ids)
    m = out.metrics.spec_decode
    assert m.drafts > 0 and 0 < m.acceptance_rate <= 1 and 1 < m.mean_accepted_length <= 5
    assert sum(m.accepted_per_pos) == m.accepted_tokens and len(m.accepted_per_pos) <= 4
    assert out.metrics.decode_tokens == len(out.token_ids) - 1 > out.metrics.decode_steps
    assert bundled.engine.stats().kv_blocks_used == 0


def chi_square(counts: list[int], probs: list[float]) -> float:
    n = sum(counts)
    return sum((c - n * p) ** 2 / (n * p) for c, p in zip(counts, probs, strict=True))


@pytest.mark.parametrize("params", [dict(temperature=1.0), dict(temperature=0.7, top_k=4)], ids=["plain", "top_k"])
def test_the_acceptance_rule_keeps_the_target_distribution(params):
    """A verify step of one draft token x on synthetic logits, 4000 seeded draws: the first token follows the
    target's processed distribution p (after temperature and top-k), x is accepted with probability p(x), and
    the token after an accepted x follows the target's next-position distribution (chi-square, p = 0.001)."""
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 6, generator=gen) * 1.5
    sp = SamplingParams(seed=0, **params)
    x = int(logits[0].argsort()[-2])  # the second most likely: rejected often
    targets = []
    for row in logits:
        scaled = row / sp.temperature
        if sp.top_k:
            scaled = scaled.masked_fill(scaled < scaled.topk(sp.top_k).values[-1], float("-inf"))
        targets.append(scaled.softmax(-1).tolist())
    first, after, accepted = [0] * 6, [0] * 6, 0
    for seed in range(4000):
        g = torch.Generator().manual_seed(seed)
        rows = [SamplingRow(sp, g, draft=x), SamplingRow(sp, g, output_ids=[x])]
        run = accepted_run([x], sample(logits.clone(), rows))
        first[run[0]] += 1
        if len(run) == 2:
            accepted += 1
            after[run[1]] += 1
    keep = [i for i in range(6) if targets[0][i] > 0]
    assert chi_square([first[i] for i in keep], [targets[0][i] for i in keep]) < 20.5  # df <= 5
    assert abs(accepted / 4000 - targets[0][x]) < 4 * (targets[0][x] / 4000) ** 0.5
    keep = [i for i in range(6) if targets[1][i] > 0]
    assert chi_square([after[i] for i in keep], [targets[1][i] for i in keep]) < 20.5


def test_a_seeded_verify_step_draws_only_the_rows_it_keeps():
    """Rows after the first that misses its draft are not drawn: the generator advances once per kept token."""
    logits = torch.tensor([[0.0, 9.0, 0.0], [9.0, 0.0, 0.0]])
    sp = SamplingParams(temperature=1.0, seed=1)
    g, alone = torch.Generator().manual_seed(1), torch.Generator().manual_seed(1)
    tokens = sample(logits, [SamplingRow(sp, g, draft=2), SamplingRow(sp, g)])  # draws 1 (not the draft 2)
    assert accepted_run([2], tokens) == [1]
    sample(logits[:1], [SamplingRow(sp, alone)])
    assert torch.equal(g.get_state(), alone.get_state())


DRAFTING = st.tuples(st.integers(0, 4), st.integers(0, 4))  # drafts proposed, of which accepted (capped)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 30), st.integers(1, 14)), min_size=1, max_size=10),  # prompt, output tokens
    st.integers(12, 30),  # blocks of 4 tokens
    st.integers(1, 40),  # token budget
    st.booleans(),  # prefix caching
    st.booleans(),  # batch invariance
    st.randoms(use_true_random=False),
)
def test_kv_rollback_keeps_the_block_pool_consistent(lengths, num_blocks, budget, caching, invariant, rnd):
    """Random drafts and acceptances: after every step each block's references are its holders', a running
    sequence holds just the blocks of its cached tokens plus what its next tokens need, no block with an uncached
    position is named for the prefix cache, and everything comes back at the end."""
    config = EngineConfig(
        max_num_seqs=4, max_num_batched_tokens=budget, block_size=4, enable_prefix_caching=caching,
        batch_invariant=invariant,
    )  # fmt: skip
    blocks = BlockManager(num_blocks, 4, caching)
    sched = Scheduler(config, blocks)
    wanted = {}
    for i, (prompt, out) in enumerate(lengths):
        seq = Sequence(str(i), None, [i % 3] * prompt, SamplingParams(max_tokens=out), RequestMetrics(0.0))
        seq.arrival_index = i
        wanted[seq] = out
        sched.add(seq)
    for _ in range(3000):
        if not sched.has_unfinished():
            break
        drafts = {s: [rnd.randrange(3) for _ in range(rnd.randrange(5))] for s in sched.decoding()}
        batch = sched.schedule({s: d for s, d in drafts.items() if d})
        finished = []
        for s in batch:
            assert len(s.seq.block_table) * 4 >= s.cached + s.new
            if not s.needs_logits:
                continue
            run = s.draft[: rnd.randrange(len(s.draft) + 1)] + [5]
            room = wanted[s.seq] - len(s.seq.output_token_ids)
            s.seq.output_token_ids += run[:room]
            s.accepted = min(len(run), room) - 1
            if len(s.seq.output_token_ids) >= wanted[s.seq]:
                finished.append(s.seq)
        sched.update(batch, finished)
        holders = {}
        for seq in sched.running:
            for b in seq.block_table:
                holders[b] = holders.get(b, 0) + 1
            assert seq.cached < seq.num_tokens
            assert len(seq.block_table) <= max(blocks.blocks_needed(seq.num_tokens), 1)
            assert all(blocks.blocks[b].hash is None for b in seq.block_table[seq.cached // 4 :])
        assert all(block.ref_count == holders.get(block.id, 0) for block in blocks.blocks)
    assert not sched.has_unfinished()
    assert blocks.num_free == num_blocks


def test_the_counts_follow_vllms_definitions():
    counts = SpecDecodeCounts()
    counts.add(4, 2)
    counts.add(3, 3)
    assert (counts.drafts, counts.draft_tokens, counts.accepted_tokens) == (2, 7, 5)
    assert counts.accepted_per_pos == [2, 2, 1, 0]
    assert counts.acceptance_rate == 5 / 7 and counts.mean_accepted_length == 1 + 5 / 2


@pytest.mark.parametrize(
    "options, message",
    [
        ({"method": "ngram", "num_speculative_tokens": 0}, "num_speculative_tokens must be an integer >= 1"),
        ({"method": "eagle", "num_speculative_tokens": 2}, "method must be one of ngram, draft; got 'eagle'"),
        ({"method": "ngram", "num_speculative_tokens": 2, "lookahead": 3}, r"unknown speculative_config keys \['lookahead'\]"),
        ({"method": "ngram"}, "speculative_config needs num_speculative_tokens"),
        ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 5, "prompt_lookup_max": 3}, "prompt_lookup_min .* cannot exceed"),
        ({"method": "draft", "num_speculative_tokens": 2}, "method 'draft' takes exactly one of model .* and draft_layers"),
        ({"method": "draft", "num_speculative_tokens": 2, "model": "x.gguf", "draft_layers": 4}, "takes exactly one of model"),
        ({"method": "draft", "num_speculative_tokens": 2, "draft_layers": 0}, "draft_layers must be an integer >= 1, got 0"),
        ({"method": "draft", "num_speculative_tokens": 0, "draft_layers": 4}, "num_speculative_tokens must be an integer >= 1"),
        ({"method": "ngram", "num_speculative_tokens": 2, "model": "x.gguf"}, "model and draft_layers go with method 'draft' only"),
        ({"method": "ngram", "num_speculative_tokens": 2, "draft_layers": 4}, "model and draft_layers go with method 'draft' only"),
        ("ngram", "speculative_config is a dict"),
    ],
)  # fmt: skip
def test_bad_speculative_options_are_refused_by_name(options, message):
    with pytest.raises(InvalidRequestError, match=message):
        EngineConfig(speculative_config=options)


def test_the_ngram_lookups_bounds_are_filled_in_as_vllm_fills_them():
    """A min alone was refused for exceeding the unset max's default (4); a max alone kept a min of 2."""
    config = SpeculativeConfig.from_dict
    bounds = [
        (c.prompt_lookup_min, c.prompt_lookup_max)
        for c in (
            config({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 6}),
            config({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3}),
            config({"method": "ngram", "num_speculative_tokens": 2}),
        )
    ]
    assert bounds == [(6, 6), (3, 3), (5, 5)]


def test_vllms_other_spellings_of_a_method_are_rooftops():
    """vLLM infers the method from `model` where none is given, and calls a draft model's method draft_model."""
    draft = SpeculativeConfig("draft", 3, model="d.gguf")
    for options in ({"model": "d.gguf"}, {"method": "draft_model", "model": "d.gguf"}):
        assert EngineConfig(speculative_config=options | {"num_speculative_tokens": 3}).speculative_config == draft
    for model in ("ngram", "[ngram]"):
        config = EngineConfig(speculative_config={"model": model, "num_speculative_tokens": 3, "prompt_lookup_max": 3})
        assert config.speculative_config == SpeculativeConfig("ngram", 3, prompt_lookup_max=3)


def test_a_config_value_and_a_dict_are_the_same():
    assert EngineConfig(speculative_config=NGRAM).speculative_config == SpeculativeConfig(**NGRAM)


SELF_DRAFT = {"method": "draft", "num_speculative_tokens": 4, "draft_layers": 8}  # 8 of the bundled model's 30


def test_a_self_draft_gives_the_tokens_decoding_gives(bundled, requests, plain):
    """The target's first 8 layers and its lm_head propose; greedy and seeded requests arriving one by one, verify
    steps sharing steps with prefills and plain decodes: the tokens, text and logprobs are those without
    speculation, and no draft cache outlives its request."""
    eng = engine(bundled, SELF_DRAFT)
    spec, shapes = run(eng, requests[:4], arrive_every=3)
    assert_same(spec, {rid: plain[rid] for rid in spec})
    counts = eng.stats().spec_decode
    assert counts.drafts > 0 and 0 <= counts.accepted_tokens <= counts.draft_tokens <= 4 * counts.drafts
    verify = [any(s.phase == "decode" and s.new > 1 for s in shape.seqs) for shape in shapes]
    plain_decode = [any(s.phase == "decode" and s.new == 1 for s in shape.seqs) for shape in shapes]
    assert any(v and d for v, d in zip(verify, plain_decode, strict=True))  # verify and plain decode share steps
    assert eng._proposer.caches == {}
    assert eng._proposer.model.layers == bundled.model.layers[:8]  # the target's own layer objects, no copy


def test_a_self_draft_under_preemption_gives_the_same_tokens(bundled, requests, plain):
    """A preempted sequence's draft cache is dropped and rebuilt when it decodes again; nothing changes."""
    eng = engine(bundled, SELF_DRAFT, num_kv_blocks=14, block_size=16)
    spec, _ = run(eng, requests[:4])
    assert_same(spec, {rid: plain[rid] for rid in spec})
    assert eng.stats().preemptions > 0 and eng.stats().spec_decode.drafts > 0
    assert eng._proposer.caches == {} and eng.stats().kv_blocks_used == 0


def test_aborting_frees_the_draft_cache(bundled):
    eng = engine(bundled, SELF_DRAFT)
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    eng.add_request("a", chat(bundled, PROMPTS[3]), params)
    eng.add_request("b", chat(bundled, PROMPTS[4]), params)
    while len(eng._proposer.caches) < 2:
        eng.step()
    eng.abort("a")
    assert [seq.request_id for seq in eng._proposer.caches] == ["b"]
    eng.abort("b")
    assert eng._proposer.caches == {} and not eng.has_unfinished()


def test_a_draft_model_file_gives_the_tokens_decoding_gives(tiny_llm, tmp_path):
    """Another tiny model with the same byte vocabulary (other weights, a 12-token context the sequences outgrow:
    it stops proposing there) drafts for the tiny model."""
    from gguf_factory import write_tiny_gguf

    write_tiny_gguf(tmp_path / "draft.gguf", seed=1, context_length=12)
    reqs = [(f"t{i}", "abcabcabc"[: 3 + i], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)) for i in range(3)]  # fmt: skip
    plain, _ = run(engine(tiny_llm, num_kv_blocks=64, block_size=4), reqs)
    draft = {"method": "draft", "num_speculative_tokens": 3, "model": str(tmp_path / "draft.gguf")}
    eng = engine(tiny_llm, draft, num_kv_blocks=64, block_size=4)
    spec, _ = run(eng, reqs)
    assert {rid: o.token_ids for rid, o in spec.items()} == {rid: o.token_ids for rid, o in plain.items()}
    assert eng.stats().spec_decode.drafts > 0 and eng._proposer.caches == {}


def test_a_draft_with_another_vocabulary_is_refused(bundled, tiny_llm, tiny_gguf):
    config = EngineConfig(speculative_config={"method": "draft", "num_speculative_tokens": 2, "model": str(tiny_gguf)})
    vocab = tiny_llm.config.vocab_size
    with pytest.raises(InvalidRequestError, match=f"vocabulary has {vocab} tokens, the target's 49152"):
        LLMEngine(bundled.model, bundled.tokenizer, config)


@pytest.mark.parametrize("layers", [30, 31])
def test_a_self_draft_needs_fewer_layers_than_the_target(bundled, layers):
    config = EngineConfig(speculative_config={"method": "draft", "num_speculative_tokens": 2, "draft_layers": layers})
    with pytest.raises(InvalidRequestError, match=r"draft_layers must be in 1\.\.29 \(the target has 30 layers\)"):
        LLMEngine(bundled.model, bundled.tokenizer, config)


@pytest.fixture(scope="module", params=["float32", "bfloat16"], ids=["kernels", "torch-ops"])
def tiny(request, tiny_gguf):
    """The tiny model on rooftop's decode attention kernel (float32) and on PyTorch's attention (bfloat16)."""
    return LLM(model=tiny_gguf, dtype=request.param)


def noisy_drafts(guesses: list[list[int]], rnd: random.Random):
    """A proposer's `propose` for requests named "<letter><index>": up to 4 tokens of the right continuation
    (`guesses[index]`, what plain decoding gives), each replaced by noise 40% of the time."""

    def propose(most):
        drafts = {}
        for seq, limit in most.items():
            right = guesses[int(seq.request_id[1:])][len(seq.output_token_ids) :][:limit]
            drafts[seq] = [t if rnd.random() < 0.6 else rnd.randrange(200) for t in right][: rnd.randrange(5)]
        return {s: d for s, d in drafts.items() if d}

    return propose


def test_random_drafts_never_change_greedy_tokens(tiny, monkeypatch):
    """Whatever the proposer guesses, right or wrong, the tokens are those of plain decoding (the tiny model, on
    both attention paths)."""
    rnd = random.Random(0)
    reqs = [(f"t{i}", "abcabcabc"[: 3 + i], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)) for i in range(4)]  # fmt: skip
    plain, _ = run(engine(tiny, num_kv_blocks=64, block_size=4), reqs)
    eng = engine(tiny, NGRAM, num_kv_blocks=64, block_size=4)
    guesses = [plain[rid].token_ids for rid, _, _ in reqs]

    monkeypatch.setattr(eng._proposer, "propose", noisy_drafts(guesses, rnd))
    spec, _ = run(eng, reqs)
    assert {rid: o.token_ids for rid, o in spec.items()} == {rid: o.token_ids for rid, o in plain.items()}
    assert 0 < eng.stats().spec_decode.accepted_tokens < eng.stats().spec_decode.draft_tokens


def test_metrics_count_drafts_in_vllms_names(bundled):
    """/metrics has vLLM's spec_decode counters (rooftop_ prefix), equal to the engine's counts."""
    from serve_support import metrics, running_server

    with running_server(None, llm=bundled, served_model_name="bundled") as url:
        c = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        messages = [{"role": "user", "content": PROMPTS[0]}]
        c.chat.completions.create(model="bundled", messages=messages, max_tokens=24, temperature=0)
        counts = bundled.engine.stats().spec_decode
        deadline = time.monotonic() + 30  # the engine thread counts after the step that finished the request
        while metrics(url)["rooftop_spec_decode_num_drafts_total"] < counts.drafts and time.monotonic() < deadline:
            time.sleep(0.05)
        m = metrics(url)
    assert counts.drafts > 0
    assert m["rooftop_spec_decode_num_drafts_total"] == counts.drafts
    assert m["rooftop_spec_decode_num_draft_tokens_total"] == counts.draft_tokens
    assert m["rooftop_spec_decode_num_accepted_tokens_total"] == counts.accepted_tokens
    for pos, accepted in enumerate(counts.accepted_per_pos):
        assert m[f'rooftop_spec_decode_num_accepted_tokens_per_pos_total{{position="{pos}"}}'] == accepted


def test_the_analyzer_predicts_tpot_for_an_acceptance_rate():
    """E = (1 - a^(k+1)) / (1 - a) tokens per verify step; a verify step is a decode of k + 1 new tokens, which on
    a memory-bound device costs about one decode step, so the speedup approaches E."""
    from rooftop.roofline.api import resolve_precision
    from rooftop.roofline.catalog import find_hardware
    from rooftop.roofline.presets import find_preset
    from rooftop.roofline.speculative import expected_tokens_per_step, predict_speculative

    assert expected_tokens_per_step(0.0, 4) == 1.0 and expected_tokens_per_step(1.0, 4) == 5.0
    assert expected_tokens_per_step(0.5, 2) == pytest.approx(1.75)
    config, hw = find_preset("llama-3.1-8b"), find_hardware("h200")
    p = resolve_precision(None, None, None, hw, config)
    spec = predict_speculative(config, p, hw, 4, 0.7, 1024)
    assert spec.verify.time_s > spec.decode.time_s and spec.verify.flops == pytest.approx(5 * spec.decode.flops, 0.05)
    assert 0.9 * spec.tokens_per_step < spec.speedup < spec.tokens_per_step
    with pytest.raises(InvalidRequestError, match="acceptance must be in"):
        predict_speculative(config, p, hw, 4, 1.2, 1024)


def test_rooftop_roofline_takes_speculative_options():
    import json

    from typer.testing import CliRunner

    from rooftop.cli import app

    args = ["roofline", "-H", "h200", "-m", "llama-3.1-8b", "--num-speculative-tokens", "4", "--acceptance", "0.7"]
    result = CliRunner().invoke(app, [*args, "--json"])
    spec = json.loads(result.stdout)["speculative"]
    assert spec["num_speculative_tokens"] == 4 and spec["tokens_per_verify_step"] == pytest.approx(2.7731)
    assert "speculative decoding, 4 draft tokens accepted at 70% each" in CliRunner().invoke(app, args).stdout
    result = CliRunner().invoke(app, args[:-2])
    assert result.exit_code == 1 and "--num-speculative-tokens and --acceptance go together" in result.stderr


def test_hybrid_models_refuse_speculation():
    """Their linear-attention state cannot be rolled back to before a rejected draft."""
    from rooftop.engine.speculative import make_proposer
    from rooftop.roofline.presets import find_preset

    with pytest.raises(InvalidRequestError, match="recurrent state that cannot be rolled back"):
        make_proposer(SpeculativeConfig(**NGRAM), find_preset("qwen3.6-27b"))


def test_the_servers_monitor_counts_a_verify_steps_tokens_once_each_and_its_gap_once(bundled):
    """A verify step hands a request several tokens at one time: ITL observed a near-zero gap for each accepted
    draft (vLLM observes one gap a step), and the dashboard's tokens/s counted one token per request a step."""
    from rooftop.engine.probe import load_or_run_probe
    from rooftop.serve.metrics import create_metrics
    from rooftop.serve.monitor import Monitor

    metrics = create_metrics()
    monitor = Monitor(metrics, bundled.config, bundled.precision, load_or_run_probe(quick=True).to_hardware())
    eng = engine(bundled, NGRAM)
    params = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
    eng.add_request("r", chat(bundled, f"Quote the sentence about the keeper from this text: {PARAGRAPH}"), params)
    steps = []
    while eng.has_unfinished():
        steps.append(eng.step())
        monitor.on_step(steps[-1])
    tokens = [len(d.new_token_ids) for s in steps for d in s.deltas if d.new_token_ids]
    assert max(tokens) > 1  # some steps accepted drafts
    itl = next(m for m in metrics.itl.collect() for s in m.samples if s.name.endswith("_count"))
    assert next(s.value for s in itl.samples if s.name.endswith("_count")) == len(tokens) - 1  # a gap a step
    assert sum(p.sampled for p in monitor.steps) == sum(tokens) == 40
    # the dashboard kept its last 300 steps, a few seconds under load, and divided their tokens by 10 s
    record = next(s.record for s in reversed(steps) if s.record is not None)
    for _ in range(700):
        monitor._record_step(record, 2)
    shown = monitor.snapshot()
    assert len(monitor.steps) == len(steps) + 700 and len(shown["steps"]) <= 600
    assert shown["generation_tokens_per_s"] >= 1400 / 10  # the 700 steps just recorded, 2 tokens each


def test_a_draft_models_passes_are_decode_time_and_their_own_part_of_the_gap(bundled):
    """The draft's forward passes ran between scheduling and the verify step, counted as neither: decode tok/s read
    416 where TPOT said 109, and the report called the draft's time host time ("host-bound: 76% ... Python")."""
    from rooftop.engine.probe import load_or_run_probe
    from rooftop.roofline.attribution import attribute_phases, attribute_step

    eng = engine(bundled, SELF_DRAFT)
    eng.add_request("r", chat(bundled, PROMPTS[3]), SamplingParams(max_tokens=24, temperature=0, ignore_eos=True))
    steps = []
    while eng.has_unfinished():
        steps.append(eng.step())
    records = [s.record for s in steps if s.record is not None]
    decodes = [r for r in records if r.phase == "decode"]
    assert sum(r.draft_seconds > 0 for r in decodes) >= len(decodes) - 1  # the last step has no room to draft
    metrics = next(d.metrics for s in steps for d in s.deltas if d.finished)
    assert metrics.decode_time == pytest.approx(sum(r.seconds + r.draft_seconds for r in decodes))
    hw = load_or_run_probe(quick=True).to_hardware()
    attributed = [
        attribute_step(
            bundled.config, bundled.precision, r.shape, r.seconds, hw, r.around_seconds, None, r.draft_seconds
        )
        for r in decodes
    ]
    phase = attribute_phases(attributed, hw)["decode"]
    assert phase.measured_s == pytest.approx(sum(r.wall_seconds for r in decodes))
    from rooftop.roofline.attribution import gap_sentence

    # a verify step's rows are not its tokens: the drafts it rejected are among them
    assert f"{len(decodes)} steps of {phase.tokens} rows (verify steps" in gap_sentence({"decode": phase})
    from rooftop.roofline.calibration import KERNEL_CLASSES, ExpectedStep, step_gap

    nothing = ExpectedStep({name: 0.0 for name in (*KERNEL_CLASSES, "communication")}, 0.0, 0.0)
    gap = step_gap(attributed[0].predicted, nothing, decodes[0].seconds, 0.0, hw, 0.5)
    assert gap.parts()["drafting"] == 0.5 and sum(gap.parts().values()) == pytest.approx(gap.measured_s)


def test_the_targets_own_file_as_its_draft_proposes_what_it_decodes(bundled):
    """A draft computed the tokens it lacked as one prefill chunk, the output included, where the target decoded
    them: on the integer kernels prefill's rounding differs (logits ~0.8 apart), and the target's own weights as
    the draft missed 13 of 79 drafts at temperature 0. Computed as the target computed them, it misses none."""
    from rooftop.loading.bundled import bundled_model_path

    eng = engine(bundled, {"method": "draft", "model": str(bundled_model_path()), "num_speculative_tokens": 4})
    params = SamplingParams(max_tokens=30, temperature=0, ignore_eos=True)
    for i, prompt in enumerate(["The capital of France is", "Once upon a time there was a", "def fib(n):"]):
        eng.add_request(str(i), prompt, params)
    while eng.has_unfinished():
        eng.step()
    counts = eng.stats().spec_decode
    assert counts.draft_tokens > 30 and counts.accepted_tokens == counts.draft_tokens
