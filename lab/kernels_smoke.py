"""Smallest GPU check of the NVFP4 kernels, run first by kernels_check.sh (and again under
compute-sanitizer when it fails, to name the faulting kernel).

    SGLANG_SM120_KERNEL_LIB=python/sglang/sm120/kernels/lib python3 lab/kernels_smoke.py

(sglang.sm120 from the installed fork, or from python/ with PYTHONPATH=python where no sglang is installed)

Steps, each followed by torch.cuda.synchronize() and a check against the pure-PyTorch reference
(sglang.sm120.nvfp4), in order of increasing risk so that a device fault names its step:
quantize (bit-exact), W4A16 at M=1 and M=16 (a small shape, then a large one), W4A4 emulation at
M=256, then six W4A16 shapes with > 64 split-K tiles (their tickets lie where earlier calls left
partials), after filling the workspace's partial area with garbage, and a check that every split-K ticket is back at zero. Exit 0 when all pass, 1 on a wrong result, 2 on a device fault
(the CUDA context is dead then, so later steps are not run).
"""
from __future__ import annotations

import os
import sys
import time
import traceback

os.environ.setdefault("SGLANG_SM120_KERNEL_SYNC", "1")  # a fault is reported by the launch that caused it

import torch  # noqa: E402

# the installed fork's API; the library is $SGLANG_SM120_KERNEL_LIB's (kernels_check.sh builds it)
from sglang.sm120 import kernels as K  # noqa: E402
from sglang.sm120 import nvfp4 as F  # noqa: E402
from sglang.sm120.fp4_tolerance import compare, exact_dequant  # noqa: E402


def within_tolerance(y, ref, absref):
    """docs/kernels.md: |y - ref| <= 2^-8 |ref| + 2^-14 (|x| @ |W|^T). Returns (ok, message)."""
    c = compare(y, ref, absref)
    return c.ok, c.summary()


def check_quantize():
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(37, 256, generator=g) * 3).to(torch.bfloat16)
    x[5, 20] = float("nan")
    x[6, 40] = float("inf")
    gs = torch.tensor([448.0 * 6.0 / 12.0])
    ref_p, ref_s = F.quantize_nvfp4(x, gs)
    for mma_order in (False, True):
        packed, scales = K.quantize_nvfp4(x.cuda(), gs.cuda(), mma_order=mma_order)
        torch.cuda.synchronize()
        want_p = K.p_order_packed(ref_p) if mma_order else ref_p
        dp = int((packed.cpu() != want_p).sum())
        ds = int((scales.view(torch.uint8).cpu() != F.swizzle_scales(ref_s).view(torch.uint8)).sum())
        if dp or ds:
            return False, f"mma_order={mma_order}: {dp} packed bytes and {ds} scale bytes differ"
    return True, "bit-exact (plain and P order, with NaN/Inf blocks)"


def _weight(n, k, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    w = torch.randn(n, k, device="cuda", generator=g) * 0.02
    w[: min(n, 16), :16] = 0.0  # a zero-scale block
    q = F.quantize_weight_modelopt(w)
    return q, K.pack_weight(q["weight"], q["weight_scale"], q["weight_scale_2"]), \
        exact_dequant(q["weight"], q["weight_scale"], q["weight_scale_2"])


def check_w4a16(n, k, m, kernel="auto"):
    _, pw, wd = _weight(n, k, n + k)
    x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    plan = K.w4a16_plan(m, n, k, sms, kernel=kernel)
    y = K.gemm_w4a16(x, pw, kernel=kernel)
    torch.cuda.synchronize()
    ok, msg = within_tolerance(y, x.float() @ wd.t(), x.float().abs() @ wd.abs().t())
    which = f"warp-K x{plan['warpk_warps']} warps" if plan["warpk"] else f"split-K splits={plan['splits']}"
    return ok, f"{msg} (plan {which} m_tiles={plan['m_tiles']} ctas={plan['n_ctas']})"


def check_w4a16_pdl_chain(m, kernel="auto"):
    """Six dependent GEMMs on one workspace, PDL on vs off: bitwise equal (the PDL hazards)."""
    layers = [_weight(2048, 2048, 70 + i)[1] for i in range(6)]
    x0 = torch.randn(m, 2048, device="cuda").to(torch.bfloat16)
    ys = {}
    for pdl in (False, True):
        x = x0
        for pw in layers:
            x = K.gemm_w4a16(x, pw, pdl=pdl, kernel=kernel)
        ys[pdl] = x
    torch.cuda.synchronize()
    diff = int((ys[False] != ys[True]).sum())
    return diff == 0, f"{diff} of {ys[False].numel()} outputs differ between PDL on and off"


def check_w4a16_cluster(n, k, m):
    """Split-K reduced in a thread-block cluster vs through the workspace: the same bits."""
    _, pw, _ = _weight(n, k, 5 * n + k)
    x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    plan = K.w4a16_plan(m, n, k, sms, cluster=True, kernel="split")
    ys = {c: K.gemm_w4a16(x, pw, cluster=c, kernel="split") for c in (False, True)}
    torch.cuda.synchronize()
    diff = int((ys[False] != ys[True]).sum())
    return diff == 0 and plan["cluster"], (f"{diff} of {ys[False].numel()} outputs differ "
                                           f"(plan splits={plan['splits']} cluster={plan['cluster']})")


def check_w4a16_warps(n, k, m, split_target=0):
    """8 warps x 1 row tile vs 4 warps x 2 per CTA: every accumulator sees the same MMAs in the same
    order, so the same bits; and within tolerance of the reference."""
    _, pw, wd = _weight(n, k, 3 * n + k + m)
    x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    ys = {w: K.gemm_w4a16(x, pw, warps=w, split_target=split_target, kernel="split") for w in (4, 8)}
    torch.cuda.synchronize()
    diff = int((ys[4] != ys[8]).sum())
    ok, msg = within_tolerance(ys[8], x.float() @ wd.t(), x.float().abs() @ wd.abs().t())
    return diff == 0 and ok, f"{diff} of {ys[4].numel()} outputs differ from 4 warps; 8 warps vs reference: {msg}"


def _workspace():
    return K.workspace(torch.device("cuda", torch.cuda.current_device()))


def poison_workspace():
    """Partials may hold anything between calls; only the ticket region must be zero."""
    p = K.w4a16_plan(1, 128, 128, 1)
    ws = _workspace()
    ws[p["partial_offset"]:].fill_(0x5A)
    torch.cuda.synchronize()
    return True, f"bytes {p['partial_offset']}..{ws.numel()} set to 0x5A (tickets: first {p['ticket_region_bytes']} B)"


def check_tickets_zero():
    p = K.w4a16_plan(1, 128, 128, 1)
    t = _workspace()[: p["ticket_region_bytes"]].view(torch.int32)
    bad = int((t != 0).sum())
    return bad == 0, f"{bad} of {t.numel()} tickets nonzero" + (f" (first: tile {int((t != 0).nonzero()[0])})" if bad else "")


def check_w4a4(n, k, m):
    _, pw, wd = _weight(n, k, 3 * n + k)
    x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    in_s = F.input_scale_from_amax(x.float().abs().max())
    xq, xs = K.quantize_nvfp4(x, (1.0 / in_s).reshape(1).cuda(), mma_order=True)
    y = K.gemm_w4a4(xq, xs, in_s.reshape(1).cuda(), pw, mode="emulate")
    torch.cuda.synchronize()
    xd = exact_dequant(*F.quantize_nvfp4(x, 1.0 / in_s), in_s)
    return within_tolerance(y, xd @ wd.t(), xd.abs() @ wd.abs().t())


STEPS = [
    ("quantize_nvfp4 37x256", check_quantize),
    ("gemm_w4a16 M=1  N=384  K=320", lambda: check_w4a16(384, 320, 1)),
    ("gemm_w4a16 M=1  N=5120 K=2048", lambda: check_w4a16(5120, 2048, 1)),
    ("gemm_w4a16 M=16 N=5120 K=2048", lambda: check_w4a16(5120, 2048, 16)),
    ("gemm_w4a16 M=16 N=2624 K=6144", lambda: check_w4a16(2624, 6144, 16)),
    ("gemm_w4a16 warp-K M=1  N=640  K=2048", lambda: check_w4a16(640, 2048, 1, "warpk")),
    ("gemm_w4a16 warp-K M=16 N=512  K=6144", lambda: check_w4a16(512, 6144, 16, "warpk")),
    ("gemm_w4a16 split-K M=1 N=640  K=2048", lambda: check_w4a16(640, 2048, 1, "split")),
    ("gemm_w4a4(emulate) M=256 N=512 K=1024", lambda: check_w4a4(512, 1024, 256)),
    ("poison the split-K partial area", poison_workspace),
    # (N, K, M) with > 64 split-K tiles: a ticket past tile 64 reads what earlier calls left there
    ("gemm_w4a16 qwen3 qkv tp1 M=128  N=5120  K=2048", lambda: check_w4a16(5120, 2048, 128)),
    ("gemm_w4a16 glm5 q_b tp1 M=1     N=16384 K=2048", lambda: check_w4a16(16384, 2048, 1)),
    ("gemm_w4a16 glm5 kv_b tp1 M=1    N=28672 K=512", lambda: check_w4a16(28672, 512, 1)),
    ("gemm_w4a16 qwen3 qkv tp8 M=1024 N=640   K=2048", lambda: check_w4a16(640, 2048, 1024)),
    ("gemm_w4a16 glm5 sh.down tp8 M=128 N=6144 K=256", lambda: check_w4a16(6144, 256, 128)),
    ("gemm_w4a16 glm5 q_a+kv_a M=256  N=2624  K=6144", lambda: check_w4a16(2624, 6144, 256)),
    ("gemm_w4a16 PDL chain M=1", lambda: check_w4a16_pdl_chain(1)),
    ("gemm_w4a16 PDL chain M=16", lambda: check_w4a16_pdl_chain(16)),
    ("gemm_w4a16 PDL chain M=1 split-K", lambda: check_w4a16_pdl_chain(1, "split")),
    ("gemm_w4a16 PDL chain M=16 warp-K", lambda: check_w4a16_pdl_chain(16, "warpk")),
    ("gemm_w4a16 cluster reduce M=1  N=5120 K=2048", lambda: check_w4a16_cluster(5120, 2048, 1)),
    ("gemm_w4a16 cluster reduce M=16 N=5120 K=2048", lambda: check_w4a16_cluster(5120, 2048, 16)),
    ("gemm_w4a16 8 warps M=1   N=16384 K=2048", lambda: check_w4a16_warps(16384, 2048, 1)),
    ("gemm_w4a16 8 warps M=3   N=384   K=320", lambda: check_w4a16_warps(384, 320, 3)),
    ("gemm_w4a16 8 warps M=16  N=2624  K=6144", lambda: check_w4a16_warps(2624, 6144, 16)),
    ("gemm_w4a16 8 warps M=32  N=5120  K=2048", lambda: check_w4a16_warps(5120, 2048, 32)),
    ("gemm_w4a16 8 warps M=100 N=6144  K=256 (no split)", lambda: check_w4a16_warps(6144, 256, 100, 1)),
    ("split-K tickets all back at zero", check_tickets_zero),
]


def main() -> int:
    if not torch.cuda.is_available():
        print("smoke: error: no CUDA GPU visible")
        return 2
    if not K.available():
        print("smoke: error: libsm120_kernels.so not built (python -m forkbuild.kernels --out python/sglang/sm120/kernels/lib)")
        return 2
    cap = torch.cuda.get_device_capability()
    print(f"smoke: {torch.cuda.get_device_name()} sm_{cap[0]}{cap[1]}, torch {torch.__version__}, "
          f"library {K.library_path()} archs {K.build_archs()}", flush=True)
    failed = 0
    for name, fn in STEPS:
        t0 = time.time()
        try:
            ok, msg = fn()
        except Exception as exc:
            print(f"FAULT {name}: {type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}")
            traceback.print_exc()
            print("smoke: stopping (a device fault leaves the CUDA context unusable)", flush=True)
            return 2
        print(f"{'PASS' if ok else 'FAIL'} {name}: {msg} [{time.time() - t0:.1f} s]", flush=True)
        failed += not ok
    print(f"smoke: {len(STEPS) - failed}/{len(STEPS)} passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
