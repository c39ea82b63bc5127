"""Public likelihood-family objects (Raykov et al. 2016, Appendix B) and the product family.

Each object holds its prior in the seed's parameterisation, checks the columns it is given, and
hands flat arrays to the numba kernels in ``kernels/obs``. ``log_marginal(X)`` and
``log_predictive(x, X)`` are the two questions every family answers; everything else in the
project (MAP-DP costs, BHC merge probabilities, Metropolis-Hastings ratios, held-out densities)
is built from them over additive sufficient statistics.

The layer also holds ``Stats`` (``stats.py``: those statistics carried with their family, the
one currency), the column schema from user data to the float matrix the kernels see
(``schema.py``) and cluster profiles read from statistics (``profile.py``). It imports only
``pipeline.core``.
"""

from __future__ import annotations

from pipeline.families.base import Family, FloatArray, ProductFamily, as_product, check_summaries
from pipeline.families.counts import (
    Bernoulli,
    Binomial,
    Categorical,
    Exponential,
    Geometric,
    Poisson,
)
from pipeline.families.gaussian import GaussianNW, NormalGamma

FAMILIES: dict[str, type[Family]] = {
    "gaussian": GaussianNW,
    "diag-gaussian": NormalGamma,
    "categorical": Categorical,
    "poisson": Poisson,
    "binomial": Binomial,
    "bernoulli": Bernoulli,
    "exponential": Exponential,
    "geometric": Geometric,
}

__all__ = [
    "FAMILIES",
    "Bernoulli",
    "Binomial",
    "Categorical",
    "Exponential",
    "Family",
    "FloatArray",
    "GaussianNW",
    "Geometric",
    "NormalGamma",
    "Poisson",
    "ProductFamily",
    "as_product",
    "check_summaries",
]
