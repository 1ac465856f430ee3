"""lab/repeat_probe.py: variant parsing and where two greedy batches first differ."""
import pytest
from repo_scripts import load

pytestmark = pytest.mark.base_independent

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
