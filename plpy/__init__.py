"""Python that runs inside PostgreSQL through plpython3u; the worker and the CLI import the same module."""
