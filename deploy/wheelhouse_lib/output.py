"""Write the wheelhouse: part-NN/ folders, manifest.json, install.sh, report.txt."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from .pack import pack

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
    part: str = ""

    def as_json(self) -> dict:
        d = {"name": self.name, "version": self.version, "filename": self.filename, "sha256": self.sha256,
             "size": self.size, "part": self.part, "role": self.role, "required_by": self.required_by}
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


def _place(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)  # same filesystem as the cache: no copy needed, files are never edited in place
    except OSError:
        shutil.copy2(src, dst)


def write_wheelhouse(out: Path, wheels: list[WheelEntry], split_bytes: int, meta: dict,
                     decisions: list[dict], report_text: str) -> tuple[dict, dict[str, int]]:
    """Returns the manifest and the byte size of each part folder as written."""
    check_out_dir(out)
    names = [w.filename for w in wheels]
    if len(set(names)) != len(names):
        raise OutputError("two wheels share a file name: " + ", ".join(sorted({n for n in names if names.count(n) > 1})))
    by_file = {w.filename: w for w in wheels}
    groups = pack({w.filename: w.size for w in wheels}, split_bytes, PER_PART_RESERVE)
    parts = {}
    for i, group in enumerate(groups, 1):
        pname = f"part-{i:02d}"
        for fn in group:
            by_file[fn].part = pname
        parts[pname] = {"bytes": sum(by_file[fn].size for fn in group), "wheels": len(group)}

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

    out.mkdir(parents=True, exist_ok=True)
    _clear_previous(out)
    dir_sizes: dict[str, int] = {}
    for pname in parts:
        pdir = out / pname
        pdir.mkdir()
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
