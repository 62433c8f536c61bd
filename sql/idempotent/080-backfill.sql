-- ------------------------------------------------------------------------------------------------------------
-- Backfill: everything up to date, synchronously, from SQL
-- ------------------------------------------------------------------------------------------------------------
-- backfill() brings every store of every source up to date; backfill('key') the stores with that key;
-- backfill(source => 'public.chunks') one source.  Folds all pending changes of the sources concerned (a file can
-- move between stores, so a source is folded as a whole), then renders the stores whose state changed.
-- A store's summary is due for rendering when what it is rendered from changed since (fold, fit, labels and
-- settings bump store_state.version; a counter, not a clock, so no commit order can hide a change), or when the
-- store was emptied (render then removes it).
CREATE OR REPLACE FUNCTION storetopics._render_due(st storetopics.store_state) RETURNS boolean
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
RETURN st.rendered_version <> st.version OR st.files <= 0;

-- The sources a backfill concerns (all, one table, or those that hold or may come to hold a store key), one row
-- each: present is false for a table dropped without detach (skipped, with a warning); resync when the source is
-- to be recounted whole (attach, TRUNCATE).  The SQL backfill() and the CLI's select the same way.
CREATE OR REPLACE FUNCTION storetopics._backfill_sources(p_store text DEFAULT NULL, p_source regclass DEFAULT NULL)
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
CREATE OR REPLACE FUNCTION storetopics._stores_due(p_source int, p_store text DEFAULT NULL)
RETURNS TABLE (store_key text, fit text, words boolean, label boolean, render boolean)
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
  SELECT d.store_key, d.fit, d.words, d.label, d.render
    FROM (SELECT st.store_key,
                 CASE WHEN st.files > 0 THEN storetopics._fit_due(st.source_id, st.store_key) END AS fit,
                 st.words_version <> st.version
                   AND EXISTS (SELECT 1 FROM storetopics.clusters k
                                WHERE k.source_id = st.source_id AND k.store_key = st.store_key) AS words,
                 storetopics._llm_labeller(st.source_id)
                   AND (EXISTS (SELECT 1 FROM storetopics.clusters k
                                 WHERE k.source_id = st.source_id AND k.store_key = st.store_key AND k.label_needed
                                   AND k.chunks > 0 AND coalesce(k.label_retry_at, '-infinity') <= now())
                        -- a keyword-only store's labels (storetopics._store_labels_due)
                        OR (st.store_label_needed AND coalesce(st.store_label_retry_at, '-infinity') <= now()))
                   AS label,
                 storetopics._render_due(st) AS render
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
  FOR s IN SELECT x.source_id AS id, x.chunks FROM storetopics._backfill_sources(backfill.store_key, backfill.source) x
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

-- backfill() for one source: fold what was logged before p_started (refresh(): until p_until, the rest is left
-- pending), cluster the stores whose fit is due (inside the database, where plpython3u is), render the stores whose
-- state changed.
CREATE OR REPLACE FUNCTION storetopics._backfill_source(p_source int, p_store text, p_started timestamptz,
                                                       p_until timestamptz DEFAULT 'infinity')
RETURNS TABLE (source_id int, store text, files bigint, chunks bigint, changed boolean, clusters int)
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_store record;
  v_done int;
BEGIN
  LOOP
    v_done := storetopics._fold(p_source);
    -- Up to date as of the call: changes logged after it started do not keep it folding (and holding the
    -- source lock) for as long as writers keep writing.
    EXIT WHEN v_done = 0 OR clock_timestamp() >= p_until
              OR NOT EXISTS (SELECT 1 FROM storetopics.pending p
                              WHERE p.source_id = p_source AND p.logged_at < p_started);
    RAISE NOTICE 'storetopics: source %: folded % files', p_source, v_done;
  END LOOP;
  FOR v_store IN SELECT d.store_key FROM storetopics._stores_due(p_source, p_store) d WHERE d.fit IS NOT NULL
                  ORDER BY d.store_key LOOP
    IF to_regprocedure('storetopics._fit_in_database(int, text)') IS NOT NULL THEN
      -- clustering inside the database; labels are the offline ones (no network call inside a transaction)
      BEGIN
        PERFORM storetopics._cluster(p_source, v_store.store_key);
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
    SELECT y.source_id, y.store_key, y.files, y.chunks, storetopics._render(y.source_id, y.store_key),
           (SELECT count(*)::int FROM storetopics.clusters k
             WHERE k.source_id = y.source_id AND k.store_key = y.store_key AND k.chunks > 0)
      FROM storetopics.store_state y
     WHERE y.source_id = p_source AND (p_store IS NULL OR y.store_key = p_store) AND storetopics._render_due(y)
     ORDER BY y.store_key;
END $$;

-- refresh(): the worker's loop as one SQL call, for a scheduler inside the database (pg_cron) where no worker process
-- can run.  It does what the worker does, by the worker's functions: the sources whose changes name no store when
-- they are quiet (sources_to_fold), then each store claim() says is due (debounce, max_staleness, backoff, paused; a
-- store leased to a worker is not due), one at a time: folded, clustered where plpython3u is installed and rendered
-- as backfill() does it (_backfill_source; labels are the offline ones: no network call from SQL, an LLM labeller's
-- labels stay due for a worker), then handed back with work_done() (a failed store keeps its summary and backs
-- off).  No step (a table's fold, a store's pass) is started once time_budget is spent, but one is done per call
-- at least; a step under way runs to its end (a fold stops between batches): a statement_timeout around the call is
-- the hard limit, and a call that runs into it is rolled back whole (the stores stay dirty).  One call at a time
-- per database (another returns at once).  It is one transaction: its leases and results show when it commits, in
-- worker_status() as the worker 'storetopics.refresh()' (last_seen: when the last call began).  Returns the stores
-- it passed over.
CREATE OR REPLACE FUNCTION storetopics.refresh(time_budget interval DEFAULT interval '1 minute')
RETURNS TABLE (source_id int, store_key text, outcome text, changed boolean)
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
  v_worker constant text := 'storetopics.refresh()';
  v_started constant timestamptz := clock_timestamp();
  v_until constant timestamptz := clock_timestamp() + coalesce(time_budget, interval '0');
  v_source int;
  c record;
  v_changed boolean;
  v_outcome text;
  v_steps int := 0;   -- tables folded and stores passed over
BEGIN
  IF NOT pg_try_advisory_xact_lock(hashtext('storetopics.refresh')) THEN
    RAISE NOTICE 'storetopics: another refresh() is running in this database; this one does nothing';
    RETURN;
  END IF;
  PERFORM storetopics._worker_heartbeat(v_worker, nullif(current_setting('application_name'), ''), pg_backend_pid(),
                                       greatest(60, extract(epoch FROM time_budget)::float8));
  PERFORM storetopics._verify_due();
  FOR v_source IN SELECT f FROM storetopics._sources_to_fold() f LOOP
    EXIT WHEN v_steps > 0 AND clock_timestamp() >= v_until;
    v_steps := v_steps + 1;
    BEGIN
      LOOP
        EXIT WHEN storetopics._fold(v_source) = 0 OR clock_timestamp() >= v_until;
      END LOOP;
    EXCEPTION WHEN OTHERS THEN
      RAISE WARNING 'storetopics: source % was not folded: %', v_source, SQLERRM;
    END;
  END LOOP;
  LOOP
    EXIT WHEN v_steps > 0 AND clock_timestamp() >= v_until;
    SELECT * INTO c FROM storetopics._claim(v_worker, greatest(60, extract(epoch FROM time_budget)::float8), 1);
    EXIT WHEN NOT FOUND;
    v_steps := v_steps + 1;
    BEGIN
      SELECT bool_or(b.changed) INTO v_changed
        FROM storetopics._backfill_source(c.source_id, c.store_key, v_started, v_until) b;
      v_outcome := storetopics._work_done(v_worker, c.source_id, c.store_key, c.generation, coalesce(v_changed, false));
    EXCEPTION WHEN OTHERS THEN
      v_changed := false;
      v_outcome := storetopics._work_done(v_worker, c.source_id, c.store_key, c.generation, false, SQLERRM);
      RAISE WARNING 'storetopics: store % of source % was not refreshed: %', c.store_key, c.source_id, SQLERRM;
    END;
    source_id := c.source_id;
    store_key := c.store_key;
    outcome := v_outcome;
    changed := coalesce(v_changed, false);
    RETURN NEXT;
  END LOOP;
  PERFORM storetopics._worker_stop(v_worker);
END $$;
COMMENT ON FUNCTION storetopics.refresh(interval) IS
  'The worker''s loop in one SQL call, for pg_cron: the stores due by the worker''s rules (debounce, max_staleness, '
  'backoff, pause, leases) folded, clustered where plpython3u is, rendered with offline labels, until time_budget is '
  'spent (one step at least); one call at a time.  Shows in worker_status() as storetopics.refresh().';

-- What \df+ shows a DBA.
COMMENT ON FUNCTION storetopics._render_due(storetopics.store_state) IS
  'Whether a store''s summary must be rendered again (its state changed since, or it emptied).';
COMMENT ON FUNCTION storetopics._backfill_sources(text, regclass) IS
  'The sources a backfill of (store key, table) concerns, with whether each is to be recounted whole and whether its table still exists.';
COMMENT ON FUNCTION storetopics._stores_due(int, text) IS
  'The stores of a source with work due (fit, words, label, render): what one refresh pass does to each.';
