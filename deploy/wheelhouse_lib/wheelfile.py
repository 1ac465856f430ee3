"""Read wheel metadata and rewrite wheels (policy slims and edits) with a correct RECORD."""
from __future__ import annotations

import base64
import csv
import hashlib
import io
import re
import shutil
import zipfile
from email.parser import Parser
from pathlib import Path

from .policy import Edit, Slim


class WheelError(RuntimeError):
    pass


def dist_info_dir(zf: zipfile.ZipFile, path: Path) -> str:
    dirs = {n.split("/", 1)[0] for n in zf.namelist() if n.split("/", 1)[0].endswith(".dist-info")}
    if len(dirs) != 1:
        raise WheelError(f"{path.name}: expected one .dist-info directory, found {sorted(dirs) or 'none'}")
    return dirs.pop()


def read_metadata(path: Path) -> tuple[str, str, list[str]]:
    """(Name, Version, Requires-Dist list) from a wheel's METADATA."""
    try:
        with zipfile.ZipFile(path) as zf:
            text = zf.read(f"{dist_info_dir(zf, path)}/METADATA").decode("utf-8")
    except (zipfile.BadZipFile, KeyError) as e:
        raise WheelError(f"{path}: not a readable wheel ({e})") from None
    msg = Parser().parsestr(text, headersonly=True)
    if not msg.get("Name") or not msg.get("Version"):
        raise WheelError(f"{path}: METADATA lacks Name or Version")
    return msg["Name"], msg["Version"], list(msg.get_all("Requires-Dist") or [])


def record_hash(data_or_digest: bytes, is_digest: bool = False) -> str:
    digest = data_or_digest if is_digest else hashlib.sha256(data_or_digest).digest()
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def _matches(entry: str, pattern: str) -> bool:
    return entry.startswith(pattern) if pattern.endswith("/") else entry == pattern


def _copy_info(info: zipfile.ZipInfo) -> zipfile.ZipInfo:
    new = zipfile.ZipInfo(info.filename, date_time=info.date_time)
    new.compress_type = info.compress_type
    new.external_attr = info.external_attr  # keeps the executable bit of .so files and scripts
    new.create_system = info.create_system
    return new


def rewrite_wheel(src: Path, dst: Path, slim: Slim | None = None, edits: list[Edit] = ()) -> dict:
    """Copy `src` to `dst` without the slimmed paths and with the edits applied.

    Every remove path and every edit must take effect exactly as the policy says (a path that
    matches nothing, or a pattern matching a different number of times, means the policy no
    longer fits the wheel and is an error). RECORD is regenerated from the written bytes.
    Returns a description of the change for the manifest.
    """
    removed: list[str] = []
    removed_bytes = 0
    edited: list[dict] = []
    with zipfile.ZipFile(src) as zin:
        di = dist_info_dir(zin, src)
        record_name = f"{di}/RECORD"
        signatures = {f"{di}/RECORD.jws", f"{di}/RECORD.p7s"}
        infos = zin.infolist()
        names = {i.filename for i in infos}
        if slim is not None:
            for pattern in slim.remove:
                if not any(_matches(n, pattern) for n in names):
                    raise WheelError(f"{src.name}: slim path {pattern!r} is not in the wheel; update the policy")
        edit_by_file: dict[str, list[Edit]] = {}
        for e in edits:
            fname = e.file.format(dist_info=di)
            if fname not in names:
                raise WheelError(f"{src.name}: {e.label}: {fname} is not in the wheel; update the policy")
            edit_by_file.setdefault(fname, []).append(e)

        dst.parent.mkdir(parents=True, exist_ok=True)
        tmp = dst.with_name(dst.name + ".part")
        rows: list[list[str]] = []
        with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as zout:
            for info in infos:
                name = info.filename
                if name == record_name or name in signatures:
                    continue  # regenerated below; signatures over the old RECORD would be invalid
                if slim is not None and any(_matches(name, p) for p in slim.remove):
                    removed.append(name)
                    removed_bytes += info.file_size
                    continue
                if info.is_dir():
                    zout.writestr(_copy_info(info), b"")
                    continue
                if name in edit_by_file:
                    text = zin.read(info).decode("utf-8")
                    for e in edit_by_file[name]:
                        text, n = re.subn(e.pattern, e.replacement, text)
                        if n != e.count:
                            raise WheelError(
                                f"{src.name}: {e.label}: pattern matched {n} time(s) in {name}, policy expects "
                                f"{e.count}; update the policy"
                            )
                        edited.append({"file": name, "pattern": e.pattern, "replacement": e.replacement,
                                       "matches": n, "reason": e.reason})
                    data = text.encode("utf-8")
                    zout.writestr(_copy_info(info), data)
                    rows.append([name, record_hash(data), str(len(data))])
                    continue
                h = hashlib.sha256()
                size = 0
                with zin.open(info) as fin, zout.open(_copy_info(info), "w", force_zip64=info.file_size > 0x7FFFFFFF) as fout:
                    for chunk in iter(lambda: fin.read(1 << 20), b""):
                        h.update(chunk)
                        size += len(chunk)
                        fout.write(chunk)
                rows.append([name, record_hash(h.digest(), is_digest=True), str(size)])
            rows.append([record_name, "", ""])
            buf = io.StringIO()
            csv.writer(buf, lineterminator="\n").writerows(rows)
            rinfo = zipfile.ZipInfo(record_name, date_time=infos[0].date_time if infos else (1980, 1, 1, 0, 0, 0))
            rinfo.compress_type = zipfile.ZIP_DEFLATED
            rinfo.external_attr = 0o644 << 16
            zout.writestr(rinfo, buf.getvalue().encode("utf-8"))
        shutil.move(tmp, dst)
    verify_record(dst)
    return {"removed": removed, "removed_bytes": removed_bytes, "edited": edited}


def verify_record(path: Path) -> int:
    """Check that RECORD lists every file with its true sha256 and size; returns the file count."""
    with zipfile.ZipFile(path) as zf:
        di = dist_info_dir(zf, path)
        record_name = f"{di}/RECORD"
        try:
            rows = list(csv.reader(io.StringIO(zf.read(record_name).decode("utf-8"))))
        except KeyError:
            raise WheelError(f"{path.name}: no {record_name}") from None
        listed = {r[0]: r for r in rows if r}
        files = [i for i in zf.infolist() if not i.is_dir()]
        for info in files:
            if info.filename == record_name:
                continue
            row = listed.get(info.filename)
            if row is None:
                raise WheelError(f"{path.name}: {info.filename} is missing from RECORD")
            data = zf.read(info)
            if row[1] != record_hash(data) or row[2] != str(len(data)):
                raise WheelError(f"{path.name}: RECORD hash/size of {info.filename} does not match its content")
        present = {i.filename for i in files}
        for name in listed:
            if name not in present:
                raise WheelError(f"{path.name}: RECORD lists {name}, which is not in the wheel")
        return len(files)


def pth_files(path: Path) -> list[str]:
    """Top-level .pth files: with PYTHONPATH installs they are not processed (only site dirs are)."""
    with zipfile.ZipFile(path) as zf:
        return [n for n in zf.namelist() if "/" not in n and n.endswith(".pth")]
