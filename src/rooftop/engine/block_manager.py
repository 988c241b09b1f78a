"""The KV block pool: fixed-size blocks, per-sequence block tables, reference counts and the prefix cache.

A full block is named by a hash of its tokens and of every token before it (the hash chains through the
parent block), so two prompts that share a prefix share its blocks. Unreferenced blocks that still hold a
cached prefix stay findable until the pool needs them; then the least recently used one is evicted first.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

BlockHash = int


def block_hash(parent: BlockHash | None, tokens: tuple[int, ...]) -> BlockHash:
    return hash((parent, tokens))


@dataclass
class Block:
    id: int
    ref_count: int = 0
    hash: BlockHash | None = None  # set once the block is full and its KV is computed
    tokens: tuple[int, ...] = ()  # what it holds, checked on a hit so a hash collision can never serve wrong K/V


class BlockManager:
    """Owns every block; sequences only hold lists of block ids (their block tables)."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(
                f"a block pool needs at least one block of at least one token, not {num_blocks} x {block_size}"
            )
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_ids: list[int] = list(range(num_blocks - 1, -1, -1))  # never cached, or evicted: pop from the end
        self.evictable: OrderedDict[int, None] = OrderedDict()  # unreferenced cached blocks, least recent first
        self.cached: dict[BlockHash, int] = {}
        self.prefix_queries = 0  # prompt tokens looked up in the prefix cache
        self.prefix_hits = 0  # of which found

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free(self) -> int:
        """Blocks a new allocation can take: never used, or cached but unreferenced."""
        return len(self.free_ids) + len(self.evictable)

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def cached_prefix(self, token_ids: list[int], most: int | None = None, unit: int | None = None) -> list[int]:
        """Ids of the cached blocks that hold a prefix of `token_ids`: at most `most` tokens (default: all but the
        last, which is left to compute), in multiples of `unit` tokens (default: one block; a multiple of it)."""
        if not self.enable_prefix_caching:
            return []
        most = len(token_ids) - 1 if most is None else most
        found, parent = [], None
        for start in range(0, most - most % self.block_size, self.block_size):
            tokens = tuple(token_ids[start : start + self.block_size])
            parent = block_hash(parent, tokens)
            block_id = self.cached.get(parent)
            if block_id is None or self.blocks[block_id].tokens != tokens:
                break
            found.append(block_id)
        per_unit = (unit or self.block_size) // self.block_size
        return found[: len(found) - len(found) % per_unit]

    def allocate(self, token_ids: list[int], hits: list[int] | None = None) -> tuple[list[int], int] | None:
        """A block table for a sequence about to compute `token_ids`, reusing the cached prefix blocks `hits` (a
        `cached_prefix` of them; by default the longest).

        Returns (block table, tokens already cached) or None when the pool cannot hold the rest now.
        """
        hits = self.cached_prefix(token_ids) if hits is None else hits
        fresh = self.blocks_needed(len(token_ids)) - len(hits)
        reusable_free = sum(1 for b in hits if self.blocks[b].ref_count == 0)
        if fresh > self.num_free - reusable_free:
            return None
        if self.enable_prefix_caching:
            self.prefix_queries += len(token_ids)
            self.prefix_hits += len(hits) * self.block_size
        for b in hits:
            self._ref(b)
        table = hits + [self._take() for _ in range(fresh)]
        return table, len(hits) * self.block_size

    def can_append(self, table: list[int], num_tokens: int) -> bool:
        """Whether a sequence with this block table can grow to `num_tokens`."""
        return self.blocks_needed(num_tokens) - len(table) <= self.num_free

    def append(self, table: list[int], num_tokens: int) -> None:
        """Grow the block table so it holds `num_tokens` tokens."""
        while len(table) < self.blocks_needed(num_tokens):
            table.append(self._take())

    def truncate(self, table: list[int], num_tokens: int) -> None:
        """Shrink the block table to the blocks that hold its first `num_tokens` tokens, freeing the rest (a
        verify step's rejected drafts: never named for the prefix cache, so they go back to the free list)."""
        keep = self.blocks_needed(num_tokens)
        tail = table[keep:]
        del table[keep:]
        self.free(tail)

    def cache_full_blocks(self, table: list[int], token_ids: list[int], num_computed: int) -> None:
        """Name every block whose tokens are all computed, so later prompts can find it."""
        if not self.enable_prefix_caching:
            return
        parent = None
        for i in range(num_computed // self.block_size):
            block = self.blocks[table[i]]
            if block.hash is not None:  # named in an earlier step: its hash carries the chain on
                parent = block.hash
                continue
            tokens = tuple(token_ids[i * self.block_size : (i + 1) * self.block_size])
            parent = block_hash(parent, tokens)
            if parent in self.cached:  # the same content already cached elsewhere: keep the first
                continue
            block.hash, block.tokens = parent, tokens
            self.cached[parent] = block.id

    def free(self, table: list[int]) -> None:
        """Drop a sequence's references; blocks with no references become free (or evictable if cached)."""
        for b in reversed(table):  # the tail of a sequence is the least likely to be shared: evict it first
            block = self.blocks[b]
            if block.ref_count < 1:
                raise RuntimeError(f"block {b} freed twice")  # a bookkeeping bug, never bad input
            block.ref_count -= 1
            if block.ref_count == 0:
                if block.hash is not None:
                    self.evictable[b] = None
                else:
                    self.free_ids.append(b)
        table.clear()

    def _ref(self, b: int) -> None:
        block = self.blocks[b]
        if block.ref_count == 0:
            self.evictable.pop(b, None)
        block.ref_count += 1

    def _take(self) -> int:
        if self.free_ids:
            b = self.free_ids.pop()
        else:
            b, _ = self.evictable.popitem(last=False)
            block = self.blocks[b]
            del self.cached[block.hash]
            block.hash, block.tokens = None, ()
        self.blocks[b].ref_count = 1
        return b
