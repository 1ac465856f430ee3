"""Layerwise CUDA-graph runner: per-layer plain CUDA graph segments with the MoE run eagerly
between them, for decode and prefill, with no torch.compile / Dynamo anywhere.

Design and the upstream hook points: docs/runner.md. Modules:
  sizes       which sizes are captured (pure Python)
  segments    SegmentedGraph / SegmentCapture (graph factory injectable)
  boundary    the eager-island boundary the FusedMoE.forward hook calls into
  layerwise   per-size capture and the largest-first / OOM / fallback policy
  config      server_args resolution for the `layerwise` backend (sglang glue)
  backend     capture backends plugged into upstream's runners (sglang glue)
  runners     upstream runner subclasses: deferred capture, eager-fallback logging
  startup     arms the traps and runs the deferred captures once every runner warmed up
  dynamo_free eager stand-ins for upstream's @torch.compile helpers on the serving path
"""
