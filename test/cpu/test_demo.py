"""python -m sglang.sm120.demo without a GPU: the refusal, the dry run (model built once, the server
command), the real-model hint, and serve() through the launcher on a stand-in server."""
from fake_server import launcher_server


def test_demo_without_gpu_prints_one_line_and_fails(monkeypatch, capsys, tmp_path):
    from sglang.sm120 import demo
    monkeypatch.setattr(demo, "_has_cuda_gpu", lambda: False)
    assert demo.main(["--port", "30555", "--cache-dir", str(tmp_path)]) == 1
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "no CUDA GPU" in lines[0], lines
    assert not any(tmp_path.iterdir())  # fails before building anything


def test_demo_dry_run_builds_once_and_prints_the_server_command(tmp_path, capsys):
    from sglang.sm120 import demo
    args = ["--dry-run", "--cache-dir", str(tmp_path), "--arch", "qwen3_moe", "--quant", "bf16",
            "--port", "30555", "--attention-backend", "flashinfer"]
    assert demo.main(args) == 0
    model_dir = tmp_path / "qwen3_moe-bf16-0"
    assert (model_dir / "model.safetensors").exists()
    cmd = [ln for ln in capsys.readouterr().err.splitlines() if "sglang.launch_server" in ln]
    assert cmd and f"--model-path {model_dir}" in cmd[0] and "--port 30555" in cmd[0]
    # passed-through flags come after the defaults, so they win in sglang's argparse
    assert cmd[0].index("--attention-backend triton") < cmd[0].index("--attention-backend flashinfer")
    assert "--enable-piecewise-cuda-graph" in cmd[0]  # the demo shows the fork's runner
    assert demo.main(args) == 0
    assert "using cached model" in capsys.readouterr().err


def test_demo_how_to_serve_names_a_real_model_launch(capsys):
    from sglang.sm120 import demo
    assert demo.main(["--how-to-serve"]) == 0
    out = capsys.readouterr().out
    assert "sglang.launch_server" in out and "--enable-piecewise-cuda-graph" in out and "--tp 8" in out


def test_demo_serve_reports_ready_time_and_answer(tmp_path, capsys):
    """serve() against a stand-in server process: ready time, the greedy answer, the real-model
    hint, and the server stopped after --once; a server that dies before ready is an error (1)."""
    from sglang.sm120 import demo

    srv = launcher_server(name="tiny", model_dir=str(tmp_path), log_path=str(tmp_path / "srv.log"),
                          args=["--healthy-after", "0.5"])
    assert demo.serve(srv, once=True, ready_timeout=30) == 0
    err = capsys.readouterr().err
    assert "ready in" in err and "' Paris.'" in err and "sglang.launch_server" in err
    assert srv.shutdown is not None and srv.shutdown.clean  # stopped after the answer

    dead = launcher_server(name="tiny", model_dir=str(tmp_path), log_path=str(tmp_path / "dead.log"),
                           args=["--exit-at-start", "3"])
    assert demo.serve(dead, once=True, ready_timeout=30) == 1
    assert "exited with code 3" in capsys.readouterr().err


def test_demo_server_takes_host_port_and_the_passed_flags_last():
    from sglang.sm120 import demo

    a, extra = demo.parse_args(["--port", "30555", "--host", "0.0.0.0", "--quant", "bf16", "--tp", "2"])
    srv = demo.make_server("/m", a, extra)
    assert (srv.port, srv.host, srv.name, srv.log_path) == (30555, "0.0.0.0", "tiny-qwen3_moe-bf16", None)
    assert srv.args[-2:] == ["--tp", "2"] and srv.args[:len(demo.DEMO_SERVER_ARGS)] == demo.DEMO_SERVER_ARGS
