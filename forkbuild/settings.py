"""The build's environment variables, read through the project's settings registry.

Every `SGLANG_SM120_*` variable the build reads is registered in python/sglang/sm120/settings.py
(scope `build`), which holds its type and accepted values. That module is standard library only,
so the build loads it from its file (not through the `sglang` package, which may be upstream's
or absent) and reads every value through it: a malformed value is a BuildError naming the
variable and what it accepts, raised where the value is read. SGLANG_SM120_BASE is checked
against the bases UPSTREAM.toml lists; SGLANG_SM120_CACHE must name a folder (or nothing yet).

    python -m forkbuild.settings [--base B ...] [--also NAME ...]

checks the whole build environment (and each base B) without building anything, printing one
`error: ...` line and exiting 2 on the first bad value: tools/venv.sh and tools/run_tests.sh run
it before they create any venv.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping, Optional

from .errors import BuildError

REPO = Path(__file__).resolve().parent.parent
REGISTRY_FILE = REPO / "python" / "sglang" / "sm120" / "settings.py"
BASE = "SGLANG_SM120_BASE"
CACHE = "SGLANG_SM120_CACHE"


@lru_cache(maxsize=None)
def registry():
    """python/sglang/sm120/settings.py, loaded from its file as a private module."""
    name = "_forkbuild_settings_registry"
    spec = importlib.util.spec_from_file_location(name, REGISTRY_FILE)
    if spec is None or not REGISTRY_FILE.is_file():
        raise BuildError(f"{REGISTRY_FILE}: missing (the settings registry the build reads)")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses resolve the module's annotations through sys.modules
    spec.loader.exec_module(module)
    return module


def build_names() -> list[str]:
    """The registered build-scope variables, in registry order."""
    return [s.name for s in registry().SETTINGS if s.scope == "build"]


def read(name: str, environ: Optional[Mapping[str, str]] = None) -> Any:
    """The typed value of the registered variable `name`; BuildError on a malformed value."""
    env = os.environ if environ is None else environ
    try:
        value = registry().get(name, env)
    except ValueError as e:
        raise BuildError(str(e)) from None
    if name == CACHE and value is not None and os.path.exists(value) and not os.path.isdir(value):
        raise BuildError(f"{CACHE}={value!r}: expected a folder (or a path to create one), not a file")
    return value


def base(environ: Optional[Mapping[str, str]] = None, upstream_toml: Optional[Path] = None) -> Optional[str]:
    """$SGLANG_SM120_BASE checked against UPSTREAM.toml's bases; None when unset or empty."""
    value = read(BASE, environ)
    if value is not None:
        check_base(value, upstream_toml)
    return value


def check_base(version: str, upstream_toml: Optional[Path] = None) -> None:
    from .upstream_toml import bases

    known = bases(upstream_toml)
    if version not in known:
        raise BuildError(f"{BASE}={version!r}: expected one of {', '.join(known)} (the bases in UPSTREAM.toml)")


def check_environment(environ: Optional[Mapping[str, str]] = None, extra_bases=(), also=(),
                      upstream_toml: Optional[Path] = None) -> None:
    """Read every build variable (and the `also` ones), and check each of `extra_bases`."""
    for name in [*build_names(), *also]:
        if name == BASE:
            base(environ, upstream_toml)
        else:
            read(name, environ)
    for b in extra_bases:
        check_base(b, upstream_toml)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m forkbuild.settings", description=__doc__.splitlines()[0])
    ap.add_argument("--base", action="append", default=[], help="also check that this base is in UPSTREAM.toml")
    ap.add_argument("--also", action="append", default=[], metavar="NAME",
                    help="also check this registered variable (e.g. SGLANG_SM120_DEPS)")
    args = ap.parse_args(argv)
    try:
        check_environment(extra_bases=[b for b in args.base if b.strip()], also=args.also)
    except (BuildError, KeyError) as e:
        print(f"error: {e.args[0] if isinstance(e, KeyError) else e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
