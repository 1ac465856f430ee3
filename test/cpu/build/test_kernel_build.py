"""csrc builds for sm_90a and sm_120a, stays torch-free, and its SASS has what DESIGN.md promises.

One build (both archs, into a temporary folder) is shared by every test of this module.
"""
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
CSRC = REPO / "csrc"
from forkbuild import kernels as kb

pytestmark = [pytest.mark.nvcc, pytest.mark.base_independent]
SMEM_LIMIT = 101_376  # SM120 per-block shared memory; kept on every arch (DESIGN.md)


@pytest.fixture(scope="session")
def built(tmp_path_factory):
    if kb.find_nvcc() is None:
        pytest.skip("needs nvcc")
    out = tmp_path_factory.mktemp("kernels")
    lines = []
    info = kb.build_kernels(CSRC, out, ["sm_90a", "sm_120a"], log=lines.append)
    return info, out, lines


@pytest.fixture(scope="session")
def cuobjdump():
    tool = kb.find_cuobjdump()
    if tool is None:
        pytest.skip("cuobjdump not found (pip install nvidia-cuda-cuobjdump)")
    return tool


def _dump(tool, lib, *args):
    return subprocess.run([tool, *args, str(lib)], capture_output=True, text=True, check=True).stdout


def test_build_result_and_progress(built):
    info, out, lines = built
    assert info["archs"] == ["sm_90a", "sm_120a"]
    assert info["library"] == kb.LIBRARY_NAME and (out / info["library"]).is_file()
    assert {"quantize_nvfp4_kernel", "gemm_w4a16_kernel", "gemm_w4a4_kernel", "moe_align_kernel",
            "moe_w4a16_kernel", "moe_reduce_kernel"} <= set(info["kernels"])
    assert any("compiled gemm_w4a16.cu" in ln for ln in lines)
    assert "Used" in (out / kb.PTXAS_LOG).read_text()  # ptxas -v report kept next to the library
    if kb.find_cuobjdump():
        assert any("SASS check passed" in ln for ln in lines), lines


def test_csrc_is_torch_free_with_one_binding_file():
    files = sorted(p for p in CSRC.iterdir() if p.suffix in (".cu", ".cuh", ".h", ".cpp"))
    assert files
    for p in files:
        text = p.read_text()
        assert not re.search(r"#\s*include\s*[<\"](torch|ATen|c10|pybind11)", text), p.name
    binders = [p.name for p in files if 'extern "C"' in p.read_text()]
    assert binders == ["bindings.cu"]


def test_sm120_sass_has_fp4_mma_and_cvt(built, cuobjdump):
    _, out, _ = built
    sass = _dump(cuobjdump, out / kb.LIBRARY_NAME, "-sass", "-arch", "sm_120a")
    assert "OMMA.SF" in sass and "E2M1" in sass and "UE4M3" in sass
    assert "F2FP.SATFINITE.E2M1" in sass
    sass90 = _dump(cuobjdump, out / kb.LIBRARY_NAME, "-sass", "-arch", "sm_90a")
    assert "HMMA" in sass90 and "OMMA" not in sass90 and "E2M1" not in sass90


def test_unwritten_uniform_register_check_catches_the_ptxas_13_0_bug():
    bad_fn = """
        Function : k_bad
        /*0000*/                   UMOV UR4, 0x400 ;
        /*0010*/                   LDGSTS.E.BYPASS.128 [R76+UR0], desc[UR1][R40.64], !P3 ;
        /*0020*/                   EXIT ;
        Function : k_good
        /*0000*/                   ULDC.64 UR6, c[0x0][0x208] ;
        /*0010*/                   UIMAD.WIDE UR14, UR6, 0x200, URZ ;
        /*0020*/              @!P0 LDGSTS.E.BYPASS.128 [R7], desc[UR6][R2.64] ;
        /*0030*/                   IMAD.U32 R3, RZ, RZ, UR15 ;
        /*0040*/                   STG.E desc[UR7][R2.64], R3 ;
    """
    assert kb.unwritten_uniform_reads(bad_fn) == {"k_bad": [("UR0", "LDGSTS.E.BYPASS.128"),
                                                            ("UR1", "LDGSTS.E.BYPASS.128")]}


def test_build_refuses_sass_with_unwritten_uniform_registers(tmp_path):
    # a stand-in cuobjdump printing the SASS that ptxas 13.0 produced for the L2-hinted cp.async
    fake = tmp_path / "cuobjdump"
    fake.write_text("#!/bin/sh\ncat <<'EOF'\n        Function : gemm_bad\n"
                    "        /*0bd0*/                   LDGSTS.E.BYPASS.128 [R76+UR0], desc[UR1][R40.64], !P3 ;\n"
                    "EOF\n")
    fake.chmod(0o755)
    with pytest.raises(kb.KernelBuildError, match=r"sm_90a SASS of gemm_bad reads uniform registers.*UR0") as exc:
        kb.check_sass(tmp_path / "lib.so", ["sm_90a"], cuobjdump=str(fake))
    assert "\n" not in str(exc.value)


def _functions(sass: str) -> dict:
    """{mangled name: body} of every function in a cuobjdump -sass listing."""
    parts = re.split(r"\n\s*Function : (\S+)\n", sass)
    return dict(zip(parts[1::2], parts[2::2]))


def test_w4a16_prefetches_weights_before_the_pdl_wait_and_has_no_sc_fence(built, cuobjdump):
    """PDL: weight copies (LDGSTS) precede griddepcontrol.wait (ACQBULK), the grid triggers its
    dependents (PREEXIT) after its output store (triggered after the K loop, one-wave chains at
    M >= 7 run slower under PDL than plain), the split-K hand-off uses one acq_rel
    atomic, not fence.sc, and the cluster reduction has its two cluster barriers (UCGABAR arrive +
    wait)."""
    _, out, _ = built
    for arch in ("sm_90a", "sm_120a"):
        fns = {n: b for n, b in _functions(_dump(cuobjdump, out / kb.LIBRARY_NAME, "-sass", "-arch", arch)).items()
               if "gemm_w4a16_kernel" in n}
        assert len(fns) == 8, (arch, sorted(fns))  # M tiles 1, 2, 4, 8 x 4 or 8 warps
        for name, body in fns.items():
            assert body.count("ACQBULK") == 1 and body.count("PREEXIT") == 1, (arch, name)
            assert "STG.E.U16" not in body.split("PREEXIT", 1)[1], (arch, name, "an output store after the trigger")
            before_wait = body.split("ACQBULK", 1)[0]
            assert before_wait.count("LDGSTS") >= 4, (arch, name)  # the first stages' weights
            # every copy asks L2 for 256-byte fills (the neighbouring lines of a streamed tile come along)
            assert before_wait.count("LDGSTS.E.BYPASS.LTC256B.128") >= 4 and "LDGSTS.E.BYPASS.128" not in body, (
                arch, name)
            assert "MEMBAR.SC" not in body, (arch, name)
            assert re.search(r"ATOMG\.E\.ADD\S*\.STRONG\.GPU", body), (arch, name)
            assert body.count("UCGABAR_ARV") == 2 and body.count("UCGABAR_WAIT") == 2, (arch, name)
            m_tiles, warps = map(int, re.search(r"ILi(\d)ELi(\d)E", name).groups())
            assert body.count("LDG.E.U16") == 4 * m_tiles * (8 // warps), (
                arch, name, "one copy of the output store (bias loads per element)")
            # split-K partials move as one float4 per MMA accumulator, both ways (fewest hand-off instructions)
            assert body.count("STG.E.128.STRONG.GPU") == m_tiles * (8 // warps), (arch, name)
            assert "LDG.E.128.STRONG.GPU" in body and "LDG.E.STRONG.GPU" not in body, (arch, name)
            assert "GLOBALTIMER" not in body, (arch, name, "timeline stamps are for the probe build only")


def test_warpk_kernel_sass_waits_triggers_clusters_and_stores_once(built, cuobjdump):
    """The warp-K kernels (M tile 8/16 x 8/16 warps): one griddepcontrol.wait (ACQBULK) and one
    launch_dependents (PREEXIT); the cluster sum pushes each peer's sums into rank 0 with one DSMEM
    store (ST.E to the cluster window, no remote load) behind two barrier phases (arrives: at entry,
    then one per rank branch; waits: before the store, and rank 0's); weights and scales streamed
    with L1 no-allocate loads and 256-byte L2 fills (the PDL instantiation prefetches the first batch to L2 before the
    wait), X read at L2 (.cg), one output store (one bias load), no timeline stamps and no cp.async."""
    _, out, _ = built
    for arch in ("sm_90a", "sm_120a"):
        fns = {n: b for n, b in _functions(_dump(cuobjdump, out / kb.LIBRARY_NAME, "-sass", "-arch", arch)).items()
               if "gemm_w4a16_warpk_kernel" in n}
        assert len(fns) == 8, (arch, sorted(fns))  # M tiles 1, 2 x 8 or 16 warps x plain / PDL
        for name, body in fns.items():
            assert body.count("ACQBULK") == 1 and body.count("PREEXIT") == 1, (arch, name)
            assert body.count("UCGABAR_ARV") == 3 and body.count("UCGABAR_WAIT") == 2, (arch, name)
            assert len(re.findall(r"\bST\.E ", body)) == 1 and not re.search(r"\bLD\.E ", body), (arch, name)
            # the PDL instantiation's L2 prefetches of its first batch (and that batch's loads) precede
            # the wait, so the weights are on their way during the previous kernel's tail; the plain
            # one prefetches nothing
            before_wait = body.split("ACQBULK", 1)[0]
            if name.endswith("ELb1EEEvNS_11W4A16ParamsE"):
                assert "CCTL.E.PF2" in before_wait and "LDG.E.NA.LTC256B.128.CONSTANT" in before_wait, (arch, name)
            else:
                assert name.endswith("ELb0EEEvNS_11W4A16ParamsE") and "CCTL.E.PF2" not in body, (arch, name)
            # 256-byte L2 fills, as in the split-K kernel
            assert "LDG.E.NA.LTC256B.128.CONSTANT" in body and "LDG.E.NA.LTC256B.64.CONSTANT" in body, (arch, name)
            assert "LDG.E.NA.128.CONSTANT" not in body, (arch, name)
            assert "LDG.E.128.STRONG.GPU" in body, (arch, name)  # ld.global.cg of X
            assert body.count("LDG.E.U16") == 1 and body.count("STG.E.U16") == 1, (arch, name)
            assert "LDGSTS" not in body and "GLOBALTIMER" not in body, (arch, name)


def test_no_kernel_reads_an_unwritten_uniform_register(built, cuobjdump):
    _, out, _ = built
    for arch in ("sm_90a", "sm_120a"):
        sass = _dump(cuobjdump, out / kb.LIBRARY_NAME, "-sass", "-arch", arch)
        assert sass.count("Function : ") >= 8, f"no SASS functions parsed for {arch}"
        assert "LDGSTS" in sass and "UR" in sass  # the parser has something to check
        bad = kb.unwritten_uniform_reads(sass)
        assert not bad, f"{arch}: uniform registers read but never written (bad ptxas encoding): {bad}"


def test_shared_memory_and_no_spills_on_every_arch(built, cuobjdump):
    _, out, _ = built
    seen = {}
    for arch in ("sm_90a", "sm_120a"):
        res = _dump(cuobjdump, out / kb.LIBRARY_NAME, "-res-usage", "-arch", arch)
        for fn, body in re.findall(r"Function (\S+):\s*\n\s*(REG:.*)", res):
            fields = dict(re.findall(r"(\w+):(\d+)", body))
            seen[(arch, fn)] = fields
            assert int(fields["SHARED"]) <= SMEM_LIMIT, (arch, fn, fields)
            assert int(fields.get("LOCAL", 0)) == 0, f"{fn} on {arch} uses local memory (spills): {fields}"
    names = {fn for _, fn in seen}
    for kernel in ("quantize_nvfp4_kernel", "gemm_w4a16_kernel", "gemm_w4a4_kernel", "moe_w4a16_kernel"):
        for arch in ("sm_90a", "sm_120a"):
            assert any(kernel in fn for a, fn in seen if a == arch), (kernel, arch, names)


def test_moe_kernel_sass_streams_weights_in_batches_of_four_and_fuses_silu(built, cuobjdump):
    """The grouped MoE GEMM per arch: 3 M tiles x (gate_up, down); bf16 MMAs (4 per 64-K chunk per
    M tile, 4 chunks a batch); per batch 4 weight loads of 16 B and 4 scale loads of 8 B with L1
    no-allocate and 256-byte L2 fills; no cp.async; SiLU's exponential only in gate_up; bf16 stores."""
    _, out, _ = built
    for arch in ("sm_90a", "sm_120a"):
        fns = {n: b for n, b in _functions(_dump(cuobjdump, out / kb.LIBRARY_NAME, "-sass", "-arch", arch)).items()
               if "moe_w4a16_kernel" in n}
        assert len(fns) == 6, (arch, sorted(fns))
        for name, body in fns.items():
            m_tiles, gate_up = map(int, re.search(r"ILi(\d)ELb(\d)E", name).groups())
            assert body.count("HMMA.16816.F32.BF16") == 16 * m_tiles, (arch, name)
            assert body.count("LDG.E.NA.LTC256B.128.CONSTANT") == 4, (arch, name)
            assert body.count("LDG.E.NA.LTC256B.64.CONSTANT") == 4, (arch, name)
            assert "LDGSTS" not in body and "STG.E.U16" in body, (arch, name)
            assert ("MUFU.EX2" in body) == bool(gate_up), (arch, name)


def _lib_abi_version() -> int:
    """The ABI the Python loader expects (sglang/sm120/kernels/_lib.py); it must match the library."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("_sm120_lib", REPO / "python/sglang/sm120/kernels/_lib.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.ABI_VERSION


def test_library_loads_without_gpu(built):
    # the static CUDA runtime only touches the driver on the first CUDA call: loading and the
    # host-only entry points work on a machine without a GPU (and in a fresh process)
    _, out, _ = built
    code = (
        "import ctypes; lib = ctypes.CDLL(%r);"
        "lib.sm120_build_archs.restype = ctypes.c_char_p;"
        "out = (ctypes.c_int * 9)(); need = ctypes.c_size_t(0);"
        "rc = lib.sm120_w4a16_plan(1, 6144, 2048, 132, ctypes.c_size_t(1 << 24), 0, 16, out, ctypes.byref(need));"
        "print(lib.sm120_abi_version(), lib.sm120_build_archs().decode(), rc, list(out))"
    ) % str(out / kb.LIBRARY_NAME)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    abi, archs, rc, plan = proc.stdout.split(" ", 3)
    assert (abi, archs, rc) == (str(_lib_abi_version()), "sm_90a,sm_120a", "0")
    m_tiles, m_blocks, n_ctas, splits, _, cluster, target, warpk, warps = eval(plan)
    # the split-K kernel (flag 16): 6144 x 2048 is a 7 MB weight, below the 8 MB line, so M = 1 aims
    # for 1 CTA per SM, and its 48 tiles take the most splits that fit one wave; no warp flag: 4 warps
    assert (m_tiles, m_blocks, n_ctas, cluster, target, warpk, warps) == (1, 1, 48, 0, 132, 0, 4)
    assert splits == 2 and n_ctas * splits <= 132


def _moe_plan_fn(lib_path):
    import ctypes
    lib = ctypes.CDLL(str(lib_path))
    lib.sm120_last_error.restype = ctypes.c_char_p

    def plan(t, topk, e, h, i, gate_up_k_warps=0, down_k_warps=0, m_tiles=0):
        out = (ctypes.c_int * 5)()
        rc = lib.sm120_moe_w4a16_plan(t, topk, e, h, i, gate_up_k_warps, down_k_warps, m_tiles, out)
        return (rc, lib.sm120_last_error().decode()) if rc else dict(
            zip(("m_tiles", "rows_per_item", "max_items", "gate_up_k_warps", "down_k_warps"), out))
    return plan


def test_moe_plan_m_tile_and_warps_per_tile(built):
    _, out, _ = built
    plan = _moe_plan_fn(out / kb.LIBRARY_NAME)
    # GLM-5 at TP 8: 256 experts, H 6144 (96 K chunks), I 256 (4 chunks: one warp a down tile).
    # gate_up's warps per tile shrink as the rows per tile grow (X reads shared through L1 by the
    # CTA's tiles): avg rows <= 4: 8 warps, <= 8: 4, <= 16: 2, else 1
    for t, m_tiles, gate_up_k_warps in ((1, 1, 8), (64, 1, 8), (128, 1, 8), (129, 1, 4), (256, 1, 4), (300, 2, 2),
                                        (512, 2, 2), (513, 4, 1), (1024, 4, 1)):
        p = plan(t, 8, 256, 6144, 256)
        assert (p["m_tiles"], p["rows_per_item"]) == (m_tiles, 8 * m_tiles), (t, p)
        assert (p["gate_up_k_warps"], p["down_k_warps"]) == (gate_up_k_warps, 1), (t, p)
    assert plan(2, 8, 32, 6144, 2048)["down_k_warps"] == 8  # EP 8: I 2048 (32 chunks), 1 row a tile
    assert plan(32, 8, 32, 6144, 2048)["down_k_warps"] == 4  # 8 rows a tile: 2 tiles a CTA share X
    assert plan(2, 8, 128, 2048, 768)["down_k_warps"] == 2  # Qwen3-30B-A3B: 12 chunks, >= 4 a warp
    # explicit warps per tile (sweeps) win; other counts are refused
    assert plan(1024, 8, 256, 6144, 256, 8, 2) | {} == plan(1024, 8, 256, 6144, 256) | {"gate_up_k_warps": 8, "down_k_warps": 2}
    rc, msg = plan(1, 8, 8, 64, 64, 3, 0)
    assert rc != 0 and "1, 2, 4 or 8; got gate_up 3" in msg
    # an explicit M tile (sweeps) wins, with rows per item and the work-list bound to match
    assert plan(256, 8, 256, 6144, 256, m_tiles=4) | {} == plan(256, 8, 256, 6144, 256) | {
        "m_tiles": 4, "rows_per_item": 32, "max_items": 64 + 256}
    rc, msg = plan(1, 8, 8, 64, 64, m_tiles=3)
    assert rc != 0 and "m_tiles must be 0 (auto), 1, 2 or 4; got 3" in msg
    rc, msg = plan(4, 8, 1025, 6144, 256)
    assert rc != 0 and "0 < E <= 1024" in msg and "E=1025" in msg
    assert plan(0, 8, 8, 64, 64)[0] != 0


def test_moe_work_list_bound_covers_any_routing(built):
    """max_items sizes the grid and the work buffer: no routing may need more items (the align
    kernel makes ceil(rows / rows_per_item) items per expert)."""
    import random
    _, out, _ = built
    plan = _moe_plan_fn(out / kb.LIBRARY_NAME)
    rng = random.Random(5)
    cases = ((1, 8, 256), (3, 8, 256), (64, 8, 256), (1024, 8, 256), (1024, 8, 32), (5, 2, 4), (200, 6, 64))
    for (t, topk, e), m_tiles in [(c, 0) for c in cases] + [(c, m) for c in cases[2:5] for m in (1, 2, 4)]:
        s = t * topk
        p = plan(t, topk, e, 2048, 768, m_tiles=m_tiles)
        r = p["rows_per_item"]
        routings = [[s] + [0] * (e - 1), [s // e + (j < s % e) for j in range(e)]]
        # as many experts as possible one row past a full item: the most items per row
        spill = [0] * e
        left = s
        for j in range(e):
            spill[j] = min(left, r + 1)
            left -= spill[j]
        spill[0] += left
        routings.append(spill)
        for _ in range(50):
            cuts = sorted(rng.randint(0, s) for _ in range(e - 1))
            routings.append([b - a for a, b in zip([0] + cuts, cuts + [s])])
        for counts in routings:
            assert sum(counts) == s
            items = sum(-(-c // r) for c in counts)
            assert items <= p["max_items"], (t, topk, e, counts, p)


def test_bad_arch_and_compile_error_are_one_line(tmp_path):
    with pytest.raises(kb.KernelBuildError, match="bad arch 'sm90'"):
        kb.build_kernels(CSRC, tmp_path / "x", ["sm90"])
    if kb.find_nvcc() is None:
        pytest.skip("needs nvcc")
    bad = tmp_path / "csrc"
    bad.mkdir()
    (bad / "broken.cu").write_text("__global__ void k() { this is not C++; }\n")
    with pytest.raises(kb.KernelBuildError) as exc:
        kb.build_kernels(bad, tmp_path / "out", ["sm_90a"], log=lambda s: None)
    msg = str(exc.value)
    assert "broken.cu" in msg and "\n" not in msg


# ----------------------------------------------------------------------------- W4A16 plan model
# The workspace outlives calls: a call's tickets (which must read 0) may lie where an EARLIER call
# with another plan left fp32 partials. The H200 run that found this: tickets at [0, 4*tiles) but
# partials right after a plan-sized ticket area, so any plan with > 64 tiles after one with <= 64
# read garbage tickets from tile 64 on and never reduced those tiles.

GEMM_SHAPES = [(5120, 2048), (16384, 2048), (28672, 512), (640, 2048), (6144, 256), (2624, 6144),
               (2048, 4096), (6144, 16384), (4096, 6144), (6144, 2048), (384, 320), (1024, 4096)]
GEMM_MS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 1024, 4096]
WORKSPACE = (8 << 20) + (256 << 10)  # ops._WORKSPACE_BYTES


def _plan_fn(lib_path):
    import ctypes
    lib = ctypes.CDLL(str(lib_path))
    size_t = ctypes.c_size_t

    def plan(m, n, k, sms, split_target=0, flags=0):
        out, need, lay = (ctypes.c_int * 9)(), size_t(0), (size_t * 4)()
        assert lib.sm120_w4a16_plan(m, n, k, sms, size_t(WORKSPACE), split_target, flags, out,
                                    ctypes.byref(need)) == 0
        assert lib.sm120_w4a16_workspace_layout(m, n, k, sms, size_t(WORKSPACE), split_target, flags, lay) == 0
        keys = ("m_tiles", "m_blocks", "n_ctas", "splits", "chunks_per_split", "cluster", "split_target", "warpk",
                "warps")
        return dict(zip(keys, out), workspace_bytes=need.value, ticket_region_bytes=lay[0],
                    partial_offset=lay[1], partial_tile_bytes=lay[2])
    plan.lib = lib
    return plan


def w4a16_workspace_model(plan, sms, calls, flags=0):
    """Replays `calls` [(m, n, k)] on one workspace as the kernel indexes it; returns problems."""
    import numpy as np
    dirty = np.zeros(WORKSPACE, dtype=bool)  # bytes holding leftover partials
    problems = []
    for m, n, k in calls:
        p = plan(m, n, k, sms, flags=flags)
        tag = f"M={m} N={n} K={k} {p}"
        n_chunks = -(-k // 64)
        tokens = 8 * p["m_tiles"]
        if p["warpk"]:  # grid (x = 16-row tile, y = cluster split, z = token block), no workspace
            tiles = p["n_ctas"] * p["m_blocks"]
            if (flags & 16) or m > 16 or p["n_ctas"] != -(-n // 128) * 8 or p["workspace_bytes"]:
                problems.append(f"{tag}: bad warp-K grid")
            if p["m_blocks"] != 1 or tokens < m or (p["m_tiles"] == 2) != (m > 8):
                problems.append(f"{tag}: warp-K token tile does not cover M")
            # kW4A16WarpKClusterMinChunks / kW4A16WarpK16MinChunks / kW4A16MaxClusterSplits
            want = min(4, sms // tiles) if n_chunks > 64 and tiles < sms else 1  # <= 32 warps per cluster
            cps = -(-n_chunks // want)
            want = -(-n_chunks // cps)
            warps = 16 if cps > 32 and tiles * want <= sms and 16 * want <= 32 else 8
            if (p["splits"], p["chunks_per_split"], bool(p["cluster"]), p["warpk"]) != (want, cps, want > 1, warps):
                problems.append(f"{tag}: warp-K split {want} x {cps} chunks, cluster {want > 1}, {warps} warps expected")
            continue
        # grid (x = 128-row group, y = split, z = token block) covers the output exactly once
        if p["n_ctas"] * 128 < n or (p["n_ctas"] - 1) * 128 >= n:
            problems.append(f"{tag}: n_ctas does not cover N")
        if p["m_blocks"] * tokens < m or (p["m_blocks"] - 1) * tokens >= m:
            problems.append(f"{tag}: m_blocks does not cover M")
        cps, splits = p["chunks_per_split"], p["splits"]
        begins = [s * cps for s in range(splits)]
        if not (1 <= splits <= 65535 and begins[-1] < n_chunks <= splits * cps):
            problems.append(f"{tag}: splits do not partition the {n_chunks} K chunks")
        if splits == 1:
            if p["cluster"]:
                problems.append(f"{tag}: one split but cluster-reduced")
            continue
        if p["cluster"]:  # reduced in the cluster's shared memory: the workspace is not touched
            if not (flags & 2) or not 2 <= splits <= 8 or p["workspace_bytes"] != 0:
                problems.append(f"{tag}: bad cluster plan")
            continue
        if flags & 2 and splits <= 8:
            problems.append(f"{tag}: <= 8 splits with cluster reduce asked, but reduced through the workspace")
        tiles = p["n_ctas"] * p["m_blocks"]  # ticket index z * gridDim.x + x
        t_end = 4 * tiles
        slot = p["partial_tile_bytes"]
        if slot != 128 * 2 * p["m_tiles"] * 4 * 4:
            problems.append(f"{tag}: partial slot {slot} B is not the kernel's tile")
        p_begin = p["partial_offset"]
        p_end = p_begin + (tiles * splits) * slot  # slot (tile, split) at (tile * splits + split) * slot
        if p_end > p["workspace_bytes"] or p["workspace_bytes"] > WORKSPACE:
            problems.append(f"{tag}: partials end at {p_end}, beyond the workspace")
        if t_end > p_begin:
            problems.append(f"{tag}: tickets overlap this call's partials")
        if dirty[:t_end].any():
            first = int(np.argmax(dirty[:t_end])) // 4
            problems.append(f"{tag}: ticket of tile {first} holds an earlier call's partials")
        dirty[p_begin:p_end] = True  # tickets end at 0 (the last CTA resets its own)
    return problems


@pytest.mark.parametrize("sms", [132, 188])  # H200, RTX PRO 6000
def test_w4a16_plan_and_workspace_model_over_successive_calls(built, sms):
    _, out, _ = built
    plan = _plan_fn(out / kb.LIBRARY_NAME)
    calls = [(m, n, k) for n, k in GEMM_SHAPES for m in GEMM_MS]  # test_gemm_shapes_all_m's order
    assert sum(plan(m, n, k, sms)["splits"] > 1 for m, n, k in calls) > 20  # the model has work
    problems = w4a16_workspace_model(plan, sms, calls + calls[::-1])
    assert not problems, f"{len(problems)} problems, first: {problems[:3]}"


@pytest.mark.parametrize("sms", [132, 188])
def test_w4a16_default_split_target_follows_the_tiles_the_weight_size_and_m(built, sms):
    _, out, _ = built
    plan = _plan_fn(out / kb.LIBRARY_NAME)
    seen = set()
    for n, k in GEMM_SHAPES:
        wbytes = n * k // 2 + n * k // 16  # packed e2m1 + e4m3 scales
        large, huge = wbytes >= 8_000_000, wbytes >= 32_000_000
        for m in GEMM_MS:
            p = plan(m, n, k, sms, flags=16)  # the split-K kernel's rule
            tiles = p["n_ctas"] * p["m_blocks"]
            unsplit = 4 * tiles >= 3 * sms or (k <= 512 and 3 * tiles >= sms)
            want = tiles if unsplit else 4 * sms if huge else 2 * sms if large else sms if m <= 16 else sms // 2
            assert p["split_target"] == want, (m, n, k, p)
            explicit = plan(m, n, k, sms, split_target=want)
            assert p == explicit, (m, n, k)  # the default is exactly that target's plan
            seen.add("tiles" if want == tiles else want // sms if want >= sms else -1)
            if want == tiles:
                assert p["splits"] == 1, (m, n, k, p)
    assert seen == {"tiles", 4, 2, 1, -1}  # every branch of the rule is exercised by the test shapes
    split = lambda m, n, k: plan(m, n, k, sms, flags=16)["splits"]  # noqa: E731
    assert split(1, 6144, 16384) > split(1, 6144, 2048)  # 56 MB vs 7 MB
    # short K: glm5 shared down at TP 8 (48 tiles, K 256) stays unsplit once its tiles fill a third
    # of the SMs; the same tiles with K 2048 split
    assert split(1, 6144, 2048) > 1
    assert (split(1, 6144, 256) == 1) == (3 * 48 >= sms)


@pytest.mark.parametrize("sms", [132, 188])
def test_w4a16_cluster_plans_keep_the_split_and_need_no_workspace(built, sms):
    _, out, _ = built
    plan = _plan_fn(out / kb.LIBRARY_NAME)
    calls = [(m, n, k) for n, k in GEMM_SHAPES for m in GEMM_MS]
    cluster = [c for c in calls if plan(*c, sms, flags=2 | 16)["cluster"]]
    assert len(cluster) > 10  # most small-M plans split 2..8 ways
    assert any(2 < plan(*c, sms, flags=16)["splits"] <= 8 for c in cluster)
    for c in calls:
        a, b = plan(*c, sms, flags=16), plan(*c, sms, flags=2 | 16)
        assert (a["n_ctas"], a["m_blocks"]) == (b["n_ctas"], b["m_blocks"]), c
        if b["cluster"]:  # the wanted split: no longer shrunk to fit partials in the workspace
            assert b["splits"] >= a["splits"], c
        else:
            assert (a["splits"], a["chunks_per_split"]) == (b["splits"], b["chunks_per_split"]), c
    # cluster and ticket plans interleaved on one workspace (the model checks each call's tickets)
    for flags in (2 | 16, 2):  # the split-K kernel alone, and interleaved with warp-K plans
        problems = w4a16_workspace_model(plan, sms, calls + calls[::-1], flags=flags)
        assert not problems, f"flags {flags}: {len(problems)} problems, first: {problems[:3]}"
    assert not w4a16_workspace_model(plan, sms, calls, flags=0)


def test_w4a16_unknown_flags_are_refused(built):
    import ctypes
    _, out, _ = built
    plan = _plan_fn(out / kb.LIBRARY_NAME)
    lib = plan.lib
    lib.sm120_last_error.restype = ctypes.c_char_p
    o, need = (ctypes.c_int * 9)(), ctypes.c_size_t(0)

    def rc(m, flags):
        return lib.sm120_w4a16_plan(m, 512, 512, 132, ctypes.c_size_t(WORKSPACE), 0, flags, o, ctypes.byref(need))

    assert rc(1, 64) != 0
    assert b"unknown flags 0x40" in lib.sm120_last_error()
    # 1 | 2 | 4 | 8 (PDL, cluster reduce, eight warps, warp-K), 16 (split-K) and 32 (auto warps) are known
    assert rc(1, 15) == 0 and o[7] == 8 and rc(1, 7 | 16) == 0 and o[7] == 0  # out[7]: warp-K warps
    assert o[8] == 8 and rc(1, 16 | 32) == 0 and o[8] == 4  # out[8]: split-K warps
    assert rc(1, 8 | 16) != 0 and b"exclude each other" in lib.sm120_last_error()
    assert rc(16, 8) == 0 and rc(17, 8) != 0 and b"M <= 16, got M=17" in lib.sm120_last_error()


def test_w4a16_auto_warps_take_8_at_m_9_to_16_unless_the_grid_has_more_than_3_ctas_per_sm(built):
    """kW4A16AutoWarps (32): 8 warps per split-K CTA for the 16-token tile, except where the grid
    already puts more than 3 CTAs on an SM (glm5 o_proj TP 1 at M = 16: 48 tiles x 11 splits at 132
    SMs; 8 warps ran it 1.10x slower on the H200). An explicit 8 (flag 4) wins."""
    _, out, _ = built
    plan = _plan_fn(out / kb.LIBRARY_NAME)
    auto, split, eight = 32, 16, 4
    for n, k in GEMM_SHAPES:
        for m in GEMM_MS:
            for sms in (132, 188):
                p = plan(m, n, k, sms, flags=split | auto)
                ctas = p["n_ctas"] * p["m_blocks"] * p["splits"]
                assert p["warps"] == (8 if 9 <= m <= 16 and ctas <= 3 * sms else 4), (m, n, k, sms, p)
                assert plan(m, n, k, sms, flags=split)["warps"] == 4
                assert plan(m, n, k, sms, flags=split | auto | eight)["warps"] == 8
    o_proj = plan(16, 6144, 16384, 132, flags=split | auto)
    assert (o_proj["n_ctas"] * o_proj["splits"], o_proj["warps"]) == (528, 4)
    assert plan(16, 16384, 2048, 132, flags=split | auto)["warps"] == 8  # glm5 q_b TP 1: 128 CTAs
    warpk = plan(16, 512, 6144, 132, flags=auto)  # glm5 shared gate_up TP 8: the warp-K kernel, no split-K warps
    assert warpk["warpk"] and warpk["warps"] == 0


@pytest.mark.parametrize("sms", [132, 188])
def test_w4a16_one_wave_targets_keep_the_grid_within_the_sms(built, sms):
    """Where the default aims at one CTA per SM or fewer, the split count is rounded down so the grid
    fits the SMs (3 splits of glm5 o_proj TP 8's 48 tiles put two CTAs on 12 of 132 SMs: 0.90-0.94x
    the time with 2 on the H200), the default's target and a caller's alike. Larger targets (2 or 4
    CTAs per SM) keep the rounded-up count."""
    _, out, _ = built
    plan = _plan_fn(out / kb.LIBRARY_NAME)
    for n, k in GEMM_SHAPES:
        for m in GEMM_MS:
            p = plan(m, n, k, sms, flags=16)
            tiles = p["n_ctas"] * p["m_blocks"]
            if p["split_target"] <= sms and p["splits"] > 1:
                assert tiles * p["splits"] <= sms, (m, n, k, sms, p)
    if sms == 132:
        assert plan(16, 6144, 2048, sms, flags=16)["splits"] == 2  # 96 CTAs, not 144
        assert plan(16, 5120, 2048, sms, flags=16)["splits"] == 3  # 120 CTAs, not 160
        assert plan(16, 6144, 2048, sms, split_target=sms, flags=16)["splits"] == 2  # a caller's target too
        assert plan(16, 6144, 2048, sms, split_target=2 * sms, flags=16)["splits"] == 6  # 2 per SM: rounded up
        assert plan(1, 16384, 2048, sms, flags=16)["splits"] == 1  # 128 tiles fill 3/4 of the SMs


@pytest.mark.parametrize("sms", [132, 188])
def test_w4a16_split_shrinks_to_the_most_splits_whose_partials_fit(built, sms):
    """A plan whose partials overflow the workspace keeps the largest split count that fits (not half
    of its wanted count): glm5 o_proj tp1 (6144 x 16384) at M = 64 wants 6 splits at 132 SMs, and 5
    of its 32 KB partial tiles x 48 tiles fit the 8 MB workspace."""
    _, out, _ = built
    plan = _plan_fn(out / kb.LIBRARY_NAME)
    shrunk = 0
    for n, k in GEMM_SHAPES:
        for m in GEMM_MS:
            p = plan(m, n, k, sms, flags=16)
            if p["splits"] == 1 or p["cluster"]:
                continue
            tiles = p["n_ctas"] * p["m_blocks"]
            fits = lambda s: p["partial_offset"] + tiles * s * p["partial_tile_bytes"] <= WORKSPACE  # noqa: E731
            assert fits(p["splits"]), (m, n, k, p)
            n_chunks = -(-k // 64)
            wanted = -(-p["split_target"] // tiles)
            if p["split_target"] <= sms and tiles * wanted > sms:  # one-wave targets: the grid fits the SMs
                wanted = max(1, sms // tiles)
            wanted = min(wanted, max(1, n_chunks // 2))  # >= 128 K per split
            cps_unit = 2 if p["m_tiles"] <= 2 else 1
            wanted = -(-n_chunks // (-(-(-(-n_chunks // wanted)) // cps_unit) * cps_unit))  # whole stages
            if wanted > p["splits"]:  # shrunk: one more split (after the chunk rounding) must not fit
                shrunk += 1
                s = p["splits"] + 1
                cps = -(-(-(-n_chunks // s)) // cps_unit) * cps_unit
                more = -(-n_chunks // cps)
                assert more == p["splits"] or not fits(more), (m, n, k, p, more)
    assert shrunk > 0  # the shapes reach the workspace limit
    if sms == 132:
        assert plan(64, 6144, 16384, sms)["splits"] == 5 and plan(128, 6144, 16384, sms)["splits"] == 2


@pytest.mark.parametrize("sms", [132, 188])
def test_w4a16_default_kernel_is_warpk_where_the_split_kernel_splits_and_the_weight_is_small(built, sms):
    """default_w4a16_warpk (csrc/kernels.h): warp-K at M <= 16 where the 128-row kernel would split
    K and the weight is < 16 MB (M <= 2), 12 MB (M <= 8) or 5 MB (M 9..16); its 16 warps only where its CTAs
    fit the SMs one each and K has >= 64 chunks (w4a16_workspace_model checks the warp-K grids); a
    caller's split target keeps the split kernel."""
    _, out, _ = built
    plan = _plan_fn(out / kb.LIBRARY_NAME)
    seen = set()
    for n, k in GEMM_SHAPES:
        wbytes = n * k // 2 + n * k // 16
        for m in GEMM_MS:
            p, split = plan(m, n, k, sms), plan(m, n, k, sms, flags=16)
            limit = 16_000_000 if m <= 2 else 12_000_000 if m <= 8 else 5_000_000
            want = m <= 16 and split["splits"] > 1 and wbytes < limit
            assert bool(p["warpk"]) == want, (m, n, k, p, split)
            if want:
                assert plan(m, n, k, sms, split_target=sms)["warpk"] == 0  # an explicit target: split-K
                seen.add((p["warpk"], p["m_tiles"]))
            elif m <= 16:
                seen.add("split")
    assert {(8, 1), (8, 2), "split"} <= seen, seen
    assert (16, 1) in seen  # 16 warps: (1024, 4096)
    problems = w4a16_workspace_model(plan, sms, [(m, n, k) for n, k in GEMM_SHAPES + [(512, 6144), (48, 4160)]
                                                 for m in range(1, 17)])
    assert not problems, problems[:3]
    assert plan(1, 512, 6144, sms)["cluster"] and plan(1, 512, 6144, sms)["warpk"]  # glm5 shared gate_up TP 8
