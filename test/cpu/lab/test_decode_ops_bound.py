"""lab/decode_ops_bound.py: its model matches layout.py's decode, and its search is not vacuous."""
from repo_scripts import load

import pytest

pytestmark = pytest.mark.base_independent

bound = load("lab/decode_ops_bound.py")


def test_model_is_layout_py_decode():
    from sglang.sm120.kernels import layout

    # value 2p + h of pair p sits in half h; its 4 bits (mantissa, exp0, exp1, sign) land on T[4h..4h+3]
    for p, rotations in enumerate(bound.LAYOUT_PY):
        for h in range(2):
            for j, src in enumerate(layout.ENC_BITS[2 * p + h]):
                assert src == (bound.T[4 * h + j] + rotations[4 * h + j]) % bound.N, (p, h, j)
    bound.check_model_accepts_layout_py()


def test_search_finds_layout_py_rotations_and_nothing_cheaper_than_8():
    assert bound.covers((0, 4, 6, 10, 14), 5)  # layout.py: 4 SHF + 5 LOP3
    assert not bound.covers((0, 4, 6, 10, 14), 4)  # one piece per pair: no tiling
    assert bound.layouts_within(7) == []


def test_two_word_search_finds_covers_where_they_exist_and_none_for_t():
    tiling = (0, 1, 2, 3, 16, 17, 18, 19)  # tiles a word by rotations 0, 4, 8, 12
    assert bound.two_word_full_cover(tiling) is not None
    assert bound.two_word_nine_pieces(tiling) is not None
    assert bound.two_word_full_cover() is None  # T: no 8 sources partition the two words
