-- ------------------------------------------------------------------------------------------------------------
-- Fold: bring the keyword state up to date with the logged changes
-- ------------------------------------------------------------------------------------------------------------
-- Recounts at most max_files touched files of one source and applies the difference.  Returns the number of files
-- recounted (0 = nothing was pending).  Serialised per source by a row lock on storetopics.sources; application
-- writers never take that lock.  Safe to call at any time, from any number of sessions.
-- (jit off here and in apply_fit: compiling the assignment's expressions took 1.2 s per statement and saved nothing,
-- 4.5 s vs 2.9 s for 100k chunks)
CREATE OR REPLACE FUNCTION storetopics.fold(p_source int, max_files int DEFAULT 5000) RETURNS int
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp SET work_mem = '128MB' SET jit = off AS $$
DECLARE
  src storetopics.sources;
  v_files text[];
  v_null_keys boolean;
  v_deleted_at timestamptz;
  v_filter text;
  v_tsv text;
  v_skip text;
  v_saved text[];
  v_n int;
BEGIN
  SELECT * INTO src FROM storetopics.sources WHERE id = p_source FOR UPDATE;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'storetopics: no source %', p_source USING ERRCODE = 'undefined_object';
  END IF;
  IF NOT EXISTS (SELECT 1 FROM pg_class WHERE oid = src.chunks) THEN
    RAISE EXCEPTION 'storetopics: the table of source % was dropped', p_source USING ERRCODE = 'undefined_table',
      HINT = format('Forget it with SELECT storetopics.detach_source(%s).', p_source);
  END IF;

  -- 1. A resync (attach, TRUNCATE): forget the state and log every live file, then fold those in batches.
  IF EXISTS (SELECT 1 FROM storetopics.pending WHERE source_id = p_source AND resync) THEN
    DELETE FROM storetopics.pending WHERE source_id = p_source AND (resync OR deletes);
    DELETE FROM storetopics.file_terms WHERE source_id = p_source;
    DELETE FROM storetopics.store_terms WHERE source_id = p_source;
    UPDATE storetopics.store_state SET files = 0, chunks = 0, words = 0, skipped = 0, other_dim = 0, folded_at = now(),
           version = version + 1
     WHERE source_id = p_source;
    UPDATE storetopics.clusters SET chunks = 0, files = 0, outliers = 0, outliers_at_fit = 0
     WHERE source_id = p_source;
    EXECUTE format('INSERT INTO storetopics.pending (source_id, store_key, file_key) '
                   'SELECT DISTINCT %s, (%s)::text, (%s)::text FROM %s AS c',
                   p_source, src.store_sql, src.file_sql, src.chunks);
    UPDATE storetopics.sources SET null_key_rows = 0 WHERE id = p_source;
  END IF;

  -- 1b. Rows were deleted: every file whose live chunk count differs from the one folded lost rows (only a DELETE
  --     changes a file's count without logging the file).  One pass over the file keys; an index on the file key
  --     makes it an index-only scan.  The same pass counts the rows whose file key is NULL.
  WITH d AS (DELETE FROM storetopics.pending WHERE source_id = p_source AND deletes RETURNING logged_at)
  SELECT max(d.logged_at) INTO v_deleted_at FROM d;
  IF v_deleted_at IS NOT NULL THEN
    EXECUTE format($q$
      CREATE TEMP TABLE storetopics_live ON COMMIT DROP AS
      SELECT (%1$s)::text AS file_key, count(*) AS chunks FROM %2$s AS c GROUP BY 1$q$, src.file_sql, src.chunks);
    SELECT coalesce(sum(l.chunks), 0) INTO src.null_key_rows FROM pg_temp.storetopics_live l WHERE l.file_key IS NULL;
    UPDATE storetopics.sources SET null_key_rows = src.null_key_rows WHERE id = p_source;
    -- logged when the deletes were: the files are as old as the events that touched them
    INSERT INTO storetopics.pending (source_id, file_key, logged_at)
    SELECT p_source, f.file_key, v_deleted_at
      FROM (SELECT f.file_key, sum(f.chunks) AS chunks FROM storetopics.file_terms f
             WHERE f.source_id = p_source GROUP BY 1) f
      LEFT JOIN pg_temp.storetopics_live l ON l.file_key = f.file_key
     WHERE l.chunks IS DISTINCT FROM f.chunks;
    DROP TABLE pg_temp.storetopics_live;
  END IF;

  -- 2. Claim a batch of touched files.
  v_files := ARRAY(SELECT DISTINCT file_key FROM storetopics.pending
                    WHERE source_id = p_source AND file_key IS NOT NULL ORDER BY 1 LIMIT max_files);
  -- One statement: a NULL-key event committed between a check and the DELETE would be lost.
  WITH d AS (DELETE FROM storetopics.pending
              WHERE source_id = p_source
                AND (file_key = ANY (v_files) OR (file_key IS NULL AND NOT resync AND NOT deletes))
             RETURNING file_key)
  SELECT coalesce(bool_or(d.file_key IS NULL), false) INTO v_null_keys FROM d;
  IF v_null_keys THEN
    EXECUTE format('SELECT count(*) FROM %s AS c WHERE (%s) IS NULL', src.chunks, src.file_sql)
      INTO src.null_key_rows;
    UPDATE storetopics.sources SET null_key_rows = src.null_key_rows WHERE id = p_source;
  END IF;
  IF cardinality(v_files) = 0 THEN
    UPDATE storetopics.sources SET folded_at = now() WHERE id = p_source;
    RETURN 0;
  END IF;

  -- 3. Recount those files from the live rows, in one scan.  Per (store, file, term): the count; plus one row per
  --    (store, file) with term NULL whose count(*) is the number of chunks and whose n is the number of skipped
  --    chunks.  Parallel query spreads the tokenising over the cores; the planner takes to_tsvector for cheap, so
  --    parallel plans are made free for this statement.
  v_filter := format('%s = ANY (%L::%s[])', src.file_sql, v_files, src.file_type);
  DROP TABLE IF EXISTS pg_temp.storetopics_new_terms, pg_temp.storetopics_new_files;
  v_saved := ARRAY[current_setting('parallel_setup_cost'), current_setting('parallel_tuple_cost'),
                   current_setting('min_parallel_table_scan_size'), current_setting('enable_sort')];
  PERFORM set_config('parallel_setup_cost', '0', true), set_config('parallel_tuple_cost', '0', true),
          set_config('min_parallel_table_scan_size', '0', true);
  -- tsv: the row's tsvector (NULL for unusable text or a NULL store key); skip: 1 for a skipped row.  Neither refers
  -- to the other, so the planner cannot end up tokenising a row twice.
  v_tsv := format('CASE WHEN (%s) IS NOT NULL AND storetopics.usable_text(%s) THEN to_tsvector(%L::regconfig, %s) END',
                  src.store_sql, src.content_sql, src.ts_config, src.content_sql);
  v_skip := format('(NOT storetopics.usable_text(%s))::int', src.content_sql);
  LOOP
    BEGIN
      EXECUTE format($q$
        CREATE TEMP TABLE storetopics_new_terms AS
        SELECT (%1$s)::text AS store_key, (%2$s)::text AS file_key, l.term, sum(l.n)::int AS n, count(*)::int AS rows
          FROM %3$s AS c
         CROSS JOIN LATERAL (SELECT x.lexeme, cardinality(x.positions) FROM unnest(%4$s) AS x
                             UNION ALL
                             SELECT NULL, %6$s) AS l(term, n)
         WHERE %5$s
         GROUP BY 1, 2, 3$q$, src.store_sql, src.file_sql, src.chunks, v_tsv, v_filter, v_skip);
      EXIT;
    EXCEPTION WHEN program_limit_exceeded THEN
      -- A text whose tsvector would pass 1 MB: redo this batch with one subtransaction per row, skipping such rows
      -- (this slow path tokenises each row twice).
      EXIT WHEN v_tsv LIKE 'storetopics._tsvector_or_null%';
      v_tsv := format('storetopics._tsvector_or_null(%L::regconfig, CASE WHEN (%s) IS NOT NULL THEN %s END)',
                      src.ts_config, src.store_sql, src.content_sql);
      v_skip := format('(%s IS NULL AND ((%s) IS NOT NULL OR NOT storetopics.usable_text(%s)))::int',
                       v_tsv, src.store_sql, src.content_sql);
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
  -- Grouping by hashing: array_agg needs no order here, and sorting ~1M rows per batch is the slow way.
  PERFORM set_config('enable_sort', 'off', true);
  -- Per file: counters and the term/count arrays (parallel arrays: both aggregates read the rows in the same
  -- order, so the pairs line up; no sort needed).  A NULL store key makes the file's chunks null-key rows.
  CREATE TEMP TABLE storetopics_new_files AS
  SELECT nt.store_key, nt.file_key,
         max(nt.rows) FILTER (WHERE nt.term IS NULL) AS chunks,
         max(nt.n) FILTER (WHERE nt.term IS NULL) AS skipped,
         coalesce(sum(nt.n) FILTER (WHERE nt.term IS NOT NULL), 0) AS words,
         coalesce(array_agg(x.id) FILTER (WHERE nt.term IS NOT NULL AND nt.store_key IS NOT NULL), '{}') AS term_ids,
         coalesce(array_agg(nt.n) FILTER (WHERE nt.term IS NOT NULL AND nt.store_key IS NOT NULL), '{}') AS counts
    FROM pg_temp.storetopics_new_terms nt
    LEFT JOIN storetopics.lexemes x ON x.lexeme = nt.term
   GROUP BY 1, 2;
  PERFORM set_config('enable_sort', v_saved[4], true);
  DROP TABLE pg_temp.storetopics_new_terms;
  -- The files' chunks per cluster of their store's fit (nothing to do while no store of the source has one).
  ALTER TABLE pg_temp.storetopics_new_files ADD cluster_ids int[] NOT NULL DEFAULT '{}',
    ADD cluster_chunks int[] NOT NULL DEFAULT '{}', ADD cluster_outliers int[] NOT NULL DEFAULT '{}',
    ADD other_dim int NOT NULL DEFAULT 0;
  IF src.embedding IS NOT NULL AND EXISTS (SELECT 1 FROM storetopics.clusters k WHERE k.source_id = p_source) THEN
    PERFORM storetopics._assign(src, v_filter);
    UPDATE pg_temp.storetopics_new_files nf SET cluster_ids = a.cluster_ids, cluster_chunks = a.cluster_chunks,
           cluster_outliers = a.cluster_outliers, other_dim = a.other_dim
      FROM pg_temp.storetopics_assign a WHERE a.store_key = nf.store_key AND a.file_key = nf.file_key;
    DROP TABLE pg_temp.storetopics_assign;
  END IF;

  -- 4. Store-wide term statistics: subtract the files' old counts, add the new ones.
  CREATE TEMP TABLE storetopics_delta ON COMMIT DROP AS
  SELECT d.store_key, d.term_id, sum(d.df)::int AS df, sum(d.tf)::bigint AS tf, sum(d.tf2)::bigint AS tf2
    FROM (SELECT f.store_key, u.term_id, -1 AS df, -u.n::bigint AS tf, -(u.n::bigint * u.n) AS tf2
            FROM storetopics.file_terms f, unnest(f.term_ids, f.counts) AS u(term_id, n)
           WHERE f.source_id = p_source AND f.file_key = ANY (v_files) AND f.store_key IS NOT NULL
          UNION ALL
          SELECT nf.store_key, u.term_id, 1, u.n, u.n::bigint * u.n
            FROM pg_temp.storetopics_new_files nf, unnest(nf.term_ids, nf.counts) AS u(term_id, n)
           WHERE nf.store_key IS NOT NULL) d
   GROUP BY 1, 2
  HAVING sum(d.df) <> 0 OR sum(d.tf) <> 0 OR sum(d.tf2) <> 0;

  INSERT INTO storetopics.store_terms AS t (source_id, store_key, term_id, files, total, total_sq)
  SELECT p_source, d.store_key, d.term_id, d.df, d.tf, d.tf2 FROM pg_temp.storetopics_delta d
  ORDER BY d.store_key, d.term_id
  ON CONFLICT (source_id, store_key, term_id) DO UPDATE
     SET files = t.files + excluded.files, total = t.total + excluded.total, total_sq = t.total_sq + excluded.total_sq;
  DELETE FROM storetopics.store_terms t USING pg_temp.storetopics_delta d
   WHERE t.source_id = p_source AND t.store_key = d.store_key AND t.term_id = d.term_id AND t.files <= 0;
  DROP TABLE pg_temp.storetopics_delta;

  -- 4b. Cluster sizes: the same difference over the files' cluster arrays.
  IF src.embedding IS NOT NULL THEN
    PERFORM storetopics._add_to_clusters(p_source, v_files);
  END IF;

  -- 5. Store counters, by the same difference.
  CREATE TEMP TABLE storetopics_counts ON COMMIT DROP AS
  SELECT x.store_key, sum(x.files)::bigint AS files, sum(x.chunks)::bigint AS chunks, sum(x.words)::bigint AS words,
         sum(x.skipped)::bigint AS skipped, sum(x.other_dim)::bigint AS other_dim
    FROM (SELECT f.store_key, -1 AS files, -f.chunks AS chunks, -f.words AS words, -f.skipped AS skipped,
                 -f.other_dim AS other_dim
            FROM storetopics.file_terms f
           WHERE f.source_id = p_source AND f.file_key = ANY (v_files) AND f.store_key IS NOT NULL
          UNION ALL
          SELECT nf.store_key, 1, nf.chunks, nf.words, nf.skipped, nf.other_dim
            FROM pg_temp.storetopics_new_files nf
           WHERE nf.store_key IS NOT NULL) x
   GROUP BY 1;
  INSERT INTO storetopics.store_state AS st (source_id, store_key, files, chunks, words, skipped, other_dim,
                                             folded_at)
  SELECT p_source, k.store_key, k.files, k.chunks, k.words, k.skipped, k.other_dim, now()
    FROM pg_temp.storetopics_counts k
  ORDER BY k.store_key
  ON CONFLICT (source_id, store_key) DO UPDATE
     SET files = st.files + excluded.files, chunks = st.chunks + excluded.chunks,
         words = st.words + excluded.words, skipped = st.skipped + excluded.skipped,
         other_dim = st.other_dim + excluded.other_dim, folded_at = now(), version = st.version + 1;
  DROP TABLE pg_temp.storetopics_counts;

  -- 6. Replace the files' own rows.
  DELETE FROM storetopics.file_terms WHERE source_id = p_source AND file_key = ANY (v_files);
  INSERT INTO storetopics.file_terms (source_id, file_key, store_key, chunks, skipped, words, term_ids, counts,
                                      cluster_ids, cluster_chunks, cluster_outliers, other_dim)
  SELECT p_source, nf.file_key, nf.store_key, nf.chunks, nf.skipped, nf.words, nf.term_ids, nf.counts,
         nf.cluster_ids, nf.cluster_chunks, nf.cluster_outliers, nf.other_dim
    FROM pg_temp.storetopics_new_files nf;

  GET DIAGNOSTICS v_n = ROW_COUNT;
  DROP TABLE pg_temp.storetopics_new_files;
  UPDATE storetopics.sources SET folded_at = now() WHERE id = p_source;
  -- Statistics of the state tables, when this batch alone wrote more files than the statistics know (a first
  -- backfill): without them the planner took the 20k-file state for "one row" and keywords() ran 96 s instead of
  -- 2.5 s.  Only the tables' owner (or a superuser) may; others leave it to autovacuum.
  PERFORM storetopics._analyze_if_stale(v_n);
  RETURN cardinality(v_files);
END $$;

-- ANALYZE the state tables when one statement just wrote at least 1,000 files' rows and more than their statistics
-- know of (a first backfill, the full reassignment after a store's first fit).  Only as the tables' owner (or a
-- superuser); others leave it to autovacuum.
CREATE OR REPLACE FUNCTION storetopics._analyze_if_stale(p_rows bigint) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  IF p_rows >= 1000 AND (SELECT c.reltuples FROM pg_class c WHERE c.oid = 'storetopics.file_terms'::regclass) < p_rows
     AND (pg_has_role(current_user, (SELECT relowner FROM pg_class WHERE oid = 'storetopics.file_terms'::regclass),
                      'USAGE')
          OR (SELECT rolsuper FROM pg_roles WHERE rolname = current_user)) THEN
    ANALYZE storetopics.file_terms, storetopics.store_terms, storetopics.lexemes;
  END IF;
END $$;

-- The slow path of fold(): one subtransaction per row, so one oversized text cannot fail a batch.
CREATE OR REPLACE FUNCTION storetopics._tsvector_or_null(cfg regconfig, t text) RETURNS tsvector
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  IF NOT storetopics.usable_text(t) THEN
    RETURN NULL;
  END IF;
  RETURN to_tsvector(cfg, t);
EXCEPTION WHEN program_limit_exceeded THEN
  RETURN NULL;
END $$;
