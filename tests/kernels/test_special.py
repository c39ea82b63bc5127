"""``kernels.special.log_gamma_ratio``, the Student-t constant's gamma ratio, against SciPy."""

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.special import gammaln, poch

from kernels.special import log_gamma_ratio


@settings(max_examples=200, deadline=None)
@given(
    a=st.floats(1e-3, 1e6),
    d=st.integers(0, 40),
    r=st.floats(1e-6, 1e6),
)
def test_log_gamma_ratio_is_the_log_of_the_pochhammer_symbol(a: float, d: int, r: float) -> None:
    """log [Gamma(a + d / 2) / Gamma(a) r^(d / 2)] equals the logarithm of SciPy's ``poch(a,
    d / 2)`` (the same ratio by its own algorithm) plus d / 2 log r, to 1e-12 of the terms."""
    ref_poch = poch(a, 0.5 * d)
    if not 1e-290 < ref_poch < 1e290:
        ref = gammaln(a + 0.5 * d) - gammaln(a)
    else:
        ref = math.log(ref_poch)
    ref += 0.5 * d * math.log(r)
    got = log_gamma_ratio(a, d, r)
    scale = abs(gammaln(a + 0.5 * d)) + abs(gammaln(a)) + abs(0.5 * d * math.log(r)) + 1.0
    assert abs(got - ref) <= 1e-12 * scale


def test_log_gamma_ratio_keeps_the_digits_lgamma_differences_lose() -> None:
    """For a cluster of 10^8 records (a = 5e7, d = 10) the product form agrees with the
    Pochhammer symbol to 1e-13 relative, where lgamma(a + 5) - lgamma(a) is off by about 1e-8."""
    a, d = 5e7, 10
    ref = sum(math.log(a + j) for j in range(5))
    assert abs(log_gamma_ratio(a, d, 1.0) - ref) <= 1e-13 * ref
    assert np.isfinite(log_gamma_ratio(1e-3, 40, 1e-6))
    assert np.isfinite(log_gamma_ratio(1e9, 40, 1e6))
