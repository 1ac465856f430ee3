"""What the soak sends and how each answer is judged (no I/O here, so CPU tests cover all of it).

Well-formed requests: random token-id prompts of 1 token up to near the context limit
(log-uniform, so most are short and some are long) and random output lengths, through three
routes: native /generate (plain and streamed) and OpenAI /v1/completions. A well-formed request
passes when it completes: HTTP 200, a finish reason of "length" or "stop", prompt_tokens equal to
the prompt sent, and 1 <= completion_tokens <= the limit (== the limit when it stopped on length).

Malformed requests (MALFORMED, a fixed share of the traffic, drawn in rotation): each must be
answered with a 4xx status and a non-empty error message. They are sent without streaming:
sglang's streamed /generate reports a request error inside a 200 event stream (its headers are
already sent when the request is validated), so only the plain form can carry a status.
"""
from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

FIRST_PROMPT_ID = 16   # prompts avoid the tokenizer's special ids (0..4 in the tiny tokenizer)
MAX_OUTPUT = 512       # longest generation asked for; the soak is mostly about prefill lengths
CONTEXT_MARGIN = 8     # keep prompt + output this far below the context limit


@dataclass
class Request:
    kind: str                   # "generate", "generate_stream", "completions" or a MALFORMED name
    path: str
    body: bytes
    stream: bool = False
    prompt_len: int = 0
    max_tokens: int = 0
    malformed: bool = False
    headers: Dict[str, str] = field(default_factory=lambda: {"Content-Type": "application/json"})


@dataclass
class Verdict:
    ok: bool
    why: str = ""               # what was wrong, for the first few failures of each kind
    completion_tokens: int = 0


def log_uniform(rng: random.Random, lo: int, hi: int) -> int:
    """Integer in [lo, hi], uniform in log space."""
    if hi <= lo:
        return lo
    return min(hi, int(math.exp(rng.uniform(math.log(lo), math.log(hi + 1)))))


def _ids(rng: random.Random, n: int, vocab: int) -> List[int]:
    return [rng.randrange(FIRST_PROMPT_ID, vocab) for _ in range(n)]


def _json(obj) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


# ----------------------------------------------------------------------------- malformed

def _bad_json(ctx, rng, model, vocab) -> Tuple[str, bytes]:
    return "/generate", b'{"input_ids": [17, 18, 19], "sampling_params": {"max_new_tokens": 4'


def _bad_json_openai(ctx, rng, model, vocab) -> Tuple[str, bytes]:
    return "/v1/completions", b'{"model": "' + model.encode() + b'", "prompt": "hi",, }'


def _negative_max_tokens(ctx, rng, model, vocab) -> Tuple[str, bytes]:
    return "/v1/completions", _json({"model": model, "prompt": _ids(rng, 8, vocab), "max_tokens": -5})


def _negative_max_new_tokens(ctx, rng, model, vocab) -> Tuple[str, bytes]:
    return "/generate", _json({"input_ids": _ids(rng, 8, vocab), "sampling_params": {"max_new_tokens": -5}})


def _unknown_model(ctx, rng, model, vocab) -> Tuple[str, bytes]:
    return "/v1/completions", _json({"model": "no-such-model-" + model, "prompt": _ids(rng, 8, vocab),
                                     "max_tokens": 4})


def _unknown_model_chat(ctx, rng, model, vocab) -> Tuple[str, bytes]:
    return "/v1/chat/completions", _json({"model": "no-such-model-" + model, "max_tokens": 4,
                                          "messages": [{"role": "user", "content": "hello"}]})


def _prompt_over_context(ctx, rng, model, vocab) -> Tuple[str, bytes]:
    return "/generate", _json({"input_ids": _ids(rng, ctx + 16, vocab), "sampling_params": {"max_new_tokens": 4}})


def _prompt_over_context_openai(ctx, rng, model, vocab) -> Tuple[str, bytes]:
    return "/v1/completions", _json({"model": model, "prompt": _ids(rng, ctx + 16, vocab), "max_tokens": 4})


def _wrong_types(ctx, rng, model, vocab) -> Tuple[str, bytes]:
    return "/v1/completions", _json({"model": model, "prompt": "hello", "max_tokens": "ten"})


def _wrong_types_generate(ctx, rng, model, vocab) -> Tuple[str, bytes]:
    return "/generate", _json({"text": 12345, "sampling_params": {"max_new_tokens": 4}})


# name -> builder(context_len, rng, served model name, tokenizer vocab) -> (path, body)
MALFORMED: Dict[str, Callable] = {
    "bad_json": _bad_json,
    "bad_json_openai": _bad_json_openai,
    "negative_max_tokens": _negative_max_tokens,
    "negative_max_new_tokens": _negative_max_new_tokens,
    "unknown_model": _unknown_model,
    "unknown_model_chat": _unknown_model_chat,
    "prompt_over_context": _prompt_over_context,
    "prompt_over_context_openai": _prompt_over_context_openai,
    "wrong_types": _wrong_types,
    "wrong_types_generate": _wrong_types_generate,
}
# Rejected by FastAPI/pydantic before any sglang handler runs (a CPU test checks these against
# the real app); the others need the running server's tokenizer manager.
VALIDATION_LAYER = ("bad_json", "bad_json_openai", "wrong_types", "wrong_types_generate")


def error_message(body: str) -> str:
    """The error text of an error response: {"message"}, {"error": str | {"message"}},
    {"detail"}, else the raw body."""
    try:
        doc = json.loads(body)
    except ValueError:
        return body.strip()
    if isinstance(doc, dict):
        for key in ("message", "error", "detail"):
            v = doc.get(key)
            if isinstance(v, dict):
                v = v.get("message")
            if isinstance(v, (str, list)) and v:
                return str(v).strip()
    return ""


def judge_malformed(status: int, body: str) -> Verdict:
    if not 400 <= status < 500:
        return Verdict(False, f"HTTP {status} (want 4xx): {body[:200]}")
    if not error_message(body):
        return Verdict(False, f"HTTP {status} with no error message: {body[:200]}")
    return Verdict(True)


# ----------------------------------------------------------------------------- well-formed

def _check_counts(prompt_tokens, completion_tokens, finish: Optional[str], req: Request) -> Verdict:
    if finish not in ("length", "stop"):
        return Verdict(False, f"finish_reason {finish!r} (want length or stop)")
    if prompt_tokens != req.prompt_len:
        return Verdict(False, f"prompt_tokens {prompt_tokens} != {req.prompt_len} sent")
    if not isinstance(completion_tokens, int) or not 1 <= completion_tokens <= req.max_tokens:
        return Verdict(False, f"completion_tokens {completion_tokens} not in 1..{req.max_tokens}")
    if finish == "length" and completion_tokens != req.max_tokens:
        return Verdict(False, f"stopped on length after {completion_tokens} of {req.max_tokens} tokens")
    return Verdict(True, completion_tokens=completion_tokens)


def _generate_verdict(doc: dict, req: Request) -> Verdict:
    meta = doc.get("meta_info") or {}
    fr = meta.get("finish_reason")
    finish = fr.get("type") if isinstance(fr, dict) else fr
    return _check_counts(meta.get("prompt_tokens"), meta.get("completion_tokens"), finish, req)


def judge_wellformed(req: Request, status: int, body: str) -> Verdict:
    if status != 200:
        return Verdict(False, f"HTTP {status}: {body[:200]}")
    try:
        if req.kind == "generate_stream":
            events = [ln[len("data:"):].strip() for ln in body.splitlines() if ln.startswith("data:")]
            docs = [json.loads(e) for e in events if e and e != "[DONE]"]
            errors = [d["error"] for d in docs if "error" in d]
            if errors:
                return Verdict(False, f"error event in stream: {str(errors[0])[:200]}")
            if not docs or events[-1] != "[DONE]":
                return Verdict(False, "stream ended without a final [DONE] after a result")
            return _generate_verdict(docs[-1], req)
        doc = json.loads(body)
    except ValueError as e:
        return Verdict(False, f"unparseable body ({e}): {body[:200]}")
    if req.kind == "generate":
        return _generate_verdict(doc, req)
    choice = (doc.get("choices") or [{}])[0]
    usage = doc.get("usage") or {}
    return _check_counts(usage.get("prompt_tokens"), usage.get("completion_tokens"),
                         choice.get("finish_reason"), req)


# ----------------------------------------------------------------------------- the mix

WELLFORMED_ROUTES = (("generate", 2), ("generate_stream", 1), ("completions", 1))  # weights


class RequestPlan:
    """A deterministic stream of requests for a seed: `malformed_share` of them malformed (the
    MALFORMED cases in rotation), the rest well-formed with random lengths."""

    def __init__(self, seed: int, context_len: int, vocab: int, model: str,
                 malformed_share: float = 0.02, max_output: int = MAX_OUTPUT,
                 max_input_len: Optional[int] = None):
        """context_len: the server's context length (over-context prompts exceed it);
        max_input_len: the scheduler's own cap on prompts, when lower (max_req_input_len)."""
        if context_len < 64:
            raise ValueError(f"context length {context_len} is too small for the soak (need >= 64)")
        if not 0 <= malformed_share < 1:
            raise ValueError(f"--malformed-share must be in [0, 1), got {malformed_share}")
        self.rng = random.Random(seed)
        self.ctx, self.vocab, self.model = context_len, vocab, model
        self.limit = min(context_len, max_input_len or context_len)
        self.share, self.max_output = malformed_share, max_output
        self.routes = [r for r, w in WELLFORMED_ROUTES for _ in range(w)]
        self.n_malformed = 0

    def malformed(self, name: str) -> Request:
        path, body = MALFORMED[name](self.ctx, self.rng, self.model, self.vocab)
        return Request(name, path, body, malformed=True)

    def wellformed(self, route: str, prompt_len: int, max_tokens: int) -> Request:
        ids = _ids(self.rng, prompt_len, self.vocab)
        if route == "completions":
            body = {"model": self.model, "prompt": ids, "max_tokens": max_tokens, "temperature": 0}
            return Request(route, "/v1/completions", _json(body), False, prompt_len, max_tokens)
        body = {"input_ids": ids, "sampling_params": {"max_new_tokens": max_tokens, "temperature": 0},
                "stream": route == "generate_stream"}
        return Request(route, "/generate", _json(body), route == "generate_stream", prompt_len, max_tokens)

    def next(self) -> Request:
        if self.rng.random() < self.share:
            names = list(MALFORMED)
            req = self.malformed(names[self.n_malformed % len(names)])
            self.n_malformed += 1
            return req
        max_tokens = log_uniform(self.rng, 1, min(self.max_output, self.limit // 4))
        prompt_len = log_uniform(self.rng, 1, self.limit - max_tokens - CONTEXT_MARGIN)
        return self.wellformed(self.rng.choice(self.routes), prompt_len, max_tokens)
