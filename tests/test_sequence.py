"""The output processor on a byte-level vocabulary: stop strings, UTF-8-safe streaming, finish reasons, metrics."""

import pytest

from rooftop import SamplingParams
from rooftop.engine.metrics import RequestMetrics
from rooftop.engine.output_processor import OutputProcessor
from rooftop.engine.sequence import Sequence

EOS = 2


@pytest.fixture(scope="module")
def tokenizer(tiny_llm):
    return tiny_llm.tokenizer  # one token per byte: characters arrive split across tokens


class Run:
    """One request through the output processor: its sequence, and the final output once it finishes."""

    def __init__(self, tokenizer, params, max_model_len=1000):
        self.processor = OutputProcessor(tokenizer, [EOS], max_model_len)
        self.seq = Sequence("0", "p", [10, 11], params, RequestMetrics(arrival_time=0.0, prompt_tokens=2))
        self.processor.add(self.seq)
        self.output = None

    @property
    def finish_reason(self):
        return None if self.output is None else self.output.finish_reason

    @property
    def text(self):
        return self.output.text

    @property
    def output_token_ids(self):
        return self.seq.output_token_ids


def make_seq(tokenizer, params, max_model_len=1000):
    return Run(tokenizer, params, max_model_len)


def feed(run, ids):
    """Hand `ids` to the processor one at a time until the request finishes; the text deltas."""
    deltas = []
    for t, token in enumerate(ids):
        if run.output is not None:
            break
        delta = run.processor.on_tokens(run.seq, [token], None, now=1.0 + t)
        assert delta.new_token_ids == [token] and delta.finished == (delta.output is not None)
        run.output = delta.output
        deltas.append(delta.text)
    return deltas


def test_byte_tokens_split_characters(tokenizer):
    assert len(tokenizer.encode("🌍")) == 4


def test_streamed_deltas_never_break_utf8_and_add_up(tokenizer):
    text = "héllo 🌍 wörld 日本語 — done"
    ids = tokenizer.encode(text)
    seq = make_seq(tokenizer, SamplingParams(max_tokens=len(ids)))
    deltas = feed(seq, ids)
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) == seq.text == text
    assert seq.finish_reason == "length"
    # the detokenizer agrees with a one-shot decode
    assert tokenizer.decode(seq.output_token_ids) == text


def test_stop_string_across_tokens_is_cut_and_never_streamed(tokenizer):
    seq = make_seq(tokenizer, SamplingParams(max_tokens=100, stop=["STOP", "never"]))
    deltas = feed(seq, tokenizer.encode("Hello STOP world"))
    assert seq.finish_reason == "stop"
    assert seq.text == "Hello "
    assert "".join(deltas) == "Hello "
    assert len(seq.output_token_ids) == len("Hello STOP")  # generation ended on the token completing "STOP"


def test_earliest_stop_string_wins(tokenizer):
    seq = make_seq(tokenizer, SamplingParams(max_tokens=100, stop=["cd", "b"]))
    feed(seq, tokenizer.encode("abcdef"))
    assert seq.text == "a"


def test_eos_stops_without_text(tokenizer):
    seq = make_seq(tokenizer, SamplingParams(max_tokens=100))
    feed(seq, tokenizer.encode("ok") + [EOS] + tokenizer.encode("more"))
    assert (seq.finish_reason, seq.text, seq.output_token_ids[-1]) == ("stop", "ok", EOS)


def test_ignore_eos_keeps_going(tokenizer):
    seq = make_seq(tokenizer, SamplingParams(max_tokens=3, ignore_eos=True))
    feed(seq, [EOS, EOS, EOS, EOS])
    assert (seq.finish_reason, len(seq.output_token_ids)) == ("length", 3)


def test_stop_token_ids(tokenizer):
    stop_id = tokenizer.encode("!")[0]
    seq = make_seq(tokenizer, SamplingParams(max_tokens=100, stop_token_ids=[stop_id]))
    feed(seq, tokenizer.encode("hi! there"))
    assert (seq.finish_reason, seq.text) == ("stop", "hi")


def test_max_tokens_and_context_end_with_length(tokenizer):
    seq = make_seq(tokenizer, SamplingParams(max_tokens=4))
    feed(seq, tokenizer.encode("abcdefgh"))
    assert (seq.finish_reason, seq.text) == ("length", "abcd")
    seq = make_seq(tokenizer, SamplingParams(max_tokens=100), max_model_len=5)  # 2 prompt tokens + 3
    feed(seq, tokenizer.encode("abcdefgh"))
    assert (seq.finish_reason, seq.text) == ("length", "abc")


def test_metrics_follow_the_definitions():
    m = RequestMetrics(arrival_time=10.0, prompt_tokens=5, first_scheduled_time=10.5)
    m.token_times = [11.0, 11.25, 11.75, 12.0]
    assert m.queue_time == 0.5
    assert m.ttft == 1.0
    assert m.e2e == 2.0
    assert m.itl == [0.25, 0.5, 0.25]
    assert m.tpot == pytest.approx((m.e2e - m.ttft) / (m.output_tokens - 1))
    assert m.tpot == pytest.approx(sum(m.itl) / len(m.itl))


def test_tpot_needs_two_tokens():
    m = RequestMetrics(arrival_time=0.0)
    m.token_times = [1.0]
    assert m.tpot is None and m.itl == [] and m.ttft == 1.0
