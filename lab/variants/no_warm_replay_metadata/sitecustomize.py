"""A/B variant for the GPU correctness grid: the layerwise decode warm pass without its extra
replay-time attention-metadata step (`LayerwiseDecodeRunner._lw_warm_replay_metadata` becomes a
no-op), in every process that starts with this folder first on PYTHONPATH (sglang's scheduler
subprocesses inherit it). Used only to ask whether that step changes what the full graphs under
layerwise compute; the installed fork is untouched.

    PYTHONPATH=lab/variants/no_warm_replay_metadata:/tmp/site python3 -m pytest ...
"""
import importlib.abc
import sys

TARGET = "sglang.sm120.runner.runners"


class _PatchAfterImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != TARGET:
            return None
        sys.meta_path.remove(self)
        from importlib.util import find_spec

        spec = find_spec(name)
        load = spec.loader.exec_module

        def exec_module(module):
            load(module)
            module.LayerwiseDecodeRunner._lw_warm_replay_metadata = lambda self, size, stream_idx: None
            print(f"[variant] {TARGET}: warm replay-metadata step disabled", file=sys.stderr, flush=True)

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _PatchAfterImport())
