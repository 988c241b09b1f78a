"""A step of decodes through a model's decoder layers in one call to rooftop's CPU kernels (kernels/decode.cpp).

Layer by layer, a decode step is some ten kernel calls a layer from Python (a mixture of experts' layer twice that,
with its routing's), and between them the interpreter's code and objects come back from memory cold: each linear's
weights have just streamed through the caches. Where every layer is the decoder block or a hybrid's (Qwen3.5's gated
attention and Gated DeltaNet) on the CPU kernels (`KernelOps`), its MLP half dense or a mixture of experts (Qwen3-MoE's,
Qwen3-Next's with its shared expert), and every linear runs in tiles (a GGUF's block formats, `--weights int8` or
`int4`) or in bfloat16 on rooftop's kernel (a bf16 checkpoint under `auto`), a step whose rows are all decodes runs
the same kernels and PyTorch ops in the same order with the same arguments from one C++ call, so each row's result
is the same bits either way (docs/PERFORMANCE.md has what it saves). Other models, prefill chunks and widened rows go
layer by layer. The calibration's op timer reads each op's time from the call's own clocks (`seconds`). An MoE
layer's experts are held the same way (`row_experts`), also for the rows of a step that goes layer by layer (a
prefill's short chunks beside decodes), in one call a layer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from rooftop.models.blocks import DecoderBlock
from rooftop.models.hybrid import DeltaNetBlock, GatedAttentionBlock
from rooftop.models.kv_cache import AttentionMetadata, KVPool
from rooftop.models.mlp import DenseMLP, SparseMoE
from rooftop.models.ops import KernelOps, Ops
from rooftop.quant.linear import Bf16Linear, ConcatLinear, RouterLinear, TiledLinear
from rooftop.quant.rows import RowPlan


@dataclass
class DecodeCall:
    """The model's layers as the kernels hold them, the op backend they were taken from (a model given other ops
    afterwards goes layer by layer), its MoE layers (each told after a step how many experts it touched), and while
    the calibration's op timer is installed the clocks it reads."""

    layers: Any  # the kernels' DecodeLayers
    ops: KernelOps
    moe: dict[int, SparseMoE]  # layer index -> its mixture of experts
    touched: torch.Tensor  # int64 per layer: the distinct experts each MoE layer ran in the last step
    seconds: torch.Tensor | None = None  # float64 (3,): where the kernels add each op's time, while timed

    def runs(self, ops: Ops, meta: AttentionMetadata, plan: RowPlan) -> bool:
        """A step it takes: decodes only, none widened, on the ops it was built from."""
        return ops is self.ops and not meta.prefills and meta.has_decodes and not plan.widen

    def __call__(self, x: torch.Tensor, positions: torch.Tensor, pool: KVPool, meta: AttentionMetadata) -> torch.Tensor:
        """The final norm's hidden states of the step's rows (x: their embeddings); their K/V go into `pool`, a
        hybrid's states into its state pool."""
        k_values, v_values, k_scales, v_scales = pool.kernel_layers
        states = pool.states
        hidden = self.layers.run(
            x,
            positions,
            meta.slot_mapping,
            meta.decode_tables,
            meta.decode_lengths,
            meta.block_size,
            k_values,
            v_values,
            k_scales,
            v_scales,
            self.seconds,
            self.touched if self.moe else None,
            None if states is None else states.conv,
            None if states is None else states.recurrent,
            None if states is None else meta.decode_state_slots,
        )
        if self.moe:
            counts = self.touched.tolist()
            for index, moe in self.moe.items():
                moe.touched = counts[index]
        return hidden


def kernel_part(linear: TiledLinear | Bf16Linear) -> tuple:
    """A linear as kernels/decode.cpp's LinearPart: tiled, or bfloat16 (no dm, format -1)."""
    if isinstance(linear, Bf16Linear):
        return linear.weight, None, -1, linear.weight.shape[0], linear.bias
    return linear.q, linear.dm, linear.kernel_format, linear.out_features, linear.bias


def row_experts(moe: SparseMoE, ops: Ops, split: bool) -> Any:
    """An MoE layer's experts as the kernels' RowExperts, for rows' experts in one call, or None: a model
    split over ranks, off the CPU kernels, or with an expert's linear in neither tiles nor bfloat16."""
    if split or not isinstance(ops, KernelOps):
        return None
    parts = [[lin.parts if isinstance(lin, ConcatLinear) else [lin] for lin in e.linears()] for e in moe.experts]
    if not all(isinstance(part, TiledLinear | Bf16Linear) for each in parts for lin in each for part in lin):
        return None
    gate_ups, downs = ([[kernel_part(part) for part in each[i]] for each in parts] for i in (0, 1))
    return ops.kernels.RowExperts(gate_ups, downs)


def in_one_call(mlp: DenseMLP | SparseMoE) -> bool:
    """Whether the one call runs this MLP half: dense, or a mixture of experts whose experts are held for the kernels
    (`row_experts`) and whose router (and Qwen3-Next's shared expert's gate) runs on them."""
    if type(mlp) is DenseMLP:
        return True
    routers_on_kernels = type(mlp.router) is RouterLinear and (not mlp.shared or type(mlp.shared_gate) is RouterLinear)
    return isinstance(mlp, SparseMoE) and mlp.row is not None and routers_on_kernels


def decode_call(layers: list, norm: torch.Tensor, ops: Ops, split: bool) -> DecodeCall | None:
    """The one call for these layers, or None where a step goes layer by layer: a model split over ranks (`split`),
    off the CPU kernels, with an MLP half the call does not run (`in_one_call`), or a linear that runs neither in
    tiles nor in bfloat16 on rooftop's kernel, alone or as a part of a fused projection (float32 weights). Its layers
    are decoder blocks, or a hybrid's gated attention and Gated DeltaNet blocks. An MoE model's experts must be held
    first (`row_experts`)."""
    if split or not isinstance(ops, KernelOps):
        return None
    if not all(type(layer) in LAYERS and in_one_call(layer.mlp) for layer in layers):
        return None
    parts = []  # per layer: qkv, o, gate_up, down, each a list of parts (an MoE layer's last two: its shared expert's)
    for layer in layers:
        dense = layer.mlp if type(layer.mlp) is DenseMLP else layer.mlp.shared  # Qwen3-Next's shared expert
        mlp = (dense.gate_up, dense.down) if dense else ()
        parts += [lin.parts if isinstance(lin, ConcatLinear) else [lin] for lin in (*layer.linears()[:2], *mlp)]
        parts += [[]] * (2 - len(mlp))
    if not all(isinstance(part, TiledLinear | Bf16Linear) for each in parts for part in each):
        return None
    moe = {i: layer.mlp for i, layer in enumerate(layers) if type(layer.mlp) is SparseMoE}
    first = next(iter(moe.values()), None)
    c, k = ops.config, ops.kernels
    return DecodeCall(
        k.DecodeLayers(
            [[kernel_part(p) for p in each] for each in parts],
            [n for layer in layers for n in (layer.attn_norm, layer.mlp_norm)] + [norm],
            [getattr(layer, "qk_norm", None) for layer in layers],
            ops.cos,
            ops.sin,
            c.num_heads,
            c.num_kv_heads,
            c.head_dim,
            c.head_dim**-0.5,
            c.rms_norm_eps,
            [moe[i].router.weight if i in moe else None for i in range(len(layers))],
            [moe[i].row if i in moe else None for i in range(len(layers))],
            first.top_k if first else 0,
            first.normalize if first else False,
            [gated_layer(k, layer) if type(layer) is GatedAttentionBlock else None for layer in layers],
            [delta_net_layer(k, layer) if type(layer) is DeltaNetBlock else None for layer in layers],
            [moe[i].shared_gate.weight if i in moe and moe[i].shared else None for i in range(len(layers))],
        ),
        ops,
        moe,
        torch.zeros(len(layers), dtype=torch.int64),
    )


LAYERS = (
    DecoderBlock,
    GatedAttentionBlock,
    DeltaNetBlock,
)  # what the one call runs; qkv or in_proj, then o or out_proj


def gated_layer(kernels: Any, block: GatedAttentionBlock) -> Any:
    """A gated attention layer's own tensors as the kernels' GatedLayer (KernelOps.gated_attention's arguments)."""
    return kernels.GatedLayer(block.q_norm, block.k_norm, block.cos, block.signed_sin)


def delta_net_layer(kernels: Any, block: DeltaNetBlock) -> Any:
    """A Gated DeltaNet layer's as the kernels' DeltaNetLayer (KernelOps.delta_net_decode's arguments)."""
    shapes = block.shapes
    return kernels.DeltaNetLayer(
        block.conv, block.neg_a, block.dt_bias, block.norm, shapes.num_key_heads, block.index, block.tiled
    )
