"""Pre-built FlashInfer modules for GPU hosts: which ones, their names, the link stub, the install."""
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from deploy import flashinfer_aot as fa

REPO = Path(__file__).resolve().parents[3]

if importlib.util.find_spec("flashinfer") is None:  # found, not imported: its arch is read at import
    pytest.skip("flashinfer is not installed", allow_module_level=True)


def _plan_names(arch: str) -> list:
    """Module names FlashInfer's own generators give the plan (a fresh process: FlashInfer reads
    its target arch at import), checked against the URI its wrappers look up."""
    code = (
        "import json\n"
        "from deploy import flashinfer_aot as fa\n"
        "from flashinfer.prefill import get_batch_prefill_uri\n"
        "out = []\n"
        "for why, gen, args in fa.module_plan(%r):\n"
        "    name = fa.generator(gen)(*args).name\n"
        "    if gen == 'gen_batch_prefill_module': assert name == get_batch_prefill_uri(*args), name\n"
        "    out.append(name)\n"
        "print(json.dumps(out))\n"
    ) % (arch,)
    env = dict(os.environ, FLASHINFER_CUDA_ARCH_LIST=arch, PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd="/")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_plan_covers_what_the_gpu_jobs_plan_on_sm90():
    names = _plan_names("9.0a")
    assert len(names) == len(set(names)) == 10
    # tiny glm4_moe (4 heads / 2 kv heads of 128) decodes through the batch decode module
    assert sum(n.startswith("batch_decode_with_kv_cache") and "head_dim_qk_128_head_dim_vo_128_" in n
               for n in names) == 1
    prefill = [n for n in names if n.startswith("batch_prefill_with_kv_cache")]
    # fa2 (paged prefill, tensor-core decode) and fa3 (ragged prefill) for head dims 64 and 128
    for d in (64, 128):
        hd = f"head_dim_qk_{d}_head_dim_vo_{d}_"
        assert sum(hd in n and not n.endswith("_sm90") for n in prefill) == 1, d
        assert sum(hd in n and n.endswith("_sm90") for n in prefill) == 1, d
    assert any("head_dim_qk_192_head_dim_vo_128_" in n and n.endswith("_sm90") for n in prefill)  # MLA's MHA prefill
    assert any(n.startswith("batch_mla_attention") and "ckv_512_head_dim_kpe_64" in n and n.endswith("_sm90")
               for n in names)
    assert {"sampling", "cascade", "norm"} <= set(names)  # the last two: what the H200 still compiled
    assert all("dtype_q_bf16" in n and "use_swa_False" in n for n in prefill)


def test_plan_without_fa3_off_hopper():
    names = _plan_names("12.0f")
    assert not any(n.endswith("_sm90") for n in names)
    assert len(names) == len(set(names)) == 8  # fa2 serves paged and ragged alike


def test_gqa_below_four_adds_the_decode_module(monkeypatch):
    monkeypatch.setattr(fa, "model_attention_shapes",
                        lambda: {"m": {"kind": "gqa", "heads": 8, "kv_heads": 4, "head_dim": 64}})
    gens = [g for _, g, _ in fa.module_plan("9.0a")]
    assert gens == ["gen_batch_prefill_module", "gen_batch_decode_module", "gen_batch_prefill_module",
                    "sampling.gen_sampling_module", "cascade.gen_cascade_module", "norm.gen_norm_module"]


def test_model_filter_keeps_the_shared_modules_and_refuses_unknown_names(monkeypatch):
    monkeypatch.setattr(fa, "model_attention_shapes", lambda: {
        "tiny a": {"kind": "gqa", "heads": 8, "kv_heads": 2, "head_dim": 64},
        "tiny b": {"kind": "gqa", "heads": 4, "kv_heads": 2, "head_dim": 128}})
    only_a = fa.module_plan("9.0a", ["tiny a"])
    assert [why for why, _, _ in only_a][:2] == ["tiny a: paged prefill + tensor-core decode", "tiny a: ragged prefill"]
    assert all(not why.startswith("tiny b") for why, _, _ in only_a)
    assert {g for _, g, _ in only_a} >= {"sampling.gen_sampling_module", "norm.gen_norm_module"}
    assert fa.module_plan("9.0a", ["a", "b"]) == fa.module_plan("9.0a")
    with pytest.raises(ValueError, match="no model matches \\['tiny c'\\]"):
        fa.module_plan("9.0a", ["tiny c"])


@pytest.mark.nvcc
def test_driver_stub_links_as_libcuda_so_1(tmp_path):
    cuda_home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    if not (Path(cuda_home) / "include" / "cuda.h").exists():
        pytest.skip(f"no cuda.h under {cuda_home}")
    lib = fa.driver_stub(cuda_home, tmp_path) / "libcuda.so"
    dyn = subprocess.run(["readelf", "-dW", str(lib)], capture_output=True, text=True, check=True).stdout
    assert "SONAME" in dyn and "[libcuda.so.1]" in dyn
    syms = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True, check=True).stdout
    for sym in ("cuInit", "cuLaunchKernel", "cuModuleLoadData", "cuMemAlloc_v2", "cuGetProcAddress_v2"):
        assert f" T {sym}\n" in syms, sym


def _cache(tmp_path, version):
    cache = tmp_path / "jitcache"
    (cache / "gptq_marlin").mkdir(parents=True)
    (cache / "gptq_marlin" / "m.so").write_bytes(b"tvm")
    mod = cache / "flashinfer-aot" / "sampling"
    mod.mkdir(parents=True)
    (mod / "sampling.so").write_bytes(b"fi")
    (cache / "flashinfer-aot" / "manifest.json").write_text(json.dumps({"flashinfer": version, "modules": []}))
    site = tmp_path / "site"
    (site / "flashinfer").mkdir(parents=True)
    (site / "flashinfer" / "__init__.py").write_text("__version__ = '0.6.14'\n")
    return cache, site


def _install(cache, site, tmp_path):
    env = dict(os.environ, JIT_DIR=str(tmp_path / "jit"), PYTHON=sys.executable)
    return subprocess.run(["bash", str(REPO / "deploy" / "install_jitcache.sh"), str(cache), str(site)],
                          capture_output=True, text=True, env=env)


def test_install_puts_modules_where_flashinfer_and_tvm_ffi_look(tmp_path):
    cache, site = _cache(tmp_path, "0.6.14")
    proc = _install(cache, site, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (site / "flashinfer" / "data" / "aot" / "sampling" / "sampling.so").read_bytes() == b"fi"
    assert (tmp_path / "jit" / "gptq_marlin" / "m.so").read_bytes() == b"tvm"
    assert not (tmp_path / "jit" / "flashinfer-aot").exists()
    assert "1 FlashInfer modules (flashinfer 0.6.14)" in proc.stdout


def test_install_refuses_another_flashinfer_version(tmp_path):
    cache, site = _cache(tmp_path, "0.7.2")
    proc = _install(cache, site, tmp_path)
    assert proc.returncode != 0
    assert "built for flashinfer 0.7.2" in proc.stderr and "has 0.6.14" in proc.stderr
    assert not (site / "flashinfer" / "data" / "aot").exists()


def test_missing_toolkit_headers_link_only_the_missing_families(tmp_path):
    spec = importlib.util.find_spec("nvidia")
    roots = list(spec.submodule_search_locations or []) if spec else []
    have = {probe for probe, _ in fa.PIP_HEADER_FAMILIES
            if any((i / probe).exists() for r in roots for i in Path(r).glob("*/include"))}
    if have != {probe for probe, _ in fa.PIP_HEADER_FAMILIES}:
        pytest.skip("needs the pip nvidia-curand and nvidia-cublas headers")
    bare = tmp_path / "cuda"
    (bare / "include").mkdir(parents=True)
    inc = fa.missing_toolkit_headers(str(bare), tmp_path / "inc")
    names = {p.name for p in inc.iterdir()}
    assert {"curand_kernel.h", "cublasLt.h"} <= names
    assert all(n.startswith(("curand", "cublas")) for n in names)  # nothing else can be shadowed
    full = tmp_path / "cuda-full"
    (full / "include").mkdir(parents=True)
    for probe, _ in fa.PIP_HEADER_FAMILIES:
        (full / "include" / probe).write_text("")
    assert fa.missing_toolkit_headers(str(full), tmp_path / "inc2") is None
