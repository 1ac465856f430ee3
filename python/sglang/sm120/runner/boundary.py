"""The eager-island boundary: how an MoE call becomes an eager step between graph segments.

The hook at the top of `FusedMoE.forward` (patch 0105) asks `boundary_active()` and, when a
layerwise session is open, hands the call to `cross(owner, *args, **kwargs)`. Sessions:

- `ProbeSession` (eager warmup forwards): runs the MoE for real, records what crossed the
  boundary (which token-major tensors go in, what comes out), and allocates the static buffers.
- `CaptureSession` (graph capture): copies the token-major inputs into static staging buffers
  as the last ops of the current segment, cuts the capture there, and returns static output
  buffers to the model code, which the next segment reads. The MoE does not run during
  capture (its inputs hold no data yet); at replay the step runs it on the staged inputs and
  copies its result into the output buffers.

Per-forward Python state the MoE reads (e.g. whether the all-reduce is fused into the next
layer) is snapshotted at capture by registered state providers and restored around each step.

With a `LeanMoe` (lean_moe.py, on by default), the probe also runs the lean step on the same inputs and
compares; where every island of the size matched, the capture makes lean steps (upstream's
kernels launched directly, combining into the output buffer) instead of calling the forward.

Real rows (`CaptureSession(real_rows=True)`, decode by default): the replay says how many of the
captured rows are real (`replaying_rows`), and the step runs the MoE on those rows only, as
graphs disabled would run it on the unpadded batch (upstream's Triton MoE picks its kernel config
by the row count: another config is another summation order), and zeroes the padded rows of its
output. `RecordingSession` + `warm_rows` run each distinct MoE at every row count before capture,
so no row count JIT-compiles at serving time.

Decode attention islands (`attention=True` on the sessions; decode_attention.py decides where):
the hook at the top of `RadixAttention.forward` (patch 0113) hands a decode attention call to
`cross_attention`, which cuts the segment there like an MoE call. At replay the step runs the
attention on the replay's real batch (`set_replaying_batch`: the batch the runner planned graphs
disabled's attention metadata for), not on the padded captured rows: FlashInfer's decode plan
splits each request's KV by the whole batch's page counts, so a plan made for padded rows splits
some requests otherwise (another summation order) than graphs disabled's plan for the real ones.
"""
from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Sequence, Tuple

import torch

from .zero_copy import non_owning_view

# Output buffers alternate between this many sets, so an MoE output stays intact until two
# boundaries later (a consumer that holds it across the next layer's MoE still reads it).
OUTPUT_RING = 2


class BoundaryMismatch(RuntimeError):
    """The capture forward reached a boundary the warmup forward did not (or with other inputs)."""


# ------------------------------------------------------------------------------------------------
# pytree-lite: tensors inside tuples / NamedTuples / lists / dicts; anything else is a constant
# ------------------------------------------------------------------------------------------------
def flatten(obj) -> Tuple[List[torch.Tensor], Callable[[Sequence[torch.Tensor]], Any]]:
    """Tensor leaves of obj and a function rebuilding obj's structure from new leaves.

    The rebuild function keeps only structure and non-tensor constants, never the leaves. The walk
    is a module-level function given the list: a nested recursive closure would sit in a reference
    cycle with the leaves list, keeping every tensor that crossed a cut alive until the garbage
    collector ran (one hidden-state-sized block per layer held in the graph pool).
    """
    leaves: List[torch.Tensor] = []
    rebuild = _walk(obj, leaves)
    return leaves, rebuild


def _walk(x, leaves: List[torch.Tensor]):
    if isinstance(x, torch.Tensor):
        idx = len(leaves)
        leaves.append(x)
        return lambda new: new[idx]
    if isinstance(x, tuple):
        parts = [_walk(e, leaves) for e in x]
        if hasattr(x, "_fields"):  # NamedTuple
            cls = type(x)
            return lambda new: cls(*[p(new) for p in parts])
        return lambda new: tuple(p(new) for p in parts)
    if isinstance(x, list):
        parts = [_walk(e, leaves) for e in x]
        return lambda new: [p(new) for p in parts]
    if isinstance(x, dict):
        parts = {k: _walk(v, leaves) for k, v in x.items()}
        return lambda new: {k: p(new) for k, p in parts.items()}
    return lambda new, _x=x: _x


@dataclass(frozen=True)
class LeafSig:
    token_major: bool
    tail: Tuple[int, ...]
    dtype: torch.dtype


def _leaf_sig(t: torch.Tensor, rows: int) -> LeafSig:
    token_major = t.dim() >= 1 and t.shape[0] == rows
    tail = tuple(t.shape[1:]) if token_major else tuple(t.shape)
    return LeafSig(token_major, tail, t.dtype)


MOE, ATTENTION = "moe", "attention"  # island kinds


@dataclass
class ProbeRecord:
    owner_id: int
    owner_name: str
    rows: int
    in_sigs: Tuple[LeafSig, ...]
    out_sigs: Tuple[LeafSig, ...]
    out_rebuild: Callable
    lean: bool = False  # the lean step matched upstream's result on this island's probe inputs
    kind: str = MOE


class StagingArena:
    """Static buffers with `capacity` leading rows, shared by every layer and every size.

    One arena per backend. Buffers are allocated during probes (eager), never during capture.
    """

    def __init__(self, capacity: int, device) -> None:
        if capacity < 1:
            raise ValueError(f"staging capacity must be >= 1 row, got {capacity}")
        self.capacity = int(capacity)
        self.device = torch.device(device)
        self._buffers: dict = {}

    def ensure(self, name: str, tail: Tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        key = (name, tail, dtype)
        buf = self._buffers.get(key)
        if buf is None:
            buf = torch.empty((self.capacity, *tail), dtype=dtype, device=self.device)
            self._buffers[key] = buf
        return buf

    def view(self, name: str, tail: Tuple[int, ...], dtype: torch.dtype, rows: int) -> torch.Tensor:
        key = (name, tail, dtype)
        buf = self._buffers.get(key)
        if buf is None:
            raise BoundaryMismatch(
                f"staging buffer {name} {tail} {dtype} was not allocated by the warmup probe"
            )
        if rows > self.capacity:
            raise BoundaryMismatch(f"{rows} rows exceed the staging capacity {self.capacity}")
        return buf[:rows]

    @property
    def nbytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self._buffers.values())


# ------------------------------------------------------------------------------------------------
# state providers: snapshot per-forward Python state at capture, restore it around each step
# ------------------------------------------------------------------------------------------------
StateProvider = Callable[[], Callable[[], contextlib.AbstractContextManager]]
_STATE_PROVIDERS: List[StateProvider] = []


def register_state_provider(provider: StateProvider) -> None:
    """provider() is called at capture time and returns a factory of a context manager that
    re-establishes the state it saw; the step enters it around the eager call."""
    if provider not in _STATE_PROVIDERS:
        _STATE_PROVIDERS.append(provider)


def _snapshot_state() -> List[Callable[[], contextlib.AbstractContextManager]]:
    return [p() for p in _STATE_PROVIDERS]


# ------------------------------------------------------------------------------------------------
# sessions
# ------------------------------------------------------------------------------------------------
_SESSION: Optional["_Session"] = None
_BYPASS = contextvars.ContextVar("sm120_boundary_bypass", default=False)
# Real rows of the replay in progress (None: every captured row is real). A plain global: replays
# run one at a time on the scheduler's thread, and a step reads it on every layer.
_REAL_ROWS: Optional[int] = None
# The replay's real ForwardBatch, for attention islands (None outside such a replay).
_REAL_BATCH: Any = None


def set_replaying_rows(rows: Optional[int]) -> Optional[int]:
    """Declare how many captured rows the replay that follows carries; returns the previous
    value (pass it back when the replay is over)."""
    global _REAL_ROWS
    previous, _REAL_ROWS = _REAL_ROWS, (None if rows is None else int(rows))
    return previous


@contextlib.contextmanager
def replaying_rows(rows: Optional[int]):
    previous = set_replaying_rows(rows)
    try:
        yield
    finally:
        set_replaying_rows(previous)


def set_replaying_batch(forward_batch) -> Any:
    """Declare the real batch of the replay that follows (its attention metadata planned for
    it); returns the previous one (pass it back when the replay is over)."""
    global _REAL_BATCH
    previous, _REAL_BATCH = _REAL_BATCH, forward_batch
    return previous


def boundary_active() -> bool:
    """True when the hook should divert the call to `cross` (a session is open and the call is
    not the boundary's own eager call)."""
    return _SESSION is not None and not _BYPASS.get()


def cross(owner, *args, **kwargs):
    session = _SESSION
    if session is None:
        raise RuntimeError("cross() called without an open layerwise session")
    return session.on_boundary(owner, args, kwargs)


def attention_island_active(forward_batch, kwargs, *unsupported) -> bool:
    """True when the attention hook should divert a call to `cross_attention`: a session with
    attention islands is open, the call is a decode and carries nothing but q, k, v (extra
    keyword arguments, or any non-None `unsupported` argument, keep it inside the segment)."""
    session = _SESSION
    return (session is not None and session.attention and not _BYPASS.get() and not kwargs
            and all(u is None for u in unsupported) and forward_batch.forward_mode.is_decode())


def cross_attention(owner, q, k, v, forward_batch, save_kv_cache=True):
    session = _SESSION
    if session is None:
        raise RuntimeError("cross_attention() called without an open layerwise session")
    return session.on_boundary(owner, (q, k, v, forward_batch, save_kv_cache), {}, kind=ATTENTION)


def call_unhooked(owner, args, kwargs):
    """owner.forward(*args, **kwargs) with the boundary hook bypassed."""
    token = _BYPASS.set(True)
    try:
        return owner.forward(*args, **kwargs)
    finally:
        _BYPASS.reset(token)


def _rows_of(leaves: Sequence[torch.Tensor]) -> int:
    for t in leaves:
        if t.dim() >= 1:
            return int(t.shape[0])
    raise BoundaryMismatch("an eager-island call needs a token-major tensor argument")


class _Session:
    def __init__(self, arena: StagingArena, records: List[ProbeRecord], lean=None, attention: bool = False):
        self.arena = arena
        self.records = records
        self.calls = 0
        self.kind_calls = {MOE: 0, ATTENTION: 0}
        self.lean = lean  # a lean_moe.LeanMoe, or None: upstream's forward at every island
        self.attention = attention  # decode attention calls are islands too

    def on_boundary(self, owner, args, kwargs, kind: str = MOE):
        raise NotImplementedError

    def _names(self, kind: str) -> Tuple[str, int]:
        """Staging-name prefix of an island kind and its output ring slot. Each kind has its own
        buffers and ring, so an MoE output still lasts two MoE islands with attention islands
        between them."""
        ring = self.kind_calls[kind] % OUTPUT_RING
        self.kind_calls[kind] += 1
        return ("" if kind == MOE else "attn."), ring

    def __enter__(self):
        global _SESSION
        if _SESSION is not None:
            raise RuntimeError("a layerwise session is already open")
        _SESSION = self
        return self

    def __exit__(self, *exc):
        global _SESSION
        _SESSION = None
        return False


class ProbeSession(_Session):
    """Eager forward: run each boundary call for real and record its signature."""

    lean_mismatch = False

    def on_boundary(self, owner, args, kwargs, kind: str = MOE):
        in_leaves, _ = flatten((args, kwargs))
        rows = _rows_of(in_leaves)
        prefix, _ = self._names(kind)
        # The lean step runs first: it only reads the inputs, upstream's may write them (inplace).
        # Twice: its first call resolves its Triton launches, the second replays them (what
        # every replay after the first does) onto NaN-filled buffers, and its result is compared.
        lean = self.lean.bind(owner, args, kwargs) if self.lean is not None and kind == MOE else None
        lean_error = None
        if lean is not None:
            try:
                lean[0]()
                lean[0].scrub()
                lean[0]()
            except torch.OutOfMemoryError:
                raise  # the size's OOM handling decides
            except Exception as e:  # noqa: BLE001 - the size keeps upstream's path, said once
                lean_error = f"the lean step raised {type(e).__name__}: {e}"
        out = call_unhooked(owner, args, kwargs)
        out_leaves, out_rebuild = flatten(out)
        if lean_error is not None:
            self._mismatch(rows, lean_error)
        lean_ok = lean is not None and lean_error is None and self._same(lean[1], out_leaves, rows)
        in_sigs = tuple(_leaf_sig(t, rows) for t in in_leaves)
        out_sigs = tuple(_leaf_sig(t, rows) for t in out_leaves)
        if not all(s.token_major for s in out_sigs):
            raise BoundaryMismatch(
                f"{type(owner).__name__}: every output of an eager island must be token-major "
                f"({rows} rows); got {[tuple(t.shape) for t in out_leaves]}"
            )
        for i, s in enumerate(in_sigs):
            if s.token_major:
                self.arena.ensure(f"{prefix}in.{i}", s.tail, s.dtype)
        for r in range(OUTPUT_RING):
            for j, s in enumerate(out_sigs):
                self.arena.ensure(f"{prefix}out{r}.{j}", s.tail, s.dtype)
        self.records.append(
            ProbeRecord(id(owner), type(owner).__name__, rows, in_sigs, out_sigs, out_rebuild, lean_ok, kind)
        )
        self.calls += 1
        return out

    def _same(self, lean_out, out_leaves, rows) -> bool:
        ref = out_leaves[0] if len(out_leaves) == 1 else None
        if ref is not None and ref.shape == lean_out.shape and ref.dtype == lean_out.dtype:
            if torch.equal(ref, lean_out):
                return True
            diff = (ref.float() - lean_out.float()).abs()
            detail = f"max |diff| {diff.max().item():.3g}, {int((diff > 0).sum())} elements differ"
        else:
            detail = f"upstream returned {[tuple(t.shape) for t in out_leaves]}"
        self._mismatch(rows, detail)
        return False

    def _mismatch(self, rows: int, detail: str) -> None:
        if not self.lean_mismatch:
            self.lean.note_mismatch(rows, self.calls, detail)
        self.lean_mismatch = True

    def __exit__(self, *exc):
        if self.lean_mismatch:  # one difference anywhere: the whole size keeps upstream's path
            for rec in self.records:
                rec.lean = False
        return super().__exit__(*exc)


class CaptureSession(_Session):
    """Capture forward: stage inputs, cut the segment, return static outputs.

    cutter: anything with `cut(step)` (SegmentCapture, or an adapter onto another segmented
    capture). zero_copy: lean steps read the segment's own tensors instead of staged copies
    (zero_copy.py; upstream's forward keeps the copies).
    """

    def __init__(self, arena: StagingArena, records: List[ProbeRecord], cutter, lean=None,
                 zero_copy: bool = False, real_rows: bool = False, attention: bool = False):
        super().__init__(arena, records, lean, attention)
        self.cutter = cutter
        self.zero_copy = zero_copy
        self.real_rows = real_rows

    def _stage(self, in_leaves, in_sigs, rows, in_place: bool, prefix: str = "") -> List[torch.Tensor]:
        staged: List[torch.Tensor] = []
        for i, (t, s) in enumerate(zip(in_leaves, in_sigs)):
            if not s.token_major:
                staged.append(t)  # static already (parameters, scalars, fixed buffers)
            elif in_place:
                staged.append(non_owning_view(t))
            else:
                buf = self.arena.view(f"{prefix}in.{i}", s.tail, s.dtype, rows)
                buf.copy_(t)  # recorded into the segment that is about to end
                staged.append(buf)
        return staged

    def on_boundary(self, owner, args, kwargs, kind: str = MOE):
        k = self.calls
        if k >= len(self.records):
            raise BoundaryMismatch(
                f"capture reached eager island #{k} ({type(owner).__name__}) but the warmup "
                f"forward had only {len(self.records)}"
            )
        rec = self.records[k]
        in_leaves, in_rebuild = flatten((args, kwargs))
        rows = _rows_of(in_leaves)
        in_sigs = tuple(_leaf_sig(t, rows) for t in in_leaves)
        if rec.owner_id != id(owner) or rec.in_sigs != in_sigs or rec.rows != rows or rec.kind != kind:
            raise BoundaryMismatch(
                f"eager island #{k}: warmup saw {rec.owner_name} ({rec.kind}) with {rec.rows} rows "
                f"{rec.in_sigs}, capture sees {type(owner).__name__} ({kind}) with {rows} rows {in_sigs}"
            )
        prefix, ring = self._names(kind)
        out_views = [
            self.arena.view(f"{prefix}out{ring}.{j}", s.tail, s.dtype, rows)
            for j, s in enumerate(rec.out_sigs)
        ]
        if kind == ATTENTION:
            staged_args, _ = in_rebuild(self._stage(in_leaves, in_sigs, rows, False, prefix))
            self.cutter.cut(_AttentionStep(owner, staged_args, out_views, rows))
            self.calls += 1
            return rec.out_rebuild(out_views)
        use_lean = self.lean is not None and rec.lean and len(out_views) == 1
        in_place = use_lean and self.zero_copy
        staged_leaves = self._stage(in_leaves, in_sigs, rows, in_place)
        staged_args, staged_kwargs = in_rebuild(staged_leaves)
        lean = self.lean.bind(owner, staged_args, staged_kwargs, out=out_views[0]) if use_lean else None
        if lean is None and in_place:  # refused at bind: upstream's forward reads staged copies
            in_place = False
            staged_leaves = self._stage(in_leaves, in_sigs, rows, False)
            staged_args, staged_kwargs = in_rebuild(staged_leaves)
        restorers = _snapshot_state()
        if lean is not None:
            step = lean[0]  # reads no per-forward flags: no state to restore
            step.zero_copy = in_place
        else:
            step = _make_step(owner, staged_args, staged_kwargs, out_views, restorers)
        if self.real_rows:
            step = _RealRowsStep(step, rows, out_views, _rows_step_factory(
                owner, list(staged_leaves), in_rebuild, in_sigs, out_views, restorers,
                self.lean if lean is not None else None))
        self.cutter.cut(step)
        self.calls += 1
        return rec.out_rebuild(out_views)

    def __exit__(self, exc_type, *rest):
        try:
            if exc_type is None and self.calls != len(self.records):
                raise BoundaryMismatch(
                    f"capture crossed {self.calls} eager islands, warmup {len(self.records)}"
                )
        finally:
            super().__exit__(exc_type, *rest)
        return False


def _make_step(owner, args, kwargs, out_views, restorers):
    shapes = [tuple(v.shape) for v in out_views]

    def step() -> None:
        if restorers:
            with contextlib.ExitStack() as stack:
                for r in restorers:
                    stack.enter_context(r())
                out = call_unhooked(owner, args, kwargs)
        else:
            out = call_unhooked(owner, args, kwargs)
        leaves, _ = flatten(out)
        if len(leaves) != len(out_views):
            raise BoundaryMismatch(
                f"{type(owner).__name__} returned {len(leaves)} tensors at replay, "
                f"{len(out_views)} at capture"
            )
        for dst, src, shape in zip(out_views, leaves, shapes):
            if tuple(src.shape) != shape:
                raise BoundaryMismatch(
                    f"{type(owner).__name__} returned shape {tuple(src.shape)} at replay, "
                    f"{shape} at capture"
                )
            if src.data_ptr() != dst.data_ptr():
                dst.copy_(src)

    step.owner_name = type(owner).__name__  # for logs
    return step


# ------------------------------------------------------------------------------------------------
# real rows: the MoE on the replay's unpadded rows
# ------------------------------------------------------------------------------------------------
def _first_rows(leaves, sigs, r: int) -> List[torch.Tensor]:
    return [t[:r] if s.token_major else t for t, s in zip(leaves, sigs)]


def _rows_step_factory(owner, staged_leaves, in_rebuild, in_sigs, out_views, restorers, lean):
    """make(r): the island's step on the first r rows of its staged inputs, writing the first r
    rows of its output buffers (lean: LeanMoe's step for r rows; else upstream's forward)."""

    def make(r: int) -> Callable[[], None]:
        args, kwargs = in_rebuild(_first_rows(staged_leaves, in_sigs, r))
        outs = [v[:r] for v in out_views]
        if lean is not None:
            bound = lean.bind(owner, args, kwargs, out=outs[0])
            if bound is not None:
                return bound[0]
        return _make_step(owner, args, kwargs, outs, restorers)

    return make


class _RealRowsStep:
    """An island's step that runs on the replay's real rows (`set_replaying_rows`): the captured
    step when every row is real, else a step for r rows (built on first use, then kept), after
    which the padded rows of the output are zeroed (what feeds the next segment's padded rows is
    then finite and the same every time, as upstream zeroes them behind a breakable attention)."""

    def __init__(self, full: Callable[[], None], rows: int, out_views: List[torch.Tensor],
                 make: Callable[[int], Callable[[], None]]):
        self.full = full
        self.rows = rows
        self.out_views = out_views
        self.make = make
        self.by_rows: dict = {}
        self.owner_name = getattr(full, "owner_name", "?")
        self.lean = getattr(full, "lean", False)
        self.zero_copy = getattr(full, "zero_copy", False)
        self.real_rows = True

    def __call__(self) -> None:
        r = _REAL_ROWS
        if r is None or r >= self.rows:
            self.full()
            return
        step = self.by_rows.get(r)
        if step is None:
            step = self.by_rows[r] = self.make(max(1, r))
        step()
        for v in self.out_views:
            v[r:].zero_()


# ------------------------------------------------------------------------------------------------
# decode attention on the replay's real batch
# ------------------------------------------------------------------------------------------------
class _AttentionStep:
    """A decode attention island: `owner.forward` on the first rows of the staged q, k, v (one
    per request of the replay's real batch) with that batch, whose attention metadata the
    runner planned before the replay as graphs disabled plans it; the KV of the real rows is
    written to the real batch's cache slots. Padded rows of the output are zeroed."""

    attention = True

    def __init__(self, owner, staged_args, out_views: List[torch.Tensor], rows: int):
        if len(out_views) != 1:
            raise BoundaryMismatch(f"{type(owner).__name__}: a decode attention island returns one "
                                   f"tensor, the warmup saw {len(out_views)}")
        self.owner = owner
        self.q, self.k, self.v, _captured_batch, self.save_kv_cache = staged_args
        self.out = out_views[0]
        self.rows = rows
        self.owner_name = type(owner).__name__

    def __call__(self) -> None:
        batch = _REAL_BATCH
        if batch is None:
            raise BoundaryMismatch("a decode attention island replayed without its real batch "
                                   "(boundary.set_replaying_batch)")
        r = int(batch.batch_size)
        if not 1 <= r <= self.rows:
            raise BoundaryMismatch(f"a replay of {r} requests on a decode attention island captured "
                                   f"for {self.rows} rows")
        k = self.k[:r] if self.k is not None else None
        v = self.v[:r] if self.v is not None else None
        out = call_unhooked(self.owner, (self.q[:r], k, v, batch, self.save_kv_cache), {})
        dst = self.out[:r]
        if out.data_ptr() != dst.data_ptr():
            dst.copy_(out.view(dst.shape))
        if r < self.rows:
            self.out[r:].zero_()


class RecordingSession(_Session):
    """Eager forward that runs each island for real and keeps, per distinct island (owner type,
    parameter shapes, input signature), a copy of its inputs and the per-forward state it ran in:
    what `warm_rows` replays at other row counts."""

    def __init__(self):
        super().__init__(arena=None, records=[])
        self.kept: dict = {}

    def on_boundary(self, owner, args, kwargs, kind: str = MOE):
        in_leaves, in_rebuild = flatten((args, kwargs))
        rows = _rows_of(in_leaves)
        sigs = tuple(_leaf_sig(t, rows) for t in in_leaves)
        params = tuple((tuple(p.shape), p.dtype) for p in owner.parameters(recurse=False)) \
            if hasattr(owner, "parameters") else ()
        key = (type(owner).__name__, params, tuple((s.token_major, s.tail, s.dtype) for s in sigs))
        if key not in self.kept:
            # copies: the forward may write its inputs (in-place MoE)
            leaves = [t.clone() if s.token_major else t for t, s in zip(in_leaves, sigs)]
            self.kept[key] = (owner, leaves, in_rebuild, sigs, rows, _snapshot_state())
        self.calls += 1
        return call_unhooked(owner, args, kwargs)


def warm_rows(kept: dict, row_counts, lean=None) -> int:
    """Run every kept island at each row count (<= the rows it was recorded with), through
    upstream's forward and, where the lean step takes it, through the lean step: whatever a row
    count compiles (Triton specialises on it) is compiled here. Returns the calls made."""
    calls = 0
    for owner, leaves, in_rebuild, sigs, rows, restorers in kept.values():
        for r in row_counts:
            if not 1 <= r <= rows:
                continue
            args, kwargs = in_rebuild([t[:r].clone() if s.token_major else t for t, s in zip(leaves, sigs)])
            with contextlib.ExitStack() as stack:
                for restore in restorers:
                    stack.enter_context(restore())
                call_unhooked(owner, args, kwargs)
            calls += 1
            if lean is not None:
                args, kwargs = in_rebuild([t[:r].clone() if s.token_major else t for t, s in zip(leaves, sigs)])
                bound = lean.bind(owner, args, kwargs)
                if bound is not None:
                    bound[0]()
                    calls += 1
    return calls
