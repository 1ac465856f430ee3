"""Split wheels into parts of bounded size (first-fit decreasing); a wheel larger than a part
travels as byte pieces (piece_spans) that the installer joins and checks against its sha256."""
from __future__ import annotations


class PackError(ValueError):
    pass


def pack(sizes: dict[str, int], limit: int, reserve: int = 0) -> list[list[str]]:
    """Group the keys of `sizes` into parts whose total is <= limit - reserve.

    `reserve` keeps room in every part for the files that travel with it (manifest, installer).
    A single item larger than that is an error naming it: it can never travel in one part.
    """
    cap = limit - reserve
    if cap <= 0:
        raise PackError(f"split size {limit} bytes leaves no room after {reserve} bytes of per-part files")
    too_big = sorted((k for k, s in sizes.items() if s > cap), key=lambda k: -sizes[k])
    if too_big:
        k = too_big[0]
        raise PackError(
            f"{k} is {sizes[k] / 1e6:.1f} MB, larger than a part ({cap / 1e6:.1f} MB usable of "
            f"--split-mb {limit / 1e6:g}); split it into pieces first (piece_spans)"
            + (f" ({len(too_big) - 1} more too large)" if len(too_big) > 1 else "")
        )
    parts: list[list[str]] = []
    room: list[int] = []
    for key in sorted(sizes, key=lambda k: (-sizes[k], k)):
        for i, free in enumerate(room):
            if sizes[key] <= free:
                parts[i].append(key)
                room[i] -= sizes[key]
                break
        else:
            parts.append([key])
            room.append(cap - sizes[key])
    return [sorted(p) for p in parts]


def piece_spans(size: int, cap: int) -> list[tuple[int, int]]:
    """(offset, length) of the fewest near-equal pieces of a `size`-byte file, each <= cap."""
    if cap <= 0:
        raise PackError(f"piece size {cap} bytes: must be positive")
    count = -(-size // cap)
    step = -(-size // count)
    return [(off, min(step, size - off)) for off in range(0, size, step)]
