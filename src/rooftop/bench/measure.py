"""Timed runs on the engine: one prefill of S tokens, batches of decodes; warm-up excluded, medians kept."""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass, replace
from datetime import datetime, timezone

import torch

import rooftop
from rooftop.engine.llm import LLM
from rooftop.engine.llm_engine import LLMEngine
from rooftop.engine.outputs import StepRecord
from rooftop.engine.sampling_params import SamplingParams
from rooftop.errors import RooftopError
from rooftop.roofline.hardware import Hardware
from rooftop.roofline.ops import parameter_count, weight_bytes

FILLER = "The history of the printing press is a long story of ideas, metal and ink. "


def synthetic_prompt(llm: LLM, length: int, variant: int) -> list[int]:
    """`length` token ids of ordinary text; `variant` changes the first token so no two runs share a prefix."""
    base = llm.tokenizer.encode(FILLER)
    ids = (base * (length // len(base) + 1))[:length]
    ids[0] = llm.tokenizer.encode(f"{variant}")[0]
    return ids


def fresh_engine(llm: LLM, max_tokens_per_step: int, max_num_seqs: int = 256, chunk: int | None = None) -> LLMEngine:
    """A new engine over the loaded weights, with the run's engine options but an empty KV pool, no prefix cache,
    room for every sequence and no chunking of the prompt, or chunks of `chunk` tokens where given (each
    measurement sees exactly the steps it asks for)."""
    base = llm.run_config.engine
    budget = max(max_tokens_per_step, base.max_num_batched_tokens, chunk or 0)  # a chunk runs in one step
    config = replace(
        base,
        max_num_seqs=max(max_num_seqs, base.max_num_seqs),
        max_num_batched_tokens=budget,
        chunked_prefill_size=chunk or budget,
        enable_prefix_caching=False,
    )
    return LLMEngine(llm.model, llm.tokenizer, config)


@dataclass
class Run:
    records: list[StepRecord]
    ttft_s: list[float]  # per request


def run_batch(llm: LLM, prompts: list[list[int]], output_len: int, chunk: int | None = None) -> Run:
    eng = fresh_engine(llm, sum(len(p) for p in prompts), len(prompts), chunk)
    params = SamplingParams(max_tokens=output_len, temperature=0, ignore_eos=True)
    for i, prompt in enumerate(prompts):
        eng.add_request(str(i), prompt, params)
    ttfts, records = [], []
    while eng.has_unfinished():
        step = eng.step()
        if step.record is not None:
            records.append(step.record)
        for d in step.deltas:
            if d.finish_reason == "error":  # a run cut short is no measurement of the requested shape
                raise RooftopError(f"the benchmark's request failed: {d.output.error}")
        ttfts += [d.metrics.ttft for d in step.deltas if d.finished]
    return Run(records, ttfts)


def machine_info(llm: LLM, hw: Hardware, cpu_model: str) -> dict:
    """What a number needs beside it to mean anything."""
    spec = llm.engine.config.speculative_config
    return {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "cpu": cpu_model or platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "threads": torch.get_num_threads(),  # per rank under tensor parallelism
        "tensor_parallel_size": llm.tensor_parallel_size,
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "default"),
        "gpu": torch.cuda.get_device_name(llm.device) if llm.device.type == "cuda" else None,
        "device": str(llm.device),
        "backend": llm.device.type.upper(),  # llama-bench's column: CPU, CUDA
        "torch": torch.__version__,
        "rooftop": rooftop.__version__,
        "python": platform.python_version(),
        "model": llm.config.name or llm.model_path,
        "model_path": llm.model_path,
        "parameters": parameter_count(llm.config).total,
        "weight_bytes": weight_bytes(llm.config, llm.precision),  # the whole model as it runs, the analyzer's count
        "load_format": llm.run_config.load_format,  # "dummy": random weights, the speed of the shapes only
        "dtype": str(llm.dtype).removeprefix("torch."),
        "weights_format": llm.precision.weights.name,
        "kv_cache_dtype": llm.engine.kv_cache_dtype,  # what the KV pool stores (--kv-cache-dtype auto: the dtype's)
        # speculative decoding (vLLM's JSON), None without: a tgN then decodes in fewer steps than N
        "speculative_config": None if spec is None else spec.to_dict(),
        "roofs": {"name": hw.name, "peak_flops_per_s": hw.peak_flops, "bandwidth_bytes_per_s": hw.memory_bandwidth},
    }
