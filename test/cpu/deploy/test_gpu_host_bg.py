"""deploy/bg.sh: a job started in one host call, waited on in the next."""
import os
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.base_independent

REPO = Path(__file__).resolve().parents[3]
BG = REPO / "deploy" / "bg.sh"


def bg(tmp_path, *args):
    env = dict(os.environ, BG_DIR=str(tmp_path / "bg"))
    return subprocess.run(["bash", str(BG), *args], env=env, capture_output=True, text=True, timeout=60)


def test_a_job_is_waited_on_across_calls_and_keeps_its_exit_code(tmp_path):
    flag = tmp_path / "go"
    job = f"echo first; while [ ! -e {flag} ]; do sleep 0.2; done; echo second; exit 4"
    assert bg(tmp_path, "start", "j", "--", "bash", "-c", job).returncode == 0
    again = bg(tmp_path, "start", "j", "--", "true")
    assert again.returncode == 1 and "already running" in again.stderr
    w = bg(tmp_path, "wait", "j", "1")
    assert w.returncode == 3 and "first" in w.stdout and "still running" in w.stdout
    flag.touch()
    w = bg(tmp_path, "wait", "j", "30")
    # only the lines not shown by the previous wait
    assert w.returncode == 4 and "second" in w.stdout and "first" not in w.stdout
    assert "j: exit 4" in bg(tmp_path, "status").stdout


def test_waiting_on_an_unknown_job_says_so(tmp_path):
    w = bg(tmp_path, "wait", "nope", "1")
    assert w.returncode == 1 and "no job nope" in w.stderr
