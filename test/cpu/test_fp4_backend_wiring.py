"""Patch 0201: `--fp4-gemm-backend sm120` reaches sglang.sm120.fp4_linear; `auto` keeps upstream's
choice off SM120; the flag's help says what `auto` picks on SM120 with the fork. Runs against the installed fork (see test_installed.py)."""
import subprocess
import sys
import textwrap

from installed import skip_module_without_sglang  # noqa: E402

skip_module_without_sglang()

SCRIPT = textwrap.dedent(
    """
    import argparse, torch
    from sglang.srt.server_args import ServerArgs
    from sglang.srt.layers.quantization import fp4_utils
    from sglang.srt.layers.quantization.modelopt_quant import ModelOptFp4LinearMethod
    import sglang.sm120.fp4_linear as glue

    from sglang.sm120.fp4_backend import initialize_upstream_config as init

    p = argparse.ArgumentParser(); ServerArgs.add_cli_args(p)
    assert p.parse_args(["--model-path", "m", "--fp4-gemm-backend", "sm120"]).fp4_gemm_runner_backend == "sm120"
    # the help says what auto picks on SM120 with the fork, and what sm120 is
    help_text = next(a.help for a in p._actions if "--fp4-gemm-backend" in a.option_strings)
    for words in ("'auto' (default; on SM120 GPUs with sglang-sm120: 'sm120' when the fork's kernel "
                  "library loads and its self-check on the first NVFP4 layer passes, else upstream's choice",
                  "'sm120' (sglang-sm120's NVFP4 kernels"):
        assert words in help_text, help_text
    assert "flashinfer_cutlass otherwise (including SM120)" not in help_text, help_text

    init("auto")
    auto = fp4_utils.get_fp4_gemm_runner_backend()
    assert not auto.is_sm120(), auto  # no SM120 GPU here: upstream's choice stands

    calls = []
    glue.apply = lambda layer, x, bias=None: calls.append(("apply", x.shape, bias)) or x * 2
    glue.process_weights_after_loading = lambda layer: calls.append(("process", layer.output_size_per_partition))
    init("sm120")
    assert fp4_utils.get_fp4_gemm_runner_backend().is_sm120()

    layer = torch.nn.Module()
    for name, value in dict(input_scale=torch.ones(3), weight_scale_2=torch.ones(3),
                            weight=torch.zeros(96, 32, dtype=torch.uint8)).items():
        layer.register_parameter(name, torch.nn.Parameter(value, requires_grad=False))
    method = ModelOptFp4LinearMethod.__new__(ModelOptFp4LinearMethod)
    method.quant_mode = "w4a4"  # what 0.5.23's __init__ sets for every backend but cutedsl W4A16
    method.process_weights_after_loading(layer)
    y = method.apply(layer, torch.ones(2, 64))
    assert calls == [("process", 96), ("apply", torch.Size([2, 64]), None)], calls
    assert torch.equal(y, torch.full((2, 64), 2.0))
    print("WIRING-OK")
    """
)


def test_sm120_backend_is_selectable_and_dispatches_to_the_overlay():
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300, cwd="/")
    assert proc.returncode == 0 and "WIRING-OK" in proc.stdout, proc.stderr[-3000:]
