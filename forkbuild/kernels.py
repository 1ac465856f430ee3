"""Build csrc/ into one shared library with nvcc (standard library only).

Runs inside a PEP 517 build backend (no third-party packages) and from the command line:

    python -m forkbuild.kernels --out python/sglang/sm120/kernels/lib [--archs sm_90a,sm_120a]

Every csrc/*.cu compiles to an object in parallel (one nvcc per file, all target archs in one fat
binary, -O3, ptxas resource report kept in ptxas.log next to the library), then nvcc links them
with a static CUDA runtime into libsm120_kernels.so. No torch headers are involved.

When cuobjdump is available (CUDA_HOME/bin, PATH, or pip's nvidia-cuda-cuobjdump) the finished
library's SASS is checked for uniform registers that are read but never written, the signature of
the ptxas 13.0 LDGSTS mis-encoding that made every GEMM die with "illegal instruction" on the H200
(SGLANG_SM120_SASS_CHECK=0 skips the check).
"""
from __future__ import annotations

import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .errors import BuildError
from .settings import read as read_setting

LIBRARY_NAME = "libsm120_kernels.so"
PTXAS_LOG = "ptxas.log"
_ARCH_RE = re.compile(r"^sm_(\d+)([af]?)$")
_KERNEL_RE = re.compile(r"__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s+)?(\w+)\s*\(")


class KernelBuildError(RuntimeError):
    """One-line build failure naming the file that failed."""


def default_archs() -> list[str]:
    return [a.strip() for a in read_setting("SGLANG_SM120_ARCHS").split(",") if a.strip()]


def find_nvcc() -> str | None:
    """nvcc from $CUDA_HOME (or $CUDA_PATH) when one is set, and from nowhere else then (an
    explicit toolkit is the user's choice); otherwise /usr/local/cuda, then PATH."""
    explicit = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    cand = Path(explicit or "/usr/local/cuda") / "bin" / "nvcc"
    if cand.is_file() and os.access(cand, os.X_OK):
        return str(cand)
    return None if explicit else shutil.which("nvcc")


def find_cuobjdump() -> str | None:
    """cuobjdump from CUDA_HOME, /usr/local/cuda, PATH, or a pip nvidia-cuda-cuobjdump wheel."""
    cands = [os.path.join(h, "bin", "cuobjdump") for h in (os.environ.get("CUDA_HOME"), "/usr/local/cuda") if h]
    cands.append(shutil.which("cuobjdump"))
    for p in sys.path:
        if p and os.path.isdir(os.path.join(p, "nvidia")):
            cands += sorted(glob.glob(os.path.join(p, "nvidia", "*", "bin", "cuobjdump")))
    return next((c for c in cands if c and os.path.isfile(c) and os.access(c, os.X_OK)), None)


_SASS_FUNC = re.compile(r"^\s*Function : (\S+)", re.M)
_SASS_INSN = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_.]*)\s*([^;]*);")
_SASS_UR = re.compile(r"\bUR(\d+)\b")


def unwritten_uniform_reads(sass: str) -> dict:
    """{function: [("URn", first opcode reading it)]} for uniform registers read but never written.

    A write is a bare URn first operand (a register pair for .64/.WIDE opcodes). ptxas 13.0 encodes
    the {shared base, L2 policy} pair of an LDGSTS with .L2::cache_hint as UR0/UR1, registers the
    kernel never writes: that SASS dies with "illegal instruction" (see cp_async16 in common.cuh).
    """
    bad = {}
    parts = _SASS_FUNC.split(sass)
    for name, body in zip(parts[1::2], parts[2::2]):
        written, read = set(), {}
        for op, args in _SASS_INSN.findall(body):
            ops = [a.strip() for a in args.split(",")] if args.strip() else []
            if ops and re.fullmatch(r"UR\d+", ops[0]):
                n = int(ops[0][2:])
                written.update((n, n + 1) if (".64" in op or ".WIDE" in op) else (n,))
                ops = ops[1:]
            for a in ops:
                for r in _SASS_UR.findall(a):
                    read.setdefault(int(r), op)
        missing = [(f"UR{r}", read[r]) for r in sorted(read) if r not in written]
        if missing:
            bad.setdefault(name, []).extend(m for m in missing if m not in bad.get(name, []))
    return bad


def check_sass(lib: Path, archs: list[str], cuobjdump: str | None = None) -> str:
    """Raise KernelBuildError if a kernel reads a never-written uniform register; returns a note."""
    tool = cuobjdump or find_cuobjdump()
    if tool is None:
        return "SASS check skipped: cuobjdump not found (pip install nvidia-cuda-cuobjdump)"
    n_funcs = 0
    for arch in archs:
        proc = subprocess.run([tool, "-sass", "-arch", arch, str(lib)], capture_output=True, text=True)
        if proc.returncode != 0 and "nvdisasm" in proc.stderr:
            # A tool missing is not a kernel defect: say so and build on.
            return f"SASS check skipped: {tool} cannot run nvdisasm (pip install nvidia-cuda-nvdisasm)"
        if proc.returncode != 0:
            raise KernelBuildError(f"cuobjdump -sass -arch {arch} {lib.name} failed: "
                                   f"{(proc.stderr.strip().splitlines() or ['?'])[0]}")
        n_funcs += len(_SASS_FUNC.findall(proc.stdout))
        bad = unwritten_uniform_reads(proc.stdout)
        if bad:
            name, regs = next(iter(bad.items()))
            raise KernelBuildError(
                f"{arch} SASS of {name} reads uniform registers it never writes {regs} "
                f"({len(bad)} kernels affected): a ptxas mis-encoding that faults on the GPU "
                "(see cp_async16 in csrc/common.cuh; SGLANG_SM120_SASS_CHECK=0 skips this check)")
    return f"SASS check passed ({n_funcs} kernel images, {tool})"


def _gencode(archs: list[str]) -> list[str]:
    flags = []
    for arch in archs:
        m = _ARCH_RE.match(arch)
        if not m:
            raise KernelBuildError(f"bad arch {arch!r}: expected sm_<number>[a|f], e.g. sm_90a, sm_120a")
        flags += ["-gencode", f"arch=compute_{m.group(1)}{m.group(2)},code={arch}"]
    return flags


def kernel_names(csrc_dir: Path) -> list[str]:
    names = set()
    for src in sorted(Path(csrc_dir).glob("*.cu")):
        names.update(_KERNEL_RE.findall(src.read_text()))
    return sorted(names)


def _compile(nvcc: str, src: Path, obj: Path, archs: list[str], include: Path) -> tuple[Path, float, str]:
    t0 = time.monotonic()
    cmd = [
        nvcc, "-c", str(src), "-o", str(obj), "-O3", "-std=c++17", "-Xcompiler", "-fPIC",
        "-Xptxas", "-v", "-I", str(include), f'-DSM120_BUILD_ARCHS="{",".join(archs)}"',
        *_gencode(archs),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    out = proc.stdout + proc.stderr
    if proc.returncode != 0:
        err = next((ln.strip() for ln in out.splitlines() if "error" in ln.lower()), out.strip()[:300])
        raise KernelBuildError(f"nvcc failed compiling {src.name}: {err}")
    return src, time.monotonic() - t0, out


def build_kernels(csrc_dir: Path, out_dir: Path, archs: list[str] | None = None, log=print) -> dict:
    """Compile csrc/*.cu into out_dir/libsm120_kernels.so.

    Returns {"archs": [...], "kernels": [__global__ names], "library": "libsm120_kernels.so"}
    (library relative to out_dir). Raises KernelBuildError with a one-line message on failure.
    """
    csrc_dir, out_dir = Path(csrc_dir), Path(out_dir)
    archs = list(archs) if archs else default_archs()
    _gencode(archs)  # validate early
    nvcc = find_nvcc()
    if nvcc is None:
        raise KernelBuildError("nvcc not found (set CUDA_HOME or put nvcc on PATH)")
    sources = sorted(csrc_dir.glob("*.cu"))
    if not sources:
        raise KernelBuildError(f"no .cu files in {csrc_dir}")
    out_dir.mkdir(parents=True, exist_ok=True)
    jobs = read_setting("SGLANG_SM120_BUILD_JOBS") or (os.cpu_count() or 1)
    log(f"[kernels] nvcc {nvcc}; {len(sources)} files for {','.join(archs)} with {jobs} jobs")
    t0 = time.monotonic()
    reports = {}
    with tempfile.TemporaryDirectory(prefix="sm120-kernels-") as tmp:
        objs = []
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            futures = []
            for src in sources:
                obj = Path(tmp) / (src.stem + ".o")
                objs.append(obj)
                futures.append(pool.submit(_compile, nvcc, src, obj, archs, csrc_dir))
            for fut in futures:
                src, dt, out = fut.result()
                reports[src.name] = out
                log(f"[kernels] compiled {src.name} in {dt:.1f} s")
        lib = out_dir / LIBRARY_NAME
        tmp_lib = Path(tmp) / LIBRARY_NAME
        cmd = [nvcc, "-shared", "-cudart", "static", "-o", str(tmp_lib), *map(str, objs), *_gencode(archs)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            err = (proc.stdout + proc.stderr).strip().splitlines()
            raise KernelBuildError(f"nvcc failed linking {LIBRARY_NAME}: {err[0] if err else 'unknown error'}")
        if read_setting("SGLANG_SM120_SASS_CHECK"):
            log(f"[kernels] {check_sass(tmp_lib, archs)}")  # before replacing a good library
        shutil.copyfile(tmp_lib, lib)  # replace atomically enough for a build dir; keeps mode bits sane
        os.chmod(lib, 0o755)
    with open(out_dir / PTXAS_LOG, "w") as fh:
        for name in sorted(reports):
            fh.write(f"### {name}\n{reports[name]}\n")
    log(f"[kernels] linked {LIBRARY_NAME} in {time.monotonic() - t0:.1f} s total -> {out_dir}")
    return {"archs": archs, "kernels": kernel_names(csrc_dir), "library": LIBRARY_NAME}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m forkbuild.kernels", description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path, help="output folder for the library")
    ap.add_argument("--archs", default=None, help="comma list, default $SGLANG_SM120_ARCHS or sm_90a,sm_120a")
    ap.add_argument("--csrc", type=Path, default=Path(__file__).resolve().parent.parent / "csrc")
    args = ap.parse_args(argv)
    archs = [a.strip() for a in args.archs.split(",") if a.strip()] if args.archs else None
    try:
        info = build_kernels(args.csrc, args.out, archs)
    except (KernelBuildError, BuildError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"[kernels] archs={','.join(info['archs'])} kernels={','.join(info['kernels'])} library={info['library']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
