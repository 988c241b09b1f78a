"""Tensor-parallel groups started and stopped by each test (a process leads one group at a time): the bundled model
(9 query heads, 3 KV heads) over 3 ranks against one; a rank killed, and a rank hung, while the group runs: the run
stops with TensorParallelError naming the rank within the timeout, never a silent hang, and every later step is
refused at once. NCCL runs the same code with another backend, on a machine with two GPUs (one GPU cannot hold two
NCCL ranks); elsewhere that test is skipped."""

from __future__ import annotations

import os
import signal
import time

import pytest
import torch
from near_ties import FLOAT_TIE, QUANTIZED_TIE, greedy_partings, rooftop_logits

from rooftop import LLM, SamplingParams
from rooftop.errors import TensorParallelError

KV = 64 << 20
SHORT = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)


def by_request(outputs) -> list[tuple[list[int], list[float]]]:
    return [(o.token_ids, [lp.logprob for lp in o.logprobs]) for o in outputs]


@pytest.mark.slow
def test_bundled_model_over_three_ranks_parts_from_one_only_at_near_ties():
    """The quantized kernels quantize each row's activations to int8 per group: the row-parallel sums, added in
    another order than one rank's accumulation, move a value by an ulp, which can move its int8 rounding, so the
    logits differ as a quantized path's do; greedy runs part only at the reference's near-ties (QUANTIZED_TIE).
    Batch invariance holds exactly at three ranks, where the partial sums are added in rank order."""
    one = LLM(kv_cache_bytes=KV)
    chats = ["What is the weather in Lagos?", "Write a haiku about rain."]
    prompts = [one.tokenizer.encode(one.apply_chat_template([{"role": "user", "content": c}])) for c in chats]
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True, logprobs=0)
    refs = [o.token_ids for o in one.generate(prompts, params)]
    three = LLM(tensor_parallel_size=3, kv_cache_bytes=KV)
    try:
        logits_of = rooftop_logits(one)
        for ids, ref in zip(prompts, refs, strict=True):
            partings = greedy_partings(logits_of, three, ids, ref)
            assert all(margin < QUANTIZED_TIE for _, margin in partings), partings
        batched = by_request(three.generate(prompts, params))
        assert batched == [by_request(three.generate([p], params))[0] for p in prompts]
    finally:
        three.close()


def test_a_killed_rank_stops_the_run_with_an_error_naming_it_within_the_timeout(tiny_gguf):
    timeout = 30
    llm = LLM(model=tiny_gguf, tensor_parallel_size=2, kv_cache_bytes=KV, distributed_timeout_s=timeout)
    try:
        assert llm.generate(["abc"], SHORT)[0].token_ids
        (worker,) = llm.lead.workers
        os.kill(worker.pid, signal.SIGKILL)
        start = time.monotonic()
        with pytest.raises(TensorParallelError, match=r"lost rank 1 \(pid \d+\), which was killed by SIGKILL"):
            llm.generate(["abc"], SHORT)
        assert time.monotonic() - start < timeout
        with pytest.raises(TensorParallelError, match="cannot run another step"):
            llm.generate(["abc"], SHORT)
    finally:
        llm.close()


def test_a_hung_rank_stops_the_run_within_the_timeout(tiny_gguf):
    """The worker is stopped (SIGSTOP): alive, connected, silent; rank 0's next collective gives up after the
    timeout, which the test forces short. The error comes after about the timeout, never a hang."""
    timeout = 4
    llm = LLM(model=tiny_gguf, tensor_parallel_size=2, kv_cache_bytes=KV, distributed_timeout_s=timeout)
    (worker,) = llm.lead.workers
    try:
        assert llm.generate(["abc"], SHORT)[0].token_ids
        os.kill(worker.pid, signal.SIGSTOP)
        start = time.monotonic()
        with pytest.raises(TensorParallelError, match=f"did not answer within {timeout} s"):
            llm.generate(["abc"], SHORT)
        assert time.monotonic() - start < 3 * timeout
    finally:
        os.kill(worker.pid, signal.SIGCONT)
        llm.close()
    assert worker.poll() is not None, "closing a failed group ends the worker rooftop started"


def test_the_rank_that_hung_is_named_not_the_one_that_timed_out_waiting_on_it():
    """Three ranks, rank 2 stopped: rank 1's collective times out and it exits, and rank 0 named rank 1 as the
    rank the group lost. A worker that gave up waiting exits with its own status (WAITED), so the rank still
    running is named, or none where rank 0 timed out first."""
    timeout = 4
    llm = LLM(tensor_parallel_size=3, kv_cache_bytes=KV, distributed_timeout_s=timeout)
    hung = llm.lead.workers[1]
    try:
        assert llm.generate(["abc"], SHORT)[0].token_ids
        os.kill(hung.pid, signal.SIGSTOP)
        with pytest.raises(TensorParallelError, match=f"did not answer within {timeout} s") as failure:
            llm.generate(["abc"], SHORT)
        assert "rank 1" not in str(failure.value).split("(rank 1 timed out")[0], failure.value
    finally:
        os.kill(hung.pid, signal.SIGCONT)
        llm.close()


def test_a_closed_group_says_so(tiny_gguf):
    """A step after close() blamed a worker's clean exit: "lost rank 1 ..., which exited with status 0"."""
    llm = LLM(model=tiny_gguf, tensor_parallel_size=2, kv_cache_bytes=KV)
    llm.close()
    with pytest.raises(TensorParallelError, match="the tensor-parallel group was closed"):
        llm.generate(["abc"], SHORT)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL needs a GPU per rank: this machine has fewer than 2")
def test_nccl_runs_the_same_split_over_two_gpus(tiny_gguf, tiny_llm):
    """float32 on two GPUs against the float32 reference on the CPU: parting only at a float path's near-ties."""
    params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    llm = LLM(model=tiny_gguf, device="cuda", dtype="float32", tensor_parallel_size=2, kv_cache_bytes=KV)
    try:
        assert llm.lead.group() == "nccl x2"
        logits_of = rooftop_logits(tiny_llm)
        for prompt in ["Hello there", "The quick brown fox"]:
            ids = tiny_llm.tokenizer.encode(prompt)
            ref = tiny_llm.generate([ids], params)[0].token_ids
            assert all(margin < FLOAT_TIE for _, margin in greedy_partings(logits_of, llm, ids, ref))
    finally:
        llm.close()


def test_the_rank_blamed_is_the_one_that_failed_of_its_own():
    """Which rank a lost group names, from the workers' exits (rank -> status): a signal first, then a failure of
    the rank's own; where every exit gave up waiting on the others (WAITED), the ranks still running."""
    from types import SimpleNamespace

    from rooftop.engine.distributed import WAITED
    from rooftop.engine.lead import Lead

    group = SimpleNamespace(workers=[SimpleNamespace(pid=100 + rank) for rank in (1, 2, 3)], timeout_s=4)
    assert Lead._blamed(group, {1: WAITED}) == (
        "one of ranks 2 (pid 102), 3 (pid 103), which did not answer within 4 s (rank 1 timed out waiting)"
    )
    assert Lead._blamed(group, {1: WAITED, 2: WAITED}).startswith("rank 3 (pid 103), which did not answer")
    assert Lead._blamed(group, {1: 1, 3: -9}) == "rank 3 (pid 103), which was killed by SIGKILL"
    assert Lead._blamed(group, {1: WAITED, 2: 1}) == "rank 2 (pid 102), which exited with status 1"
