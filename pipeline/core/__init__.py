"""The bottom layer: errors, the parameters' defaults and checks, seeds, paths and storage (the one
place that knows local from remote), and persistence (JSON plus arrays, never a pickle). Imports
nothing of the pipeline.
"""
