"""Rotary position embeddings in Hugging Face's layout (rotate halves), with Llama-3 and linear scaling."""

from __future__ import annotations

import math

import torch

from rooftop.config import ModelConfig


def inv_frequencies(config: ModelConfig) -> torch.Tensor:
    """Per-pair rotation frequencies (rotary_dim / 2,), float32, computed the way transformers does (rotary_dim is
    head_dim but for partial rotary embeddings, Qwen3.5's)."""
    dim = config.rotary_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    if config.rope_freq_factors is not None:
        return inv_freq / torch.tensor(config.rope_freq_factors, dtype=torch.float32)
    s = config.rope_scaling
    if s is None:
        return inv_freq
    if s.rope_type == "linear":
        return inv_freq / s.factor
    # Llama 3: long wavelengths slowed by `factor`, short ones kept, the band between interpolated.
    low_wavelen = s.original_max_position_embeddings / s.low_freq_factor
    high_wavelen = s.original_max_position_embeddings / s.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / s.factor, inv_freq)
    smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) / (
        s.high_freq_factor - s.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, smoothed, scaled)


def cos_sin_table(
    config: ModelConfig, max_positions: int, dtype: torch.dtype, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and signed sin for positions 0..max_positions-1, each (max_positions, rotary_dim): float32 math, then
    `dtype`. The sin table's first half is negated, so that rotating halves needs no negation per step."""
    positions = torch.arange(max_positions, dtype=torch.float32)
    freqs = torch.outer(positions, inv_frequencies(config))
    cos = torch.cat([freqs, freqs], dim=-1).cos()
    signed_sin = torch.cat([-freqs.sin(), freqs.sin()], dim=-1)
    return cos.to(device, dtype), signed_sin.to(device, dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """x: (T, heads, head_dim); cos/signed_sin: (T, 1, head_dim) gathered at the tokens' positions.
    Hugging Face's x·cos + rotate_half(x)·sin, where rotate_half(x) = (-x2, x1) = roll(x, half)·(-1, 1)."""
    return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, dims=-1), signed_sin)
