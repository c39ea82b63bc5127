"""``fit_distributed`` imports from ``pipeline.distributed``, where the README documents it."""

from __future__ import annotations

import warnings

import pytest


def test_fit_distributed_from_the_package() -> None:
    import pipeline.distributed as dist
    from pipeline.distributed.fit import fit_distributed

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the documented place: no DeprecationWarning
        from pipeline.distributed import fit_distributed as documented
    assert documented is fit_distributed
    assert "fit_distributed" in dist.__all__
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        dist.nothing  # noqa: B018
