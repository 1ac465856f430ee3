"""Relaunching one Triton kernel call without redoing Triton's per-call resolution.

A `@triton.jit` function resolves every call anew in Python before its C launcher runs: it binds
the arguments (57 for upstream's `fused_moe_kernel`), specializes each one, hashes a cache key and
looks the compiled kernel up. The lean MoE step launches the same kernels with the same static
buffers on every replay, so that work gives the same answer every time. `ResolvedOnce` wraps one
call that launches Triton kernels: the first time it runs through Triton unchanged (compiling
there if Triton would, exactly as upstream's path does) while a stand-in for the named kernel
records what Triton resolved (the compiled kernel, the grid, the bound arguments); from then on
it calls the compiled kernels' own launchers (`CompiledKernel[grid](*args)`, which honours
Triton's launch hooks) with those arguments. Same kernel, same arguments, same grid, same stream
rule (the current stream at the call): the same launch.

The binder is read from `JITFunction.device_caches`, Triton-internal (the layout of Triton 3.6,
the version the GPU host's torch pins). Where it is not there, or the call launches nothing
through the stand-in, the call keeps running through Triton (logged once per reason).
"""
from __future__ import annotations

import logging
import threading
from typing import Any, Callable, List, Optional, Sequence, Tuple

import torch

logger = logging.getLogger(__name__)

_logged: set = set()


def _log_once(why: str) -> None:
    if why not in _logged:
        _logged.add(why)
        logger.info("lean eager MoE: Triton launches resolved per call (%s)", why)


class CachedLaunch:
    """One recorded launch: the compiled kernel's launcher and the bound argument values.

    Tensors are passed as their device addresses: Triton's launcher takes an int for a pointer
    parameter as it is, where for a tensor it calls `data_ptr()` and asks the driver to check the
    address (cuPointerGetAttribute) on every launch. The tensors are kept referenced here, so an
    address stays theirs for as long as the launch can run.
    """

    __slots__ = ("_launch", "args", "grid", "_tensors")

    def __init__(self, compiled, grid: Tuple[int, int, int], args: Tuple[Any, ...]) -> None:
        self._launch = compiled[grid]
        self.grid = grid
        self._tensors = tuple(a for a in args if isinstance(a, torch.Tensor))
        self.args = tuple(a.data_ptr() if isinstance(a, torch.Tensor) else a for a in args)

    def __call__(self) -> None:
        self._launch(*self.args)


def _grid3(grid, params) -> Tuple[int, int, int]:
    if callable(grid):
        grid = grid(params)
    grid = tuple(int(g) for g in grid)
    if not 1 <= len(grid) <= 3:
        raise ValueError(f"a Triton grid has 1-3 dimensions, got {grid}")
    return grid + (1,) * (3 - len(grid))


def _current_device() -> Any:
    from triton.runtime import driver

    return driver.active.get_current_device()


def resolve(jit, compiled, grid, args: Sequence[Any], kwargs: dict, *, device=None) -> CachedLaunch:
    """The launch Triton just made for `jit[grid](*args, **kwargs)`, which returned `compiled`."""
    caches = getattr(jit, "device_caches", None)
    if caches is None:
        raise TypeError(f"{type(jit).__name__} has no device_caches (not a Triton 3.6 JITFunction)")
    if getattr(jit, "pre_run_hooks", None):
        raise TypeError(f"{getattr(jit, '__name__', jit)} has pre_run_hooks, which Triton runs before every launch")
    binder = caches[_current_device() if device is None else device][-1]
    params, _specialization, _options = binder(*args, **kwargs)
    if hasattr(compiled, "result"):  # an async compile's future
        compiled = compiled.result()
    return CachedLaunch(compiled, _grid3(grid, params), tuple(params.values()))


class _Recorder:
    """Takes the place of one JITFunction for one call: launches through it and records."""

    def __init__(self, jit, launches: List[CachedLaunch], device=None) -> None:
        self.jit = jit
        self.device = device
        self.launches = launches  # shared by the recorders of one call: launch order is kept
        self.failure: Optional[str] = None
        self._thread = threading.get_ident()  # another thread's launch passes through unrecorded

    def __getitem__(self, grid) -> Callable[..., Any]:
        def launch(*args, **kwargs):
            compiled = self.jit[grid](*args, **kwargs)
            if threading.get_ident() != self._thread:
                return compiled
            try:
                self.launches.append(resolve(self.jit, compiled, grid, args, kwargs, device=self.device))
            except Exception as e:  # noqa: BLE001 - the launch happened; only caching is lost
                self.failure = f"{type(e).__name__}: {e}"
            return compiled

        return launch

    def __getattr__(self, name):
        return getattr(self.jit, name)


class ResolvedOnce:
    """`call()` (a function launching Triton kernels named `kernel_names` among its globals):
    through Triton the first time, recording; then the recorded launches."""

    def __init__(self, call: Callable[[], Any], kernel_names: Sequence[str], *, device=None) -> None:
        self._call = call
        self._names = tuple(kernel_names)
        self._device = device
        self.launches: Optional[List[CachedLaunch]] = None
        self.uncached: Optional[str] = None  # why it keeps resolving per call

    def __call__(self) -> None:
        if self.launches is not None:
            for launch in self.launches:
                launch()
            return
        if self.uncached is not None:
            self._call()
            return
        self._record()

    def _record(self) -> None:
        func = getattr(self._call, "func", self._call)  # a functools.partial's function
        namespace = getattr(func, "__globals__", None)
        missing = [n for n in self._names if namespace is None or n not in namespace]
        if missing:
            self.uncached = f"{getattr(func, '__name__', func)} has no global {missing[0]}"
            _log_once(self.uncached)
            self._call()
            return
        real = {n: namespace[n] for n in self._names}
        launches: List[CachedLaunch] = []
        recorders = {n: _Recorder(j, launches, self._device) for n, j in real.items()}
        namespace.update(recorders)
        try:
            self._call()
        finally:
            namespace.update(real)
        failures = [r.failure for r in recorders.values() if r.failure]
        if failures:
            self.uncached = failures[0]
        elif not launches:
            self.uncached = f"{getattr(func, '__name__', func)} launched none of {list(self._names)}"
        if self.uncached is not None:
            _log_once(self.uncached)
            return
        self.launches = launches
