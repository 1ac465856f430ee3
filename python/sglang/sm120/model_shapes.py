"""Linear-layer shapes of the models the fork targets (from their Hugging Face configs), for
kernel tests and benchmarks. N of column-parallel and K of row-parallel layers are divided by TP."""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Tuple


def projection_shapes(tps=(1, 4, 8)) -> List[Tuple[str, int, int]]:
    """(name, N, K) of the attention and shared-expert projections of Qwen3-30B-A3B and GLM-5."""
    out = [("glm5 q_a+kv_a (replicated)", 2624, 6144)]
    for tp in tps:
        out += [
            (f"qwen3-30b qkv tp{tp}", 5120 // tp, 2048),
            (f"qwen3-30b o_proj tp{tp}", 2048, 4096 // tp),
            (f"glm5 q_b tp{tp}", 16384 // tp, 2048),
            (f"glm5 kv_b tp{tp}", 28672 // tp, 512),
            (f"glm5 o_proj tp{tp}", 6144, 16384 // tp),
            (f"glm5 shared gate_up tp{tp}", 4096 // tp, 6144),
            (f"glm5 shared down tp{tp}", 6144, 2048 // tp),
        ]
    return out


@dataclass(frozen=True)
class MoeShape:
    """The routed experts one GPU holds: `experts` local experts of hidden size `hidden` and
    intermediate size `inter` (gate_up N = 2 * inter, K = hidden; down N = hidden, K = inter), top-k
    routing over `global_experts` (more than `experts` under expert parallelism: ids outside
    [0, experts) belong to other ranks)."""

    name: str
    experts: int
    hidden: int
    inter: int
    topk: int = 8
    global_experts: Optional[int] = None
    routed_scaling: float = 1.0

    @property
    def routed_over(self) -> int:
        return self.global_experts or self.experts

    def fp4_bytes_per_expert(self) -> int:
        """NVFP4 weight bytes of one expert: e2m1 (half a byte) + one e4m3 scale per 16 values."""
        return 3 * self.hidden * self.inter * 9 // 16

    def bf16_bytes_per_expert(self) -> int:
        return 3 * self.hidden * self.inter * 2


# GLM-5 (256 experts, hidden 6144, moe_intermediate 2048, routed_scaling 2.5) on one rank of TP 8
# (each expert's intermediate split 8 ways) and of EP 8 (32 whole experts), and Qwen3-30B-A3B
# (128 experts, hidden 2048, moe_intermediate 768) on one GPU.
MOE_SHAPES = (
    MoeShape("glm5-tp8", experts=256, hidden=6144, inter=2048 // 8, routed_scaling=2.5),
    MoeShape("glm5-ep8", experts=256 // 8, hidden=6144, inter=2048, global_experts=256, routed_scaling=2.5),
    MoeShape("qwen3-30b", experts=128, hidden=2048, inter=768),
)


def moe_shape(name: str) -> MoeShape:
    for s in MOE_SHAPES:
        if s.name == name:
            return s
    raise ValueError(f"unknown MoE shape set {name!r}; known: {', '.join(s.name for s in MOE_SHAPES)}")


# config.json of a model with Qwen3-30B-A3B's real shapes (for --load-format dummy runs).
QWEN3_30B_A3B_CONFIG = {
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 2048,
    "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
    "intermediate_size": 6144, "moe_intermediate_size": 768, "num_experts": 128,
    "num_experts_per_tok": 8, "vocab_size": 151936, "max_position_embeddings": 40960,
    "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "torch_dtype": "bfloat16", "norm_topk_prob": True,
    "decoder_sparse_step": 1, "mlp_only_layers": [], "tie_word_embeddings": False,
    "hidden_act": "silu", "attention_bias": False, "bos_token_id": 1, "eos_token_id": 2,
}


def glm5_config() -> dict:
    """config.json of a model with GLM-5's real shapes (GlmMoeDsaForCausalLM: MLA + DSA indexer;
    GLM-5's published dimensions), written by the tiny factory's config writer so
    sglang reads it as it reads the tiny glm_moe_dsa models."""
    from .tiny.spec import TinySpec, hf_config

    spec = TinySpec(
        arch="glm_moe_dsa", layers=78, hidden=6144, heads=64, dense_layers=3, dense_intermediate=12288,
        experts=256, top_k=8, shared_experts=1, moe_intermediate=2048, vocab=154880, q_lora_rank=2048,
        kv_lora_rank=512, qk_nope_head_dim=192, qk_rope_head_dim=64, v_head_dim=256, index_n_heads=32,
        index_head_dim=128, index_topk=2048, routed_scaling_factor=2.5,
        max_position=202752,  # GLM-5's 200K context
    )
    return hf_config(spec, {"bos": 0, "eos": 1, "pad": 2})
