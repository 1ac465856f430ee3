"""Every build variable is checked where it is read: a malformed value is one `error:` line naming
the variable and what it accepts, from the build (setup.py), from the kernel builder, and from
tools/venv.sh, install_and_serve.sh and run_tests.sh before they create any venv; good values
build as they say. tools/venv.sh shows progress while pip installs."""
from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]

pytestmark = pytest.mark.base_independent

# name -> (malformed values, words the error must carry (the accepted values), good value -> parsed)
CASES = {
    "SGLANG_SM120_KERNELS": (["maybe", "2", "enabled"], ["auto, 0, 1"],
                             {"auto": "auto", "0": "0", "1": "1", "OFF": "0", "yes": "1", "": "auto"}),
    "SGLANG_SM120_BUILD_JOBS": (["two", "-1", "1.5"], ["an integer >= 0"], {"0": 0, "8": 8, " 3 ": 3, "": 0}),
    "SGLANG_SM120_SASS_CHECK": (["off", "no", "true"], ["1 (", "0 ("], {"0": False, "1": True, "": True}),
    "SGLANG_SM120_ARCHS": (["sm90", "sm_90a;sm_120a", "compute_90"], ["sm_<number>[a|f]", "sm_90a,sm_120a"],
                           {"sm_120a": "sm_120a", "sm_90a, sm_120f": "sm_90a, sm_120f", "": "sm_90a,sm_120a"}),
    "SGLANG_SM120_BASE": (["0.5.99", "latest", "0.5.16,0.5.23"], ["0.5.16", "0.5.23", "UPSTREAM.toml"],
                          {"0.5.16": "0.5.16", "0.5.23": "0.5.23", "": None}),
    "SGLANG_SM120_CACHE": ([str(REPO / "UPSTREAM.toml")], ["a folder"],
                           {"/nonexistent/cache": "/nonexistent/cache", str(REPO): str(REPO), "": None}),
    "SGLANG_SM120_INDEX_URL": (["pypi.org/simple", "ftp://mirror/simple"], ["http://", "https://", "file://"],
                               {"https://pypi.org/simple": "https://pypi.org/simple",
                                "file:///srv/index": "file:///srv/index", "": None}),
}


def _read(name, raw):
    from forkbuild import settings as build_settings

    if name == "SGLANG_SM120_BASE":
        return build_settings.base({name: raw})
    return build_settings.read(name, {name: raw})


def test_every_build_setting_has_a_case():
    from forkbuild import settings as build_settings

    assert sorted(build_settings.build_names()) == sorted(CASES)


@pytest.mark.parametrize("name, raw", [(n, bad) for n, (bads, _, _) in CASES.items() for bad in bads])
def test_a_malformed_value_is_one_line_naming_the_variable_and_what_it_accepts(name, raw):
    from forkbuild.errors import BuildError

    with pytest.raises(BuildError) as e:
        _read(name, raw)
    line = str(e.value)
    assert "\n" not in line and line.startswith(f"{name}={raw.strip()!r}: expected "), line
    for word in CASES[name][1]:
        assert word in line, line


@pytest.mark.parametrize("name, raw, value", [(n, raw, v) for n, (_, _, goods) in CASES.items()
                                              for raw, v in goods.items()])
def test_good_values_are_accepted(name, raw, value):
    assert _read(name, raw) == value


# -------------------------------------------------------------------- the readers use the registry

def _environ_reads(tree: ast.AST) -> list[str]:
    """SGLANG_SM120_* names read straight from the environment (os.environ.get / [] / getenv),
    also through a module-level constant holding the name."""
    consts = {t.id: n.value.value for n in ast.walk(tree) if isinstance(n, ast.Assign)
              and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)
              for t in n.targets if isinstance(t, ast.Name)}

    def name_of(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        return consts.get(node.id) if isinstance(node, ast.Name) else None

    def is_environ(node):
        return isinstance(node, ast.Attribute) and node.attr == "environ" or \
            isinstance(node, ast.Name) and node.id == "environ"

    found = []
    for n in ast.walk(tree):
        arg = None
        if isinstance(n, ast.Call) and n.args and isinstance(n.func, ast.Attribute) and (
                n.func.attr == "getenv" or n.func.attr in ("get", "pop") and is_environ(n.func.value)):
            arg = n.args[0]
        elif isinstance(n, ast.Subscript) and is_environ(n.value):
            arg = n.slice
        name = name_of(arg) if arg is not None else None
        if name and name.startswith("SGLANG_SM120_"):
            found.append(name)
    return found


def test_the_build_reads_its_variables_only_through_the_registry():
    files = [REPO / "setup.py", *sorted((REPO / "forkbuild").glob("*.py"))]
    direct = {f.relative_to(REPO).as_posix(): r for f in files if (r := _environ_reads(ast.parse(f.read_text())))}
    assert not direct, f"read around python/sglang/sm120/settings.py (use forkbuild.settings.read): {direct}"
    # and the scan sees such a read
    sample = 'import os\nX = "SGLANG_SM120_BUILD_JOBS"\nos.environ.get(X, "0")\nos.getenv("SGLANG_SM120_ARCHS")\n'
    assert _environ_reads(ast.parse(sample)) == ["SGLANG_SM120_BUILD_JOBS", "SGLANG_SM120_ARCHS"]


def test_the_kernel_builder_reads_jobs_and_archs_through_the_registry(monkeypatch, tmp_path):
    from forkbuild import kernels
    from forkbuild.errors import BuildError

    monkeypatch.setenv("SGLANG_SM120_ARCHS", "sm_120a")
    assert kernels.default_archs() == ["sm_120a"]
    monkeypatch.setenv("SGLANG_SM120_ARCHS", "sm120")
    with pytest.raises(BuildError, match="SGLANG_SM120_ARCHS='sm120': expected a comma list"):
        kernels.default_archs()
    # BUILD_JOBS is read once nvcc and the sources are found, before anything compiles
    monkeypatch.setattr(kernels, "find_nvcc", lambda: "/bin/false")
    monkeypatch.setenv("SGLANG_SM120_BUILD_JOBS", "two")
    with pytest.raises(BuildError, match="SGLANG_SM120_BUILD_JOBS='two': expected an integer >= 0"):
        kernels.build_kernels(REPO / "csrc", tmp_path, ["sm_90a"], log=lambda *_: None)


def test_kernels_maybe_is_refused_not_built_as_auto(monkeypatch):
    from forkbuild import build
    from forkbuild.errors import BuildError

    monkeypatch.setenv("SGLANG_SM120_KERNELS", "maybe")
    with pytest.raises(BuildError, match="SGLANG_SM120_KERNELS='maybe': expected one of auto, 0, 1"):
        build.kernels_wanted()
    monkeypatch.setenv("SGLANG_SM120_KERNELS", "off")
    assert build.kernels_wanted() is False


# ----------------------------------------------------------------- the front doors: setup.py, scripts

@pytest.mark.parametrize("name", sorted(CASES))
def test_setup_py_refuses_a_malformed_value_before_any_download(name, tmp_path):
    """The build checks every variable first: one error line, no wheel, nothing fetched."""
    raw = CASES[name][0][0]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_SM120_")}
    env.update({"SGLANG_SM120_KERNELS": "0", name: raw, "SGLANG_UPSTREAM_WHEEL": str(tmp_path / "no-wheel")})
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, str(REPO / "setup.py"), "wheel", "--out", str(out)],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 1, proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error: ")]
    assert errors == [ln for ln in proc.stderr.splitlines() if ln.strip()], proc.stderr  # nothing else
    assert len(errors) == 1 and errors[0].startswith(f"error: {name}={raw!r}: expected "), proc.stderr
    assert not out.exists()


SCRIPT_PARTS = ("tools/venv.sh", "tools/heartbeat.sh", "tools/install_and_serve.sh", "tools/run_tests.sh",
                "UPSTREAM.toml", "forkbuild", "python/sglang/sm120/settings.py")


@pytest.fixture()
def script_repo(tmp_path):
    """A copy of what the setup scripts run before their first venv (nothing else: a script that
    went further would fail on the missing rest, visibly)."""
    root = tmp_path / "repo"
    for part in SCRIPT_PARTS:
        (root / part).parent.mkdir(parents=True, exist_ok=True)
        if (REPO / part).is_dir():
            shutil.copytree(REPO / part, root / part, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(REPO / part, root / part)
    return root


def _run_script(root: Path, script: str, **env_extra) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_SM120_")}
    env.update(PYTHON=sys.executable, **env_extra)
    return subprocess.run(["bash", str(root / script)], cwd=root, capture_output=True, text=True,
                          env=env, timeout=120)


@pytest.mark.parametrize("script, env", [
    ("tools/install_and_serve.sh", {"SGLANG_SM120_BASE": "0.5.99"}),
    ("tools/venv.sh", {"SGLANG_SM120_BASE": "0.5.99"}),
    ("tools/run_tests.sh", {"SGLANG_SM120_BASE": "0.5.99"}),
    ("tools/run_tests.sh", {"SGLANG_SM120_TEST_BASES": "0.5.16 0.5.99"}),
    ("tools/install_and_serve.sh", {"SGLANG_SM120_BUILD_JOBS": "two"}),
    ("tools/install_and_serve.sh", {"SGLANG_SM120_DEPS": "all"}),
])
def test_setup_scripts_refuse_a_bad_value_before_creating_a_venv(script_repo, script, env):
    proc = _run_script(script_repo, script, **env)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out
    name, raw = next(iter(env.items()))
    raw = raw.split()[-1] if name == "SGLANG_SM120_TEST_BASES" else raw
    name = "SGLANG_SM120_BASE" if name == "SGLANG_SM120_TEST_BASES" else name
    errors = [ln for ln in out.splitlines() if ln.startswith("error: ")]
    assert errors == [f"error: {name}={raw!r}: expected " + errors[0].split(": expected ", 1)[1]], out
    assert not [p.name for p in script_repo.iterdir() if p.name.startswith(".venv")], "a venv was created"
    assert "pip" not in out and "Traceback" not in out, out


def test_the_check_passes_good_values(script_repo):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_SM120_")}
    env.update(SGLANG_SM120_KERNELS="auto", SGLANG_SM120_BUILD_JOBS="4", SGLANG_SM120_SASS_CHECK="0",
               SGLANG_SM120_BASE="0.5.16", SGLANG_SM120_DEPS="cpu-test")
    proc = subprocess.run([sys.executable, "-m", "forkbuild.settings", "--also", "SGLANG_SM120_DEPS",
                           "--base", "0.5.23"], cwd=script_repo, capture_output=True, text=True, env=env)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr


def test_heartbeat_reports_while_the_command_runs_and_keeps_its_status(tmp_path):
    (tmp_path / "venv").mkdir()
    (tmp_path / "venv" / "blob").write_bytes(b"\0" * (3 << 20))
    script = (f'source {REPO}/tools/heartbeat.sh\n'
              f'with_heartbeat 1 {tmp_path}/venv "installing dependencies" -- bash -c "sleep 2.5; exit 7"\n'
              'echo "rc=$?"\n'
              'with_heartbeat 1 - "building the wheel" -- true; echo "rc=$?"\n')
    t0 = time.monotonic()
    proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60)
    elapsed = time.monotonic() - t0
    lines = proc.stdout.splitlines()
    beats = [ln for ln in lines if ln.startswith("[setup] installing dependencies: ")]
    assert len(beats) == 2, proc.stdout  # at 1 s and 2 s; none after the command ended
    for beat in beats:  # elapsed time and the folder's size (3 MiB of data, du rounds up)
        assert re.fullmatch(rf"\[setup\] installing dependencies: [12] s so far, {tmp_path}/venv [34] MB", beat), beat
    assert "rc=7" in lines and lines[-1] == "rc=0", proc.stdout
    assert elapsed < 5, f"the heartbeat held the script for {elapsed:.1f} s after the command ended"


def test_venv_sh_installs_under_a_heartbeat():
    """Both dependency installs (full, cpu-test) and the wheel build run under a heartbeat."""
    text = (REPO / "tools" / "venv.sh").read_text()
    wrapped = re.findall(r'with_heartbeat 30 "\$VENV" "installing dependencies" -- \\?\s*vpip install -q (\S+)', text)
    assert wrapped == ['"$WHEEL"', "-r"], wrapped
    assert re.search(r'with_heartbeat 30 - "building the wheel" -- build_wheel', text)
