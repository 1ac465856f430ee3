"""Built-in model configs `plan --model-path` accepts by name, written to a folder as a
checkpoint's config.json (no weights: server-argument resolution reads the config only)."""
from __future__ import annotations

import json
import os
import tempfile
from typing import Callable, Dict


def _qwen3_30b() -> dict:
    from sglang.sm120.model_shapes import QWEN3_30B_A3B_CONFIG

    return dict(QWEN3_30B_A3B_CONFIG)


def _glm5() -> dict:
    from sglang.sm120.model_shapes import glm5_config

    return glm5_config()


KNOWN: Dict[str, Callable[[], dict]] = {"glm-5": _glm5, "qwen3-30b-a3b": _qwen3_30b}


def write_config(config: dict, folder: str) -> str:
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    return folder


def model_dir(model_path: str) -> str:
    """A folder holding config.json: `model_path` itself when it is one, else the built-in config
    of that name written to a temporary folder."""
    if os.path.isfile(os.path.join(model_path, "config.json")):
        return model_path
    key = model_path.lower()
    if key not in KNOWN:
        raise ValueError(f"--model-path: {model_path!r} is neither a folder with config.json nor one "
                         f"of the built-in models ({', '.join(KNOWN)})")
    return write_config(KNOWN[key](), tempfile.mkdtemp(prefix=f"sglang-sm120-plan-{key}-"))
