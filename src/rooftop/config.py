"""ModelConfig: one description of a decoder-only transformer, whatever file or preset it came from.

The engine runs the dense architectures (Llama, Qwen2, Qwen3), Qwen3-MoE, and the hybrids Qwen3.5 and Qwen3-Next;
the roofline analyzer takes the same. Mixture-of-experts and hybrid models add the fields at the end.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from rooftop.errors import InvalidRequestError, UnsupportedModelError

RUNNABLE_ARCHITECTURES = ("llama", "qwen2", "qwen3", "qwen3_moe", "qwen3_5", "qwen3_next")
FULL_ATTENTION = "full_attention"
LINEAR_ATTENTION = "linear_attention"


@dataclass
class RopeScaling:
    """Llama-3 style frequency scaling (rope_type "llama3") or plain position interpolation ("linear")."""

    rope_type: str
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


@dataclass
class LinearAttention:
    """Gated DeltaNet layers (Qwen3-Next, Qwen3.5/3.6): a per-sequence recurrent state instead of a KV cache."""

    num_key_heads: int
    num_value_heads: int
    key_head_dim: int
    value_head_dim: int
    conv_kernel_dim: int = 4

    @property
    def state_elements(self) -> int:
        """Recurrent state per sequence and layer: one key_dim x value_dim matrix per value head."""
        return self.num_value_heads * self.key_head_dim * self.value_head_dim

    @property
    def conv_channels(self) -> int:
        return 2 * self.num_key_heads * self.key_head_dim + self.num_value_heads * self.value_head_dim


@dataclass
class ModelConfig:
    """Shapes and flags of the model. Llama, Qwen2 and Qwen3 differ only in the flags."""

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    rope_freq_factors: list[float] | None = None  # GGUF `rope_freqs`: per-pair divisors of the frequencies
    tie_word_embeddings: bool = False
    qk_norm: bool = False  # Qwen3: RMSNorm over head_dim on q and k before RoPE
    attention_bias: bool = False  # Qwen2: q/k/v projections carry a bias
    bos_token_id: int | None = None
    eos_token_ids: list[int] = field(default_factory=list)
    name: str = ""
    # mixture of experts: every layer's MLP is `num_experts` experts of `moe_intermediate_size`, top-k routed
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    norm_topk_prob: bool = False  # the top-k routing weights renormalized to sum to 1 (transformers' default: not)
    # hybrid models: layer_types[i] is "full_attention" or "linear_attention"; None means all full attention
    layer_types: list[str] | None = None
    linear_attention: LinearAttention | None = None
    attn_output_gate: bool = False  # gated full attention: q_proj also yields a sigmoid gate on the output
    partial_rotary_factor: float = 1.0  # RoPE turns the first head_dim * factor dims of q and k (Qwen3.5: 0.25)
    # what a config.json says its weights are stored in; the analyzer's default precision reads both
    # (roofline.precision.checkpoint_weights), the engine neither
    torch_dtype: str | None = None  # config.json's torch_dtype (transformers 5: dtype), e.g. "bfloat16"
    hidden_act: str = "silu"  # the MLP's gate activation (config.json's hidden_act): the engine runs silu
    mlp_bias: bool = False  # biases on the MLP's projections (Llama's mlp_bias): the engine's have none
    quantization_config: dict | None = None  # config.json's quantization_config as written (quant_method, bits, ...)

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim"):
            if getattr(self, name) <= 0:
                raise InvalidRequestError(f"{name} must be positive, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads:
            raise InvalidRequestError(
                f"query heads ({self.num_heads}) must be a multiple of KV heads ({self.num_kv_heads})"
            )
        if self.num_experts and not (
            0 < self.num_experts_per_tok <= self.num_experts and self.moe_intermediate_size > 0
        ):
            raise InvalidRequestError(
                f"{self.num_experts} experts need 1..{self.num_experts} per token and a positive moe_intermediate_size"
            )
        if self.layer_types is not None:
            if len(self.layer_types) != self.num_layers:
                raise InvalidRequestError(f"{len(self.layer_types)} layer types for {self.num_layers} layers")
            if not set(self.layer_types) <= {FULL_ATTENTION, LINEAR_ATTENTION}:
                raise InvalidRequestError(f"unknown layer types in {sorted(set(self.layer_types))}")
            if LINEAR_ATTENTION in self.layer_types and self.linear_attention is None:
                raise InvalidRequestError("linear-attention layers need the linear_attention shapes")

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def can_speculate(self) -> bool:
        """Whether rooftop's speculative decoding runs this model: it rolls rejected drafts back in the KV cache,
        and a hybrid's linear-attention layers keep a recurrent state that cannot be rolled back."""
        return not self.num_linear_attention_layers

    @property
    def can_split(self) -> bool:
        """Whether rooftop's tensor parallelism runs this model: dense Llama, Qwen2 and Qwen3 models for now (no
        mixture of experts, no linear-attention layers)."""
        return not self.is_moe and not self.num_linear_attention_layers

    @property
    def num_full_attention_layers(self) -> int:
        return self.num_layers if self.layer_types is None else self.layer_types.count(FULL_ATTENTION)

    @property
    def num_linear_attention_layers(self) -> int:
        return self.num_layers - self.num_full_attention_layers


def is_runnable(config: ModelConfig) -> bool:
    """The engine runs full-attention Llama / Qwen2 / Qwen3, Qwen3-MoE (routed experts, no shared expert), the dense
    hybrid Qwen3.5 (Gated DeltaNet and gated attention) and Qwen3-Next (that hybrid with routed and shared experts)."""
    if config.architecture not in RUNNABLE_ARCHITECTURES:
        return False
    if config.architecture in ("qwen3_5", "qwen3_next"):
        return config.is_moe == (config.architecture == "qwen3_next")
    if config.num_linear_attention_layers or config.shared_expert_intermediate_size:
        return False
    return config.is_moe == (config.architecture == "qwen3_moe")


def check_runnable(config: ModelConfig) -> None:
    """Refuse a model the engine would run as another: an architecture it does not run, or a config.json field that
    changes the math from what its layers compute (the analyzer, which costs shapes, takes them all)."""
    if not is_runnable(config):
        raise UnsupportedModelError(
            f"{config.architecture!r} models can be analyzed (`rooftop roofline`) but not run; "
            f"the engine runs {', '.join(RUNNABLE_ARCHITECTURES)}"
        )
    if config.hidden_act not in ("silu", "swish"):
        raise UnsupportedModelError(
            f"hidden_act {config.hidden_act!r} is not supported: the engine's MLP gates with silu (`rooftop "
            "roofline` analyzes the model)"
        )
    if config.mlp_bias:
        raise UnsupportedModelError(
            "mlp_bias true is not supported: the engine's MLP projections carry no biases (`rooftop roofline` "
            "analyzes the model)"
        )


SPECULATIVE_METHODS = ("ngram", "draft")


NGRAM_LOOKUP = 5  # vLLM's prompt_lookup_min and _max where neither is given


@dataclass(frozen=True)
class SpeculativeConfig:
    """Speculative decoding, as vLLM's --speculative-config: each decoding sequence proposes up to
    `num_speculative_tokens` draft tokens, and one verify step of the target model checks them all.
    `ngram` proposes the continuation of the latest earlier occurrence of the sequence's last n tokens
    (prompt_lookup_max >= n >= prompt_lookup_min) in its prompt and output; `draft` proposes greedily with a draft
    model: the file `model` (sharing the target's tokenizer and vocabulary), or, with `draft_layers` N (rooftop's
    own key; vLLM has none), a self-draft: the target's own first N layers, final norm and lm_head. vLLM's rule
    fills the lookup's bounds: one given sets the other, none gives 5 and 5."""

    method: str
    num_speculative_tokens: int
    prompt_lookup_max: int | None = None
    prompt_lookup_min: int | None = None
    model: str | None = None
    draft_layers: int | None = None  # method draft: the target's first N layers as the draft (a self-draft)

    def __post_init__(self) -> None:
        if self.method not in SPECULATIVE_METHODS:
            raise InvalidRequestError(
                f"speculative_config method must be one of {', '.join(SPECULATIVE_METHODS)}; got {self.method!r}",
                "speculative_config",
            )
        given = self.prompt_lookup_max or self.prompt_lookup_min or NGRAM_LOOKUP  # a frozen dataclass's own fill-in
        object.__setattr__(
            self, "prompt_lookup_max", given if self.prompt_lookup_max is None else self.prompt_lookup_max
        )
        object.__setattr__(
            self, "prompt_lookup_min", given if self.prompt_lookup_min is None else self.prompt_lookup_min
        )
        for name in ("num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise InvalidRequestError(
                    f"speculative_config {name} must be an integer >= 1, got {value!r}", "speculative_config"
                )
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise InvalidRequestError(
                f"speculative_config prompt_lookup_min ({self.prompt_lookup_min}) cannot exceed prompt_lookup_max "
                f"({self.prompt_lookup_max})",
                "speculative_config",
            )
        if self.draft_layers is not None and (
            not isinstance(self.draft_layers, int) or isinstance(self.draft_layers, bool) or self.draft_layers < 1
        ):
            raise InvalidRequestError(
                f"speculative_config draft_layers must be an integer >= 1, got {self.draft_layers!r}",
                "speculative_config",
            )
        if self.method == "draft" and (self.model is None) == (self.draft_layers is None):
            raise InvalidRequestError(
                "speculative_config method 'draft' takes exactly one of model (the draft model's file) and "
                f"draft_layers (a self-draft of the target's first N layers); got model {self.model!r}, "
                f"draft_layers {self.draft_layers!r}",
                "speculative_config",
            )
        if self.method != "draft" and (self.model is not None or self.draft_layers is not None):
            raise InvalidRequestError(
                f"speculative_config model and draft_layers go with method 'draft' only (method {self.method!r})",
                "speculative_config",
            )

    def to_dict(self) -> dict:
        """vLLM's JSON of this config: the keys its method takes (the filled-in lookup bounds are ngram's)."""
        keys = ("prompt_lookup_max", "prompt_lookup_min") if self.method == "ngram" else ("model", "draft_layers")
        taken = {key: getattr(self, key) for key in keys if getattr(self, key) is not None}
        return {"method": self.method, "num_speculative_tokens": self.num_speculative_tokens, **taken}

    def check_ranks(self, tensor_parallel_size: int) -> None:
        """A draft model runs on rank 0 alone: under tensor parallelism only ngram drafts."""
        if self.method == "draft" and tensor_parallel_size > 1:
            raise UnsupportedModelError(
                "speculative decoding with a draft model runs on one rank only for now: with tensor parallelism use "
                '{"method": "ngram", ...}'
            )

    @classmethod
    def from_dict(cls, options: dict) -> SpeculativeConfig:
        """From vLLM's JSON form; an unknown key is refused by name, never ignored."""
        if not isinstance(options, dict):
            raise InvalidRequestError(
                f"speculative_config is a JSON object, not {type(options).__name__}", "speculative_config"
            )
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise InvalidRequestError(
                f"unknown speculative_config keys {unknown}; known: {', '.join(sorted(known))}", "speculative_config"
            )
        missing = [name for name in ("method", "num_speculative_tokens") if name not in vllm_method(options)]
        if missing:
            raise InvalidRequestError(f"speculative_config needs {' and '.join(missing)}", "speculative_config")
        return cls(**vllm_method(options))


def vllm_method(options: dict) -> dict:
    """vLLM's other spellings of a method, as rooftop's: "draft_model" is "draft", and without a method a `model`
    names it ("ngram" or "[ngram]", vLLM's older form, for ngram; any other, a draft model's path)."""
    method, model = options.get("method"), options.get("model")
    if method == "draft_model":
        return options | {"method": "draft"}
    if method is None and model in ("ngram", "[ngram]"):
        return {k: v for k, v in options.items() if k != "model"} | {"method": "ngram"}
    if method is None and model is not None:
        return options | {"method": "draft"}
    return options


@dataclass
class EngineConfig:
    """How the engine batches: sequences and tokens per step, the KV pool's size, prefix caching (vLLM's names)."""

    max_num_seqs: int = 64
    max_num_batched_tokens: int = 1024
    block_size: int = 16
    kv_cache_bytes: int | None = None  # default: DEFAULT_KV_CACHE_BYTES
    num_kv_blocks: int | None = None  # overrides kv_cache_bytes
    enable_prefix_caching: bool = True
    max_model_len: int | None = None  # default: the model's context length
    batch_invariant: bool = True  # a request's outputs do not depend on what shares its steps
    chunked_prefill_size: int | None = None  # default: DEFAULT_CHUNK tokens, at most max_num_batched_tokens
    speculative_config: SpeculativeConfig | None = None  # also given as vLLM's dict; None: no speculation
    kv_cache_dtype: str = "auto"  # vLLM's name: auto (the model's dtype), a float dtype, int8 or fp8_e4m3 (alias fp8)
    enforce_eager: bool = False  # vLLM's name: CUDA runs every decode step op by op instead of replaying a graph
    cuda_graph_sizes: list[int] | None = None  # vLLM's: the decode batch sizes captured (engine/cuda_graph.py)

    def __post_init__(self) -> None:
        self.kv_cache_dtype = canonical_kv_cache_dtype(self.kv_cache_dtype)
        if isinstance(self.speculative_config, dict):
            self.speculative_config = SpeculativeConfig.from_dict(self.speculative_config)
        elif self.speculative_config is not None and not isinstance(self.speculative_config, SpeculativeConfig):
            raise InvalidRequestError(
                f"speculative_config is a dict of vLLM's keys, not {type(self.speculative_config).__name__}",
                "speculative_config",
            )
        for name in ("max_num_seqs", "max_num_batched_tokens", "block_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise InvalidRequestError(f"{name} must be an integer >= 1, got {value!r}", name)
        for name in ("enable_prefix_caching", "batch_invariant", "enforce_eager"):
            if not isinstance(getattr(self, name), bool):
                raise InvalidRequestError(f"{name} must be true or false, got {getattr(self, name)!r}", name)
        if self.cuda_graph_sizes is not None and (
            not isinstance(self.cuda_graph_sizes, list | tuple)
            or not self.cuda_graph_sizes
            or any(not isinstance(n, int) or n < 1 for n in self.cuda_graph_sizes)
        ):
            raise InvalidRequestError(
                f"cuda_graph_sizes must be a list of integers >= 1, got {self.cuda_graph_sizes!r}", "cuda_graph_sizes"
            )
        for name in ("kv_cache_bytes", "num_kv_blocks", "max_model_len", "chunked_prefill_size"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise InvalidRequestError(f"{name} must be an integer >= 1, got {value!r}", name)
        if self.chunked_prefill_size is not None and self.chunked_prefill_size > self.max_num_batched_tokens:
            raise InvalidRequestError(
                f"chunked_prefill_size ({self.chunked_prefill_size}) cannot exceed max_num_batched_tokens "
                f"({self.max_num_batched_tokens}): a chunk runs in one step"
            )

    @property
    def chunk_size(self) -> int:
        """The most prompt tokens of one sequence computed in one step. With batch invariance a sequence's chunks
        start at multiples of it, wherever the step's token budget stands (a chunk waits for a step it fits in)."""
        if self.chunked_prefill_size is not None:
            return self.chunked_prefill_size
        if not self.batch_invariant:
            return self.max_num_batched_tokens
        chunk = min(DEFAULT_CHUNK, self.max_num_batched_tokens)
        return chunk // self.block_size * self.block_size or chunk  # whole blocks, where the budget holds one


DEFAULT_KV_CACHE_BYTES = 1 << 30
DEFAULT_CHUNK = 256  # batch-invariant prefill chunks (and prefix-cache reuse) in tokens; docs/PERFORMANCE.md
KV_CACHE_DTYPES = ("auto", "float32", "bfloat16", "float16", "int8", "fp8_e4m3")  # vLLM's --kv-cache-dtype names
KV_CACHE_DTYPE_ALIASES = {"fp8": "fp8_e4m3"}  # vLLM's "fp8" is e4m3 on its CUDA backends
KV_CACHE_DTYPES_REFUSED = {"fp8_e5m2": "rooftop's pool stores fp8 as e4m3 only (kv_cache_dtype fp8 or fp8_e4m3)"}
DTYPES = ("auto", "float32", "bfloat16", "float16")  # auto: `auto_dtype`


def canonical_kv_cache_dtype(name: str) -> str:
    """A --kv-cache-dtype value as the engine names it (vLLM's alias "fp8" is "fp8_e4m3"); one rooftop does not
    store is refused, saying why or naming the valid ones."""
    if isinstance(name, str) and name in KV_CACHE_DTYPES_REFUSED:
        raise InvalidRequestError(
            f"kv_cache_dtype {name} is not supported: {KV_CACHE_DTYPES_REFUSED[name]}", "kv_cache_dtype"
        )
    name = KV_CACHE_DTYPE_ALIASES.get(name, name) if isinstance(name, str) else name
    if name not in KV_CACHE_DTYPES:
        raise InvalidRequestError(
            f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)} (fp8: fp8_e4m3), got {name!r}",
            "kv_cache_dtype",
        )
    return name


def auto_dtype(device_type: str) -> str:
    """What --dtype auto runs a model in on a device type ("cpu", "cuda"): float32 on the CPU (the reference
    precision), bfloat16 on an accelerator. The engine, its probe and the analyzer's `-H this` all ask here."""
    return "float32" if device_type == "cpu" else "bfloat16"


LOAD_FORMATS = ("auto", "dummy")  # vLLM's --load-format values: read the file's weights, or make seeded random ones


# The longest wait on the other ranks: the clocks' arithmetic (timedelta, a deadline's timestamp) overflows near
# 1e12 s, and no collective takes a week.
MAX_TIMEOUT_S = 7 * 24 * 3600


@dataclass
class RunConfig:
    """What runs and how: the model, its compute dtype, device and weight format, and the engine's batching.
    One value shared by `LLM`, every CLI command that starts an engine, and the server."""

    model: str | None = None  # GGUF file or Hugging Face directory (dummy: also a preset or config.json); None: bundled
    dtype: str = "auto"
    device: str = "cpu"
    weights: str = "auto"  # one of roofline.precision.WEIGHT_CHOICES (checked where the model is built)
    threads: int | None = None  # CPU threads for the model's ops (llama.cpp's --threads); None: the cores we may use
    load_format: str = "auto"  # one of LOAD_FORMATS
    dummy_seed: int = 0  # the seed of dummy weights: the same seed, the same weights
    tensor_parallel_size: int = 1  # vLLM's name: ranks the model is split over (processes, GPUs or hosts)
    distributed_timeout_s: float = 60.0  # how long a rank waits on the others before the run stops with an error
    engine: EngineConfig = field(default_factory=EngineConfig)

    def __post_init__(self) -> None:
        if self.model is not None:
            self.model = str(self.model)
        if self.dtype not in DTYPES:
            raise InvalidRequestError(f"dtype must be one of {', '.join(DTYPES)}; got {self.dtype!r}")
        if self.load_format not in LOAD_FORMATS:
            gguf = " (a GGUF reads with auto)" if self.load_format == "gguf" else ""
            raise InvalidRequestError(
                f"load_format (--load-format) must be one of {', '.join(LOAD_FORMATS)}; got {self.load_format!r}{gguf}",
                "load_format",
            )
        if not isinstance(self.dummy_seed, int) or self.dummy_seed < 0:
            raise InvalidRequestError(
                f"dummy_seed (--dummy-seed) must be an integer >= 0, got {self.dummy_seed!r}", "dummy_seed"
            )
        if self.dummy_seed and self.load_format != "dummy":
            raise InvalidRequestError(
                f"dummy_seed (--dummy-seed) {self.dummy_seed} seeds load_format 'dummy' (--load-format dummy) only; "
                f"with {self.load_format!r} the weights are the file's",
                "dummy_seed",
            )
        if self.threads is not None and (not isinstance(self.threads, int) or self.threads < 1):
            raise InvalidRequestError(f"threads must be an integer >= 1, got {self.threads!r}", "threads")
        if not isinstance(self.tensor_parallel_size, int) or self.tensor_parallel_size < 1:
            raise InvalidRequestError(
                f"tensor_parallel_size must be an integer >= 1, got {self.tensor_parallel_size!r}",
                "tensor_parallel_size",
            )
        if self.engine.speculative_config is not None:  # before any weights load
            self.engine.speculative_config.check_ranks(self.tensor_parallel_size)
        timeout = self.distributed_timeout_s
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 0 < timeout <= MAX_TIMEOUT_S:
            raise InvalidRequestError(
                f"distributed_timeout_s (--distributed-timeout) must be a number of seconds > 0 and at most "
                f"{MAX_TIMEOUT_S} (a week), got {timeout!r}",
                "distributed_timeout_s",
            )
        if not isinstance(self.device, str) or not self.device:
            raise InvalidRequestError(
                f"device must be a torch device name (cpu, cuda, cuda:1 ...); got {self.device!r}"
            )
        if self.engine.cuda_graph_sizes is not None and not self.device.startswith("cuda"):
            raise InvalidRequestError(
                f"cuda_graph_sizes: the decode batch sizes captured as CUDA graphs, and {self.device} captures none "
                "(every step runs op by op there); drop it or run on cuda",
                "cuda_graph_sizes",
            )
