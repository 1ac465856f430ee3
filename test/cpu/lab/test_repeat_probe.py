"""lab/repeat_probe.py: variant parsing and where two greedy batches first differ."""
import pytest
from repo_scripts import load

probe = load("lab/repeat_probe.py")


def test_variant_words_split_into_flags_and_environment():
    v = probe.parse_variant("topk glm_moe_dsa-nvfp4 --dsa-topk-backend torch SGLANG_X=0 'A_B=x y'")
    assert (v["name"], v["model"]) == ("topk", "glm_moe_dsa-nvfp4")
    assert v["args"] == ["--dsa-topk-backend", "torch"]
    assert v["env"] == {"SGLANG_X": "0", "A_B": "x y"}
    with pytest.raises(SystemExit, match="NAME MODEL"):
        probe.parse_variant("lonely")


@pytest.mark.parametrize("a,b,where", [
    ([[1, 2, 3], [4, 5, 6]], [[1, 2, 3], [4, 5, 6]], None),
    ([[1, 2, 3], [4, 5, 6]], [[1, 2, 3], [4, 9, 6]], (1, 1)),
    ([[1, 2, 3], [4, 5, 6]], [[7, 2, 3], [4, 9, 6]], (0, 0)),
    ([[1, 2, 3]], [[1, 2]], (0, 2)),
])
def test_first_difference(a, b, where):
    assert probe.first_difference(a, b) == where


class _FakeServer:
    """Stands in for sglang.sm120.launcher.Server: its name picks how its repeats answer."""
    calls = {}

    def __init__(self, name, model_dir, log_path, args, env):
        self.name, self.args, self.env, self.url = name, args, env, f"fake://{name}"

    def command(self):
        return ["launch", self.name, *self.args]

    def start(self):
        _FakeServer.calls[self.url] = 0

    def wait_ready(self, timeout, progress):
        if self.name == "broken":
            raise RuntimeError("server exited with code 1 during startup")
        return 1.0

    def stop(self):
        pass


def _fake_request_json(url, payload, timeout):
    url = url.removesuffix("/generate")
    n = _FakeServer.calls[url] = _FakeServer.calls[url] + 1
    outs = [[10 * r + t for t in range(payload["sampling_params"]["max_new_tokens"])]
            for r in range(len(payload["text"]))]
    if url == "fake://flaky" and n == 3:
        outs[1][2] = -1
    return [{"output_ids": o} for o in outs]


def test_probe_counts_differing_repeats_per_variant_and_records_failures(tmp_path, monkeypatch):
    import json

    from sglang.sm120 import launcher
    from sglang.sm120.tiny import serving

    monkeypatch.setattr(launcher, "Server", _FakeServer)
    monkeypatch.setattr(launcher, "request_json", _fake_request_json)
    monkeypatch.setattr(serving, "server_args", lambda model: ["--base-flag"])
    monkeypatch.setattr(serving, "server_env", lambda model: {"BASE": "1"})
    built = []
    monkeypatch.setattr(serving, "tiny_model", lambda root, arch, quant: built.append((arch, quant)))
    monkeypatch.setattr(probe.time, "sleep", lambda s: None)
    models = tmp_path / "models"
    (models / "m-bf16").mkdir(parents=True)
    (models / "m-bf16" / "config.json").write_text("{}")  # present: nothing is built
    out = tmp_path / "res" / "probe.json"
    rc = probe.main(["--out", str(out), "--models-dir", str(models), "--repeats", "4", "--tokens", "5",
                     "--variant", "steady m-bf16 --x 1", "--variant", "flaky m-bf16 K=2",
                     "--variant", "broken m-bf16"])
    assert rc == 1 and built == [("m", "bf16")]
    got = {v["name"]: v for v in json.loads(out.read_text())["variants"]}
    assert got["steady"]["differing_repeats"] == 0 and got["steady"]["distinct_batches"] == 1
    assert got["steady"]["command"].endswith("--base-flag --x 1")
    assert got["flaky"]["differing_repeats"] == 1
    assert got["flaky"]["first_differences"] == [{"repeat": 2, "request": 1, "token": 2}]
    assert "exited with code 1" in got["broken"]["error"]
    targets = json.loads(out.read_text())["targets"]
    assert targets["steady_differing_repeats"]["met"] and not targets["flaky_differing_repeats"]["met"]
    assert not targets["broken_differing_repeats"]["met"]

