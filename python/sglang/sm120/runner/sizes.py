"""Which sizes the layerwise runner captures, and how a live size maps onto them.

Pure Python (no torch, no sglang) so the planning rules are unit-tested on any machine.

Decode sizes are batch sizes. Below the full-graph ceiling the default plan keeps upstream's
full graphs (a captured MoE is cheapest where the host would otherwise outrun the GPU); above
it, up to LAYERWISE_DECODE_MAX_BS, sizes are captured layerwise with buckets that get coarser as
the batch grows (relative padding stays <= ~12%). Prefill sizes are token buckets up to the
chunked prefill size on a ~1.5x ladder, so a replay never pads more than 2x (upstream's prefill
runner rejects a larger padding factor and runs such batches eagerly).
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Iterable, List, Optional, Sequence

# Above upstream's usual ceiling (256 on 80-160 GB cards) the point of layerwise decode is to
# reach the batch sizes a high-concurrency server actually runs at.
LAYERWISE_DECODE_MAX_BS = 1024

# Prefill bucket ladder (tokens): ratio <= 1.5 between neighbours from 64 up.
_PREFILL_LADDER = (8, 16, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048,
                   3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768)


def upstream_decode_sizes(max_bs: int) -> List[int]:
    """Upstream 0.5.16's default decode capture list (non-speculative, padding on), up to max_bs.

    Restated from the documented schedule in ServerArgs._generate_decode_cuda_graph_batch_sizes
    so the planner does not need sglang importable: 1,2,4,8,12, then every 8 up to 256, every 16
    below 512, every 32 from 512; max_bs itself is always included.
    """
    if max_bs < 1:
        raise ValueError(f"decode max batch size must be >= 1, got {max_bs}")
    sizes = [1, 2, 4, 8, 12] + list(range(16, 257, 8)) + list(range(272, 512, 16))
    sizes += list(range(512, max_bs + 1, 32))
    sizes = [s for s in sizes if s <= max_bs]
    if max_bs not in sizes:
        sizes.append(max_bs)
    return sorted(set(sizes))


def layerwise_decode_buckets(low_exclusive: int, high: int) -> List[int]:
    """Decode buckets in (low_exclusive, high]: multiples of 32 up to 512, of 64 above.

    Coarser than upstream's list above 256 on purpose: every captured size costs capture time
    and one graph per layer; at these batch sizes a <=12% padded tail costs little.
    """
    if high <= low_exclusive:
        return []
    sizes = [s for s in range(32, 513, 32) if low_exclusive < s <= high]
    sizes += [s for s in range(576, high + 1, 64) if s > low_exclusive]
    if high not in sizes:
        sizes.append(high)
    return sorted(set(sizes))


def prefill_buckets(max_tokens: int, min_tokens: int = 1) -> List[int]:
    """Prefill token buckets up to max_tokens on a <=1.5x ladder; max_tokens always included."""
    if max_tokens < 1:
        raise ValueError(f"prefill max tokens must be >= 1, got {max_tokens}")
    sizes = [s for s in _PREFILL_LADDER if min_tokens <= s <= max_tokens]
    top = _PREFILL_LADDER[-1]
    while top < max_tokens:  # beyond the table: keep alternating x1.5 / x1.33
        top = top * 3 // 2 if top % 3 else top * 4 // 3
        if top <= max_tokens:
            sizes.append(top)
    if max_tokens not in sizes:
        sizes.append(max_tokens)
    return sorted(set(sizes))


@dataclass(frozen=True)
class DecodePlan:
    """Decode sizes split into upstream full graphs (<= full_max_bs) and layerwise ones."""

    sizes: tuple  # every captured batch size, ascending
    full_max_bs: int  # sizes <= this use a full graph; 0 = layerwise at every size

    def __post_init__(self):
        if list(self.sizes) != sorted(set(self.sizes)) or not self.sizes or self.sizes[0] < 1:
            raise ValueError(f"decode sizes must be ascending, unique and >= 1: {self.sizes}")
        if self.full_max_bs < 0:
            raise ValueError(f"full_max_bs must be >= 0, got {self.full_max_bs}")

    @property
    def full_sizes(self) -> List[int]:
        return [s for s in self.sizes if s <= self.full_max_bs]

    @property
    def layerwise_sizes(self) -> List[int]:
        return [s for s in self.sizes if s > self.full_max_bs]

    @property
    def max_bs(self) -> int:
        return self.sizes[-1]


def plan_decode(
    *,
    ceiling: int,
    every_size: bool,
    max_bs: Optional[int] = None,
    explicit_sizes: Optional[Sequence[int]] = None,
) -> DecodePlan:
    """Decode plan for the layerwise backend.

    ceiling: the full-graph ceiling (upstream's memory-derived decode max_bs, or the user's).
    every_size: capture every size layerwise (no full graphs), e.g. when the MoE cannot be
        captured or the operator asks for it.
    max_bs: the largest decode batch to capture (default LAYERWISE_DECODE_MAX_BS, never below
        the ceiling).
    explicit_sizes: an operator-given size list; kept as is, split by the ceiling.
    """
    if ceiling < 1:
        raise ValueError(f"full-graph ceiling must be >= 1, got {ceiling}")
    top = LAYERWISE_DECODE_MAX_BS if max_bs is None else max_bs
    if top < 1:
        raise ValueError(f"decode max batch size must be >= 1, got {top}")
    if explicit_sizes:
        bad = [s for s in explicit_sizes if int(s) < 1]
        if bad:
            raise ValueError(f"decode batch sizes must be >= 1, got {bad}")
        sizes = sorted({int(s) for s in explicit_sizes})
    else:
        low = upstream_decode_sizes(min(ceiling, top))
        sizes = sorted(set(low) | set(layerwise_decode_buckets(min(ceiling, top), top)))
    return DecodePlan(sizes=tuple(sizes), full_max_bs=0 if every_size else min(ceiling, sizes[-1]))


@dataclass(frozen=True)
class PrefillPlan:
    """Prefill token buckets plus the fixed request-slot count of captured-attention mode."""

    buckets: tuple
    req_slots: int

    def __post_init__(self):
        if list(self.buckets) != sorted(set(self.buckets)) or not self.buckets:
            raise ValueError(f"prefill buckets must be ascending and unique: {self.buckets}")
        if self.buckets[0] < 1:
            raise ValueError(f"prefill buckets must be >= 1: {self.buckets}")
        if self.req_slots < 1:
            raise ValueError(f"prefill request slots must be >= 1, got {self.req_slots}")


def default_prefill_req_slots(chunked_prefill_size: int, max_running_requests: Optional[int]) -> int:
    """Request slots baked into captured-attention prefill graphs.

    More slots let more requests share one prefill replay (a batch with more requests than slots
    runs eagerly); each slot costs one zero-length attention work item. chunk/128 keeps a chunk
    of 128-token prompts on the graph path.
    """
    slots = max(16, int(chunked_prefill_size) // 128) if chunked_prefill_size > 0 else 16
    if max_running_requests:
        slots = min(slots, int(max_running_requests))
    return max(1, slots)


def plan_prefill(
    *,
    max_tokens: int,
    explicit_buckets: Optional[Iterable[int]] = None,
    req_slots: int,
) -> PrefillPlan:
    if explicit_buckets:
        raw = [int(b) for b in explicit_buckets]
        bad = [b for b in raw if b < 1]
        if bad:
            raise ValueError(f"prefill token buckets must be >= 1, got {bad}")
        buckets = sorted(set(raw))
    else:
        buckets = prefill_buckets(max_tokens)
    return PrefillPlan(buckets=tuple(buckets), req_slots=req_slots)


def pad_to_bucket(size: int, buckets: Sequence[int]) -> Optional[int]:
    """Smallest bucket >= size, or None when size is above every bucket."""
    if size < 0:
        raise ValueError(f"size must be >= 0, got {size}")
    i = bisect.bisect_left(buckets, size)
    return buckets[i] if i < len(buckets) else None


@dataclass
class SizeLedger:
    """Captured / dropped bookkeeping for one runner (largest-first capture, OOM drops)."""

    planned: List[int]
    captured: List[int] = field(default_factory=list)
    dropped: List[int] = field(default_factory=list)

    def capture_order(self) -> List[int]:
        return sorted(self.planned, reverse=True)

    def mark_captured(self, size: int) -> None:
        if size in self.dropped:
            raise ValueError(f"size {size} was dropped and cannot be captured")
        if size not in self.captured:
            self.captured.append(size)

    def drop_from(self, size: int) -> List[int]:
        """Drop `size` and every planned size above it; returns the newly dropped sizes
        (captured ones among them must be released by the caller)."""
        newly = [s for s in self.planned if s >= size and s not in self.dropped]
        self.dropped.extend(newly)
        self.captured = [s for s in self.captured if s < size]
        return sorted(newly)

    def is_dropped(self, size: int) -> bool:
        return size in self.dropped

    def servable(self) -> List[int]:
        return sorted(self.captured)
