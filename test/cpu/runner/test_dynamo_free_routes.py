"""Every helper the series routes through compile_unless_dynamo_free (torch_compile_sites.toml
beside this file: patches 0106-0112 of the installed base) runs without Dynamo in Dynamo-free
mode, and still enters Dynamo without it (so the check can fail): each is called on the
installed patched tree with the traps armed in raise mode (an eval-frame callback or
torch.compile raises before anything compiles) and Dynamo's frame counters watched. The calls
are dynamo_free_cases'; the test_dynamo_free_bits_* files compare their outputs with Inductor's.
Also: every routed site has calls there, and the ones whose compiled form is not reproduced
(dynamo_free_cases.NOT_REPRODUCED) are exactly those without a bits comparison."""
import tomllib
from pathlib import Path

import pytest

pytest.importorskip("sglang.srt.layers.sampler")
import dynamo_free_cases as dfc  # noqa: E402
from sglang.sm120 import traps  # noqa: E402

BASE = dfc.installed_base()
CASES = dfc.all_cases(BASE)
TABLE = Path(__file__).with_name("torch_compile_sites.toml")


def routed_sites(base):
    entries = tomllib.loads(TABLE.read_text())["site"]
    return {site for site, e in entries.items() if "routed" in e and base in e.get("bases", [base])}


def test_every_routed_site_has_calls_and_the_unreproduced_ones_are_declared():
    covered = {c.site for c in CASES}
    assert covered == routed_sites(BASE), (covered ^ routed_sites(BASE))
    assert {c.site for c in CASES if not c.bits} == set(dfc.NOT_REPRODUCED)
    assert not {c.site for c in CASES if c.bits} & set(dfc.NOT_REPRODUCED)


@pytest.fixture(scope="module")
def runs(one_thread):
    """key -> (violations and frames in Dynamo-free mode, whether the trap fired without it)."""
    out = {}
    with dfc.stand_ins():
        for case in CASES:
            traps.clear_violations()
            with traps.trapped("dynamo-free route test", mode="raise"):
                _, frames = dfc.outputs(case, True)
            free = {"violations": [v["what"] for v in traps.violations()], "frames": frames}
            traps.clear_violations()
            fired = False
            try:
                with traps.trapped("dynamo-free route test", mode="raise"):
                    dfc.outputs(case, False)
            except traps.TrapViolation:
                fired = True
            traps.clear_violations()
            out[dfc.key(case)] = (free, fired)
    return out


@pytest.mark.parametrize("key", [dfc.key(c) for c in CASES])
def test_dynamo_free_mode_evaluates_no_dynamo_frame(runs, key):
    free, _ = runs[key]
    assert traps.dynamo_trap_error() is None, traps.dynamo_trap_error()
    assert free == {"violations": [], "frames": 0}


@pytest.mark.parametrize("key", [dfc.key(c) for c in CASES])
def test_without_the_mode_the_helper_enters_dynamo(runs, key):
    _, fired = runs[key]
    assert fired
