"""Offline tests of deploy/wheelhouse.py and the GPU-host staging scripts, on tiny synthetic wheels."""
from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from deploy import wheelhouse
from deploy.wheelhouse_lib.compat import Requirement, Version, canonicalize_name
from deploy.wheelhouse_lib.hostenv import HostListError, HostPackages, Target, load_host_list, parse_host_list
from deploy.wheelhouse_lib.output import OutputError, WheelEntry, check_out_dir, write_wheelhouse
from deploy.wheelhouse_lib.pack import PackError, pack, piece_spans
from deploy.wheelhouse_lib.pipselect import PipSelector, sha256_of
from deploy.wheelhouse_lib.policy import PolicyError, load_policy, parse_policy
from deploy.wheelhouse_lib.resolve import Candidate, resolve
from deploy.wheelhouse_lib.wheelfile import WheelError, read_metadata, rewrite_wheel, verify_record

REPO = Path(__file__).resolve().parents[3]
STAGE_SH, INSTALL_SH = REPO / "deploy/stage.sh", REPO / "deploy/install.sh"

POLICY_HEAD = '[upstream]\nname = "root"\nversion = "1.0"\n'


# ---- synthetic wheels

def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def make_wheel(folder: Path, name: str, version: str, files: dict[str, bytes] | None = None,
               requires: tuple[str, ...] = (), executable: tuple[str, ...] = ()) -> Path:
    """A minimal valid py3-none-any wheel with a correct RECORD."""
    mod = name.replace("-", "_")
    dist, di = f"{mod}-{version}", f"{mod}-{version}.dist-info"
    files = dict(files if files is not None else {f"{mod}/__init__.py": f"VERSION = {version!r}\n".encode()})
    files[f"{di}/METADATA"] = ("Metadata-Version: 2.1\n" f"Name: {name}\nVersion: {version}\n"
                               + "".join(f"Requires-Dist: {r}\n" for r in requires)).encode()
    files[f"{di}/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{dist}-py3-none-any.whl"
    rows = []
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for fn, data in files.items():
            info = zipfile.ZipInfo(fn, date_time=(2024, 1, 1, 0, 0, 0))
            info.external_attr = (0o755 if fn in executable else 0o644) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, data)
            rows.append(f"{fn},{_record_hash(data)},{len(data)}\n")
        zf.writestr(f"{di}/RECORD", "".join(rows) + f"{di}/RECORD,,\n")  # no name here needs CSV quoting
    return path


# ---- host package lists

@pytest.mark.parametrize("text, want", [
    ("""# comment
torch==2.11.0+cu130
Bar_Baz.qux==2.0.post1
legacy===1.0a1
-e git+https://example.invalid/repo.git@abc#egg=editpkg
direct @ file:///tmp/direct-3.1-py3-none-any.whl
nourl @ https://example.invalid/archive.zip
""", {"torch": "2.11.0+cu130", "bar-baz-qux": "2.0.post1", "LEGACY": "1.0a1", "editpkg": None, "direct": "3.1",
      "nourl": None}),
    ("""Package            Version     Editable project location
------------------ ----------- -------------------------
numpy              2.5.2
typing_extensions  4.16.0
mypkg              0.1.dev0    /src/mypkg
""", {"numpy": "2.5.2", "typing-extensions": "4.16.0", "mypkg": "0.1.dev0"}),
    (json.dumps([{"name": "Torch", "version": "2.11.0"}, {"name": "tokenizers", "version": "0.23.2"}]),
     {"torch": "2.11.0", "tokenizers": "0.23.2"}),
], ids=["freeze", "columns", "json"])
def test_parse_host_list_formats(text, want):
    host = parse_host_list(text, "freeze.txt")
    for name, version in want.items():
        assert host.has(name) and host.version_of(name) == (version and Version(version))
    assert len(host) == len(want)


def test_parse_host_list_errors_name_the_line():
    with pytest.raises(HostListError, match=r"f\.txt:2: cannot read 'what is this'"):
        parse_host_list("numpy==1.0\nwhat is this\n", "f.txt")
    with pytest.raises(HostListError, match=r"f\.txt:1: invalid version"):
        parse_host_list("numpy==not.a.version!\n", "f.txt")
    with pytest.raises(HostListError, match="--exclude-from"):
        load_host_list("/nonexistent/freeze.txt")


def test_checked_in_host_freeze_reads():
    host = load_host_list(REPO / "deploy/h200-host-freeze.txt")
    for name, version in {"torch": "2.11.0", "transformers": "5.17.0", "tokenizers": "0.23.2"}.items():
        assert host.version_of(name) == Version(version)


def test_target_platform_tags_cover_every_manylinux_level():
    plats = Target(python="3.12", glibc="2.39").platforms()
    for minor in range(5, 40):
        assert f"manylinux_2_{minor}_x86_64" in plats
    assert {"manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64", "linux_x86_64"} <= set(plats)
    assert plats[0] == "manylinux_2_39_x86_64"  # most specific first: pip prefers earlier tags
    assert "manylinux_2_40_x86_64" not in plats
    with pytest.raises(ValueError, match="--python"):
        Target(python="twelve")


# ---- resolution

class FakeIndex:
    """Selector over an in-memory index: name -> {version: requires_dist}; newest match wins.
    With wheels (name -> file), candidates are those files and download() returns them."""

    def __init__(self, index, wheels=None):
        self.index, self.wheels, self.asked, self.calls = index, wheels or {}, [], 0  # the CLI reports calls

    def select(self, requirements):
        out = {}
        for key, text in requirements.items():
            self.asked.append(text)
            req = Requirement(text)
            versions = self.index.get(canonicalize_name(req.name), {})
            ok = sorted((v for v in versions if req.specifier.contains(v, prereleases=True)), key=Version)
            if not ok:
                out[key] = f"ERROR: No matching distribution found for {text}"
                continue
            v, w = ok[-1], self.wheels.get(req.name)
            out[key] = Candidate(name=req.name, version=v, requires_dist=versions[v],
                                 filename=w.name if w else f"{req.name}-{v}-py3-none-any.whl",
                                 url=w.as_uri() if w else "", sha256=w and sha256_of(w))
        return out

    def download(self, wanted, cache_dir):
        return {c.filename: self.wheels[c.name] for c in wanted}


def _resolve(root_requires, index, host_text="", policy_text=""):
    root = Candidate(name="root", version="1.0", requires_dist=list(root_requires), filename="root.whl", url="")
    policy = parse_policy(POLICY_HEAD + policy_text)
    host = parse_host_list(host_text) if host_text else HostPackages()
    sel = FakeIndex(index)
    return resolve(root, Target(python="3.12"), host, policy, sel, log=lambda m: None), sel


def test_resolve_subtracts_compatible_target_packages_and_applies_policy():
    index = {"a": {"1.5": [], "2.0": []}, "b": {"2.0": ["leaf"], "3.0": []}, "c": {"1.0": ["a>=1.2"]},
             "f": {"1.0": ['fx; extra == "more"', 'fy; extra == "other"']}, "skipme": {"1.0": ["g"]},
             **{n: {"1.0": []} for n in ("d", "e", "fx", "fy", "leaf", "g")}}
    res, sel = _resolve(["a>=1", "b==2.0", "c", 'd; python_version < "3.12"', 'e; python_version >= "3.12"',
                         "torch==2.11.0", "skipme", "f[more]"], index, "a==1.5\nb==3.0\ntorch==2.11.0+cu130\n",
                        '[skip]\nskipme = "not needed here"\n[conflict.b]\nuse = "ship"\nreason = "needs 2.0"\n')
    kinds = {name: n.kind for name, n in res.nodes.items()}
    assert kinds["a"] == "host" and kinds["torch"] == "host"       # target versions meet every requirement
    assert kinds["b"] == "ship" and res.nodes["b"].version == "2.0"  # conflict resolved by policy: ship
    assert [e.parent for e in res.nodes["b"].violated] == ["root 1.0"]
    assert kinds["leaf"] == "ship"                                  # followed from the shipped b
    assert kinds["c"] == "ship" and kinds["e"] == "ship" and kinds["f"] == "ship" and kinds["fx"] == "ship"
    assert "d" not in kinds          # marker false for Python 3.12 (evaluated for the target, not this interpreter)
    assert "fy" not in kinds         # extra not requested
    assert kinds["skipme"] == "skip" and "g" not in kinds  # skipped packages are not followed
    assert not any(t.startswith("torch") or t.startswith("a") for t in sel.asked)  # never looked up


def test_resolve_conflict_without_decision_is_undecided_and_use_host_keeps_target():
    index = {"numba": {"0.65.1": ["numpy<2.4"]}, "numpy": {"2.3.5": []}}
    host = "numba==0.68.0\nnumpy==2.5.2\n"
    res, _ = _resolve(["numba==0.65.1"], index, host)
    assert res.nodes["numba"].kind == "undecided"
    res, _ = _resolve(["numba==0.65.1"], index, host, '[conflict.numba]\nuse = "host"\nreason = "host build works"\n')
    assert res.nodes["numba"].kind == "host-conflict"
    assert "numpy" not in res.nodes  # the rejected pin's own requirements are not followed
    # A package whose version on the target is unknown meets only unconstrained requirements.
    res, _ = _resolve(["editpkg>=1", "other"], {"other": {"1": ["editpkg"]}},
                      host_text="-e git+https://x.invalid/r.git#egg=editpkg\n")
    assert res.nodes["editpkg"].kind == "undecided"


def test_resolve_restarts_when_a_later_requirement_rejects_a_pick_and_applies_pins():
    index = {"x": {"1.5": [], "2.0": []}, "y": {"1.0": ["z"]}, "z": {"1.0": ["x<2"]}}
    res, _ = _resolve(["x", "y"], index)
    assert res.nodes["x"].version == "1.5"
    assert res.restarts == 1 and res.learned == {"x": "<2"}
    index = {"refl": {"1.84.0": [], "1.85.1": []}}
    res, _ = _resolve(["refl>=1.81"], index, policy_text='[pin.refl]\nversion = "==1.84.0"\nreason = "match grpcio"\n')
    assert res.nodes["refl"].version == "1.84.0"
    res, _ = _resolve(["nope>=1"], index)
    assert res.nodes["nope"].kind == "missing" and "No matching distribution" in res.nodes["nope"].error


def test_pip_selector_skips_releases_that_do_not_support_the_target_python(monkeypatch):
    sel = PipSelector(Target(python="3.10"), log=lambda m: None)
    releases = {"3.0": ">=3.12", "2.0": ">=3.11", "1.0": ">=3.8"}

    def fake_dry_run(reqs):
        req = Requirement(reqs[0])
        v = max((v for v in releases if req.specifier.contains(v)), key=Version)
        return {"pkg": Candidate("pkg", v, [], f"pkg-{v}-py3-none-any.whl", "", None, releases[v])}, ""

    monkeypatch.setattr(sel, "_dry_run", fake_dry_run)
    got = sel.select({"pkg": "pkg>=0.5"})["pkg"]
    assert got.version == "1.0"
    assert sel.select({"pkg": "pkg>=0.5"})["pkg"] is got  # cached by the caller's requirement text


# ---- packing

def test_pack_respects_limit_and_places_everything_once():
    sizes = {f"w{i}.whl": s for i, s in enumerate([45, 30, 30, 20, 15, 10, 10, 5, 5, 1])}
    parts = pack(sizes, limit=60, reserve=2)
    assert sorted(k for p in parts for k in p) == sorted(sizes)
    assert all(sum(sizes[k] for k in p) <= 58 for p in parts)
    assert len(parts) == 4  # 171 units in bins of 58: three cannot hold them


def test_pack_names_a_wheel_larger_than_a_part():
    with pytest.raises(PackError, match=r"huge\.whl is 0\.0 MB, larger than a part"):
        pack({"small.whl": 10, "huge.whl": 70}, limit=60)


@pytest.mark.parametrize("size,cap,count", [(100, 40, 3), (80, 40, 2), (81, 40, 3), (5, 40, 1)])
def test_piece_spans_cover_the_file_in_the_fewest_pieces(size, cap, count):
    spans = piece_spans(size, cap)
    assert len(spans) == count and all(0 < n <= cap for _, n in spans)
    assert [off for off, _ in spans] == [sum(n for _, n in spans[:i]) for i in range(count)]
    assert sum(n for _, n in spans) == size


# ---- wheel rewriting

def _kernel_wheel(tmp):
    return make_wheel(tmp / "src", "kern", "0.4.5", {
        "kern/__init__.py": b"x = 1\n", "kern/flash_ops.so": b"\x7fELF" + b"0" * 5000, "kern/sm100/a.so": b"a" * 100,
        "kern/sm100/b.so": b"b" * 100, "kern/common.so": b"\x7fELF common",
        "kern/table.py": b'deps = {"tok": "tok>=0.22.0,<=0.23.0"}\n',
    }, requires=("tok<=0.23.0,>=0.22.0",), executable=("kern/common.so",))


def _edit(package, file, pattern, replacement, reason="r"):
    return (f"[[edit]]\npackage = '{package}'\nfile = '{file}'\npattern = '{pattern}'\n"
            f"replacement = '{replacement}'\nreason = '{reason}'\n")


def test_rewrite_wheel_slims_and_edits_with_a_valid_record(tmp_path):
    src = _kernel_wheel(tmp_path)
    pol = parse_policy(POLICY_HEAD + '[slim.kern]\nremove = ["kern/flash_ops.so", "kern/sm100/"]\n'
                       'reason = "FA3 and SM100 code are not used"\n'
                       + _edit("kern", "kern/table.py", r"<=0\.23\.0", "<0.24", "host has 0.23.2")
                       + _edit("kern", "{dist_info}/METADATA", r"tok<=0\.23\.0", "tok<0.24", "metadata agrees"))
    dst = tmp_path / "out" / src.name
    change = rewrite_wheel(src, dst, slim=pol.slim["kern"], edits=pol.edits_for("kern"))
    assert sorted(change["removed"]) == ["kern/flash_ops.so", "kern/sm100/a.so", "kern/sm100/b.so"]
    assert change["removed_bytes"] == 5004 + 200
    assert [e["file"] for e in change["edited"]] == ["kern/table.py", "kern-0.4.5.dist-info/METADATA"]
    assert verify_record(dst) == 6  # __init__, common.so, table.py, METADATA, WHEEL, RECORD
    with zipfile.ZipFile(dst) as zf:
        assert b"<0.24" in zf.read("kern/table.py")
        assert not any(n.startswith("kern/sm100/") for n in zf.namelist())
        assert (zf.getinfo("kern/common.so").external_attr >> 16) & 0o111  # executable bit kept
        record = zf.read("kern-0.4.5.dist-info/RECORD").decode()
    assert "flash_ops" not in record and "kern-0.4.5.dist-info/RECORD,," in record
    assert read_metadata(dst)[2] == ["tok<0.24,>=0.22.0"]


def test_rewrite_wheel_refuses_stale_policy_and_verify_record_detects_tampering(tmp_path):
    src = _kernel_wheel(tmp_path)
    pol = parse_policy(POLICY_HEAD + '[slim.kern]\nremove = ["kern/gone.so"]\nreason = "r"\n')
    with pytest.raises(WheelError, match="slim path 'kern/gone.so' is not in the wheel"):
        rewrite_wheel(src, tmp_path / "o1" / src.name, slim=pol.slim["kern"])
    pol = parse_policy(POLICY_HEAD + _edit("kern", "kern/table.py", "absent", "x"))
    with pytest.raises(WheelError, match="pattern matched 0 time"):
        rewrite_wheel(src, tmp_path / "o2" / src.name, edits=pol.edits_for("kern"))
    # A wheel whose file changed behind RECORD's back fails the check.
    bad = tmp_path / "bad.whl"
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(bad, "w") as zout:
        for info in zin.infolist():
            data = zin.read(info)
            zout.writestr(info, data + b"# tampered\n" if info.filename == "kern/table.py" else data)
    with pytest.raises(WheelError, match="RECORD hash/size of kern/table.py"):
        verify_record(bad)


# ---- policy validation

@pytest.mark.parametrize("text, message", [
    ('[skip]\nfoo = ""\n', r"\[skip\] foo needs a non-empty reason"),
    ('[bogus]\nx = 1\n', r"top level has unknown key 'bogus'"),
    ('[conflict.foo]\nuse = "maybe"\nreason = "r"\n', r"\[conflict.foo\] use: expected \"host\""),
    ('[conflict.foo]\nuse = "host"\n', r"\[conflict.foo\] needs a non-empty reason"),
    ('[conflict.foo]\nuse = "host"\nreason = "r"\nextra = 1\n', r"\[conflict.foo\] has unknown key 'extra'"),
    ('[pin.foo]\nversion = "about 2"\nreason = "r"\n', r"\[pin.foo\] version must be a version specifier"),
    ('[slim.foo]\nremove = []\nreason = "r"\n', r"\[slim.foo\] remove must be a non-empty list"),
    ('[slim.foo]\nremove = ["../etc"]\nreason = "r"\n', r"must be a relative path"),
    (_edit("foo", "f.py", "(", ""), r"pattern is not a valid regular expression"),
    (_edit("foo", "f.py", "a", "b") + "count = 0\n", r"count must be an integer >= 1"),
    ('[skip]\nfoo = "r"\n[conflict.foo]\nuse = "host"\nreason = "r"\n', r"foo is both skipped and in \[conflict.foo\]"),
    ('[skip]\n"bad name!" = "r"\n', r"is not a valid package name"),
])
def test_policy_errors_name_the_key(text, message):
    with pytest.raises(PolicyError, match=message):
        parse_policy(POLICY_HEAD + text, "p.toml")


def test_policy_needs_upstream_and_valid_toml(tmp_path):
    with pytest.raises(PolicyError, match=r"p.toml: missing \[upstream\]"):
        parse_policy('[skip]\nfoo = "r"\n', "p.toml")
    with pytest.raises(PolicyError, match="not valid TOML"):
        parse_policy("[skip\n", "p.toml")
    with pytest.raises(PolicyError, match="--policy"):
        load_policy(tmp_path / "absent.toml")


def test_checked_in_policy_is_valid_and_explains_every_entry():
    pol = load_policy(REPO / "deploy/wheelhouse-policy.toml")
    assert pol.upstream_name == "sglang" and pol.upstream_version == "0.5.16"
    assert pol.conflict["transformers"].use == "ship" and pol.conflict["tokenizers"].use == "host"
    assert "sgl_kernel/flash_ops.abi3.so" in pol.slim["sglang-kernel"].remove
    assert all(len(r) > 20 for r in pol.skip.values())


# ---- wheelhouse output and install.sh

def _write(tmp, wheels, split=None):
    """wheels: (name, version, manifest version, __init__.py, size of an incompressible blob, role);
    split None: room for one wheel + the 512 KiB per-part reserve."""
    entries = []
    for n, v, mv, init, blob, role in wheels:
        p = make_wheel(tmp / "wheels", n, v, {f"{n}/__init__.py": init, f"{n}/blob.bin": os.urandom(blob)})
        entries.append(WheelEntry(name=n, version=mv, filename=p.name, path=p, sha256=sha256_of(p),
                                  size=p.stat().st_size, role=role))
    split = split or max(e.size for e in entries) + 600 * 1024
    manifest, sizes = write_wheelhouse(tmp / "wh", entries, split, {"root": {"name": "sglang"}}, [], "report\n")
    assert all(s <= split for s in sizes.values())
    return tmp / "wh", manifest


def _wheelhouse(tmp, fork=False):
    """alpha, beta and sglang of 100 kB each, never two in a part."""
    return _write(tmp, [("alpha", "1.0", "1.0", b"A = 1\n", 100_000, "dependency"),
                        ("beta", "2.0", "2.0", b"B = 2\n", 100_000, "dependency"),
                        ("sglang", "0.5.16", "0.5.16", b"__version__ = '0.5.16'\n", 100_000,
                         "fork" if fork else "upstream")])


def _sh(*args, env=None, cwd=None, rc=0):
    """bash ARGS; its exit status must be rc (None: unchecked)."""
    full_env = {**os.environ, "PYTHON": sys.executable, **(env or {})}
    r = subprocess.run(["bash", *map(str, args)], capture_output=True, text=True, env=full_env, cwd=cwd)
    assert rc is None or r.returncode == rc, r.stdout + r.stderr
    return r


def test_manifest_lists_every_wheel_with_hash_and_part(tmp_path):
    out, manifest = _wheelhouse(tmp_path)
    on_disk = json.loads(text := (out / "manifest.json").read_text())
    assert on_disk["wheels"] == manifest["wheels"] and len(on_disk["wheels"]) == 3
    assert len(manifest["parts"]) == 3  # the split size leaves room for one wheel per part
    for w in on_disk["wheels"]:
        path = out / w["part"] / w["filename"]
        assert sha256_of(path) == w["sha256"] and path.stat().st_size == w["size"]
        assert {"name", "version", "sha256", "part", "role"} <= set(w)
        assert (out / w["part"] / "manifest.json").read_text() == text
        assert os.access(out / w["part"] / "install.sh", os.X_OK)
    assert {w["role"] for w in on_disk["wheels"]} == {"dependency", "upstream"}


def test_install_sh_installs_offline_and_deps_only(tmp_path):
    out, _ = _wheelhouse(tmp_path)
    site = tmp_path / "site"
    r = _sh(out / "install.sh", site)
    assert (site / "alpha" / "__init__.py").is_file() and (site / "sglang" / "__init__.py").is_file()
    assert f"export PYTHONPATH={site}" in r.stdout
    site2 = tmp_path / "site2"
    _sh(out / "install.sh", "--deps-only", site2)
    assert (site2 / "beta").is_dir() and not (site2 / "sglang").exists()


def _install_damaged(out, rel, at):
    """Byte `at` of out/rel flipped: install.sh names the file and installs nothing."""
    data = bytearray((out / rel).read_bytes())
    data[at] ^= 0xFF
    (out / rel).unlink()  # the file may be a hard link to the source wheel: replace, don't edit in place
    (out / rel).write_bytes(bytes(data))
    r = _sh(out / "install.sh", out.parent / "site", rc=1)
    assert f"sha256 mismatch for {rel}" in r.stderr
    assert not (out.parent / "site").exists()
    return r


def test_install_sh_refuses_a_corrupted_wheel_or_a_missing_part(tmp_path):
    out, manifest = _wheelhouse(tmp_path)
    victim = manifest["wheels"][0]
    r = _install_damaged(out, f"{victim['part']}/{victim['filename']}", 100)
    assert r.stderr.strip().count("\n") == 0
    out2, manifest2 = _wheelhouse(tmp_path / "again")
    gone = sorted(manifest2["parts"])[-1]
    for f in (out2 / gone).glob("*.whl"):
        f.unlink()
    r = _sh(out2 / "install.sh", tmp_path / "site3", rc=1)
    assert f"{gone} is missing or incomplete" in r.stderr
    r = _sh(out2 / "install.sh", "--status")
    assert f"{gone}: missing" in r.stdout


def _pieced_wheelhouse(tmp):
    """alpha (90 kB) and beta (360 kB) with parts of ~100 kB usable: beta travels as 4 pieces."""
    out, manifest = _write(tmp, [("alpha", "1.0", "1", b"A = 1\n", 90_000, "dependency"),
                                 ("beta", "2.0", "1", b"B = 2\n", 360_000, "dependency")], 512 * 1024 + 100_000)
    return out, manifest, {w["name"]: w for w in manifest["wheels"]}


def test_a_wheel_larger_than_a_part_travels_as_checked_pieces_and_installs(tmp_path):
    out, manifest, by_name = _pieced_wheelhouse(tmp_path)
    beta = by_name["beta"]
    assert beta["part"] == "" and len(beta["pieces"]) == 4
    assert len({p["part"] for p in beta["pieces"]}) == 4  # one piece a part: each is ~90 kB of ~100
    joined = b"".join((out / p["part"] / p["file"]).read_bytes() for p in beta["pieces"])
    assert hashlib.sha256(joined).hexdigest() == beta["sha256"] and len(joined) == beta["size"]
    for p in beta["pieces"]:
        assert sha256_of(out / p["part"] / p["file"]) == p["sha256"]
    assert sum(part["pieces"] for part in manifest["parts"].values()) == 4
    r = _sh(out / "install.sh", "--verify-only", "--part", beta["pieces"][1]["part"])
    assert "verified 1 file(s)" in r.stdout
    site = tmp_path / "site"
    _sh(out / "install.sh", site)
    assert (site / "beta" / "blob.bin").stat().st_size == 360_000 and (site / "alpha").is_dir()
    assert sha256_of(out / "joined" / beta["filename"]) == beta["sha256"]


def test_a_damaged_or_missing_piece_is_named_and_nothing_installs(tmp_path):
    out, _, by_name = _pieced_wheelhouse(tmp_path)
    piece = by_name["beta"]["pieces"][2]
    _install_damaged(out, f"{piece['part']}/{piece['file']}", 10)
    assert not (out / "joined").exists()
    (out / piece["part"] / piece["file"]).unlink()
    r = _sh(out / "install.sh", "--status", rc=None)
    assert f"{piece['part']}: missing" in r.stdout
    r = _sh(out / "install.sh", tmp_path / "site", rc=1)
    assert f"{piece['part']} is missing or incomplete" in r.stderr


def test_stage_carries_pieces(tmp_path):
    out, manifest, by_name = _pieced_wheelhouse(tmp_path)
    stage = tmp_path / "stage"
    for part in sorted(manifest["parts"]):
        _sh(STAGE_SH, out / part, env={"STAGE_DIR": str(stage)})
    _sh(stage / "install.sh", tmp_path / "site")
    assert (tmp_path / "site" / "beta" / "blob.bin").is_file()


def test_out_dir_that_is_not_a_wheelhouse_is_refused(tmp_path):
    (tmp_path / "precious.txt").write_text("keep me")
    with pytest.raises(OutputError, match="not a wheelhouse"):
        check_out_dir(tmp_path)


# ---- GPU-host staging scripts

def test_stage_then_gpu_host_install_with_a_prebuilt_fork(tmp_path):
    out, manifest = _wheelhouse(tmp_path, fork=True)
    site, env = tmp_path / "site", {"STAGE_DIR": str(tmp_path / "stage")}
    parts = sorted(manifest["parts"])
    r = _sh(STAGE_SH, out / parts[0], env=env)
    assert f"{parts[1]}: missing" in r.stdout and f"{parts[0]}: present" in r.stdout
    assert r.stdout.splitlines()[-1] == "stage.sh: still missing: " + " ".join(parts[1:])
    r = _sh(INSTALL_SH, site, env=env, rc=1)  # not everything staged yet
    assert "is missing or incomplete" in r.stderr
    r = _sh(STAGE_SH, *(out / p for p in parts[1:]), env=env)
    assert r.stdout.splitlines()[-1] == "stage.sh: every part staged (next: deploy/install.sh)"
    other, _ = _wheelhouse(tmp_path / "other")  # a different build (upstream role): manifests differ
    r = _sh(STAGE_SH, other / parts[0], env=env, rc=1)
    assert "belongs to another wheelhouse build" in r.stderr
    r = _sh(INSTALL_SH, site, env=env, cwd=tmp_path)
    assert f"export PYTHONPATH={site}" in r.stdout
    assert (site / "sglang" / "__init__.py").is_file() and (site / "alpha").is_dir()


def test_stage_rejects_a_folder_that_is_not_a_part(tmp_path):
    (tmp_path / "junk").mkdir()
    r = _sh(STAGE_SH, tmp_path / "junk", env={"STAGE_DIR": str(tmp_path / "stage")}, rc=1)
    assert "not a part of a wheelhouse" in r.stderr


# ---- the CLI end to end, index faked

def test_cli_end_to_end_with_a_fake_index(tmp_path, monkeypatch, capsys):
    src = tmp_path / "index"
    wheels = {"sglang": make_wheel(src, "sglang", "0.5.16", requires=("kern==0.4.5", "trf==5.12.1", "numpy", "heavy")),
              "kern": _kernel_wheel(tmp_path), "forkdep": make_wheel(src, "forkdep", "1.0"),
              "trf": make_wheel(src, "trf", "5.12.1", {"trf/table.py": b'"tok": "tok<=0.23.0"\n'}, requires=("tok<=0.23.0",))}
    index = {n: {v: requires} for n, v, requires in map(read_metadata, wheels.values())}
    policy, tok = tmp_path / "policy.toml", '[conflict.tok]\nuse = "host"\nreason = "patch release; pin relaxed below"\n'
    policy.write_text("""[upstream]
name = "sglang"
version = "0.5.16"
[skip]
heavy = "not needed to serve"
[conflict.trf]
use = "ship"
reason = "host version breaks registration"
""" + tok + """[slim.kern]
remove = ["kern/flash_ops.so", "kern/sm100/"]
reason = "unused attention kernels"
""" + _edit("trf", "trf/table.py", r"<=0\.23\.0", "<0.24", "host has tok 0.23.2"))
    freeze = tmp_path / "freeze.txt"
    freeze.write_text("numpy==2.5.2\ntrf==5.17.0\ntok==0.23.2\n")
    pin = tmp_path / "UPSTREAM.toml"  # the fork build's pin: its Requires-Dist changes must be resolved too
    pin.write_text('[upstream]\npackage = "sglang"\ndefault = "0.5.16"\n[fork]\nlocal = "sm120.1"\n'
                   '[base."0.5.16".wheels]\n'
                   f'"{wheels["sglang"].name}" = "{sha256_of(wheels["sglang"])}"\n'
                   '[base."0.5.16".requires_dist]\nadd = [{requirement = "forkdep>=1", reason = "fork needs it"}]\n'
                   'remove = [{requirement = "numpy", reason = "fork drops it"}]\n')
    monkeypatch.setattr(wheelhouse, "PipSelector", lambda target, log=print: FakeIndex(index, wheels))
    out = tmp_path / "wh"
    common = ["--policy", str(policy), "--cache-dir", str(tmp_path / "cache"), "--upstream-pin", str(pin)]
    rc = wheelhouse.main(["--python", "3.12", "--exclude-from", str(freeze), "--split-mb", "1", "--out", str(out),
                          *common])
    text = capsys.readouterr().out
    assert rc == 0, text
    manifest = json.loads((out / "manifest.json").read_text())
    by_name = {w["name"]: w for w in manifest["wheels"]}
    assert set(by_name) == {"sglang", "kern", "trf", "forkdep"}  # tok comes from the target, heavy is skipped
    assert by_name["sglang"]["role"] == "upstream"
    assert by_name["kern"]["modified"]["removed_count"] == 3
    assert by_name["trf"]["modified"]["edits"][0]["file"] == "trf/table.py"
    for w in manifest["wheels"]:
        assert sha256_of(out / w["part"] / w["filename"]) == w["sha256"]
    actions = {(d["package"], d["action"]) for d in manifest["decisions"]}
    assert {("trf", "ship-over-target"), ("tok", "keep-target-version"), ("heavy", "skip")} <= actions
    assert "numpy" not in {d["package"] for d in manifest["decisions"]}  # removed by the fork's pin
    for word in ("OVERRIDE trf==5.12.1", "KEEP-TARGET tok==0.23.2", "SKIP heavy", "SLIM kern", "EDIT trf",
                 "+forkdep>=1, -numpy"):
        assert word in text
    # The pin and the policy must name the same upstream release.
    pin.write_text(pin.read_text().replace('"0.5.16"', '"0.5.17"'))
    rc = wheelhouse.main(["--out", str(tmp_path / "wh3"), *common])
    assert rc == 2 and "differs from" in capsys.readouterr().err
    pin.write_text(pin.read_text().replace('"0.5.17"', '"0.5.16"'))
    # Without the conflict decision for tok the tool refuses and says what to add.
    policy.write_text(policy.read_text().replace(tok, ""))
    rc = wheelhouse.main(["--exclude-from", str(freeze), "--out", str(tmp_path / "wh2"), *common])
    err = capsys.readouterr().err
    assert rc == 2 and "undecided: tok" in err and "[conflict.NAME]" in err
