"""A step's row plan: which of its rows take which path through a linear, shared by every linear class (the CPU's
and CUDA's), so that one plan decides the path of a row whatever format its weights are in."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

# Prefill is matrix-matrix work: from this many rows on, widening the weights to float32 one linear at a time and
# running MKL's sgemm beats the weight-only kernels, which compute in emulated bfloat16 on CPUs without it
# (measured on the bundled model, docs/PERFORMANCE.md). Decode steps (one row per sequence) stay quantized. CUDA's
# weight-only kernels keep 16 to 64 rows per tile (tinygemm 16), re-reading the weights for every tile of a long
# chunk, so there too a prefill chunk widens to one cuBLAS matmul; whether 96 is the crossover on a GPU is one of the
# numbers benchmarks/gpu_check.py measures (quant/cuda_linear.py).
WIDEN_ROWS = 96


@dataclass(frozen=True)
class RowPlan:
    """Which path each of a step's rows takes through a linear. The leading `widen` groups (prefill chunks, in row
    order) each run as one float matmul of their own: a quantized linear widens its weights once for all of them.
    The rows after them run together on the narrow path: the quantized kernel (int8 activations, one row at a
    time, so a row's result never depends on its neighbours), or for float weights one matmul padded to a multiple
    of `min_rows` rows, the BLAS library's row tile, in which a row's result no longer depends on its neighbours
    (`float_min_rows`). With batch invariance the groups are the sequences' own chunks (`row_plan`)."""

    widen: tuple[int, ...] = ()
    min_rows: int = 1


def by_plan(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    plan: RowPlan,
    wide: Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor],
    narrow: Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor],
) -> torch.Tensor:
    """A linear over rows (T, K) by `plan`: each widened group through `wide`, the rest through `narrow`."""
    if not plan.widen:
        return narrow(x, residual)
    parts, start = [], 0
    for n in plan.widen:
        parts.append(wide(x[start : start + n], None if residual is None else residual[start : start + n]))
        start += n
    if start < x.shape[0]:
        parts.append(narrow(x[start:], None if residual is None else residual[start:]))
    return parts[0] if len(parts) == 1 else torch.cat(parts)


NARROW = RowPlan()  # every row on the narrow path: decodes, logits, a linear called on its own


def with_residual(y: torch.Tensor, residual: torch.Tensor | None) -> torch.Tensor:
    """Every linear takes an optional residual to add to its output: rooftop's kernels fold it into their store."""
    return y if residual is None else y.add_(residual)
