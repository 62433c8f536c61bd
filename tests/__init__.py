"""The tests, and the harness they share with the benchmarks and the evaluation: throwaway Postgres servers
(harness.py), chunk tables and an independent recount (helpers.py), local LLM API servers (fakes/).  A package, so
that bench/ and lab/evaluation/ import them as tests.harness and tests.fakes; never shipped."""
