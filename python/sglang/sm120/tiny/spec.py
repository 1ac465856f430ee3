"""Shapes of the tiny models and the HF config.json each one gets.

Two families, both loaded by upstream sglang 0.5.16 without changes:

* ``qwen3_moe``  -> ``Qwen3MoeForCausalLM`` (GQA attention with q/k RMSNorm, softmax top-k MoE).
* ``deepseek_v2`` -> ``DeepseekV3ForCausalLM`` (sglang's ``models/deepseek_v2.py``): MLA attention
  with a q LoRA, DeepSeek-V3/GLM-5 style MoE (sigmoid scores, ``noaux_tc`` with an expert bias,
  one shared expert, first layer dense). This is GLM-5 without its DSA indexer.

Every dimension that an NVFP4 GEMM sees is a multiple of 128: the SM90 path upstream runs NVFP4
through Marlin (W4A16), which needs N % 64 == 0 and K % 128 == 0 (``marlin_utils.py``
GPTQ_MARLIN_MIN_THREAD_N/K); the SM120 CUTLASS paths pad N and K to 32.
MLA head dims are DeepSeek-V3's (kv_lora 512, rope 64, nope 128, v 128): Lk = 576 and
qk = 192 are the head sizes sglang's Triton MLA decode/extend kernels special-case, and the only
ones FlashInfer's MLA kernels are built for.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

ARCHS = ("qwen3_moe", "deepseek_v2")
QUANTS = ("bf16", "nvfp4")
GEMM_MULTIPLE = 128  # see module docstring
MIN_VOCAB = 512      # 256 byte symbols + specials + room for merges
MAX_VOCAB = 131072   # the built-in tokenizer corpus fills at least this many BPE tokens


@dataclass(frozen=True)
class TinySpec:
    arch: str
    quant: str = "bf16"
    seed: int = 0
    layers: int = 4
    hidden: int = 256
    experts: int = 16
    top_k: int = 4
    moe_intermediate: int = 256
    vocab: int = 4096
    heads: int = 8
    max_position: int = 4096
    # qwen3_moe
    kv_heads: int = 2
    head_dim: int = 64
    # deepseek_v2 (MLA + shared expert + leading dense layers)
    dense_layers: int = 1
    dense_intermediate: int = 512
    shared_experts: int = 1
    q_lora_rank: Optional[int] = 256
    kv_lora_rank: int = 512
    qk_nope_head_dim: int = 128
    qk_rope_head_dim: int = 64
    v_head_dim: int = 128
    routed_scaling_factor: float = 2.5

    @property
    def name(self) -> str:
        return f"{self.arch}-{self.quant}-{self.seed}"

    def replace(self, **kw) -> "TinySpec":
        return dataclasses.replace(self, **kw)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def default_spec(arch: str, quant: str = "bf16", seed: int = 0, **overrides) -> TinySpec:
    """Default shapes per arch; `overrides` are TinySpec fields (None values are ignored)."""
    if arch not in ARCHS:
        raise ValueError(f"--arch must be one of {', '.join(ARCHS)}, got {arch!r}")
    base = dict(arch=arch, quant=quant, seed=seed)
    if arch == "qwen3_moe":
        base.update(layers=4, heads=8, kv_heads=2, head_dim=64)
    else:
        base.update(layers=3, heads=4, dense_layers=1)
    base.update({k: v for k, v in overrides.items() if v is not None})
    spec = TinySpec(**base)
    validate(spec)
    return spec


def _need(cond: bool, option: str, msg: str) -> None:
    if not cond:
        raise ValueError(f"{option}: {msg}")


def validate(s: TinySpec) -> None:
    """Raise ValueError naming the offending option."""
    _need(s.arch in ARCHS, "--arch", f"must be one of {', '.join(ARCHS)}, got {s.arch!r}")
    _need(s.quant in QUANTS, "--quant", f"must be one of {', '.join(QUANTS)}, got {s.quant!r}")
    _need(isinstance(s.seed, int) and s.seed >= 0, "--seed", f"must be an integer >= 0, got {s.seed!r}")
    _need(1 <= s.layers <= 64, "--layers", f"must be in 1..64, got {s.layers}")
    for opt, v in (("--hidden", s.hidden), ("--moe-intermediate", s.moe_intermediate)):
        _need(v > 0 and v % GEMM_MULTIPLE == 0, opt,
              f"must be a positive multiple of {GEMM_MULTIPLE} (NVFP4 Marlin needs K % 128 == 0), got {v}")
    _need(s.experts >= 2, "--experts", f"must be >= 2, got {s.experts}")
    _need(1 <= s.top_k <= s.experts, "--top-k", f"must be in 1..experts ({s.experts}), got {s.top_k}")
    _need(MIN_VOCAB <= s.vocab <= MAX_VOCAB, "--vocab",
          f"must be in {MIN_VOCAB}..{MAX_VOCAB}, got {s.vocab}")
    _need(s.heads >= 1, "--heads", f"must be >= 1, got {s.heads}")
    if s.arch == "qwen3_moe":
        _need(s.kv_heads >= 1 and s.heads % s.kv_heads == 0, "--heads",
              f"must be a multiple of kv_heads ({s.kv_heads}), got {s.heads}")
        _need(s.head_dim % 64 == 0, "head_dim", f"must be a multiple of 64, got {s.head_dim}")
        _need((s.heads * s.head_dim) % GEMM_MULTIPLE == 0, "--heads",
              f"heads * head_dim ({s.heads * s.head_dim}) must be a multiple of {GEMM_MULTIPLE} (o_proj K)")
    else:
        _need(0 <= s.dense_layers < s.layers, "dense_layers",
              f"must be in 0..layers-1 so at least one layer is MoE, got {s.dense_layers}")
        _need(s.dense_intermediate % GEMM_MULTIPLE == 0, "dense_intermediate",
              f"must be a multiple of {GEMM_MULTIPLE}, got {s.dense_intermediate}")
        _need(s.shared_experts >= 1, "shared_experts", f"must be >= 1, got {s.shared_experts}")
        # flashinfer's fused DeepSeek top-k (used by sglang when experts is a power of two) needs top_k <= 8
        _need(s.top_k <= 8, "--top-k", f"must be <= 8 for the DeepSeek router kernels, got {s.top_k}")


# ----------------------------------------------------------------------------- config.json

def hf_config(s: TinySpec, special_ids: dict) -> dict:
    """config.json contents. Keys follow the real checkpoints of each family (Qwen3-30B-A3B,
    DeepSeek-V3) so both transformers and sglang read them as they read those models."""
    common = {
        "vocab_size": s.vocab,
        "hidden_size": s.hidden,
        "num_hidden_layers": s.layers,
        "num_attention_heads": s.heads,
        "max_position_embeddings": s.max_position,
        "rms_norm_eps": 1e-6,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "use_cache": True,
        "bos_token_id": special_ids["bos"],
        "eos_token_id": special_ids["eos"],
        "pad_token_id": special_ids["pad"],
        "torch_dtype": "bfloat16",
        "num_experts_per_tok": s.top_k,
        "moe_intermediate_size": s.moe_intermediate,
        "norm_topk_prob": True,
    }
    if s.arch == "qwen3_moe":
        cfg = {
            "architectures": ["Qwen3MoeForCausalLM"],
            "model_type": "qwen3_moe",
            "num_key_value_heads": s.kv_heads,
            "head_dim": s.head_dim,
            "rope_theta": 1000000.0,
            "rope_scaling": None,
            "num_experts": s.experts,
            "decoder_sparse_step": 1,
            "mlp_only_layers": [],
            # dense MLP width; unused because every layer is MoE, but both loaders read it
            "intermediate_size": s.moe_intermediate * s.top_k,
            "use_sliding_window": False,
            "sliding_window": None,
            "max_window_layers": s.layers,
            "output_router_logits": False,
            "router_aux_loss_coef": 0.001,
        }
    else:
        cfg = {
            "architectures": ["DeepseekV3ForCausalLM"],
            "model_type": "deepseek_v3",
            "num_key_value_heads": s.heads,
            "q_lora_rank": s.q_lora_rank,
            "kv_lora_rank": s.kv_lora_rank,
            "qk_nope_head_dim": s.qk_nope_head_dim,
            "qk_rope_head_dim": s.qk_rope_head_dim,
            "v_head_dim": s.v_head_dim,
            "intermediate_size": s.dense_intermediate,
            "first_k_dense_replace": s.dense_layers,
            "moe_layer_freq": 1,
            "n_routed_experts": s.experts,
            "n_shared_experts": s.shared_experts,
            "n_group": 1,
            "topk_group": 1,
            "topk_method": "noaux_tc",
            "scoring_func": "sigmoid",
            "routed_scaling_factor": s.routed_scaling_factor,
            "rope_theta": 10000.0,
            "rope_scaling": None,
            "rope_interleave": True,
            "num_nextn_predict_layers": 0,
        }
    cfg.update(common)
    return dict(sorted(cfg.items()))
