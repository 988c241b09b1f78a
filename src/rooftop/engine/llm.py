"""LLM: the front door (vLLM's shape). Loads a model and runs prompts through the continuous-batching engine."""

from __future__ import annotations

import contextlib
import itertools
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields, replace
from pathlib import Path

import torch

from rooftop.config import EngineConfig, RunConfig, auto_dtype
from rooftop.engine.distributed import check_parallel_run, check_torchrun, launch_of, rank_device, rank_threads
from rooftop.engine.lead import Lead, lead_group
from rooftop.engine.llm_engine import LLMEngine
from rooftop.engine.outputs import RequestDelta, RequestOutput, StepOutput, StepRecord
from rooftop.engine.progress import LoadProgress, PromptProgress
from rooftop.engine.sampling_params import SamplingParams
from rooftop.engine.tool_calls import parse_tool_calls
from rooftop.engine.tool_prompt import tool_messages
from rooftop.engine.tools import Function, check_tool_choice, check_tools, with_tool_grammar
from rooftop.enums import FinishReason
from rooftop.errors import InvalidRequestError
from rooftop.loading.dummy import check_fits
from rooftop.loading.model_files import check_source, load_weights
from rooftop.loading.tokenizer import Tokenizer
from rooftop.models.loader import build_model
from rooftop.models.transformer import Transformer
from rooftop.roofline.ops import weight_bytes
from rooftop.roofline.precision import KV_BYTES, KV_SCALE_BYTES, Precision
from rooftop.roofline.probe import available_cores

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
STEP_HISTORY = 10_000  # step records kept for the phase report

Prompt = str | list[int] | dict  # text, token ids, or vLLM's {"prompt": text} / {"prompt_token_ids": ids}


def as_prompt(prompt: Prompt) -> str | list[int]:
    """Text or token ids from any of the forms `Prompt` names; anything else is refused by name."""
    if isinstance(prompt, dict):
        if set(prompt) == {"prompt_token_ids"}:
            return list(prompt["prompt_token_ids"])
        if set(prompt) == {"prompt"}:
            return prompt["prompt"]
        raise InvalidRequestError(
            f"a prompt dict holds exactly one of 'prompt' (text) or 'prompt_token_ids'; got keys {sorted(prompt)}"
        )
    if isinstance(prompt, str) or (isinstance(prompt, list) and all(isinstance(i, int) for i in prompt)):
        return prompt
    raise InvalidRequestError(f"a prompt is text, a list of token ids or a prompt dict, not {type(prompt).__name__}")


Messages = list[dict]


def each_params(given: SamplingParams | list[SamplingParams] | None, count: int) -> list[SamplingParams]:
    """The sampling params of each of `count` prompts: one for all, or a list (one each: its length is checked by
    the caller); anything else is refused by name."""
    listed = list(given) if isinstance(given, list | tuple) else [given or SamplingParams()] * count
    wrong = next((p for p in listed if not isinstance(p, SamplingParams)), None)
    if wrong is not None:
        raise InvalidRequestError(
            f"sampling_params must be a SamplingParams or a list of them, got {type(wrong).__name__}",
            "sampling_params",
        )
    return listed


@dataclass
class StreamChunk:
    """One step of a streamed request: the text and tokens it added; the whole output with the last chunk."""

    delta: str
    token_ids: list[int]
    finish_reason: FinishReason | None = None
    output: RequestOutput | None = None  # on the final chunk only

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """ "auto" is `auto_dtype` of the device."""
    return TORCH_DTYPES[auto_dtype(device.type) if dtype == "auto" else dtype]


def gathered(outputs: list[RequestOutput]) -> RequestOutput:
    """A prompt's n requests' outputs as one: the first's, with every one of them as its `outputs`."""
    if len(outputs) > 1:
        outputs[0].outputs = [o.completion(i) for i, o in enumerate(outputs)]
    return outputs[0]


class LLM:
    """Run a model on prompts or chats: `LLM().generate(["Hello"], SamplingParams(max_tokens=32))`.

    `weights` (roofline.precision.WEIGHT_CHOICES): "auto" (the format closest to the file: int4 for the bundled Q4_1
    GGUF), "float" (in `dtype`), "int8" (a quarter of float32's bytes per decode step: GGUF Q8_0, a scale per group
    of 32, on rooftop's CPU kernels; one scale per row without them) or "int4" (a scale and a zero or minimum per
    group of 32; a GGUF's Q4_0/Q4_1 weights load as they are, the lm_head at 8 bits), or an exact format the engine
    runs here (e.g. "q4_1", "q8_0").
    `threads`: CPU threads for the model's ops (default: the cores this process may use); it sets PyTorch's one
    intra-op pool, so it holds for the whole process.
    `seed` (vLLM's): seeds torch's generator once the engine is up, which the requests without a seed of their own
    (SamplingParams.seed) draw from, so a script's sampled outputs repeat from run to run.
    `load_format` (vLLM's): "auto" reads the weights from the model's file; "dummy" makes seeded random ones
    (`dummy_seed`) in the `weights` format and reads no weight file, and `model` may then also be a preset name of
    the analyzer (`rooftop.roofline.presets`) or a config.json.
    `tensor_parallel_size` (vLLM's): the ranks the model is split over. rooftop starts tensor_parallel_size - 1
    worker processes on this host (gloo on the CPU, NCCL on CUDA, one GPU each), or, under torchrun, this process is
    one rank of torchrun's: rank 0 goes on here, any other serves rank 0's steps inside `LLM(...)` and then exits
    the process. `distributed_timeout_s`: how long a rank waits on the others before the run stops with
    TensorParallelError. `close()` stops the ranks (also done at exit).
    Engine options (vLLM's names, EngineConfig's fields): max_num_seqs, max_num_batched_tokens, kv_cache_bytes or
    num_kv_blocks, block_size, enable_prefix_caching, max_model_len, speculative_config (vLLM's dict, e.g.
    {"method": "ngram", "num_speculative_tokens": 4}; a draft model: {"method": "draft", "model": PATH,
    "num_speculative_tokens": 4}, or a self-draft of the first N layers: {"method": "draft", "draft_layers": N,
    "num_speculative_tokens": 4}). `LLM.from_config(RunConfig(...))` takes the same as one value.
    """

    def __init__(
        self,
        model: str | Path | None = None,
        dtype: str | torch.dtype = "auto",
        device: str | torch.device = "cpu",
        weights: str = "auto",
        threads: int | None = None,
        load_format: str = "auto",
        dummy_seed: int = 0,
        tensor_parallel_size: int = 1,
        distributed_timeout_s: float = 60.0,
        seed: int | None = None,
        **engine_options,
    ):
        if isinstance(dtype, torch.dtype):
            dtype = str(dtype).removeprefix("torch.")
        unknown = sorted(set(engine_options) - {f.name for f in fields(EngineConfig)})
        if unknown:  # EngineConfig's TypeError would name a class the caller never called
            known = ", ".join(f.name for f in fields(EngineConfig))
            raise InvalidRequestError(f"LLM() takes no {', '.join(map(repr, unknown))} (its engine options: {known})")
        engine = EngineConfig(**engine_options)
        run = RunConfig(
            model,
            dtype,
            str(device),
            weights,
            threads,
            load_format,
            dummy_seed,
            tensor_parallel_size,
            distributed_timeout_s,
            engine,
        )
        if seed is not None and (not isinstance(seed, int) or seed < 0):
            raise InvalidRequestError(f"seed must be an integer >= 0, got {seed!r}", "seed")
        self._start(run)
        if seed is not None:
            torch.manual_seed(seed)

    @classmethod
    def from_config(cls, run: RunConfig) -> LLM:
        llm = cls.__new__(cls)
        llm._start(run)
        return llm

    def _start(self, run: RunConfig) -> None:
        self.run_config = run
        self.lead: Lead | None = None
        check_torchrun(run)  # one of torchrun's processes runs as a rank of this run's group, never alone
        launch = launch_of(run) if run.tensor_parallel_size > 1 else None
        # the process's one intra-op pool, kernels included; the host's cores shared among its ranks
        torch.set_num_threads(rank_threads(run, launch, available_cores()))
        self.device = rank_device(run.device, launch)
        self.dtype = resolve_dtype(run.dtype, self.device)
        check_source(run)  # a missing file refused before any other is read
        loaded = load_weights(run, self.device, self.dtype)
        self.model_path = loaded.source
        self.load_notes = loaded.notes
        self.config = loaded.config
        self.tokenizer = loaded.tokenizer
        if launch is not None:
            check_parallel_run(run, loaded)
        if run.load_format == "dummy":  # made here, not read: refused before the first tensor if they cannot fit
            check_fits(loaded, run.weights, self.device, self.dtype, run.tensor_parallel_size)
        if launch is not None and launch.rank != 0:  # one of torchrun's processes: serve rank 0's steps, then end
            from rooftop.engine.tp_worker import serve_rank

            raise SystemExit(serve_rank(run, launch))
        with LoadProgress(self.config.num_layers) as progress:
            if launch is None:
                model = build_model(loaded, self.dtype, self.device, run.weights, on_layer=progress.on_layer)
            else:
                self.lead, model = lead_group(
                    run,
                    launch,
                    self.device,
                    lambda tp: build_model(loaded, self.dtype, self.device, run.weights, tp, progress.on_layer),
                )
        self.engine = LLMEngine(model, self.tokenizer, run.engine)
        self.step_records: deque[StepRecord] = deque(maxlen=STEP_HISTORY)  # the steps this LLM ran, oldest first
        self._request_ids = itertools.count()
        self._inbox: dict[str, list[RequestDelta]] = {}  # deltas stepped out for a request not being read now

    def get_tokenizer(self) -> Tokenizer:
        """vLLM's accessor of the model's tokenizer (`encode`, `decode`, `apply_chat_template`)."""
        return self.tokenizer

    def close(self) -> None:
        """Stop the other ranks of a tensor-parallel group and leave it (the process may then lead another); a
        no-op for one device."""
        if self.lead is not None:
            self.lead.close()

    @property
    def tensor_parallel_size(self) -> int:
        return self.run_config.tensor_parallel_size

    @property
    def max_model_len(self) -> int:
        return self.engine.max_model_len

    @property
    def model(self) -> Transformer:
        return self.engine.model

    @property
    def precision(self) -> Precision:
        """What the engine's steps read and compute in, for the roofline attribution: the model's, with the KV cache
        at the width the engine's pool stores (--kv-cache-dtype, scales included)."""
        kv = self.engine.kv_cache_dtype
        return replace(self.model.precision, kv_bytes=KV_BYTES[kv], kv_scale_bytes=KV_SCALE_BYTES.get(kv, 0))

    @property
    def weight_bytes(self) -> float:
        """The weights a decode step reads on one rank, by the analyzer's count at the run's precision: the working
        set whose read bandwidth is the run's memory roof (ProbeResult.to_hardware)."""
        return weight_bytes(self.config, self.precision) / self.tensor_parallel_size

    def generate(
        self,
        prompts: Prompt | list[Prompt],
        sampling_params: SamplingParams | list[SamplingParams] | None = None,
        use_tqdm: bool | Callable = True,
    ) -> list[RequestOutput]:
        """One output per prompt, in order; all prompts run concurrently. A prompt is text or token ids. A prompt's
        `n` outputs (SamplingParams.n) run as n requests sharing its computed prompt, gathered in its output's
        `outputs` (vLLM's). `use_tqdm` (vLLM's name): a progress bar of the prompts finished, on stderr where it is a
        terminal."""
        if not isinstance(use_tqdm, bool) and not callable(use_tqdm):
            raise InvalidRequestError(
                f"use_tqdm must be True, False or a tqdm-like bar's constructor, not {use_tqdm!r}", "use_tqdm"
            )
        if isinstance(prompts, str | dict) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        if not isinstance(prompts, list | tuple):
            raise InvalidRequestError(
                "prompts must be a prompt (text, token ids or a prompt dict) or a list of them, got "
                f"{type(prompts).__name__}",
                "prompts",
            )
        params_list = each_params(sampling_params, len(prompts))
        if len(params_list) != len(prompts):
            raise InvalidRequestError(f"{len(prompts)} prompts but {len(params_list)} sampling params")
        arrival = time.perf_counter()
        ids: list[str] = []
        groups: list[list[str]] = []  # each prompt's requests, one per output
        try:
            for prompt, p in zip(prompts, params_list, strict=True):
                groups.append([])
                for choice in p.choices():
                    ids.append(f"generate-{next(self._request_ids)}")
                    first = groups[-1][0] if groups[-1] else None
                    self.engine.add_request(ids[-1], as_prompt(prompt), choice, arrival, shares_prompt_with=first)
                    groups[-1].append(ids[-1])
            outputs = {}
            bar = None if isinstance(use_tqdm, bool) else use_tqdm
            with PromptProgress(groups, bar) if use_tqdm else contextlib.nullcontext() as progress:
                on_step = progress.on_step if progress else None
                for request_id in ids:
                    for delta in self._deltas(request_id, on_step):
                        if delta.output is not None:
                            outputs[request_id] = delta.output
            return [gathered([outputs[i] for i in group]) for group in groups]
        finally:  # an error (or Ctrl-C) midway frees every request this call started
            for request_id in ids:
                self.engine.abort(request_id)

    def chat(
        self,
        messages: Messages | list[Messages],
        sampling_params: SamplingParams | None = None,
        tools: list[dict] | None = None,
        tool_choice: str | dict | None = None,
        parallel_tool_calls: bool = True,
        use_tqdm: bool | Callable = True,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        chat_template_kwargs: dict | None = None,
    ) -> list[RequestOutput]:
        """One conversation (a list of {"role", "content"} dicts, OpenAI's tool calls and `role: tool` results
        included) or a list of them -> one output each. `tools` (OpenAI's function tools) and `tool_choice` ("auto"
        by default with tools, "none", "required" or {"type": "function", "function": {"name": ...}}) as the
        server takes them: the calls are held to the tools by a grammar and read into `output.tool_calls`.
        `use_tqdm` as `generate` takes it; `add_generation_prompt`, `continue_final_message` and
        `chat_template_kwargs` (vLLM's) as `apply_chat_template` takes them."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        functions = [] if tools is None else check_tools(tools)
        choice = check_tool_choice(tool_choice, functions)
        params = [
            with_tool_grammar(p, functions, choice, parallel_tool_calls)
            for p in each_params(sampling_params, len(conversations))
        ]
        offered = functions if choice.mode != "none" else []
        template = {
            "add_generation_prompt": add_generation_prompt,
            "continue_final_message": continue_final_message,
            "chat_template_kwargs": chat_template_kwargs,
        }
        prompts = [self.apply_chat_template(c, offered, **template) for c in conversations]
        outputs = self.generate(prompts, params, use_tqdm)
        if choice.mode != "none":
            for output in outputs:
                for completion in output.outputs:
                    completion.tool_calls = parse_tool_calls(completion.text)[1]
                output.tool_calls = output.outputs[0].tool_calls
        return outputs

    def stream(self, prompt: Prompt, sampling_params: SamplingParams | None = None) -> Iterator[StreamChunk]:
        """Generate for one prompt, yielding each piece of text as soon as it is final (the request is queued
        at once, so a bad prompt raises here, not at the first `next`)."""
        request_id = f"stream-{next(self._request_ids)}"
        self.engine.add_request(request_id, as_prompt(prompt), sampling_params or SamplingParams())
        return self._stream(request_id)

    def _stream(self, request_id: str) -> Iterator[StreamChunk]:
        try:
            for delta in self._deltas(request_id):
                yield StreamChunk(delta.text, delta.new_token_ids, delta.finish_reason, delta.output)
        finally:  # a consumer that stops early (Ctrl-C, a closed stream) frees the request's blocks
            self.engine.abort(request_id)

    def _deltas(self, request_id: str, on_step: Callable[[StepOutput], None] | None = None) -> Iterator[RequestDelta]:
        """This request's deltas until it finishes, stepping the engine as needed (each step shown to `on_step`);
        other requests' deltas are kept for their own consumers, so interleaved streams and generate calls each see
        all of theirs."""
        while True:
            queue = self._inbox.pop(request_id, [])
            yield from queue
            if queue and queue[-1].finished:
                return
            if request_id in self._inbox:
                continue
            if not self.engine.has_request(request_id):
                return
            step = self.engine.step()
            if step.record is not None:
                self.step_records.append(step.record)
            if on_step is not None:
                on_step(step)
            for delta in step.deltas:
                self._inbox.setdefault(delta.request_id, []).append(delta)

    def apply_chat_template(
        self,
        messages: Messages,
        tools: list[Function] | None = None,
        add_generation_prompt: bool = True,
        *,
        continue_final_message: bool = False,
        chat_template_kwargs: dict | None = None,
    ) -> str:
        """The prompt of a conversation, with `tools` offered: through the template's own tool syntax where it has
        one, rooftop's default tool prompt otherwise (engine/tool_prompt.py). vLLM's `chat_template_kwargs` are the
        template's own variables (Qwen3's {"enable_thinking": False}); `continue_final_message` (with
        add_generation_prompt=False) leaves the last message open, so the model goes on with it."""
        takes_tools = self.tokenizer.template_takes_tools
        messages = tool_messages(messages, tools or [], takes_tools)
        offered = [f.as_tool() for f in tools] if tools and takes_tools else None
        return self.tokenizer.apply_chat_template(
            messages,
            add_generation_prompt,
            tools=offered,
            continue_final_message=continue_final_message,
            chat_template_kwargs=chat_template_kwargs,
        )
