"""Tensor parallelism inside the model: the ranks' collectives and the layers that call them.

A layer's column-parallel linears (fused QKV, gate/up) give each rank its own heads and intermediate columns and
need no communication; a row-parallel linear (o, down) leaves each rank a partial sum over its slice of the input,
which one all-reduce adds up; the vocab-parallel embedding looks up the rank's rows of the vocabulary and
all-reduces, and the vocab-parallel lm_head's logits are gathered on rank 0, which samples. Which rows and columns a
rank holds is the loader's business (models/loader.py); the collectives are torch.distributed's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol

import torch
import torch.distributed as dist
import torch.nn.functional as F

from rooftop.config import ModelConfig
from rooftop.errors import InvalidRequestError, UnsupportedModelError
from rooftop.quant.linear import NARROW, Linear, RowPlan
from rooftop.quant.weights import Weight
from rooftop.roofline.ops import tp_sizes


class Lead(Protocol):
    """Rank 0's side of the group (rooftop.engine.distributed.Lead): runs a piece of work on every rank at once."""

    def run(self, message: tuple, work: Callable[[], Any] | None = None) -> Any:
        """Send `message` to the other ranks, which do their part of it, and do `work` here meanwhile."""
        ...


@dataclass
class TPGroup:
    """This process's place in the tensor-parallel group: its rank among `size` (the forward pass's collectives run on
    torch.distributed's default group, the device's backend), and on rank 0 the `lead` that sends each step to the
    others. `ordered`: a reduction adds the ranks' partial sums in rank order whatever the message's length (batch
    invariance; each step's plan sets it on every rank)."""

    rank: int
    size: int
    ordered: bool = True
    lead: Lead | None = None

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The sum of every rank's `x`, the same bits on every rank. At two ranks each element is one addition,
        which is commutative, so torch's all-reduce gives the same sum whatever the message; at three or more a
        ring adds an element's partial sums in an order set by the chunk it falls in, which moves with the message's
        length: `ordered` gathers them instead and adds them in rank order, so a row's sum never depends on what
        else the step holds."""
        x = x.contiguous()
        if not self.ordered or self.size == 2:
            dist.all_reduce(x)
            return x
        parts = [torch.empty_like(x) for _ in range(self.size)]
        dist.all_gather(parts, x)
        total = parts[0]
        for part in parts[1:]:
            total += part
        return total

    def gather(self, x: torch.Tensor) -> torch.Tensor | None:
        """Every rank's `x` (same shape) concatenated along the last dimension on rank 0; None on the others."""
        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(self.size)] if self.rank == 0 else None
        dist.gather(x, parts, dst=0)
        return torch.cat(parts, dim=-1) if parts is not None else None


def split(n: int, rank: int, size: int) -> tuple[int, int]:
    """Rank `rank`'s part [start, stop) of n items split evenly `size` ways (the caller has checked n % size)."""
    return rank * n // size, (rank + 1) * n // size


def vocab_rows(vocab: int, rank: int, size: int) -> tuple[int, int]:
    """Rank `rank`'s rows of the vocabulary: ceil(vocab / size) each, the last rank's fewer, so that every rank's
    logits have one width for the gather."""
    per = -(-vocab // size)
    return min(vocab, rank * per), min(vocab, (rank + 1) * per)


def kv_head_rows(config: ModelConfig, rank: int, size: int) -> tuple[int, int]:
    """The rows of K (or V) rank `rank` holds: its share of the KV heads, or, with fewer KV heads than ranks, the one
    KV head its query heads read (replicated on size / kv_heads ranks)."""
    c = config
    if c.num_kv_heads % size == 0:
        return split(c.kv_size, rank, size)
    head = rank * c.num_kv_heads // size
    return head * c.head_dim, (head + 1) * c.head_dim


def rank_config(config: ModelConfig, size: int) -> ModelConfig:
    """The shapes one rank computes: its query heads, its KV heads (one where they are replicated) and its part of
    the MLP; the vocabulary and the hidden size stay the model's."""
    if size == 1:
        return config
    return replace(
        config,
        num_heads=config.num_heads // size,
        num_kv_heads=max(1, config.num_kv_heads // size),
        intermediate_size=config.intermediate_size // size,
    )


@dataclass
class RowParallel:
    """A row-parallel linear: this rank's slice of the input features; the ranks' partial outputs all-reduced, then
    the bias (once) and the residual added."""

    linear: Linear
    tp: TPGroup
    bias: torch.Tensor | None = None

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None = None, plan: RowPlan = NARROW) -> torch.Tensor:
        y = self.tp.all_reduce(self.linear(x, plan=plan))
        if self.bias is not None:
            y = y + self.bias.to(y.dtype)
        return y if residual is None else y.add_(residual)

    @property
    def format(self) -> str:
        return self.linear.format

    @property
    def widen_rows(self) -> int | None:
        return self.linear.widen_rows

    @property
    def nbytes(self) -> int:
        return self.linear.nbytes

    @property
    def parts(self) -> list:
        return getattr(self.linear, "parts", [self.linear])


@dataclass
class VocabParallelEmbedding:
    """Rows start:stop of the embedding table (float, or a file's quantized groups); a token outside them looks up
    zeros here and its row on the rank that holds it; one all-reduce adds them up."""

    table: Weight
    start: int
    stop: int
    tp: TPGroup

    def __call__(self, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        mine = (ids >= self.start) & (ids < self.stop)
        local = torch.where(mine, ids - self.start, 0)
        if isinstance(self.table, torch.Tensor):
            rows = F.embedding(local, self.table).to(dtype)
        else:
            rows = self.table.lookup(local).to(dtype)
        return self.tp.all_reduce(torch.where(mine[:, None], rows, 0))


@dataclass
class VocabParallelHead:
    """The lm_head's rows start:stop of the vocabulary on this rank; the logits of every rank gathered on rank 0 (the
    one that samples), padded to one width per rank and cut back to the vocabulary. Other ranks get None."""

    linear: Linear
    width: int  # ceil(vocab / ranks): every rank's logits are padded to it for the gather
    vocab: int
    tp: TPGroup

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None = None, plan: RowPlan = NARROW):
        local = self.linear(x, plan=plan).float()
        local = F.pad(local, (0, self.width - local.shape[-1]))
        logits = self.tp.gather(local)
        return None if logits is None else logits[..., : self.vocab]

    @property
    def format(self) -> str:
        return self.linear.format

    @property
    def nbytes(self) -> int:
        return self.linear.nbytes


def check_tensor_parallel(config: ModelConfig, size: int) -> None:
    """Refuse, naming why and the sizes that work, a model the engine cannot split `size` ways."""
    c = config
    if not c.can_split:
        kind = "a mixture of experts" if c.is_moe else "a hybrid (Gated DeltaNet) model"
        raise UnsupportedModelError(
            f"tensor parallelism runs dense Llama, Qwen2 and Qwen3 models for now; {c.architecture} is {kind}: "
            "run it with tensor_parallel_size 1"
        )
    if size not in tp_sizes(c):
        raise InvalidRequestError(
            f"tensor_parallel_size {size} does not split {c.name or c.architecture}: its {c.num_heads} query heads, "
            f"{c.num_kv_heads} KV heads and {c.intermediate_size} intermediate features must divide evenly (KV "
            f"heads may also be replicated on size / KV heads ranks); valid sizes: "
            f"{', '.join(map(str, tp_sizes(c)))}",
            "tensor_parallel_size",
        )
