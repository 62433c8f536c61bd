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
  v_store record;
  v_started timestamptz := clock_timestamp();
  v_done int;
  v_in_db boolean := to_regprocedure('storetopics._fit_in_database(int, text)') IS NOT NULL;
  v_told boolean := false;
BEGIN
  FOR s IN SELECT x.id FROM storetopics.sources x
            WHERE (backfill.source IS NULL OR x.chunks = backfill.source)
              AND EXISTS (SELECT 1 FROM pg_class c WHERE c.oid = x.chunks)
              AND (backfill.store_key IS NULL
                   OR EXISTS (SELECT 1 FROM storetopics.store_state y
                               WHERE y.source_id = x.id AND y.store_key = backfill.store_key)
                   OR EXISTS (SELECT 1 FROM storetopics.pending p WHERE p.source_id = x.id))
            ORDER BY x.id LOOP
    LOOP
      v_done := storetopics.fold(s.id);
      -- Up to date as of the call: changes logged after it started do not keep it folding (and holding the
      -- source lock) for as long as writers keep writing.
      EXIT WHEN v_done = 0 OR NOT EXISTS (SELECT 1 FROM storetopics.pending p
                                           WHERE p.source_id = s.id AND p.logged_at < v_started);
      RAISE NOTICE 'storetopics: source %: folded % files', s.id, v_done;
    END LOOP;
    FOR v_store IN SELECT st.store_key FROM storetopics.store_state st
              WHERE st.source_id = s.id AND (backfill.store_key IS NULL OR st.store_key = backfill.store_key)
                AND st.files > 0 AND storetopics.fit_due(s.id, st.store_key) IS NOT NULL
              ORDER BY st.store_key LOOP
      IF v_in_db THEN
        -- clustering inside the database; labels are the offline ones (no network call inside a transaction)
        BEGIN
          PERFORM storetopics.cluster(s.id, v_store.store_key);
        EXCEPTION WHEN OTHERS THEN
          RAISE WARNING 'storetopics: clustering store % of source % failed, its summary keeps the keywords: %',
            v_store.store_key, s.id, SQLERRM;
        END;
      ELSIF NOT v_told THEN
        RAISE NOTICE 'storetopics: stores with embeddings are not clustered: plpython3u is not installed here'
          USING HINT = 'Run `storetopics backfill` (CLI) or the worker, which cluster outside the database.';
        v_told := true;
      END IF;
    END LOOP;
    RETURN QUERY
      SELECT y2.source_id, y2.store_key, y2.files, y2.chunks, storetopics.render(y2.source_id, y2.store_key),
             (SELECT count(*)::int FROM storetopics.clusters k
               WHERE k.source_id = y2.source_id AND k.store_key = y2.store_key AND k.chunks > 0)
        FROM storetopics.store_state y2
       WHERE y2.source_id = s.id AND (backfill.store_key IS NULL OR y2.store_key = backfill.store_key)
         AND storetopics.render_due(y2)
       ORDER BY y2.store_key;
  END LOOP;
  RAISE NOTICE 'storetopics: backfill took %', clock_timestamp() - v_started;
END $$;
