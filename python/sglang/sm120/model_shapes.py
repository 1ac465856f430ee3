"""Linear-layer shapes of the models the fork targets (REFERENCE.md "Model shapes"), for kernel
tests and benchmarks. N of column-parallel and K of row-parallel layers are divided by TP."""
from __future__ import annotations

from typing import List, Tuple


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
