"""GPU cards the planner knows, and `faked_card`: upstream's resolution run as if on that card.

Server-argument resolution reads the machine through a few probes (device memory, name,
capability, SM count, whether CUDA is there). `faked_card` answers them for a card from CARDS at
the places upstream itself reads them, `sglang.srt.utils.common`'s probes and torch.cuda's
capability / name / properties, so that resolving on a machine without that GPU (or without any)
takes the branches it would take on the card; upstream's cached predicates over them
(`is_sm120_supported`, ...) are evaluated afresh from the fakes. Nothing else is changed: no CUDA
context is made, `torch.cuda.is_available()` keeps its answer, and a module imported meanwhile
sees the real machine (its import-time constants choose kernels to import, which a plan never
runs).
"""
from __future__ import annotations

import contextlib
import sys
import types
from dataclasses import dataclass
from typing import Dict, Iterator, Tuple

MIB = 1 << 20


@dataclass(frozen=True)
class Card:
    key: str  # what `--gpu` takes
    name: str  # torch.cuda.get_device_name()
    memory_mib: int  # total memory as nvidia-smi reports it (what upstream sizes from)
    capability: Tuple[int, int]
    sms: int

    @property
    def memory_bytes(self) -> int:
        return self.memory_mib * MIB

    @property
    def sm(self) -> int:
        return self.capability[0] * 10 + self.capability[1]


# Totals are nvidia-smi's memory.total of each card (MiB), which upstream's memory tiers read.
CARDS: Dict[str, Card] = {c.key: c for c in (
    Card("h200", "NVIDIA H200", 143771, (9, 0), 132),
    Card("rtx-pro-6000", "NVIDIA RTX PRO 6000 Blackwell Server Edition", 97887, (12, 0), 188),
    Card("rtx-5090", "NVIDIA GeForce RTX 5090", 32607, (12, 0), 170),
    Card("b200", "NVIDIA B200", 183359, (10, 0), 148),
)}


def card(key: str) -> Card:
    if key not in CARDS:
        raise ValueError(f"--gpu must be one of {', '.join(CARDS)} or auto, got {key!r}")
    return CARDS[key]


def local_card() -> Card:
    """The card this process sees (device 0), read through torch.cuda."""
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("--gpu auto: torch sees no CUDA GPU here; name a card (--gpu "
                           f"{'|'.join(CARDS)})")
    props = torch.cuda.get_device_properties(0)
    known = next((c for c in CARDS.values() if c.name == props.name), None)
    key = known.key if known else "local"
    return Card(key, props.name, props.total_memory // MIB, (props.major, props.minor),
                props.multi_processor_count)


def _upstream_probes(c: Card) -> Dict[str, object]:
    """The fakes, by the name of the `sglang.srt.utils.common` probe they stand for."""
    return {
        "is_cuda": lambda: True,
        "is_cuda_alike": lambda: True,
        "get_device": lambda device_id=None: "cuda" if device_id is None else f"cuda:{device_id}",
        "get_device_sm": lambda: c.sm,
        "get_device_capability": lambda device_id=0: c.capability,
        "get_device_name": lambda device_id=0: c.name,
        "get_device_core_count": lambda device_id=0: c.sms,
        "get_nvgpu_memory_capacity": lambda: float(c.memory_mib),
        "get_device_memory_capacity": lambda device=None: float(c.memory_mib),
    }


def _torch_cuda_fakes(c: Card) -> Dict[str, object]:
    props = types.SimpleNamespace(name=c.name, major=c.capability[0], minor=c.capability[1],
                                  total_memory=c.memory_bytes, multi_processor_count=c.sms)
    return {
        "get_device_capability": lambda device=None: c.capability,
        "get_device_name": lambda device=None: c.name,
        "get_device_properties": lambda device=None: props,
    }


def _importing() -> bool:
    """Whether a module's top-level code is running (an import), the __main__ script aside."""
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_name == "<module>" and frame.f_globals.get("__name__") != "__main__":
            return True
        frame = frame.f_back
    return False


def _on_card(real, fake):
    """`fake` when resolution asks, `real` when a module being imported asks: import-time
    constants (`_is_cuda = is_cuda()`) choose kernels to import, which a plan never runs."""
    def probe(*args, **kwargs):
        return real(*args, **kwargs) if _importing() else fake(*args, **kwargs)
    probe.__wrapped_probe__ = real
    return probe


def _uncached(cached):
    """Upstream's own cached probe (the capability predicates, `is_sm120_supported` and the like,
    are lru_cache'd over the probes above), evaluated afresh outside imports so it reads the fakes."""
    return _on_card(cached, cached.__wrapped__)


@contextlib.contextmanager
def faked_card(c: Card) -> Iterator[Card]:
    """Within the block, upstream's resolution sees `c` as the GPU (every device index)."""
    import torch
    from sglang.srt.utils import common

    saved = []  # (object, attribute, original)

    def replace(obj, name, new):
        saved.append((obj, name, getattr(obj, name)))
        setattr(obj, name, new)

    fakes = {name: _on_card(getattr(common, name), fn)
             for name, fn in _upstream_probes(c).items() if hasattr(common, name)}
    for name, value in vars(common).items():
        if name not in fakes and callable(getattr(value, "cache_clear", None)) and hasattr(value, "__wrapped__"):
            fakes[name] = _uncached(value)
    originals = {id(getattr(common, name)): name for name in fakes}

    def rebind(to_fake: bool) -> None:
        """Modules that imported a probe by name (`from sglang.srt.utils import is_cuda`) hold
        their own reference: on entry point them at the fake; on exit put the original back,
        also in modules imported inside the block (they bound the fake)."""
        fake_ids = {id(fn): name for name, fn in fakes.items()}
        for mod_name, mod in list(sys.modules.items()):
            if mod is None or mod is common or not mod_name.startswith("sglang"):
                continue
            for attr, value in list(vars(mod).items()):
                if to_fake and id(value) in originals:
                    replace(mod, attr, fakes[originals[id(value)]])
                elif not to_fake and id(value) in fake_ids:
                    setattr(mod, attr, value.__wrapped_probe__)

    try:
        for name, fn in fakes.items():
            replace(common, name, fn)
        rebind(to_fake=True)
        for name, fn in _torch_cuda_fakes(c).items():
            replace(torch.cuda, name, _on_card(getattr(torch.cuda, name), fn))
        yield c
    finally:
        for obj, name, original in reversed(saved):
            setattr(obj, name, original)
        rebind(to_fake=False)
