"""Tests of ``flows/``."""
