"""Which files make up a source distribution of the fork."""
from __future__ import annotations

import subprocess
from pathlib import Path

TOP = ("setup.py", "pyproject.toml", "UPSTREAM.toml", "README.md", "pytest.ini")
DIRS = ("forkbuild", "patches", "python", "csrc", "tools", "deploy", "lab", "test", "docs", "benchmarks")


def source_files(root: Path) -> list[str]:
    try:
        out = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
            cwd=root, capture_output=True, text=True, check=True,
        ).stdout.split()
        return sorted(f for f in out if (root / f).is_file())
    except (OSError, subprocess.CalledProcessError):
        files = [t for t in TOP if (root / t).is_file()]
        for d in DIRS:
            files += [p.relative_to(root).as_posix() for p in (root / d).rglob("*")
                      if p.is_file() and "__pycache__" not in p.parts]
        return sorted(files)
