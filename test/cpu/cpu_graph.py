"""A CPU stand-in for torch.cuda.CUDAGraph, so the segmented-capture code runs without a GPU.

`RecordingGraph` records every aten op issued between capture_begin and capture_end and replays
them on the same tensor objects: inputs are read at their fixed addresses, outputs are written
back into the tensors the capture produced. That is the contract of a CUDA graph that the
layerwise runner relies on (static addresses, replay recomputes from current buffer contents).

To resemble a real capture, where kernels are recorded but not run, freshly allocated
floating-point outputs are overwritten with NaN during capture (`poison=True`), and host syncs
(`.item()`, `.tolist()`, `.cpu()` of a captured value) raise. Code that depends on values
computed during capture therefore fails here as it would on a GPU.
"""
from __future__ import annotations

from typing import Any, List, Tuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

# Ops that read a device value on the host or size their output from data: on a GPU they sync
# with the host, which a stream capture forbids.
_HOST_SYNC_PACKETS = {
    torch.ops.aten._local_scalar_dense,
    torch.ops.aten.nonzero,
    torch.ops.aten._unique2,
    torch.ops.aten.unique_dim,
    torch.ops.aten.unique_consecutive,
    torch.ops.aten.masked_select,
}


class HostSyncInCapture(RuntimeError):
    pass


def _storage_ptr(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


class _Recorder(TorchDispatchMode):
    def __init__(self, tape: List[Tuple[Any, tuple, dict, Any]], poison: bool):
        super().__init__()
        self.tape = tape
        self.poison = poison

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.overloadpacket in _HOST_SYNC_PACKETS:
            raise HostSyncInCapture(f"{func} reads a device value on the host inside a capture")
        out = func(*args, **kwargs)
        self.tape.append((func, args, kwargs, out))
        if self.poison:
            in_storages = {
                _storage_ptr(t) for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)
            }
            for t in tree_flatten(out)[0]:
                if (
                    isinstance(t, torch.Tensor)
                    and t.is_floating_point()
                    and t.numel() > 0
                    and _storage_ptr(t) not in in_storages
                ):
                    with torch.no_grad():
                        t.fill_(float("nan"))
        return out


def _copy_into(dst, src) -> None:
    if isinstance(dst, torch.Tensor):
        if not isinstance(src, torch.Tensor):
            raise RuntimeError("replay produced a non-tensor where capture produced a tensor")
        same = (
            dst.data_ptr() == src.data_ptr()
            and dst.shape == src.shape
            and dst.stride() == src.stride()
        )
        if not same:
            dst.copy_(src)
        return
    if isinstance(dst, (tuple, list)):
        for d, s in zip(dst, src):
            _copy_into(d, s)


class RecordingGraph:
    """Drop-in for torch.cuda.CUDAGraph in the segmented capture (CPU, single stream)."""

    def __init__(self, poison: bool = True) -> None:
        self._tape: List[Tuple[Any, tuple, dict, Any]] = []
        self._mode = None
        self._poison = poison
        self.pool = None
        self.captured = False

    def capture_begin(self, pool=None, capture_error_mode: str = "global") -> None:
        if self._mode is not None or self.captured:
            raise RuntimeError("capture_begin on a graph that is capturing or already captured")
        self.pool = pool
        self._mode = _Recorder(self._tape, self._poison)
        self._mode.__enter__()

    def capture_end(self) -> None:
        if self._mode is None:
            raise RuntimeError("capture_end without capture_begin")
        self._mode.__exit__(None, None, None)
        self._mode = None
        self.captured = True

    def replay(self) -> None:
        if not self.captured:
            raise RuntimeError("replay of a graph that was never captured")
        with torch.no_grad():  # a CUDA graph replay records no autograd either
            for func, args, kwargs, out in self._tape:
                _copy_into(out, func(*args, **kwargs))
