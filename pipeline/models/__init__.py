"""In-memory algorithm cores over the kernels: MAP-DP (Algorithm 1), the infinite HMM, the mixed-
effects model, ASUGS, the DP concentration, trees, exact references. Imports ``core``,
``families`` and ``data``.
"""
