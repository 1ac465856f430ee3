"""Tiny random-weight MoE checkpoints (bf16 and ModelOpt NVFP4) that upstream sglang loads unchanged.

`python -m sglang.sm120.tiny --arch {qwen3_moe,deepseek_v2} --quant {bf16,nvfp4} --out DIR`.
See docs/tiny-models.md.
"""
