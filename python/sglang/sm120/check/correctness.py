"""Correctness stage: quantize bit-exactness, every FP4 GEMM path of this GPU against the
dequantized reference on the model shapes at M = 1..4096, and the server's self-check.

The reference is sglang.sm120.nvfp4 (pure PyTorch, from the format description); the tolerance
is sglang.sm120.fp4_tolerance (the one the server's self-check and test/gpu/test_kernels.py use). Each result is a dict
{name, ok, detail}; the stage fails when any is not ok.
"""
from __future__ import annotations

import time
from typing import Callable, Dict, List, Sequence, Tuple

import torch

from sglang.sm120.fp4_tolerance import compare, exact_dequant, reference_gemm

GEMM_MS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 1024, 4096)


def _result(name: str, ok: bool, detail: str) -> Dict:
    return {"name": name, "ok": bool(ok), "detail": detail}


def quantize_cases() -> Dict[str, torch.Tensor]:
    """bf16 inputs covering the rounding and special-value rules of the format (CPU tensors)."""
    g = torch.Generator().manual_seed(0)
    cases = {
        "random": torch.randn(300, 2048, generator=g) * 3,
        "all_zero": torch.zeros(130, 256),
        "max_magnitude": torch.full((129, 64), 3.3895e38).where(torch.rand(129, 64, generator=g) > 0.5,
                                                                 torch.tensor(-3.3895e38)),
        "ties": (torch.randint(-12, 13, (257, 512), generator=g) * 0.25) * 2.0 ** -3,
        "wide_range": torch.randn(77, 1024, generator=g) * torch.logspace(-30, 30, 1024).unsqueeze(0),
    }
    special = torch.randn(200, 512, generator=g)
    special[3, 7] = float("nan")
    special[10, 100] = float("inf")
    special[11, 200] = float("-inf")
    special[12, 16:32] = float("nan")
    special[13, 32:48] = float("inf")
    special[14, 48], special[14, 49] = float("inf"), float("nan")
    special[15, 0:16] = -0.0
    cases["nan_inf"] = special
    return {k: v.to(torch.bfloat16) for k, v in cases.items()}


def run_quantize(log: Callable[[str], None]) -> List[Dict]:
    """The quantize kernel bit for bit against the reference, plain and MMA nibble order."""
    from sglang.sm120 import kernels as K
    from sglang.sm120 import nvfp4 as F

    out = []
    for case, x in quantize_cases().items():
        finite = x.float()[torch.isfinite(x.float())]
        amax = finite.abs().max().item() if finite.numel() else 0.0
        gs = 448.0 * 6.0 / amax if 0 < amax < float("inf") and 448.0 * 6.0 / amax < 3e38 else 1.0
        gs_t = torch.tensor([gs], dtype=torch.float32)
        ref_packed, ref_scales = F.quantize_nvfp4(x, gs_t)
        ref_sw = F.swizzle_scales(ref_scales).view(torch.uint8)
        for mma_order in (False, True):
            name = f"quantize {case}{' mma-order' if mma_order else ''}"
            want = K.p_order_packed(ref_packed) if mma_order else ref_packed
            try:
                packed, scales = K.quantize_nvfp4(x.cuda(), gs_t.cuda(), mma_order=mma_order)
                bad_p = int((packed.cpu() != want).sum())
                bad_s = int((scales.view(torch.uint8).cpu() != ref_sw).sum())
                ok = bad_p == 0 and bad_s == 0
                detail = "bit-exact" if ok else f"{bad_p} packed bytes and {bad_s} scale bytes differ"
            except Exception as exc:
                ok, detail = False, f"{type(exc).__name__}: {exc}".splitlines()[0]
            out.append(_result(name, ok, detail))
    n_bad = sum(not r["ok"] for r in out)
    log(f"  quantize: {len(out) - n_bad}/{len(out)} bit-exact")
    return out


def gemm_paths(m: int, capability: Tuple[int, int]) -> List[str]:
    """The GEMM paths the backend runs at M on this GPU: both W4A16 kernels where warp-K serves
    (M <= 16), the split-K one always, W4A4 (hardware FP4 MMA on SM120, its emulation elsewhere)."""
    from sglang.sm120 import kernels as K

    paths = ["W4A16 warp-K"] if m <= K.WARPK_MAX_M else []
    paths.append("W4A16 split-K")
    paths.append("W4A4 hardware" if capability[0] == 12 else "W4A4 emulated")
    return paths


def run_gemms(shapes: Sequence[Tuple[str, int, int]], ms: Sequence[int], log: Callable[[str], None],
              fault: bool = False) -> List[Dict]:
    """Every path of gemm_paths at every M of `ms` for every (name, N, K). fault: corrupt the first
    result compared (SGLANG_SM120_FAULT_INJECT=gemm)."""
    from sglang.sm120 import kernels as K
    from sglang.sm120 import nvfp4 as F
    from sglang.sm120.fp4_selfcheck import corrupt_one

    cap = torch.cuda.get_device_capability()
    out: List[Dict] = []
    for name, n, k in shapes:
        t0 = time.perf_counter()
        rows: List[Dict] = []
        try:
            g = torch.Generator(device="cuda").manual_seed(n * 7 + k)
            w = torch.randn(n, k, device="cuda", generator=g) * 0.02
            w[: min(n, 16), :16] = 0.0  # zero-scale blocks
            q = F.quantize_weight_modelopt(w)
            del w
            pw = K.pack_weight(q["weight"], q["weight_scale"], q["weight_scale_2"])
            wd = exact_dequant(q["weight"], q["weight_scale"], q["weight_scale_2"])
            x = torch.randn(max(ms), k, device="cuda", generator=g).to(torch.bfloat16)
            in_s = F.input_scale_from_amax(x.float().abs().max())
            xd4 = exact_dequant(*F.quantize_nvfp4(x, 1.0 / in_s), in_s)
            in_dev, inv_dev = in_s.reshape(1).cuda(), (1.0 / in_s).reshape(1).cuda()
            for m in ms:
                xf = x[:m].float()
                for path in gemm_paths(m, cap):
                    label = f"{name} {path} M={m}"
                    try:
                        if path.startswith("W4A16"):
                            kernel = "warpk" if "warp-K" in path else "split"
                            y = K.gemm_w4a16(x[:m], pw, kernel=kernel)
                            xs = xf
                        else:
                            xq, xsc = K.quantize_nvfp4(x[:m], inv_dev, mma_order=True)
                            y = K.gemm_w4a4(xq, xsc, in_dev, pw)
                            xs = xd4[:m]
                        if fault and not out and not rows:
                            y = corrupt_one(y)
                        c = compare(y, *reference_gemm(xs, wd))
                        rows.append(_result(label, c.ok, c.summary()))
                    except Exception as exc:
                        rows.append(_result(label, False, f"{type(exc).__name__}: {exc}".splitlines()[0]))
            torch.cuda.synchronize()
        except Exception as exc:
            rows.append(_result(f"{name} setup", False, f"{type(exc).__name__}: {exc}".splitlines()[0]))
        bad = [r for r in rows if not r["ok"]]
        log(f"  {name} (N={n} K={k}): {len(rows) - len(bad)}/{len(rows)} within tolerance"
            f" ({time.perf_counter() - t0:.1f} s)" + (f"; FIRST FAILURE {bad[0]['name']}: {bad[0]['detail']}" if bad else ""))
        out += rows
        torch.cuda.empty_cache()
    return out


def start_cublas() -> None:
    """cuBLAS's one-time start (handle, workspace, first fp32 GEMM kernel) on the current GPU."""
    a = torch.ones(64, 64, device=torch.device("cuda", torch.cuda.current_device()))
    torch.mm(a, a)
    torch.cuda.synchronize()


def run_selfcheck(n: int, k: int, log: Callable[[str], None]) -> Dict:
    """The check the server runs before serving (fp4_selfcheck.verify_shape), on one shape."""
    from sglang.sm120.fp4_selfcheck import verify_shape

    res = verify_shape(n, k, torch.device("cuda", torch.cuda.current_device()))
    name = f"server self-check N={n} K={k} M={','.join(map(str, res.ms))}"
    detail = (f"passed in {res.seconds:.2f} s" if res.ok
              else f"M={res.m} {res.path}: {res.error} ({res.seconds:.2f} s)")
    log(f"  {name}: {detail}")
    r = _result(name, res.ok, detail)
    r["seconds"] = round(res.seconds, 3)
    return r
