"""Find the upstream wheel (local file/folder, cache, or the package index) and verify its hash."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

from . import settings as build_settings
from .errors import BuildError, log

ENV_WHEEL = "SGLANG_UPSTREAM_WHEEL"
ENV_CACHE = "SGLANG_SM120_CACHE"
ENV_INDEX = "SGLANG_SM120_INDEX_URL"


def cache_dir() -> Path:
    root = build_settings.read(ENV_CACHE) or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "sglang-sm120"
    )
    return Path(root) / "upstream"


def sha256_of(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def verify(path: Path, expected: str | None) -> str:
    """Return the file's sha256; refuse when a pinned hash differs."""
    actual = sha256_of(path)
    if expected is not None and actual != expected:
        raise BuildError(f"sha256 mismatch for {path}: expected {expected}, actual {actual}")
    return actual


def _from_env(filename: str) -> Path | None:
    given = os.environ.get(ENV_WHEEL)
    if not given:
        return None
    p = Path(given).expanduser()
    if p.is_dir():
        cand = p / filename
        if not cand.is_file():
            raise BuildError(f"{ENV_WHEEL}={given}: folder has no {filename}")
        return cand
    if p.is_file():
        if p.name != filename:
            raise BuildError(f"{ENV_WHEEL}={given}: expected a file named {filename} (this interpreter's wheel)")
        return p
    raise BuildError(f"{ENV_WHEEL}={given}: no such file or folder")


def _index_files(index: str, package: str) -> dict[str, str]:
    """filename -> download URL, from the index's JSON simple API (PEP 691)."""
    url = f"{index.rstrip('/')}/{package}/"
    req = urllib.request.Request(url, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        data = json.load(r)
    return {f["filename"]: f["url"] for f in data.get("files", [])}


def download(filename: str, package: str, index: str, dest: Path) -> Path:
    index = build_settings.read(ENV_INDEX) or index
    try:
        url = _index_files(index, package).get(filename)
        if url is None:
            raise BuildError(f"{filename} is not on {index}")
        dest.parent.mkdir(parents=True, exist_ok=True)
        log(f"downloading {filename} from {index}")
        with urllib.request.urlopen(url, timeout=120) as r, tempfile.NamedTemporaryFile(
            dir=dest.parent, delete=False, suffix=".part"
        ) as tmp:
            total = int(r.headers.get("Content-Length") or 0)
            done, next_report = 0, 0.0
            while chunk := r.read(1 << 20):
                tmp.write(chunk)
                done += len(chunk)
                if total and done / total >= next_report:
                    log(f"  {done >> 20} / {total >> 20} MiB")
                    next_report += 0.25
        os.replace(tmp.name, dest)
        return dest
    except (urllib.error.URLError, OSError, ValueError) as e:
        raise BuildError(
            f"cannot download {filename} from {index} ({getattr(e, 'reason', e)}); "
            f"on an offline host set {ENV_WHEEL}=/path/to/{filename} (or a folder holding it)"
        ) from None


def fetch_pinned(pin, python_tag: str) -> tuple[Path, str]:
    """The pinned upstream wheel for a CPython tag, hash-checked against UPSTREAM.toml."""
    name = pin.wheel_for(python_tag)
    return fetch_wheel(name, pin.package, pin.index, pin.wheels[name])


def fetch_wheel(filename: str, package: str, index: str, expected_sha256: str | None) -> tuple[Path, str]:
    """Local file from the environment, else the cache, else the index; always hash-checked."""
    local = _from_env(filename)
    if local is not None:
        log(f"upstream wheel from {ENV_WHEEL}: {local}")
        return local, verify(local, expected_sha256)
    cached = cache_dir() / filename
    if cached.is_file():
        try:
            return cached, verify(cached, expected_sha256)
        except BuildError:
            log(f"cached {cached} has the wrong hash; downloading again")
            cached.unlink()
    path = download(filename, package, index, cached)
    try:
        return path, verify(path, expected_sha256)
    except BuildError:
        shutil.move(str(path), str(path) + ".bad")
        raise
