"""sglang-sm120: the fork's own modules (the overlay). Upstream sglang has no `sglang.sm120`.

`python -m sglang.sm120 info` prints what this build is: upstream base, patch series, kernels.
"""
