"""Lower bound on the W4A16 decode: which rotate+mask layouts turn a 32-bit word of 8 e2m1 values
into its 4 bf16x2 pairs in at most LIMIT integer ops; none for 8 (docs/kernels.md).

Model: pair p's 8 value bits must land on the bf16x2 positions T (exponent low bits, mantissa top
bit, sign of both halves); the encoding (which source bit holds what) is free. Each target bit of
a pair comes from the word rotated by some r: one SHF per distinct nonzero rotation (shared by all
pairs), one LOP3 per piece (the bits a pair takes from one rotation). The packed layout of
`layout.py` costs 9: rotations {0, 4, 10, 6, 14}, pair 3 in two pieces. A global relabelling of
the encoding shifts every rotation and only lowers the cost, so rotation 0 is assumed used.

    python lab/decode_ops_bound.py 8          # prints "layouts within 8 ops: 0" (~1 min)
    python lab/decode_ops_bound.py 9 --first  # finds a 9-op layout (slower)
It first checks that the model accepts layout.py's own 9-op decode.

--two-words asks whether decoding two words together does better: a funnel shift
(SHF.R.W of the pair hi:lo) takes any 32-bit window of the 64 bits, so pairs may draw on both
words. Eight outputs need at least eight sources (each holds 8 bits at T), and eight that are
fully used would be an exact cover of the 64 bits by translates of T: none exists. Nine sources
(the two words and 7 SHF) with 9 pieces would cost 16 ops: none exists either (~2 min). So two
words cost at least 17 ops, 8.5 a word, against 18 for two single-word decodes.
    python lab/decode_ops_bound.py 16 --two-words
"""
import argparse
import itertools

N = 32
T = (6, 7, 8, 15, 22, 23, 24, 31)
FULL = (1 << N) - 1
FULL_TWO_WORDS = (1 << 2 * N) - 1


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


def two_word_sources(target=T):
    """Bit images of every source register of a two-word decode: word A (bits 0-31) or B (32-63)
    rotated within itself, or a 32-bit window of the 64 bits (one SHF each; A and B themselves
    are free). Maps a label to {target position: source bit}; sources with equal maps once."""
    found = {}
    for r in range(N):
        found.setdefault(tuple((t + r) % N for t in target), ("A", r))
        found.setdefault(tuple(N + (t + r) % N for t in target), ("B", r))
    for r in range(1, 2 * N):
        found.setdefault(tuple((t + r) % (2 * N) for t in target), ("W", r))
    return {label: dict(zip(target, bits)) for bits, label in found.items()}


def _exact_cover(options, full, max_items, required=(), acc=0, used=(), kinds=()):
    """Option labels whose bit masks partition `full`, or None. options: (label, mask, source,
    kind); at most one option per source register, at most max_items options in all, each kind
    other than "F" (a source's whole image) at most once and every kind in `required` once."""
    if acc == full:
        return [] if all(k in kinds for k in required) else None
    if len(used) == max_items:
        return None
    free = full & ~acc
    low = free & -free
    for label, mask, source, kind in options:
        if mask & low and not mask & acc and source not in used and (kind == "F" or kind not in kinds):
            rest = _exact_cover(options, full, max_items, required, acc | mask, used + (source,), kinds + (kind,))
            if rest is not None:
                return [label] + rest
    return None


def _mask(bits):
    return sum(1 << b for b in set(bits))


def _whole_images(sources):
    return [(label, _mask(m.values()), label, "F") for label, m in sources.items()]


def two_word_full_cover(target=T):
    """Eight sources, each giving all its target bits to one output: their images partition the 64
    bits (cost 8 LOP3 + at most 6 SHF). Returns one such set of source labels, or None."""
    return _exact_cover(_whole_images(two_word_sources(target)), FULL_TWO_WORDS, 8)


def two_word_nine_pieces(target=T):
    """Nine sources and nine pieces (16 ops with 7 SHF): seven outputs from one source each, one
    output from two sources splitting the target bits (`part` from one, the rest from another).
    Returns (part, labels) or None."""
    sources = two_word_sources(target)
    whole = _whole_images(sources)
    for n1 in range(1, len(target) // 2 + 1):
        for part in itertools.combinations(target, n1):
            rest = [t for t in target if t not in part]
            split = [((kind, label), _mask(m[t] for t in bits), label, kind)
                     for label, m in sources.items() for kind, bits in (("part", part), ("rest", rest))]
            got = _exact_cover(whole + split, FULL_TWO_WORDS, 9, required=("part", "rest"))
            if got is not None:
                return part, got
    return None


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("limit", type=int, help="op budget to search within (8: the claim; 9: finds one)")
    ap.add_argument("--first", action="store_true", help="stop at the first layout found")
    ap.add_argument("--two-words", action="store_true", help="two words with funnel shifts (limit 16)")
    a = ap.parse_args()
    check_model_accepts_layout_py()
    if a.two_words:
        if a.limit != 16:
            ap.error("--two-words checks the 16-op bound only")
        full, nine = two_word_full_cover(), two_word_nine_pieces()
        print(f"two words, 8 single-piece sources: {full or 'none'}; 9 sources, 9 pieces: {nine or 'none'}")
        print("two-word decodes within 16 ops:", 0 if full is None and nine is None else "found")
        raise SystemExit(0)
    print(f"layouts within {a.limit} ops: {len(layouts_within(a.limit, a.first))}")
