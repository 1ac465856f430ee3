"""lab/same_tokens_probe.py: the workload, the comparison against graphs disabled and the report,
on fake servers."""
import json
import types

import pytest
from repo_scripts import load

pytestmark = pytest.mark.base_independent

probe = load("lab/same_tokens_probe.py")


def test_workload_is_deterministic_covers_every_band_and_repeats_one_batch():
    a, b = probe.build_workload(500, seed=3), probe.build_workload(500, seed=3)
    assert a == b and a != probe.build_workload(500, seed=4)
    assert [x["size"] for x in a] == list(probe.BATCH_SIZES) + [probe.REPEAT_OF]
    assert a[-1]["name"] == f"bs{probe.REPEAT_OF}-again" and a[-1]["prompts"] == a[4]["prompts"]
    for batch in a:
        assert len(batch["prompts"]) == batch["size"]
        if batch["size"] >= len(probe.BANDS):
            assert {probe.band_of(len(p)) for p in batch["prompts"]} == {f"{lo}-{hi}" for lo, hi in probe.BANDS}
    assert all(3 <= t < 500 for batch in a for p in batch["prompts"] for t in p)
    assert probe.max_batch_tokens(a) == max(sum(len(p) + 16 for p in x["prompts"]) for x in a)
    with pytest.raises(ValueError):
        probe.band_of(1501)


def test_compare_splits_by_first_difference_band_and_batch():
    batches = [{"name": "bs2", "size": 2, "prompts": [[5] * 3, [6] * 100]},
               {"name": "bs1", "size": 1, "prompts": [[7] * 900]}]
    ref = [[[1, 2, 3], [4, 5, 6]], [[7, 8, 9]]]
    got = [[[9, 2, 3], [4, 5, 6]], [[7, 8, 0]]]  # request 0 differs at token 0, bs1's at token 2
    r = probe.compare(batches, ref, got)
    assert (r["sequences"], r["identical"], r["first_diff_prefill"], r["first_diff_decode"]) == (3, 1, 1, 1)
    assert r["identical_share"] == round(1 / 3, 4)
    assert r["by_band"]["1-8"] == {"identical": 0, "total": 1, "share": 0.0}
    assert r["by_band"]["65-256"] == {"identical": 1, "total": 1, "share": 1.0}
    assert r["by_band"]["257-700"]["share"] is None
    assert r["by_batch"] == {"bs2": {"identical": 1, "total": 2, "share": 0.5},
                             "bs1": {"identical": 0, "total": 1, "share": 0.0}}
    assert r["examples"][1] == {"batch": "bs1", "request": 0, "prompt_len": 900, "token": 2}
    assert probe.first_difference([1, 2], [1, 2, 3]) == 2 and probe.first_difference([1], [1]) is None
    with pytest.raises(ValueError, match="2 batches"):
        probe.compare(batches, ref[:1], got)


def test_variant_selection():
    default = probe.select_variants(None)
    assert default == [n for n in probe.VARIANTS if n not in probe.NAMED_ONLY]
    assert {"upstream-1024", "upstream-exact", "lw-exact", "lw-exact-compiled"} <= set(default)
    assert probe.select_variants("off-a,lw-exact-router-tree") == ["off-a", "lw-exact-router-tree"]
    # each named-only variant names a lab variant sitecustomize knows
    site = load("lab/variants/sitecustomize.py")
    assert all(set(env["SGLANG_SM120_LAB_VARIANT"].split(",")) <= set(site.PATCHES)
               for _, _, env in probe.NAMED_ONLY.values())
    # the probe's orders are the lab variants' (test_lab_variants.py holds those to gpu_numerics)
    assert {f"router-{o}" for o in probe.ORDERS} <= set(site.PATCHES)
    assert probe.select_variants("off-a, seed") == ["off-a", "seed"]
    with pytest.raises(SystemExit, match="unknown"):
        probe.select_variants("off-a,bogus")
    with pytest.raises(SystemExit, match="reference"):
        probe.select_variants("seed")
    # every variant but the reference's twin switches something on top of its base
    assert all(isinstance(flags, list) and isinstance(env, dict) for _, flags, env in probe.VARIANTS.values())


class _FakeServer:
    envs = {}

    def __init__(self, name, model_dir, log_path, args, env):
        self.name, self.args, self.env, self.log_path = name, args, env, log_path
        self.url = f"fake://{name}"
        _FakeServer.envs[name] = env

    def command(self):
        return ["launch", self.name, *self.args]

    def start(self):
        with open(self.log_path, "w") as f:
            if self.name == "seed":
                f.write('SM120_LAYERWISE_CAPTURE {"phase": "decode", "moe_rows": "real", "layerwise": [512]}\n')
                f.write("layerwise decode: size 1100 runs eagerly (above ...); logged once\n")

    def wait_ready(self, timeout, progress):
        if self.name == "upstream":
            raise RuntimeError("server exited with code 1 during startup")
        return 2.0

    def stop(self):
        pass


def _fake_request_json(url, payload, timeout):
    name = url.split("//")[1].split("/")[0]
    outs = [[len(p) % 97, 1, 2, 3] for p in payload["input_ids"]]
    if name == "seed" and len(payload["input_ids"]) == 5:
        outs[2][3] = -1  # one decode token differs in the batch of 5
    if name == "off-b" and len(payload["input_ids"]) == 17:
        outs[0][0] = -1  # one first token differs in the batch of 17
    return [{"output_ids": o} for o in outs]


def test_main_on_fake_servers(tmp_path, monkeypatch):
    flushed = []
    fake = types.SimpleNamespace(Server=_FakeServer, request_json=_fake_request_json,
                                 flush_cache=flushed.append)
    monkeypatch.setattr(probe, "launcher", lambda: fake)
    monkeypatch.setattr(probe.time, "sleep", lambda s: None)
    models = tmp_path / "models" / "glm4_moe-bf16"
    models.mkdir(parents=True)
    (models / "config.json").write_text(json.dumps({"vocab_size": 300}))
    out = tmp_path / "out"
    assert probe.main(["--out", str(out), "--models-dir", str(tmp_path / "models"),
                       "--variants", "off-a,off-b,upstream,seed"]) == 0
    doc = json.loads((out / "same-tokens-probe.json").read_text())
    res = doc["results"]
    n = sum(probe.BATCH_SIZES) + probe.REPEAT_OF
    assert res["off-a"] is None and res["upstream"] is None
    assert res["seed"]["sequences"] == n and res["seed"]["identical"] == n - 1
    assert res["seed"]["first_diff_decode"] == 1 and res["seed"]["by_batch"]["bs5"]["identical"] == 4
    assert res["off-b"]["first_diff_prefill"] == 1 and res["off-b"]["by_batch"]["bs17"]["identical"] == 16
    variants = {v["name"]: v for v in doc["variants"]}
    assert "exited with code 1" in variants["upstream"]["error"]
    assert variants["seed"]["capture_reports"] == [{"phase": "decode", "layerwise": [512], "moe_rows": "real"}]
    assert variants["seed"]["eager_fallback_lines"] == 1
    assert "--enable-piecewise-cuda-graph" in variants["seed"]["command"]
    assert "--disable-cuda-graph" in variants["off-b"]["command"]
    # every server sees the lab variants first on its path (only a variant's env name applies one)
    assert all(e["PYTHONPATH"].split(":")[0].endswith("lab/variants") for e in _FakeServer.envs.values())
    # every server that came up starts its workload from an empty radix cache
    assert sorted(u.split("//")[1] for u in flushed) == ["off-a", "off-b", "seed"]
    md = (out / "same-tokens-probe.md").read_text()
    assert f"| seed | {n - 1}/{n} " in md and "| upstream | RuntimeError" in md


def test_gpu_identity_test_workload_and_comparison():
    """test/gpu/test_same_tokens.py's pure parts: the workload and the per-group identity count."""
    gpu = load("test/gpu/test_same_tokens.py")
    w = gpu.workload(1000)
    assert w == gpu.workload(1000)
    groups = {b["group"] for b in w}
    assert groups == {"decode", "decode-long", "prefill", "prefix"}
    assert [len(b["prompts"]) for b in w if b["group"] == "decode"] == gpu.DECODE_SIZES
    long = [b for b in w if b["group"] == "decode-long"]
    assert [len(b["prompts"]) for b in long] == gpu.LONG_DECODE_SIZES
    lo, hi = gpu.LONG_DECODE_LENS
    assert all(lo <= len(p) <= hi for b in long for p in b["prompts"])
    # a long-decode batch's KV fits every server's pool at once (no queueing, no retraction)
    assert max(sum(len(p) + b["new_tokens"] for p in b["prompts"]) for b in long) <= gpu.MAX_TOTAL_TOKENS
    assert max(len(p) for b in w for p in b["prompts"]) <= 4096
    assert w[-1]["prompts"] == next(b for b in w if b["name"] == "prefill-mixed")["prompts"]  # cache hits
    shared = next(b for b in w if b["name"] == "prefix-shared")["prompts"]
    assert len({tuple(p[:gpu.PREFIX_LEN]) for p in shared}) == 1
    batches = [{"group": "decode", "name": "d", "prompts": [[1], [2]]}, {"group": "prefill", "name": "p", "prompts": [[3]]}]
    cells = gpu.same_tokens(batches, [[[1, 2], [3, 4]], [[5]]], [[[1, 2], [3, 9]], [[5]]])
    assert cells["decode"] == {"identical": 1, "total": 2, "differ": ["d request 1 token 1"]}
    assert gpu.fraction(cells) == round(2 / 3, 6) and gpu.fraction(cells, ("prefill",)) == 1.0
    assert gpu.fraction({}) is None
