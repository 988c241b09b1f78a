"""The two phases as two functions: `prefill` runs a whole prompt once, `decode` runs one token on the cache.

Both return float32 logits of the last position and the measured seconds, with the device synchronized
before each clock read so that asynchronous (CUDA) work is counted where it happens.
"""

from __future__ import annotations

import time

import torch

from rooftop.engine.kv_cache import KVCache
from rooftop.models.transformer import Transformer


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.inference_mode()
def prefill(model: Transformer, prompt_ids: list[int], cache: KVCache) -> tuple[torch.Tensor, float]:
    """All prompt tokens in one forward pass; K/V of every layer land in `cache`. Logits of the last token only."""
    synchronize(model.device)
    t0 = time.perf_counter()
    ids = torch.tensor(prompt_ids, dtype=torch.long, device=model.device)
    hidden = model.forward(ids, cache, start=0)
    logits = model.logits(hidden[-1:])[0]
    synchronize(model.device)
    return logits, time.perf_counter() - t0


@torch.inference_mode()
def decode(model: Transformer, token_id: int, position: int, cache: KVCache) -> tuple[torch.Tensor, float]:
    """One new token at `position`, attending to the `position` tokens already in `cache`."""
    synchronize(model.device)
    t0 = time.perf_counter()
    ids = torch.tensor([token_id], dtype=torch.long, device=model.device)
    hidden = model.forward(ids, cache, start=position)
    logits = model.logits(hidden)[0]
    synchronize(model.device)
    return logits, time.perf_counter() - t0
