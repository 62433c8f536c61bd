"""Side-by-side benchmarks of storetopics (attached vs unattached chunk tables).  Run with `make bench`."""
