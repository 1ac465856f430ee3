"""Layerwise CUDA graphs vs graphs disabled on tiny MoE models (GPU): greedy tokens + logprobs.

For each tiny model one reference engine (graphs disabled) runs the request grid twice (the
second pass is the run-to-run noise floor: batch composition and timing differ), then one engine
per mode runs it once:
  full        upstream full graphs, layerwise off (control: decode full; prefill 'full' where
              layerwise prefill applies (qwen3_moe), given layerwise's buckets and request
              slots so both capture the same batches; upstream's default otherwise)
  layerwise   layerwise default: upstream full decode graphs up to the ceiling, layerwise above
  every_size  layerwise at every decode size
Requests come in groups that run as one batch (batch sizes x prompt lengths, >= 32 prompts per
batch size), greedy, with per-token logprobs and the top-5 logprobs of every position.

Each prompt is classified against the reference:
  identical   same tokens
  flip        first different token at position t is a near tie: the tokens before t agree (same
              inputs), and under both runs the logprob gap between the two candidates at t is
              <= NEAR_TIE_EPS[quant]
  mismatch    any other divergence (a real numerical difference, or a bug)
and max |delta logprob| of the chosen tokens over the agreeing positions is recorded.
What a layerwise mode is held to (`judge`):
  identity claimed (the default: prefill attention an eager break with upstream's own forward,
  SGLANG_SM120_LAYERWISE_PREFILL_ATTENTION=eager; MLA keeps upstream's prefill), where graphs
  disabled repeats itself exactly: greedy tokens identical to graphs disabled on every prompt
  (no flip, no mismatch);
  the opt-in captured prefill attention (auto / fa2 / fa3, other kernels than graphs disabled):
  on upstream's FA2 plan (what `auto` picks off SM90) greedy tokens identical to the `full`
  control, compared prompt by prompt in this process; on FA3 no further from graphs disabled
  than the control: real mismatches <= NOISE_SLACK x the control's + NOISE_EXTRA, flips <= the
  larger of MAX_FLIP_FRACTION and NOISE_SLACK x the control's;
  no control in the process: no real mismatch, flips <= MAX_FLIP_FRACTION.
Where graphs disabled does not repeat itself, counts are held to the larger of its own noise floor
and the control's, as above. Every mode: |delta| <= MAX_ABS_DELTA; layerwise modes also on missing
graph kinds, eager decode, or a trap hit. The control (upstream's own graphs) is recorded, not
failed on its counts: it is the bar for the captured attention, not the code under test.
Engines run what a user runs: graphs disabled and the control with upstream's compiled helpers,
layerwise with its Dynamo-free eager twins (runner/dynamo_free.py); NVFP4 engines with the ordered
Marlin reduce (SGLANG_SM120_MARLIN_MOE_ORDERED_REDUCE=1), so graphs disabled repeats itself.

Why NEAR_TIE_EPS is 0.25 nats for bf16 (not 1e-2): logits come out of a bf16 LM head. The tiny
models' logits have std 6 (sglang.sm120.tiny), so the top logits of a 4096 vocab sit at 16-32,
where one bf16 step is 0.125; a gap of 1e-2 cannot be represented, and any hidden-state noise
that moves a logit by one rounding step flips a 1-step tie. 0.25 = two bf16 steps there. On the
H200 NVFP4 runs through Marlin (bf16 activations, FP4 weights): the same bound, doubled for the
dequantization order.

Environment: SGLANG_SM120_TINY_DIR caches the generated models (default: a pytest temp dir);
SGLANG_SM120_GPU_QUICK=1 runs batch sizes {1, 17, 300} x lengths {7, 2000} only;
SGLANG_SM120_RESULTS_DIR: also write layerwise-correctness-<model>[-tpN[-epN]].{json,md} there
(merged over modes); SGLANG_SM120_GPU_MOE_BACKEND=sm120 runs the NVFP4 models only, every engine's experts on
the fork's grouped kernel (--moe-runner-backend sm120; results "...-moe-sm120"), and asserts the
backend served: no self-check failure or refused layer in any engine's log, and the layerwise
modes' decode capture bound sm120 lean steps; SGLANG_SM120_TP=N runs every engine with tensor parallelism N, and
SGLANG_SM120_EP=N (N = 1 or the TP size) with expert parallelism too;
SGLANG_SM120_GPU_MAX_TOKENS=N caps every engine's KV pool at N tokens (--max-total-tokens), so
several pytest processes, one model each, can share one GPU (queue step correctness-full); a cap
below what the grid's largest batch holds at once is refused.

Split per model/mode with -k, e.g. -k "qwen3_moe-bf16 and not every_size" (one reference engine
per pytest process, shared by the modes it runs).
"""
from __future__ import annotations

import json
import os
import random
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

import pytest
from tinymodels import (EP, MAX_TOKENS, MOE_BACKEND, MOE_SUFFIX, PARALLEL_SUFFIX, TP,  # noqa: F401 (fixture)
                        dsa_engine_kwargs, tiny_root)

from sglang.sm120.tiny.serving import DSA_ARCH, dsa_env, tiny_model

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

QUICK = os.environ.get("SGLANG_SM120_GPU_QUICK") == "1"
BATCH_SIZES = [1, 17, 300] if QUICK else [1, 3, 17, 64, 300, 1024]
PROMPT_LENS = [7, 2000] if QUICK else [7, 128, 2000]
MIN_PROMPTS = 32
NEW_TOKENS = 12
MAX_RUNNING = 1024
PREFILL_CHUNK = 8192  # the H200's default chunked prefill size, pinned for every engine (control_prefill_plan)
TOP_LOGPROBS = 5
NEAR_TIE_EPS = {"bf16": 0.25, "nvfp4": 0.5}  # nats, see the module docstring
MAX_FLIP_FRACTION = 0.10  # of all prompts of one mode (first H200 run: 71/732 diverged)
MAX_ABS_DELTA = {"bf16": 1.0, "nvfp4": 2.0}  # nats, chosen-token logprob on agreeing prefixes
NOISE_SLACK, NOISE_EXTRA = 1.5, 2  # counts held to a floor (the control's, a noisy reference's): see judge
_LARGEST_BATCH_TOKENS = max(BATCH_SIZES) * (max(PROMPT_LENS) + NEW_TOKENS)
if MAX_TOKENS is not None and MAX_TOKENS < _LARGEST_BATCH_TOKENS:
    raise ValueError(f"SGLANG_SM120_GPU_MAX_TOKENS={MAX_TOKENS} is below the {_LARGEST_BATCH_TOKENS} "
                     "tokens the largest batch of the grid holds at once")
MODELS = [(a, q) for a in ("qwen3_moe", "deepseek_v2", "glm_moe_dsa", "glm4_moe") for q in ("bf16", "nvfp4")
          if q == "nvfp4" or MOE_BACKEND is None]
# GQA archs get layerwise prefill (MLA keeps upstream's prefill: docs/runner.md 5.10)
GQA_ARCHS = ("qwen3_moe", "glm4_moe")
TEST_MODES = ["full", "layerwise", "every_size"]
LAYERWISE_MODES = ("layerwise", "every_size")
CAPTURE_TAG = "SM120_LAYERWISE_CAPTURE"
DYNAMO_FREE_ENV = "SGLANG_SM120_DYNAMO_FREE"
ORDERED_REDUCE_ENV = "SGLANG_SM120_MARLIN_MOE_ORDERED_REDUCE"


def control_prefill_plan():
    """(token buckets, request slots) layerwise prefill captures by default at PREFILL_CHUNK, which
    the `full` control's fixed-slot prefill graphs are given too: with upstream's own default
    (chunk // 512 = 16 slots) a 17-request batch ran eagerly under the control but captured under
    layerwise, so the control could not show what upstream's captured prefill attention does to
    those prompts (docs/runner.md 5.8)."""
    from sglang.sm120.runner.sizes import default_prefill_req_slots, prefill_buckets

    return prefill_buckets(PREFILL_CHUNK), default_prefill_req_slots(PREFILL_CHUNK, MAX_RUNNING)


def mode_kwargs(mode: str, arch: str) -> dict:
    if mode == "disabled":
        return dict(cuda_graph_backend_decode="disabled", cuda_graph_backend_prefill="disabled")
    if mode == "full":
        # Layerwise prefill is modeled on upstream's fixed-slot 'full' prefill; for MLA layerwise
        # falls back to the prefill upstream resolves (disabled), as here (docs/runner.md 5.10).
        kw = dict(cuda_graph_backend_decode="full")
        if arch in GQA_ARCHS:
            buckets, slots = control_prefill_plan()
            kw["cuda_graph_config"] = {"prefill": {"backend": "full", "bs": buckets, "max_bs": max(buckets),
                                                   "full_prefill_max_req": slots}}
        return kw
    kw = dict(cuda_graph_backend_decode="layerwise", cuda_graph_backend_prefill="layerwise")
    if mode == "every_size":
        kw["cuda_graph_layerwise_every_size"] = True
    return kw


# ------------------------------------------------------------------------------------------------
# results and their comparison (pure Python; test/cpu/gpu_harness/test_runner_divergence.py covers them)
# ------------------------------------------------------------------------------------------------
@dataclass
class Gen:
    """One request's greedy continuation: tokens, their logprobs, top-k logprobs per position."""

    tokens: List[int]
    logprobs: List[float]
    top: List[Dict[int, float]]


def parse_output(res: dict) -> Gen:
    mi = res["meta_info"]
    toks = [int(t) for _, t, _ in mi["output_token_logprobs"]]
    lps = [float(lp) for lp, _, _ in mi["output_token_logprobs"]]
    top = [{int(t): float(lp) for lp, t, _ in (pos or [])} for pos in mi["output_top_logprobs"]]
    if toks != list(res["output_ids"]):
        raise AssertionError(f"logprob tokens {toks} != output_ids {res['output_ids']}")
    return Gen(toks, lps, top)


@dataclass
class Verdict:
    kind: str  # "identical" | "flip" | "mismatch"
    position: Optional[int] = None
    gap: Optional[float] = None  # max of the two runs' gaps between the candidates at position
    max_abs_delta: float = 0.0
    delta_position: Optional[int] = None  # the agreeing position where max_abs_delta was reached


def _gap(top: Dict[int, float], chosen: int, other: int) -> float:
    """logprob(chosen) - logprob(other) from one run's top-k; `other` outside the top-k gives
    a lower bound (chosen minus the smallest listed logprob)."""
    mine = top.get(chosen)
    if mine is None:
        return float("inf")
    theirs = top.get(other, min(top.values()) if top else float("-inf"))
    return mine - theirs


def classify(ref: Gen, got: Gen, eps: float) -> Verdict:
    delta, at = 0.0, None
    for t, (a, b) in enumerate(zip(ref.tokens, got.tokens)):
        if a == b:
            d = abs(ref.logprobs[t] - got.logprobs[t])
            if d > delta:
                delta, at = d, t
            continue
        gap = max(_gap(ref.top[t], a, b), _gap(got.top[t], b, a))
        kind = "flip" if gap <= eps else "mismatch"
        return Verdict(kind, t, gap, delta, at)
    if len(ref.tokens) != len(got.tokens):
        return Verdict("mismatch", min(len(ref.tokens), len(got.tokens)), None, delta, at)
    return Verdict("identical", None, None, delta, at)


@dataclass
class Cell:
    identical: int = 0
    flips: int = 0
    mismatches: int = 0
    max_abs_delta: float = 0.0
    max_abs_delta_at: Optional[str] = None  # which prompt and token position reached it
    examples: List[str] = field(default_factory=list)
    mismatch_labels: List[str] = field(default_factory=list)

    def take_delta(self, delta: float, at: Optional[str]) -> None:
        if delta > self.max_abs_delta:
            self.max_abs_delta, self.max_abs_delta_at = delta, at

    def add(self, v: Verdict, label: str) -> None:
        self.take_delta(v.max_abs_delta, f"{label} token {v.delta_position}")
        if v.kind == "identical":
            self.identical += 1
            return
        if v.kind == "flip":
            self.flips += 1
        else:
            self.mismatches += 1
            self.mismatch_labels.append(label)
        gap = "n/a" if v.gap is None else f"{v.gap:.3g}"
        self.examples.append(f"{label} {v.kind} at token {v.position} (gap {gap})")

    @property
    def total(self) -> int:
        return self.identical + self.flips + self.mismatches


def compare_groups(groups, ref_outs, got_outs, eps: float) -> Dict[tuple, Cell]:
    """(bs, len) -> Cell; prompts paired by (group index, index in group)."""
    if len(ref_outs) != len(groups) or len(got_outs) != len(groups):
        raise AssertionError(f"{len(groups)} groups, {len(ref_outs)} / {len(got_outs)} results")
    cells: Dict[tuple, Cell] = {}
    for g, ((bs, plen, prompts), want, got) in enumerate(zip(groups, ref_outs, got_outs)):
        if not (len(want) == len(got) == len(prompts)):
            raise AssertionError(f"group {g}: {len(prompts)} prompts, {len(want)} / {len(got)} results")
        cell = cells.setdefault((bs, plen), Cell())
        for i, (w, o) in enumerate(zip(want, got)):
            cell.add(classify(w, o, eps), f"group={g} bs={bs} len={plen} req={i}")
    return cells


def render_table(title: str, rows: Dict[str, Dict[tuple, Cell]]) -> str:
    lines = [title, f"{'bs':>5} {'len':>5} {'mode':<16} {'ident':>6} {'flips':>6} {'real':>5} {'max|dlp|':>9}"]
    keys = sorted({k for cells in rows.values() for k in cells})
    for key in keys:
        for mode, cells in rows.items():
            c = cells.get(key)
            if c is not None:
                lines.append(
                    f"{key[0]:>5} {key[1]:>5} {mode:<16} {c.identical:>6} {c.flips:>6} "
                    f"{c.mismatches:>5} {c.max_abs_delta:>9.4f}"
                )
    return "\n".join(lines)


def prefill_attention_choice() -> str:
    from sglang.sm120.runner.prefill_attention import requested

    return requested()


def device_capability():
    import torch

    return torch.cuda.get_device_capability()


def same_kernels_as_control(arch: str, prefill_attention: str, capability) -> bool:
    """Whether a layerwise engine runs the control's kernels: MLA keeps upstream's prefill, and the
    captured MHA prefill attention is upstream's FA2 plan unless `auto` takes FA3 (SM90 only)."""
    if arch not in GQA_ARCHS:
        return True
    if prefill_attention == "eager":  # graphs disabled's kernels, not the control's captured ones
        return False
    return prefill_attention == "fa2" or (prefill_attention == "auto" and capability[0] != 9)


@dataclass
class Judgement:
    failures: List[str]
    targets: Dict[str, dict]


def _limit(targets: Dict[str, dict], failures: List[str], name: str, value, limit, why: str) -> None:
    met = value <= limit
    targets[name] = {"value": value, "target": round(limit, 4), "met": met}
    if not met:
        failures.append(why)


def identity_claimed(mode: str, arch: str, prefill_attention: str) -> bool:
    """Layerwise modes claim graphs disabled's tokens unless prefill attention is captured (the
    opt-in); MLA archs keep upstream's prefill whatever the setting."""
    return mode in LAYERWISE_MODES and (prefill_attention == "eager" or arch not in GQA_ARCHS)


def judge(mode: str, got: "Cell", control: Optional["Cell"], noise: Optional["Cell"], quant: str,
          vs_control: Optional["Cell"] = None, identical: bool = False) -> Judgement:
    """What `mode` is held to against graphs disabled (module docstring), as failures and as the
    results file's targets. got / control / noise: totals against graphs disabled of this mode, of
    the `full` control and of graphs disabled's second pass; vs_control: totals of this mode
    against the control prompt by prompt, given only where both run the same kernels; identical:
    the mode claims graphs disabled's tokens (identity_claimed), held to it where graphs disabled
    repeats itself exactly."""
    failures: List[str] = []
    targets: Dict[str, dict] = {}
    n = max(1, got.total)
    noisy = noise is not None and (noise.mismatches > 0 or noise.flips > MAX_FLIP_FRACTION * max(1, noise.total))
    exact = noise is not None and noise.mismatches == 0 and noise.flips == 0
    if mode == "full":
        pass  # the control, upstream's own graphs: recorded; only |delta| is checked below
    elif identical and exact:
        differ = got.flips + got.mismatches
        _limit(targets, failures, f"{mode}_prompts_differing_from_disabled", differ, 0,
               f"{mode}: {differ} prompts differ from graphs disabled (identity is claimed): "
               f"{got.examples[:8]}")
    elif vs_control is not None and not noisy:
        differ = vs_control.flips + vs_control.mismatches
        _limit(targets, failures, f"{mode}_prompts_differing_from_control", differ, 0,
               f"{mode}: {differ} prompts differ from upstream's own CUDA graphs on the same kernels: "
               f"{vs_control.examples[:8]}")
    elif noisy or control is not None:
        floors = [c for c in (noise if noisy else None, control) if c is not None]
        real_limit = NOISE_SLACK * max(c.mismatches for c in floors) + NOISE_EXTRA
        flip_limit = max(MAX_FLIP_FRACTION * n, NOISE_SLACK * max(c.flips for c in floors))
        seen = (f"noise floor {noise.mismatches if noisy else '-'} / {noise.flips if noisy else '-'}, "
                f"control {control.mismatches if control else '-'} / {control.flips if control else '-'}")
        _limit(targets, failures, f"{mode}_real_mismatches", got.mismatches, real_limit,
               f"{mode}: {got.mismatches} real mismatches > {real_limit:g} ({seen})")
        _limit(targets, failures, f"{mode}_flips", got.flips, flip_limit,
               f"{mode}: {got.flips}/{got.total} near-tie flips > {flip_limit:g} ({seen})")
    else:  # a layerwise mode with no control in this process, against a reference that repeats itself
        _limit(targets, failures, f"{mode}_real_mismatches", got.mismatches, 0,
               f"{mode}: {got.mismatches} real mismatches (no full-graph control ran in this process): "
               f"{got.mismatch_labels[:8]}")
        _limit(targets, failures, f"{mode}_flips", got.flips, MAX_FLIP_FRACTION * n,
               f"{mode}: {got.flips}/{got.total} near-tie flips > {MAX_FLIP_FRACTION:.0%}")
    _limit(targets, failures, f"{mode}_max_abs_dlogprob", round(got.max_abs_delta, 4), MAX_ABS_DELTA[quant],
           f"{mode}: max |dlogprob| {got.max_abs_delta} > {MAX_ABS_DELTA[quant]}")
    return Judgement(failures, targets)


def totals(cells: Dict[tuple, Cell]) -> Cell:
    out = Cell()
    for c in cells.values():
        out.identical += c.identical
        out.flips += c.flips
        out.mismatches += c.mismatches
        out.mismatch_labels += c.mismatch_labels
        out.take_delta(c.max_abs_delta, c.max_abs_delta_at)
        out.examples += c.examples
    return out


# ------------------------------------------------------------------------------------------------
# engines
# ------------------------------------------------------------------------------------------------
def request_groups(vocab: int):
    """[(batch_size, prompt_len, [prompt ids] * batch_size)], >= MIN_PROMPTS prompts per size."""
    rng = random.Random(1234)
    groups = []
    for bs in BATCH_SIZES:
        for plen in PROMPT_LENS:
            rounds = max(1, -(-MIN_PROMPTS // bs))
            for _ in range(rounds):
                prompts = [[rng.randrange(3, vocab) for _ in range(plen)] for _ in range(bs)]
                groups.append((bs, plen, prompts))
    return groups


def attention_kwargs(arch: str) -> dict:
    """FlashInfer attention, except GLM-5's DSA, which has its own backend (sglang.sm120.tiny.serving.dsa_flags)."""
    return dsa_engine_kwargs() if arch == DSA_ARCH else {"attention_backend": "flashinfer"}


def run_engine(model_dir: Path, mode: str, arch: str, groups, trap_log: Path, passes: int = 1):
    import sglang

    os.environ["SGLANG_SM120_TRAPS"] = "log"
    os.environ["SGLANG_SM120_TRAP_LOG"] = str(trap_log)
    # graphs disabled and the control run upstream's compiled helpers, as a user's upstream
    # deployment does; a layerwise engine's ServerArgs turns the Dynamo-free twins on itself
    os.environ.pop(DYNAMO_FREE_ENV, None)
    if model_dir.name.endswith("-nvfp4"):  # Marlin's atomics otherwise: graphs disabled would not repeat
        os.environ[ORDERED_REDUCE_ENV] = "1"
    else:
        os.environ.pop(ORDERED_REDUCE_ENV, None)
    for name, value in dsa_env().items():  # engines of other archs must not inherit them
        if arch == DSA_ARCH:
            os.environ[name] = value
        else:
            os.environ.pop(name, None)
    engine = sglang.Engine(
        model_path=str(model_dir),
        **attention_kwargs(arch),
        sampling_backend="flashinfer",
        max_running_requests=MAX_RUNNING,
        chunked_prefill_size=PREFILL_CHUNK,
        mem_fraction_static=0.7,
        disable_radix_cache=True,
        random_seed=0,
        tp_size=TP,
        ep_size=EP,
        max_total_tokens=MAX_TOKENS,
        log_level="warning",
        **({"moe_runner_backend": MOE_BACKEND} if MOE_BACKEND else {}),
        **mode_kwargs(mode, arch),
    )
    try:
        runs = []
        for _ in range(passes):
            outs = []
            for bs, plen, prompts in groups:
                res = engine.generate(
                    input_ids=prompts,
                    sampling_params={"temperature": 0, "max_new_tokens": NEW_TOKENS, "ignore_eos": True},
                    return_logprob=True,
                    top_logprobs_num=TOP_LOGPROBS,
                )
                outs.append([parse_output(r) for r in res])
            runs.append(outs)
        return runs
    finally:
        engine.shutdown()


def moe_backend_problems(stderr: str) -> List[str]:
    """With SGLANG_SM120_GPU_MOE_BACKEND set: the log lines of an sm120 MoE self-check failure (the
    process fell back to upstream's backend) or of a layer the kernel refused (it ran marlin)."""
    if not MOE_BACKEND:
        return []
    return [ln for ln in stderr.splitlines()
            if "sm120 NVFP4 MoE self-check FAILED" in ln or "is not served by the grouped kernel" in ln]


def capture_reports(stderr: str):
    reports = {}
    for line in stderr.splitlines():
        if line.startswith(CAPTURE_TAG + " "):
            rep = json.loads(line[len(CAPTURE_TAG) + 1:])
            reports[rep["phase"]] = rep
    return reports


_REFERENCE: dict = {}  # (arch, quant) -> (groups, pass A, pass B, noise cells)
_ROWS: dict = {}  # (arch, quant) -> {mode: cells}, for the table
_CONTROL: dict = {}  # (arch, quant) -> the `full` control's outputs, for the prompt-by-prompt comparison
_TARGETS: dict = {}  # (arch, quant) -> {name: target}, what each mode was held to (results file)


def _reference(arch, quant, model_dir, tmp_path):
    key = (arch, quant)
    if key not in _REFERENCE:
        vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
        groups = request_groups(vocab)
        a, b = run_engine(model_dir, "disabled", arch, groups, tmp_path / "traps-disabled.jsonl", passes=2)
        noise = compare_groups(groups, a, b, NEAR_TIE_EPS[quant])
        _REFERENCE[key] = (groups, a, noise)
        _ROWS.setdefault(key, {})["disabled-repeat"] = noise
    return _REFERENCE[key]


def _publish(arch, quant, capfd) -> str:
    rows = _ROWS[(arch, quant)]
    table = render_table(
        f"{arch}-{quant}: vs graphs disabled; rows MODE~full: MODE vs the full-graph control itself "
        f"(near tie: gap <= {NEAR_TIE_EPS[quant]} nats)", rows
    )
    with capfd.disabled():
        print("\n" + table, file=sys.stderr, flush=True)
    out_dir = os.environ.get("SGLANG_SM120_RESULTS_DIR")
    if out_dir:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        targets = dict(_TARGETS.get((arch, quant), {}))
        doc = {
            "model": f"{arch}-{quant}",
            "moe_runner_backend": MOE_BACKEND or "upstream's choice",
            "tp_size": TP,
            "ep_size": EP,
            "near_tie_eps": NEAR_TIE_EPS[quant],
            "rule": "judge() in test/gpu/test_layerwise_correctness.py (held to the full-graph control)",
            "targets": targets,
            "modes": {
                m: {f"{k[0]}x{k[1]}": c.__dict__ for k, c in cells.items()} for m, cells in rows.items()
            },
        }
        stem = f"layerwise-correctness-{arch}-{quant}" + MOE_SUFFIX + PARALLEL_SUFFIX
        (out / f"{stem}.json").write_text(json.dumps(doc, indent=1))
        (out / f"{stem}.md").write_text("```\n" + table + "\n```\n")
    return table


@pytest.mark.parametrize(
    "arch,quant,mode",
    [(a, q, m) for a, q in MODELS for m in TEST_MODES],
    ids=[f"{a}-{q}-{m}" for a, q in MODELS for m in TEST_MODES],
)
def test_greedy_tokens_match_graphs_disabled(arch, quant, mode, tiny_root, tmp_path, capfd):
    model_dir = tiny_model(tiny_root, arch, quant)
    groups, reference, _ = _reference(arch, quant, model_dir, tmp_path)
    assert not moe_backend_problems(capfd.readouterr().err), "the reference engine (graphs disabled)"
    trap_log = tmp_path / f"traps-{mode}.jsonl"
    (got,) = run_engine(model_dir, mode, arch, groups, trap_log)
    err = capfd.readouterr().err
    key = (arch, quant)
    cells = compare_groups(groups, reference, got, NEAR_TIE_EPS[quant])
    _ROWS[key][mode] = cells
    if mode == "full":
        _CONTROL[key] = got
    control = _ROWS[key].get("full") if mode in LAYERWISE_MODES else None
    vs_control = None
    if control is not None and same_kernels_as_control(arch, prefill_attention_choice(), device_capability()):
        vs_control = compare_groups(groups, _CONTROL[key], got, NEAR_TIE_EPS[quant])
        _ROWS[key][f"{mode}~full"] = vs_control  # this mode against the control itself
    noise = _ROWS[key].get("disabled-repeat")
    verdict = judge(mode, totals(cells), totals(control) if control is not None else None,
                    totals(noise) if noise is not None else None, quant,
                    totals(vs_control) if vs_control is not None else None,
                    identical=identity_claimed(mode, arch, prefill_attention_choice()))
    _TARGETS.setdefault(key, {}).update(verdict.targets)
    table = _publish(arch, quant, capfd)
    reports = capture_reports(err)
    with capfd.disabled():
        print(f"{arch}-{quant} {mode} capture reports: {json.dumps(reports)}", file=sys.stderr, flush=True)
    assert not verdict.failures, "\n".join(verdict.failures) + "\n" + table
    problems = moe_backend_problems(err)
    assert not problems, f"{mode}: {problems[:3]}"
    if mode not in LAYERWISE_MODES:
        return
    assert "decode" in reports, f"no layerwise decode capture report on stderr ({mode})"
    dec = reports["decode"]
    if MOE_BACKEND == "sm120":
        lean = dec.get("lean_moe") or {}
        assert lean.get("sm120_steps", 0) > 0, f"{mode}: no decode MoE step ran on the sm120 kernel: {lean}"
    assert 1024 in dec["layerwise"] and not dec["dropped"], dec
    if mode == "every_size":
        assert dec["full"] == [] and 1 in dec["layerwise"], dec
    else:
        assert (1 in dec["full"]) or not dec["moe_capturable"], dec
    if arch in GQA_ARCHS:  # MLA (deepseek_v2, glm_moe_dsa) keeps upstream's prefill (see docs/runner.md)
        assert "prefill" in reports and reports["prefill"]["layerwise"], reports
        # the control captured the same prefill buckets (with the same slots: control_prefill_plan)
        assert reports["prefill"]["layerwise"] == control_prefill_plan()[0], reports["prefill"]
    eager_decode = [ln for ln in err.splitlines() if "layerwise decode: size" in ln and "runs eagerly" in ln]
    assert not eager_decode, eager_decode[:5]
    hits = trap_log.read_text().splitlines() if trap_log.exists() else []
    assert not hits, f"{mode}: Dynamo/subprocess used after capture began: {hits[:3]}"


def test_oom_while_capturing_drops_sizes_and_serves_them_eagerly(tiny_root, tmp_path, capfd, monkeypatch):
    """An OOM capturing decode bs 512 (injected) drops 512 and everything above; a batch of 600
    then runs eagerly (logged once) and matches graphs disabled up to near ties."""
    model_dir = tiny_model(tiny_root, "qwen3_moe", "bf16")
    vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    rng = random.Random(5)
    groups = [(bs, 7, [[rng.randrange(3, vocab) for _ in range(7)] for _ in range(bs)]) for bs in (300, 600, 600)]
    (reference,) = run_engine(model_dir, "disabled", "qwen3_moe", groups, tmp_path / "t0.jsonl")
    capfd.readouterr()
    monkeypatch.setenv("SGLANG_SM120_LAYERWISE_INJECT_OOM", "decode:512")
    (got,) = run_engine(model_dir, "layerwise", "qwen3_moe", groups, tmp_path / "t1.jsonl")
    err = capfd.readouterr().err
    t = totals(compare_groups(groups, reference, got, NEAR_TIE_EPS["bf16"]))
    assert t.mismatches == 0 and t.flips <= MAX_FLIP_FRACTION * t.total, t.examples[:8]
    dec = capture_reports(err)["decode"]
    assert 512 in dec["dropped"] and 1024 in dec["dropped"] and max(dec["layerwise"]) < 512, dec
    eager = [ln for ln in err.splitlines() if "layerwise decode: size 600 runs eagerly" in ln]
    assert len(eager) == 1, eager
