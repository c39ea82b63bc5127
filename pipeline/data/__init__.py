"""Data: input readers and sources, ingest, the dataset and state stores, generated data sets.
Imports ``core`` and ``families``.
"""
