"""A/B variants for GPU runs, applied in every process that starts with this folder first on
PYTHONPATH (sglang's scheduler subprocesses inherit it); the installed fork is untouched.

    SGLANG_SM120_LAB_VARIANT=NAME PYTHONPATH=lab/variants:/tmp/site python3 -m pytest ...

NAME (one or more, comma-separated):
  no-warm-replay-metadata  the layerwise decode warm pass without its replay-time attention-
                           metadata step (LayerwiseDecodeRunner._lw_warm_replay_metadata: no-op)
  no-overlap-schedule      every ServerArgs with disable_overlap_schedule=True (the scheduler
                           prepares batch N+1 only after batch N's forward)
  no-pinned-plan-wait      patch 0303 undone: FlashInfer MLA fast plans overwrite their pinned
                           buffer without waiting for the previous copy
  plain-eager-helpers      Dynamo-free helpers run their plain bodies, not their eager twins
                           (runner/dynamo_free.py: TWINS emptied)
  compiled-helpers         Dynamo-free mode off in this process: upstream's torch.compile'd
                           helpers compile and run as under upstream's configuration (leave the
                           traps off: every call enters Dynamo)
  router-ORDER[-divfull]   the sigmoid routers (biased_grouped_topk_impl and kin) run their plain
                           bodies under Inductor's GPU numerics (runner/gpu_numerics.py: Triton's
                           sigmoid and division, sums in ORDER, a division by a number as a
                           product with its reciprocal, or with -divfull as Triton's division)
Each patch is applied right after its module's first import and says so on stderr.
"""
import importlib.abc
import importlib.util
import os
import sys

VARIANTS = [v for v in os.environ.get("SGLANG_SM120_LAB_VARIANT", "").split(",") if v]


def _no_warm_replay_metadata(module):
    module.LayerwiseDecodeRunner._lw_warm_replay_metadata = lambda self, size, stream_idx: None


def _no_overlap_schedule(module):
    original = module.ServerArgs.__post_init__

    def post_init(self, *args, **kwargs):
        self.disable_overlap_schedule = True
        return original(self, *args, **kwargs)

    module.ServerArgs.__post_init__ = post_init


def _no_pinned_plan_wait(module):
    module.wait_for_plan_copy = lambda wrapper: None


def _plain_eager_helpers(module):
    module.TWINS.clear()


def _compiled_helpers(module):
    module.dynamo_free = lambda: False


# the sigmoid routers upstream torch.compiles (biased top-k fallbacks: GLM-4.5 / GLM-5 with the
# shared expert fused into the top-k reach biased_grouped_topk_impl)
SIGMOID_ROUTERS = ("biased_grouped_topk_impl", "biased_topk_impl", "kimi_k2_biased_topk_impl")


def _router_twin(order, constant_division):
    def patch(module):
        from sglang.sm120.runner.gpu_numerics import inductor_gpu_twin

        for name in SIGMOID_ROUTERS:
            module.TWINS[name] = lambda f: inductor_gpu_twin(f, order, constant_division)
    return patch


PATCHES = {
    "plain-eager-helpers": ("sglang.sm120.runner.dynamo_free", _plain_eager_helpers),
    "compiled-helpers": ("sglang.sm120.runner.dynamo_free", _compiled_helpers),
    "no-warm-replay-metadata": ("sglang.sm120.runner.runners", _no_warm_replay_metadata),
    "no-overlap-schedule": ("sglang.srt.server_args", _no_overlap_schedule),
    "no-pinned-plan-wait": ("sglang.sm120.pinned_plan", _no_pinned_plan_wait),
}
for _order in ("sequential", "tree", "butterfly", "pairs-butterfly", "quads-butterfly"):  # gpu_numerics.ORDERS
    # the routers' plain bodies under Inductor's GPU numerics (gpu_numerics.inductor_gpu_twin)
    PATCHES[f"router-{_order}"] = ("sglang.sm120.runner.dynamo_free", _router_twin(_order, "reciprocal"))
    PATCHES[f"router-{_order}-divfull"] = ("sglang.sm120.runner.dynamo_free", _router_twin(_order, "div_full"))


class _PatchAfterImport(importlib.abc.MetaPathFinder):
    def __init__(self, patches):
        self.pending = dict(patches)  # module name -> [(variant, patch)]

    def find_spec(self, name, path, target=None):
        todo = self.pending.pop(name, None)
        if todo is None:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            if self.pending:
                sys.meta_path.insert(0, self)
        load = spec.loader.exec_module

        def exec_module(module):
            load(module)
            for variant, patch in todo:
                patch(module)
                print(f"[lab variant] {variant}: {name} patched (pid {os.getpid()})", file=sys.stderr, flush=True)

        spec.loader.exec_module = exec_module
        return spec


unknown = [v for v in VARIANTS if v not in PATCHES]
if unknown:
    raise SystemExit(f"SGLANG_SM120_LAB_VARIANT: unknown {unknown}; known: {sorted(PATCHES)}")
if VARIANTS:
    by_module = {}
    for v in VARIANTS:
        mod, patch = PATCHES[v]
        by_module.setdefault(mod, []).append((v, patch))
    sys.meta_path.insert(0, _PatchAfterImport(by_module))
