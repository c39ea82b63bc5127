"""Tests of ``kernels/``."""
