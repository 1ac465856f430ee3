"""Where layerwise decode runs attention at the sizes it captures layerwise (docs/runner.md 3.3).

SGLANG_SM120_LAYERWISE_DECODE_ATTENTION=eager (the default), with FlashInfer's or FA3's MHA
backend: each layer's decode attention is an eager island between graph segments (the hook patch
0113 puts at the top of `RadixAttention.forward`); before each such replay the runner plans the
real batch as graphs disabled does (`init_forward_metadata`), and the island runs the attention on
the real rows. A plan made for the padded batch splits some long requests' KV otherwise
(FlashInfer sizes its chunks from every row's pages; FA3 picks its split count from the batch
size), another summation order, other tokens. `captured` keeps the attention in the segments, one
eager step fewer per layer. MLA models and other backends keep it captured, said at start-up.
"""
from __future__ import annotations

import logging
from typing import Optional

from .. import settings

logger = logging.getLogger(__name__)

ENV = "SGLANG_SM120_LAYERWISE_DECODE_ATTENTION"
EAGER = "eager"
# Backends whose decode metadata only RadixAttention's call reads, planned outside the graph. FA3's
# in-graph metadata step serves speculative decoding only (target verify, draft extend), which
# layerwise refuses; for any other backend that defines one, the step could overwrite the plan.
# Class name -> the --attention-backend values that build it (what `plan` reads from the flags).
BACKENDS = {"FlashInferAttnBackend": ("flashinfer",), "FlashAttentionBackend": ("fa3", "fa4")}
IN_GRAPH_STEP_NOT_FOR_DECODE = ("FlashAttentionBackend",)


def requested() -> str:
    return settings.choice(ENV)


def refusal(model_runner, runner_attn_backend) -> Optional[str]:
    """Why decode attention stays captured for this model runner (None: it becomes an island)."""
    if requested() != EAGER:
        return f"{ENV}={requested()}"
    backend = getattr(model_runner, "attn_backend", None)
    name = type(backend).__name__
    if name not in BACKENDS:
        return f"the attention backend is {name}, not {' / '.join(BACKENDS)}"
    if runner_attn_backend is not backend:
        return "the decode runner plans another attention backend than the model runs"
    if "init_forward_metadata_in_graph" in type(backend).__dict__ and name not in IN_GRAPH_STEP_NOT_FOR_DECODE:
        # metadata recorded into the graph would overwrite the real batch's plan at replay
        return f"{name} records attention metadata inside the graph"
    if getattr(model_runner, "use_mla_backend", False):
        return "an MLA model"
    return None


def choose(model_runner, runner_attn_backend) -> bool:
    """Whether layerwise decode sizes get attention islands; one log line either way."""
    why = refusal(model_runner, runner_attn_backend)
    if why is None:
        logger.info("layerwise decode: attention runs as an eager island on the real batch, planned "
                    "as graphs disabled plans it (%s=eager; captured keeps it in the graphs)", ENV)
        return True
    logger.info("layerwise decode: attention stays captured at the padded size (%s)", why)
    return False


def planned(attention_backend: str, mla: bool) -> str:
    """What `python -m sglang.sm120 plan` says runs decode attention at layerwise sizes, from the
    flags and the model's config (the server decides from the objects it builds: `refusal`)."""
    if requested() != EAGER:
        return f"captured, padded plan ({ENV}={requested()})"
    if mla:
        return "captured, padded plan (MLA)"
    if not any(attention_backend in names for names in BACKENDS.values()):
        return f"captured, padded plan ({attention_backend})"
    return "eager step, real batch's plan"
