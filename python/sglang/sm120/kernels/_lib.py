"""ctypes loader for libsm120_kernels.so (the C ABI in csrc/bindings.cu).

Where the library is looked up, first hit wins:
1. $SGLANG_SM120_KERNEL_LIB (the .so itself or the folder holding it) -- dev builds;
2. sglang/sm120/kernels/lib/libsm120_kernels.so inside the installed package (the wheel build).
"""
from __future__ import annotations

import ctypes
import threading
from pathlib import Path
from typing import Optional

from sglang.sm120 import settings

LIBRARY_NAME = "libsm120_kernels.so"
ABI_VERSION = 10

_lock = threading.Lock()
_lib: Optional[ctypes.CDLL] = None
_load_error: Optional[str] = None

_c_int, _c_size, _vp = ctypes.c_int, ctypes.c_size_t, ctypes.c_void_p

_SIGNATURES = {
    "sm120_last_error": (ctypes.c_char_p, []),
    "sm120_abi_version": (_c_int, []),
    "sm120_build_archs": (ctypes.c_char_p, []),
    "sm120_w4a16_plan": (_c_int, [_c_int, _c_int, _c_int, _c_int, _c_size, _c_int, _c_int,
                                  ctypes.POINTER(_c_int), ctypes.POINTER(_c_size)]),
    "sm120_w4a16_workspace_layout": (_c_int, [_c_int, _c_int, _c_int, _c_int, _c_size, _c_int, _c_int,
                                              ctypes.POINTER(_c_size)]),
    "sm120_quantize_nvfp4": (_c_int, [_c_int, _vp, _vp, _vp, _vp, _c_int, _c_int, _c_int, _vp]),
    "sm120_gemm_w4a16": (_c_int, [_c_int, _vp, _vp, _vp, _vp, _vp, _vp, _c_int, _c_int, _c_int,
                                  _vp, _c_size, _c_int, _c_int, _vp]),
    "sm120_gemm_w4a4": (_c_int, [_c_int, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _c_int, _c_int,
                                 _c_int, _c_int, _vp]),
    "sm120_moe_w4a16_plan": (_c_int, [_c_int] * 8 + [ctypes.POINTER(_c_int)]),
    "sm120_moe_w4a16": (_c_int, [_c_int] + [_vp] * 15 + [_c_int] * 5 + [ctypes.c_float, _c_int, _c_int, _c_int, _c_int, _vp]),
}


def library_path() -> Optional[Path]:
    env = settings.path("SGLANG_SM120_KERNEL_LIB")
    if env:
        p = Path(env)
        return p / LIBRARY_NAME if p.is_dir() else p
    p = Path(__file__).resolve().parent / "lib" / LIBRARY_NAME
    return p if p.exists() else None


def load() -> ctypes.CDLL:
    """Load (once) and return the library; RuntimeError with the reason if it is unavailable."""
    global _lib, _load_error
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is not None:
            return _lib
        path = library_path()
        if path is None or not path.exists():
            _load_error = (f"{LIBRARY_NAME} not found (looked at $SGLANG_SM120_KERNEL_LIB and "
                           f"{Path(__file__).resolve().parent / 'lib'}); build it with "
                           "`python -m forkbuild.kernels --out python/sglang/sm120/kernels/lib`")
            raise RuntimeError(_load_error)
        try:
            lib = ctypes.CDLL(str(path))
        except OSError as exc:
            _load_error = f"cannot load {path}: {exc}"
            raise RuntimeError(_load_error) from exc
        lib.sm120_abi_version.restype, lib.sm120_abi_version.argtypes = _c_int, []
        if lib.sm120_abi_version() != ABI_VERSION:  # before binding: a stale build may lack symbols
            raise RuntimeError(f"{path}: ABI version {lib.sm120_abi_version()}, expected {ABI_VERSION}; rebuild it "
                               "(python -m forkbuild.kernels --out python/sglang/sm120/kernels/lib)")
        for name, (res, args) in _SIGNATURES.items():
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = res, args
        _lib = lib
        return lib


def available() -> bool:
    try:
        load()
        return True
    except RuntimeError:
        return False


def check(rc: int, what: str) -> None:
    if rc != 0:
        msg = _lib.sm120_last_error().decode(errors="replace") if _lib is not None else "unknown error"
        raise RuntimeError(f"{what} failed (code {rc}): {msg}")


def build_archs() -> list:
    return [a for a in load().sm120_build_archs().decode().split(",") if a]
