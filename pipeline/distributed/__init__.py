"""The distributed pass loop and what runs around it: Dask client, write-out, summaries, runs."""
