"""pip as the wheel finder and downloader for a target other than the running interpreter.

Selection: `pip install --dry-run --no-deps --ignore-installed --report` with the target's
--python-version/--platform list; pip's report carries each chosen wheel's URL, sha256 and
Requires-Dist. pip evaluates markers and (in `install`, unlike `download`) Requires-Python for
the running interpreter, not the target. So markers are left to resolve.py (--no-deps), and
Requires-Python is ignored by pip and checked here against the target: a release that does
not support the target's Python is excluded (`!=V`) and the selection repeated.
Download: `pip download --no-deps --require-hashes` into a cache directory, so the user's pip
configuration (index, proxy, certificates, credentials) applies and reruns are fast.
"""
from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable
from urllib.parse import unquote

from .compat import InvalidSpecifier, Requirement, SpecifierSet, canonicalize_name
from .hostenv import Target
from .resolve import Candidate


class PipError(RuntimeError):
    pass


def sha256_of(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _last_error(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("WARNING: Location")]
    errs = [ln for ln in lines if ln.startswith("ERROR:")]
    return (errs[-1] if errs else (lines[-1] if lines else "pip failed without a message"))[:400]


class PipSelector:
    def __init__(self, target: Target, python: str = sys.executable, log: Callable[[str], None] = print):
        self.target = target
        self.python = python
        self.log = log
        self.cache: dict[str, Candidate | str] = {}  # requirement text -> answer; survives restarts
        self.calls = 0

    def _target_args(self) -> list[str]:
        args = ["--only-binary=:all:", "--python-version", self.target.python, "--implementation", "cp"]
        for plat in self.target.platforms():
            args += ["--platform", plat]
        return args

    def _dry_run(self, reqs: list[str]) -> tuple[dict[str, Candidate] | None, str]:
        self.calls += 1
        with tempfile.TemporaryDirectory(prefix="wheelhouse-select-") as tmp:
            report = Path(tmp) / "report.json"
            cmd = [self.python, "-m", "pip", "install", "--dry-run", "--no-deps", "--ignore-installed",
                   "--disable-pip-version-check", "--no-input", "--quiet", "--ignore-requires-python",
                   *self._target_args(),
                   "--target", str(Path(tmp) / "t"), "--report", str(report), *reqs]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0 or not report.exists():
                return None, _last_error(proc.stderr + proc.stdout)
            data = json.loads(report.read_text())
        out = {}
        for item in data.get("install", []):
            meta = item["metadata"]
            info = item.get("download_info", {})
            url = info.get("url", "")
            hashes = info.get("archive_info", {}).get("hashes", {})
            sha = hashes.get("sha256")
            if sha is None and info.get("archive_info", {}).get("hash", "").startswith("sha256="):
                sha = info["archive_info"]["hash"].split("=", 1)[1]
            out[canonicalize_name(meta["name"])] = Candidate(
                name=meta["name"], version=meta["version"], requires_dist=list(meta.get("requires_dist") or []),
                filename=unquote(url.rsplit("/", 1)[-1].split("#", 1)[0]), url=url, sha256=sha,
                requires_python=meta.get("requires_python") or "",
            )
        return out, ""

    def _supports_target(self, cand: Candidate) -> bool:
        if not cand.requires_python:
            return True
        try:
            return SpecifierSet(cand.requires_python).contains(self.target.python_full, prereleases=True)
        except InvalidSpecifier:
            return True  # unreadable Requires-Python: pip itself would ignore it too

    def _select_uncached(self, pending: dict[str, str]) -> dict[str, Candidate | str]:
        found, _ = self._dry_run(list(pending.values()))
        answers: dict[str, Candidate | str] = {}
        if found is None:
            # One bad requirement fails the whole batch: ask one at a time to know which.
            for key, req in pending.items():
                one, one_err = self._dry_run([req])
                answers[key] = one[key] if one and key in one else (one_err or f"pip chose nothing for {req}")
        else:
            for key, req in pending.items():
                answers[key] = found.get(key, f"pip chose nothing for {req}")
        return answers

    def select(self, requirements: dict[str, str], max_python_skips: int = 30) -> dict[str, Candidate | str]:
        todo = {k: r for k, r in requirements.items() if r not in self.cache}
        asked = dict(todo)  # key -> the caller's requirement text (cache key)
        skipped: dict[str, list[str]] = {k: [] for k in todo}
        while todo:
            answers = self._select_uncached(todo)
            retry = {}
            for key, ans in answers.items():
                if isinstance(ans, Candidate) and not self._supports_target(ans):
                    skipped[key].append(ans.version)
                    if len(skipped[key]) >= max_python_skips:
                        ans = (f"no release of {asked[key]} supports Python {self.target.python} among the newest "
                               f"{max_python_skips} tried (last Requires-Python {ans.requires_python})")
                    else:
                        req = Requirement(todo[key])
                        req.specifier &= SpecifierSet(f"!={ans.version}")
                        retry[key] = str(req)
                        continue
                if isinstance(ans, Candidate) and skipped[key]:
                    self.log(f"  {ans.name}: newer release(s) {', '.join(skipped[key])} need another Python "
                             f"than {self.target.python}; picked {ans.version}")
                self.cache[asked[key]] = ans
            todo = retry
        return {k: self.cache[r] for k, r in requirements.items()}

    def download(self, wanted: list[Candidate], cache_dir: Path) -> dict[str, Path]:
        """Fetch every wanted wheel into cache_dir (reusing verified copies); filename -> path."""
        cache_dir.mkdir(parents=True, exist_ok=True)
        need = []
        for c in wanted:
            path = cache_dir / c.filename
            if path.exists() and c.sha256 and sha256_of(path) == c.sha256:
                continue
            if path.exists():
                path.unlink()  # stale or unverifiable copy
            need.append(c)
        self.log(f"download: {len(wanted) - len(need)} of {len(wanted)} wheels already in {cache_dir}"
                 + (f", fetching {len(need)}" if need else ""))
        if need:
            with tempfile.TemporaryDirectory(prefix="wheelhouse-dl-") as tmp:
                reqfile = Path(tmp) / "requirements.txt"
                hashed = all(c.sha256 for c in need)
                lines = [f"{c.name}=={c.version}" + (f" --hash=sha256:{c.sha256}" if hashed else "") for c in need]
                reqfile.write_text("\n".join(lines) + "\n")
                cmd = [self.python, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
                       "--no-input", "--progress-bar", "on", *self._target_args(), "-d", str(cache_dir),
                       "-r", str(reqfile)] + (["--require-hashes"] if hashed else [])
                sys.stdout.flush()
                proc = subprocess.run(cmd, stdout=sys.stdout, stderr=subprocess.PIPE, text=True)
                if proc.returncode != 0:
                    raise PipError(f"pip download failed: {_last_error(proc.stderr)}")
        out = {}
        for c in wanted:
            path = cache_dir / c.filename
            if not path.exists():
                raise PipError(f"pip download did not produce {c.filename} (asked for {c.name}=={c.version})")
            if c.sha256 and sha256_of(path) != c.sha256:
                raise PipError(f"{c.filename}: sha256 differs from the index's {c.sha256}")
            out[c.filename] = path
        return out
