"""Write one tiny model directory: tokenizer, config, weights (bf16 or NVFP4), expected outputs.

Files (all deterministic for a given spec and seed; `tiny_reference.json` holds CPU-computed
floats, reproducible on one machine):
    config.json, generation_config.json, tokenizer.json, tokenizer_config.json,
    special_tokens_map.json, model.safetensors, hf_quant_config.json (nvfp4 only),
    tiny_reference.json (spec, calibration, and the reference forward's scores on EVAL_TEXTS
    that the GPU serving tests compare sglang against; sglang ignores the file).
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
from typing import Callable, Dict, Optional

import torch

from . import agreement, prompts, quantize, reference, spec as spec_mod, tokenizer as tok_mod, weights
from .spec import TinySpec

FORMAT_VERSION = 1
REFERENCE_FILE = "tiny_reference.json"
CHECKPOINT_FILES = (
    "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
    "special_tokens_map.json", "model.safetensors",
)
SCORE_DECIMALS = 5


def _log(msg: str) -> None:
    print(f"[tiny] {msg}", file=sys.stderr, flush=True)


def _dump_json(path: str, obj) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=1, sort_keys=True)
        f.write("\n")


def calibrate(s: TinySpec, w: Dict[str, torch.Tensor], tok) -> Dict[str, float]:
    """max |x| at every linear input over the calibration texts and random token sequences,
    pooled per input_scale group (see quantize.py)."""
    rec = reference.AmaxRecorder(w)
    fwd = reference.TinyForward(s, w, rec)
    for text in prompts.CALIBRATION_TEXTS:
        fwd(torch.tensor(tok.encode(text).ids))
    g = torch.Generator().manual_seed(s.seed + 7919)
    for _ in range(prompts.CALIBRATION_RANDOM_SEQS):
        fwd(torch.randint(0, s.vocab, (prompts.CALIBRATION_RANDOM_LEN,), generator=g))
    return quantize.pool_amax(rec.amax)


def score_sequences(fwd, sequences, probes) -> Dict:
    """Per sequence: the argmax next token and the probe logprobs at every position."""
    top1, probe_lp = [], []
    for seq in sequences:
        t, p = agreement.score_logits(fwd(torch.tensor(seq)), probes)
        top1.append(t)
        probe_lp.append([[round(v, SCORE_DECIMALS) for v in row] for row in p])
    return {"top1": top1, "probe_logprobs": probe_lp}


def _flat(scores: Dict):
    return ([t for seq in scores["top1"] for t in seq],
            [row for seq in scores["probe_logprobs"] for row in seq])


def compare_scores(a: Dict, b: Dict) -> Dict:
    """agreement.compare over two score dicts as stored in tiny_reference.json / returned by
    the serving test (per sequence lists)."""
    ta, pa = _flat(a)
    tb, pb = _flat(b)
    return agreement.compare(ta, tb, pa, pb)


def reference_scores(s: TinySpec, w: Dict[str, torch.Tensor], qw: Optional[Dict[str, torch.Tensor]],
                     sequences) -> Dict:
    """Expected per-position scores: 'bf16' always; 'w4a16' (weights dequantized, what Marlin
    computes on SM80-SM90) and 'w4a4' (activations quantized with input_scale too, what the
    SM100/SM120 paths compute) for NVFP4 models, plus their agreement with bf16."""
    probes = agreement.probe_ids(s.vocab)
    out = {"bf16": score_sequences(reference.TinyForward(s, w), sequences, probes)}
    if qw is not None:
        for mode, qa in (("w4a16", False), ("w4a4", True)):
            fwd = reference.TinyForward(s, qw, quantize.NVFP4Linears(qw, quantize_activations=qa))
            out[mode] = score_sequences(fwd, sequences, probes)
    return out


def build(out_dir: str, s: TinySpec, force: bool = False,
          log: Callable[[str], None] = _log, write: Optional[Callable] = None) -> str:
    """Build the model into out_dir (written to a temp dir first, then renamed, so a
    directory that exists is always complete). Returns out_dir. `write(dir, spec, log, t0)`
    replaces the tiny writer (fullsize.py; it validates its own spec)."""
    if write is None:
        spec_mod.validate(s)
        write = _write
    out_dir = os.path.abspath(out_dir)
    if os.path.exists(out_dir) and os.listdir(out_dir) and not force:
        raise FileExistsError(f"--out: {out_dir} exists and is not empty (pass --force to replace it)")
    parent = os.path.dirname(out_dir)
    os.makedirs(parent, exist_ok=True)
    t0 = time.time()
    tmp = tempfile.mkdtemp(prefix=".tiny-", dir=parent)
    try:
        write(tmp, s, log, t0)
        os.chmod(tmp, 0o755)  # mkdtemp makes it private; the server may run as another user
        for f in os.listdir(tmp):
            os.chmod(os.path.join(tmp, f), 0o644)
        if os.path.exists(out_dir):
            shutil.rmtree(out_dir)
        os.rename(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    size = sum(os.path.getsize(os.path.join(out_dir, f)) for f in os.listdir(out_dir))
    log(f"{s.name}: wrote {out_dir} ({len(os.listdir(out_dir))} files, {size / 2**20:.1f} MiB) "
        f"in {time.time() - t0:.1f}s")
    return out_dir


@contextlib.contextmanager
def _one_thread():
    """The reference forward is thousands of tiny ops, where intra-op threading costs more than it
    saves; and a fixed thread count keeps fp32 reductions identical across machines."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


def _write(d: str, s: TinySpec, log, t0: float) -> None:
    with _one_thread():
        _write_files(d, s, log, t0)


def write_tokenizer_and_config(d: str, s: TinySpec, tokenizer_vocab: Optional[int] = None):
    """tokenizer files, config.json, generation_config.json; returns (tokenizer, special ids).
    The tokenizer has s.vocab tokens unless `tokenizer_vocab` is given (then config.json's
    vocab_size may exceed it, as in real checkpoints whose embedding is padded)."""
    tok = tok_mod.build_tokenizer(tokenizer_vocab or s.vocab)
    ids = tok_mod.save_tokenizer_files(tok, d, s.max_position)
    _dump_json(os.path.join(d, "config.json"), spec_mod.hf_config(s, ids))
    _dump_json(os.path.join(d, "generation_config.json"), {
        "bos_token_id": ids["bos"],
        "eos_token_id": [ids["eos"], ids["im_end"]],
        "pad_token_id": ids["pad"],
    })
    return tok, ids


def _write_files(d: str, s: TinySpec, log, t0: float) -> None:
    from safetensors.torch import save_file

    def step(msg):
        log(f"{s.name}: {msg} ({time.time() - t0:.1f}s)")

    tok, ids = write_tokenizer_and_config(d, s)
    step("tokenizer and config")

    w = weights.init_weights(s)
    step("random weights")

    qw = None
    calib = {}
    if s.quant == "nvfp4":
        amax = calibrate(s, w, tok)
        calib = {k: quantize.rounded_amax(v) for k, v in sorted(amax.items())}
        qw = quantize.quantize_checkpoint(s, w, amax)
        _dump_json(os.path.join(d, "hf_quant_config.json"),
                   quantize.hf_quant_config(s, f"tiny-v{FORMAT_VERSION}"))
        step(f"calibrated {len(calib)} activation ranges, quantized to NVFP4")

    sequences = [tok.encode(t).ids for t in prompts.EVAL_TEXTS]
    scores = reference_scores(s, w, qw, sequences)
    summary = {}
    if qw is not None:
        for mode in ("w4a16", "w4a4"):
            summary[f"nvfp4_{mode}_vs_bf16"] = compare_scores(scores[mode], scores["bf16"])
    step("reference scores" + "".join(
        f"; {k}: top1 {v['top1']:.3f} corr {v['corr']:.4f}" for k, v in summary.items()))

    tensors = qw if qw is not None else w
    save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(d, "model.safetensors"),
              metadata={"format": "pt"})
    _dump_json(os.path.join(d, REFERENCE_FILE), {
        "format_version": FORMAT_VERSION,
        "spec": s.to_dict(),
        "special_ids": ids,
        "calibration_amax_rounded": calib,
        "eval": {
            "texts": list(prompts.EVAL_TEXTS),
            "sequences": sequences,
            "probe_ids": agreement.probe_ids(s.vocab),
            "scores": scores,
            "summary": summary,
        },
    })
    step("safetensors written")


def load_reference(model_dir: str) -> Dict:
    with open(os.path.join(model_dir, REFERENCE_FILE), encoding="utf-8") as f:
        return json.load(f)
