"""Build machinery for the sglang-sm120 wheel: pinned upstream wheel + strict patch series +
overlay + csrc kernels -> one drop-in `sglang` wheel. Stdlib only: it runs as a PEP 517 backend
with nothing installed."""
