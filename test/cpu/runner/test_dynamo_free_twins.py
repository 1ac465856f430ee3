"""runner/dynamo_free.py: in Dynamo-free mode a helper runs its eager twin, which gives the
compiled helper's bits (one rounding after fp32 math) where the plain body rounds between ops."""
import os
import shutil
import subprocess
import sys

import pytest
import torch

from sglang.sm120.runner import dynamo_free as dfree



def moe_sum_reduce_torch_compile(x, out, routed_scaling_factor):  # upstream's body, same name
    torch.sum(x, dim=1, out=out)
    out.mul_(routed_scaling_factor)


def _expert_outputs(rows=64, topk=4, hidden=256, seed=0):
    g = torch.Generator().manual_seed(seed)
    # one magnitude, so the fp32 sum of topk bf16 values is exact whatever the order
    return (torch.randn(rows, topk, hidden, generator=g) * 0.5).to(torch.bfloat16)


def test_plain_body_rounds_twice_the_twin_once():
    x = _expert_outputs()
    plain, twin = (torch.empty(64, 256, dtype=torch.bfloat16) for _ in range(2))
    moe_sum_reduce_torch_compile(x, plain, 2.5)
    dfree.eager_twin(moe_sum_reduce_torch_compile)(x, twin, 2.5)
    once = (x.double().sum(dim=1) * 2.5).to(torch.bfloat16)
    assert torch.equal(twin, once)
    assert not torch.equal(plain, twin)  # the double rounding the twin exists for
    # a scale of 1 is exact: the plain sum already rounds once, and the twin is that sum
    dfree.eager_twin(moe_sum_reduce_torch_compile)(x, twin, 1.0)
    moe_sum_reduce_torch_compile(x, plain, 1.0)
    assert torch.equal(twin, plain) and torch.equal(twin, x.double().sum(dim=1).to(torch.bfloat16))


def test_wrapper_runs_the_twin_when_dynamo_free_and_the_plain_body_without_twins(monkeypatch):
    monkeypatch.setenv(dfree.ENV, "1")
    wrapped = dfree.compile_unless_dynamo_free(moe_sum_reduce_torch_compile)
    x = _expert_outputs(seed=1)
    got, plain = (torch.empty(64, 256, dtype=torch.bfloat16) for _ in range(2))
    wrapped(x, got, 2.5)
    assert torch.equal(got, (x.double().sum(dim=1) * 2.5).to(torch.bfloat16))
    monkeypatch.setattr(dfree, "TWINS", {})  # what lab variant plain-eager-helpers does
    wrapped(x, got, 2.5)
    moe_sum_reduce_torch_compile(x, plain, 2.5)
    assert torch.equal(got, plain)


def _swiglu_silu_clamp_mul(x, gemm1_limit):  # upstream's body, same name
    gate, up = x.chunk(2, dim=-1)
    gate = torch.nn.functional.silu(gate)
    gate = gate.clamp(min=None, max=gemm1_limit)
    up = up.clamp(min=-gemm1_limit, max=gemm1_limit)
    return gate * up


def test_upcast_twin_computes_in_fp32_and_rounds_once():
    x = torch.randn(32, 128, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    got = dfree.eager_twin(_swiglu_silu_clamp_mul)(x, 7.0)
    assert got.dtype == torch.bfloat16
    assert torch.equal(got, _swiglu_silu_clamp_mul(x.float(), 7.0).to(torch.bfloat16))
    assert not torch.equal(got, _swiglu_silu_clamp_mul(x, 7.0))


_COMPILE_SCRIPT = """
import sys, torch
from sglang.sm120.runner import dynamo_free as dfree

def moe_sum_reduce_torch_compile(x, out, routed_scaling_factor):
    torch.sum(x, dim=1, out=out)
    out.mul_(routed_scaling_factor)

x = torch.load(sys.argv[1])
outs = {k: torch.empty(x.shape[0], x.shape[2], dtype=torch.bfloat16) for k in ("compiled", "plain", "twin")}
try:
    torch.compile(moe_sum_reduce_torch_compile)(x, outs["compiled"], 2.5)
except Exception as e:
    print(f"SKIP {type(e).__name__}: {e}")
    sys.exit(0)
moe_sum_reduce_torch_compile(x, outs["plain"], 2.5)
dfree.eager_twin(moe_sum_reduce_torch_compile)(x, outs["twin"], 2.5)
torch.save(outs, sys.argv[2])
"""


@pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None,
                    reason="Inductor's CPU backend needs a C++ compiler")
def test_twin_equals_what_inductor_compiles(tmp_path):
    """The compiled helper (Inductor, CPU backend) gives the twin's bits, not the plain body's.
    Compiled in a fresh interpreter: after the other Dynamo-free tests in the same process the
    in-process compile gave other bits than alone (state they leave behind), which this isolates;
    the compiled result must also differ from the plain body, so a compile that silently ran
    eagerly fails here."""
    torch.save(_expert_outputs(rows=8, seed=3), tmp_path / "x.pt")
    proc = subprocess.run([sys.executable, "-c", _COMPILE_SCRIPT, str(tmp_path / "x.pt"), str(tmp_path / "out.pt")],
                          capture_output=True, text=True, timeout=300, env=dict(os.environ, **{dfree.ENV: "0"}))
    assert proc.returncode == 0, proc.stderr[-3000:]
    if proc.stdout.startswith("SKIP"):
        pytest.skip(f"torch.compile unavailable on this host: {proc.stdout[5:]}")
    outs = torch.load(tmp_path / "out.pt")
    assert not torch.equal(outs["compiled"], outs["plain"]), "torch.compile ran the plain body"
    assert torch.equal(outs["compiled"], outs["twin"])


def test_the_reciprocal_twin_divides_by_a_constant_as_inductor_does_on_gpus():
    """multinomial_with_seed's and batched_quantize's twins: `t / c` as `t * (1 / c)`, in place
    too; tensor divisors and integer tensors untouched."""
    def body(h, x, d):
        u = h / 4294967295
        x /= 6.0
        return u, x, h / d, torch.arange(10) / 4

    g = torch.Generator().manual_seed(4)
    h = torch.randint(0, 2**32, (100000,), generator=g).to(torch.float64)
    x = torch.randn(1000, generator=g)
    d = torch.rand(100000, generator=g, dtype=torch.float64) + 1
    u, x6, q, ints = dfree._reciprocal_division_twin(body)(h, x.clone(), d)
    assert torch.equal(u, h * (1.0 / 4294967295)) and not torch.equal(u, h / 4294967295)
    assert torch.equal(x6, x * (1.0 / 6.0)) and not torch.equal(x6, x / 6.0)
    assert torch.equal(q, h / d) and torch.equal(ints, torch.arange(10) / 4)


def test_inductor_lowers_a_division_by_a_constant_to_its_reciprocal_off_cpu():
    """What the reciprocal twin follows: Inductor's div lowering (installed torch) multiplies by
    the reciprocal of a constant divisor on every device but the CPU. When torch changes this, the
    twins of multinomial_with_seed and batched_quantize must follow."""
    import inspect

    from torch._inductor import lowering

    src = inspect.getsource(lowering.div_prim)
    assert "get_constant_value(b)" in src and 'a.get_device().type != "cpu"' in src
    assert "reciprocal = 1.0 / divisor.value" in src and "mul(a, reciprocal)" in src
