"""Fixtures for the GPU serving tests: tiny models built in the session, one sglang server each.

By default every selected model's server is launched at once when the first serving test
starts (JIT compiles and Python start-up overlap; each server holds a small KV pool), and each
is stopped after its own tests. SGLANG_SM120_TEST_PARALLEL=0 starts them one at a time instead.
Server logs and a summary JSON go to $SGLANG_SM120_RESULTS_DIR (like every GPU test's results),
else to $OUT, else to pytest's tmp dir.
"""
from __future__ import annotations

import json
import os
import time
from typing import Dict, List

import pytest

from sglang.sm120 import launcher
from sglang.sm120.tiny import serving as tiny_serving

MODELS = tiny_serving.TINY_MODELS
STARTUP_TIMEOUT = float(os.environ.get("SGLANG_SM120_TEST_STARTUP_TIMEOUT", "600"))
PARALLEL = os.environ.get("SGLANG_SM120_TEST_PARALLEL", "1") != "0"
SEED = 0


class Session:
    """Shared state: progress output, per-model results and the summary file."""

    def __init__(self, config, out_dir: str):
        self.config = config
        self.out_dir = out_dir
        self.t0 = time.time()
        self.results: Dict[str, Dict] = {}   # per model, goes into the summary file
        self.scores: Dict[str, Dict] = {}    # per model, served teacher-forced scores
        self.lines: List[str] = []

    def say(self, msg: str) -> None:
        line = f"[gpu-serving {time.time() - self.t0:6.1f}s] {msg}"
        self.lines.append(line)
        capman = self.config.pluginmanager.getplugin("capturemanager")
        if capman is not None:
            with capman.global_and_fixture_disabled():
                print(line, flush=True)
        else:
            print(line, flush=True)

    def record(self, model: str, key: str, value) -> None:
        self.results.setdefault(model, {})[key] = value

    def write_summary(self) -> str:
        from sglang.sm120.tiny.agreement import serving_targets

        path = os.path.join(self.out_dir, "gpu_serving_summary.json")
        with open(path, "w") as f:
            json.dump({"elapsed_s": round(time.time() - self.t0, 1),
                       "server_args": tiny_serving.server_args(),
                       "extra_server_args": tiny_serving.EXTRA_SERVER_ARGS, "parallel": PARALLEL,
                       "targets": serving_targets(self.results),
                       "models": self.results, "progress": self.lines}, f, indent=1)
        return path


def _selected_models(session) -> List[str]:
    """Models whose serving tests survived selection (-k etc.), in MODELS order."""
    seen = set()
    for item in session.items:
        cs = getattr(item, "callspec", None)
        if cs is not None and "server" in cs.params:
            seen.add(cs.params["server"])
    return [m for m in MODELS if m in seen]


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session, config, items):
    """All serving tests of one model run back to back, in file order, its shutdown test last:
    pytest's grouping by the module-scoped `server` parameter is best effort, and a model's server
    is stopped when its group ends (the first H200 run interleaved groups and lost servers)."""
    slots = [i for i, it in enumerate(items)
             if "server" in getattr(getattr(it, "callspec", None), "params", {})]
    def key(i):
        it = items[i]
        return (MODELS.index(it.callspec.params["server"]),
                it.originalname == "test_shutdown_is_clean", i)
    ordered = [items[i] for i in sorted(slots, key=key)]
    for slot, it in zip(slots, ordered):
        items[slot] = it


@pytest.fixture(scope="session")
def serving(request, tmp_path_factory):
    out = (os.environ.get("SGLANG_SM120_RESULTS_DIR") or os.environ.get("OUT")
           or str(tmp_path_factory.mktemp("gpu-serving")))
    os.makedirs(out, exist_ok=True)
    s = Session(request.config, out)
    yield s
    s.say(f"summary written to {s.write_summary()}")


@pytest.fixture(scope="session")
def tiny_models(serving, request, tmp_path_factory) -> Dict[str, str]:
    """Build the selected tiny models (CPU, a few seconds each) into a tmp dir."""
    from sglang.sm120.tiny.build import build
    from sglang.sm120.tiny.spec import default_spec

    root = tmp_path_factory.mktemp("tiny-models")
    dirs = {}
    for model in _selected_models(request.session):
        arch, quant = model.rsplit("-", 1)
        t = time.time()
        dirs[model] = build(str(root / model), default_spec(arch, quant, SEED),
                            log=lambda m: None)
        serving.say(f"{model}: built model in {time.time() - t:.1f}s -> {dirs[model]}")
        serving.record(model, "build_s", round(time.time() - t, 1))
    return dirs


class Fleet:
    def __init__(self, serving: Session, dirs: Dict[str, str]):
        self.serving = serving
        self.dirs = dirs
        self.servers: Dict[str, launcher.Server] = {}

    def launch(self, model: str) -> launcher.Server:
        if model not in self.servers:
            srv = launcher.Server(name=model, model_dir=self.dirs[model],
                                  log_path=os.path.join(self.serving.out_dir, f"server-{model}.log"),
                                  args=tiny_serving.server_args(model), env=tiny_serving.server_env(model))
            srv.start()
            self.servers[model] = srv
            self.serving.say(f"{model}: launched on port {srv.port}, log {srv.log_path}")
        return self.servers[model]

    def stop_all(self) -> None:
        for srv in self.servers.values():
            srv.stop()


@pytest.fixture(scope="session")
def fleet(serving, tiny_models):
    f = Fleet(serving, tiny_models)
    if PARALLEL:
        for model in tiny_models:
            f.launch(model)
    yield f
    f.stop_all()  # safety net; each model's own fixture stops it first


@pytest.fixture(scope="module")
def server(request, fleet, serving):
    """The running server of one model (indirect parameter: the model id)."""
    model = request.param
    srv = fleet.launch(model)
    if srv.shutdown is not None:
        raise launcher.ServerError(f"{model}: server already stopped by its shutdown test "
                                  f"(a test of this model was ordered after it)")
    try:
        t = srv.wait_ready(STARTUP_TIMEOUT, progress=serving.say)
    except launcher.ServerError:
        serving.record(model, "startup", "failed")
        srv.stop()
        raise
    if "ready_s" not in serving.results.get(model, {}):
        serving.say(f"{model}: ready after {t:.1f}s")
        serving.record(model, "ready_s", round(t, 1))
    # No stop here: pytest may set this fixture up again for the same model (its parametrization
    # key includes the index in each test's id list), so the server lives until that model's
    # test_shutdown_is_clean, ordered last by pytest_collection_modifyitems, or the session end.
    yield srv


@pytest.fixture(scope="module")
def K():
    """sglang.sm120.kernels with its library loaded (the kernel tests fail, not skip, without it)."""
    import torch

    from sglang.sm120 import kernels

    if not kernels.available():
        pytest.fail("libsm120_kernels.so is not built: run "
                    "`PYTHONPATH=python python3 -m forkbuild.kernels --out python/sglang/sm120/kernels/lib`")
    torch.backends.cuda.matmul.allow_tf32 = False
    return kernels
