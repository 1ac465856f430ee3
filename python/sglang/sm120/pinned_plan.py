"""One FlashInfer plan buffer, reused safely across steps.

A FlashInfer wrapper builds its plan (the per-CTA work list, with every request's KV range) in
its own pinned host buffer and copies it to the device on the current stream, without waiting.
sglang's fast MLA plans for CUDA-graph replay skip the synchronisation the stock plan does, so
with the overlap scheduler the next step is planned while the previous copy may still sit in the
stream behind the running graph: the new plan overwrites the pinned bytes before they were
copied, and the earlier step's graph reads a later step's KV ranges. Short contexts then
attend over a different number of keys (docs/runner.md, "Correctness").

Around each plan call: `wait_for_plan_copy(wrapper)` blocks until the wrapper's previous copy
has run (normally already: the GPU is past it once the previous step's graph started), and
`plan_copied(wrapper)` marks the new copy on the current stream.
"""
from __future__ import annotations

import torch

_ATTR = "_sm120_plan_copied"


def wait_for_plan_copy(wrapper) -> None:
    copied = getattr(wrapper, _ATTR, None)
    if copied is not None:
        copied.synchronize()


def plan_copied(wrapper) -> None:
    copied = getattr(wrapper, _ATTR, None)
    if copied is None:
        copied = torch.cuda.Event()
        setattr(wrapper, _ATTR, copied)
    copied.record()
