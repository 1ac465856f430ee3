"""`--reject-unknown-model`: the OpenAI endpoints refuse a `model` this server does not serve.

Upstream echoes whatever `model` a client sends, which is what drop-in users rely on (clients
that send a placeholder name), so the check is opt-in. With it a typo or a request meant for
another deployment gets `404 NotFoundError` naming the served names, instead of an answer from
the wrong model. Accepted: the served model name, the model path, the API's own default name
("default"), `NAME:ADAPTER` for a LoRA adapter the server has loaded, and a loaded adapter's name.

The flag sets an environment variable (the OpenAI handlers run in the HTTP server's process,
which inherits it), so ServerArgs keeps upstream's fields.
"""
from __future__ import annotations

import argparse
import logging
import os
from typing import Optional, Set

from . import settings

logger = logging.getLogger(__name__)

ENV = "SGLANG_SM120_REJECT_UNKNOWN_MODEL"
API_DEFAULT_NAME = "default"  # sglang's protocol default when a request omits `model`


class RejectUnknownModelAction(argparse.Action):
    def __init__(self, option_strings, dest, **kwargs):
        kwargs.setdefault("nargs", 0)
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        os.environ[ENV] = "1"
        logger.warning("%s: OpenAI requests naming another model get 404", option_string)


def enabled() -> bool:
    return settings.switch(ENV)


def served_names(tokenizer_manager) -> Set[str]:
    sa = tokenizer_manager.server_args
    names = {tokenizer_manager.served_model_name, sa.model_path, API_DEFAULT_NAME}
    return {n for n in names if n}


def adapter_names(tokenizer_manager) -> Set[str]:
    if not tokenizer_manager.server_args.enable_lora:
        return set()
    registry = tokenizer_manager.lora_registry
    return {ref.lora_name for ref in registry.get_all_adapters().values()}


def unknown_model_reason(model: str, served: Set[str], adapters: Set[str]) -> Optional[str]:
    """None when `model` names this server (or one of its adapters), else the error message."""
    if model in served or model in adapters:
        return None
    base, sep, adapter = model.partition(":")
    if sep and base in served and adapter in adapters:
        return None
    listed = sorted(served - {API_DEFAULT_NAME}) + sorted(adapters)
    return f"The model `{model}` does not exist on this server; it serves: {', '.join(listed)}"


def unknown_model_error(serving, request):
    """Called by the OpenAI handlers after upstream's own validation (patch 0003)."""
    if not enabled():
        return None
    model = getattr(request, "model", None)
    if not isinstance(model, str):
        return None
    tm = serving.tokenizer_manager
    reason = unknown_model_reason(model, served_names(tm), adapter_names(tm))
    if reason is None:
        return None
    return serving.create_error_response(reason, err_type="NotFoundError", status_code=404,
                                         param="model")
