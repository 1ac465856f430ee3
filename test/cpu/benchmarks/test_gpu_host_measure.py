"""benchmarks/gpu_queue.sh: steps in order, each logged, a failed step does not stop the queue."""
import os
import subprocess

import pytest
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / "benchmarks" / "gpu_queue.sh"


def run(tmp_path, *steps, fail=""):
    fake = tmp_path / "python"
    # stands in for python3: records its arguments, fails when they contain $FAIL
    fake.write_text('#!/bin/sh\necho "$@${SGLANG_SM120_LAYERWISE_ZERO_COPY:+ [zero-copy]}'
                    '${SGLANG_SM120_LEAN_MOE:+ [lean=$SGLANG_SM120_LEAN_MOE]}'
                    '${SGLANG_SM120_GPU_MOE_BACKEND:+ [moe=$SGLANG_SM120_GPU_MOE_BACKEND]}'
                    '${SGLANG_SM120_GPU_QUICK:+ [quick]}" >> "$CALLS"\n'
                    'case "$*" in *"$FAIL"*) [ -n "$FAIL" ] && { echo "1 failed"; exit 1; } ;; esac\n'
                    'echo "1 passed"\n')
    fake.chmod(0o755)
    env = dict(os.environ, PYTHON=str(fake), NCU=str(fake), CALLS=str(tmp_path / "calls"), FAIL=fail,
               CORRECTNESS_FULL_STAGGER_S="0")
    proc = subprocess.run(["bash", str(SCRIPT), str(tmp_path / "res"), *steps], env=env,
                          capture_output=True, text=True, timeout=60)
    calls = (tmp_path / "calls").read_text().splitlines() if (tmp_path / "calls").exists() else []
    return proc, calls


def set_or_unset(monkeypatch, name, value):
    """The step's variable as the parametrization says: a value, or absent (None)."""
    if value is None:
        monkeypatch.delenv(name, raising=False)
    else:
        monkeypatch.setenv(name, value)


def test_steps_run_in_order_and_a_failure_does_not_stop_the_queue(tmp_path):
    proc, calls = run(tmp_path, "fp4", "runner", "traps", fail="bench_runner")
    assert proc.returncode == 1
    assert [c.split()[0] for c in calls] == ["benchmarks/bench_fp4_gemm.py", "benchmarks/bench_runner.py", "-m"]
    assert "--results-dir " + str(tmp_path / "res") in calls[0]
    assert "test/gpu/test_layerwise_traps.py" in calls[2]
    assert "runner: rc 1" in proc.stdout and "failed steps: runner" in proc.stdout
    assert (tmp_path / "res" / "fp4.log").read_text().strip() == "1 passed"


def test_unknown_step_is_refused(tmp_path):
    proc, calls = run(tmp_path, "fp4", "nope")
    assert proc.returncode == 2 and "unknown step nope" in proc.stdout
    assert calls == []  # refused before the first step ran


def test_serving_steps_run_only_when_named(tmp_path):
    proc, calls = run(tmp_path, "serving", "soak")
    assert proc.returncode == 0, proc.stdout
    assert [c.split()[0] for c in calls] == ["benchmarks/bench_serving_matrix.py", "benchmarks/soak.py"]
    default = tmp_path / "default"
    default.mkdir()
    proc, calls = run(default)  # no steps named: the default list, without the serving session
    # 13 steps; correctness-full runs nine processes, correctness-alone two, `kernels`
    # kernels_check.sh (build, smoke, pytest: 3 calls), prefill-fa2 two
    assert proc.returncode == 0 and len(calls) == 25
    # the whole correctness grid first (what #4 still has to show), one model alone twice, then
    # SM120's prefill plan, the runner
    assert all("test_layerwise_correctness.py" in c and "--basetemp" in c for c in calls[:11])
    assert calls[9].endswith("-k deepseek_v2-bf16") and calls[10].endswith("-k deepseek_v2-bf16 [lean=0]")
    assert calls[11].startswith("benchmarks/bench_runner.py") and "--configs layerwise_fa2_prefill" in calls[11]
    assert "test_layerwise_correctness.py" in calls[12] and calls[13].startswith("benchmarks/bench_runner.py")
    assert "--configs layerwise_zero_copy" in calls[14]
    assert not {c.split()[0] for c in calls} & {"benchmarks/bench_serving_matrix.py", "benchmarks/soak.py"}


def test_serving_soak_step_soaks_the_matrix_layerwise_server(tmp_path):
    proc, calls = run(tmp_path, "serving-soak")
    assert proc.returncode == 0, proc.stdout
    assert len(calls) == 1 and calls[0].startswith("benchmarks/bench_serving_matrix.py")
    assert "--then-soak 10" in calls[0] and "--copy-to " + str(tmp_path / "res" / "serving-copy") in calls[0]


def test_serving_diag_step_runs_one_server_with_four_clients_then_the_soak(tmp_path):
    proc, calls = run(tmp_path, "client-ceiling", "serving-diag")
    assert proc.returncode == 0, proc.stdout
    assert [c.split()[0] for c in calls] == ["benchmarks/client_ceiling.py", "benchmarks/bench_serving_matrix.py"]
    diag = calls[1]
    assert "--configs layerwise --concurrency 1024 --client-procs 4 --then-soak 10" in diag


def test_lean_moe_step_runs_the_gpu_test_with_a_results_dir(tmp_path):
    proc, calls = run(tmp_path, "lean-moe")
    assert proc.returncode == 0 and len(calls) == 1
    assert calls[0].startswith("-m pytest -m gpu") and "test/gpu/test_lean_moe.py" in calls[0]


def test_serving_tw4_step_widens_the_streaming_path_for_every_server(tmp_path):
    proc, calls = run(tmp_path, "serving-tw4")
    assert proc.returncode == 0 and len(calls) == 1
    assert "--client-procs 4" in calls[0] and "--server-args --tokenizer-worker-num 4" in calls[0]
    assert "--then-soak 10" in calls[0] and "--tag h200 " in calls[0]


def test_usage_prints_the_whole_header(tmp_path):
    proc = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "moe-fp4" in proc.stderr and "serving-tw4" in proc.stderr and "set -uo" not in proc.stderr


def test_kernels_step_builds_smokes_and_tests_without_the_quick_benchmark(tmp_path):
    proc, calls = run(tmp_path, "kernels")
    assert proc.returncode == 0, proc.stdout
    assert [c.split()[:2] for c in calls] == [["-m", "forkbuild.kernels"], ["lab/kernels_smoke.py"],
                                              ["-m", "pytest"]]
    assert "bench: skipped (BENCH_CAP=0)" in (tmp_path / "res" / "kernels-check" / "summary.txt").read_text()


def test_prefill_fa2_step_benchmarks_and_checks_correctness_under_the_switch(tmp_path):
    proc, calls = run(tmp_path, "prefill-fa2")
    assert proc.returncode == 0, proc.stdout
    assert calls[0].startswith("benchmarks/bench_runner.py") and "--configs layerwise_fa2_prefill" in calls[0]
    assert "test/gpu/test_layerwise_correctness.py" in calls[1] and '-k qwen3_moe-bf16' in calls[1]
    assert (tmp_path / "res" / "fa2").is_dir()
    assert "SGLANG_SM120_LAYERWISE_PREFILL_ATTENTION=fa2" in SCRIPT.read_text()


def test_full_grid_step_runs_each_model_in_its_own_process_and_reports_each_failure(tmp_path, monkeypatch):
    monkeypatch.setenv("CORRECTNESS_FULL_STAGGER_S", "0")
    proc, calls = run(tmp_path, "correctness-full", fail="-k qwen3_moe-nvfp4")
    assert proc.returncode == 1, proc.stdout
    runs = sorted(c.split(" -k ")[1] for c in calls)
    assert runs == ["deepseek_v2-bf16", "deepseek_v2-nvfp4", "glm4_moe-bf16", "glm4_moe-nvfp4", "glm_moe_dsa-bf16",
                    "glm_moe_dsa-nvfp4", "qwen3_moe-bf16", "qwen3_moe-bf16 [zero-copy]",
                    "qwen3_moe-nvfp4"]  # the eight models, and qwen3_moe bf16 again under zero-copy
    assert all("test/gpu/test_layerwise_correctness.py" in c for c in calls)
    assert len({c.split("--basetemp ")[1].split()[0] for c in calls}) == 9  # no shared pytest tmp dir
    assert (tmp_path / "res" / "correctness-full-qwen3_moe-bf16-zero-copy.log").is_file()
    assert "failed steps: correctness-full-qwen3_moe-nvfp4" in proc.stdout
    assert (tmp_path / "res" / "correctness-full-deepseek_v2-bf16.log").read_text().strip() == "1 passed"
    text = SCRIPT.read_text()
    assert not any("[quick]" in c for c in calls)  # the whole grid
    assert "SGLANG_SM120_GPU_MAX_TOKENS=2200000" in text[text.index("grids_side_by_side() {"):]


@pytest.mark.parametrize("full", [None, "1"])
def test_moe_sm120_grid_runs_each_nvfp4_model_on_the_sm120_kernel(tmp_path, monkeypatch, full):
    set_or_unset(monkeypatch, "CORRECTNESS_MOE_FULL", full)
    monkeypatch.delenv("SGLANG_SM120_GPU_QUICK", raising=False)
    proc, calls = run(tmp_path, "correctness-moe-sm120", "traps", fail="-k glm4_moe-nvfp4")
    assert proc.returncode == 1, proc.stdout
    grid, traps = calls[:4], calls[4]
    quick = "" if full else " [quick]"
    assert sorted(c.split(" -k ")[1] for c in grid) == [
        f"{m}-nvfp4 [moe=sm120]{quick}" for m in ("deepseek_v2", "glm4_moe", "glm_moe_dsa", "qwen3_moe")]
    assert "[moe=" not in traps and "[quick]" not in traps  # nothing leaks into the next step
    assert (tmp_path / "res" / "moe-sm120").is_dir()
    assert "failed steps: correctness-moe-sm120-glm4_moe-nvfp4" in proc.stdout


def test_alone_step_runs_one_model_alone_then_with_upstreams_moe(tmp_path, monkeypatch):
    monkeypatch.delenv("SGLANG_SM120_LEAN_MOE", raising=False)
    proc, calls = run(tmp_path, "correctness-alone")
    assert proc.returncode == 0, proc.stdout
    assert calls[0].endswith("-k deepseek_v2-bf16") and calls[1].endswith("-k deepseek_v2-bf16 [lean=0]")
    assert calls[0].split("--basetemp ")[1].split()[0] != calls[1].split("--basetemp ")[1].split()[0]
    assert (tmp_path / "res" / "correctness-alone-deepseek_v2-bf16-upstream-moe.log").is_file()
    text = SCRIPT.read_text()
    block = text[text.index("    correctness-alone)"):text.index("    eager-warmup)")]
    assert "SGLANG_SM120_GPU_QUICK" not in block  # the whole grid


def test_steps_use_the_installed_library_unless_the_kernels_step_built_one(tmp_path, monkeypatch):
    """Pointing SGLANG_SM120_KERNEL_LIB at the tree's library when it is absent would hide the
    installed fork's own (the check then fails at its env stage)."""
    monkeypatch.delenv("SGLANG_SM120_KERNEL_LIB", raising=False)
    fake = tmp_path / "python"
    fake.write_text('#!/bin/sh\necho "lib=${SGLANG_SM120_KERNEL_LIB:-unset}" >> "$CALLS"\necho "1 passed"\n')
    fake.chmod(0o755)
    env = dict(os.environ, PYTHON=str(fake), CALLS=str(tmp_path / "calls"))
    proc = subprocess.run(["bash", str(SCRIPT), str(tmp_path / "res"), "sm120-check", "fp4"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    calls = (tmp_path / "calls").read_text().splitlines()
    assert len(calls) >= 2 and set(calls) == {"lib=unset"}, calls


def test_gpu_suite_step_runs_every_gpu_test_but_the_grid(tmp_path, monkeypatch):
    monkeypatch.setenv("GPU_SUITE_K", "glm4_moe and bf16")
    proc, calls = run(tmp_path, "gpu-suite")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (call,) = calls
    assert call.startswith("-m pytest -m gpu") and call.rstrip().endswith("test/gpu")
    assert "--ignore test/gpu/test_layerwise_correctness.py" in call and "-k glm4_moe and bf16" in call


def test_moe_fp4_step_runs_the_gpu_test_then_the_benchmark_into_the_results(tmp_path):
    proc, calls = run(tmp_path, "moe-fp4", fail="test_moe_w4a16")
    assert proc.returncode == 1 and len(calls) == 2  # a failed test does not stop the benchmark
    assert calls[0].startswith("-m pytest -m gpu") and "test/gpu/test_moe_w4a16.py" in calls[0]
    assert calls[1] == f"benchmarks/bench_moe_fp4.py --pdl-off --m-tiles 2,4 --profile 1,64,1024 --results-dir {tmp_path / 'res'}"
    assert "failed steps: moe-fp4-test" in proc.stdout and (tmp_path / "res" / "moe-fp4.log").is_file()


@pytest.mark.parametrize("full,configs", [(None, None), ("1", "layerwise_moe_sm120 layerwise_moe_marlin")])
def test_twin_step_runs_the_twin_bench_quick_unless_told(tmp_path, monkeypatch, full, configs):
    set_or_unset(monkeypatch, "TWIN_FULL", full)
    set_or_unset(monkeypatch, "TWIN_CONFIGS", configs)
    proc, calls = run(tmp_path, "glm5-twin")
    assert proc.returncode == 0, proc.stdout
    (call,) = calls
    assert call.startswith("benchmarks/bench_twin.py") and ("--quick" in call) == (full is None)
    assert ("--configs layerwise_moe_sm120 layerwise_moe_marlin" in call) == bool(configs)
    assert "--out " + str(tmp_path / "res" / "glm5-twin-h200.json") in call
    from repo_scripts import load  # every flag the step passes parses under the bench's own parser

    bench = load("benchmarks/bench_twin.py")
    argv = call.split("benchmarks/bench_twin.py", 1)[1].split()
    assert bench.parse_args(argv).out == str(tmp_path / "res" / "glm5-twin-h200.json")


def test_the_queue_records_the_gpu_it_measures_on(tmp_path, monkeypatch):
    """RESULTS/gpu.txt (nvidia-smi's name and memory) is what status.py --take checks against each
    record's hardware; without nvidia-smi there is none, and the log says so."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text('#!/bin/sh\necho "NVIDIA H100 80GB HBM3, 81559 MiB"\n')
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    proc, _ = run(tmp_path, "lean-moe")
    assert (tmp_path / "res" / "gpu.txt").read_text() == "NVIDIA H100 80GB HBM3, 81559 MiB\n"
    assert "GPU: NVIDIA H100 80GB HBM3" in proc.stdout
    smi.write_text("#!/bin/sh\nexit 9\n")
    proc, _ = run(tmp_path, "lean-moe")
    assert not (tmp_path / "res" / "gpu.txt").exists() and "GPU: unknown" in proc.stdout


@pytest.mark.parametrize("models", [None, "qwen3_moe-bf16 qwen3-30b-a3b-nvfp4"])
def test_serving_parity_step_runs_the_bench_into_the_results(tmp_path, monkeypatch, models):
    set_or_unset(monkeypatch, "SERVING_PARITY_MODELS", models)
    proc, calls = run(tmp_path, "serving-parity")
    assert proc.returncode == 0, proc.stdout
    (call,) = calls
    assert call.startswith("benchmarks/bench_serving_parity.py --results-dir " + str(tmp_path / "res"))
    from repo_scripts import load  # every flag the step passes parses under the bench's own parser

    a = load("benchmarks/bench_serving_parity.py").parse_args(call.split(" ", 1)[1].split())
    assert a.workdir == str(tmp_path / "res" / "parity-work")
    assert a.models == (models.split() if models else load("benchmarks/bench_serving_parity.py").DEFAULT_MODELS)


def test_queue_cap_pct_scales_every_steps_cap(tmp_path, monkeypatch):
    monkeypatch.setenv("QUEUE_CAP_PCT", "150")
    proc, _ = run(tmp_path, "lean-moe")
    assert "lean-moe: start (cap 450 s)" in proc.stdout
