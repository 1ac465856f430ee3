"""Routing like a trained router's for `--load-format dummy` models, plus two step probes.

Why: upstream's dummy loader (`initialize_dummy_weights`, model_loader/weight_utils.py) fills
every floating parameter with U(-1e-3, 1e-3) from a generator re-seeded with 1234 for each
parameter, so the values depend only on a tensor's size and dtype: every MoE layer gets the same
router, and the router's `e_score_correction_bias` (also U(+-1e-3)) is of the order of the
router logits themselves or larger (hidden states after a norm whose weights are U(+-1e-3) are
~1e-3 per element). Decode tokens are then also nearly alike: each request's next token is the
argmax of near-equal logits, and a dummy residual stream is its embedding row (U(+-1e-3)) plus
much smaller layer outputs. The likely outcome, which the histogram probe below measures, is a
few experts taking most tokens: the MoE reads a small part of its expert weights and a decode
step looks faster than a trained model's.

What `spread` does after the dummy load (seeded, same on every run):
* every MoE router weight <- N(0, 1) with a seed per layer, correction bias <- 0 (selection is
  top-k of sigmoid(logits), scale-free, so the gate's scale does not matter);
* the embedding and lm_head <- N(0, 1): hidden states differ per token, and the next token is a
  pseudo-random function of the current one, so a batch's decode tokens stay distinct and the
  router spreads them over the experts (no load balancing is modelled: a trained router with
  its aux-loss-free bias is close to uniform at bs 1024, which this approximates).
Nothing quantized is touched (the router, embedding and lm_head are BF16 in both twin variants).

Probes (environment, read by `install`):
  SGLANG_SM120_TWIN_ROUTER=spread|dummy   spread (default) applies the above; dummy leaves upstream's
  SGLANG_SM120_TWIN_PROBE=PATH            writes {"nonfinite_logits": bool, "logit_steps": n,
                                          "histogram": {layer: counts}} there when the run ends
  SGLANG_SM120_TWIN_HISTOGRAM_BS=1024     the decode batch whose routing is counted (first and last
                                          MoE layers; count it where the gates run eagerly, since
                                          capture warm-ups would count their fake batches)
The nonfinite check is one reduction over the logits per step, kept on the device (capturable).

Prefill in pieces (`chunk_prefill`, SGLANG_SM120_TWIN_PREFILL_TOKENS, default 8192 as upstream's
chunked prefill on the 96 GB card): one_batch prefills the whole batch in one forward, and at the
twin's sizes (1024 x 256 tokens, hidden 6144) the MoE's top-k output alone (tokens x 8 x 6144 x
2 B = 26 GB) is beyond what a 96 GB card leaves after the KV pool. The server never does that, so
the prelude prefills whole requests in groups of at most that many tokens and merges the groups
into one batch (ScheduleBatch.merge_batch, as the scheduler merges a prefilled batch into the
running one). Decode, which the twin measures, then sees the batch one_batch would have made.
"""
from __future__ import annotations

import json
from typing import Dict, List, Optional

from .. import settings

ROUTER_ENV, PROBE_ENV, HIST_BS_ENV = "SGLANG_SM120_TWIN_ROUTER", "SGLANG_SM120_TWIN_PROBE", "SGLANG_SM120_TWIN_HISTOGRAM_BS"
PREFILL_ENV = "SGLANG_SM120_TWIN_PREFILL_TOKENS"
SEED = 20260141
_STATE: dict = {}


def moe_gates(model) -> List[tuple]:
    """(layer index, gate module) of every MoE router (modules carrying e_score_correction_bias)."""
    out = []
    for name, mod in model.named_modules():
        if getattr(mod, "e_score_correction_bias", None) is not None and hasattr(mod, "weight"):
            layer = next((int(p) for p in name.split(".") if p.isdigit()), -1)
            out.append((layer, mod))
    return sorted(out, key=lambda x: x[0])


def spread(model, seed: int = SEED) -> Dict[str, int]:
    import torch

    gates = moe_gates(model)
    for layer, gate in gates:
        g = torch.Generator(device=gate.weight.device).manual_seed(seed + layer)
        w = torch.randn(gate.weight.shape, generator=g, device=gate.weight.device, dtype=torch.float32)
        gate.weight.data.copy_(w.to(gate.weight.dtype))
        gate.e_score_correction_bias.data.zero_()
    done = {"gates": len(gates)}
    for attr in ("model.embed_tokens", "lm_head"):
        mod = model
        for part in attr.split("."):
            mod = getattr(mod, part, None)
        weight = getattr(mod, "weight", None)
        if weight is not None and weight.is_floating_point():
            g = torch.Generator(device=weight.device).manual_seed(seed - 1 - len(done))
            weight.data.copy_(torch.randn(weight.shape, generator=g, device=weight.device,
                                          dtype=torch.float32).to(weight.dtype))
            done[attr] = weight.shape[0]
    return done


def summarize(counts: List[int], top_k: int, tokens: int) -> dict:
    """Spread of one layer's per-expert token counts (picks = tokens x top_k)."""
    n = len(counts)
    picks = sum(counts)
    mean = picks / n if n else 0.0
    var = sum((c - mean) ** 2 for c in counts) / n if n else 0.0
    return {"experts": n, "picks": picks, "tokens": tokens, "top_k": top_k,
            "experts_hit": sum(1 for c in counts if c), "max_over_mean": round(max(counts) / mean, 3) if mean else None,
            "cv": round(var ** 0.5 / mean, 3) if mean else None}


def spread_ok(summary: dict) -> bool:
    """A trained router at bs 1024 x top-8 reaches nearly every expert without a hot spot: every
    expert hit and none above 3x the mean (uniform random picks give ~1.6x)."""
    return summary["experts_hit"] == summary["experts"] and (summary["max_over_mean"] or 99) <= 3.0


def _install_probes(model, hist_bs: Optional[int]) -> None:
    import torch

    dev = next(model.parameters()).device
    _STATE.update(flag=torch.zeros((), dtype=torch.bool, device=dev), steps=torch.zeros((), dtype=torch.int64, device=dev))
    lp = getattr(model, "logits_processor", None)
    if lp is not None:
        def on_logits(_m, _inp, out):
            x = getattr(out, "next_token_logits", None)
            if isinstance(x, torch.Tensor):
                _STATE["flag"].logical_or_(~torch.isfinite(x).all())
                _STATE["steps"].add_(1)
        lp.register_forward_hook(on_logits)
    gates = moe_gates(model)
    if not hist_bs or not gates:
        return
    _STATE["hist"] = {}
    for layer, gate in (gates[0], gates[-1]):
        counts = torch.zeros(gate.weight.shape[0], dtype=torch.int64, device=dev)
        _STATE["hist"][layer] = counts
        top_k = _STATE["top_k"]

        def on_gate(m, _inp, logits, counts=counts):
            if logits.dim() == 2 and logits.shape[0] == hist_bs:
                scores = logits.float().sigmoid() + m.e_score_correction_bias.float()
                idx = scores.topk(top_k, dim=-1).indices.flatten()
                counts.index_add_(0, idx, torch.ones_like(idx))
        gate.register_forward_hook(on_gate)


def after_dummy_load(model, top_k: int) -> None:
    mode = settings.choice(ROUTER_ENV)
    if mode not in ("spread", "dummy"):
        raise ValueError(f"{ROUTER_ENV} must be spread or dummy, got {mode!r}")
    _STATE.update(mode=mode, top_k=top_k)
    if mode == "spread":
        _STATE["spread"] = spread(model)
    if settings.path(PROBE_ENV):
        _install_probes(model, settings.integer(HIST_BS_ENV))


def install() -> None:
    """Wrap upstream's DummyModelLoader.load_model so `after_dummy_load` runs on its model."""
    from sglang.srt.model_loader import loader

    orig = loader.DummyModelLoader.load_model
    if getattr(orig, "_twin_router", False):
        return

    def load_model(self, *args, **kwargs):
        model = orig(self, *args, **kwargs)
        cfg = kwargs.get("model_config") or (args[0] if args else None)
        hf = getattr(cfg, "hf_config", None)
        after_dummy_load(model, int(getattr(hf, "num_experts_per_tok", 8) or 8))
        return model

    load_model._twin_router = True
    loader.DummyModelLoader.load_model = load_model


def prefill_groups(lengths: List[int], max_tokens: int) -> List[List[int]]:
    """Consecutive request indices, whole requests, at most max_tokens each (a longer request alone)."""
    groups: List[List[int]] = []
    used = 0
    for i, n in enumerate(lengths):
        if groups and used + n <= max_tokens:
            groups[-1].append(i)
            used += n
        else:
            groups.append([i])
            used = n
    return groups


def chunk_prefill(one_batch) -> None:
    """Make one_batch's `extend(reqs, model_runner)` prefill in groups and merge them (see above)."""
    orig = one_batch.extend
    if getattr(orig, "_twin_chunked", False):
        return
    max_tokens = settings.integer(PREFILL_ENV)

    def extend(reqs, model_runner):
        groups = prefill_groups([len(r.origin_input_ids) for r in reqs], max_tokens)
        if len(groups) == 1:
            return orig(reqs, model_runner)
        import torch

        parts = [orig([reqs[i] for i in g], model_runner) for g in groups]
        batch = parts[0][2]
        for _, _, part in parts[1:]:
            batch.merge_batch(part)
        return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts]), batch

    extend._twin_chunked = True
    one_batch.extend = extend


def dump() -> Optional[dict]:
    """Write the probes' readings to SGLANG_SM120_TWIN_PROBE (once the run is over)."""
    path = settings.path(PROBE_ENV)
    if not path or "flag" not in _STATE:
        return None
    doc = {"router": _STATE.get("mode"), "spread": _STATE.get("spread"),
           "nonfinite_logits": bool(_STATE["flag"].item()), "logit_steps": int(_STATE["steps"].item())}
    if _STATE.get("hist"):
        hist_bs = settings.integer(HIST_BS_ENV)
        doc["histogram_bs"] = hist_bs
        doc["histogram"] = {}
        for layer, counts in _STATE["hist"].items():
            c = counts.tolist()
            tokens = sum(c) // _STATE["top_k"]
            doc["histogram"][str(layer)] = {"counts": c, **summarize(c, _STATE["top_k"], tokens)}
    with open(path, "w") as f:
        json.dump(doc, f)
    return doc


# `python -c` prelude for one_batch: patch, run, dump (cli_main returns after killing children)
ONE_BATCH_PRELUDE = (
    "import sys\n"
    "from sglang.sm120.tiny import twin_router\n"
    "twin_router.install()\n"
    "from sglang.benchmark import one_batch\n"
    "twin_router.chunk_prefill(one_batch)\n"
    "from sglang.benchmark.one_batch import cli_main\n"
    "sys.argv = ['one_batch'] + sys.argv[1:]\n"
    "try:\n"
    "    cli_main()\n"
    "finally:\n"
    "    twin_router.dump()\n"
)
