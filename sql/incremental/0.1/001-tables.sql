-- storetopics 0.1: the tables, as 0.1 created them (run once, by the install script or the 0.1 -> 0.2 upgrade
-- never: they exist there).
CREATE TABLE storetopics.meta (
  key   text PRIMARY KEY,
  value text NOT NULL
);
INSERT INTO storetopics.meta VALUES ('version', '0.1');

-- One row per attached chunk table.
CREATE TABLE storetopics.sources (
  id               int GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  chunks           regclass NOT NULL UNIQUE,
  owner            name NOT NULL,               -- the role that owned the table when it was attached
  store_key        text NOT NULL,               -- SQL expression over the chunk row `c`, as given
  file_key         text NOT NULL,
  content          text NOT NULL,
  embedding        text,                        -- column name, NULL for keyword-only
  store_sql        text NOT NULL,               -- the same, normalised: c.col or (expression)
  file_sql         text NOT NULL,
  content_sql      text NOT NULL,
  file_type        regtype NOT NULL,            -- type of the file key expression (lets fold use the app's indexes)
  ts_config        regconfig NOT NULL DEFAULT 'pg_catalog.english',
  settings         jsonb NOT NULL DEFAULT '{}',
  capture_function text NOT NULL,               -- storetopics.capture_<id>()
  null_key_rows    bigint NOT NULL DEFAULT 0,   -- rows whose file key is NULL (never counted)
  -- attach(..., files_table => ...): the table that lists the files when only it knows a file's store (the store
  -- key looks it up); an UPDATE or DELETE of its rows logs their files_key (= the chunks' file key) as touched.
  files_table      regclass,
  files_key        text,
  -- attach(..., mirror => ...): render() also writes each store's summary into mirror.mirror_column of the row
  -- whose mirror_key::text = the store key (see _mirror_summary).
  mirror           regclass,
  mirror_key       text,
  mirror_column    text,
  folded_at        timestamptz,
  attached_at      timestamptz NOT NULL DEFAULT now()
);

-- The change log the triggers append to; fold() consumes it.  No unique constraint: appends never wait.
-- resync = true means "forget this source's state and recount every live file" (attach, TRUNCATE, resync()).
-- deletes = true means "rows were deleted": DELETE logs no keys (capturing the deleted rows would cost the
-- application's DELETE a third more); fold() finds the files that lost rows by comparing chunk counts.
CREATE TABLE storetopics.pending (
  source_id int NOT NULL,
  store_key text,
  file_key  text,
  resync    boolean NOT NULL DEFAULT false,
  deletes   boolean NOT NULL DEFAULT false,
  logged_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX pending_source_store ON storetopics.pending (source_id, store_key);

-- Every lexeme storetopics has counted, numbered once.  Per-file arrays and store statistics hold these numbers
-- instead of the strings: about half the storage, and joins on integers.
CREATE TABLE storetopics.lexemes (
  id     int GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  lexeme text NOT NULL UNIQUE
);

-- Per-file term counts: one row per (file, store) with parallel arrays of lexeme ids and their counts.  A row whose store_key is
-- NULL holds chunks of the file whose store key evaluated to NULL: counted as skipped, never summarised.
CREATE TABLE storetopics.file_terms (
  source_id int NOT NULL,
  file_key  text NOT NULL,
  store_key text,
  chunks    int NOT NULL,
  skipped   int NOT NULL,                    -- chunks whose text could not be used (NULL, blank, junk, too long)
  words     bigint NOT NULL,                 -- counted terms (after stopwords)
  term_ids  int[] NOT NULL,
  counts    int[] NOT NULL,
  -- The file's chunks per cluster of its store's current fit (parallel arrays, sorted by cluster id): how many
  -- joined each cluster, and how many of those lie beyond the cluster's radius (outliers).
  cluster_ids      int[] NOT NULL DEFAULT '{}',
  cluster_chunks   int[] NOT NULL DEFAULT '{}',
  cluster_outliers int[] NOT NULL DEFAULT '{}',
  other_dim        int NOT NULL DEFAULT 0,   -- chunks with a vector no cluster of the store can take (dimension)
  UNIQUE NULLS NOT DISTINCT (source_id, file_key, store_key)
);

-- Store-wide statistics per term: in how many files (df), how often in all (total), and the sum of squared per-file
-- counts (total_sq).  All three are sums over files, so a deletion is an exact subtraction.
-- total_sq / total is the expected in-file count of an occurrence: high for a term dense in few files.
CREATE TABLE storetopics.store_terms (
  source_id int NOT NULL,
  store_key text NOT NULL,
  term_id   int NOT NULL,                    -- storetopics.lexemes
  files     int NOT NULL,
  total     bigint NOT NULL,
  total_sq  bigint NOT NULL,
  PRIMARY KEY (source_id, store_key, term_id)
);

-- One row per store: counters kept by fold(), the summary kept by render().
CREATE TABLE storetopics.store_state (
  source_id    int NOT NULL,
  store_key    text NOT NULL,
  files        bigint NOT NULL DEFAULT 0,
  chunks       bigint NOT NULL DEFAULT 0,
  words        bigint NOT NULL DEFAULT 0,
  skipped      bigint NOT NULL DEFAULT 0,
  other_dim    bigint NOT NULL DEFAULT 0,     -- chunks whose vector has another dimension than the fit: not clustered
  store_topics text,                          -- what a router reads: <= 200 tokens
  topics       jsonb,                         -- the structured form
  folded_at    timestamptz,
  rendered_at  timestamptz,
  updated_at   timestamptz,                   -- last time store_topics changed
  version      bigint NOT NULL DEFAULT 1,     -- +1 whenever what the summary is rendered from changes
  rendered_version bigint NOT NULL DEFAULT 0, -- the version render() last rendered (render due when they differ)
  -- The current clustering of the store's embeddings (NULL before the first fit).
  fit_generation int NOT NULL DEFAULT 0,      -- +1 per fit; labels are written back only for the generation asked
  fit_at         timestamptz,
  fit_k          int,
  fit_silhouette real,
  fit_single_theme boolean,
  fit_sample     int,                         -- vectors the fit saw
  fit_seed       int,
  fit_dim        int,                         -- dimension of the vectors the centroids live in
  fit_space      text,                        -- fingerprint of the embedding space (model name if configured)
  fit_chunks     bigint,                      -- chunks clustered right after the fit (the outlier gate's base)
  fit_seconds    real,
  words_version  bigint NOT NULL DEFAULT 0,   -- the version the clusters' words were computed at
  PRIMARY KEY (source_id, store_key)
);

-- Clusters of a store's embeddings.  cluster_id is stable across fits while a cluster persists (a re-fit matches
-- new clusters to these by centroid), so labels survive.  chunks/files/outliers are sums over file_terms' arrays,
-- kept by fold() like the term statistics: a deletion is an exact subtraction.
CREATE TABLE storetopics.clusters (
  source_id        int NOT NULL,
  store_key        text NOT NULL,
  cluster_id       int GENERATED BY DEFAULT AS IDENTITY,
  centroid         vector NOT NULL,           -- unit length
  radius           real NOT NULL,             -- cosine distance beyond which a chunk is an outlier
  chunks           bigint NOT NULL DEFAULT 0,
  files            bigint NOT NULL DEFAULT 0,
  outliers         bigint NOT NULL DEFAULT 0,
  outliers_at_fit  bigint NOT NULL DEFAULT 0, -- outliers right after the fit: what came since is what counts
  outliers_seen    bigint NOT NULL DEFAULT 0, -- outliers when its words were last computed
  fit_size         int NOT NULL,              -- members in the fit's sample
  keywords         text[] NOT NULL DEFAULT '{}',   -- distinctive words of the cluster (c-TF-IDF), as people write them
  representatives  jsonb NOT NULL DEFAULT '[]',    -- the chunks nearest the centroid: [{"id", "file", "text"}]
  label            text,                      -- from the labeller; NULL: the offline label (from keywords) is shown
  labeller         text,
  label_model      text,
  label_needed     boolean NOT NULL DEFAULT true,
  label_words      text[],                    -- its words when the labeller named it (the keyword gate's base)
  label_error      text,                      -- last failure or rejection, for the status view
  label_failures   int NOT NULL DEFAULT 0,
  label_retry_at   timestamptz,
  created_at       timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (source_id, store_key, cluster_id)
);

-- Scratch for the assignment pass (_assign): each file's mean direction, written and deleted again within one
-- fold() or apply_fit(), so no other transaction ever sees a row.  A table, not a temp table, because parallel workers
-- cannot read temp tables; unlogged, because its rows never outlive a transaction.
CREATE UNLOGGED TABLE storetopics.file_means (
  source_id int NOT NULL,
  store_key text NOT NULL,
  file_key  text NOT NULL,
  dims      int NOT NULL,
  m         vector NOT NULL
);

-- Every labelling call, with its usage as the API reported it and its estimated cost (settings' price table).
CREATE TABLE storetopics.label_ledger (
  id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  source_id     int NOT NULL,
  store_key     text NOT NULL,
  cluster_id    int,
  at            timestamptz NOT NULL DEFAULT now(),
  labeller      text NOT NULL,
  model         text,
  input_tokens  int NOT NULL DEFAULT 0,
  output_tokens int NOT NULL DEFAULT 0,
  cost_usd      numeric(12, 6) NOT NULL DEFAULT 0,
  outcome       text NOT NULL CHECK (outcome IN ('ok', 'rejected', 'error')),
  detail        text
);
CREATE INDEX label_ledger_store ON storetopics.label_ledger (source_id, store_key);

-- How people write a term: lexeme (stem) -> the most common surface word seen for it.
CREATE TABLE storetopics.term_words (
  ts_config regconfig NOT NULL,
  lexeme    text NOT NULL,
  word      text NOT NULL,
  PRIMARY KEY (ts_config, lexeme)
);


-- ------------------------------------------------------------------------------------------------------------
-- The worker's tables
-- ------------------------------------------------------------------------------------------------------------
-- Dirtiness is derived from the data: a store is dirty while changes are logged for it (storetopics.pending), while
-- what it is rendered from changed since its last render (store_state.version <> rendered_version), or while a
-- labelling retry of one of its clusters has come due.  storetopics.work remembers only what the derivation cannot:
-- since when a store has been dirty (max_staleness), its last change (debounce), and who holds its lease.
-- Claiming follows pgmq: SELECT ... FOR UPDATE SKIP LOCKED, then a lease with an expiry; no transaction stays open
-- while a worker clusters or waits on an LLM.  A crashed worker's lease runs out and another worker takes the store.
CREATE TABLE storetopics.work (
  source_id          int NOT NULL,
  store_key          text NOT NULL,
  dirty_since        timestamptz,                 -- NULL: clean
  changed_at         timestamptz,                 -- the last change seen (debounce counts from here)
  generation         bigint NOT NULL DEFAULT 0,   -- +1 whenever a new change is seen
  leased_by          text,                        -- storetopics.workers.id
  lease_expires      timestamptz,
  claimed_at         timestamptz,
  claimed_generation bigint,
  attempts           int NOT NULL DEFAULT 0,      -- failed passes in a row (the worker's own errors)
  last_error         text,
  next_attempt_at    timestamptz,                 -- after a failed pass: exponential backoff with jitter, capped
  processed          bigint NOT NULL DEFAULT 0,   -- passes completed
  regenerated        bigint NOT NULL DEFAULT 0,   -- passes that changed the summary
  takeovers          bigint NOT NULL DEFAULT 0,   -- claims of an expired lease (its worker died or stalled)
  last_done_at       timestamptz,
  PRIMARY KEY (source_id, store_key)
);

-- One row per worker process: heartbeat and progress, for `storetopics status`.
CREATE TABLE storetopics.workers (
  id            text PRIMARY KEY,
  host          text,
  pid           int,
  started_at    timestamptz NOT NULL DEFAULT now(),
  last_seen     timestamptz NOT NULL DEFAULT now(),
  lease_seconds real NOT NULL DEFAULT 60,
  source_id     int,                              -- the store it works on now
  store_key     text,
  processed     bigint NOT NULL DEFAULT 0,
  regenerated   bigint NOT NULL DEFAULT 0,
  failures      bigint NOT NULL DEFAULT 0,
  label_calls   bigint NOT NULL DEFAULT 0,
  stopped_at    timestamptz
);
