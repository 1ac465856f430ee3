"""Where layerwise prefill runs attention, and which FlashInfer kernels a captured one plans.

SGLANG_SM120_LAYERWISE_PREFILL_ATTENTION=eager (the default): attention is an eager break between
graph segments, through upstream's breakable capture, running upstream's own attention forward
on the real tokens with the plan graphs disabled makes (FlashInfer: ragged prefill over the new
tokens, paged prefill over a cached prefix, merge_state), so layerwise prefill gives the tokens
of graphs disabled. `auto`, `fa2` and `fa3` opt into captured attention instead (FlashInfer only):
fixed request slots, planned into capture-stable wrappers, which runs other kernels than eager
prefill and so gives other tokens on some prompts (docs/runner.md, "Same tokens as upstream").

For captured attention: upstream's FlashInfer backend builds its full-CUDA-graph prefill wrappers with its
`prefill_backend`, fixed to FA2: a paged kernel whose CUDA-graph plan splits the KV and merges the
parts (`PersistentVariableLengthMergeStates`). Eager prefill without a prefix runs the ragged FA3
kernel on SM90 instead, which is faster there than the captured FA2 plan; `auto` lets the captured
prefill take the FA3 kernels too.

SGLANG_SM120_LAYERWISE_PREFILL_ATTENTION picks the kernels those wrappers plan: `auto`
hands FlashInfer its own `auto` rule, which takes the FA3 paged kernels
on SM90 where they support the dtypes and mask (the same compiled module as the ragged FA3
prefill) and FA2 everywhere else, SM120 included; `fa2` keeps upstream's choice; `fa3` insists
on FA3 and is refused off SM90. Only the wrappers built while layerwise prefill captures take
it: eager paths keep their own (docs/runner.md, "Captured prefill attention").
"""
from __future__ import annotations

import contextlib
import logging
from typing import Iterator, List, Optional, Tuple

from .. import settings

logger = logging.getLogger(__name__)

ENV = "SGLANG_SM120_LAYERWISE_PREFILL_ATTENTION"
CHOICES = settings.setting(ENV).choices
DEFAULT = settings.setting(ENV).default
EAGER = "eager"
UPSTREAM = "fa2"


def requested() -> str:
    return settings.choice(ENV)


def captured_requested() -> bool:
    """Whether the operator opted into captured prefill attention (any choice but eager)."""
    return requested() != EAGER


def _check_device(choice: str, capability: Optional[Tuple[int, int]]) -> None:
    if choice != "fa3":
        return
    if capability is None:
        import torch

        capability = torch.cuda.get_device_capability()
    if capability[0] != 9:
        raise ValueError(f"{ENV}=fa3: FlashInfer's FA3 kernels need an SM90 GPU, this one is "
                         f"sm_{capability[0]}{capability[1]}; use auto or fa2")


def planned(attn_backend) -> List[str]:
    """The kernel family each captured prefill wrapper of `attn_backend` resolved to (FlashInfer
    resolves `auto` at its first plan)."""
    wrappers = getattr(attn_backend, "full_cg_prefill_wrappers", None) or []
    return sorted({str(getattr(w, "_backend", "?")) for w in wrappers})


@contextlib.contextmanager
def wrappers_built_with(attn_backend, choice: Optional[str] = None,
                        capability: Optional[Tuple[int, int]] = None) -> Iterator[None]:
    """While open, FlashInfer prefill wrappers that `attn_backend` creates use `choice`
    (default: the environment's); its own setting is put back on exit. `capability` (default:
    the current device's) is read only to refuse `fa3` off SM90."""
    choice = requested() if choice is None else choice
    current = getattr(attn_backend, "prefill_backend", None)
    if choice in (UPSTREAM, EAGER) or current is None or current == choice:
        yield
        return
    _check_device(choice, capability)
    attn_backend.prefill_backend = choice
    try:
        yield
    finally:
        attn_backend.prefill_backend = current
    kinds = planned(attn_backend)
    if kinds and "auto" not in kinds and not getattr(attn_backend, "_sm120_prefill_attention_logged", False):
        attn_backend._sm120_prefill_attention_logged = True  # one line per backend, once it has planned
        logger.info("layerwise prefill: captured attention planned with FlashInfer %s (%s=%s; upstream: %s)",
                    "/".join(kinds), ENV, choice, current)
