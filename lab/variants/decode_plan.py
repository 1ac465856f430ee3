"""FlashInfer's decode-plan KV split (include/flashinfer/attention/scheduler.cuh,
PartitionPagedKVCacheBinarySearchMinNumPagePerBatch, as of flashinfer 0.6), restated for the lab
variant `zero-pad-decode` (sitecustomize.py): whether padded rows of 0 pages leave a batch's split
exactly as graphs disabled plans it, and fit the captured plan's work budget.

The plan binary-searches the smallest chunk (in pages, at least 128 tokens' worth) for which the
batch's chunks fit `budget` (max grid size / KV heads); a padded row of one page takes a chunk of
the budget, one of 0 pages takes none in the search but still one work item in the final count,
and the work list is copied into buffers sized for the budget.
"""
from __future__ import annotations

from typing import Sequence, Tuple


def _chunks(pages: Sequence[int], chunk: int, at_least_one: bool) -> int:
    return sum(-(-(max(p, 1) if at_least_one else p) // chunk) for p in pages)


def split(pages: Sequence[int], budget: int, page_size: int = 1) -> Tuple[int, int]:
    """(chunk size in pages, work items) of FlashInfer's search over `pages` for `budget`."""
    low, high = max(128 // page_size, 1), max(pages, default=0)
    while low < high:
        mid = (low + high) // 2
        if _chunks(pages, mid, False) > budget:
            low = mid + 1
        else:
            high = mid
    return low, _chunks(pages, low, True)


def zero_padding_fits(real_pages: Sequence[int], padded_rows: int, budget: int, page_size: int = 1) -> bool:
    """Padded rows of 0 pages: the chunk size is the real rows' own (what graphs disabled plans)
    and the work list (real chunks plus one item per padded row) fits the budget."""
    _, items = split(real_pages, budget, page_size)
    return items + padded_rows <= budget
