"""The host side of a paged KV cache: which pages each sampler slot holds, and the free lists.

The pool may be split into `shards` equal parts, one a data shard of a sampler mesh: shard s
owns the pages `[s * per, (s + 1) * per)` and the slots `[s * slots_per, (s + 1) *
slots_per)` (as the mesh lays out pages and rows over the batch axes), and a slot takes
pages from its own shard's part only, so a device's rows read only its own pages. Each part's
first page is scratch (the unfilled table entries of its slots point there; it is never
handed out). A slot takes pages as it grows (`grow`: as many as its part allows) and gives
back those past its tokens (`shrink`, `release`), so a row holds ceil(length / page) pages
between calls. The table (global page ids) is copied to the device before each call.
"""

from __future__ import annotations

import numpy as np


class PageTable:
    """Page tables of `slots` slots over a pool of `pages` pages of `page_size` tokens, each
    slot's table `width` pages wide (its capacity), the pool and the slots split into
    `shards` parts (one a data shard)."""

    def __init__(self, slots: int, pages: int, page_size: int, width: int, shards: int = 1):
        if slots % shards or pages % shards:
            raise ValueError(f"{slots} slots and {pages} pages do not split into {shards} data shards")
        per = pages // shards
        if per < 2:
            raise ValueError(f"a pool of {pages} pages in {shards} shards holds none besides each shard's scratch page")
        self.page_size, self.pages, self.shards = page_size, pages, shards
        self._slots_per, self._per = slots // shards, per
        scratch = np.repeat(np.arange(shards, dtype=np.int32) * per, slots // shards)
        self.table = np.repeat(scratch[:, None], width, axis=1)  # unfilled: the shard's scratch page
        self.held: list[list[int]] = [[] for _ in range(slots)]
        # Popped from the end: low ids first.
        self._free = [list(range((s + 1) * per - 1, s * per, -1)) for s in range(shards)]

    def shard(self, slot: int) -> int:
        """The data shard whose pages the slot holds."""
        return slot // self._slots_per

    @property
    def free(self) -> list[int]:
        """The free pages of every shard."""
        return [page for pages in self._free for page in pages]

    def free_pages(self, slot: int) -> int:
        """Free pages the slot could take (its shard's)."""
        return len(self._free[self.shard(slot)])

    def capacity(self, slot: int) -> int:
        """Tokens the slot's pages hold."""
        return len(self.held[slot]) * self.page_size

    def room(self, slot: int, length: int) -> int:
        """Tokens a slot holding `length` could still add: its pages' spare slots and its
        shard's free pages (shared with the shard's other slots), within its table."""
        most = self.table.shape[1] * self.page_size
        return max(0, min(most, self.capacity(slot) + self.free_pages(slot) * self.page_size) - length)

    def grow(self, slot: int, tokens: int) -> int:
        """Takes pages until the slot holds `tokens` tokens or its shard's pages (or its
        table) run out; returns the tokens it holds."""
        held, free = self.held[slot], self._free[self.shard(slot)]
        need = min(-(-tokens // self.page_size), self.table.shape[1])
        while len(held) < need and free:
            page = free.pop()
            self.table[slot, len(held)] = page
            held.append(page)
        return self.capacity(slot)

    def shrink(self, slot: int, tokens: int) -> None:
        """Returns the slot's pages past its first `tokens` tokens."""
        held, free = self.held[slot], self._free[self.shard(slot)]
        keep = -(-tokens // self.page_size)
        while len(held) > keep:
            free.append(held.pop())
            self.table[slot, len(held)] = self.shard(slot) * self._per

    def release(self, slot: int) -> None:
        """Returns all of the slot's pages."""
        self.shrink(slot, 0)

    @property
    def used(self) -> int:
        """Pages held by the slots (the scratch pages not counted)."""
        return self.pages - self.shards - sum(len(f) for f in self._free)
