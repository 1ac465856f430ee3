"""The CPU test env's requirement list: the wheel's own, minus GPU kernel packages only."""
import subprocess
import sys
import zipfile

from buildenv import REPO, pinned_wheel
from tools import cpu_test_requirements as ctr


def _wheel(path, requires):
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("demo-1.0.dist-info/METADATA",
                    "Metadata-Version: 2.1\nName: demo\nVersion: 1.0\n" + "".join(f"Requires-Dist: {r}\n" for r in requires))
    return path


def test_skips_gpu_kernel_packages_and_extras_keeps_the_rest(tmp_path):
    reqs = ["torch==2.11.0", "sglang_kernel==0.4.5", "Tokenspeed.MLA==0.1.8", 'av; sys_platform == "linux"',
            'pytest; extra == "test"', "flashinfer_python[cu13]==0.6.14"]
    kept, skipped = ctr.cpu_test_requirements(reqs)
    assert kept == ["torch==2.11.0", 'av; sys_platform == "linux"', "flashinfer_python[cu13]==0.6.14"]
    assert skipped == ["sglang_kernel==0.4.5", "Tokenspeed.MLA==0.1.8"]

    proc = subprocess.run([sys.executable, "-m", "tools.cpu_test_requirements",
                           str(_wheel(tmp_path / "demo-1.0-py3-none-any.whl", reqs))],
                          capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == kept
    assert "skips sglang_kernel==0.4.5: sgl_kernel's CUDA ops" in proc.stderr


def test_bad_arguments_fail_with_usage(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "tools.cpu_test_requirements", "x.tar.gz"],
                          capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 2 and "usage" in proc.stderr


def test_every_skipped_package_is_a_requirement_of_a_pinned_upstream():
    """A rebase that drops one of them from every base must also drop it from the list (no stale
    exclusions). Bases differ (0.5.23 no longer requires helion or tokenspeed-mla)."""
    from buildenv import load_pin, running_python_tag
    from forkbuild.config import bases
    from forkbuild.upstream import fetch_pinned

    names = set()
    for base in bases():
        wheel = fetch_pinned(load_pin(base=base), running_python_tag())[0]
        names |= {ctr.req_name(r) for r in ctr.requires_dist(str(wheel))}
    assert set(ctr.GPU_ONLY) <= names, sorted(set(ctr.GPU_ONLY) - names)
    chosen = {ctr.req_name(r) for r in ctr.requires_dist(str(pinned_wheel()))}
    assert "torch" in chosen and "torch" not in ctr.GPU_ONLY
