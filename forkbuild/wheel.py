"""Write a wheel: upstream's members (patched where the series says), the overlay, and a
dist-info that is upstream's with the fork version. Written to a temporary name and renamed,
so a failed build leaves no partial wheel behind."""
from __future__ import annotations

import base64
import csv
import hashlib
import io
import os
import re
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from .errors import BuildError

# Members keep upstream's zip timestamps; new files get this fixed one so rebuilds are identical.
FIXED_DATE = (2020, 1, 1, 0, 0, 0)


@dataclass
class Member:
    data: bytes
    mode: int = 0o644
    date: tuple = FIXED_DATE


def record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def dist_info_name(package: str, version: str) -> str:
    return f"{package}-{version}.dist-info"


def rewrite_metadata(metadata: str, version: str, add: list[str], remove: list[str]) -> str:
    """Upstream METADATA with the fork version and exactly the listed Requires-Dist changes."""
    text, n = re.subn(r"^Version: .*$", f"Version: {version}", metadata, count=1, flags=re.M)
    if n != 1:
        raise BuildError("upstream METADATA has no Version field")
    lines = text.split("\n")
    for req in remove:
        target = f"Requires-Dist: {req}"
        if target not in lines:
            raise BuildError(f"UPSTREAM.toml removes Requires-Dist '{req}', which upstream does not have")
        lines.remove(target)
    if add:
        last = max(i for i, l in enumerate(lines) if l.startswith("Requires-Dist: "))
        lines[last + 1 : last + 1] = [f"Requires-Dist: {r}" for r in add]
    return "\n".join(lines)


def write_wheel(out_dir: Path, filename: str, members: dict[str, Member], dist_info: str) -> Path:
    """Write members + RECORD; atomic rename into out_dir/filename."""
    out_dir.mkdir(parents=True, exist_ok=True)
    record_name = f"{dist_info}/RECORD"
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")  # names may hold commas: RECORD is CSV
    for name, m in members.items():
        if name != record_name:
            writer.writerow([name, record_hash(m.data), len(m.data)])
    writer.writerow([record_name, "", ""])
    record = buf.getvalue().encode()
    fd, tmp = tempfile.mkstemp(dir=out_dir, prefix=".tmp-", suffix=".whl")
    os.close(fd)
    try:
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
            for name, m in sorted(members.items(), key=lambda kv: (kv[0].startswith(dist_info), kv[0])):
                if name == record_name:
                    continue
                _write(z, name, m)
            _write(z, record_name, Member(record))
        os.chmod(tmp, 0o644)  # mkstemp's 0600 would make the wheel unreadable for others
        final = out_dir / filename
        os.replace(tmp, final)
        return final
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _write(z: zipfile.ZipFile, name: str, m: Member) -> None:
    info = zipfile.ZipInfo(name, date_time=m.date)
    info.external_attr = (m.mode & 0xFFFF) << 16
    info.compress_type = zipfile.ZIP_DEFLATED
    z.writestr(info, m.data)
