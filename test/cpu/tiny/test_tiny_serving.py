"""The tiny models' server flags (sglang.sm120.tiny.serving, the GPU tests' and the repeat probe's):
every one parses under the installed sglang; beside other GPU jobs (SGLANG_SM120_GPU_MAX_TOKENS
set) a server must start while they hold memory, so its static fraction is raised and its KV pool
stays capped; alone it keeps the small fraction. The DSA model's flags and environment, and the
operator's replacements of either."""
from sglang.sm120.tiny import serving


def _server_module(monkeypatch, max_tokens):
    """sglang.sm120.tiny.serving with SGLANG_SM120_GPU_MAX_TOKENS as given (it reads the
    environment at each call)."""
    if max_tokens is None:
        monkeypatch.delenv("SGLANG_SM120_GPU_MAX_TOKENS", raising=False)
    else:
        monkeypatch.setenv("SGLANG_SM120_GPU_MAX_TOKENS", str(max_tokens))
    monkeypatch.delenv("SGLANG_SM120_TEST_SERVER_ARGS", raising=False)
    monkeypatch.delenv("SGLANG_SM120_TEST_DSA_ARGS", raising=False)
    return serving


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


def test_the_dsa_model_gets_its_flags_and_env_and_the_ordered_reduce_in_place_of_the_flag(monkeypatch):
    server = _server_module(monkeypatch, None)
    args = server.server_args("glm_moe_dsa-nvfp4")
    assert args[-len(server.DSA_SM90_FLAGS):] == server.DSA_SM90_FLAGS
    assert server.DETERMINISTIC_FLAG not in args  # sglang refuses it for DeepSeek-family models
    assert server.server_env("glm_moe_dsa-nvfp4") == {**server.DSA_SM90_ENV,
                                                       "SGLANG_SM120_MARLIN_MOE_ORDERED_REDUCE": "1"}
    assert server.server_env("glm_moe_dsa-bf16") == server.DSA_SM90_ENV
    assert server.DETERMINISTIC_FLAG in server.server_args("qwen3_moe-nvfp4")
    assert server.server_env("qwen3_moe-nvfp4") == {}


def test_an_empty_dsa_list_means_upstreams_defaults_not_ours(monkeypatch):
    server = _server_module(monkeypatch, None)
    monkeypatch.setenv("SGLANG_SM120_TEST_DSA_ARGS", "")
    assert server.dsa_flags() == [] and server.dsa_env() == {}
    monkeypatch.setenv("SGLANG_SM120_TEST_DSA_ARGS", "--attention-backend dsa")
    assert server.dsa_flags() == ["--attention-backend", "dsa"] and server.dsa_env() == {}


def test_tiny_model_builds_once(monkeypatch, tmp_path):
    runs = []
    monkeypatch.setattr(serving.subprocess, "run", lambda cmd, **kw: runs.append(cmd))
    out = serving.tiny_model(tmp_path, "qwen3_moe", "bf16")
    assert out == tmp_path / "qwen3_moe-bf16" and runs[0][1:3] == ["-m", "sglang.sm120.tiny"]
    (out).mkdir()
    (out / "config.json").write_text("{}")
    assert serving.tiny_model(tmp_path, "qwen3_moe", "bf16") == out and len(runs) == 1
