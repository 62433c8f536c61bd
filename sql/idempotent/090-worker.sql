-- ------------------------------------------------------------------------------------------------------------
-- The worker: leases per store, debounce, heartbeats (storetopics worker)
-- ------------------------------------------------------------------------------------------------------------
-- Stores whose labelling calls failed this many times in a row, or whose passes failed this many times, show as
-- 'failing' (they keep being retried, with backoff, and recover by themselves).
CREATE OR REPLACE FUNCTION storetopics._failing_after() RETURNS int
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp
RETURN 3;

-- Whether a store has work the worker has not done: changes logged that may concern it (a NULL store key is a
-- delete, a resync or a key not known when logged), a render due, or a labelling retry come due.
CREATE OR REPLACE FUNCTION storetopics._store_dirty(p_source int, p_store text) RETURNS boolean
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
RETURN EXISTS (SELECT 1 FROM storetopics.pending p
                WHERE p.source_id = p_source AND (p.store_key = p_store OR p.store_key IS NULL))
    OR EXISTS (SELECT 1 FROM storetopics.store_state st
                WHERE st.source_id = p_source AND st.store_key = p_store AND storetopics._render_due(st))
    OR (storetopics._llm_labeller(p_source)
        AND (EXISTS (SELECT 1 FROM storetopics.clusters k
                      WHERE k.source_id = p_source AND k.store_key = p_store AND k.label_needed AND k.chunks > 0
                        AND k.label_retry_at <= now())
             OR EXISTS (SELECT 1 FROM storetopics.store_state st
                         WHERE st.source_id = p_source AND st.store_key = p_store AND st.store_label_needed
                           AND st.store_label_retry_at <= now())));

-- Record what changed since the last look: stores with logged changes, stores folded but not rendered since, and
-- stores whose labelling retry came due.  One session at a time (the others skip: the one syncing serves them).
-- A new change bumps the store's generation; the first one sets dirty_since.  Changes that name no store (deletes,
-- TRUNCATE, attach) are found by fold(), which bumps the versions of the stores they touched.  A fold is no change
-- of its own: a store already dirty from the changes it folded keeps its last change time (its debounce counts from
-- its writes, not from another store's pass that folded them).
CREATE OR REPLACE FUNCTION storetopics._work_sync() RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  IF NOT pg_try_advisory_xact_lock(hashtext('storetopics.work sync')) THEN
    RETURN;
  END IF;
  DELETE FROM storetopics.work w WHERE NOT EXISTS (SELECT 1 FROM storetopics.sources s WHERE s.id = w.source_id);
  WITH seen AS (
    SELECT p.source_id, p.store_key, min(p.logged_at) AS first, max(p.logged_at) AS last, true AS logged
      FROM storetopics.pending p
     WHERE p.store_key IS NOT NULL AND char_length(p.store_key) <= storetopics._max_store_key()   -- else never a store
     GROUP BY 1, 2
    UNION ALL
    SELECT st.source_id, st.store_key, coalesce(st.folded_at, now()), coalesce(st.folded_at, now()), false
      FROM storetopics.store_state st
     WHERE storetopics._render_due(st)
    UNION ALL
    SELECT k.source_id, k.store_key, min(k.label_retry_at), min(k.label_retry_at), true
      FROM storetopics.clusters k
     WHERE k.label_needed AND k.chunks > 0 AND k.label_retry_at <= now()
       AND storetopics._llm_labeller(k.source_id)
     GROUP BY 1, 2
    UNION ALL
    SELECT st.source_id, st.store_key, st.store_label_retry_at, st.store_label_retry_at, true
      FROM storetopics.store_state st
     WHERE st.store_label_needed AND st.store_label_retry_at <= now()
       AND storetopics._llm_labeller(st.source_id)
  ), agg AS (
    SELECT s.source_id, s.store_key, min(s.first) AS first, max(s.last) AS last, bool_or(s.logged) AS logged
      FROM seen s GROUP BY 1, 2
  )
  -- (generation carries whether the change was logged, for the WHERE below; a new row starts at 0 or 1)
  INSERT INTO storetopics.work AS w (source_id, store_key, dirty_since, changed_at, generation)
  SELECT a.source_id, a.store_key, a.first, a.last, a.logged::int FROM agg a ORDER BY 1, 2
  ON CONFLICT (source_id, store_key) DO UPDATE
     SET dirty_since = coalesce(w.dirty_since, excluded.dirty_since),
         changed_at = greatest(w.changed_at, excluded.changed_at),
         generation = w.generation + 1
   WHERE (w.dirty_since IS NULL OR w.changed_at IS NULL OR excluded.changed_at > w.changed_at)
     -- a version bumped by the lease holder's own fold is no change underneath it
     AND (excluded.generation = 1 OR w.leased_by IS NULL OR w.lease_expires < now())
     -- nor is a fold of changes already seen (excluded.generation 0: only folded, nothing logged)
     AND (excluded.generation = 1 OR w.dirty_since IS NULL OR w.changed_at IS NULL);
END $$;

-- When a dirty store is due: quiet for `debounce` seconds since its last change, or dirty for `max_staleness`.
CREATE OR REPLACE FUNCTION storetopics._work_due_at(w storetopics.work, cfg jsonb) RETURNS timestamptz
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
RETURN CASE WHEN w.dirty_since IS NOT NULL THEN
  greatest(least(coalesce(w.changed_at, w.dirty_since) + make_interval(secs => (cfg ->> 'debounce')::float8),
                 w.dirty_since + make_interval(secs => (cfg ->> 'max_staleness')::float8)),
           coalesce(w.next_attempt_at, '-infinity')) END;

-- Why a dirty store is due when _work_due_at says: 'debounce' (quiet for `debounce` seconds after its last change),
-- 'max_staleness' (dirty that long under a steady stream of changes) or 'backoff' (a failed pass is tried again).
CREATE OR REPLACE FUNCTION storetopics._work_due_why(w storetopics.work, cfg jsonb) RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
RETURN CASE WHEN w.dirty_since IS NULL THEN NULL
            WHEN w.next_attempt_at > least(
                   coalesce(w.changed_at, w.dirty_since) + make_interval(secs => (cfg ->> 'debounce')::float8),
                   w.dirty_since + make_interval(secs => (cfg ->> 'max_staleness')::float8)) THEN 'backoff'
            WHEN coalesce(w.changed_at, w.dirty_since) + make_interval(secs => (cfg ->> 'debounce')::float8)
                 <= w.dirty_since + make_interval(secs => (cfg ->> 'max_staleness')::float8) THEN 'debounce'
            ELSE 'max_staleness' END;

-- Sources whose logged changes name no store (deletes, TRUNCATE, attach, keys unknown when logged), debounced like
-- stores (p_now: at once, `worker --now`): the worker folds them, and the stores the fold touched become dirty.
CREATE OR REPLACE FUNCTION storetopics._sources_to_fold(p_now boolean DEFAULT false) RETURNS SETOF int
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
  SELECT p.source_id
    FROM storetopics.pending p
    JOIN storetopics.sources s ON s.id = p.source_id
    JOIN pg_catalog.pg_class t ON t.oid = s.chunks   -- (a table dropped where no event trigger saw it: skipped)
   WHERE p.store_key IS NULL AND NOT (storetopics._settings(s.id) ->> 'paused')::boolean
   GROUP BY p.source_id
  HAVING p_now
      OR least(max(p.logged_at) + make_interval(secs => (storetopics._settings(p.source_id) ->> 'debounce')::float8),
               min(p.logged_at) + make_interval(secs => (storetopics._settings(p.source_id) ->> 'max_staleness')::float8))
         <= now()
   ORDER BY 1;
END;

-- Register a worker, or beat its heart: last_seen, the store it works on, and its leases extended by p_lease
-- seconds.  Returns how many leases it still holds.
CREATE OR REPLACE FUNCTION storetopics._worker_heartbeat(p_worker text, p_host text DEFAULT NULL, p_pid int DEFAULT NULL,
                                             p_lease float8 DEFAULT 60, p_source int DEFAULT NULL,
                                             p_store text DEFAULT NULL) RETURNS int
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_n int;
BEGIN
  -- Lock order everywhere: work rows, then the workers row (work_done and worker_stop do the same; the heartbeat
  -- runs on its own connection beside the worker's).
  UPDATE storetopics.work SET lease_expires = now() + make_interval(secs => p_lease)
   WHERE leased_by = p_worker AND lease_expires >= now();
  GET DIAGNOSTICS v_n = ROW_COUNT;
  INSERT INTO storetopics.workers AS x (id, host, pid, lease_seconds, source_id, store_key)
  VALUES (p_worker, p_host, p_pid, p_lease, p_source, p_store)
  ON CONFLICT (id) DO UPDATE SET last_seen = now(), lease_seconds = excluded.lease_seconds,
                                 source_id = excluded.source_id, store_key = excluded.store_key,
                                 host = coalesce(excluded.host, x.host), pid = coalesce(excluded.pid, x.pid),
                                 stopped_at = NULL;
  RETURN v_n;
END $$;

-- Claim up to p_limit due stores for p_worker, leased for p_lease seconds (renewed by worker_heartbeat).
-- Due: dirty, quiet for `debounce` or dirty for `max_staleness`, its backoff over, its source not paused (nor its
-- table dropped where no event trigger saw it: detach_dropped() forgets such a source), and no live lease on it.
-- Returns the stores with the generation the result is checked against in work_done().
-- Stores of a source whose last pass over some store failed come after every other due store: a source whose
-- passes keep failing (a tenant's key expression that runs into the worker's time limit, and a fold fails for every
-- store of its source) is served when nothing else is waiting, so it holds the others up by the one pass in flight
-- at most, however many stores it has.  p_now (`worker --now`): a dirty store is due at once, debounce and
-- max_staleness aside (the backoff of a failed pass still holds).
CREATE OR REPLACE FUNCTION storetopics._claim(p_worker text, p_lease float8 DEFAULT 60, p_limit int DEFAULT 1,
                                             p_now boolean DEFAULT false)
RETURNS TABLE (source_id int, store_key text, generation bigint, takeover boolean)
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
BEGIN
  PERFORM storetopics._work_sync();
  RETURN QUERY
  WITH c AS (
    SELECT w.source_id, w.store_key, w.leased_by IS NOT NULL AS takeover
      FROM storetopics.work w
      JOIN storetopics.sources s ON s.id = w.source_id
      JOIN pg_catalog.pg_class t ON t.oid = s.chunks   -- (a table dropped where no event trigger saw it: skipped)
     CROSS JOIN LATERAL storetopics._settings(s.id) AS cfg
     WHERE w.dirty_since IS NOT NULL
       AND (w.leased_by IS NULL OR w.lease_expires < now())
       AND NOT (cfg ->> 'paused')::boolean
       AND (storetopics._work_due_at(w, cfg) <= now() OR p_now AND coalesce(w.next_attempt_at, now()) <= now())
     ORDER BY EXISTS (SELECT 1 FROM storetopics.work f WHERE f.source_id = w.source_id AND f.attempts > 0),
              storetopics._work_due_at(w, cfg), w.source_id, w.store_key
     LIMIT p_limit
       FOR UPDATE OF w SKIP LOCKED)
  UPDATE storetopics.work w
     SET leased_by = p_worker, lease_expires = now() + make_interval(secs => p_lease), claimed_at = now(),
         claimed_generation = w.generation, takeovers = w.takeovers + c.takeover::int
    FROM c
   WHERE w.source_id = c.source_id AND w.store_key = c.store_key
  RETURNING w.source_id, w.store_key, w.generation, c.takeover;
END $$;

-- Seconds until a store or a source can next be claimed (0: now; NULL: nothing dirty): how long a worker with
-- nothing to do may sleep before polling again (it also wakes on NOTIFY storetopics_dirty).  (NULL stays NULL:
-- greatest(0, NULL) is 0, which would have an idle worker poll without rest.)
CREATE OR REPLACE FUNCTION storetopics._next_due() RETURNS float8
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
RETURN (SELECT greatest(0, extract(epoch FROM d.due - now()))
          FROM (SELECT min(greatest(storetopics._work_due_at(w, cfg), coalesce(w.lease_expires, '-infinity'))) AS due
                  FROM storetopics.work w
                  JOIN storetopics.sources s ON s.id = w.source_id
                  JOIN pg_catalog.pg_class t ON t.oid = s.chunks
                 CROSS JOIN LATERAL storetopics._settings(s.id) AS cfg
                 WHERE w.dirty_since IS NOT NULL AND NOT (cfg ->> 'paused')::boolean) d
         WHERE d.due IS NOT NULL);

-- Whether p_worker still holds the lease on a store (checked before each labelling call and by work_render).
CREATE OR REPLACE FUNCTION storetopics._lease_held(p_worker text, p_source int, p_store text) RETURNS boolean
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
RETURN EXISTS (SELECT 1 FROM storetopics.work w
                WHERE w.source_id = p_source AND w.store_key = p_store AND w.leased_by = p_worker
                  AND w.lease_expires >= now());

-- render() for a lease holder: NULL (nothing written) when the lease was lost, e.g. the worker stalled past its
-- expiry and another worker took the store over, or, with count_first, when token counts are missing (see render).
-- The work row stays locked until the render commits.
CREATE OR REPLACE FUNCTION storetopics._work_render(p_worker text, p_source int, p_store text,
                                                  count_first boolean DEFAULT false) RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  PERFORM 1 FROM storetopics.work w
    WHERE w.source_id = p_source AND w.store_key = p_store AND w.leased_by = p_worker AND w.lease_expires >= now()
      FOR UPDATE;
  IF NOT FOUND THEN
    RETURN NULL;
  END IF;
  RETURN storetopics._render(p_source, p_store, count_first);
END $$;

-- A pass over a store ended: release the lease.  Compare-and-set: the store becomes clean only if its generation
-- is still the one claimed and nothing is left to do (_store_dirty); otherwise it stays dirty (changes that came
-- during the pass are due after their own debounce).  A failed pass (p_error) keeps it dirty and backs off
-- exponentially with jitter (5 s doubling, capped at 10 minutes).  Returns 'clean', 'dirty', 'failed' or NULL
-- when the lease was no longer held (another worker has the store: nothing is written).
CREATE OR REPLACE FUNCTION storetopics._work_done(p_worker text, p_source int, p_store text, p_generation bigint,
                                      p_changed boolean DEFAULT false, p_error text DEFAULT NULL,
                                      p_label_calls int DEFAULT 0) RETURNS text
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  w storetopics.work;
  v_result text;
BEGIN
  SELECT * INTO w FROM storetopics.work x
   WHERE x.source_id = p_source AND x.store_key = p_store AND x.leased_by = p_worker FOR UPDATE;
  IF NOT FOUND THEN
    RETURN NULL;
  END IF;
  IF p_error IS NOT NULL THEN
    v_result := 'failed';
    UPDATE storetopics.work x
       SET attempts = x.attempts + 1, last_error = left(p_error, 500),
           next_attempt_at = now() + make_interval(secs => least(600, 5 * 2 ^ least(x.attempts, 20))
                                                           * (0.5 + random() / 2)),
           dirty_since = coalesce(x.dirty_since, now())
     WHERE x.source_id = p_source AND x.store_key = p_store;
  ELSIF w.generation = p_generation AND NOT storetopics._store_dirty(p_source, p_store) THEN
    v_result := 'clean';
    UPDATE storetopics.work x SET dirty_since = NULL, attempts = 0, last_error = NULL, next_attempt_at = NULL
     WHERE x.source_id = p_source AND x.store_key = p_store;
  ELSE
    v_result := 'dirty';
    UPDATE storetopics.work x SET dirty_since = greatest(x.dirty_since, x.claimed_at),
           changed_at = greatest(x.changed_at, x.claimed_at), attempts = 0, last_error = NULL, next_attempt_at = NULL
     WHERE x.source_id = p_source AND x.store_key = p_store;
  END IF;
  UPDATE storetopics.work x
     SET leased_by = NULL, lease_expires = NULL, last_done_at = now(),
         processed = x.processed + (p_error IS NULL)::int, regenerated = x.regenerated + coalesce(p_changed, false)::int
   WHERE x.source_id = p_source AND x.store_key = p_store;
  UPDATE storetopics.workers x
     SET processed = x.processed + (p_error IS NULL)::int, failures = x.failures + (p_error IS NOT NULL)::int,
         regenerated = x.regenerated + coalesce(p_changed, false)::int, label_calls = x.label_calls + p_label_calls,
         source_id = NULL, store_key = NULL, last_seen = now()
   WHERE x.id = p_worker;
  RETURN v_result;
END $$;

-- A worker stopping (SIGTERM) gives its leases back at once: the stores stay dirty and another worker takes them.
CREATE OR REPLACE FUNCTION storetopics._worker_stop(p_worker text) RETURNS int
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_n int;
BEGIN
  UPDATE storetopics.work SET leased_by = NULL, lease_expires = NULL WHERE leased_by = p_worker;
  GET DIAGNOSTICS v_n = ROW_COUNT;
  UPDATE storetopics.workers SET stopped_at = now(), last_seen = now(), source_id = NULL, store_key = NULL
   WHERE id = p_worker;
  RETURN v_n;
END $$;

-- Per store: idle, dirty (due at due_at), working (leased), failing (labelling or passes failed failing_after()
-- times in a row; retried with backoff), with the last error, last update and LLM cost.
CREATE OR REPLACE FUNCTION storetopics.work_status()
RETURNS TABLE (source regclass, source_id int, store_key text, state text, dirty_since timestamptz,
               changed_at timestamptz, due_at timestamptz, leased_by text, lease_expires timestamptz, attempts int,
               last_error text, next_attempt_at timestamptz, label_failures int, label_retry_at timestamptz,
               processed bigint, regenerated bigint, takeovers bigint, last_done_at timestamptz,
               updated_at timestamptz, label_calls bigint, cost_usd numeric)
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
SELECT s.chunks AS source, x.source_id, x.store_key,
       CASE WHEN coalesce(w.attempts, 0) >= storetopics._failing_after()
              OR coalesce(k.label_failures, 0) >= storetopics._failing_after() THEN 'failing'
            WHEN w.leased_by IS NOT NULL AND w.lease_expires >= now() THEN 'working'
            WHEN w.dirty_since IS NOT NULL OR storetopics._store_dirty(x.source_id, x.store_key) THEN 'dirty'
            ELSE 'idle' END AS state,
       w.dirty_since, w.changed_at, storetopics._work_due_at(w, storetopics._settings(x.source_id)) AS due_at,
       w.leased_by, w.lease_expires, w.attempts, coalesce(w.last_error, k.label_error) AS last_error,
       w.next_attempt_at, k.label_failures, k.label_retry_at, coalesce(w.processed, 0) AS processed,
       coalesce(w.regenerated, 0) AS regenerated, coalesce(w.takeovers, 0) AS takeovers, w.last_done_at,
       st.updated_at, coalesce(l.calls, 0) AS label_calls, coalesce(l.cost_usd, 0) AS cost_usd
  FROM (SELECT st.source_id, st.store_key FROM storetopics.store_state st
        UNION SELECT w.source_id, w.store_key FROM storetopics.work w) x
  JOIN storetopics.sources s ON s.id = x.source_id
  LEFT JOIN storetopics.work w ON w.source_id = x.source_id AND w.store_key = x.store_key
  LEFT JOIN storetopics.store_state st ON st.source_id = x.source_id AND st.store_key = x.store_key
  -- the labels waiting for a retry: the clusters', or a keyword-only store's
  LEFT JOIN LATERAL (SELECT max(c.label_failures) AS label_failures, min(c.label_retry_at) AS label_retry_at,
                            (array_agg(c.label_error ORDER BY c.label_failures DESC)
                               FILTER (WHERE c.label_failures > 0))[1] AS label_error
                       FROM (SELECT c.label_failures, c.label_retry_at, c.label_error FROM storetopics.clusters c
                              WHERE c.source_id = x.source_id AND c.store_key = x.store_key AND c.chunks > 0
                                AND c.label_needed
                             UNION ALL
                             SELECT st.store_label_failures, st.store_label_retry_at, st.store_label_error
                              WHERE st.store_label_needed) c) k ON true
  LEFT JOIN LATERAL (SELECT count(*) AS calls, sum(g.cost_usd) AS cost_usd FROM storetopics.label_ledger g
                      WHERE g.source_id = x.source_id AND g.store_key = x.store_key) l ON true
 WHERE st.files > 0 OR w.dirty_since IS NOT NULL;
END;

-- What waits for a worker, and when it is due (`storetopics worker --once` and `status` say it): each dirty store not
-- leased, its due time and why (_work_due_why; 'paused' with no due time for a paused source); logged changes of a
-- store no worker has looked at yet, debounced the same way; and per source with changes that name no store
-- (attach, DELETE, TRUNCATE), a row with store_key NULL: they are folded first, when quiet like a store.
CREATE OR REPLACE FUNCTION storetopics.work_due()
RETURNS TABLE (source regclass, source_id int, store_key text, due_at timestamptz, why text)
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
SELECT s.chunks, x.source_id, x.store_key, CASE WHEN NOT (cfg ->> 'paused')::boolean THEN x.due_at END,
       CASE WHEN (cfg ->> 'paused')::boolean THEN 'paused' ELSE x.why END
  FROM (SELECT w.source_id, w.store_key, storetopics._work_due_at(w, storetopics._settings(w.source_id)) AS due_at,
               storetopics._work_due_why(w, storetopics._settings(w.source_id)) AS why
          FROM storetopics.work w
         WHERE w.dirty_since IS NOT NULL AND (w.leased_by IS NULL OR w.lease_expires < now())
        UNION ALL
        SELECT p.source_id, p.store_key,
               least(p.last + make_interval(secs => (storetopics._settings(p.source_id) ->> 'debounce')::float8),
                     p.first + make_interval(secs => (storetopics._settings(p.source_id) ->> 'max_staleness')::float8)),
               CASE WHEN p.last + make_interval(secs => (storetopics._settings(p.source_id) ->> 'debounce')::float8)
                         <= p.first + make_interval(secs => (storetopics._settings(p.source_id) ->> 'max_staleness')::float8)
                    THEN 'debounce' ELSE 'max_staleness' END
          FROM (SELECT q.source_id, q.store_key, min(q.logged_at) AS first, max(q.logged_at) AS last
                  FROM storetopics.pending q
                 WHERE q.store_key IS NULL OR char_length(q.store_key) <= storetopics._max_store_key()
                 GROUP BY 1, 2) p
         WHERE p.store_key IS NULL
            OR NOT EXISTS (SELECT 1 FROM storetopics.work w
                            WHERE w.source_id = p.source_id AND w.store_key = p.store_key
                              AND w.dirty_since IS NOT NULL)) x
  JOIN storetopics.sources s ON s.id = x.source_id
  JOIN pg_catalog.pg_class t ON t.oid = s.chunks
 CROSS JOIN LATERAL storetopics._settings(s.id) AS cfg
 ORDER BY 4 NULLS LAST, 2, 3 NULLS FIRST;
END;

-- Workers (a function, like work_status): alive while their heartbeat is younger than two leases.
CREATE OR REPLACE FUNCTION storetopics.worker_status()
RETURNS TABLE (id text, host text, pid int, started_at timestamptz, last_seen timestamptz, alive boolean,
               stopped_at timestamptz, source_id int, store_key text, processed bigint, regenerated bigint,
               failures bigint, label_calls bigint)
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
SELECT x.id, x.host, x.pid, x.started_at, x.last_seen,
       x.stopped_at IS NULL AND x.last_seen > now() - make_interval(secs => 2 * x.lease_seconds) AS alive,
       x.stopped_at, x.source_id, x.store_key, x.processed, x.regenerated, x.failures, x.label_calls
  FROM storetopics.workers x;
END;

-- The periodic count check (verify()): sources whose last check is older than their settings.verify_every seconds
-- get a count-check event; their next fold compares every file's live chunk count with the folded one.  Called by
-- the worker on every tick (cheap: one row per source).  Returns how many sources were asked.
CREATE OR REPLACE FUNCTION storetopics._verify_due() RETURNS int
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_n int;
BEGIN
  WITH due AS (
    UPDATE storetopics.sources s SET checked_at = now()
     WHERE (storetopics._settings(s.id) ->> 'verify_every')::float8 > 0
       AND coalesce(s.checked_at, s.attached_at)
           + make_interval(secs => (storetopics._settings(s.id) ->> 'verify_every')::float8) <= now()
       AND NOT (storetopics._settings(s.id) ->> 'paused')::boolean
       AND EXISTS (SELECT 1 FROM pg_class c WHERE c.oid = s.chunks)
    RETURNING s.id, s.owner)
  INSERT INTO storetopics.pending (source_id, deletes, logged_by) SELECT due.id, true, due.owner FROM due;
  GET DIAGNOSTICS v_n = ROW_COUNT;
  RETURN v_n;
END $$;
COMMENT ON FUNCTION storetopics._verify_due() IS
  'For the worker: ask a count check (see verify()) of every source whose last one is older than verify_every.';

-- What \df+ shows a DBA.
COMMENT ON FUNCTION storetopics._failing_after() IS
  'Failures in a row after which a store shows as failing (3).';
COMMENT ON FUNCTION storetopics._sources_to_fold(boolean) IS
  'For the worker: sources whose logged changes name no store (deletes, TRUNCATE, attach), debounced (p_now: all).';
COMMENT ON FUNCTION storetopics._worker_heartbeat(text, text, int, float8, int, text) IS
  'For the worker: register or beat a worker''s heart and extend its leases; returns how many it holds.';
COMMENT ON FUNCTION storetopics._claim(text, float8, int, boolean) IS
  'For the worker: lease up to p_limit due stores (FOR UPDATE SKIP LOCKED; p_now: every dirty store is due); '
  'returns them with their generation.';
COMMENT ON FUNCTION storetopics.work_due() IS
  'What waits for a worker: each dirty store (and each source with changes that name no store), when it is due and '
  'why: debounce, max_staleness, backoff or paused.';
COMMENT ON FUNCTION storetopics._next_due() IS
  'For the worker: seconds until a store can next be claimed (NULL: nothing dirty).';
COMMENT ON FUNCTION storetopics._lease_held(text, int, text) IS
  'For the worker: whether it still holds its lease on a store.';
COMMENT ON FUNCTION storetopics._work_render(text, int, text, boolean) IS
  'For the worker: render() if the lease is still held (NULL otherwise).';
COMMENT ON FUNCTION storetopics._work_done(text, int, text, bigint, boolean, text, int) IS
  'For the worker: a pass ended; release the lease (compare-and-set on the generation); a failure backs off.';
COMMENT ON FUNCTION storetopics._worker_stop(text) IS
  'For the worker: give its leases back (SIGTERM).';
COMMENT ON FUNCTION storetopics.work_status() IS
  'Per store: idle, dirty, working or failing, with the last error, passes and LLM cost.';
COMMENT ON FUNCTION storetopics.worker_status() IS
  'Per worker: heartbeat, what it works on, passes, failures, labelling calls.';
