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

CREATE OR REPLACE FUNCTION storetopics.backfill(store_key text DEFAULT NULL, source regclass DEFAULT NULL)
RETURNS TABLE (source_id int, store text, files bigint, chunks bigint, changed boolean, clusters int)
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  s record;
  v_started timestamptz := clock_timestamp();
BEGIN
  FOR s IN SELECT x.id, x.chunks FROM storetopics.sources x
            WHERE (backfill.source IS NULL OR x.chunks = backfill.source)
              AND EXISTS (SELECT 1 FROM pg_class c WHERE c.oid = x.chunks)
              AND (backfill.store_key IS NULL
                   OR EXISTS (SELECT 1 FROM storetopics.store_state y
                               WHERE y.source_id = x.id AND y.store_key = backfill.store_key)
                   OR EXISTS (SELECT 1 FROM storetopics.pending p WHERE p.source_id = x.id))
            ORDER BY x.id LOOP
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
  FOR v_store IN SELECT st.store_key FROM storetopics.store_state st
                  WHERE st.source_id = p_source AND (p_store IS NULL OR st.store_key = p_store)
                    AND st.files > 0 AND storetopics.fit_due(p_source, st.store_key) IS NOT NULL
                  ORDER BY st.store_key LOOP
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
