# storetopics: the PostgreSQL extension (PGXS, like pgvector) and the project's own targets.
#   make setup   install what is missing on this Debian machine (idempotent)
#   make demo    embedded local Postgres + real data + summaries
#   make test    every test: SQL regression (pg_regress) and pytest, each against a real throwaway Postgres
#   make bench   side-by-side measurements, written to bench/results/
#   make soak    opt-in: the worker under 10 minutes of churn, memory bounded
#   make bench-large  opt-in: the scaling curves with 5M chunks too (check df: see bench/README.md)
#   make eval    routing accuracy of the summaries vs names and hand-written descriptions, needle, report
EXTENSION  = storetopics
EXTVERSION = $(shell sed -n "s/^default_version *= *'\(.*\)'/\1/p" storetopics.control)
PREVIOUS   = 0.1
# sql/storetopics--$(EXTVERSION).sql and the upgrade from $(PREVIOUS) are built from sql/incremental and
# sql/idempotent by `make sql` (and committed: the Python package ships them); older versioned scripts are frozen.
SQL_BUILT  = sql/storetopics--$(EXTVERSION).sql sql/storetopics--$(PREVIOUS)--$(EXTVERSION).sql
DATA       = $(sort $(wildcard sql/storetopics--*.sql) $(SQL_BUILT)) plpy/storetopics_clustering.py
REGRESS    = $(patsubst test/sql/%.sql,%,$(sort $(wildcard test/sql/*.sql)))
REGRESS_OPTS = --inputdir=test --outputdir=$(REGRESS_OUTDIR) --load-extension=vector
REGRESS_OUTDIR ?= test/out
# The server to build for, as with pgvector: the pg_config on PATH (Debian's picks the newest server headers
# installed), or name one: `make PG_CONFIG=/usr/lib/postgresql/16/bin/pg_config install`.  Exported, so setup.sh
# and the throwaway test servers (lab/localpg.py: its --bindir) use the same server.
PG_CONFIG ?= pg_config
export PG_CONFIG
PGXS := $(shell $(PG_CONFIG) --pgxs 2>/dev/null)
ifneq ($(wildcard $(PGXS)),)
include $(PGXS)
endif

VENV   ?= .venv
PY     := $(VENV)/bin/python
SUDO   := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: setup demo test pytest regress bench bench-large soak ext-install eval sql lint doc-corpus
setup:
	@bash scripts/setup.sh

SQL_SOURCES = sql/build.sh $(wildcard sql/incremental/*/*.sql) $(wildcard sql/idempotent/*.sql)
sql: $(SQL_BUILT)
sql/storetopics--$(EXTVERSION).sql: $(SQL_SOURCES)
	sh sql/build.sh install $(EXTVERSION) > $@
sql/storetopics--$(PREVIOUS)--$(EXTVERSION).sql: $(SQL_SOURCES)
	sh sql/build.sh upgrade $(PREVIOUS) $(EXTVERSION) > $@

# Installs the extension files into the server's share directory (root needed, hence sudo when not root).
# PG_CONFIG as an absolute path: sudo resets PATH, and setup may just have installed pg_config.
ext-install: setup
	@$(SUDO) $(MAKE) --no-print-directory -s install PG_CONFIG="$$(command -v $(PG_CONFIG))"

demo: ext-install
	$(PY) -m lab.demo

# lint, pg_regress on a throwaway cluster, then pytest (which starts its own clusters; tests/test_package.py builds
# the wheel and runs it from a fresh virtualenv, tests/test_upgrade.py upgrades a populated 0.1 database).
test: ext-install lint
	$(PY) -m tests.harness regress
	$(PY) -m pytest -q tests

regress: ext-install
	$(PY) -m tests.harness regress

pytest: ext-install
	$(PY) -m pytest -q tests

# The document corpus (scripts/doc_corpus.py, .cache/doc-corpus/): the realistic text of bench.scale --text docs
# and the routing evaluation's document stores.  Built when missing, with what building it needs (man-db,
# groff-base, bsdextrautils, BeautifulSoup) installed when missing.
doc-corpus: setup
	@bash scripts/doc_corpus_setup.sh

bench: ext-install doc-corpus
	$(PY) -m bench.startup
	$(PY) -m bench.route
	$(PY) -m bench.run
	$(PY) -m bench.catalog
	$(PY) -m bench.clusters
	$(PY) -m bench.worker
	$(PY) -m bench.scale --sizes 10000,100000,1000000
	$(PY) -m bench.scale --text docs --sizes 10000,100000,1000000

# Opt-in: the scaling curves of bench.scale with 5M chunks added, short and realistic text (the 5M tables and their
# state need tens of GB of disk, see bench/README.md; check `df` first).  Writes bench/results/scale-latest.md,
# scale.png, scale-docs-latest.md and scale-docs.png like make bench.
bench-large: ext-install doc-corpus
	$(PY) -m bench.scale --sizes 10000,100000,1000000,5000000
	$(PY) -m bench.scale --text docs --sizes 10000,100000,1000000,5000000

# ruff over the package, the lab, the benchmarks and the tests (configuration in pyproject.toml).
lint: setup
	$(VENV)/bin/ruff check bgworker lab bench tests plpy scripts

# Opt-in: 10 minutes of steady churn on a 50k-chunk 1536-d store under a running worker; its memory is sampled
# (target <= 1 GB).  Writes bench/results/worker-soak-latest.md.
soak: ext-install
	$(PY) -m bench.worker --soak 600

# Routing evaluation, drift, needle and label quality (real Postgres; all-MiniLM-L6-v2 embeddings cached in
# .cache/embeddings/).  Installs the optional extra `eval` (CPU torch first) when missing.  Writes
# bench/results/eval.json, report.md and eval-*.png.  EVAL_ARGS='--quick' for a smoke run.
eval: ext-install
	@bash scripts/eval_setup.sh
	$(PY) -m lab.evaluation all $(EVAL_ARGS)
