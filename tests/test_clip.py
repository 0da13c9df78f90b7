"""landscape.clip: the one definition of per-sample clipping factors, against the closed forms (Bu et al. Sec. 2.2).

Training (``train/privatize``), the clipping analysis (``analyze/clipping``) and the clipped NTK (``analyze/ntk``)
all take their factors from here; before, each had its own, and the clipping analysis' ``C / max(||g||, C)`` is
checked here to be bit-identical to the shared ``min(1, C / max(||g||, 1e-12))`` for every C >= 1e-12.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from landscape.clip import CLIP_FUNCTIONS, CLIP_STYLES, clip_factors, layer_threshold
from landscape.errors import UsageError

norms_st = st.lists(st.floats(0.0, 1e6, allow_nan=False, allow_subnormal=False), min_size=1, max_size=40)
c_st = st.floats(1e-12, 1e4, allow_nan=False)


@settings(max_examples=200, deadline=None)
@given(norms=norms_st, c=c_st)
def test_abadi_is_min_one_c_over_norm(norms, c):
    """The closed form min(1, C/||g||) (Abadi et al. 2016; Watson et al. eq. (2)), factor 1 for a zero gradient."""
    n = torch.tensor(norms, dtype=torch.float64)
    got = clip_factors(n, c).numpy()
    want = np.array([1.0 if g == 0 else min(1.0, c / g) for g in norms])
    assert np.allclose(got, want, rtol=4e-16, atol=0)  # torch's scalar / tensor is a reciprocal times C: 1 ulp
    assert (got[np.array(norms) < c * (1 - 1e-15)] == 1.0).all()  # exactly 1 where the gradient is not clipped
    assert (got * np.array(norms) <= c * (1 + 1e-15)).all()


@settings(max_examples=200, deadline=None)
@given(norms=norms_st, c=c_st)
def test_the_clipping_analysis_variant_is_bit_identical(norms, c):
    """``analyze/clipping`` used ``C / max(||g||, C)`` (float64): the same bits as the shared definition wherever a
    gradient is clipped (torch divides a scalar by a tensor as ``C * (1/||g||)`` in both); where none is, the old
    one gave ``C * (1/C)``, which may be 1 ulp below 1, and the shared one 1 (at ``||g|| = C`` both may be)."""
    n = torch.tensor(norms, dtype=torch.float64)
    old, new = c / torch.clamp(n, min=c), clip_factors(n, c)
    clipped = n > c
    assert torch.equal(new[clipped], old[clipped].clamp(max=1.0))
    assert torch.allclose(old[~clipped], new[~clipped], rtol=2.3e-16, atol=0)


def test_the_other_functions_and_styles():
    n = torch.tensor([0.0, 0.5, 1.0, 2.0, 4.0], dtype=torch.float64)
    c = 1.0
    assert torch.equal(clip_factors(n, c, "automatic"), c / (n + 0.01))
    assert torch.equal(clip_factors(n[1:], c, "normalize"), c / n[1:])
    assert torch.equal(clip_factors(n, c, "global"), torch.tensor([1.0, 1, 1, 0, 0], dtype=torch.float64))
    assert set(CLIP_FUNCTIONS) == {"abadi", "automatic", "normalize", "global"}
    assert CLIP_STYLES == ("flat", "layerwise")
    assert layer_threshold(2.0, 4) == 1.0 and math.isclose(layer_threshold(1.0, 3) ** 2 * 3, 1.0)
    assert clip_factors(torch.tensor([3.0]), 1.0).dtype == torch.float32  # the norms' dtype (training: float32)
    with pytest.raises(UsageError, match="unknown clipping function 'nope'"):
        clip_factors(n, c, "nope")


def test_one_home():
    """Training, the clipping analysis and the NTK reach the same function object (no second definition)."""
    from landscape.analyze import clipping
    from landscape.analyze import ntk_kernels as ntk
    from landscape.train import privatize

    assert getattr(privatize, "clip_factors", clip_factors) is clip_factors and privatize.CLIP_FUNCTIONS is CLIP_FUNCTIONS
    assert clipping.clip_factors is clip_factors and ntk.clip_factors is clip_factors
    assert not hasattr(ntk, "clipping_factors")  # no wrapper beside the one function
