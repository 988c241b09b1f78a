"""One decoder-only transformer run on explicit weights, over a flat batch of many sequences' new tokens.

`forward_batch` runs every matmul once for all of them (each reads the weights once); only attention is per
sequence, through the paged KV cache. The blocks and the op backend come from the loader (models/loader.py).
"""

from __future__ import annotations

from dataclasses import replace

import torch
import torch.nn.functional as F

from rooftop.config import ModelConfig
from rooftop.enums import Phase
from rooftop.errors import UnsupportedModelError
from rooftop.models.blocks import DecoderBlock
from rooftop.models.decode_call import decode_call, row_experts
from rooftop.models.hybrid import DeltaNetBlock, GatedAttentionBlock
from rooftop.models.kv_cache import AttentionMetadata, KVCache, KVPool
from rooftop.models.mlp import SparseMoE
from rooftop.models.ops import Ops
from rooftop.models.parallel import TPGroup, VocabParallelEmbedding, VocabParallelHead, rank_config
from rooftop.quant.linear import FLOAT_FORMATS, NARROW, Linear, RowPlan, TiledLinear, row_plan, widen_compute
from rooftop.quant.weights import Int4Weight, Int8GroupWeight, Weight
from rooftop.roofline.ops import matrix_weights
from rooftop.roofline.precision import WEIGHT_FORMATS, Precision, mixed_format, precision


class Transformer:
    """Weights on one device in one dtype, the op backend picked for them, and the forward pass. Under tensor
    parallelism (`tp`) the weights are this rank's part: `config` stays the model's, `rank_config` has the heads and
    intermediate features this rank computes."""

    def __init__(
        self,
        config: ModelConfig,
        dtype: torch.dtype,
        device: torch.device,
        embed: Weight | TiledLinear,  # a lookup table: float, a file's groups, or tiles (quant.linear.embedding_table)
        layers: list[DecoderBlock | GatedAttentionBlock | DeltaNetBlock],
        norm: torch.Tensor,
        lm_head: Linear,
        ops: Ops,
        weight_policy: str,
        conversions: dict[str, str] | None = None,
        tp: TPGroup | None = None,
    ):
        self.config, self.dtype, self.device = config, dtype, device
        self.tp = tp if tp is not None and tp.size > 1 else None
        self.rank_config = rank_config(config, self.tp_size)
        self.embed, self.layers, self.norm, self.lm_head = embed, layers, norm, lm_head
        self.ops = ops
        self.weight_policy = weight_policy  # the policy its linears were built under: float, int8 or int4
        self.conversions = conversions or {}  # HF name -> "Q3_K -> Q4_1": matrices the loader converted
        self.moe = [layer.mlp for layer in layers if isinstance(layer.mlp, SparseMoE)]  # read after every step
        for moe in self.moe:  # the experts held for the kernels where they all run on them
            moe.row = row_experts(moe, ops, self.tp is not None)
        self.decode_call = decode_call(layers, norm, ops, self.tp is not None)  # None: decodes go layer by layer

    @property
    def tp_size(self) -> int:
        """The ranks the model is split over (1: all of it here)."""
        return 1 if self.tp is None else self.tp.size

    def bytes_by_format(self) -> dict[str, int]:
        """The block linears' bytes per format they run in (several for a mixed file such as a Q4_K_M)."""
        held: dict[str, int] = {}
        for layer in self.layers:
            for linear in layer.linears():
                for part in getattr(linear, "parts", [linear]):
                    held[part.format] = held.get(part.format, 0) + part.nbytes
        return held

    def experts_touched(self) -> float | None:
        """Distinct experts each mixture-of-experts layer ran in the last forward pass, averaged over the layers;
        None for a dense model."""
        if not self.moe:
            return None
        return sum(moe.touched for moe in self.moe) / len(self.moe)

    @property
    def precision(self) -> Precision:
        """What the steps read and compute in, as the linears report it: activations and KV cache in the dtype, the
        block linears' format (their mix, by bytes, in a mixed file) and the lm_head's, and the step size from which
        quantized linears widen to floats, and the embedding table's format (a file's Q8_0 table beside Q4_1 blocks
        is read and counted as Q8_0: the working set whose read is the run's memory roof)."""
        fmt = FLOAT_FORMATS[self.dtype]
        weights = mixed_format(self.bytes_by_format(), matrix_weights(self.rank_config))
        head = WEIGHT_FORMATS[self.lm_head.format]
        table = WEIGHT_FORMATS[self.table_format()]
        return replace(
            precision(fmt, fmt),
            weights=weights,
            widen_rows=self.layers[0].linears()[0].widen_rows,
            widen_compute=widen_compute(self.layers[0].linears()[0], self.dtype),
            lm_head=None if head == weights else head,
            embedding=None if table == weights else table,
        )

    def table_format(self) -> str:
        """The format the embedding table is held in: a float dtype, a file's groups or blocks, or tiles; a table that
        is the tied lm_head's own matrix (quant.linear.embedding_table: a bf16-fp32 head's bfloat16 tensor) the
        head's, so that the two count as the one matrix they are (roofline.ops.shares_table)."""
        table = self.embed.table if isinstance(self.embed, VocabParallelEmbedding) else self.embed
        head = self.lm_head.linear if isinstance(self.lm_head, VocabParallelHead) else self.lm_head
        if table is head or table is getattr(head, "weight", None):
            return head.format
        if isinstance(table, torch.Tensor):
            return FLOAT_FORMATS[table.dtype]
        if isinstance(table, Int4Weight):
            return "q4_1"
        return "q8_0" if isinstance(table, Int8GroupWeight) else table.format

    def forward(
        self, input_ids: torch.Tensor, cache: KVCache, start: int, phase: Phase = Phase.PREFILL
    ) -> torch.Tensor:
        """One sequence: T new tokens at positions start..start+T-1 after `start` tokens already in `cache`; the
        caller decides the phase, as the engine's scheduler does (a decode brings the one token sampled last). The
        rows take the paths they take in the engine with batch invariance: a prefill of them all is one chunk. A model
        split over ranks runs only through the engine's steps, which every rank takes part in."""
        if self.tp is not None:
            raise UnsupportedModelError(
                "a tensor-parallel model runs through the engine (LLM.generate, LLMEngine.step), where every rank "
                "computes the step; Transformer.forward runs one rank's part alone"
            )
        n = input_ids.shape[0]
        positions = torch.arange(start, start + n, device=input_ids.device)
        meta = cache.metadata(start, n, phase)
        plan = row_plan([n] if phase is Phase.PREFILL else [], n, self.dtype, batch_invariant=True)
        return self.forward_batch(input_ids, positions, cache.pool, meta, plan)

    def forward_batch(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        pool: KVPool,
        meta: AttentionMetadata,
        plan: RowPlan = NARROW,
    ) -> torch.Tensor:
        """Hidden states (T, hidden) of the step's T tokens (all sequences, flat); their K/V go into `pool`. `plan`
        says which rows go through the linears on which path (quant/linear.py)."""
        x = self.embed_tokens(input_ids)
        if self.decode_call is not None and self.decode_call.runs(self.ops, meta, plan):
            return self.decode_call(x, positions, pool, meta)
        rope = self.ops.rope(positions)
        attention = 0  # the full-attention layers' index into the KV pool
        for layer in self.layers:
            if isinstance(layer, DeltaNetBlock):
                x = layer(x, self.ops, pool.states, meta, plan)
                continue
            k_pool, v_pool = pool.k_layers[attention], pool.v_layers[attention]
            if isinstance(layer, GatedAttentionBlock):
                x = layer(x, self.ops, positions, k_pool, v_pool, meta, plan)
            else:
                x = layer(x, self.ops, rope, k_pool, v_pool, meta, plan)
            attention += 1
        return self.ops.rms_norm(x, self.norm)

    def embed_tokens(self, input_ids: torch.Tensor) -> torch.Tensor:
        if isinstance(self.embed, VocabParallelEmbedding):
            return self.embed(input_ids, self.dtype)
        if isinstance(self.embed, torch.Tensor):
            return F.embedding(input_ids, self.embed).to(self.dtype)  # a bf16-fp32 head's table: bf16
        return self.embed.lookup(input_ids).to(self.dtype)  # only the rows of these tokens are widened

    def logits(self, hidden: torch.Tensor, batch_invariant: bool = True) -> torch.Tensor | None:
        """Float32 logits (T, vocab) for the given hidden states (only the positions that need sampling). With batch
        invariance every row takes the narrow path: a row's logits do not depend on what else is sampled. Under
        tensor parallelism they are gathered on rank 0; the other ranks get None."""
        logits = self.lm_head(hidden, plan=row_plan([], hidden.shape[0], self.dtype, batch_invariant))
        return None if logits is None else logits.float()
