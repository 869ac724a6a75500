"""The host side of a paged KV cache: which pages each sampler slot holds, and the free list.

The pool's page 0 is scratch (a slot's unfilled table entries point there; it is never
handed out). A slot takes pages as it grows (`grow`: as many as the pool allows) and gives
back those past its tokens (`shrink`, `release`), so a row holds ceil(length / page) pages
between calls. The table is copied to the device before each prefill or decode call.
"""

from __future__ import annotations

import numpy as np


class PageTable:
    """Page tables of `slots` slots over a pool of `pages` pages of `page_size` tokens, each
    slot's table `width` pages wide (its capacity)."""

    def __init__(self, slots: int, pages: int, page_size: int, width: int):
        if pages < 2:
            raise ValueError(f"a pool of {pages} pages holds none besides the scratch page 0")
        self.page_size, self.pages = page_size, pages
        self.table = np.zeros((slots, width), np.int32)  # 0: the scratch page
        self.held: list[list[int]] = [[] for _ in range(slots)]
        self.free = list(range(pages - 1, 0, -1))  # popped from the end: low ids first

    def capacity(self, slot: int) -> int:
        """Tokens the slot's pages hold."""
        return len(self.held[slot]) * self.page_size

    def room(self, slot: int, length: int) -> int:
        """Tokens a slot holding `length` could still add: its pages' spare slots and the
        free pool (shared with the other slots), within its table."""
        most = self.table.shape[1] * self.page_size
        return max(0, min(most, self.capacity(slot) + len(self.free) * self.page_size) - length)

    def grow(self, slot: int, tokens: int) -> int:
        """Takes pages until the slot holds `tokens` tokens or the pool (or its table) runs
        out; returns the tokens it holds."""
        held = self.held[slot]
        need = min(-(-tokens // self.page_size), self.table.shape[1])
        while len(held) < need and self.free:
            page = self.free.pop()
            self.table[slot, len(held)] = page
            held.append(page)
        return self.capacity(slot)

    def shrink(self, slot: int, tokens: int) -> None:
        """Returns the slot's pages past its first `tokens` tokens."""
        held = self.held[slot]
        keep = -(-tokens // self.page_size)
        while len(held) > keep:
            self.free.append(held.pop())
            self.table[slot, len(held)] = 0

    def release(self, slot: int) -> None:
        """Returns all of the slot's pages."""
        self.shrink(slot, 0)

    @property
    def used(self) -> int:
        """Pages held by the slots (the scratch page not counted)."""
        return self.pages - 1 - len(self.free)
