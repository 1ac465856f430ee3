"""What the check ran on: GPU, arch, driver, CUDA, torch, the fork and the upstream libraries."""
from __future__ import annotations

import importlib.metadata as md
import platform
import subprocess
from typing import Optional


def _version(dist: str) -> Optional[str]:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def driver_version() -> Optional[str]:
    """The NVIDIA driver version (NVML, else nvidia-smi); None when neither answers."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            v = pynvml.nvmlSystemGetDriverVersion()
            return v.decode() if isinstance(v, bytes) else str(v)
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        pass
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None
    except (OSError, subprocess.SubprocessError):
        return None


def software() -> dict:
    """Versions that need no GPU."""
    from sglang.sm120.build_info import build_info

    info = build_info()
    return {
        "python": platform.python_version(),
        "torch": _version("torch"),
        "fork": info.get("version"),
        "upstream": (info.get("upstream") or {}).get("version"),
        "patches": len(info.get("series") or []),
        "flashinfer": _version("flashinfer-python"),
        "sglang_kernel": _version("sglang-kernel") or _version("sgl-kernel"),
    }


def collect(device: int = 0) -> dict:
    """Everything above plus the GPU (needs CUDA)."""
    import torch

    from sglang.sm120 import kernels

    props = torch.cuda.get_device_properties(device)
    major, minor = torch.cuda.get_device_capability(device)
    env = {
        "gpu": props.name,
        "arch": f"sm_{major}{minor}",
        "capability": [major, minor],
        "sm_count": props.multi_processor_count,
        "memory_gib": round(props.total_memory / (1 << 30), 1),
        "l2_mib": round(getattr(props, "L2_cache_size", 0) / (1 << 20), 1),
        "gpu_count": torch.cuda.device_count(),
        "driver": driver_version(),
        "cuda_runtime": torch.version.cuda,
        **software(),
    }
    try:
        kernels.load()
        env["kernel_archs"] = kernels.build_archs()
        env["kernel_library"] = str(kernels.library_path())
    except RuntimeError as exc:
        env["kernel_archs"] = None
        env["kernel_error"] = str(exc).splitlines()[0]
    return env


def describe(env: dict) -> str:
    """One line a person reads first."""
    parts = [f"{env.get('gpu', '?')} ({env.get('arch', '?')}, {env.get('sm_count', '?')} SMs, "
             f"{env.get('memory_gib', '?')} GiB)",
             f"driver {env.get('driver') or '?'}", f"CUDA {env.get('cuda_runtime') or '?'}",
             f"torch {env.get('torch') or '?'}", f"sglang-sm120 {env.get('fork') or 'not a fork build'}"
             + (f" over upstream {env['upstream']}" if env.get("upstream") else ""),
             f"flashinfer {env.get('flashinfer') or '-'}", f"sglang-kernel {env.get('sglang_kernel') or '-'}",
             f"kernels {','.join(env.get('kernel_archs') or []) or 'NOT LOADABLE'}"]
    return "; ".join(parts)
