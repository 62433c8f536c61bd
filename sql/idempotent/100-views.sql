-- ------------------------------------------------------------------------------------------------------------
-- Views: what a router, a tenant and a DBA read
-- ------------------------------------------------------------------------------------------------------------
-- A role sees the sources it may act as the owner of, those granted to it with grant_read (or to every source), and
-- everything when it is a worker role or a superuser.  The views read storetopics' tables as their owner; the test
-- runs for the role reading (current_user; a function would run as the reader, who may not read the grants).  security_barrier: a function in the reader's WHERE clause cannot see
-- the rows the test hides.
-- The router's view: a plain indexed read.  `dirty` = changes are logged that are not folded in yet.
CREATE OR REPLACE VIEW storetopics.stores WITH (security_barrier) AS
SELECT s.chunks AS source, st.source_id, st.store_key, st.files, st.chunks, st.words, st.skipped,
       st.store_topics, st.topics, st.updated_at, st.folded_at,
       EXISTS (SELECT 1 FROM storetopics.pending p
                WHERE p.source_id = st.source_id AND (p.store_key = st.store_key OR p.resync OR p.deletes
                      -- a change whose store key was NULL when logged (e.g. a store key looked up in a parent
                      -- row that an ON DELETE CASCADE already removed) dirties the store that holds the file
                      OR (p.store_key IS NULL AND EXISTS (SELECT 1 FROM storetopics.file_terms f
                                                           WHERE f.source_id = p.source_id
                                                             AND md5(f.file_key)::uuid = md5(p.file_key)::uuid
                                                             AND f.file_key = p.file_key
                                                             AND f.store_key = st.store_key)))) AS dirty,
       st.tool_name
  FROM storetopics.store_state st
  JOIN storetopics.sources s ON s.id = st.source_id
  JOIN pg_catalog.pg_class t ON t.oid = s.chunks   -- (a table dropped where no event trigger saw it: not a store)
 WHERE pg_has_role(current_user, s.owner, 'USAGE')
    OR EXISTS (SELECT 1 FROM storetopics.grants g
                WHERE (g.source_id IS NULL OR g.source_id = s.id) AND pg_has_role(current_user, g.role, 'USAGE'));
COMMENT ON VIEW storetopics.stores IS
  'One row per store the reading role may see: its summary (store_topics), the structured topics, sizes, freshness.';

CREATE OR REPLACE VIEW storetopics.status WITH (security_barrier) AS
SELECT s.id AS source_id, s.chunks AS source, s.ts_config,
       (SELECT count(*) FROM storetopics.store_state st WHERE st.source_id = s.id) AS stores,
       (SELECT coalesce(sum(st.files), 0) FROM storetopics.store_state st WHERE st.source_id = s.id) AS files,
       (SELECT coalesce(sum(st.chunks), 0) FROM storetopics.store_state st WHERE st.source_id = s.id) AS chunks,
       (SELECT coalesce(sum(st.skipped), 0) FROM storetopics.store_state st WHERE st.source_id = s.id)
         AS skipped_text_rows,
       -- rows whose file key or store key is NULL, or whose store key is longer than max_store_key()
       s.null_key_rows
         + (SELECT coalesce(sum(f.chunks), 0) FROM storetopics.file_terms f
             WHERE f.source_id = s.id AND f.store_key IS NULL) AS skipped_null_key_rows,
       (SELECT coalesce(sum(st.other_dim), 0) FROM storetopics.store_state st WHERE st.source_id = s.id)
         AS other_dimension_chunks,     -- vectors no cluster can take: another dimension than the store's fit
       (SELECT count(*) FROM storetopics.pending p WHERE p.source_id = s.id) AS pending_events,
       (SELECT min(p.logged_at) FROM storetopics.pending p WHERE p.source_id = s.id) AS oldest_pending,
       s.folded_at, s.attached_at,
       -- the last error a key met, and when: the capture could not key a statement's rows (logged, not folded
       -- yet; or folded), or a key expression raised for a row (its rows are read one by one since)
       coalesce(e.error, s.key_error) AS key_error, coalesce(e.logged_at, s.key_error_at) AS key_error_at,
       CASE WHEN s.safe_keys THEN 'row by row' ELSE 'set-based' END AS reads
  FROM storetopics.sources s
  LEFT JOIN LATERAL (SELECT 'the capture trigger could not key a statement''s rows: ' || p.error AS error, p.logged_at
                       FROM storetopics.pending p
                      WHERE p.source_id = s.id AND p.error IS NOT NULL
                      ORDER BY p.logged_at DESC LIMIT 1) e ON true
 WHERE pg_has_role(current_user, s.owner, 'USAGE')
    OR EXISTS (SELECT 1 FROM storetopics.grants g
                WHERE (g.source_id IS NULL OR g.source_id = s.id) AND pg_has_role(current_user, g.role, 'USAGE'));
COMMENT ON VIEW storetopics.status IS
  'One row per attached table the reading role may see: stores, files, chunks, skipped rows, pending events.';
