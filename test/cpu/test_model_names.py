"""`--reject-unknown-model` (patch 0401 + sglang.sm120.model_names), against the installed fork."""
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("sglang.srt.entrypoints.openai.serving_chat")
from sglang.sm120 import model_names as M  # noqa: E402


@pytest.mark.parametrize("model,ok", [
    ("tiny", True), ("/models/tiny", True), ("default", True), ("ad1", True),
    ("tiny:ad1", True), ("tiny:nope", False), ("other:ad1", False), ("gpt-4o", False), ("", False),
])
def test_which_names_are_accepted(model, ok):
    reason = M.unknown_model_reason(model, {"tiny", "/models/tiny", "default"}, {"ad1"})
    assert (reason is None) == ok, reason
    if not ok:
        assert f"`{model}`" in reason and "tiny, ad1" in reason.replace("/models/tiny, ", "")


SCRIPT = r"""
import asyncio, json, sys, types
from sglang.srt.server_args import ServerArgs
import argparse
p = argparse.ArgumentParser(); ServerArgs.add_cli_args(p)
args = p.parse_args(['--model-path', '/models/tiny'] + sys.argv[1:])
import dataclasses
assert not hasattr(args, 'reject_unknown_model')          # ServerArgs keeps upstream's fields
try:
    fields = {f.name for f in dataclasses.fields(ServerArgs)}
except TypeError:  # 0.5.23 assembles ServerArgs from namespace classes
    from sglang.srt.arg_groups.arg_utils import record_fields
    fields = {f.name for f in record_fields(ServerArgs)}
assert fields and 'reject_unknown_model' not in fields
from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest
from sglang.srt.entrypoints.openai.serving_chat import OpenAIServingChat
serving = OpenAIServingChat.__new__(OpenAIServingChat)
serving.tokenizer_manager = types.SimpleNamespace(
    served_model_name='tiny', server_args=types.SimpleNamespace(model_path='/models/tiny', enable_lora=False),
    request_logger=types.SimpleNamespace(log_requests=False, log_requests_level=0))
serving._validate_request = lambda request: None          # upstream's own checks are not under test
def refuse(*a, **k): raise RuntimeError('CONVERTED')        # past validation: the request would be served
serving._convert_to_internal_request = refuse
for model in ('gpt-4o', 'tiny'):
    req = ChatCompletionRequest(model=model, messages=[{'role': 'user', 'content': 'hi'}])
    try:
        r = asyncio.run(serving.handle_request(req, None))
        msg = json.loads(r.body)['message']
        print('RESULT', model, 'served' if 'CONVERTED' in msg else r.status_code, msg)
    except RuntimeError as e:
        print('RESULT', model, 'served', str(e))
"""


def _run(*flags):
    env = {k: v for k, v in os.environ.items() if k != M.ENV}
    proc = subprocess.run([sys.executable, "-c", SCRIPT, *flags], capture_output=True, text=True,
                          timeout=300, env=env, cwd="/")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [ln.split(" ", 3)[1:] for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")], proc


def test_flag_makes_the_chat_endpoint_answer_404_for_another_model():
    rows, proc = _run("--reject-unknown-model")
    assert rows[0][:2] == ["gpt-4o", "404"] and "does not exist on this server; it serves: /models/tiny, tiny" in rows[0][2]
    assert rows[1][:2] == ["tiny", "served"], rows
    assert "--reject-unknown-model: OpenAI requests naming another model get 404" in proc.stderr


def test_without_the_flag_any_name_is_served_as_upstream_does():
    rows, _ = _run()
    assert [r[:2] for r in rows] == [["gpt-4o", "served"], ["tiny", "served"]], rows
