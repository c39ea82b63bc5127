"""Tests of ``pipeline/``."""
