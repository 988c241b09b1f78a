"""Scheduler, block pool and (hybrid models) state slot invariants under random arrivals, lengths and aborts
(hypothesis), without a model."""

from hypothesis import given, settings
from hypothesis import strategies as st

from rooftop import SamplingParams
from rooftop.config import EngineConfig
from rooftop.engine.block_manager import BlockManager
from rooftop.engine.metrics import RequestMetrics
from rooftop.engine.scheduler import Scheduler
from rooftop.engine.sequence import Sequence, Status

REQUEST = st.tuples(
    st.integers(1, 40),  # prompt tokens
    st.integers(1, 12),  # output tokens before it stops
    st.integers(0, 3),  # which of 4 shared prefixes it starts with
    st.integers(0, 30),  # step at which it arrives
    st.one_of(st.none(), st.integers(0, 40)),  # step at which it is aborted, if ever
)


def make_seq(i, prompt_len, prefix):
    ids = [1000 + prefix] * 16 + [i] * max(0, prompt_len - 16) if prompt_len > 16 else [1000 + prefix] * prompt_len
    return Sequence(
        request_id=str(i),
        prompt=None,
        prompt_token_ids=ids,
        params=SamplingParams(max_tokens=12),
        metrics=RequestMetrics(0.0),
    )


@settings(max_examples=60, deadline=None)
@given(
    st.lists(REQUEST, min_size=1, max_size=24),
    st.integers(13, 40),  # blocks of 4 tokens: room for one 52-token request at least
    st.integers(1, 64),  # token budget
    st.integers(1, 8),  # max_num_seqs
    st.booleans(),
    st.booleans(),  # batch invariance
    st.booleans(),  # a hybrid model: a linear-attention state slot per running sequence
)
def test_scheduler_invariants(requests, num_blocks, budget, max_seqs, prefix_caching, invariant, hybrid):
    config = EngineConfig(
        max_num_seqs=max_seqs,
        max_num_batched_tokens=budget,
        block_size=4,
        enable_prefix_caching=prefix_caching,
        batch_invariant=invariant,
    )
    chunk = config.chunk_size
    blocks = BlockManager(num_blocks, 4, prefix_caching)
    sched = Scheduler(config, blocks, max_seqs if hybrid else 0)
    seqs = [make_seq(i, p, prefix) for i, (p, _, prefix, _, _) in enumerate(requests)]
    wanted = {s.request_id: out for s, (_, out, _, _, _) in zip(seqs, requests, strict=False)}
    done: set[str] = set()
    arrivals = 0
    for step in range(2000):
        for seq, (_, _, _, arrive, abort) in zip(seqs, requests, strict=False):
            if arrive == step:
                seq.arrival_index, arrivals = arrivals, arrivals + 1  # as LLMEngine.add_request numbers them
                sched.add(seq)
            if (
                abort == step
                and seq.request_id not in done
                and seq.status is not Status.FINISHED
                and (seq in sched.running or seq in sched.waiting)
            ):
                sched.finish(seq)
                done.add(seq.request_id)
        if not sched.has_unfinished() and step > 30:
            break
        running_before = {id(s) for s in sched.running}
        batch = sched.schedule()
        assert sum(s.new for s in batch) <= budget
        assert len({id(s.seq) for s in batch}) == len(batch)
        assert len(sched.running) <= max_seqs
        holders = {}
        for s in sched.running:
            for b in s.block_table:
                holders[b] = holders.get(b, 0) + 1
        for block in blocks.blocks:
            assert block.ref_count == holders.get(block.id, 0)  # nobody touches another's blocks uncounted
        slots = [s.state_slot for s in sched.running]
        if hybrid:  # each running sequence holds its own slot; the others hold none; none is lost
            assert None not in slots and len(set(slots)) == len(slots)
            assert sorted(slots + sched.free_states) == list(range(max_seqs))
        else:
            assert slots == [None] * len(slots) and sched.free_states == []
        assert all(s.state_slot is None for s in sched.waiting)
        finished = []
        for s in batch:
            assert s.seq.status is Status.RUNNING
            assert len(s.seq.block_table) * 4 >= s.cached + s.new
            # the phase, decided once: a decode is a running sequence computing the one token it sampled last, or
            # with batch invariance replaying a generated token after a preemption (its whole prompt cached);
            # admission is always a prefill, even when the prefix cache leaves one prompt token to compute
            continues = id(s.seq) in running_before and bool(s.seq.output_token_ids)
            replays = invariant and s.cached >= len(s.seq.prompt_token_ids)
            decodes = continues and (replays or s.cached == s.seq.num_tokens - 1)
            assert (s.phase == "decode") == decodes, (s.phase, s.cached)
            assert s.phase != "decode" or s.new == 1
            if invariant and s.phase == "prefill":  # chunks lie between multiples of the chunk size
                assert s.cached // chunk == (s.cached + s.new - 1) // chunk
                assert (s.cached + s.new) % chunk == 0 or s.cached + s.new == len(s.seq.prompt_token_ids)
            if s.needs_logits:
                s.seq.output_token_ids.append(7)
                if len(s.seq.output_token_ids) >= wanted[s.seq.request_id]:
                    finished.append(s.seq)
                    done.add(s.seq.request_id)
        sched.update(batch, finished)
        # first come, first served: the waiting queue stays in arrival order
        queue = [s.arrival_index for s in sched.waiting]
        assert queue == sorted(queue)
    assert not sched.has_unfinished(), "every request finishes: no deadlock"
    assert all(b.ref_count == 0 for b in blocks.blocks)
    assert blocks.num_free == num_blocks
    assert sched.free_states == list(range(max_seqs if hybrid else 0))


def test_a_hash_hit_with_other_tokens_is_not_served():
    blocks = BlockManager(8, 4)
    table, cached = blocks.allocate([1, 2, 3, 4, 5])
    blocks.cache_full_blocks(table, [1, 2, 3, 4, 5], 5)
    assert blocks.cached_prefix([1, 2, 3, 4, 9]) == [table[0]]
    blocks.blocks[table[0]].tokens = (9, 9, 9, 9)  # as if another prefix had collided on this hash
    assert blocks.cached_prefix([1, 2, 3, 4, 9]) == []
