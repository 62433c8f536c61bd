-- ------------------------------------------------------------------------------------------------------------
-- Backfill: everything up to date, synchronously, from SQL
-- ------------------------------------------------------------------------------------------------------------
-- backfill() brings every store of every source up to date; backfill('key') the stores with that key;
-- backfill(source => 'public.chunks') one source.  Folds all pending changes of the sources concerned (a file can
-- move between stores, so a source is folded as a whole), then renders the stores whose state changed.
-- A store's summary is due for rendering when what it is rendered from changed since (fold, fit, labels and
-- settings bump store_state.version; a counter, not a clock, so no commit order can hide a change), or when the
-- store was emptied (render then removes it).
CREATE OR REPLACE FUNCTION storetopics.render_due(st storetopics.store_state) RETURNS boolean
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
RETURN st.rendered_version <> st.version OR st.files <= 0;

-- The sources a backfill concerns (all, one table, or those that hold or may come to hold a store key), one row
-- each: present is false for a table dropped without detach (skipped, with a warning); resync when the source is
-- to be recounted whole (attach, TRUNCATE).  The SQL backfill() and the CLI's select the same way.
CREATE OR REPLACE FUNCTION storetopics.backfill_sources(p_store text DEFAULT NULL, p_source regclass DEFAULT NULL)
RETURNS TABLE (source_id int, chunks regclass, resync boolean, present boolean)
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
  SELECT x.id, x.chunks,
         EXISTS (SELECT 1 FROM storetopics.pending p WHERE p.source_id = x.id AND p.resync),
         EXISTS (SELECT 1 FROM pg_catalog.pg_class c WHERE c.oid = x.chunks)
    FROM storetopics.sources x
   WHERE (p_source IS NULL OR x.chunks = p_source)
     AND (p_store IS NULL
          OR EXISTS (SELECT 1 FROM storetopics.store_state y WHERE y.source_id = x.id AND y.store_key = p_store)
          OR EXISTS (SELECT 1 FROM storetopics.pending p WHERE p.source_id = x.id))
   ORDER BY x.id;
END;

-- The stores of a source (or the one store) with work due after a fold, and which: fit (why a (re-)fit is due, or
-- NULL), words (the clusters' words predate the store's last change: refresh_words() runs the keyword gate), label
-- (a cluster's label is due from an LLM labeller now), render (render_due()).  One pass over each such store, in
-- this order, is what backfill() (SQL), `storetopics backfill` and the worker do.
CREATE OR REPLACE FUNCTION storetopics.stores_due(p_source int, p_store text DEFAULT NULL)
RETURNS TABLE (store_key text, fit text, words boolean, label boolean, render boolean)
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
  SELECT d.store_key, d.fit, d.words, d.label, d.render
    FROM (SELECT st.store_key,
                 CASE WHEN st.files > 0 THEN storetopics.fit_due(st.source_id, st.store_key) END AS fit,
                 st.words_version <> st.version
                   AND EXISTS (SELECT 1 FROM storetopics.clusters k
                                WHERE k.source_id = st.source_id AND k.store_key = st.store_key) AS words,
                 storetopics._settings(st.source_id) ->> 'labeller' <> 'offline'
                   AND (EXISTS (SELECT 1 FROM storetopics.clusters k
                                 WHERE k.source_id = st.source_id AND k.store_key = st.store_key AND k.label_needed
                                   AND k.chunks > 0 AND coalesce(k.label_retry_at, '-infinity') <= now())
                        -- a keyword-only store's labels (storetopics.store_labels_due)
                        OR (st.store_label_needed AND coalesce(st.store_label_retry_at, '-infinity') <= now()))
                   AS label,
                 storetopics.render_due(st) AS render
            FROM storetopics.store_state st
           WHERE st.source_id = p_source AND (p_store IS NULL OR st.store_key = p_store)) d
   WHERE d.fit IS NOT NULL OR d.words OR d.label OR d.render
   ORDER BY d.store_key;
END;

CREATE OR REPLACE FUNCTION storetopics.backfill(store_key text DEFAULT NULL, source regclass DEFAULT NULL)
RETURNS TABLE (source_id int, store text, files bigint, chunks bigint, changed boolean, clusters int)
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  s record;
  v_started timestamptz := clock_timestamp();
BEGIN
  FOR s IN SELECT x.source_id AS id, x.chunks FROM storetopics.backfill_sources(backfill.store_key, backfill.source) x
            WHERE x.present LOOP
    -- One source's failure (its owner lacks a right its expressions need, a row that cannot be read) is that
    -- source's alone: its work is rolled back, the others go on.
    BEGIN
      RETURN QUERY SELECT * FROM storetopics._backfill_source(s.id, backfill.store_key, v_started);
    EXCEPTION WHEN OTHERS THEN
      RAISE WARNING 'storetopics: source % (%) was not brought up to date: %', s.id, s.chunks, SQLERRM
        USING HINT = 'Its summaries stay as they were; fix the cause and run backfill again.';
    END;
  END LOOP;
  RAISE NOTICE 'storetopics: backfill took %', clock_timestamp() - v_started;
END $$;
COMMENT ON FUNCTION storetopics.backfill(text, regclass) IS
  'Fold, cluster (where plpython3u is installed) and render every store of every source (or of one store key, one '
  'table) synchronously; returns the stores rendered.  A source that fails is reported (WARNING) and skipped.';

-- backfill() for one source: fold what was logged before p_started, cluster the stores whose fit is due (inside
-- the database, where plpython3u is), render the stores whose state changed.
CREATE OR REPLACE FUNCTION storetopics._backfill_source(p_source int, p_store text, p_started timestamptz)
RETURNS TABLE (source_id int, store text, files bigint, chunks bigint, changed boolean, clusters int)
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_store record;
  v_done int;
BEGIN
  LOOP
    v_done := storetopics.fold(p_source);
    -- Up to date as of the call: changes logged after it started do not keep it folding (and holding the
    -- source lock) for as long as writers keep writing.
    EXIT WHEN v_done = 0 OR NOT EXISTS (SELECT 1 FROM storetopics.pending p
                                         WHERE p.source_id = p_source AND p.logged_at < p_started);
    RAISE NOTICE 'storetopics: source %: folded % files', p_source, v_done;
  END LOOP;
  FOR v_store IN SELECT d.store_key FROM storetopics.stores_due(p_source, p_store) d WHERE d.fit IS NOT NULL
                  ORDER BY d.store_key LOOP
    IF to_regprocedure('storetopics._fit_in_database(int, text)') IS NOT NULL THEN
      -- clustering inside the database; labels are the offline ones (no network call inside a transaction)
      BEGIN
        PERFORM storetopics.cluster(p_source, v_store.store_key);
      EXCEPTION WHEN OTHERS THEN
        RAISE WARNING 'storetopics: clustering store % of source % failed, its summary keeps the keywords: %',
          v_store.store_key, p_source, SQLERRM;
      END;
    ELSE
      RAISE NOTICE 'storetopics: stores with embeddings are not clustered: plpython3u is not installed here'
        USING HINT = 'Run `storetopics backfill` (CLI) or the worker, which cluster outside the database.';
      EXIT;
    END IF;
  END LOOP;
  RETURN QUERY
    SELECT y.source_id, y.store_key, y.files, y.chunks, storetopics.render(y.source_id, y.store_key),
           (SELECT count(*)::int FROM storetopics.clusters k
             WHERE k.source_id = y.source_id AND k.store_key = y.store_key AND k.chunks > 0)
      FROM storetopics.store_state y
     WHERE y.source_id = p_source AND (p_store IS NULL OR y.store_key = p_store) AND storetopics.render_due(y)
     ORDER BY y.store_key;
END $$;

-- What \df+ shows a DBA.
COMMENT ON FUNCTION storetopics.render_due(storetopics.store_state) IS
  'Whether a store''s summary must be rendered again (its state changed since, or it emptied).';
COMMENT ON FUNCTION storetopics.backfill_sources(text, regclass) IS
  'The sources a backfill of (store key, table) concerns, with whether each is to be recounted whole and whether its table still exists.';
COMMENT ON FUNCTION storetopics.stores_due(int, text) IS
  'The stores of a source with work due (fit, words, label, render): what one refresh pass does to each.';
