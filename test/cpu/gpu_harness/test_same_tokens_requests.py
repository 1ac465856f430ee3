"""test/gpu/test_same_tokens.py's requests fit its servers: sglang refuses a prompt whose length
plus new tokens exceeds the context length, and the tiny models have 4096 positions while the
test prefills prompts of up to 4096 tokens. Every server loads the model with more positions
(--json-model-override-args, so RoPE's cache covers them too), and every request fits."""
import json

import test_same_tokens as st
from sglang.sm120.tiny import spec


def test_every_request_fits_the_positions_the_servers_load():
    flags = st.common_flags()
    override = json.loads(flags[flags.index("--json-model-override-args") + 1])
    assert override == {"max_position_embeddings": st.POSITIONS}
    longest = max(len(p) + b["new_tokens"] for b in st.workload(vocab=4096) for p in b["prompts"])
    assert max(st.PREFILL_LENS) == 4096 and 4096 + st.PREFILL_TOKENS <= longest <= st.POSITIONS
    assert "--context-length" not in flags  # past the model's positions it would index past RoPE's cache


def test_the_tiny_models_need_it():
    assert spec.TinySpec(arch="glm4_moe").max_position < 4096 + st.PREFILL_TOKENS


def test_the_cold_servers_import_flashinfer_without_its_prebuilt_modules(tmp_path):
    """A stand-in flashinfer that finds data/aot from its resolved file, as FlashInfer does: from
    the mirror it finds no prebuilt modules, every other data entry is the installed one, and
    sglang's JIT cache is an empty folder of the server's own."""
    import subprocess
    import sys

    pkg = tmp_path / "site" / "flashinfer"
    (pkg / "jit").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "jit" / "__init__.py").write_text("")
    (pkg / "jit" / "env.py").write_text(
        "import pathlib\nAOT = pathlib.Path(__file__).resolve().parents[1] / 'data' / 'aot'\n")
    for d in ("aot", "csrc"):
        (pkg / "data" / d).mkdir(parents=True)
    env = st.without_prebuilt_modules(tmp_path / "cold", package=pkg)
    mirror = tmp_path / "cold" / "pkgs" / "flashinfer"
    assert sorted(p.name for p in (mirror / "data").iterdir()) == ["csrc"]
    assert (mirror / "data" / "csrc").resolve() == (pkg / "data" / "csrc").resolve()
    assert env["TVM_FFI_CACHE_DIR"] == str(tmp_path / "cold" / "tvm-ffi")
    out = subprocess.run([sys.executable, "-c", "import flashinfer.jit.env as e; print(e.AOT, e.AOT.exists())"],
                         env={"PATH": "/usr/bin:/bin", "PYTHONPATH": env["PYTHONPATH"] + ":" + str(tmp_path / "site")},
                         capture_output=True, text=True, check=True).stdout.split()
    assert out == [str(mirror / "data" / "aot"), "False"]
    # the real package resolves to the installed data/aot: the same code finds it there
    out = subprocess.run([sys.executable, "-c", "import flashinfer.jit.env as e; print(e.AOT.exists())"],
                         env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tmp_path / "site")},
                         capture_output=True, text=True, check=True).stdout.split()
    assert out == ["True"]


def test_a_difference_from_graphs_disabled_counts_only_where_upstream_does_not_share_it():
    batches = [{"group": "decode", "name": "bs3"}, {"group": "prefill", "name": "len9"}]
    off = [[[1, 2], [3, 4], [5, 6]], [[7]]]
    upstream = [[[1, 2], [3, 9], [5, 6]], [[7]]]
    got = [[[1, 2], [3, 9], [5, 8]], [[0]]]
    cells = st.unexplained(batches, off, upstream, got)
    assert cells["decode"] == {"as_upstream": 1, "unexplained": 1, "total": 3, "differ": ["bs3 request 2 token 1"]}
    assert cells["prefill"] == {"as_upstream": 0, "unexplained": 1, "total": 1, "differ": ["len9 request 0 token 0"]}
    # identical to graphs disabled where upstream differs: nothing to explain
    assert st.unexplained(batches, off, upstream, off)["decode"]["unexplained"] == 0


def test_the_identity_test_runs_upstreams_configuration_beside_layerwise():
    assert st.ROLES["upstream"] == []
    assert all(st.LAYERWISE[0] in st.ROLES[r] for r in st.LAYERWISE_ROLES)
