"""A run's steps behind each command (run, score, hmm, longitudinal, stage 2, cv, schedule,
report), called by the Prefect flows of ``flows/``. The top layer of the pipeline.
"""
