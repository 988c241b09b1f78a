"""ModelConfig: one description of a decoder-only transformer, whatever file it came from."""

from __future__ import annotations

from dataclasses import dataclass, field

SUPPORTED_ARCHITECTURES = ("llama", "qwen2", "qwen3")


@dataclass
class RopeScaling:
    """Llama-3 style frequency scaling (rope_type "llama3") or plain position interpolation ("linear")."""

    rope_type: str
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


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
    bos_token_id: int | None = None
    eos_token_ids: list[int] = field(default_factory=list)
    name: str = ""

    def __post_init__(self) -> None:
        assert self.architecture in SUPPORTED_ARCHITECTURES, self.architecture
        assert self.num_heads % self.num_kv_heads == 0, "query heads must be a multiple of KV heads"
        assert self.head_dim > 0 and self.hidden_size > 0 and self.num_layers > 0

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim
