-- ------------------------------------------------------------------------------------------------------------
-- Fold: bring the keyword state up to date with the logged changes
-- ------------------------------------------------------------------------------------------------------------
-- fold(source) recounts at most max_files touched files of one source from the live rows and applies the
-- difference old -> new to the store-wide state.  A recount is absolute, so folding is idempotent and exact whatever
-- happened in between.  Serialised per source by a row lock on storetopics.sources (application writers never take
-- it).  Every read of the chunk table goes through the source's reader (read_<id>), which runs as the table's owner.
-- Steps: _fold_source (lock, checks, forged events), _fold_resync, _fold_check_counts, _fold_claim, _fold_recount,
-- _fold_apply.  Returns the number of files recounted (0 = nothing was pending).
-- (jit off here and in apply_fit: compiling the assignment's expressions cost more than it saved.  Custom plans: a
-- batch's file keys are an array; planned as a constant, `= ANY` is hashed, as a parameter of a generic plan it is
-- searched row by row.  bench/README.md has the figures.)
CREATE OR REPLACE FUNCTION storetopics._fold(p_source int, max_files int DEFAULT 5000) RETURNS int
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp SET work_mem = '128MB' SET jit = off
  SET plan_cache_mode = force_custom_plan AS $$
BEGIN
  BEGIN
    RETURN storetopics._fold_once(p_source, max_files);
  EXCEPTION WHEN data_exception OR cardinality_violation THEN
    -- a key expression raised for some row: the source is read row by row from now on, and the fold runs again
    IF NOT storetopics._read_row_by_row(p_source, SQLERRM) THEN
      RAISE;
    END IF;
  END;
  RETURN storetopics._fold_once(p_source, max_files);
END $$;

CREATE OR REPLACE FUNCTION storetopics._fold_once(p_source int, max_files int) RETURNS int
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  src storetopics.sources := storetopics._fold_source(p_source);
  v_files text[];
  v_n int;
BEGIN
  IF EXISTS (SELECT 1 FROM storetopics.pending WHERE source_id = p_source AND resync) THEN
    PERFORM storetopics._fold_resync(src);
  END IF;
  PERFORM storetopics._fold_check_counts(src);
  v_files := storetopics._fold_claim(src, max_files);
  IF cardinality(v_files) > 0 THEN
    v_n := storetopics._fold_apply(src, v_files);   -- (it recounts them: storetopics._fold_recount)
  END IF;
  UPDATE storetopics.sources SET folded_at = now() WHERE id = p_source;
  -- (a first backfill: without statistics the planner took the state for "one row"; see _analyze_if_stale)
  IF v_n > 0 THEN
    PERFORM storetopics._analyze_if_stale(p_source, NULL);
  END IF;
  RETURN cardinality(v_files);
END $$;

-- A key expression raised a data error (a division by zero, text that is no JSON, a subquery that found two rows)
-- for some row: from now on the source's reader evaluates its expression keys row by row, catching such errors
-- (the rows count as skipped), and status shows the error.  false when it already does, or has no expression key
-- (then the error is not a row's).
CREATE OR REPLACE FUNCTION storetopics._read_row_by_row(p_source int, p_error text) RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  UPDATE storetopics.sources s SET safe_keys = true, key_error = 'a key raised for a row: ' || p_error,
         key_error_at = now()
   WHERE s.id = p_source AND NOT s.safe_keys AND storetopics._has_expression_key(s);
  IF NOT FOUND THEN
    RETURN false;
  END IF;
  RAISE WARNING 'storetopics: source %: a key expression raised "%" for a row; its rows are read one by one from '
    'now on, and rows it raises for are counted as skipped', p_source, p_error
    USING HINT = 'Fix the expression or the rows, then run storetopics.resync() to read them set-based again.';
  PERFORM storetopics._regenerate(p_source);
  RETURN true;
END $$;

COMMENT ON FUNCTION storetopics._fold(int, int) IS
  'Recount up to max_files files of a source whose rows changed and apply the difference to its stores; returns '
  'the number of files recounted (0: nothing pending).  Exact and idempotent; safe from any number of sessions.';

-- The source, locked for this fold, if it can be folded: its table exists and still has the owner its generated
-- functions run as.  Events logged by a role that may not act as that owner are dropped: the capture function logs
-- as the owner, fold and resync() as the owner too, so such rows were forged (a tenant writing another's source id).
CREATE OR REPLACE FUNCTION storetopics._fold_source(p_source int) RETURNS storetopics.sources
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  src storetopics.sources;
  v_owner oid;
BEGIN
  SELECT * INTO src FROM storetopics.sources WHERE id = p_source FOR UPDATE;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'storetopics: no source %', p_source USING ERRCODE = 'undefined_object';
  END IF;
  SELECT c.relowner INTO v_owner FROM pg_class c WHERE c.oid = src.chunks;
  IF v_owner = src.owner THEN
    PERFORM storetopics._reader(p_source);   -- its generated functions made current
  END IF;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'storetopics: the table of source % was dropped', p_source USING ERRCODE = 'undefined_table',
      HINT = 'Forget it with SELECT * FROM storetopics.detach_dropped().';
  ELSIF v_owner <> src.owner THEN
    RAISE EXCEPTION 'storetopics: source %: the owner of % is now %, not % who attached it', p_source, src.chunks,
      v_owner::regrole, src.owner USING ERRCODE = 'insufficient_privilege',
      HINT = format('Detach %s and attach it again as its new owner.', src.chunks);
  END IF;
  DELETE FROM storetopics.pending p
   WHERE p.source_id = p_source
     AND p.logged_by IN (SELECT x.r FROM (SELECT DISTINCT q.logged_by AS r FROM storetopics.pending q
                                          WHERE q.source_id = p_source) x
                          WHERE NOT pg_has_role(x.r, src.owner, 'USAGE'));
  RETURN src;
END $$;

-- The capture could not key a statement's rows (it logged a count check or a resync instead, with the error, and the
-- statement went through): recorded for the status view, and said.
CREATE OR REPLACE FUNCTION storetopics._note_capture_error(p_source int, p_error text, p_at timestamptz) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  IF p_error IS NULL THEN
    RETURN;
  END IF;
  UPDATE storetopics.sources SET key_error = 'the capture trigger could not key a statement''s rows: ' || p_error,
         key_error_at = p_at
   WHERE id = p_source;
  RAISE WARNING 'storetopics: source %: the capture trigger could not key a statement''s rows at %: %', p_source, p_at,
    p_error USING HINT = 'The statement went through; its files are found by their counts.  status shows the error.';
END $$;

-- Fold step 1 (attach, TRUNCATE, resync()): forget the source's state and log every live file, folded in batches.
CREATE OR REPLACE FUNCTION storetopics._fold_resync(src storetopics.sources) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  r record;
BEGIN
  WITH d AS (DELETE FROM storetopics.pending WHERE source_id = src.id AND (resync OR deletes) RETURNING logged_at, error)
  SELECT d.error, d.logged_at INTO r FROM d WHERE d.error IS NOT NULL ORDER BY d.logged_at DESC LIMIT 1;
  PERFORM storetopics._note_capture_error(src.id, r.error, r.logged_at);
  PERFORM storetopics._catalog_move(src.id, storetopics._catalog(src.id), NULL);
  DELETE FROM storetopics.file_terms WHERE source_id = src.id;
  DELETE FROM storetopics.file_clusters WHERE source_id = src.id;
  DELETE FROM storetopics.store_terms WHERE source_id = src.id;
  PERFORM storetopics._forget_novelty(src.id);
  UPDATE storetopics.store_state SET files = 0, chunks = 0, words = 0, skipped = 0, other_dim = 0, folded_at = now(),
         version = version + 1
   WHERE source_id = src.id;
  UPDATE storetopics.clusters SET chunks = 0, files = 0, outliers = 0, outliers_at_fit = 0 WHERE source_id = src.id;
  EXECUTE format('INSERT INTO storetopics.pending (source_id, store_key, file_key, logged_by) '
                 'SELECT $1, r.s, r.f, $2 FROM %s(''keys'', NULL, NULL, NULL) AS r(s text, f text)',
                 storetopics._generated(src.id, 'read'))
    USING src.id, src.owner;
  UPDATE storetopics.sources SET null_key_rows = 0, store_count = 0, file_count = 0 WHERE id = src.id;
END $$;

-- Fold step 2 (rows were deleted, or the periodic check asked): every file whose live chunk count differs from the
-- one folded is logged for a recount.  Only a DELETE changes a file's count without logging the file, unless
-- triggers did not fire (session_replication_role = replica, a partition attached with its rows): then a file is
-- live but unknown, which the same comparison finds.  One pass over the file keys (an index-only scan with an index
-- on the file key); it also counts the rows whose file key is NULL.
CREATE OR REPLACE FUNCTION storetopics._fold_check_counts(src storetopics.sources) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_at timestamptz;
  v_error text;
  v_error_at timestamptz;
BEGIN
  WITH d AS (DELETE FROM storetopics.pending WHERE source_id = src.id AND deletes RETURNING logged_at, error)
  SELECT max(d.logged_at), (array_agg(d.error ORDER BY d.logged_at DESC) FILTER (WHERE d.error IS NOT NULL))[1],
         max(d.logged_at) FILTER (WHERE d.error IS NOT NULL)
    INTO v_at, v_error, v_error_at FROM d;
  IF v_at IS NULL THEN
    RETURN;
  END IF;
  PERFORM storetopics._note_capture_error(src.id, v_error, v_error_at);
  EXECUTE format('CREATE TEMP TABLE storetopics_live ON COMMIT DROP AS '
                 'SELECT * FROM %s(''file_counts'', NULL, NULL, NULL) AS r(file_key text, chunks bigint)',
                 storetopics._generated(src.id, 'read'));
  UPDATE storetopics.sources
     SET null_key_rows = (SELECT coalesce(sum(l.chunks), 0) FROM pg_temp.storetopics_live l WHERE l.file_key IS NULL),
         checked_at = now()
   WHERE id = src.id;
  -- logged when the event was: the files are as old as the events that touched them
  INSERT INTO storetopics.pending (source_id, file_key, logged_at, logged_by)
  SELECT src.id, coalesce(f.file_key, l.file_key), v_at, src.owner
    FROM (SELECT f.file_key, sum(f.chunks) AS chunks FROM storetopics.file_terms f
           WHERE f.source_id = src.id GROUP BY 1) f
    FULL JOIN (SELECT * FROM pg_temp.storetopics_live WHERE file_key IS NOT NULL) l ON l.file_key = f.file_key
   WHERE l.chunks IS DISTINCT FROM f.chunks;
  DROP TABLE pg_temp.storetopics_live;
END $$;

-- Fold step 3: claim a batch of touched files (and the events that name none).  Returns the file keys.
CREATE OR REPLACE FUNCTION storetopics._fold_claim(src storetopics.sources, max_files int) RETURNS text[]
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_files text[];
  v_null_keys boolean;
BEGIN
  v_files := ARRAY(SELECT DISTINCT file_key FROM storetopics.pending
                    WHERE source_id = src.id AND file_key IS NOT NULL ORDER BY 1 LIMIT max_files);
  -- One statement: a NULL-key event committed between a check and the DELETE would be lost.
  WITH d AS (DELETE FROM storetopics.pending
              WHERE source_id = src.id
                AND (file_key = ANY (v_files) OR (file_key IS NULL AND NOT resync AND NOT deletes))
             RETURNING file_key)
  SELECT coalesce(bool_or(d.file_key IS NULL), false) INTO v_null_keys FROM d;
  IF v_null_keys THEN
    EXECUTE format('UPDATE storetopics.sources SET null_key_rows = (SELECT r.n FROM %s(''null_files'', NULL, NULL, '
                   'NULL) AS r(n bigint)) WHERE id = $1', storetopics._generated(src.id, 'read'))
      USING src.id;
  END IF;
  RETURN v_files;
END $$;

-- The reader's queries fold makes (storetopics._reader_body puts them in read_<id>): keys (a resync's list of
-- files), file_counts (the count check), null_files (rows whose file key is NULL), terms and terms_slow (the
-- recount of files: _fold_recount).
CREATE OR REPLACE FUNCTION storetopics._fold_reads(src storetopics.sources) RETURNS text
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  tbl text := src.chunks::text;
  t text := src.content_sql;
  fast_tsv text := format('CASE WHEN k.s IS NOT NULL AND storetopics._usable_text(%s) THEN to_tsvector(%L::regconfig, %s) END',
                          t, src.ts_config, storetopics._read_text_sql(src));
  slow_tsv text := format('storetopics._tsvector_or_null(%L::regconfig, CASE WHEN k.s IS NOT NULL THEN %s END)',
                          src.ts_config, storetopics._read_text_sql(src));
BEGIN
  RETURN storetopics._read_arm('keys', format('SELECT DISTINCT (%s)::text, (%s)::text FROM %s AS c',
                                              src.store_sql, src.file_sql, tbl))
      || storetopics._read_arm('file_counts', format('SELECT (%s)::text, count(*) FROM %s AS c GROUP BY 1',
                                                     src.file_sql, tbl))
      || storetopics._read_arm('null_files', format('SELECT count(*) FROM %s AS c WHERE (%s) IS NULL',
                                                    tbl, src.file_sql))
      || storetopics._read_arm('terms', storetopics._fold_terms_sql(
           src, fast_tsv, format('(NOT storetopics._usable_text(%s))::int', t)), 'files')
      || storetopics._read_arm('terms_slow', storetopics._fold_terms_sql(
           src, slow_tsv,
           format('(%s IS NULL AND (k.s IS NOT NULL OR NOT storetopics._usable_text(%s)))::int', slow_tsv, t)), 'files');
END $$;

-- The chunk rows c with their store key k.s, as fold keeps it (NULL when longer than max_store_key()).
CREATE OR REPLACE FUNCTION storetopics._read_keyed_rows(src storetopics.sources) RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
RETURN format($q$%1$s AS c
     CROSS JOIN LATERAL unnest(ARRAY[CASE WHEN char_length((%2$s)::text) <= storetopics._max_store_key()
                                          THEN (%2$s)::text END]) AS k(s)$q$, src.chunks, src.store_sql);

-- The recount of the files of a call ($1): per (store, file, term) its count and the rows, and per (store, file)
-- a row with no term (the rows, and in n those skipped).  The store key is computed once per row (a function scan:
-- expressions may be subqueries), NULL when longer than max_store_key().  tsv: the row's tsvector (NULL for unusable
-- text or a NULL key); skip: 1 for a skipped row.  Neither refers to the other, so the planner cannot end up
-- tokenising a row twice.
CREATE OR REPLACE FUNCTION storetopics._fold_terms_sql(src storetopics.sources, tsv text, skip text) RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
RETURN format($q$
    SELECT k.s AS store_key, (%1$s)::text AS file_key, l.term, sum(l.n)::int AS n, count(*)::int AS rows
      FROM %2$s
     CROSS JOIN LATERAL (SELECT x.lexeme, cardinality(x.positions) FROM unnest(%3$s) AS x
                         UNION ALL
                         SELECT NULL, %4$s) AS l(term, n)
     WHERE %5$s
     GROUP BY 1, 2, 3$q$,
  src.file_sql, storetopics._read_keyed_rows(src), tsv, skip, storetopics._read_by_files(src));

-- Fold step 4: recount the files from the live rows; returns per (store, file) the counters, the term/count arrays
-- and the chunks per cluster.  The reader's recount is one parallel scan (the planner takes to_tsvector for cheap,
-- so parallel plans are made free for it).  A text whose tsvector would pass 1 MB fails the batch: it is redone row
-- by row, skipping such rows.  (Its terms are a temp table made here.)
CREATE OR REPLACE FUNCTION storetopics._fold_recount(src storetopics.sources, p_files text[])
RETURNS TABLE (store_key text, file_key text, chunks int, skipped int, words bigint, term_ids int[], counts int[],
               cluster_ids int[], cluster_chunks int[], cluster_outliers int[], other_dim int, distance_ratio real)
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
  v_op text := 'terms';
  v_clustered boolean := src.embedding IS NOT NULL
                         AND EXISTS (SELECT 1 FROM storetopics.clusters k WHERE k.source_id = src.id);
  v_saved text[] := ARRAY[current_setting('parallel_setup_cost'), current_setting('parallel_tuple_cost'),
                          current_setting('min_parallel_table_scan_size'), current_setting('enable_sort'),
                          current_setting('enable_hashjoin')];
BEGIN
  -- (dropped only when there: DROP ... IF EXISTS would send the client a NOTICE each time)
  IF to_regclass('pg_temp.storetopics_new_terms') IS NOT NULL THEN DROP TABLE pg_temp.storetopics_new_terms; END IF;
  PERFORM set_config('parallel_setup_cost', '0', true), set_config('parallel_tuple_cost', '0', true),
          set_config('min_parallel_table_scan_size', '0', true);
  LOOP
    BEGIN
      EXECUTE format('CREATE TEMP TABLE storetopics_new_terms ON COMMIT DROP AS SELECT * FROM %s($1, $2, NULL, NULL) '
                     'AS r(store_key text, file_key text, term text, n int, rows int)',
                     storetopics._generated(src.id, 'read'))
        USING v_op, p_files;
      EXIT;
    EXCEPTION WHEN program_limit_exceeded THEN
      EXIT WHEN v_op = 'terms_slow';
      v_op := 'terms_slow';
    END;
  END LOOP;
  PERFORM set_config('parallel_setup_cost', v_saved[1], true), set_config('parallel_tuple_cost', v_saved[2], true),
          set_config('min_parallel_table_scan_size', v_saved[3], true);
  -- Number the lexemes not seen before (in sorted order, so concurrent folds of other sources cannot deadlock;
  -- only missing ones, so the identity is not used up by conflicts).
  INSERT INTO storetopics.lexemes (lexeme)
  SELECT t.term FROM (SELECT DISTINCT nt.term FROM pg_temp.storetopics_new_terms nt WHERE nt.term IS NOT NULL) t
   WHERE NOT EXISTS (SELECT 1 FROM storetopics.lexemes x WHERE x.lexeme = t.term)
   ORDER BY 1
  ON CONFLICT (lexeme) DO NOTHING;
  -- Grouping by hashing: array_agg needs no order here, and sorting ~1M rows per batch is the slow way.  Both
  -- aggregates read the rows in the same order, so the term and count arrays line up.  A NULL store key makes the
  -- file's chunks null-key rows.
  -- Returned as computed, not parked in a temp table first (which would compress each array into its TOAST table,
  -- for the caller to decompress).  The files' chunks per cluster of their store's fit joined in (nothing to do
  -- while no store of the source has one).
  PERFORM set_config('enable_sort', 'off', true);
  -- (a few files, an upload's: their terms probed in lexemes by its index; hashed, the whole vocabulary of the
  -- database was read at each upload, whatever the upload's size)
  IF cardinality(p_files) <= 100 THEN
    PERFORM set_config('enable_hashjoin', 'off', true);
  END IF;
  RETURN QUERY
  SELECT r.*, coalesce(a.cluster_ids, '{}'), coalesce(a.cluster_chunks, '{}'), coalesce(a.cluster_outliers, '{}'),
         coalesce(a.other_dim, 0), a.distance_ratio
    FROM (SELECT nt.store_key, nt.file_key,
                 max(nt.rows) FILTER (WHERE nt.term IS NULL) AS chunks,
                 max(nt.n) FILTER (WHERE nt.term IS NULL) AS skipped,
                 coalesce(sum(nt.n) FILTER (WHERE nt.term IS NOT NULL), 0) AS words,
                 coalesce(array_agg(x.id) FILTER (WHERE nt.term IS NOT NULL AND nt.store_key IS NOT NULL), '{}')
                   AS term_ids,
                 coalesce(array_agg(nt.n) FILTER (WHERE nt.term IS NOT NULL AND nt.store_key IS NOT NULL), '{}')
                   AS counts
            FROM pg_temp.storetopics_new_terms nt
            LEFT JOIN storetopics.lexemes x ON x.lexeme = nt.term
           GROUP BY 1, 2) r
    LEFT JOIN (SELECT * FROM storetopics._assign(src, p_files, NULL) WHERE v_clustered) a
           ON a.store_key = r.store_key AND a.file_key = r.file_key;
  PERFORM set_config('enable_sort', v_saved[4], true), set_config('enable_hashjoin', v_saved[5], true);
  -- (The terms table stays until the next recount or the end of the transaction: the rows returned may point into
  -- its TOAST table, a file key longer than 2 kB, which the caller reads after this returns.)
END $$;

-- Fold step 5: recount the files (storetopics._fold_recount), subtract their old counts and add the new ones, in the
-- store-wide term statistics and the catalog's, the cluster sizes and the store counters; then replace the files'
-- own rows.  Returns the number of file rows written.
-- (file_terms is found by a digest of the file key: keys may be longer than an index entry can be)
-- (About 110 lines: its statements share the batch's old and new rows, temp tables that stay inside it.)
CREATE OR REPLACE FUNCTION storetopics._fold_apply(src storetopics.sources, p_files text[]) RETURNS int
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_digests uuid[] := ARRAY(SELECT md5(x)::uuid FROM unnest(p_files) x);
  v_n int;
  -- the catalog's background: per term the difference, and the stores that gain or lose it
  v_terms int[];
  v_totals numeric[];
  v_stores int[];
  v_files bigint[];
BEGIN
  -- (dropped only when there: DROP ... IF EXISTS would send the client a NOTICE each time)
  IF to_regclass('pg_temp.storetopics_new_files') IS NOT NULL THEN DROP TABLE pg_temp.storetopics_new_files; END IF;
  -- (its arrays stored as they are: compressing them, to decompress them for each read here, cost more than it saved)
  CREATE TEMP TABLE storetopics_new_files AS SELECT * FROM storetopics._fold_recount(src, p_files) WITH NO DATA;
  ALTER TABLE pg_temp.storetopics_new_files ALTER term_ids SET STORAGE EXTERNAL, ALTER counts SET STORAGE EXTERNAL;
  INSERT INTO pg_temp.storetopics_new_files SELECT * FROM storetopics._fold_recount(src, p_files);
  -- (with the chunks per cluster of each: a row in file_clusters, or none)
  CREATE TEMP TABLE storetopics_old_files ON COMMIT DROP AS
  SELECT f.*, coalesce(c.cluster_ids, '{}') AS cluster_ids, coalesce(c.cluster_chunks, '{}') AS cluster_chunks,
         coalesce(c.cluster_outliers, '{}') AS cluster_outliers, coalesce(c.other_dim, 0) AS other_dim
    FROM storetopics.file_terms f
    LEFT JOIN storetopics.file_clusters c
           ON c.source_id = src.id AND md5(c.file_key)::uuid = md5(f.file_key)::uuid AND c.file_key = f.file_key
          AND c.store_key = f.store_key
   WHERE f.source_id = src.id AND md5(f.file_key)::uuid = ANY (v_digests) AND f.file_key = ANY (p_files);

  -- The rows of the stores the batch touches first, in one order: render holds its store's row from its start and
  -- then writes the clusters' words and what it keeps (novelty_state), which fold writes before the store's row.
  -- Taken in the other order, a fold and a render of one store (two workers holding two stores of one source: a
  -- pass folds its source first) waited for each other (tests/test_lock_order.py).
  PERFORM FROM storetopics.store_state st
   WHERE st.source_id = src.id
     AND st.store_key IN (SELECT f.store_key FROM pg_temp.storetopics_new_files f
                          UNION SELECT f.store_key FROM pg_temp.storetopics_old_files f)
   ORDER BY st.store_key FOR NO KEY UPDATE;
  -- (the arrays unnested in the select list, in step: a set-returning function in FROM is materialised first)
  CREATE TEMP TABLE storetopics_delta ON COMMIT DROP AS
  SELECT d.store_key, d.term_id, sum(d.df)::int AS df, sum(d.tf)::bigint AS tf, sum(d.tf2)::bigint AS tf2
    FROM (SELECT u.store_key, u.term_id, -1 AS df, -u.n AS tf, -(u.n::bigint * u.n) AS tf2
            FROM (SELECT f.store_key, unnest(f.term_ids) AS term_id, unnest(f.counts) AS n
                    FROM pg_temp.storetopics_old_files f WHERE f.store_key IS NOT NULL) u
          UNION ALL
          SELECT u.store_key, u.term_id, 1, u.n, u.n::bigint * u.n
            FROM (SELECT nf.store_key, unnest(nf.term_ids) AS term_id, unnest(nf.counts) AS n
                    FROM pg_temp.storetopics_new_files nf WHERE nf.store_key IS NOT NULL) u) d
   GROUP BY 1, 2
  HAVING sum(d.df) <> 0 OR sum(d.tf) <> 0 OR sum(d.tf2) <> 0;
  -- The store terms: a row whose files fall to 0 goes, the others change, new ones come (a source's rows are
  -- written only by its fold, under its lock: no ON CONFLICT).  What each statement returns is the catalog's
  -- background: per term the difference, and the stores that gain (+1) or lose (-1) it; and the term's counts in
  -- the store now.
  WITH gone AS (DELETE FROM storetopics.store_terms t USING pg_temp.storetopics_delta d
                 WHERE t.source_id = src.id AND t.store_key = d.store_key AND t.term_id = d.term_id
                   AND t.files + d.df <= 0
                RETURNING d.store_key, d.term_id, d.tf, -1 AS stores, d.df, 0 AS files, 0::bigint AS total,
                          0::bigint AS total_sq),
       changed AS (UPDATE storetopics.store_terms t
                      SET files = t.files + d.df, total = t.total + d.tf, total_sq = t.total_sq + d.tf2
                     FROM pg_temp.storetopics_delta d
                    WHERE t.source_id = src.id AND t.store_key = d.store_key AND t.term_id = d.term_id
                      AND t.files + d.df > 0
                   RETURNING d.store_key, d.term_id, d.tf, 0 AS stores, d.df, t.files, t.total, t.total_sq),
       added AS (INSERT INTO storetopics.store_terms (source_id, store_key, term_id, files, total, total_sq)
                 SELECT src.id, d.store_key, d.term_id, d.df, d.tf, d.tf2 FROM pg_temp.storetopics_delta d
                  WHERE d.df > 0 AND NOT EXISTS (SELECT 1 FROM storetopics.store_terms t
                                                  WHERE t.source_id = src.id AND t.store_key = d.store_key
                                                    AND t.term_id = d.term_id)
                  ORDER BY d.store_key, d.term_id
                 RETURNING store_key, term_id, total AS tf, 1 AS stores, files AS df, files, total, total_sq),
       y AS (SELECT * FROM gone UNION ALL SELECT * FROM changed UNION ALL SELECT * FROM added),
       -- the terms whose counts moved since the store's novelty was kept, each once with its counts now, for what
       -- render keeps of the store (novelty_state.touched; past 100k of them, every term is read again): those
       -- listed before and not now, then those now; nothing to list before a store's first render
       listed AS (UPDATE storetopics.novelty_state k
                     SET (touched, touched_files, touched_totals, touched_totals_sq) =
                         (SELECT array_agg(u.t), array_agg(u.f), array_agg(u.n), array_agg(u.s)
                            FROM (SELECT DISTINCT ON (u.t) u.t, u.f, u.n, u.s
                                    FROM (SELECT o.*, 0 AS w
                                            FROM unnest(k.touched, k.touched_files, k.touched_totals,
                                                        k.touched_totals_sq) AS o(t, f, n, s)
                                          UNION ALL
                                          SELECT x.*, 1
                                            FROM unnest(d.ids, d.files, d.totals, d.totals_sq) AS x(t, f, n, s)) u
                                   WHERE k.touched IS NOT NULL
                                   ORDER BY u.t, u.w DESC) u
                          HAVING count(*) <= 100000)
                    FROM (SELECT y.store_key, array_agg(y.term_id) AS ids, array_agg(y.files) AS files,
                                 array_agg(y.total) AS totals, array_agg(y.total_sq) AS totals_sq
                            FROM y WHERE EXISTS (SELECT 1 FROM storetopics.novelty_state k WHERE k.source_id = src.id)
                           GROUP BY 1) d
                   WHERE k.source_id = src.id AND k.store_key = d.store_key)
  SELECT array_agg(x.term_id), array_agg(x.total), array_agg(x.stores), array_agg(x.files)
    INTO v_terms, v_totals, v_stores, v_files
    FROM (SELECT y.term_id, sum(y.tf) AS total, sum(y.stores)::int AS stores, sum(y.df) AS files
            FROM y GROUP BY 1) x;
  PERFORM storetopics._catalog_apply(storetopics._catalog(src.id), v_terms, v_totals, v_stores, v_files);
  DROP TABLE pg_temp.storetopics_delta;

  -- the clusters' sizes: the files' old cluster arrays subtracted, the new ones added
  IF src.embedding IS NOT NULL THEN
    UPDATE storetopics.clusters k
       SET chunks = k.chunks + d.chunks, files = k.files + d.files, outliers = k.outliers + d.outliers
      FROM (SELECT x.store_key, x.cluster_id, sum(x.files) AS files, sum(x.chunks) AS chunks,
                   sum(x.outliers) AS outliers
              FROM (SELECT f.store_key, u.cluster_id, -1 AS files, -u.n AS chunks, -u.o AS outliers
                      FROM pg_temp.storetopics_old_files f,
                           unnest(f.cluster_ids, f.cluster_chunks, f.cluster_outliers) AS u(cluster_id, n, o)
                     WHERE f.store_key IS NOT NULL
                    UNION ALL
                    SELECT nf.store_key, u.cluster_id, 1, u.n, u.o
                      FROM pg_temp.storetopics_new_files nf,
                           unnest(nf.cluster_ids, nf.cluster_chunks, nf.cluster_outliers) AS u(cluster_id, n, o)
                     WHERE nf.store_key IS NOT NULL) x
             GROUP BY 1, 2) d
     WHERE k.source_id = src.id AND k.store_key = d.store_key AND k.cluster_id = d.cluster_id
       AND (d.files <> 0 OR d.chunks <> 0 OR d.outliers <> 0);
  END IF;

  CREATE TEMP TABLE storetopics_store_delta ON COMMIT DROP AS
  SELECT x.store_key, sum(x.files) AS files, sum(x.chunks) AS chunks, sum(x.words) AS words,
         sum(x.skipped) AS skipped, sum(x.other_dim) AS other_dim
    FROM (SELECT f.store_key, -1 AS files, -f.chunks AS chunks, -f.words AS words, -f.skipped AS skipped,
                 -f.other_dim AS other_dim
            FROM pg_temp.storetopics_old_files f WHERE f.store_key IS NOT NULL
          UNION ALL
          SELECT nf.store_key, 1, nf.chunks, nf.words, nf.skipped, nf.other_dim
            FROM pg_temp.storetopics_new_files nf WHERE nf.store_key IS NOT NULL) x
   GROUP BY x.store_key;
  -- the source's part of its catalog's size: its files, and its stores that come to hold files or lose their last
  UPDATE storetopics.sources s
     SET file_count = s.file_count + d.files, store_count = s.store_count + d.stores
    FROM (SELECT coalesce(sum(d.files), 0) AS files,
                 coalesce(sum((coalesce(st.files, 0) + d.files > 0)::int - (coalesce(st.files, 0) > 0)::int), 0)
                   AS stores
            FROM pg_temp.storetopics_store_delta d
            LEFT JOIN storetopics.store_state st ON st.source_id = src.id AND st.store_key = d.store_key) d
   WHERE s.id = src.id;
  INSERT INTO storetopics.store_state AS st (source_id, store_key, files, chunks, words, skipped, other_dim,
                                             folded_at)
  SELECT src.id, d.store_key, d.files, d.chunks, d.words, d.skipped, d.other_dim, now()
    FROM pg_temp.storetopics_store_delta d
  ORDER BY d.store_key
  ON CONFLICT (source_id, store_key) DO UPDATE
     SET files = st.files + excluded.files, chunks = st.chunks + excluded.chunks,
         words = st.words + excluded.words, skipped = st.skipped + excluded.skipped,
         other_dim = st.other_dim + excluded.other_dim, folded_at = now(), version = st.version + 1;
  IF EXISTS (SELECT 1 FROM storetopics.store_state st WHERE st.source_id = src.id AND st.tool_name IS NULL) THEN
    PERFORM storetopics._name_stores(src.id);   -- new stores
  END IF;

  DELETE FROM storetopics.file_terms f
   WHERE f.source_id = src.id AND md5(f.file_key)::uuid = ANY (v_digests) AND f.file_key = ANY (p_files);
  INSERT INTO storetopics.file_terms (source_id, file_key, store_key, chunks, skipped, words, term_ids, counts)
  SELECT src.id, nf.file_key, nf.store_key, nf.chunks, nf.skipped, nf.words, nf.term_ids, nf.counts
    FROM pg_temp.storetopics_new_files nf;
  GET DIAGNOSTICS v_n = ROW_COUNT;
  DELETE FROM storetopics.file_clusters c
   WHERE c.source_id = src.id AND md5(c.file_key)::uuid = ANY (v_digests) AND c.file_key = ANY (p_files);
  INSERT INTO storetopics.file_clusters (source_id, store_key, file_key, chunks, words, cluster_ids, cluster_chunks,
                                         cluster_outliers, other_dim, distance_ratio)
  SELECT src.id, nf.store_key, nf.file_key, nf.chunks, nf.words, nf.cluster_ids, nf.cluster_chunks,
         nf.cluster_outliers, nf.other_dim, nf.distance_ratio
    FROM pg_temp.storetopics_new_files nf
   WHERE nf.store_key IS NOT NULL AND (cardinality(nf.cluster_ids) > 0 OR nf.other_dim <> 0);
  -- what render keeps of its stores' novelty (storetopics._outlier_files): these files are computed again there,
  -- and the numbers they had are gone from the kept ranking
  WITH gone AS (
    DELETE FROM storetopics.file_novelty f
     WHERE f.source_id = src.id AND md5(f.file_key)::uuid = ANY (v_digests) AND f.file_key = ANY (p_files)
    RETURNING f.store_key, f.n)
  UPDATE storetopics.novelty_state k SET gone = k.gone || g.ns
    FROM (SELECT g.store_key, array_agg(g.n) AS ns FROM gone g WHERE g.n IS NOT NULL GROUP BY 1) g
   WHERE k.source_id = src.id AND k.store_key = g.store_key;
  INSERT INTO storetopics.file_novelty (source_id, store_key, file_key)
  SELECT src.id, nf.store_key, nf.file_key FROM pg_temp.storetopics_new_files nf
   WHERE nf.store_key IN (SELECT k.store_key FROM storetopics.novelty_state k WHERE k.source_id = src.id);
  DROP TABLE pg_temp.storetopics_new_files, pg_temp.storetopics_old_files, pg_temp.storetopics_store_delta;
  RETURN v_n;
END $$;

-- ANALYZE the state tables when their statistics have not seen most of a store's files (p_store NULL: of a
-- source's): a store attached or grown since autovacuum last came by.  The planner takes its rows for one, and a join
-- planned on that reads one side whole for each row of the other: a render of a 3,000-file store that takes 36 s, a
-- fit's reassignment 30-60 s (bench/README.md).  The readers that can are written so that no estimate changes how
-- much they read; this is for the others (before the clusters' words and a render, storetopics._refresh_words; after a
-- fold and a fit's reassignment).  Only as the tables' owner (or a superuser), and not while another session
-- analyzes them (lock_timeout): others leave it to autovacuum.  Costs two EXPLAINs when the statistics are fine.
CREATE OR REPLACE FUNCTION storetopics._analyze_if_stale(p_source int, p_store text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp SET lock_timeout = '100ms' AS $$
DECLARE
  v_files bigint := CASE WHEN p_store IS NULL THEN (SELECT s.file_count FROM storetopics.sources s WHERE s.id = p_source)
                         ELSE (SELECT st.files FROM storetopics.store_state st
                                WHERE st.source_id = p_source AND st.store_key = p_store) END;
  v_where text := format('source_id = %s', p_source)
                   || CASE WHEN p_store IS NOT NULL THEN format(' AND store_key = %L', p_store) ELSE '' END;
  v_terms json;
  v_clusters json;
BEGIN
  IF coalesce(v_files, 0) < 1000 OR NOT (pg_has_role(current_user, (SELECT relowner FROM pg_class
                                                        WHERE oid = 'storetopics.file_terms'::regclass), 'USAGE')
                                         OR (SELECT rolsuper FROM pg_roles WHERE rolname = current_user)) THEN
    RETURN;
  END IF;
  EXECUTE 'EXPLAIN (FORMAT JSON) SELECT 1 FROM storetopics.file_terms WHERE ' || v_where INTO v_terms;
  EXECUTE 'EXPLAIN (FORMAT JSON) SELECT 1 FROM storetopics.file_clusters WHERE ' || v_where INTO v_clusters;
  IF (v_terms -> 0 -> 'Plan' ->> 'Plan Rows')::float8 * 10 < v_files
     OR EXISTS (SELECT 1 FROM storetopics.file_clusters c WHERE c.source_id = p_source
                   AND (p_store IS NULL OR c.store_key = p_store))
        AND (v_clusters -> 0 -> 'Plan' ->> 'Plan Rows')::float8 * 10 < v_files THEN
    ANALYZE storetopics.file_terms, storetopics.file_clusters, storetopics.store_terms, storetopics.catalog_terms,
            storetopics.lexemes;
  END IF;
EXCEPTION WHEN lock_not_available THEN
  NULL;   -- (another session is analyzing them, or altering one)
END $$;
