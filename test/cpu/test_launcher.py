"""sglang.sm120.launcher on a stand-in server process (fake_server.py): start, wait until ready,
stop the whole process group, the log, and the failures a caller must see."""
import os

import pytest
from fake_server import launcher_server

from sglang.sm120 import launcher


def _fake(tmp_path, *flags, **kw):
    return launcher_server(name="fake", model_dir=str(tmp_path), log_path=str(tmp_path / "logs" / "fake.log"),
                           args=list(flags), **kw)


def test_the_command_names_model_host_port_and_name_then_the_callers_flags():
    srv = launcher.Server(name="tiny", model_dir="/m", log_path=None, args=["--tp", "2"], port=31000)
    cmd = srv.command()
    assert cmd[1:3] == ["-m", "sglang.launch_server"] and cmd[-2:] == ["--tp", "2"]
    for flag, value in (("--model-path", "/m"), ("--host", "127.0.0.1"), ("--port", "31000"),
                        ("--served-model-name", "tiny")):
        assert cmd[cmd.index(flag) + 1] == value
    assert srv.url == "http://127.0.0.1:31000"
    # a server listening on every address is reached on the loopback one
    assert launcher.Server("t", "/m", None, host="0.0.0.0", port=31001).url == "http://127.0.0.1:31001"


def test_ready_after_the_health_check_passes_then_a_clean_stop_of_the_whole_group(tmp_path):
    srv = _fake(tmp_path, "--healthy-after", "1.5", "--child", env={"FAKE_GREETING": "bonjour"})
    srv.start()
    try:
        notes = []
        secs = srv.wait_ready(30, progress=notes.append, every=0.5)
        assert secs >= 1.5 and srv.ready_seconds == secs and srv.alive()
        assert notes and notes[0].startswith("fake: starting")
        assert launcher.request_json(srv.url + "/generate", {"text": "x"}) == {"text": " Paris."}
        assert len(launcher.group_members(srv.proc.pid)) == 2  # the server and its child
        assert os.getpgid(srv.proc.pid) == srv.proc.pid != os.getpgid(0)  # a group of its own
    finally:
        report = srv.stop(timeout=20)
    assert report.clean and not report.killed and report.port_free and report.returncode == 0
    assert launcher.group_members(srv.proc.pid) == [] and launcher.port_is_free(srv.port)
    assert srv.stop() is report  # idempotent
    log = (tmp_path / "logs" / "fake.log").read_text()
    assert log.startswith("$ ") and "fake_server.py --port" in log.splitlines()[0]
    assert "fake server listening" in log and "clean shutdown" in log
    assert "FAKE_GREETING=bonjour HF_HUB_OFFLINE=1" in log  # the caller's additions, and never the Hub


def test_a_group_that_ignores_sigterm_is_killed_and_the_stop_is_not_clean(tmp_path):
    srv = _fake(tmp_path, "--ignore-term", "--child")
    srv.start()
    srv.wait_ready(30)
    report = srv.stop(timeout=1)
    assert report.killed and not report.clean
    assert launcher.group_members(srv.proc.pid) == []


def test_a_server_that_exits_during_startup_fails_with_its_exit_code_and_log_tail(tmp_path):
    srv = _fake(tmp_path, "--exit-at-start", "3")
    srv.start()
    with pytest.raises(launcher.ServerError, match="exited with code 3") as e:
        srv.wait_ready(30)
    assert "refusing to start" in str(e.value) and "fake_server.py" in str(e.value)
    assert srv.stop().note == "process had already exited before stop"


def test_a_server_never_ready_fails_after_the_timeout(tmp_path):
    srv = _fake(tmp_path, "--healthy-after", "600")
    srv.start()
    try:
        with pytest.raises(launcher.ServerError, match="/health not ready after 2s"):
            srv.wait_ready(2)
    finally:
        srv.stop(timeout=10)


def test_wait_before_start_and_stop_of_a_server_never_started(tmp_path):
    srv = _fake(tmp_path)
    with pytest.raises(launcher.ServerError, match="before start"):
        srv.wait_ready(1)
    assert srv.stop().note == "never started"


def test_an_http_error_carries_status_and_body(tmp_path):
    srv = _fake(tmp_path)
    srv.start()
    try:
        srv.wait_ready(30)
        with pytest.raises(launcher.HTTPStatusError) as e:
            launcher.request_json(srv.url + "/nowhere")
        assert e.value.status == 404 and "no route /nowhere" in e.value.body
    finally:
        srv.stop(timeout=10)


def test_flush_cache_takes_the_plain_text_answer_and_raises_on_an_error_status(tmp_path):
    srv = _fake(tmp_path)
    srv.start()
    try:
        srv.wait_ready(30)
        launcher.flush_cache(srv.url)
        with pytest.raises(launcher.HTTPStatusError) as e:
            launcher.flush_cache(srv.url + "/nowhere")
        assert e.value.status == 404
    finally:
        srv.stop(timeout=10)


def test_without_a_log_file_the_server_writes_to_the_callers_terminal(tmp_path, capfd):
    srv = launcher_server(name="fake", model_dir=str(tmp_path), log_path=None, args=["--exit-at-start", "4"])
    srv.start()
    srv.proc.wait(timeout=30)
    assert "refusing to start" in capfd.readouterr().out
    assert "the server wrote to the terminal" in launcher.log_tail(None)
