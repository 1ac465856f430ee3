"""Every upstream SGLang symbol the overlay and the patch series rely on, declared once, per base.

An anchor names one upstream symbol as "package.module" (the module itself) or
"package.module:Qual.name" (a class, function or attribute defined in that module, dotted
through classes). Each anchor says where it lives on every supported base (UPSTREAM.toml); None
means the base does not have it, with the reason in ABSENT, and the overlay code that needs it
must not run on that base (`require` raises, naming the anchor and the base).

ServerArgs fields are declared by name only (SERVER_ARGS_FIELDS): on 0.5.16 they are annotated
attributes of ServerArgs itself, on 0.5.23 of the namespace classes in arg_groups/fields/.

Checked twice, by the same code (`missing`), which reads source text only (stdlib, no import of
sglang or torch): at build time against the chosen base's patched tree (forkbuild/anchors.py; a
missing anchor fails the build naming it) and in the installed package by `check_installed`
(once a process: when runner.hooks is imported, which the series does first, on the first
`has`/`require`, and by `python -m sglang.sm120 info`); a failure raises UpstreamAnchorError.
`check_installed` also refuses an environment holding another base's torch, flashinfer-python or
sglang-kernel (the build records the base's exact pins).
"""
from __future__ import annotations

import ast
import functools
import importlib
from pathlib import Path
from typing import Callable, Dict, List, Optional

BASES = ("0.5.16", "0.5.23")


def _both(spec: str) -> Dict[str, Optional[str]]:
    return {b: spec for b in BASES}


_FM = "sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe"
_MAB = "sglang.srt.layers.moe.moe_runner.triton_utils.moe_align_block_size"


# name -> {base: "module[:Qual.name]" or None}. The name is what overlay code asks for.
ANCHORS: Dict[str, Dict[str, Optional[str]]] = {
    # runner/config.py: backend identifiers and upstream's prefill default
    "cuda_graph_config.Backend": _both("sglang.srt.model_executor.cuda_graph_config:Backend"),
    "cuda_graph_config.default_prefill_backend": {
        "0.5.16": "sglang.srt.model_executor.cuda_graph_config:default_prefill_backend",
        "0.5.23": "sglang.srt.model_executor.cuda_graph_config:default_prefill_backend",
    },
    # runner/config.py: whether the model uses MLA (layerwise prefill does not handle it)
    "ServerArgs.use_mla_backend": {
        "0.5.16": "sglang.srt.server_args:ServerArgs.use_mla_backend",
        "0.5.23": None,
    },
    "model_override_base.use_mla_backend": {
        "0.5.16": None,
        "0.5.23": "sglang.srt.arg_groups.model_override_base:use_mla_backend",
    },
    "ServerArgs.get_attention_backends": {
        "0.5.16": "sglang.srt.server_args:ServerArgs.get_attention_backends",
        "0.5.23": None,
    },
    "attention_backends_of": {
        "0.5.16": None,
        "0.5.23": "sglang.srt.arg_groups.model_override_base:attention_backends_of",
    },
    # runner/resolution_hook.py: 0.5.23's declarative ServerArgs resolution and its hook point
    "register_resolution_hook": {
        "0.5.16": None,
        "0.5.23": "sglang.srt.arg_groups.resolution_hooks:register_resolution_hook",
    },
    "resolution_step.last": {
        "0.5.16": None,
        "0.5.23": "sglang.srt.arg_groups.moe_hook:validate_deepep_v2_dispatch_token_budget",
    },
    "ServerArgs._handle_gpu_memory_settings": {
        "0.5.16": "sglang.srt.server_args:ServerArgs._handle_gpu_memory_settings",
        "0.5.23": None,
    },
    "resolution_step.handle_gpu_memory_settings": {
        "0.5.16": None,
        "0.5.23": "sglang.srt.arg_groups.memory_hook:handle_gpu_memory_settings",
    },
    "resolving_view": {
        "0.5.16": None,
        "0.5.23": "sglang.srt.arg_groups.model_override_base:resolving_view",
    },
    "declare_resolution": {
        "0.5.16": None,
        "0.5.23": "sglang.srt.arg_groups.overrides:declare_resolution",
    },
    "cuda_graph_hook.disable_breakable_cudagraph_if_incompatible": {
        "0.5.16": None,
        "0.5.23": "sglang.srt.arg_groups.cuda_graph_hook:disable_breakable_cudagraph_if_incompatible",
    },
    "cuda_graph_hook.disable_full_prefill_cudagraph_if_incompatible": {
        "0.5.16": None,
        "0.5.23": "sglang.srt.arg_groups.cuda_graph_hook:disable_full_prefill_cudagraph_if_incompatible",
    },
    # server_flags.py: the CLI choices the fork adds (0.5.16 lists them in server_args.py, which
    # patch 0201 edits; 0.5.23 has an extension point)
    "add_fp4_gemm_runner_backend_choices": {
        "0.5.16": None,
        "0.5.23": "sglang.srt.arg_groups.choices:add_fp4_gemm_runner_backend_choices",
    },
    "FP4_GEMM_RUNNER_BACKEND_CHOICES": {
        "0.5.16": "sglang.srt.server_args:FP4_GEMM_RUNNER_BACKEND_CHOICES",
        "0.5.23": "sglang.srt.arg_groups.choices:FP4_GEMM_RUNNER_BACKEND_CHOICES",
    },
    # plan/resolve.py: upstream's own command-line resolution
    "prepare_server_args": _both("sglang.srt.server_args:prepare_server_args"),
    # server_flags.py: the legacy piecewise flags restored where a base dropped them
    "argparse_actions.DeprecatedStoreConstAction": _both(
        "sglang.srt.arg_groups.argparse_actions:DeprecatedStoreConstAction"),
    "argparse_actions.DeprecatedAliasStoreAction": _both(
        "sglang.srt.arg_groups.argparse_actions:DeprecatedAliasStoreAction"),
    "ServerArgs.get_model_config": {
        "0.5.16": "sglang.srt.server_args:ServerArgs.get_model_config",
        "0.5.23": None,
    },
    "model_override_base.model_config_of": {
        "0.5.16": None,
        "0.5.23": "sglang.srt.arg_groups.model_override_base:model_config_of",
    },
    # runner/config.py: upstream's per-backend prefill compatibility rules
    "ServerArgs._disable_breakable_cudagraph_if_incompatible": {
        "0.5.16": "sglang.srt.server_args:ServerArgs._disable_breakable_cudagraph_if_incompatible",
        "0.5.23": None,
    },
    "ServerArgs._disable_tc_piecewise_cudagraph_if_incompatible": {
        "0.5.16": "sglang.srt.server_args:ServerArgs._disable_tc_piecewise_cudagraph_if_incompatible",
        "0.5.23": None,
    },
    "ServerArgs._disable_full_prefill_cudagraph_if_incompatible": {
        "0.5.16": "sglang.srt.server_args:ServerArgs._disable_full_prefill_cudagraph_if_incompatible",
        "0.5.23": None,
    },
    # runner/backend.py, runner/runners.py: the runners and backends the layerwise ones extend
    "BreakableCudaGraphBackend": _both(
        "sglang.srt.model_executor.runner_backend.breakable_cuda_graph_backend:BreakableCudaGraphBackend"),
    "FullCudaGraphBackend": _both(
        "sglang.srt.model_executor.runner_backend.full_cuda_graph_backend:FullCudaGraphBackend"),
    "breakable_cuda_graph._current_capture_var": _both(
        "sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph.breakable_cuda_graph:_current_capture_var"),
    "DecodeCudaGraphRunner": _both(
        "sglang.srt.model_executor.runner.decode_cuda_graph_runner:DecodeCudaGraphRunner"),
    "PrefillCudaGraphRunner": _both(
        "sglang.srt.model_executor.runner.prefill_cuda_graph_runner:PrefillCudaGraphRunner"),
    "model_capture_mode": _both("sglang.srt.model_executor.runner_utils.capture_mode:model_capture_mode"),
    # runner/runners.py: the decode warm pass re-runs the capture's metadata step (per-size replay kernels)
    "DecodeCudaGraphRunner.capture_prepare": _both(
        "sglang.srt.model_executor.runner.decode_cuda_graph_runner:DecodeCudaGraphRunner.capture_prepare"),
    "DecodeCudaGraphRunner.capture_one_shape": _both(
        "sglang.srt.model_executor.runner.decode_cuda_graph_runner:DecodeCudaGraphRunner.capture_one_shape"),
    # runner/runners.py + decode_attention.py: a replay with decode attention islands plans the
    # real batch in load_batch, as graphs disabled plans it
    "DecodeCudaGraphRunner.load_batch": _both(
        "sglang.srt.model_executor.runner.decode_cuda_graph_runner:DecodeCudaGraphRunner.load_batch"),
    "FlashInferAttnBackend.init_forward_metadata": _both(
        "sglang.srt.layers.attention.flashinfer_backend:FlashInferAttnBackend.init_forward_metadata"),
    "ForwardContext": _both("sglang.srt.model_executor.forward_context:ForwardContext"),
    "forward_context": _both("sglang.srt.model_executor.forward_context:forward_context"),
    "runtime_context.get_forward": _both("sglang.srt.runtime_context:get_forward"),
    "runtime_context.get_server_args": _both("sglang.srt.runtime_context:get_server_args"),
    # check/moe_timing.py: a kernel harness publishes upstream's default MoE flags (no server runs)
    "runtime_context.get_context": _both("sglang.srt.runtime_context:get_context"),
    "ServerArgs": _both("sglang.srt.server_args:ServerArgs"),
    # runner/config.py: where the resolved CUDA-graph config lives at run time on 0.5.23
    "runtime_context.get_exec": {
        "0.5.16": None,
        "0.5.23": "sglang.srt.runtime_context:get_exec",
    },
    # resolved(): where 0.5.23 declares the fields the overlay reads from its namespace bags
    "exec.deterministic.enable_deterministic_inference": {
        "0.5.16": None,
        "0.5.23": "sglang.srt.arg_groups.fields.exec_:ExecDeterministic.enable_deterministic_inference",
    },
    "exec.moe.enable_fused_moe_sum_all_reduce": {
        "0.5.16": None,
        "0.5.23": "sglang.srt.arg_groups.fields.exec_:ExecMoe.enable_fused_moe_sum_all_reduce",
    },
    # runner/lean_moe.py: the Triton MoE path it replays without Python dispatch
    "FusedMoE": _both("sglang.srt.layers.moe.fused_moe_triton.layer:FusedMoE"),
    "FusedMoE.forward": _both("sglang.srt.layers.moe.fused_moe_triton.layer:FusedMoE.forward"),
    "is_batch_invariant_mode_enabled": _both("sglang.srt.batch_invariant_ops:is_batch_invariant_mode_enabled"),
    "fused_experts_none_to_triton": _both("sglang.srt.layers.moe.moe_runner.triton:fused_experts_none_to_triton"),
    "triton_utils.get_config": _both("sglang.srt.layers.moe.moe_runner.triton_utils:get_config"),
    "StandardDispatcher": _both("sglang.srt.layers.moe.token_dispatcher.standard:StandardDispatcher"),
    "UnquantizedFusedMoEMethod.forward_cuda": _both(
        "sglang.srt.layers.quantization.unquant:UnquantizedFusedMoEMethod.forward_cuda"),
    "StandardTopKOutput": _both("sglang.srt.layers.moe.topk:StandardTopKOutput"),
    # check/moe_timing.py: upstream's NVFP4 Marlin MoE (ModelOptNvFp4FusedMoEMethod's SM80-SM90 path)
    # and bf16 Triton fused MoE, timed beside the grouped W4A16 kernel
    "MoeRunnerConfig": _both("sglang.srt.layers.moe.moe_runner.base:MoeRunnerConfig"),
    "MarlinMoeQuantInfo": _both("sglang.srt.layers.moe.moe_runner.marlin:MarlinMoeQuantInfo"),
    "fused_experts_none_to_marlin": _both("sglang.srt.layers.moe.moe_runner.marlin:fused_experts_none_to_marlin"),
    "prepare_moe_nvfp4_layer_for_marlin": _both(
        "sglang.srt.layers.quantization.marlin_utils_fp4:prepare_moe_nvfp4_layer_for_marlin"),
    "fused_experts": _both("sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe:fused_experts"),
    "fused_moe._is_cuda": _both("sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe:_is_cuda"),
    "fused_moe.get_config_dtype_str": _both(
        "sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe:get_config_dtype_str"),
    "fused_moe.try_get_optimal_moe_config": _both(
        "sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe:try_get_optimal_moe_config"),
    "fused_moe._down_moe_use_tma": {
        "0.5.16": "sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe:_down_moe_use_tma",
        "0.5.23": None,
    },
    "fused_moe._moe_support_tma": {
        "0.5.16": None,
        "0.5.23": "sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe:_moe_support_tma",
    },
    "fused_moe._use_moe_sum_reduce_torch_compile": _both(
        "sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe:_use_moe_sum_reduce_torch_compile"),
    "fused_moe.invoke_fused_moe_kernel": _both(
        "sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe:invoke_fused_moe_kernel"),
    "fused_moe.silu_and_mul": _both("sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe:silu_and_mul"),
    "fused_moe.gelu_and_mul": _both("sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe:gelu_and_mul"),
    "fused_moe.moe_sum_reduce": _both("sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe:moe_sum_reduce"),
    "fused_moe.moe_sum_reduce_torch_compile": _both(
        "sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe:moe_sum_reduce_torch_compile"),
    "moe_align_block_size.sgl_moe_align_block_size": _both(
        "sglang.srt.layers.moe.moe_runner.triton_utils.moe_align_block_size:sgl_moe_align_block_size"),
    "moe_align_block_size._SGLANG_EXPERIMENTAL_LORA_OPTI": _both(
        "sglang.srt.layers.moe.moe_runner.triton_utils.moe_align_block_size:_SGLANG_EXPERIMENTAL_LORA_OPTI"),
    "jit_kernel.activation": {
        "0.5.16": "sglang.jit_kernel.activation",
        "0.5.23": None,
    },
    "jit_kernel.activation._jit_activation_module": {
        "0.5.16": "sglang.jit_kernel.activation:_jit_activation_module",
        "0.5.23": None,
    },
    # runner/lean_triton_0523.py: what 0.5.23's Triton MoE path adds (align fast path, Triton sum,
    # activation row filter, its activation module) and what the gate reads to refuse
    "fused_moe.moe_sum_reduce_triton": _both(f"{_FM}:moe_sum_reduce_triton"),
    "fused_moe.is_arch_support_pdl": {"0.5.16": None, "0.5.23": f"{_FM}:is_arch_support_pdl"},
    "fused_moe._activation_row_filter": {"0.5.16": None, "0.5.23": f"{_FM}:_activation_row_filter"},
    "moe_align_block_size.moe_align_small_numel": {"0.5.16": None, "0.5.23": f"{_MAB}:moe_align_small_numel"},
    "moe_align_block_size.SMALL_NUMEL_LIMIT": {"0.5.16": None, "0.5.23": f"{_MAB}:SMALL_NUMEL_LIMIT"},
    "moe_align_block_size._CUDA_SMALL_BATCH_MAX_BUCKETS": {
        "0.5.16": None, "0.5.23": f"{_MAB}:_CUDA_SMALL_BATCH_MAX_BUCKETS"},
    "kernels.activation": {"0.5.16": None, "0.5.23": "sglang.kernels.ops.activation.activation"},
    "kernels.activation.activation_module": {
        "0.5.16": None, "0.5.23": "sglang.kernels.ops.activation.activation:activation_module"},
    "fused_op.get_fused_op_backend": {"0.5.16": None, "0.5.23": "sglang.kernels.fused_op:get_fused_op_backend"},
    "pynccl_allocator.is_symmetric_memory_enabled": _both(
        "sglang.srt.distributed.device_communicators.pynccl_allocator:is_symmetric_memory_enabled"),
    "runtime_context.get_parallel": _both("sglang.srt.runtime_context:get_parallel"),
    # runner/prewarm.py: sampling kernels and the Triton attention check it warms before capture
    "sampler": _both("sglang.srt.layers.sampler"),
    "support_triton": _both("sglang.srt.utils.common:support_triton"),
    "forward_batch_info.clamp_position": _both("sglang.srt.model_executor.forward_batch_info:clamp_position"),
    "compute_position_triton": _both("sglang.kernels.ops.attention.position:compute_position_triton"),
    "write_req_to_token_pool_triton": _both("sglang.kernels.ops.memory.common:write_req_to_token_pool_triton"),
    "alloc_extend_kernel": _both("sglang.kernels.ops.memory.allocator:alloc_extend_kernel"),
    "alloc_decode_kernel": _both("sglang.kernels.ops.memory.allocator:alloc_decode_kernel"),
    "FlashInferMLAAttnBackend": _both("sglang.srt.layers.attention.flashinfer_mla_backend:FlashInferMLAAttnBackend"),
    "dsa_get_k_and_s_triton": {
        "0.5.16": "sglang.kernels.ops.attention.dsa.index_buf_accessor:_get_k_and_s_triton",
        "0.5.23": None,
    },
    "create_flashinfer_kv_indices_triton": {
        "0.5.16": "sglang.kernels.ops.kvcache.kv_indices:create_flashinfer_kv_indices_triton",
        "0.5.23": "sglang.kernels.ops.attention.kv_indices:create_flashinfer_kv_indices_triton",
    },
    # check/: upstream's FP4 linear backends the validation kit times and checks beside the fork's
    "apply_fp4_marlin_linear": _both("sglang.srt.layers.quantization.marlin_utils_fp4:apply_fp4_marlin_linear"),
    "prepare_nvfp4_layer_for_marlin": _both(
        "sglang.srt.layers.quantization.marlin_utils_fp4:prepare_nvfp4_layer_for_marlin"),
    "ModelOptFp4Config": _both("sglang.srt.layers.quantization.modelopt_quant:ModelOptFp4Config"),
    "ModelOptFp4LinearMethod": _both("sglang.srt.layers.quantization.modelopt_quant:ModelOptFp4LinearMethod"),
    "fp4_quantize": _both("sglang.srt.layers.quantization.fp4_utils:fp4_quantize"),
    # fp4_linear.py: how upstream swaps a parameter in place (keeps CUDA-graph addresses)
    "copy_or_rebind_param": _both("sglang.srt.layers.utils.common:copy_or_rebind_param"),
    # model_names.py (patch 0401): the OpenAI serving base the model-name check hooks into
    "OpenAIServingBase": _both("sglang.srt.entrypoints.openai.serving_base:OpenAIServingBase"),
    # patches: the upstream definitions their hunks change (the hunks' text is checked strictly
    # when they apply; these say which symbols they are about)
    "initialize_fp4_gemm_config": _both("sglang.srt.layers.quantization.fp4_utils:initialize_fp4_gemm_config"),
    # fp4_selfcheck.py: where initialize_fp4_gemm_config reads the backend on 0.5.23 (0.5.16 passes it)
    "fp4_utils.get_exec": {
        "0.5.16": None,
        "0.5.23": "sglang.srt.layers.quantization.fp4_utils:get_exec",
    },
    "ModelOptNvFp4FusedMoEMethod.create_moe_runner": _both(
        "sglang.srt.layers.quantization.modelopt_quant:ModelOptNvFp4FusedMoEMethod.create_moe_runner"),
    # fp4_moe*.py and lean_moe.py (patch 0202): the MoE runner backend, its auto resolution, and
    # the dispatch/combine types of upstream's NVFP4 MoE path
    "ModelOptNvFp4FusedMoEMethod.process_weights_after_loading": _both(
        "sglang.srt.layers.quantization.modelopt_quant:ModelOptNvFp4FusedMoEMethod.process_weights_after_loading"),
    "ModelOptNvFp4FusedMoEMethod.apply": _both(
        "sglang.srt.layers.quantization.modelopt_quant:ModelOptNvFp4FusedMoEMethod.apply"),
    "moe_utils.MoeRunnerBackend": _both("sglang.srt.layers.moe.utils:MoeRunnerBackend"),
    "moe_utils.get_moe_runner_backend": _both("sglang.srt.layers.moe.utils:get_moe_runner_backend"),
    "moe_utils.get_flags": _both("sglang.srt.layers.moe.utils:get_flags"),
    "moe_utils.should_use_flashinfer_cutlass_moe_fp4_allgather": _both(
        "sglang.srt.layers.moe.utils:should_use_flashinfer_cutlass_moe_fp4_allgather"),
    "overrides._moe_runner_backend_quant_constraints": _both(
        "sglang.srt.arg_groups.overrides:_moe_runner_backend_quant_constraints"),
    "StandardCombineInput": _both("sglang.srt.layers.moe.token_dispatcher.standard:StandardCombineInput"),
    "TopKOutputChecker": _both("sglang.srt.layers.moe.topk:TopKOutputChecker"),
    "VocabParallelEmbedding": _both("sglang.srt.layers.vocab_parallel_embedding:VocabParallelEmbedding"),
    # patch 0108: the DSA indexer's compiled head-gate helpers and the backend's compiled concat
    "Indexer._project_and_scale_head_gates": _both(
        "sglang.srt.layers.attention.dsa.dsa_indexer:Indexer._project_and_scale_head_gates"),
    "Indexer._get_logits_head_gate": _both(
        "sglang.srt.layers.attention.dsa.dsa_indexer:Indexer._get_logits_head_gate"),
    "Indexer._apply_q_scale_and_softmax_scale": _both(
        "sglang.srt.layers.attention.dsa.dsa_indexer:Indexer._apply_q_scale_and_softmax_scale"),
    "Indexer._scale_head_gates": _both("sglang.srt.layers.attention.dsa.dsa_indexer:Indexer._scale_head_gates"),
    "dsa_backend._compiled_cat": _both("sglang.srt.layers.attention.dsa_backend:_compiled_cat"),
}

# Why a base lacks an anchor, and what the overlay does there instead.
ABSENT: Dict[str, str] = {
    "dsa_get_k_and_s_triton": "0.5.23 gathers the DSA indexer's keys through its key pool (index_key_cache), "
                              "not index_buf_accessor; its prefill gather is not pre-built",
    "ServerArgs.use_mla_backend": "0.5.23 moved it to arg_groups.model_override_base.use_mla_backend(server_args)",
    "model_override_base.use_mla_backend": "0.5.16 has it as the method ServerArgs.use_mla_backend",
    "ServerArgs.get_model_config": "0.5.23 moved it to arg_groups.model_override_base.model_config_of(server_args)",
    "model_override_base.model_config_of": "0.5.16 has it as the method ServerArgs.get_model_config",
    "ServerArgs.get_attention_backends": "0.5.23 moved it to arg_groups.model_override_base.attention_backends_of",
    "attention_backends_of": "0.5.16 has it as the method ServerArgs.get_attention_backends",
    "register_resolution_hook": "0.5.16 resolves ServerArgs in __post_init__ (patch 0102 calls the overlay there)",
    "resolution_step.last": "0.5.16 resolves ServerArgs in __post_init__ (patch 0102 calls the overlay at its end)",
    "ServerArgs._handle_gpu_memory_settings": "0.5.23 moved it to arg_groups/memory_hook.py (handle_gpu_memory_settings)",
    "resolution_step.handle_gpu_memory_settings": "0.5.16 has it as the method ServerArgs._handle_gpu_memory_settings",
    "resolving_view": "0.5.16 resolves ServerArgs in place",
    "declare_resolution": "0.5.16 resolves ServerArgs in place",
    "cuda_graph_hook.disable_breakable_cudagraph_if_incompatible":
        "0.5.16 has it as the method ServerArgs._disable_breakable_cudagraph_if_incompatible",
    "cuda_graph_hook.disable_full_prefill_cudagraph_if_incompatible":
        "0.5.16 has it as the method ServerArgs._disable_full_prefill_cudagraph_if_incompatible",
    "runtime_context.get_exec": "0.5.16 keeps the resolved config on ServerArgs itself",
    "fp4_utils.get_exec": "0.5.16's initialize_fp4_gemm_config takes the server args instead",
    "exec.deterministic.enable_deterministic_inference": "0.5.16 has no namespace bags: the resolved "
                                                         "value is the ServerArgs record's field",
    "exec.moe.enable_fused_moe_sum_all_reduce": "0.5.16 has no namespace bags: the resolved value is "
                                                "the ServerArgs record's field",
    "add_fp4_gemm_runner_backend_choices": "0.5.16 has no add_*_choices extension points (patch 0201 edits the list)",
    "ServerArgs._disable_breakable_cudagraph_if_incompatible":
        "0.5.23 moved the per-backend prefill rules into arg_groups/cuda_graph_hook.py",
    "ServerArgs._disable_tc_piecewise_cudagraph_if_incompatible": "0.5.22 removed the tc_piecewise backend",
    "ServerArgs._disable_full_prefill_cudagraph_if_incompatible":
        "0.5.23 moved the per-backend prefill rules into arg_groups/cuda_graph_hook.py",
    "fused_moe._down_moe_use_tma": "0.5.23 renamed it _moe_support_tma",
    "fused_moe._moe_support_tma": "0.5.16 names it _down_moe_use_tma",
    "jit_kernel.activation": "0.5.23 ships no sglang.jit_kernel package",
    "jit_kernel.activation._jit_activation_module": "0.5.23 ships no sglang.jit_kernel package",
    "fused_moe.is_arch_support_pdl": "0.5.16's MoE combine has no PDL-gated Triton sum",
    "fused_moe._activation_row_filter": "0.5.16 runs the activation on every row",
    "moe_align_block_size.moe_align_small_numel": "0.5.16 has no single-CTA small-batch align",
    "moe_align_block_size.SMALL_NUMEL_LIMIT": "0.5.16 has no single-CTA small-batch align",
    "moe_align_block_size._CUDA_SMALL_BATCH_MAX_BUCKETS": "0.5.16 has no single-CTA small-batch align",
    "kernels.activation": "0.5.16 keeps its JIT activations in sglang.jit_kernel.activation",
    "kernels.activation.activation_module": "0.5.16 names it sglang.jit_kernel.activation._jit_activation_module",
    "fused_op.get_fused_op_backend": "0.5.16's unquantized MoE method is a MultiPlatformOp (dispatch fixed at init)",
}

# ServerArgs fields the overlay reads (runner/config.py incompatibilities, lean_moe, prewarm,
# model_names). Every one must exist on every base.
SERVER_ARGS_FIELDS = (
    "device", "enable_torch_compile", "enable_dp_attention", "moe_a2a_backend", "enable_two_batch_overlap",
    "pp_size", "speculative_algorithm", "enable_lora", "lora_paths", "enable_pdmux", "dllm_algorithm",
    "debug_cuda_graph", "enable_memory_saver", "enable_eplb", "expert_distribution_recorder_mode",
    "sampling_backend", "attention_backend", "prefill_attention_backend", "decode_attention_backend",
    "enable_deterministic_inference", "enable_fused_moe_sum_all_reduce", "cuda_graph_config",
    "cuda_graph_backend_decode", "cuda_graph_backend_prefill", "disable_cuda_graph", "fp4_gemm_runner_backend",
    "chunked_prefill_size", "max_running_requests", "tp_size",
)

# Resolved settings the overlay reads at run time, through `resolved(field)`: field -> {base: where}.
# "record": the ServerArgs record runtime_context.get_server_args() returns (0.5.16 resolves it in
# place, so the record holds the resolved value). "exec.<namespace>": get_exec().<namespace>.<field>
# (0.5.23 publishes resolved values in namespace bags; its record is the startup input, misses
# overrides made after publishing, and the global-config read ratchet of upstream's repository
# fails on any field read off it). Each "exec.<namespace>" entry has the anchor
# "exec.<namespace>.<field>" naming the class that declares the field on that base.
RESOLVED_FIELDS: Dict[str, Dict[str, str]] = {
    "enable_deterministic_inference": {"0.5.16": "record", "0.5.23": "exec.deterministic"},
    "enable_fused_moe_sum_all_reduce": {"0.5.16": "record", "0.5.23": "exec.moe"},
}

# Attributes the overlay reads from ServerArgs that a base or a moment may lack, and why reading
# them with a default is right there (runner/config.py `_get`).
OPTIONAL_ATTRS = {
    "cuda_graph_tc_compiler": "0.5.16's tc_piecewise compiler flag; 0.5.22 removed it with the backend",
    "_cuda_graph_config_locked": "set by upstream's cuda-graph parse step; a record it has not run on has none",
    "cuda_graph_layerwise_every_size": "the fork's own field (patch 0102); upstream lacks it by design",
}

# Where a base declares ServerArgs fields: (module, class name or None for every class in it).
FIELD_HOMES = {
    "0.5.16": [("sglang.srt.server_args", "ServerArgs")],
    "0.5.23": [(f"sglang.srt.arg_groups.fields.{m}", None) for m in (
        "device", "disagg", "exec_", "lora", "memory", "mm", "model", "observability", "parallel",
        "schedule", "serving", "spec")],
}


class UpstreamAnchorError(RuntimeError):
    """An upstream symbol the fork relies on is missing from this base."""


def module_files(module: str) -> List[str]:
    """Candidate source paths (python/sglang/...) of a dotted module name."""
    rel = module.replace(".", "/")
    return [f"python/{rel}.py", f"python/{rel}/__init__.py"]


def _defined(body, name: str):
    """The node defining `name` at this level (def, class, assignment, annotation, import)."""
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            return node
        if isinstance(node, ast.Assign):
            for t in node.targets:
                for n in ast.walk(t):
                    if isinstance(n, ast.Name) and n.id == name:
                        return node
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == name:
            return node
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for a in node.names:
                if (a.asname or a.name.split(".")[0]) == name:
                    return node
        if isinstance(node, (ast.If, ast.Try)):  # definitions under `if _is_cuda:` / try-except
            for sub in (node.body, getattr(node, "orelse", []), getattr(node, "finalbody", []),
                        *[h.body for h in getattr(node, "handlers", [])]):
                found = _defined(sub, name)
                if found is not None:
                    return found
    return None


class _Tree:
    """A source tree read once per module: module name -> parsed body (or None)."""

    def __init__(self, read: Callable[[str], Optional[str]]):
        self.read = read
        self._bodies: Dict[str, Optional[list]] = {}

    def body(self, module: str) -> Optional[list]:
        if module not in self._bodies:
            text = next((t for t in map(self.read, module_files(module)) if t is not None), None)
            self._bodies[module] = None if text is None else ast.parse(text).body
        return self._bodies[module]


def _find(tree: _Tree, spec: str) -> Optional[str]:
    """None when `spec` is defined in the tree, else why not."""
    module, _, qual = spec.partition(":")
    body = tree.body(module)
    if body is None:
        return f"module {module} not found"
    for part in qual.split(".") if qual else ():
        node = _defined(body, part)
        if node is None:
            return f"{qual} not defined in {module}"
        body = node.body if isinstance(node, ast.ClassDef) else []
    return None


def _field_missing(tree: _Tree, base: str, field: str) -> Optional[str]:
    for module, cls in FIELD_HOMES[base]:
        for node in tree.body(module) or []:
            if isinstance(node, ast.ClassDef) and (cls is None or node.name == cls):
                if any(isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name) and n.target.id == field
                       for n in node.body):
                    return None
    return f"ServerArgs field {field} not declared in {', '.join(m for m, _ in FIELD_HOMES[base])}"


def missing(read: Callable[[str], Optional[str]], base: str) -> List[str]:
    """Every anchor of `base` not found in the tree `read` (python/sglang/... -> text or None),
    as "name (spec): why" lines; [] when all are there."""
    if base not in BASES:
        return [f"base {base} is not declared in sglang/sm120/upstream_api.py (BASES = {', '.join(BASES)})"]
    tree, out = _Tree(read), []
    for name, where in ANCHORS.items():
        if base not in where:
            out.append(f"{name}: no declaration for base {base}")
            continue
        spec = where[base]
        if spec is None:
            if name not in ABSENT:
                out.append(f"{name}: absent on {base} without a reason in ABSENT")
            continue
        why = _find(tree, spec)
        if why:
            out.append(f"{name} ({spec}): {why}")
    for field in SERVER_ARGS_FIELDS:
        why = _field_missing(tree, base, field)
        if why:
            out.append(f"ServerArgs.{field}: {why}")
    for field, where in RESOLVED_FIELDS.items():
        place = where.get(base)
        if place is None or (place != "record" and not place.startswith("exec.")):
            out.append(f"resolved {field}: no reader declared for base {base} (RESOLVED_FIELDS)")
        elif place.startswith("exec.") and (ANCHORS.get(f"{place}.{field}", {}).get(base) is None
                                            or ANCHORS["runtime_context.get_exec"].get(base) is None):
            out.append(f"resolved {field}: {place} on {base} needs the anchors runtime_context.get_exec "
                       f"and {place}.{field}")
    return out


def status(read: Callable[[str], Optional[str]], base: str) -> Dict[str, str]:
    """name -> "ok" / "absent (reason)" / "MISSING (why)", for reports."""
    tree, out = _Tree(read), {}
    for name, where in ANCHORS.items():
        spec = where.get(base)
        if spec is None:
            out[name] = f"absent ({ABSENT.get(name, 'no reason given')})"
        else:
            why = _find(tree, spec)
            out[name] = f"MISSING ({why})" if why else "ok"
    for field in SERVER_ARGS_FIELDS:
        why = _field_missing(tree, base, field)
        out[f"ServerArgs.{field}"] = f"MISSING ({why})" if why else "ok"
    return out


# --- the installed package ---------------------------------------------------------------------
def upstream_present() -> bool:
    """Whether upstream sglang (sglang.srt) is importable here; kernel-only test environments
    carry the overlay alone."""
    import importlib.util

    return importlib.util.find_spec("sglang.srt") is not None


def installed_base() -> str:
    """The base this installation was built on: the build writes it into _build_info; a source
    tree of upstream + series (no build) has upstream's own version in sglang/_version.py."""
    try:
        from sglang.sm120 import _build_info

        return _build_info.BASE["version"]
    except ImportError:
        pass
    try:
        from sglang._version import __version__ as upstream_version
    except ImportError:
        raise UpstreamAnchorError("neither sglang.sm120._build_info nor sglang._version: the upstream "
                                  "base of this sglang is unknown") from None
    if upstream_version not in BASES:
        raise UpstreamAnchorError(f"sglang {upstream_version} is not a supported base ({', '.join(BASES)})")
    return upstream_version


def _installed_reader():
    import sglang

    root = Path(sglang.__file__).resolve().parent.parent

    def read(path: str) -> Optional[str]:
        p = root / path[len("python/"):]
        return p.read_text() if p.is_file() else None

    return read


def dependency_mismatches(requires: Dict[str, str], version_of: Callable[[str], Optional[str]]) -> List[str]:
    """The base's exact pins (torch, flashinfer-python, sglang-kernel) the environment contradicts.
    A package that is not installed is not a mismatch (CPU test environments leave GPU-only ones
    out); a local version suffix (2.11.0+cu130) matches its public version, as in PEP 440."""
    out = []
    for name, want in requires.items():
        have = version_of(name)
        if have is not None and have.split("+", 1)[0] != want:
            out.append(f"{name} {have} (base needs =={want})")
    return out


def _installed_version(name: str) -> Optional[str]:
    import importlib.metadata as md

    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None


@functools.lru_cache(maxsize=None)
def check_installed() -> str:
    """Check once that the installed base has every anchor and that the environment holds that
    base's dependencies; returns the base."""
    base = installed_base()
    gone = missing(_installed_reader(), base)
    if gone:
        raise UpstreamAnchorError(f"installed sglang (base {base}) lacks upstream symbols the fork relies on: "
                                  + "; ".join(gone))
    try:
        from sglang.sm120._build_info import REQUIRES
    except ImportError:  # a source tree of upstream + series: no build, no recorded pins
        return base
    wrong = dependency_mismatches(REQUIRES, _installed_version)
    if wrong:
        raise UpstreamAnchorError(
            f"this sglang is the fork built on upstream sglang {base}, but the environment holds another "
            f"base's dependencies: {'; '.join(wrong)}. Install the fork wheel built for the base these "
            f"match (SGLANG_SM120_BASE=<version> pip wheel .; `python -m sglang.sm120 info` names a "
            f"wheel's base), or install this one with its dependencies (pip install without --no-deps)")
    return base


def has(name: str) -> bool:
    """Whether the installed base has anchor `name` (declared, so never a guess)."""
    if name not in ANCHORS:
        raise KeyError(f"{name}: not an anchor declared in sglang/sm120/upstream_api.py")
    return ANCHORS[name][check_installed()] is not None


def resolved(field: str):
    """The resolved value of the server setting `field` in this process, read where the installed
    base keeps it (RESOLVED_FIELDS)."""
    if field not in RESOLVED_FIELDS:
        raise KeyError(f"{field}: not declared in RESOLVED_FIELDS (sglang/sm120/upstream_api.py)")
    place = RESOLVED_FIELDS[field][check_installed()]
    if place == "record":
        holder = require("runtime_context.get_server_args")()
    else:
        holder = getattr(require("runtime_context.get_exec")(), place.split(".", 1)[1])
    return getattr(holder, field)


def require(name: str):
    """The upstream object anchor `name` names on the installed base (imported on first use)."""
    if name not in ANCHORS:
        raise KeyError(f"{name}: not an anchor declared in sglang/sm120/upstream_api.py")
    base = check_installed()
    spec = ANCHORS[name][base]
    if spec is None:
        raise UpstreamAnchorError(f"{name} does not exist on base {base}: {ABSENT[name]}")
    module, _, qual = spec.partition(":")
    obj = importlib.import_module(module)
    for part in qual.split(".") if qual else ():
        obj = getattr(obj, part)
    return obj
