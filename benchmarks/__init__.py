"""pgnb benchmarks: `python -m benchmarks` runs every row of the performance table (see __main__.py)."""
