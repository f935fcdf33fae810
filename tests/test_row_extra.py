"""A ``capture_batch`` row's ``extra`` (``producer._plain``): what the producer keeps is exactly
what the readers' rule (``notice.plain_value_problem``) accepts, whichever path takes it.

``_plain`` keeps an exact builtin leaf (str, bytes, float, bool, None, an int inside msgpack's
range) under a str key as it is, without the general checks (~0.6 us a row on the capturing
thread); everything else goes through them. Either way the answer must be the rule's: the value
kept (numpy and torch scalars as Python ones), or a ``CaptureConfigError`` for a value every
reader would reject, before a sequence number is taken.
"""

from __future__ import annotations

import msgpack
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hscapture import notice as nt
from hscapture.errors import CaptureConfigError
from hscapture.producer import _plain


class Str(str):
    """A str subclass: not an exact leaf, so the general path takes it."""


_EDGES = [-(1 << 63), -(1 << 63) - 1, (1 << 64) - 1, 1 << 64, 0, -1, True, False]
values = st.one_of(
    st.none(), st.booleans(), st.floats(allow_nan=False), st.text(max_size=8),
    st.binary(max_size=8), st.sampled_from(_EDGES), st.integers(-(1 << 70), 1 << 70),
    st.builds(Str, st.text(max_size=4)), st.builds(bytearray, st.binary(max_size=4)),
    st.lists(st.integers(-5, 5), max_size=3),
    st.dictionaries(st.one_of(st.text(max_size=3), st.integers(0, 3)), st.integers(0, 3),
                    max_size=2),
    st.just(msgpack.ExtType(3, b"x")), st.just(np.int64(7)), st.just(np.float32(0.5)),
    st.just(torch.tensor(3)))
keys = st.one_of(st.text(max_size=6), st.builds(Str, st.text(max_size=3)), st.integers(0, 3))


def _rule(extra: dict) -> dict | None:
    """What the readers' rule keeps of ``extra``, or None when it is refused."""
    out = {}
    for k, v in extra.items():
        if not isinstance(k, str):
            return None
        if isinstance(v, (np.generic, torch.Tensor)) and getattr(v, "ndim", 0) == 0:
            v = v.item()
        if nt.plain_value_problem(v, 1):
            return None
        out[k] = v
    return out


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(keys, values, max_size=4))
def test_a_rows_extra_is_kept_exactly_as_the_readers_rule_says_whichever_path_takes_it(extra):
    want = _rule(extra)
    if want is None:
        with pytest.raises(CaptureConfigError):
            _plain(extra, "row 'r' extra")
        return
    got = _plain(extra, "row 'r' extra")
    assert got == want and list(got) == list(want)
    assert all(type(got[k]) is type(want[k]) for k in got)
    assert got is not extra                       # a copy: the caller's map may change later


@pytest.mark.parametrize("value", [1 << 64, -(1 << 63) - 1])
def test_an_int_outside_msgpacks_range_is_refused_by_name(value):
    with pytest.raises(CaptureConfigError, match="outside msgpack's range"):
        _plain({"n": value}, "row 'r' extra")
