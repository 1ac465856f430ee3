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
  zero-pad-decode          layerwise decode replays give padded rows 0 KV pages instead of 1
                           (FlashInfer's decode plan then splits the real rows' KV as graphs
                           disabled does) when decode_plan.py says the work list fits the captured
                           plan's budget (read once per size, from its capture's split-mode plan;
                           else upstream's fill)
  sum-ORDER[-rounded]      Dynamo-free moe_sum_reduce sums the top-k outputs in fp32 in ORDER
                           (sum_orders.py: sequential, tree, butterfly,
                           pairs-butterfly, quads-butterfly), one rounding after the
                           scale, or with -rounded the sum rounded first: candidates for the GPU's
                           compiled kernel (test/gpu/test_dynamo_free_bits_gpu.py names the match)
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


def _zero_pad_decode(module):
    import decode_plan

    from sglang.sm120.runner.sizes import pad_to_bucket

    cls = module.LayerwiseDecodeRunner
    original = cls.load_batch

    def budget_of(runner, bs):
        """The split-mode budget (padded_batch_size) of size bs's FlashInfer decode plan, or None."""
        wrappers = getattr(runner.attn_backend, "decode_cuda_graph_metadata", {}).get(bs) or []
        budgets = set()
        for w in wrappers:
            # the decode kernels' plan only (tensor-core decode plans as prefill, another layout)
            if type(w).__name__ != "BatchDecodeWithPagedKVCacheWrapper":
                return None
            info = list(getattr(w, "_plan_info", None) or [])
            if len(info) != 10 or not bool(info[9]):  # DecodePlanInfo: [padded_batch_size, ..., split_kv]
                return None
            budgets.add(int(info[0]))
        return budgets.pop() if len(budgets) == 1 else None

    def load_batch(self, forward_batch, *args, **kwargs):
        upstream_fill = self.__dict__.setdefault("_zp_upstream_fill", self.seq_len_fill_value)
        fill = upstream_fill
        raw_bs = forward_batch.batch_size
        budget = self.__dict__.setdefault("_zp_budget", {})
        padded = pad_to_bucket(raw_bs, self.capture_bs)
        if padded and padded not in budget:
            # a size's kernel is split-mode or not for good: read once, from its capture's plan
            budget[padded] = budget_of(self, padded)
            wrappers = getattr(self.attn_backend, "decode_cuda_graph_metadata", {}).get(padded) or []
            print(f"[lab variant] zero-pad-decode: size {padded}: budget {budget[padded]} "
                  f"(wrappers {[type(w).__name__ for w in wrappers]}, plan info "
                  f"{[getattr(w, '_plan_info', None) for w in wrappers][:1]!r:.200})", file=sys.stderr, flush=True)
        if getattr(self, "_lw_finished", False) and padded and padded > raw_bs and budget[padded]:
            page = int(getattr(self.model_runner.server_args, "page_size", 1) or 1)
            pages = [-(-int(n) // page) for n in forward_batch.seq_lens_cpu.tolist()]
            if decode_plan.zero_padding_fits(pages, padded - raw_bs, budget[padded], page):
                fill = 0
        for name in ("seq_lens", "seq_lens_cpu"):
            self.buffer_registry.get_slot(name).pad_value = fill
        self.seq_len_fill_value = fill
        try:
            return original(self, forward_batch, *args, **kwargs)
        finally:
            self.seq_len_fill_value = upstream_fill

    cls.load_batch = load_batch


def _sum_order(order, rounded):
    def patch(module):
        from sum_orders import twin

        module.TWINS["moe_sum_reduce_torch_compile"] = lambda f: twin(order, rounded)
    return patch


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
    "zero-pad-decode": ("sglang.sm120.runner.runners", _zero_pad_decode),
}
for _order in ("sequential", "tree", "butterfly", "pairs-butterfly", "quads-butterfly"):  # gpu_numerics.ORDERS
    PATCHES[f"sum-{_order}"] = ("sglang.sm120.runner.dynamo_free", _sum_order(_order, False))
    PATCHES[f"sum-{_order}-rounded"] = ("sglang.sm120.runner.dynamo_free", _sum_order(_order, True))
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
