"""Lower bound on the W4A16 decode: which rotate+mask layouts turn a 32-bit word of 8 e2m1 values
into its 4 bf16x2 pairs in at most LIMIT integer ops; none for 8 (docs/kernels.md "Sessions 18-19").

Model: pair p's 8 value bits must land on the bf16x2 positions T (exponent low bits, mantissa top
bit, sign of both halves); the encoding (which source bit holds what) is free. Each target bit of
a pair comes from the word rotated by some r: one SHF per distinct nonzero rotation (shared by all
pairs), one LOP3 per piece (the bits a pair takes from one rotation). The packed layout of
`layout.py` costs 9: rotations {0, 4, 10, 6, 14}, pair 3 in two pieces. A global relabelling of
the encoding shifts every rotation and only lowers the cost, so rotation 0 is assumed used.

    python tools/decode_ops_bound.py 8          # prints "layouts within 8 ops: 0" (~1 min)
    python tools/decode_ops_bound.py 9 --first  # finds a 9-op layout (slower)
It first checks that the model accepts layout.py's own 9-op decode.
"""
import argparse
import itertools

N = 32
T = (6, 7, 8, 15, 22, 23, 24, 31)
FULL = (1 << N) - 1


def source_mask(rotations):
    """Source bits of a pair whose target bit T[i] comes from rotation rotations[i]; None on a clash."""
    m = 0
    for t, r in zip(T, rotations):
        b = 1 << ((t + r) % N)
        if m & b:
            return None
        m |= b
    return m


# layout.py's decode as this model sees it: pairs 0-2 one piece at rotations 0, 4 and 10, pair 3
# bits 6 and 22 from rotation 14 and the rest from rotation 6 (9 ops). The model must accept it.
LAYOUT_PY = [(0,) * 8, (4,) * 8, (10,) * 8, tuple(14 if t in (6, 22) else 6 for t in T)]


def check_model_accepts_layout_py():
    masks = [source_mask(f) for f in LAYOUT_PY]
    # four 8-bit masks whose union is all 32 bits are disjoint
    assert None not in masks and masks[0] | masks[1] | masks[2] | masks[3] == FULL, "model rejects layout.py's decode"


def covers(rots, pieces_budget):
    """Whether 4 pairs, each taking its bits from some of `rots`, can cover all 32 source bits
    disjointly with at most `pieces_budget` pieces in all."""
    cheapest = {}
    for p in range(1, min(pieces_budget - 3, len(rots)) + 1):
        for image in itertools.combinations(rots, p):
            for f in itertools.product(image, repeat=8):
                if len(set(f)) != p:
                    continue
                m = source_mask(f)
                if m is not None and cheapest.get(m, 99) > p:
                    cheapest[m] = p
    by_low = {}
    for m, p in cheapest.items():
        by_low.setdefault((m & -m).bit_length() - 1, []).append((m, p))

    def cover(cov, n, pieces):
        if cov == FULL:
            return True
        if n == 4:
            return False
        free = ~cov & FULL
        low = (free & -free).bit_length() - 1  # some pair must hold the lowest free bit
        return any(cover(cov | m, n + 1, pieces + p) for m, p in by_low.get(low, [])
                   if not m & cov and pieces + p + (3 - n) <= pieces_budget)

    return cover(0, 0, 0)


def layouts_within(limit, first=False):
    """Rotation sets (0 included) that admit a decode of at most `limit` ops."""
    found = []
    for k in range(1, limit - 3 + 1):  # nonzero rotations; every pair takes >= 1 piece
        for rest in itertools.combinations(range(1, N), k):
            if covers((0,) + rest, limit - k):
                found.append((0,) + rest)
                print(f"layout within {limit} ops: rotations {found[-1]}", flush=True)
                if first:
                    return found
    return found


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("limit", type=int, help="op budget to search within (8: the claim; 9: finds one)")
    ap.add_argument("--first", action="store_true", help="stop at the first layout found")
    a = ap.parse_args()
    check_model_accepts_layout_py()
    print(f"layouts within {a.limit} ops: {len(layouts_within(a.limit, a.first))}")
