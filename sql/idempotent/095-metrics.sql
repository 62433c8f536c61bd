-- ------------------------------------------------------------------------------------------------------------
-- Metrics: what a monitoring system scrapes (docker/postgres_exporter-queries.yaml maps them for postgres_exporter)
-- ------------------------------------------------------------------------------------------------------------
-- One row per source the calling role may see, with a label column (source) and numeric gauges and counters: the
-- shape postgres_exporter's custom queries turn into one series per source and column.
--
-- Who sees what: the rule of the views storetopics.stores and storetopics.status (the sources the caller may act as
-- the owner of, those granted to it with grant_read, every source for a worker role or a superuser).  SECURITY
-- DEFINER because a monitoring role may read none of the tables counted here (work, clusters, label_ledger); the
-- rule is therefore applied to the role that called in (_caller), as attach() does, not to current_user.  Granted
-- by grant_read (a monitoring role is a reader: `SELECT storetopics.grant_read('monitoring')` for every source).
--
-- Cheap to scrape: it reads, per visible source, only its rows of pending (the backlog
-- itself), store_state and work (one row per store), the clusters of its stores that still need a label, and the
-- label ledger (one row per labelling call), each through an index on source_id; never the per-file or per-term
-- tables.  The ledger grows with every call ever made: the exporter file caches the result for a while.
--
-- dirty_stores counts what _store_dirty() and work_status() call dirty: stores named by logged changes, stores
-- whose summary must be rendered again, stores the worker has seen dirty (work.dirty_since), stores with a labelling
-- retry come due; and, while a change that names no store is logged (a delete, TRUNCATE, a resync, attach), every
-- store of the source, because the fold that comes may change any of them.  failing_stores: the 'failing' state of
-- work_status() (passes or labelling calls failed failing_after() times in a row).
CREATE OR REPLACE FUNCTION storetopics.metrics()
RETURNS TABLE (source text, source_id int, stores bigint, pending_events bigint, oldest_pending_seconds float8,
               dirty_stores bigint, failing_stores bigint, oldest_summary_seconds float8, paused int,
               label_calls_total bigint, label_errors_total bigint, label_cost_usd_total float8)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
-- a long backlog makes the plan look costly enough to compile, which a query this short, run on every scrape, never
-- pays back
SET jit = off
BEGIN ATOMIC
WITH src AS (
  SELECT s.id, s.chunks, storetopics._settings(s.id) AS cfg, storetopics._llm_labeller(s.id) AS llm
    FROM storetopics.sources s
   WHERE storetopics._may_act_as(s.owner)
      OR EXISTS (SELECT 1 FROM storetopics.grants g
                  WHERE (g.source_id IS NULL OR g.source_id = s.id)
                    AND pg_has_role(storetopics._caller(), g.role, 'USAGE'))
), pend AS (
  SELECT src.id AS source_id, p.store_key, p.n, p.oldest
    FROM src CROSS JOIN LATERAL (SELECT x.store_key, count(*) AS n, min(x.logged_at) AS oldest
                                   FROM storetopics.pending x WHERE x.source_id = src.id GROUP BY 1) p
), dirty AS (
  SELECT x.source_id, x.store_key FROM pend x
   WHERE x.store_key IS NOT NULL AND char_length(x.store_key) <= storetopics._max_store_key()   -- else never a store
  UNION
  SELECT st.source_id, st.store_key FROM storetopics.store_state st
   WHERE st.source_id IN (SELECT src.id FROM src)
     AND (storetopics._render_due(st)
          OR EXISTS (SELECT 1 FROM pend x WHERE x.source_id = st.source_id AND x.store_key IS NULL))
  UNION
  SELECT w.source_id, w.store_key FROM storetopics.work w
   WHERE w.source_id IN (SELECT src.id FROM src) AND w.dirty_since IS NOT NULL
  UNION
  SELECT k.source_id, k.store_key FROM storetopics.clusters k JOIN src ON src.id = k.source_id
   WHERE k.label_needed AND k.chunks > 0 AND k.label_retry_at <= now() AND src.llm
  UNION
  SELECT st.source_id, st.store_key FROM storetopics.store_state st JOIN src ON src.id = st.source_id
   WHERE st.store_label_needed AND st.store_label_retry_at <= now() AND src.llm
), failing AS (
  SELECT w.source_id, w.store_key FROM storetopics.work w
   WHERE w.source_id IN (SELECT src.id FROM src) AND w.attempts >= storetopics._failing_after()
  UNION
  SELECT k.source_id, k.store_key FROM storetopics.clusters k
   WHERE k.source_id IN (SELECT src.id FROM src) AND k.label_needed AND k.chunks > 0
     AND k.label_failures >= storetopics._failing_after()
  UNION
  SELECT st.source_id, st.store_key FROM storetopics.store_state st
   WHERE st.source_id IN (SELECT src.id FROM src) AND st.store_label_needed
     AND st.store_label_failures >= storetopics._failing_after()
)
SELECT src.chunks::text, src.id, st.stores, coalesce(p.n, 0)::bigint,
       coalesce(extract(epoch FROM now() - p.oldest), 0)::float8,
       (SELECT count(*) FROM dirty d WHERE d.source_id = src.id),
       (SELECT count(*) FROM failing f WHERE f.source_id = src.id),
       coalesce(extract(epoch FROM now() - st.oldest), 0)::float8,
       (src.cfg ->> 'paused')::boolean::int,
       l.calls, l.errors, l.cost_usd::float8
  FROM src
  LEFT JOIN LATERAL (SELECT sum(x.n) AS n, min(x.oldest) AS oldest FROM pend x WHERE x.source_id = src.id) p ON true
  -- a store's summary dates from its last render (a store folded but never rendered: from that fold)
  LEFT JOIN LATERAL (SELECT count(*) AS stores, min(coalesce(y.rendered_at, y.folded_at)) AS oldest
                       FROM storetopics.store_state y WHERE y.source_id = src.id AND y.files > 0) st ON true
  LEFT JOIN LATERAL (SELECT count(*) AS calls, count(*) FILTER (WHERE g.outcome = 'error') AS errors,
                            coalesce(sum(g.cost_usd), 0) AS cost_usd
                       FROM storetopics.label_ledger g WHERE g.source_id = src.id) l ON true
 ORDER BY src.id;
END;
COMMENT ON FUNCTION storetopics.metrics() IS
  'For monitoring (postgres_exporter): per source the caller may read, stores, pending events and the oldest one''s '
  'age, dirty and failing stores, the oldest summary''s age, and labelling calls, errors and cost since attach.';
