"""Import a script of the repo (benchmarks/, tools/) by its path, for the tests of its helpers."""
import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def load(relpath: str):
    path = REPO / relpath
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
