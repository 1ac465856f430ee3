"""The GPU serving tests' server flags (test/gpu/server.py): every one parses under the installed
sglang; beside other GPU jobs (SGLANG_SM120_GPU_MAX_TOKENS set) a server must start while they
hold memory, so its static fraction is raised and its KV pool stays capped; alone it keeps the
small fraction."""
import importlib
import sys
from pathlib import Path

GPU_TESTS = str(Path(__file__).resolve().parents[2] / "gpu")


def _server_module(monkeypatch, max_tokens):
    if max_tokens is None:
        monkeypatch.delenv("SGLANG_SM120_GPU_MAX_TOKENS", raising=False)
    else:
        monkeypatch.setenv("SGLANG_SM120_GPU_MAX_TOKENS", str(max_tokens))
    monkeypatch.delenv("SGLANG_SM120_TEST_SERVER_ARGS", raising=False)
    monkeypatch.syspath_prepend(GPU_TESTS)
    for name in ("tinymodels", "server"):
        sys.modules.pop(name, None)
    return importlib.import_module("server")


def _parse_with_installed_sglang(args):
    import argparse

    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    return parser.parse_args(["--model-path", "/nonexistent"] + args)


def _flag(args, name):
    return args[args.index(name) + 1]


def test_alone_the_small_fraction(monkeypatch):
    args = _server_module(monkeypatch, None).server_args("qwen3_moe-bf16")
    assert (_flag(args, "--mem-fraction-static"), _flag(args, "--max-total-tokens")) == ("0.15", "65536")


def test_beside_other_jobs_a_high_fraction_and_the_same_capped_pool(monkeypatch):
    server = _server_module(monkeypatch, 2200000)
    args = server.server_args("glm4_moe-nvfp4")
    assert (_flag(args, "--mem-fraction-static"), _flag(args, "--max-total-tokens")) == ("0.7", "65536")
    assert args.count("--mem-fraction-static") == 1
    assert server.DEFAULT_SERVER_ARGS[server.DEFAULT_SERVER_ARGS.index("--mem-fraction-static") + 1] == "0.15"


def test_an_operator_list_is_kept_as_given(monkeypatch):
    server = _server_module(monkeypatch, 2200000)
    monkeypatch.setenv("SGLANG_SM120_TEST_SERVER_ARGS", "--mem-fraction-static 0.2")
    assert server.server_args("qwen3_moe-bf16") == ["--mem-fraction-static", "0.2"]


def test_every_flag_parses_under_the_installed_sglang(monkeypatch):
    """A flag the installed upstream does not know would stop every test server at start-up."""
    server = _server_module(monkeypatch, None)
    for model in server.TINY_MODELS:
        ns = _parse_with_installed_sglang(server.server_args(model))
        assert ns.enable_tokenizer_batch_encode and ns.disable_radix_cache, model


def test_the_queue_steps_default_variants_parse_under_the_installed_sglang(monkeypatch):
    """Every default variant of measure_all.sh's repeat-probe step names a built tiny model and
    flags the installed upstream accepts, on top of the test servers' own."""
    import re

    from repo_scripts import REPO, load

    probe = load("lab/repeat_probe.py")
    text = (REPO / "lab/measure_all.sh").read_text()
    specs = re.search(r'REPEAT_PROBE_VARIANTS:-([^}]*)\}', text).group(1).split(";")
    server = _server_module(monkeypatch, None)
    assert len(specs) >= 2
    for spec in specs:
        v = probe.parse_variant(spec)
        assert v["model"] in server.TINY_MODELS, spec
        _parse_with_installed_sglang(server.server_args(v["model"]) + v["args"])
