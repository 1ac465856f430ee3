"""`python -m sglang.sm120 check`: the SM120 validation kit (docs/sm120-check.md).

Stages, each a module: env (GPU, driver, versions), correctness (quantize bit-exactness, every FP4
GEMM path of this GPU against the dequantized reference, the server's self-check), layerwise
(tiny-model capture/replay against graphs disabled), timing (ours beside every upstream FP4
backend this GPU runs, and bf16). `cli` runs them and `report` writes the table and JSON.
This package imports no GPU code at import time: the CLI parses and reports without a GPU.
"""
