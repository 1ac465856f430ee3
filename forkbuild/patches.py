"""The patch series: parse git-format patches, apply them strictly, and write diffs.

Strict means every hunk must match at exactly the line its header names, context included:
no fuzz, no offset. The series is generated against the pinned upstream, so a hunk that does
not match there is a real conflict, and guessing would silently change behaviour.
"""
from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from .errors import BuildError

HEADER_FIELDS = ("Subject", "Why", "How", "Upstream status", "Drop when")
NO_NEWLINE = "\\ No newline at end of file"
_HUNK_RE = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
_FIELD_RE = re.compile(r"^(%s):\s?(.*)$" % "|".join(re.escape(f) for f in HEADER_FIELDS))


@dataclass
class Hunk:
    header: str
    old_start: int
    old_len: int
    new_start: int
    new_len: int
    lines: list[tuple[str, str]]  # (op, text incl. its newline unless the file lacks one)

    def old_lines(self) -> list[str]:
        return [t for op, t in self.lines if op in " -"]

    def new_lines(self) -> list[str]:
        return [t for op, t in self.lines if op in " +"]


@dataclass
class FileDiff:
    path: str
    hunks: list[Hunk]
    old_missing: bool = False  # "--- /dev/null": the patch creates the file
    new_missing: bool = False  # "+++ /dev/null": the patch deletes the file


@dataclass
class Patch:
    name: str
    preamble: str  # everything before the first "diff --git", kept verbatim on refresh
    fields: dict[str, str]
    files: list[FileDiff] = field(default_factory=list)
    raw_body: str = ""  # the diff text after the preamble, verbatim

    @property
    def subject(self) -> str:
        return re.sub(r"^\[PATCH[^\]]*\]\s*", "", self.fields.get("Subject", ""))


def read_series(patch_dir: Path) -> list[str]:
    series = patch_dir / "series"
    if not series.is_file():
        raise BuildError(f"{series}: missing")
    names = []
    for n, raw in enumerate(series.read_text().splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if not (patch_dir / line).is_file():
            raise BuildError(f"{series}:{n}: '{line}' names no file in {patch_dir}")
        if line in names:
            raise BuildError(f"{series}:{n}: '{line}' is listed twice")
        names.append(line)
    return names


def load_series(patch_dir: Path) -> list[Patch]:
    return [parse_patch(name, (patch_dir / name).read_text()) for name in read_series(patch_dir)]


def _parse_fields(name: str, preamble: str) -> dict[str, str]:
    fields: dict[str, str] = {}
    current = None
    for line in preamble.splitlines():
        if line.strip() == "---":
            break
        m = _FIELD_RE.match(line)
        if m:
            current = m.group(1)
            fields[current] = m.group(2).strip()
        elif current and line.strip() and current != "Subject":
            fields[current] += " " + line.strip()
        elif not line.strip():
            current = None
    missing = [f for f in HEADER_FIELDS if not fields.get(f)]
    if missing:
        raise BuildError(f"malformed patch {name}: header lacks {', '.join(missing)}")
    return fields


def parse_patch(name: str, text: str) -> Patch:
    start = text.find("\ndiff --git ")
    if start < 0:
        raise BuildError(f"malformed patch {name}: no 'diff --git' section")
    preamble, body = text[: start + 1], text[start + 1 :]
    patch = Patch(name, preamble, _parse_fields(name, preamble), raw_body=body)
    lines = body.splitlines(keepends=True)
    i = 0

    def bad(msg: str) -> BuildError:
        return BuildError(f"malformed patch {name}: line {preamble.count(chr(10)) + i + 1}: {msg}")

    while i < len(lines):
        line = lines[i]
        if not line.startswith("diff --git "):
            if line.strip() in ("", "--") or re.match(r"^\d+\.\d+", line.strip()):
                i += 1  # format-patch trailer ("-- " + version)
                continue
            raise bad(f"expected 'diff --git', found {line.rstrip()!r}")
        i += 1
        old = new = None
        while i < len(lines) and not lines[i].startswith("@@"):
            if lines[i].startswith("--- "):
                old = lines[i][4:].strip()
            elif lines[i].startswith("+++ "):
                new = lines[i][4:].strip()
            elif lines[i].startswith("diff --git "):
                break
            i += 1
        if old is None or new is None:
            raise bad("file section without '---'/'+++' lines")
        path = (new if new != "/dev/null" else old)
        if not path.startswith(("a/", "b/")):
            raise bad(f"path {path!r} lacks the a/ or b/ prefix")
        fd = FileDiff(path[2:], [], old_missing=old == "/dev/null", new_missing=new == "/dev/null")
        while i < len(lines) and lines[i].startswith("@@"):
            m = _HUNK_RE.match(lines[i])
            if not m:
                raise bad(f"bad hunk header {lines[i].rstrip()!r}")
            h = Hunk(
                f"@@ {lines[i].split('@@')[1].strip()} @@",
                int(m.group(1)), int(m.group(2) if m.group(2) is not None else 1),
                int(m.group(3)), int(m.group(4) if m.group(4) is not None else 1), [],
            )
            i += 1
            n_old = n_new = 0
            while i < len(lines) and (n_old < h.old_len or n_new < h.new_len):
                line = lines[i]
                op, text = line[:1], line[1:]
                if line in ("\n",):  # an empty context line whose leading space was stripped
                    op, text = " ", "\n"
                if op not in " +-":
                    raise bad(f"hunk {h.header}: line counts do not match its header")
                h.lines.append((op, text))
                n_old += op in " -"
                n_new += op in " +"
                i += 1
                if i < len(lines) and lines[i].startswith("\\"):
                    h.lines[-1] = (op, text.rstrip("\n"))
                    i += 1
            if n_old != h.old_len or n_new != h.new_len:
                raise bad(f"hunk {h.header}: line counts do not match its header")
            fd.hunks.append(h)
        if not fd.hunks:
            raise bad(f"{fd.path}: no hunks")
        patch.files.append(fd)
    if not patch.files:
        raise BuildError(f"malformed patch {name}: no file diffs")
    return patch


def apply_file(patch: Patch, fd: FileDiff, text: str) -> str:
    lines = text.splitlines(keepends=True)
    delta = 0
    for n, h in enumerate(fd.hunks, 1):
        old = h.old_lines()
        pos = (h.old_start if h.old_len == 0 else h.old_start - 1) + delta
        found = lines[pos : pos + len(old)]
        if found != old:
            mismatch = next(
                (k for k in range(len(old)) if k >= len(found) or found[k] != old[k]), len(old)
            )
            got = found[mismatch].rstrip("\n") if mismatch < len(found) else "<end of file>"
            want = old[mismatch].rstrip("\n") if mismatch < len(old) else ""
            raise BuildError(
                f"patch {patch.name}: {fd.path}: hunk #{n} ({h.header}) does not apply at line "
                f"{pos + mismatch + 1}: expected {want!r}, found {got!r}"
            )
        lines[pos : pos + len(old)] = h.new_lines()
        delta += h.new_len - h.old_len
    return "".join(lines)


def apply_patch(patch: Patch, read: Callable[[str], str | None], state: dict[str, str]) -> None:
    """Apply one patch onto `state` (path -> text), reading untouched files through `read`."""
    for fd in patch.files:
        if fd.old_missing or fd.new_missing:
            what = "creates" if fd.old_missing else "deletes"
            raise BuildError(
                f"patch {patch.name}: {what} {fd.path}: patches may only change upstream files "
                "(new modules belong in the overlay)"
            )
        text = state[fd.path] if fd.path in state else read(fd.path)
        if text is None:
            raise BuildError(f"patch {patch.name}: touches {fd.path}, which upstream lacks")
        state[fd.path] = apply_file(patch, fd, text)


def apply_series(patches: list[Patch], read: Callable[[str], str | None]) -> dict[str, str]:
    state: dict[str, str] = {}
    for p in patches:
        apply_patch(p, read, state)
    return state


def _range(start: int, stop: int) -> str:
    length = stop - start
    first = start + 1 if length else start
    return str(first) if length == 1 else f"{first},{length}"


def file_diff(path: str, old: str, new: str, context: int = 3) -> str:
    """A git-style unified diff of one file ('' when equal)."""
    a, b = old.splitlines(keepends=True), new.splitlines(keepends=True)
    out = []
    for group in difflib.SequenceMatcher(None, a, b, autojunk=False).get_grouped_opcodes(context):
        i1, i2, j1, j2 = group[0][1], group[-1][2], group[0][3], group[-1][4]
        out.append(f"@@ -{_range(i1, i2)} +{_range(j1, j2)} @@\n")
        for tag, x1, x2, y1, y2 in group:
            if tag == "equal":
                out += [_line(" ", t) for t in a[x1:x2]]
                continue
            out += [_line("-", t) for t in a[x1:x2]]
            out += [_line("+", t) for t in b[y1:y2]]
    if not out:
        return ""
    return f"diff --git a/{path} b/{path}\n--- a/{path}\n+++ b/{path}\n" + "".join(out)


def _line(op: str, text: str) -> str:
    return f"{op}{text}" if text.endswith("\n") else f"{op}{text}\n{NO_NEWLINE}\n"


def render(preamble: str, diffs: list[str]) -> str:
    return preamble + "".join(diffs)


def new_preamble(fields: dict[str, str]) -> str:
    missing = [f for f in HEADER_FIELDS if not fields.get(f)]
    if missing:
        raise BuildError(f"patch header lacks {', '.join(missing)}")
    body = "\n".join(f"{k}: {fields[k]}" for k in HEADER_FIELDS[1:])
    return (
        "From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\n"
        "From: sglang-sm120 <dev@sglang-sm120.invalid>\n"
        f"Subject: [PATCH] {fields['Subject']}\n\n{body}\n---\n"
    )
