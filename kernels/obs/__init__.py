"""Conjugate likelihood families (Raykov et al. 2016, Appendix B) over additive sufficient
statistics.

The contract every family module keeps
--------------------------------------
A *group* is a set of ``d`` columns of the record matrix modelled by one family. For one group:

``x`` : ndarray of shape (d,)
    The group's columns of one record (float64; categorical codes are stored as floats).
``s`` : ndarray of shape (S,)
    Additive sufficient statistics of a set of records. ``s[0]`` is always the number of records
    ``n``; the rest is family specific. Statistics of a union are the sum of statistics.
``c`` : ndarray of shape (C,)
    Per-cluster cache derived from ``s`` and ``p`` (posterior parameters, Cholesky factors,
    normalising constants) so that ``log_predictive`` is cheap.
``p`` : ndarray of shape (P,)
    The prior's parameters, flattened (layout documented per module).

and each module defines, all ``@njit(cache=True, nogil=True)``:

``add_stats(x, s, w)``
    ``s += w * g(x)`` (w = +1 adds the record, -1 removes it). Stats only, no cache.
``refresh(s, c, p)``
    Recompute the cache ``c`` from ``s`` (used for a new cluster and after merges).
``update(x, s, c, p, w)``
    Normal-Wishart and categorical only: ``add_stats`` and ``c`` brought up to date cheaper than
    by ``refresh`` (``product`` refreshes the other families).
``log_marginal(s, p) -> float``
    log p(X) of the records summarised by ``s``, parameters integrated out; 0 for n = 0.
``log_predictive(x, s, c, p) -> float``
    log p(x | X) where ``X`` is summarised by ``s`` and ``c`` is current.
``moments(s, p, mean, cov)``
    Fill mean (d,) and covariance (d, d) of the records summarised by ``s`` (the records' own,
    divided by n) where the statistics determine them, NaN elsewhere.

``product.py`` dispatches on a family code per group (a record of mixed column types; its log
terms add). The partition prior, the allocation model, is ``kernels.alloc``.
"""
