"""Public likelihood-family objects (Raykov et al. 2016, Appendix B) and the product family.

Each object holds its prior, checks its columns and hands flat arrays to the kernels in
``kernels/obs``; everything else (MAP-DP costs, BHC merge probabilities, held-out densities) is
built from ``log_marginal`` and ``log_predictive`` over additive sufficient statistics. The layer
also holds ``Stats``, the column ``schema`` and cluster ``profile``s; it imports only
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
