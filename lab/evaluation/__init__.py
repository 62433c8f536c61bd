"""The evaluation harness (`make eval`, `python -m lab.evaluation routing`): does a store's summary route queries to it?

Modules: data (corpus, split, queries), metrics (accuracy, recall@k, confidence intervals), routers (the store
descriptions compared and the two routers: nearest embedding, BM25), pg (the real Postgres the stores live in),
routing (the routing benchmark and the drift scenario), needle (needle and flood benchmarks), quality (ledger,
NMI and topic diversity), report (JSON, Markdown, PNG), run (the command line).
"""
