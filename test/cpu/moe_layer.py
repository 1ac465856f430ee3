"""A real upstream FusedMoE on the unquantized Triton path, assembled by hand (upstream's classes,
attributes set as its constructor would), and its inputs: the layer the lean MoE step is held to,
on CPU (test/cpu/runner/test_runner_lean_moe.py) and on the GPU (test/gpu/test_lean_moe.py)."""
from __future__ import annotations

import torch

from sglang.srt.layers.moe.fused_moe_triton.layer import FusedMoE
from sglang.srt.layers.moe.moe_runner.base import MoeRunnerConfig
from sglang.srt.layers.moe.moe_runner.runner import MoeRunner
from sglang.srt.layers.moe.moe_runner.triton import fused_experts_none_to_triton
from sglang.srt.layers.moe.token_dispatcher.standard import StandardDispatcher
from sglang.srt.layers.moe.topk import StandardTopKOutput
from sglang.srt.layers.moe.utils import MoeRunnerBackend
from sglang.srt.layers.quantization.unquant import UnquantizedFusedMoEMethod


def make_layer(E=6, H=32, inter=16, topk=2, activation="silu", rsf=None, inplace=True, seed=0,
               device="cpu"):
    g = torch.Generator().manual_seed(seed)
    layer = FusedMoE.__new__(FusedMoE)
    torch.nn.Module.__init__(layer)
    dt = torch.bfloat16
    layer.w13_weight = torch.nn.Parameter(
        (torch.randn(E, 2 * inter, H, generator=g) * 0.2).to(device, dt), requires_grad=False)
    layer.w2_weight = torch.nn.Parameter(
        (torch.randn(E, H, inter, generator=g) * 0.2).to(device, dt), requires_grad=False)
    cfg = MoeRunnerConfig(num_experts=E, num_local_experts=E, hidden_size=H,
                          intermediate_size_per_partition=inter, top_k=topk, params_dtype=dt,
                          activation=activation, routed_scaling_factor=rsf, inplace=inplace)
    layer.moe_runner_config = cfg
    qm = UnquantizedFusedMoEMethod.__new__(UnquantizedFusedMoEMethod)
    torch.nn.Module.__init__(qm)
    qm.use_flashinfer_cutlass = qm.use_triton_kernels = qm.with_bias = False
    qm.use_flashinfer_trtllm_moe = qm.use_deep_gemm = False
    qm._aiter_runner = None
    qm.w13_swiglu_interleaved = False  # 0.5.23: w13 not interleaved for the fused SwiGLU epilogue
    qm._forward_method = qm.forward_cuda
    runner = MoeRunner.__new__(MoeRunner)
    runner.runner_backend, runner.config, runner.lora_enabled = MoeRunnerBackend.TRITON, cfg, False
    runner.fused_func, runner.runner_core = fused_experts_none_to_triton, None
    qm.runner, qm.moe_runner_config = runner, cfg
    layer.quant_method = qm
    disp = StandardDispatcher.__new__(StandardDispatcher)
    disp.moe_ep_size, disp.skip_local_expert_mapping = 1, False
    disp.local_expert_mapping, disp.use_aiter_moe_runner, disp.expert_mask_gpu = None, False, None
    layer.dispatcher = disp
    layer._use_ascend_fuseep = False
    layer._dwdp_bound = False  # 0.5.23: no DWDP weight prefetch
    layer.moe_ep_size = layer.moe_tp_size = 1
    layer.reduce_results = False
    return layer


def make_inputs(layer, rows, seed=1):
    g = torch.Generator().manual_seed(seed)
    E, _, H = layer.w13_weight.shape
    dev = layer.w13_weight.device
    topk = layer.moe_runner_config.top_k
    h = (torch.randn(rows, H, generator=g)).to(dev, torch.bfloat16)
    logits = torch.randn(rows, E, generator=g).to(dev)
    w, ids = torch.topk(torch.softmax(logits, -1), topk, dim=-1)
    return h, StandardTopKOutput(w.contiguous(), ids.to(torch.int32).contiguous(), logits)
