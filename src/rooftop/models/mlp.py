"""The MLP half of a decoder layer: dense SwiGLU, or a mixture of experts (Qwen3-MoE) whose float router picks each
token's top-k experts, each expert running once per step on the rows routed to it, not a dense loop of every
expert over every token.

Decode at batch 1 so reads only k experts' weights per layer; a large batch touches most of them
(roofline.ops.expected_experts_touched). Each step counts the experts it touched, for the report beside that
expectation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from rooftop.kernels import cpu
from rooftop.models.ops import KernelOps, Ops, rowwise
from rooftop.quant.linear import NARROW, WIDEN_ROWS, FloatLinear, Linear, RouterLinear, RowPlan


@dataclass
class DenseMLP:
    """Fused SwiGLU: gate and up in one matmul, the residual (if any) added in the down projection's store. Also
    each expert of a SparseMoE."""

    gate_up: Linear  # hidden -> 2 * intermediate
    down: Linear

    def __call__(self, h: torch.Tensor, ops: Ops, plan: RowPlan, residual: torch.Tensor | None) -> torch.Tensor:
        return self.down(ops.silu_mul(self.gate_up(h, plan=plan)), residual=residual, plan=plan)

    def linears(self) -> list[Linear]:
        return [self.gate_up, self.down]


@dataclass
class Routing:
    """Each row's experts (T, k) and their weights (T, k), as transformers' Qwen3MoeTopKRouter computes them."""

    experts: torch.Tensor
    weights: torch.Tensor


def route(
    x: torch.Tensor, router: RouterLinear | FloatLinear, top_k: int, normalize: bool, plan: RowPlan = NARROW
) -> Routing:
    """Softmax over the router's float32 logits, the top k, renormalized to sum to 1 when `normalize`
    (norm_topk_prob). The logits go by the step's plan like any float linear: a row's do not depend on its
    neighbours, so neither do its experts. On the CPU rooftop's kernel takes the three steps in one pass a row
    (`route_rows`, as a decode step run in one call does), elsewhere PyTorch's ops."""
    logits = router(x.float(), plan=plan)
    kernels = cpu.ops() if logits.device.type == "cpu" else None
    if kernels is not None:
        weights, experts = kernels.route_rows(logits, top_k, normalize)
        return Routing(experts, weights)
    weights, experts = torch.topk(torch.softmax(logits, dim=-1), top_k, dim=-1)
    if normalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return Routing(experts, weights)


def expert_plan(plan: RowPlan, rows: torch.Tensor) -> tuple[torch.Tensor, RowPlan]:
    """How one expert runs the step's rows routed to it (ascending): an order of them (positions into `rows`) and
    a plan as if they were a step of their own. Each widened group of the step (a prefill chunk) keeps its routed
    rows together and widens them if there are WIDEN_ROWS of them; the other rows follow on the narrow path. A
    row's path so depends only on its own chunk (batch invariance)."""
    wide, narrow, groups, start = [], [], [], 0
    for n in plan.widen:
        inside = ((rows >= start) & (rows < start + n)).nonzero()[:, 0]
        if len(inside) >= WIDEN_ROWS:
            wide.append(inside)
            groups.append(len(inside))
        else:
            narrow.append(inside)
        start += n
    narrow.append((rows >= start).nonzero()[:, 0])
    return torch.cat(wide + narrow), RowPlan(tuple(groups), plan.min_rows)


@dataclass
class SparseMoE:
    """The MLP half of a Qwen3-MoE or Qwen3-Next layer: the router (hidden -> num_experts) in float32 and the
    experts' linears in the model's weight format. `touched`: how many distinct experts the last call ran (the
    engine's step record)."""

    router: RouterLinear | FloatLinear
    experts: list[DenseMLP]
    top_k: int
    normalize: bool
    shared: DenseMLP | None = None  # Qwen3-Next: an expert every token takes, scaled by sigmoid(shared_gate(x))
    shared_gate: RouterLinear | FloatLinear | None = None  # hidden -> 1
    touched: int = 0
    row: Any = None  # the kernels' RowExperts where every expert runs on them (models/decode_call.py's row_experts)

    def __call__(self, x: torch.Tensor, ops: Ops, plan: RowPlan, residual: torch.Tensor) -> torch.Tensor:
        """residual + the experts' weighted sum for rows x (T, hidden), each expert on its own rows: in one call to
        the kernels where they hold the experts (`row`) and no row widens, else from Python."""
        routing = route(x, self.router, self.top_k, self.normalize, plan)
        if self.row is not None and isinstance(ops, KernelOps) and not plan.widen:
            out, self.touched = ops.experts_rows(self.row, x, routing.experts, routing.weights)
        elif len(x) == 1 and not plan.widen:
            out = self._one_row(x, routing, ops, plan)
        else:
            out = self._by_expert(x, routing, ops, plan)
        if self.shared is not None:
            gate = rowwise(torch.sigmoid, self.shared_gate(x.float(), plan=plan))
            out = out + gate.to(x.dtype) * self.shared(x, ops, plan, residual=None)
        return residual + out  # as transformers adds them: the experts' sum first

    def _one_row(self, x: torch.Tensor, routing: Routing, ops: Ops, plan: RowPlan) -> torch.Tensor:
        """One token (a decode at batch 1): its k experts straight on it, in ascending expert order as
        `_by_expert` adds them, so the same sum bit for bit without regrouping rows (which cost a 1B-class MoE
        layer more host time than its experts' reads, docs/PERFORMANCE.md)."""
        experts = routing.experts[0].tolist()
        self.touched = self.top_k
        out = torch.zeros_like(x)
        for slot in sorted(range(self.top_k), key=experts.__getitem__):
            y = self.experts[experts[slot]](x, ops, plan, residual=None)
            out += y * routing.weights[0, slot].to(y.dtype)
        return out

    def _by_expert(self, x: torch.Tensor, routing: Routing, ops: Ops, plan: RowPlan) -> torch.Tensor:
        """Each expert once on the rows routed to it (its weights read once a step), its weighted output added
        into those rows."""
        flat = routing.experts.reshape(-1)
        pairs_by_expert = torch.argsort(flat, stable=True)  # (row, slot) pairs grouped by expert, rows ascending
        counts = torch.bincount(flat, minlength=len(self.experts)).tolist()
        out = torch.zeros_like(x)
        start = 0
        for e, count in enumerate(counts):
            if not count:
                continue
            pairs = pairs_by_expert[start : start + count]
            start += count
            sub_plan = plan
            if plan.widen:  # a step of decodes and short chunks keeps its rows in order, all narrow
                order, sub_plan = expert_plan(plan, pairs // self.top_k)
                pairs = pairs[order]
            rows, weights = pairs // self.top_k, routing.weights.reshape(-1)[pairs]
            y = self.experts[e](x[rows], ops, sub_plan, residual=None)
            out.index_add_(0, rows, y * weights[:, None].to(y.dtype))
        self.touched = sum(1 for c in counts if c)
        return out

    def linears(self) -> list[Linear]:
        shared = self.shared.linears() if self.shared else []
        return [linear for expert in self.experts for linear in expert.linears()] + shared
