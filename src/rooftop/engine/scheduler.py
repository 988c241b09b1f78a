"""The scheduler: which sequences run in the next step, how many tokens each brings, and in which phase
(first come, first served). The phase is decided here, once; everything downstream reads `ScheduledSeq.phase`.

Each step first gives every running decode its one token, then continues running prefills chunk by chunk,
then admits waiting requests, all within max_num_seqs and the token budget max_num_batched_tokens. When the
block pool runs dry, the most recently arrived running sequence is preempted: its blocks are freed and it
is recomputed later from its tokens so far. After the step, `update` takes in what it computed.

With batch invariance (the default) a sequence computes exactly what it would alone, whatever shares its steps:
- its prompt is cut into chunks at multiples of `chunk_size`, and a chunk waits for a step with room for all of
  it (the budget decides when a chunk runs, never where it ends);
- the prefix cache offers only blocks of whole chunks, and a hit is used in whole chunks, so a reused prefix
  holds exactly the K/V this sequence's own chunks would have computed;
- after a preemption the prompt is recomputed in the same chunks and the tokens it had generated are replayed
  one decode step each, as they were first computed.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from rooftop.config import EngineConfig
from rooftop.engine.block_manager import BlockManager
from rooftop.engine.sequence import Sequence, Status
from rooftop.enums import Phase


@dataclass
class ScheduledSeq:
    seq: Sequence
    new: int  # tokens computed for it this step
    cached: int  # tokens it already had in the cache
    phase: Phase
    # a verify step (speculative decoding): the draft tokens computed after the token it sampled last, new - 1 of
    # them; after sampling, `accepted` of them turned out to be what the model samples
    draft: list[int] = field(default_factory=list)
    accepted: int = 0

    @property
    def needs_logits(self) -> bool:
        """The step reaches the sequence's last token, so a new token is sampled from its logits (from each of a
        verify step's rows)."""
        return self.cached + self.new - len(self.draft) == self.seq.num_tokens

    @property
    def prompt_positions(self) -> range:
        """The positions of this step whose logits give the next prompt token its logprobs
        (SamplingParams.prompt_logprobs): those before the prompt's last that the sequence has not recorded yet, so a
        recompute after a preemption records none twice."""
        seq = self.seq
        if seq.params.prompt_logprobs is None or self.phase is not Phase.PREFILL:
            return range(0)
        return range(
            max(self.cached, len(seq.prompt_logprobs)), min(self.cached + self.new, len(seq.prompt_token_ids) - 1)
        )


def running_phase(seq: Sequence, replay: bool) -> Phase:
    """A running sequence decodes when its one uncached token is the output token it sampled last, or, when
    `replay`, whenever its whole prompt is cached (it recomputes generated tokens one decode each after a
    preemption); otherwise it is still prefilling (its prompt's next chunk, or recomputing after a preemption).
    Admission is always a prefill, even when the prefix cache leaves a single prompt token to compute."""
    if replay and seq.output_token_ids and seq.cached >= len(seq.prompt_token_ids):
        return Phase.DECODE
    return Phase.DECODE if seq.uncached == 1 and seq.output_token_ids else Phase.PREFILL


class Scheduler:
    def __init__(self, config: EngineConfig, blocks: BlockManager, state_slots: int = 0):
        self.config, self.blocks = config, blocks
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # kept in arrival order
        self.num_preemptions = 0
        # a hybrid model's state slots (as many as max_num_seqs): one per running sequence, lowest free first
        self.free_states = list(range(state_slots))

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
        self._free_state(seq)
        seq.status = Status.FINISHED

    def decoding(self) -> list[Sequence]:
        """The running sequences whose next step decodes the token they sampled last (not a replay after a
        preemption): those a speculative proposer may give draft tokens to verify in that step."""
        return [s for s in self.running if s.uncached == 1 and s.output_token_ids]

    def tokens_this_step(self, seq: Sequence, cached: int, phase: Phase, budget: int, drafts: int = 0) -> int:
        """How many tokens `seq`, with `cached` of them in the cache, computes in a step with `budget` tokens left
        (0: it waits for a later step); a decode with `drafts` draft tokens verifies as many of them as fit."""
        if phase is Phase.DECODE:
            return min(1 + drafts, budget)
        chunk = self.config.chunk_size
        if not self.config.batch_invariant:
            return min(seq.num_tokens - cached, chunk, budget)
        # the rest of the chunk its next position is in; generated tokens are replayed as decodes, not prefilled
        n = min(len(seq.prompt_token_ids) - cached, chunk - cached % chunk)
        return n if n <= budget else 0

    def reusable_prefix(self, seq: Sequence) -> tuple[int, int]:
        """(The most tokens of `seq` a prefix-cache hit may cover, in multiples of how many): with batch invariance,
        whole chunks (and whole blocks) of its prompt, leaving at least one prompt token to compute; otherwise whole
        blocks. A request with prompt_logprobs reuses none: a cached prefix has no logits (vLLM's rule)."""
        if seq.params.prompt_logprobs is not None:
            return 0, self.config.block_size
        if not self.config.batch_invariant:
            return seq.num_tokens - 1, self.config.block_size
        return len(seq.prompt_token_ids) - 1, math.lcm(self.config.chunk_size, self.config.block_size)

    def schedule(self, drafts: dict[Sequence, list[int]] | None = None) -> list[ScheduledSeq]:
        """The next step's sequences. A decoding sequence with `drafts` verifies them in its step (new = 1 + the
        drafts that fit in the token budget), or decodes plainly when the pool has no room for them."""
        drafts = drafts or {}
        budget = self.config.max_num_batched_tokens
        scheduled: list[ScheduledSeq] = []
        preempted = False
        phases = {seq: running_phase(seq, self.config.batch_invariant) for seq in self.running}
        decodes = [s for s in self.running if phases[s] is Phase.DECODE]
        prefills = [s for s in self.running if phases[s] is Phase.PREFILL]
        for seq in decodes + prefills:
            if seq.status is not Status.RUNNING:
                continue  # preempted earlier in this loop
            draft = drafts.get(seq, []) if phases[seq] is Phase.DECODE else []
            n = self.tokens_this_step(seq, seq.cached, phases[seq], budget, len(draft))
            if n == 0:
                continue  # no room left in this step for its next chunk
            draft = draft[: n - 1]
            if draft and not self.blocks.can_append(seq.block_table, seq.cached + n):
                draft, n = [], 1  # no blocks to spare for the drafts: a plain decode preempts no one for them
            while not self.blocks.can_append(seq.block_table, seq.cached + n):
                victim = max(self.running, key=lambda s: s.arrival_index)
                for entry in [e for e in scheduled if e.seq is victim]:  # give back what it was granted
                    scheduled.remove(entry)
                    budget += entry.new
                self._preempt(victim)
                preempted = True
                if victim is seq:
                    break
            if seq.status is not Status.RUNNING:
                continue
            self.blocks.append(seq.block_table, seq.cached + n)
            scheduled.append(ScheduledSeq(seq, n, seq.cached, phases[seq], draft))
            budget -= n
        while not preempted and self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            seq = self.waiting[0]
            if self.awaits_prompt(seq):  # a few steps, first in line: the prompt is then computed once, not n times
                break
            hits = self.blocks.cached_prefix(seq.all_token_ids, *self.reusable_prefix(seq))
            n = self.tokens_this_step(seq, len(hits) * self.blocks.block_size, Phase.PREFILL, budget)
            if n == 0:  # its first chunk does not fit in this step: it stays first in line
                break
            allocation = self.blocks.allocate(seq.all_token_ids, hits)
            if allocation is None:
                break
            seq.block_table, seq.cached = allocation
            if self.free_states:
                seq.state_slot = self.free_states.pop(0)
            self.waiting.popleft()
            seq.status = Status.RUNNING
            self.running.append(seq)
            self.running.sort(key=lambda s: s.arrival_index)
            scheduled.append(ScheduledSeq(seq, n, seq.cached, Phase.PREFILL))
            budget -= n
        return scheduled

    def awaits_prompt(self, seq: Sequence) -> bool:
        """Whether `seq` waits for its prompt source (another choice of its request) to finish computing the prompt
        they share, so that it is admitted with a prefix-cache hit instead of computing the prompt beside it (one with
        prompt_logprobs computes it all anyway)."""
        source = seq.prompt_source
        return (
            source is not None
            and seq.params.prompt_logprobs is None
            and self.blocks.enable_prefix_caching
            and source.status is Status.RUNNING
            and source.cached < len(source.prompt_token_ids)
        )

    def update(self, batch: list[ScheduledSeq], finished: list[Sequence]) -> None:
        """Take in a step's work: each sequence's new tokens are cached (full blocks named for the prefix cache),
        and the sequences that finished give their blocks back. A verify step keeps the K/V of the token it
        decoded and of its accepted drafts; the rejected drafts' slots are rolled back: overwritten by later steps,
        and blocks that hold nothing but rejected drafts go back to the pool."""
        for s in batch:
            s.seq.cached += s.new - len(s.draft) + s.accepted
            if s.draft:
                self.blocks.truncate(s.seq.block_table, s.seq.cached)
            self.blocks.cache_full_blocks(s.seq.block_table, s.seq.all_token_ids, self.shareable(s.seq))
        for seq in finished:
            self.finish(seq)

    def shareable(self, seq: Sequence) -> int:
        """Of `seq`'s cached tokens, how many the prefix cache may offer to others: with batch invariance, its
        prompt's whole chunks (a partial chunk's K/V depend on where the prompt ends, generated tokens' on having
        been decoded); otherwise all of them."""
        if not self.config.batch_invariant:
            return seq.cached
        chunk = self.config.chunk_size
        return min(seq.cached, len(seq.prompt_token_ids) // chunk * chunk)

    def _preempt(self, seq: Sequence) -> None:
        """Free its blocks and send it back to the head of the queue, to be recomputed from its tokens so far."""
        self.running.remove(seq)
        self.blocks.free(seq.block_table)
        self._free_state(seq)  # its state is rebuilt from zeros as its tokens are recomputed
        seq.cached = 0
        seq.status = Status.WAITING
        self.num_preemptions += 1
        position = next(
            (i for i, s in enumerate(self.waiting) if s.arrival_index > seq.arrival_index), len(self.waiting)
        )
        self.waiting.insert(position, seq)

    def _free_state(self, seq: Sequence) -> None:
        if seq.state_slot is not None:
            self.free_states = sorted([*self.free_states, seq.state_slot])
            seq.state_slot = None
