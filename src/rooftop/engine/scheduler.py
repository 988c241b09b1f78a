"""The scheduler: which sequences run in the next step and how many tokens each brings (first come, first served).

Each step first gives every running decode its one token, then continues running prefills chunk by chunk,
then admits waiting requests, all within max_num_seqs and the token budget max_num_batched_tokens. When the
block pool runs dry, the most recently arrived running sequence is preempted: its blocks are freed and it
is recomputed later from its tokens so far.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from rooftop.config import EngineConfig
from rooftop.engine.block_manager import BlockManager
from rooftop.engine.sequence import Sequence, Status


@dataclass
class ScheduledSeq:
    seq: Sequence
    num_new: int  # tokens computed for it this step
    cached: int  # tokens it already had in the cache

    @property
    def samples(self) -> bool:
        """The step reaches the sequence's last token, so a new token is sampled from its logits."""
        return self.cached + self.num_new == self.seq.num_tokens


class Scheduler:
    def __init__(self, config: EngineConfig, blocks: BlockManager):
        self.config, self.blocks = config, blocks
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # kept in arrival order
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def finish(self, seq: Sequence) -> None:
        """Release a finished or aborted sequence's blocks, wherever it is."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.blocks.free(seq.block_table)
        seq.status = Status.FINISHED

    def schedule(self) -> list[ScheduledSeq]:
        budget = self.config.max_num_batched_tokens
        scheduled: list[ScheduledSeq] = []
        preempted = False
        decodes = [s for s in self.running if s.num_uncomputed_tokens == 1]
        prefills = [s for s in self.running if s.num_uncomputed_tokens > 1]
        for seq in decodes + prefills:
            if seq.status is not Status.RUNNING or budget == 0:
                continue  # preempted earlier in this loop, or out of budget until the next step
            n = min(seq.num_uncomputed_tokens, budget)
            while not self.blocks.can_append(seq.block_table, seq.num_computed_tokens + n):
                victim = max(self.running, key=lambda s: s.arrival_index)
                for entry in [e for e in scheduled if e.seq is victim]:  # give back what it was granted
                    scheduled.remove(entry)
                    budget += entry.num_new
                self._preempt(victim)
                preempted = True
                if victim is seq:
                    break
            if seq.status is not Status.RUNNING:
                continue
            self.blocks.append(seq.block_table, seq.num_computed_tokens + n)
            scheduled.append(ScheduledSeq(seq, n, seq.num_computed_tokens))
            budget -= n
        while not preempted and self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            seq = self.waiting[0]
            allocation = self.blocks.allocate(seq.all_token_ids)
            if allocation is None:
                break
            self.waiting.popleft()
            seq.block_table, seq.num_computed_tokens = allocation
            seq.status = Status.RUNNING
            self.running.append(seq)
            self.running.sort(key=lambda s: s.arrival_index)
            n = min(seq.num_uncomputed_tokens, budget)
            scheduled.append(ScheduledSeq(seq, n, seq.num_computed_tokens))
            budget -= n
        return scheduled

    def _preempt(self, seq: Sequence) -> None:
        """Free its blocks and send it back to the head of the queue, to be recomputed from its tokens so far."""
        self.running.remove(seq)
        self.blocks.free(seq.block_table)
        seq.num_computed_tokens = 0
        seq.status = Status.WAITING
        self.num_preemptions += 1
        position = next(
            (i for i, s in enumerate(self.waiting) if s.arrival_index > seq.arrival_index), len(self.waiting)
        )
        self.waiting.insert(position, seq)
