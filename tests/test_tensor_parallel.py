"""Tensor parallelism end to end on gloo with the tiny random Llama (4 query heads, 2 KV heads) over 2 ranks against
one: greedy tokens part only where the reference's own logits nearly tie, a batch gives each request exactly what it
gets alone, the probe measures the group's all-reduce and the attribution counts the collectives as their own
part; sizes that do not split a model are refused naming the valid ones; `rooftop serve -tp 2` streams what the
engine computes and stops with a 503 and exit status 1 when a rank dies. (The bundled model over 3 ranks, failures
and NCCL: test_tp_ranks.py.)"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading

import httpx
import pytest
import torch
from near_ties import FLOAT_TIE, greedy_partings, rooftop_logits
from serve_support import sse_events
from tp_support import children, serving

from rooftop import LLM, SamplingParams
from rooftop.errors import InvalidRequestError, UnsupportedModelError

KV = 64 << 20
GREEDY = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True, logprobs=0)
TINY_PROMPTS = ["Hello there", "abc", "The quick brown fox", "tensor parallel"]


@pytest.fixture(scope="module")
def tiny_tp(tiny_gguf):
    llm = LLM(model=tiny_gguf, tensor_parallel_size=2, kv_cache_bytes=KV)
    yield llm
    llm.close()


def by_request(outputs) -> list[tuple[list[int], list[float]]]:
    return [(o.token_ids, [lp.logprob for lp in o.logprobs]) for o in outputs]


def test_tiny_model_over_two_ranks_decodes_as_one(tiny_llm, tiny_tp):
    logits_of = rooftop_logits(tiny_llm)
    for prompt in TINY_PROMPTS:
        ids = tiny_llm.tokenizer.encode(prompt)
        ref = tiny_llm.generate([ids], GREEDY)[0].token_ids
        partings = greedy_partings(logits_of, tiny_tp, ids, ref)
        assert all(margin < FLOAT_TIE for _, margin in partings), partings


def test_a_batch_over_two_ranks_gives_each_request_what_it_gets_alone(tiny_tp):
    batched = by_request(tiny_tp.generate(TINY_PROMPTS, GREEDY))
    alone = [by_request(tiny_tp.generate([p], GREEDY))[0] for p in TINY_PROMPTS]
    assert batched == alone
    streamed = [t for chunk in tiny_tp.stream(TINY_PROMPTS[0], GREEDY) for t in chunk.token_ids]
    assert streamed == batched[0][0]


def test_prompt_logprobs_over_two_ranks_are_one_ranks(tiny_llm, tiny_tp):
    """vLLM's prompt_logprobs under tensor parallelism: the prompt's rows gathered from the ranks like the sampled
    row's, each prompt token's log-probability the one rank's (float32: within the split sums' rounding)."""
    params = SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=2)
    for prompt in TINY_PROMPTS[2:]:
        ids = tiny_llm.tokenizer.encode(prompt)
        one, two = (llm.generate([ids], params)[0].prompt_logprobs for llm in (tiny_llm, tiny_tp))
        assert one[0] is None and two[0] is None and len(two) == len(one) == len(ids) > 2
        for token, a, b in zip(ids[1:], one[1:], two[1:], strict=True):
            assert b[token].logprob == pytest.approx(a[token].logprob, abs=1e-4)


def test_a_split_model_runs_only_through_the_engine(tiny_tp):
    assert tiny_tp.model.rank_config.num_heads == 2 and tiny_tp.model.rank_config.num_kv_heads == 1
    with pytest.raises(UnsupportedModelError, match="every rank computes the step"):
        tiny_tp.model.forward(torch.tensor([1, 2]), None, 0)


def test_the_probe_measures_the_groups_all_reduce_and_the_attribution_counts_it(tiny_tp):
    from rooftop.engine.calibrate import calibrate
    from rooftop.engine.probe import run_probe
    from rooftop.roofline.attribution import attribute_phases, attribute_step

    probe = run_probe(quick=True, collectives=tiny_tp.lead)
    assert probe.tensor_parallel == "gloo x2" and sorted(probe.all_reduce_seconds) == [1 << 10, 64 << 10]
    assert probe.all_reduce_latency_s > 0 and probe.all_reduce_bandwidth > 0
    hw = probe.to_hardware(working_set=tiny_tp.weight_bytes)
    assert hw.interconnect_bandwidth == probe.all_reduce_bandwidth
    assert hw.collective_latency_s == probe.all_reduce_latency_s
    calibration = calibrate(tiny_tp, hw, quick=True)
    assert calibration.curves["decode.communication"].points, "the collectives timed inside real steps"
    tiny_tp.step_records.clear()
    tiny_tp.generate(TINY_PROMPTS[:2], SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
    steps = [
        attribute_step(tiny_tp.config, tiny_tp.precision, r.shape, r.seconds, hw, r.around_seconds, calibration)
        for r in tiny_tp.step_records
    ]
    assert all(s.shape.tp == 2 for s in steps)
    for phase in attribute_phases(steps, hw).values():
        parts = phase.gap.parts()
        assert phase.gap.communication_s > 0  # the collectives as calibrated, whole
        # the bar's bound is the report's (the collectives at the probed interconnect where they take longer than
        # the kernels' ops), and the communication part only what the bound does not count of them
        assert parts["bound"] == pytest.approx(phase.bound_s)
        assert parts["communication"] == pytest.approx(phase.gap.communication_s - (phase.bound_s - phase.gap.kernels))
        assert sum(parts.values()) == pytest.approx(phase.measured_s)
    # the op model's collectives of a decode step: the plan, 2 per layer and the embedding's, the logits
    assert sum(op.collectives for op in steps[-1].predicted.ops) == 2 * tiny_tp.config.num_layers + 3


def test_sizes_that_do_not_split_the_model_are_refused_naming_the_valid_ones():
    with pytest.raises(InvalidRequestError, match=r"9 query heads, 3 KV heads .* valid sizes: 1, 3$"):
        LLM(tensor_parallel_size=2)  # refused before any rank starts
    with pytest.raises(UnsupportedModelError, match="dense Llama, Qwen2 and Qwen3 models for now"):
        LLM(model="qwen3-30b-a3b", load_format="dummy", tensor_parallel_size=2)
    with pytest.raises(InvalidRequestError, match="tensor_parallel_size must be an integer >= 1"):
        LLM(tensor_parallel_size=0)
    from test_cli import assert_user_error, rooftop_in_process

    cli = rooftop_in_process("generate", "Hi", "-tp", "2", "--no-roofline")
    assert_user_error(cli, "error: tensor_parallel_size 2 does not split")
    draft = '{"method": "draft", "draft_layers": 8, "num_speculative_tokens": 2}'
    cli = rooftop_in_process("generate", "Hi", "-tp", "3", "--speculative-config", draft, "--no-roofline")
    # one line of the message, not the exception's arguments as a tuple
    assert_user_error(cli, "error: speculative decoding with a draft model runs on one rank only for now")


def test_a_k_quant_split_inside_its_blocks_is_refused_with_the_sizes_that_keep_them_whole(tmp_path):
    from gguf import GGMLQuantizationType as T
    from gguf_factory import write_tiny_gguf

    from rooftop.config import RunConfig
    from rooftop.loading.model_files import load_weights
    from rooftop.loading.shard import ShardError
    from rooftop.models.loader import build_model
    from rooftop.models.parallel import TPGroup

    path = tmp_path / "tiny-q4k.gguf"
    write_tiny_gguf(path, qtype=T.Q4_K)  # rows of 256 weights: one super-block, which two ranks would cut
    loaded = load_weights(RunConfig(model=str(path)), torch.device("cpu"), torch.float32)
    with pytest.raises(ShardError, match="Q4_K blocks of 256 weights.*valid sizes for this file: 1$"):
        build_model(loaded, torch.float32, "cpu", "auto", TPGroup(0, 2))  # rank 0's part: no group needed


def test_serve_over_two_ranks_streams_what_the_engine_computes_and_stops_with_503_when_a_rank_dies(long_gguf, tiny_tp):
    """`rooftop serve -tp 2` (the group's quick probe cached first, as conftest caches the single rank's): a
    streamed completion is what `rooftop generate -tp 2` writes, the same steps over 2 ranks (their parity with one
    rank is the tests above); a worker killed while a long request streams ends it with a 503 error event naming
    the rank, and the server exits with status 1."""
    from rooftop.engine.probe import run_probe
    from rooftop.roofline.probe import cache_path

    probe = run_probe(quick=True, collectives=tiny_tp.lead).to_dict()
    probe["quick"] = False  # let it answer the server's full request
    cache_path("cpu", "gloo x2").write_text(json.dumps(probe))
    prompt = TINY_PROMPTS[2]
    generate = [sys.executable, "-m", "rooftop", "generate", prompt, "-m", str(long_gguf), "-tp", "2", "--raw"]
    cli = subprocess.run([*generate, "-n", "12", "-t", "0", "--no-roofline"], capture_output=True, text=True)
    assert cli.returncode == 0, cli.stderr
    assert "on cpu split over 2 ranks, weights" in cli.stderr  # the model line says how it runs
    expected = cli.stdout.removesuffix("\n")
    with serving(long_gguf, "--kv-cache-bytes", str(KV), "--distributed-timeout", "30") as (url, server):
        assert stream(url, {"prompt": prompt, "max_tokens": 12, "ignore_eos": False})[0] == expected
        events, started = [], threading.Event()
        body = {"prompt": prompt, "max_tokens": 1500}
        reader = threading.Thread(target=read_events, args=(url, body, events, started))
        reader.start()
        assert started.wait(120)
        (worker,) = children(server.pid)
        os.kill(worker, signal.SIGKILL)
        reader.join(120)
        assert server.wait(60) == 1
        stderr = server.stderr.read()
    error = json.loads(events[-2])["error"]
    assert error["code"] == 503 and "the engine stopped" in error["message"], events[-3:]
    assert "rank 1" in error["message"] and "SIGKILL" in error["message"]
    assert "rank 1" in stderr.strip().splitlines()[-1] and "Traceback" not in stderr


def stream(url: str, body: dict) -> list[str]:
    """A greedy streamed completion's text and finish reason."""
    events: list[str] = []
    read_events(url, body, events, threading.Event())
    choices = [json.loads(e)["choices"][0] for e in events if e != "[DONE]"]
    return ["".join(c["text"] or "" for c in choices), choices[-1]["finish_reason"]]


def read_events(url: str, body: dict, into: list, started: threading.Event) -> None:
    greedy = {"temperature": 0, "ignore_eos": True, "stream": True, **body}
    with httpx.stream("POST", f"{url}/v1/completions", json=greedy, timeout=120) as response:
        for event in sse_events(response.iter_lines()):
            into.append(event)
            started.set()
