"""The options of every command that starts an engine (generate, chat, serve, bench), defined once: one help text
each, defaults taken from RunConfig and EngineConfig, and handed to the command as one RunConfig."""

from __future__ import annotations

import functools
import inspect
import json
import os
from collections.abc import Callable
from dataclasses import fields
from typing import Annotated, Any, get_type_hints

import typer

from rooftop.config import DTYPES, LOAD_FORMATS, EngineConfig, RunConfig
from rooftop.console import err, user_errors
from rooftop.errors import InvalidRequestError
from rooftop.roofline.precision import WEIGHT_CHOICES, check_weight_choice

# --weights as the engine takes it (the analyzer's help adds what each choice means on a datasheet device)
ENGINE_WEIGHTS_HELP = (
    "auto (the file's own format: a GGUF's tensors as stored, a bf16 checkpoint as bf16-fp32 on the CPU kernels, "
    "other floats in the run's dtype), float (the run's dtype), int8 or int4 (Q8_0 / Q4_1 groups of 32 on the CPU "
    "kernels, else int8 per row / int4 per 32), or an exact format: "
    f"{', '.join(WEIGHT_CHOICES[4:])} (refused where the engine does not make it; a file's own block formats run as "
    "stored under auto)"
)

RUN_HELP = {
    "model": (
        "--model",
        "-m",
        "GGUF file or Hugging Face directory, with --load-format dummy also a preset name or a config.json "
        "(default: the bundled SmolLM2-135M-Instruct)",
    ),
    "dtype": (f"{', '.join(DTYPES)} (auto: float32 on CPU, bfloat16 on a GPU)",),
    "device": ("torch device: cpu, cuda, cuda:1 ...",),
    "weights": (ENGINE_WEIGHTS_HELP,),
    "threads": ("CPU threads for the model's ops (llama.cpp's --threads; default: the cores this process may use)",),
    "load_format": (
        f"{', '.join(LOAD_FORMATS)} (vLLM's): auto reads the weights from the model's file; dummy makes seeded "
        "random weights in the --weights format and reads no weight file",
    ),
    "dummy_seed": ("seed of --load-format dummy's weights: the same seed, the same weights",),
    "tensor_parallel_size": (
        "--tensor-parallel-size",
        "-tp",
        "ranks the model is split over (vLLM's name): rooftop starts them on this host, or each is a process of "
        "torchrun (gloo on CPU, NCCL on CUDA); --threads is then per rank (default: the cores shared among them)",
    ),
    "distributed_timeout_s": (
        "--distributed-timeout",
        "seconds a rank waits on the others (a collective, the next step's plan) before the run stops with an "
        "error naming the rank that failed",
    ),
}
ENGINE_HELP = {
    "max_num_seqs": "most sequences in one step",
    "max_num_batched_tokens": "most tokens in one step (longer prompts are prefilled in chunks)",
    "block_size": "tokens per KV block",
    "kv_cache_bytes": "KV cache pool size in bytes (default 1 GiB)",
    "num_kv_blocks": "KV cache pool size in blocks (overrides --kv-cache-bytes)",
    "enable_prefix_caching": "reuse the KV blocks of prompt prefixes seen before",
    "max_model_len": "context length (default: the model's)",
    "batch_invariant": "a request's tokens and logprobs do not depend on what shares its steps "
    "(--no-batch-invariant: chunks and linear paths follow the whole step, faster prefill under load)",
    "chunked_prefill_size": "most prompt tokens of one sequence per step (SGLang's name; default 256 with batch "
    "invariance, where chunks start at its multiples and the prefix cache is reused in whole chunks; else "
    "max-num-batched-tokens)",
    "kv_cache_dtype": "KV cache storage (vLLM's name): auto (the model's dtype), float32, bfloat16, float16 (cast "
    "on write and on read where not the model's dtype), int8 or fp8_e4m3 (1 byte per value and a float32 scale per "
    "token and KV head, quantized as each token is written and read as stored by decode attention; fp8: vLLM's "
    "alias of fp8_e4m3)",
    "enforce_eager": "CUDA: run decode steps op by op instead of replaying the CUDA graphs captured at startup "
    "(vLLM's name)",
    "cuda_graph_sizes": "CUDA: decode batch sizes captured as graphs (repeat the option; vLLM's rule: one value N "
    "captures 1, 2, 4 and the multiples of 8 up to N; default N = min(2 x max-num-seqs, 512)); a step is padded to "
    "the next captured size, and one larger than all of them runs eagerly",
    "speculative_config": "speculative decoding as vLLM's JSON, e.g. "
    '\'{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}\' '
    "(n-gram prompt lookup: drafts from the prompt and output; greedy and seeded outputs stay the same)",
}
JSON_FIELDS = {"speculative_config"}  # EngineConfig fields given on the command line as a JSON object
RUN_FIELDS = [f for f in fields(RunConfig) if f.name != "engine"]


def _parameter(name: str, annotation: Any, default: Any, *decls: str, help: str) -> inspect.Parameter:
    option = typer.Option(*decls, help=help)
    return inspect.Parameter(
        name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=Annotated[annotation, option]
    )


def _run_parameters() -> list[inspect.Parameter]:
    run, run_types = RunConfig(), get_type_hints(RunConfig)
    params = []
    for f in RUN_FIELDS:
        *decls, text = RUN_HELP[f.name]
        params.append(_parameter(f.name, run_types[f.name], getattr(run, f.name), *decls, help=text))
    engine, engine_types = EngineConfig(), get_type_hints(EngineConfig)
    for f in fields(EngineConfig):
        text = f"engine: {ENGINE_HELP[f.name]}"
        kind = str | None if f.name in JSON_FIELDS else engine_types[f.name]
        params.append(_parameter(f.name, kind, getattr(engine, f.name), help=text))
    return params


def parse_json_option(name: str, text: str | None) -> dict | None:
    """A JSON object option's value (None when not given); text that is not JSON is refused naming the option."""
    if text is None:
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        option = "--" + name.replace("_", "-")
        raise InvalidRequestError(f"{option} is not valid JSON ({e.msg} at character {e.pos}): {text!r}", name) from e


def with_run_config(command: Callable | None = None, *, run_fields: dict[str, Callable] | None = None) -> Callable:
    """Give `command` (whose last parameter is `run: RunConfig`) the engine options as CLI options; it receives
    them as one validated RunConfig. Bad values fail with one line, before anything loads. `run_fields`: RunConfig
    fields that `command` declares as options of its own (`bench`'s --threads, which takes llama-bench's lists),
    each with the parser from its value to the field's: the RunConfig holds the parsed value (so that every rank of
    a tensor-parallel run has it) and `command` still gets its option as given. Any other option named like a
    shared one is refused here, at import."""
    if command is None:
        return functools.partial(with_run_config, run_fields=run_fields)
    parsers = run_fields or {}
    own = [p for p in inspect.signature(command, eval_str=True).parameters.values() if p.name != "run"]
    clashes = {p.name for p in own} & {p.name for p in _run_parameters()} - parsers.keys()
    if clashes:
        raise TypeError(f"{command.__name__} declares shared engine options of its own: {sorted(clashes)}")
    shared = [p for p in _run_parameters() if p.name not in parsers]
    names = {p.name for p in shared}

    @functools.wraps(command)
    def wrapper(**kwargs):
        options = {name: kwargs.pop(name) for name in list(kwargs) if name in names}
        with user_errors():
            options |= {name: parse(kwargs[name]) for name, parse in parsers.items()}
            for name in JSON_FIELDS:
                options[name] = parse_json_option(name, options[name])
            engine = EngineConfig(**{f.name: options.pop(f.name) for f in fields(EngineConfig)})
            run = RunConfig(**options, engine=engine)
            check_weight_choice(run.weights)
        if run.tensor_parallel_size > 1 and os.environ.get("RANK", "0") != "0":
            # one of torchrun's processes other than rank 0: it serves rank 0's steps instead of the command
            from rooftop.engine.distributed import launch_of
            from rooftop.engine.tp_worker import serve_rank

            with user_errors():
                launch = launch_of(run)
            raise typer.Exit(serve_rank(run, launch))
        return command(**kwargs, run=run)

    parameters = own + shared
    wrapper.__signature__ = inspect.Signature(parameters)
    wrapper.__annotations__ = {p.name: p.annotation for p in parameters}  # typer reads both
    return wrapper


def refuse_foreign(args: list[str], foreign: dict[tuple[str, ...], str], tool: str, command: str, params: list) -> None:
    """Another tool's option without a counterpart here, refused by name with what to use instead (click would
    have said "No such option", or read a multi-letter short option as letters). The value of one of the command's
    own options (`params`: `--stop -c`) is a value, and what follows `--` is arguments (a prompt "-c")."""
    valued = {name for p in params if p.param_type_name == "option" and not p.is_flag for name in p.opts}
    after_option = False
    for arg in args:
        if arg == "--":
            return
        name = arg.split("=", 1)[0]
        if not after_option:
            for names, instead in foreign.items():
                if name in names:
                    err.print(f"[bold red]error:[/] {tool}'s {name} has no counterpart in {command}: {instead}")
                    raise typer.Exit(1)
        after_option = not after_option and arg in valued


# llama.cpp's options (llama-bench's, llama-cli's, llama-server's) that rooftop has no counterpart for, or spells
# otherwise, with rooftop's way. Click would read "-ctk q8_0" as -c with "tk", and "-md FILE" as -m with "d".
LLAMA_CPP_COMMON = {
    ("-ngl", "--n-gpu-layers", "--gpu-layers"): "every layer runs on --device (cpu, or cuda for a GPU): there are no "
    "layers to offload",
    ("-fa", "--flash-attn"): "rooftop's attention is always its own fused kernel: there is nothing to switch",
    ("-ctk", "--cache-type-k", "-ctv", "--cache-type-v"): "--kv-cache-dtype sets K's and V's together (auto, float32, "
    "bfloat16, float16, int8 or fp8_e4m3)",
}
LLAMA_CPP_ONLY = LLAMA_CPP_COMMON | {
    ("-md", "--model-draft", "--draft-max", "--draft-min", "--draft"): "--speculative-config, vLLM's JSON: "
    """'{"method": "draft", "model": "FILE", "num_speculative_tokens": 4}'""",
    ("-c", "--ctx-size"): "--max-model-len",
    ("-np", "--parallel"): "--max-num-seqs",
    ("-b", "--batch-size", "-ub", "--ubatch-size"): "--max-num-batched-tokens (the tokens of one step)",
}


class LlamaCppOptions(typer.core.TyperCommand):
    """An engine command's arguments as llama.cpp users write them (LLAMA_CPP_ONLY refused by name)."""

    def parse_args(self, ctx, args: list[str]) -> list[str]:
        refuse_foreign(args, LLAMA_CPP_ONLY, "llama.cpp", f"rooftop {ctx.info_name}", self.params)
        return super().parse_args(ctx, args)
