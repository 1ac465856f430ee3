"""Every `SGLANG_SM120_*` environment variable the project reads, and the CLI flags the fork adds.

One registry (`SETTINGS`, `FLAGS`) with name, type, default, scope and effect; typed accessors
that validate the value and raise an error naming the variable; the tables of docs/settings.md
generated from it. Standard library only: importable by the build backend and tools without torch.

Reading rules (accessor `get`): unset or empty (after stripping) -> the default; otherwise the
value must parse as the registered type, else ValueError naming the variable, its value and what
is accepted. A name that is not registered raises KeyError: register it here first.

Scopes: runtime (read by the server process), build (setup.py / forkbuild), test (the test
suite), tools (deploy/, lab/, benchmarks/, tools/ scripts). Runtime settings are read through
this module, and so are build settings: forkbuild/settings.py loads this file (the build has no
sglang package to import) and reads every build variable through `get`. The test and tools
scopes are registered so the table and the repository scan (test/cpu/test_settings.py) cover
them; their readers keep parsing them where they are.

    python -m sglang.sm120.settings --markdown            # print the tables
    python -m sglang.sm120.settings --write-docs docs/settings.md   # refresh the marked block
"""
from __future__ import annotations

import argparse
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple

PREFIX = "SGLANG_SM120_"
NAME_PATTERN = re.compile(r"SGLANG_SM120_[A-Z0-9_]+")
SCOPES = ("runtime", "build", "test", "tools")
KINDS = ("switch", "int", "float", "choice", "path", "str")
BEGIN_MARKER = "<!-- settings:begin -->"
END_MARKER = "<!-- settings:end -->"


@dataclass(frozen=True)
class Setting:
    """One environment variable. `default` is the parsed value used when it is unset or empty
    (None: no value). switch: 1 / 0 only, `on` / `off` describe the two states in errors.
    choice: `choices` are the accepted values (compared after lower-casing when `fold_case`);
    `aliases` maps further accepted spellings to one of them. int / float: `minimum` bounds the
    value from below (inclusive). str / path: a `pattern` the whole value must match, `expect`
    says in words what it accepts."""

    name: str
    kind: str
    default: Any
    scope: str
    doc: str
    choices: Tuple[str, ...] = ()
    aliases: Mapping[str, str] = field(default_factory=dict)
    fold_case: bool = False
    minimum: Optional[float] = None
    on: str = "on"
    off: str = "off"
    note: str = ""
    pattern: str = ""
    expect: str = ""

    def __post_init__(self):
        if not self.name.startswith(PREFIX) or not NAME_PATTERN.fullmatch(self.name):
            raise ValueError(f"setting name {self.name!r} must match {NAME_PATTERN.pattern}")
        if self.kind not in KINDS:
            raise ValueError(f"{self.name}: kind must be one of {KINDS}, got {self.kind!r}")
        if self.scope not in SCOPES:
            raise ValueError(f"{self.name}: scope must be one of {SCOPES}, got {self.scope!r}")
        if self.kind == "choice" and (not self.choices or self.default not in self.choices):
            raise ValueError(f"{self.name}: a choice needs choices that include its default")
        if self.pattern and (self.kind not in ("str", "path") or not self.expect):
            raise ValueError(f"{self.name}: a pattern is for str / path settings and needs `expect`")

    def parse(self, raw: Optional[str]) -> Any:
        """The typed value of `raw` (the variable's text, None when unset)."""
        text = "" if raw is None else raw.strip()
        if text == "":
            return self.default
        if self.kind == "switch":
            if text in ("0", "1"):
                return text == "1"
            raise ValueError(f"{self.name}={text!r}: expected 1 ({self.on}) or 0 ({self.off})")
        if self.kind == "choice":
            key = text.lower() if self.fold_case else text
            key = self.aliases.get(key, key)
            if key not in self.choices:
                raise ValueError(f"{self.name}={text!r}: expected one of {', '.join(self.choices)} "
                                 f"(default {self.default}" + (f"; {self.note})" if self.note else ")"))
            return key
        if self.kind in ("int", "float"):
            convert = int if self.kind == "int" else float
            try:
                value = convert(text)
            except ValueError:
                value = None
            if value is None or (self.minimum is not None and value < self.minimum):
                what = "an integer" if self.kind == "int" else "a number"
                bound = f" >= {self.minimum:g}" if self.minimum is not None else ""
                raise ValueError(f"{self.name}={text!r}: expected {what}{bound}"
                                 + (f" ({self.note})" if self.note else ""))
            return value
        if self.pattern and not re.fullmatch(self.pattern, text):
            raise ValueError(f"{self.name}={text!r}: expected {self.expect}")
        return text  # path, str

    def default_text(self) -> str:
        """The default as a person would set it (for the table)."""
        if self.default is None:
            return "unset"
        if self.kind == "switch":
            return "1" if self.default else "0"
        if isinstance(self.default, float) and self.default.is_integer():
            return str(int(self.default))
        return str(self.default)

    def type_text(self) -> str:
        if self.kind == "switch":
            return "switch 0/1"
        if self.kind == "choice":
            return " \\| ".join(self.choices)
        if self.minimum is not None:
            return f"{self.kind} >= {self.minimum:g}"
        return self.kind


@dataclass(frozen=True)
class Flag:
    """A command-line flag (or flag value) the fork adds to `sglang serve` / `launch_server`."""

    flag: str
    default: str
    doc: str
    source: str  # the patch or overlay module that adds it


def _s(name, kind, default, scope, doc, **kw) -> Setting:
    return Setting(PREFIX + name, kind, default, scope, doc, **kw)


_TRAPS_ALIASES = {"0": "off", "false": "off", "no": "off", "1": "raise", "on": "raise",
                  "true": "raise", "yes": "raise"}

SETTINGS: Tuple[Setting, ...] = (
    # ---- runtime: the layerwise runner
    _s("DYNAMO_FREE", "switch", False, "runtime",
       "Upstream's torch.compile'd helpers run as plain Python. Set to 1 by the server when a phase "
       "uses the layerwise backend (inherited by the scheduler processes); not meant to be set by hand."),
    _s("LEAN_MOE", "switch", True, "runtime",
       "Layerwise runner: the MoE between graph segments runs as a lean eager step (upstream's Triton "
       "kernels launched directly); 0 runs upstream's MoE path.",
       on="lean eager MoE, the default", off="upstream's MoE path"),
    _s("LEAN_MOE_PREFILL_TOKENS", "int", 4096, "runtime",
       "Largest prefill bucket (tokens) given lean MoE steps, with captured prefill attention "
       "(LAYERWISE_PREFILL_ATTENTION auto/fa2/fa3; the eager-attention default runs upstream's MoE "
       "forward in prefill); its workspace grows with the rows. 0 turns lean prefill off (decode keeps it).", minimum=0, note="0 turns lean prefill off"),
    _s("LAYERWISE_PREFILL_ATTENTION", "choice", "eager", "runtime",
       "Attention in layerwise prefill: eager (a break between graph segments running upstream's own "
       "attention forward, as graphs disabled and upstream's breakable prefill do: the same tokens), "
       "or captured with fixed request slots (FlashInfer only; other tokens): auto (FlashInfer's rule: "
       "FA3 on SM90 where it applies, FA2 elsewhere), fa2 (upstream's captured-prefill kernels), fa3 "
       "(SM90 only).",
       choices=("eager", "auto", "fa2", "fa3"), note="eager gives graphs-disabled tokens"),
    _s("LAYERWISE_MOE_ROWS", "choice", "real", "runtime",
       "Layerwise decode: the eager MoE between graph segments runs on the batch's real rows (real: "
       "the kernel config graphs disabled picks for that batch, so the same tokens) or on all rows "
       "of the captured size (padded).",
       choices=("real", "padded")),
    _s("LAYERWISE_DECODE_ATTENTION", "choice", "eager", "runtime",
       "Layerwise decode sizes (above the full-graph ceiling): each layer's attention runs as an eager "
       "step between graph segments on the real batch, planned as graphs disabled plans it (eager: "
       "the same tokens; FlashInfer and FA3 MHA backends), or inside the graphs with the plan of the padded "
       "size (captured: one eager step fewer per layer; some long requests' KV split otherwise).",
       choices=("eager", "captured"), note="eager gives graphs-disabled tokens"),
    _s("LAYERWISE_ZERO_COPY", "switch", False, "runtime",
       "Lean MoE steps read the tensors their segment wrote instead of copies staged into static "
       "buffers (one copy fewer per MoE input).", off="off, the default"),
    _s("LAYERWISE_TIMING", "switch", False, "runtime",
       "Diagnostics: the capture report (stderr JSON) adds each captured size's memory (a device "
       "sync and allocator snapshot around its capture), and the eager steps' host time per size "
       "is printed at exit."),
    _s("LAYERWISE_PROFILE", "path", None, "runtime",
       "With LAYERWISE_TIMING=1: cProfile of the eager steps between segments, written to this file "
       "at exit (the profiler slows those steps)."),
    _s("LAYERWISE_INJECT_OOM", "str", None, "runtime",
       "Test hook, SIZE or PHASE:SIZE: capturing that size fails with an injected out-of-memory "
       "error (the drop rule then removes it and every larger size)."),
    _s("TRAPS", "choice", "off", "runtime",
       "Arm the Dynamo / subprocess traps right before the first graph capture: raise (1) makes a "
       "use an error, log only records it, off (0) leaves them unarmed.",
       choices=("off", "raise", "log"), aliases=_TRAPS_ALIASES, fold_case=True),
    _s("TRAP_LOG", "path", None, "runtime",
       "Armed traps append one JSON line per hit to this file."),
    _s("REJECT_UNKNOWN_MODEL", "switch", False, "runtime",
       "OpenAI endpoints answer 404 to a `model` this server does not serve. Set by "
       "--reject-unknown-model (inherited by the HTTP server's process)."),
    _s("MARLIN_MOE_ORDERED_REDUCE", "switch", False, "runtime",
       "Marlin MoE (NVFP4 and other weight-only MoE on SM80-SM90) reduces in a fixed order instead "
       "of with atomic adds, so identical requests give identical outputs, as "
       "--enable-deterministic-inference does; for backends where sglang refuses that flag (DSA "
       "models on FlashMLA). Read once, at the first Marlin MoE call.",
       off="atomic adds unless deterministic inference, upstream's rule"),
    # ---- runtime: NVFP4 kernels
    _s("KERNEL_LIB", "path", None, "runtime",
       "libsm120_kernels.so (or its folder) to load instead of the one packaged in the wheel."),
    _s("FP4_W4A16_MAX_M", "int", 64, "runtime",
       "NVFP4 linear layers: calls with at most this many tokens use the W4A16 GEMM (bf16 "
       "activations), larger ones the W4A4 path.", minimum=0),
    _s("FP4_LARGE_M", "choice", "w4a4", "runtime",
       "NVFP4 linear layers above FP4_W4A16_MAX_M tokens: w4a4 (activations quantized to FP4) or "
       "w4a16 (W4A16 for every M).", choices=("w4a4", "w4a16"), fold_case=True),
    _s("W4A16_KERNEL", "choice", "auto", "runtime",
       "Default W4A16 GEMM kernel: auto (the plan's rule), split (128-row CTAs, split-K across "
       "CTAs) or warpk (one CTA per 16-row tile, K over its warps; M <= 16, else split).",
       choices=("auto", "split", "warpk")),
    _s("W4A16_WARPS", "choice", "auto", "runtime",
       "Default warps per 128-row CTA of the split-K W4A16 kernel: 4, 8, or auto (the plan picks).",
       choices=("auto", "4", "8")),
    _s("W4A16_CLUSTER", "switch", False, "runtime",
       "W4A16 split-K reduced inside a thread-block cluster (up to 8 splits, no workspace round "
       "trip) by default; the same bits either way."),
    _s("PDL", "switch", True, "runtime",
       "W4A16 GEMM launched with programmatic dependent launch (its weight prefetch overlaps the "
       "previous kernel's tail), and the grouped MoE's gate_up, down and reduce kernels each after the "
       "previous one (down pulls its weights into L2 while gate_up drains); 0 launches them as plain "
       "kernels. Same bits either way."),
    _s("WORKSPACE_MB", "float", 8.0, "runtime",
       "Split-K partials workspace per (device, stream), in MiB (a fixed 256 KiB ticket region is "
       "added).", minimum=0),
    _s("KERNEL_SYNC", "switch", False, "runtime",
       "Debug: synchronize after every kernel launch and name the launch that faulted. Not for "
       "production or graph capture."),
    # ---- build: setup.py / forkbuild
    _s("KERNELS", "choice", "auto", "build",
       "Build the CUDA kernels into the wheel: auto (when nvcc is found), 1 (required), 0 (CPU-only "
       "wheel).", choices=("auto", "0", "1"), fold_case=True,
       aliases={"no": "0", "false": "0", "off": "0", "yes": "1", "true": "1", "on": "1"}),
    _s("ARCHS", "str", "sm_90a,sm_120a", "build",
       "Comma list of GPU architectures the kernels are compiled for.",
       pattern=r"sm_\d+[af]?(\s*,\s*sm_\d+[af]?)*\s*,?",
       expect="a comma list of sm_<number>[a|f], e.g. sm_90a,sm_120a"),
    _s("BUILD_JOBS", "int", 0, "build",
       "Parallel nvcc jobs; 0 = the CPU count.", minimum=0),
    _s("SASS_CHECK", "switch", True, "build",
       "After the kernel build, refuse a library whose SASS reads uniform registers it never "
       "writes (a ptxas mis-encoding that faults on the GPU); 0 skips the check.",
       on="check the library's SASS, the default", off="skip the check"),
    _s("BASE", "str", None, "build",
       "Upstream release the build takes as its base (one with a table in UPSTREAM.toml: 0.5.23 or "
       "0.5.16); unset: UPSTREAM.toml's [upstream].default. Also picks the series tools/refresh.py "
       "and tools/rebase.py edit, and the venv tools/venv.sh installs into."),
    _s("CACHE", "path", None, "build",
       "Cache folder of downloaded upstream wheels (default: $XDG_CACHE_HOME/sglang-sm120)."),
    _s("INDEX_URL", "str", None, "build",
       "Package index the pinned upstream wheel is downloaded from (default: UPSTREAM.toml's index).",
       pattern=r"(https?|file)://\S+", expect="an http://, https:// or file:// URL of a simple index"),
    # ---- test suite
    _s("TEST_BASES", "str", None, "test",
       "tools/run_tests.sh: the bases to test, space-separated (default: SGLANG_SM120_BASE alone "
       "when set, else every base in UPSTREAM.toml)."),
    _s("REQUIRE_INSTALLED", "switch", False, "test",
       "Tests that need the installed fork fail instead of skipping when it is missing."),
    _s("WHEEL", "path", None, "test",
       "The fork wheel the wheel tests inspect (default: a CPU-only wheel built by the test)."),
    _s("GPU_QUICK", "switch", False, "test",
       "GPU correctness test: a reduced grid of batch sizes and prompt lengths."),
    _s("GPU_MAX_TOKENS", "int", 0, "test",
       "GPU correctness test: KV pool of every engine capped at this many tokens; 0 = no cap.",
       minimum=0),
    _s("GPU_MOE_BACKEND", "str", None, "test",
       "GPU correctness grid: run the NVFP4 tiny models only, every engine with --moe-runner-backend "
       "of this value (results named -moe-<value>); unset: upstream's choice.",
       pattern=r"sm120", expect="sm120"),
    _s("RESULTS_DIR", "path", None, "test",
       "GPU tests also write their result files (JSON, markdown) into this folder."),
    _s("TP", "int", 1, "test", "Layerwise GPU tests (correctness grid, traps): tensor parallelism of every "
       "engine and server.", minimum=1),
    _s("EP", "int", 1, "test", "Layerwise GPU tests: expert parallelism of every engine and server, 1 or "
       "SGLANG_SM120_TP (sglang spreads experts over the whole TP group).", minimum=1),
    _s("TINY_DIR", "path", None, "test",
       "Cache folder of the generated tiny models (default: a pytest temporary folder)."),
    _s("TEST_PARALLEL", "switch", True, "test",
       "GPU tests start their servers at the same time; 0 starts them one at a time."),
    _s("LAB_VARIANT", "str", None, "test",
       "A/B patches applied in every process of a GPU run that has lab/variants first on PYTHONPATH "
       "(comma-separated names, listed in lab/variants/sitecustomize.py)."),
    _s("TEST_SERVER_ARGS", "str", None, "test",
       "Replaces the GPU test server's argument list (shell syntax)."),
    _s("TEST_DSA_ARGS", "str", None, "test",
       "Replaces the server flags the GPU tests give DSA (glm_moe_dsa) models (shell syntax)."),
    _s("TEST_LAUNCH_LINE", "str", None, "test",
       "Replaces the usual flags of the GLM-5 launch-line GPU test (shell syntax)."),
    _s("TEST_STARTUP_TIMEOUT", "float", 600.0, "test",
       "Seconds a GPU test waits for its server to become ready.", minimum=0),
    # ---- tools: deploy/, lab/, benchmarks/, tools/
    _s("DEPS", "choice", "full", "tools",
       "tools/venv.sh: full (the wheel and all it requires) or cpu-test (what the CPU tests need).",
       choices=("full", "cpu-test")),
    _s("FAULT_INJECT", "str", None, "runtime",
       "Test hook: 'gemm' corrupts one result of the sm120 NVFP4 GEMM backend's self-check (and of "
       "the check command's GEMM stage), 'moe' one result of the sm120 NVFP4 MoE backend's "
       "self-check (--moe-runner-backend sm120 or auto on SM120) and of the check command's moe "
       "stage, to show the fallback to upstream's backend; unset in production."),
    _s("COMMIT", "str", None, "tools",
       "Commit recorded in benchmark results where the tree has no usable .git."),
    # ---- the GLM-5 rank twin (benchmarks/bench_twin.py sets them for its servers)
    _s("TWIN_ROUTER", "choice", "spread", "tools",
       "GLM-5 rank twin: spread (after the dummy load, seeded N(0,1) router gates and zero expert "
       "bias, so tokens spread over the experts as a trained router's do) or dummy (upstream's dummy "
       "weights as loaded).", choices=("spread", "dummy")),
    _s("TWIN_PROBE", "path", None, "tools",
       "GLM-5 rank twin: write the run's probe readings (non-finite logits, per-expert token "
       "histogram) to this JSON file at exit."),
    _s("TWIN_HISTOGRAM_BS", "int", None, "tools",
       "GLM-5 rank twin, with TWIN_PROBE: the decode batch size whose routing is counted.", minimum=1),
    _s("TWIN_PREFILL_TOKENS", "int", 8192, "tools",
       "GLM-5 rank twin: one_batch prefills whole requests in groups of at most this many tokens "
       "and merges them into one batch (one forward of the whole batch does not fit a 96 GB card).",
       minimum=1),
)

FLAGS: Tuple[Flag, ...] = (
    Flag("--enable-piecewise-cuda-graph", "off",
         "Layerwise CUDA graphs for every phase whose backend was not chosen explicitly "
         "(--cuda-graph-backend-* and --disable-piecewise-cuda-graph win in either order).",
         "patches/0002, sglang/sm120/server_flags.py"),
    Flag("--cuda-graph-backend-decode layerwise", "upstream's",
         "Decode: upstream's full CUDA graphs up to the full-graph ceiling, per-layer graphs with "
         "the MoE eager between them above it.", "patches/0101, 0102"),
    Flag("--cuda-graph-backend-prefill layerwise", "upstream's",
         "Prefill: per-layer CUDA graphs with the MoE eager between them, at the planned token "
         "buckets.", "patches/0101, 0102"),
    Flag("""--cuda-graph-config '{"decode": {"layerwise_full_max_bs": N}}'""",
         "upstream's default decode max batch size (an explicit --cuda-graph-max-bs-decode: at most 256)",
         "Layerwise decode: batch sizes up to N use upstream's full graphs, larger ones per-layer "
         "graphs; 0 = per-layer graphs at every size.", "patches/0101"),
    Flag("--cuda-graph-layerwise-every-size", "off",
         "Layerwise decode captures every batch size as per-layer graphs (same as "
         "layerwise_full_max_bs=0).", "patches/0102"),
    Flag("--fp4-gemm-backend sm120", "auto (sm120 on SM120 GPUs when the kernel library loads)",
         "NVFP4 linear layers run on the fork's kernels: W4A16 at small M, W4A4 above "
         "SGLANG_SM120_FP4_W4A16_MAX_M.", "patches/0201, sglang/sm120/fp4_backend.py"),
    Flag("--moe-runner-backend sm120", "auto (sm120 for ModelOpt NVFP4 on SM120 GPUs when the kernel library loads)",
         "ModelOpt NVFP4 MoE experts (gated SiLU) run on the fork's grouped W4A16 kernel, on SM90 and "
         "SM120, both bases; a self-check on the first MoE layer's shapes falls back to upstream's "
         "choice.", "patches/0202, sglang/sm120/fp4_moe.py"),
    Flag("--reject-unknown-model", "off",
         "OpenAI endpoints answer 404 NotFoundError to a `model` this server does not serve "
         "(served name, model path, 'default' and loaded LoRA adapters are accepted).",
         "patches/0401, sglang/sm120/model_names.py"),
)

REGISTRY: Dict[str, Setting] = {s.name: s for s in SETTINGS}
if len(REGISTRY) != len(SETTINGS):
    raise RuntimeError("sglang.sm120.settings: a setting is registered twice")


# ------------------------------------------------------------------------------------ accessors

def setting(name: str) -> Setting:
    """The registered setting `name`; KeyError for a name that is not registered."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise KeyError(f"{name} is not a registered setting; add it to sglang/sm120/settings.py") from None


def get(name: str, environ: Optional[Mapping[str, str]] = None) -> Any:
    """The typed value of `name` from `environ` (default: the process environment)."""
    s = setting(name)
    return s.parse((os.environ if environ is None else environ).get(name))


def _typed(name: str, kind: str, environ) -> Any:
    s = setting(name)
    if s.kind != kind:
        raise TypeError(f"{name} is a {s.kind} setting, not a {kind}")
    return s.parse((os.environ if environ is None else environ).get(name))


def switch(name: str, environ: Optional[Mapping[str, str]] = None) -> bool:
    return _typed(name, "switch", environ)


def integer(name: str, environ: Optional[Mapping[str, str]] = None) -> int:
    return _typed(name, "int", environ)


def number(name: str, environ: Optional[Mapping[str, str]] = None) -> float:
    return _typed(name, "float", environ)


def choice(name: str, environ: Optional[Mapping[str, str]] = None) -> str:
    return _typed(name, "choice", environ)


def path(name: str, environ: Optional[Mapping[str, str]] = None) -> Optional[str]:
    return _typed(name, "path", environ)


def text(name: str, environ: Optional[Mapping[str, str]] = None) -> Optional[str]:
    return _typed(name, "str", environ)


def raw(name: str, environ: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """The text of a registered str setting exactly as set: None when unset, '' when set empty
    (for a variable whose empty value means something of its own)."""
    _typed(name, "str", environ)
    return (os.environ if environ is None else environ).get(name)


# ------------------------------------------------------------------------ repository scan

SCANNED_SUFFIXES = (".py", ".sh", ".cu", ".cuh", ".h", ".patch")
# Hidden folders (.venv, .cache, .git, ...) are skipped as well: they hold installed or generated
# copies, not the project's files.
SKIPPED_DIRS = {"__pycache__", "build", "dist", "node_modules"}
SKIPPED_PATHS = {("lab", "scratch")}  # probe outputs (git-ignored)


def scanned_files(root: Path) -> Iterable[Path]:
    """The files of the repository at `root` whose mentions of SGLANG_SM120_* must be registered."""
    root = Path(root)
    for dirpath, dirnames, filenames in os.walk(root):
        rel = Path(dirpath).relative_to(root).parts
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d not in SKIPPED_DIRS
                             and not d.endswith(".egg-info") and (*rel, d) not in SKIPPED_PATHS)
        for f in sorted(filenames):
            if f.endswith(SCANNED_SUFFIXES):
                yield Path(dirpath) / f


def mentioned_names(files: Iterable[Path]) -> Dict[str, List[str]]:
    """SGLANG_SM120_* name -> the files mentioning it."""
    found: Dict[str, List[str]] = {}
    for f in files:
        try:
            content = Path(f).read_text(errors="replace")
        except OSError:
            continue
        for name in sorted(set(NAME_PATTERN.findall(content))):
            found.setdefault(name, []).append(str(f))
    return found


def unregistered(files: Iterable[Path]) -> Dict[str, List[str]]:
    """Names mentioned in `files` that are not registered, with where they appear."""
    return {n: where for n, where in mentioned_names(files).items() if n not in REGISTRY}


# ------------------------------------------------------------------------------ markdown

def _cell(s: str) -> str:
    return s.replace("|", "\\|").replace("\n", " ")


def markdown() -> str:
    """Two tables: the environment variables by scope, then the CLI flags the fork adds."""
    lines = ["Environment variables (registered in `python/sglang/sm120/settings.py`; unset or empty "
             "means the default, a malformed value is an error naming the variable):", "",
             "| variable | scope | type | default | effect |", "|---|---|---|---|---|"]
    for scope in SCOPES:
        for s in SETTINGS:
            if s.scope == scope:
                lines.append(f"| `{s.name}` | {scope} | {s.type_text()} | {_cell(s.default_text())} | {_cell(s.doc)} |")
    lines += ["", "Command-line flags the fork adds to `sglang serve` / `python -m sglang.launch_server`:", "",
              "| flag | default | effect | added by |", "|---|---|---|---|"]
    for f in FLAGS:
        lines.append(f"| `{f.flag}` | {_cell(f.default)} | {_cell(f.doc)} | {_cell(f.source)} |")
    return "\n".join(lines) + "\n"


def replace_block(content: str, block: str) -> str:
    """`content` with the text between BEGIN_MARKER and END_MARKER replaced by `block`."""
    start = content.find(BEGIN_MARKER)
    end = content.find(END_MARKER)
    if start < 0 or end < 0 or end < start:
        raise ValueError(f"expected {BEGIN_MARKER} followed by {END_MARKER}")
    head = content[: start + len(BEGIN_MARKER)]
    return head + "\n" + block.rstrip("\n") + "\n" + content[end:]


def marked_block(content: str) -> Optional[str]:
    """The text between the markers (None when they are missing), as replace_block writes it."""
    start = content.find(BEGIN_MARKER)
    end = content.find(END_MARKER)
    if start < 0 or end < 0 or end < start:
        return None
    return content[start + len(BEGIN_MARKER): end].strip("\n") + "\n"


def write_block(path: Path, block: Optional[str] = None) -> bool:
    """Replace the marked block of the file at `path` with `block` (default: the generated
    tables); returns whether the file changed."""
    path = Path(path)
    old = path.read_text()
    new = replace_block(old, markdown() if block is None else block)
    if new != old:
        path.write_text(new)
    return new != old


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sglang.sm120.settings", description=__doc__.splitlines()[0])
    group = ap.add_mutually_exclusive_group(required=True)
    group.add_argument("--markdown", action="store_true", help="print the tables")
    group.add_argument("--write-docs", metavar="FILE", type=Path,
                       help=f"replace the text between {BEGIN_MARKER} and {END_MARKER} in FILE")
    args = ap.parse_args(argv)
    if args.markdown:
        sys.stdout.write(markdown())
        return 0
    try:
        changed = write_block(args.write_docs)
    except (OSError, ValueError) as e:
        print(f"error: {args.write_docs}: {e}", file=sys.stderr)
        return 1
    print(f"{args.write_docs}: settings block {'updated' if changed else 'already current'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
