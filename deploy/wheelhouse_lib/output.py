"""Write the wheelhouse: part-NN/ folders, manifest.json, install.sh, report.txt.

A wheel larger than a part is written as pieces (FILE.piece-I-of-N, each in some part); its
manifest entry lists them with their own sha256, and install.sh joins them into joined/FILE."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from .pack import pack, piece_spans

INSTALL_SH = Path(__file__).with_name("install.sh")
PER_PART_RESERVE = 512 * 1024  # manifest.json + install.sh copies travel in every part
OUR_FILES = ("manifest.json", "install.sh", "report.txt")


class OutputError(RuntimeError):
    pass


@dataclass
class WheelEntry:
    name: str
    version: str
    filename: str
    path: Path  # the file to place in the part (cache copy or rewritten copy)
    sha256: str
    size: int
    role: str  # dependency | upstream | fork
    required_by: list[str] = field(default_factory=list)
    modified: dict | None = None
    part: str = ""  # "" when the wheel travels as pieces
    pieces: list[dict] = field(default_factory=list)  # {file, part, offset, size, sha256}

    def as_json(self) -> dict:
        d = {"name": self.name, "version": self.version, "filename": self.filename, "sha256": self.sha256,
             "size": self.size, "part": self.part, "role": self.role, "required_by": self.required_by}
        if self.pieces:
            d["pieces"] = [{k: p[k] for k in ("file", "part", "size", "sha256")} for p in self.pieces]
        if self.modified:
            d["modified"] = self.modified
        return d


def check_out_dir(out: Path) -> None:
    """Refuse to write into a non-empty folder that is not an earlier wheelhouse."""
    if out.exists() and not out.is_dir():
        raise OutputError(f"--out {out}: exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not (out / "manifest.json").is_file():
        raise OutputError(f"--out {out}: not empty and holds no manifest.json (not a wheelhouse); choose another directory")


def _clear_previous(out: Path) -> None:
    for p in out.glob("part-*"):
        if p.is_dir():
            shutil.rmtree(p)
    for name in OUR_FILES:
        (out / name).unlink(missing_ok=True)
    shutil.rmtree(out / "joined", ignore_errors=True)


def _place(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)  # same filesystem as the cache: no copy needed, files are never edited in place
    except OSError:
        shutil.copy2(src, dst)


def _write_piece(src: Path, offset: int, size: int, dst: Path) -> str:
    with open(src, "rb") as f:
        f.seek(offset)
        data = f.read(size)
    if len(data) != size:
        raise OutputError(f"{src}: short read at byte {offset} (the file changed while writing the wheelhouse?)")
    dst.write_bytes(data)
    return hashlib.sha256(data).hexdigest()


def _items(wheels: list[WheelEntry], cap: int) -> dict[str, int]:
    """What pack() places: whole wheels, and the pieces of every wheel larger than `cap` (set
    here as each wheel's `pieces`; parts are assigned after packing)."""
    items = {}
    for w in wheels:
        w.part, w.pieces = "", []
        if w.size <= cap:
            items[w.filename] = w.size
            continue
        spans = piece_spans(w.size, cap)
        for i, (offset, size) in enumerate(spans, 1):
            piece = {"file": f"{w.filename}.piece-{i}-of-{len(spans)}", "offset": offset, "size": size}
            w.pieces.append(piece)
            items[piece["file"]] = size
    return items


def write_wheelhouse(out: Path, wheels: list[WheelEntry], split_bytes: int, meta: dict,
                     decisions: list[dict], report_text: str) -> tuple[dict, dict[str, int]]:
    """Returns the manifest and the byte size of each part folder as written."""
    check_out_dir(out)
    names = [w.filename for w in wheels]
    if len(set(names)) != len(names):
        raise OutputError("two wheels share a file name: " + ", ".join(sorted({n for n in names if names.count(n) > 1})))
    items = _items(wheels, split_bytes - PER_PART_RESERVE)
    by_file = {w.filename: w for w in wheels}
    by_piece = {p["file"]: p for w in wheels for p in w.pieces}
    groups = pack(items, split_bytes, PER_PART_RESERVE)
    parts = {}
    for i, group in enumerate(groups, 1):
        pname = f"part-{i:02d}"
        for fn in group:
            if fn in by_file:
                by_file[fn].part = pname
            else:
                by_piece[fn]["part"] = pname
        parts[pname] = {"bytes": sum(items[fn] for fn in group), "wheels": sum(fn in by_file for fn in group),
                        "pieces": sum(fn in by_piece for fn in group)}
    out.mkdir(parents=True, exist_ok=True)
    _clear_previous(out)
    for pname in parts:
        (out / pname).mkdir()
    for w in wheels:
        for p in w.pieces:
            p["sha256"] = _write_piece(w.path, p["offset"], p["size"], out / p["part"] / p["file"])

    ident = hashlib.sha256("\n".join(f"{w.filename} {w.sha256}" for w in sorted(wheels, key=lambda w: w.filename)).encode()).hexdigest()
    manifest = {
        "format": 1,
        "id": ident[:16],
        **meta,
        "split_bytes": split_bytes,
        "parts": parts,
        "wheels": [w.as_json() for w in sorted(wheels, key=lambda w: (w.part, w.name))],
        "decisions": decisions,
    }
    text = json.dumps(manifest, indent=1, sort_keys=False) + "\n"

    dir_sizes: dict[str, int] = {}
    for pname in parts:
        pdir = out / pname
        for w in wheels:
            if w.part == pname:
                _place(w.path, pdir / w.filename)
        (pdir / "manifest.json").write_text(text)
        shutil.copyfile(INSTALL_SH, pdir / "install.sh")
        os.chmod(pdir / "install.sh", 0o755)
        total = sum(f.stat().st_size for f in pdir.iterdir())
        dir_sizes[pname] = total
        if total > split_bytes:
            raise OutputError(f"{pdir} is {total} bytes, over the split size {split_bytes}; this is a bug in packing")
    (out / "manifest.json").write_text(text)
    shutil.copyfile(INSTALL_SH, out / "install.sh")
    os.chmod(out / "install.sh", 0o755)
    (out / "report.txt").write_text(report_text)
    return manifest, dir_sizes
