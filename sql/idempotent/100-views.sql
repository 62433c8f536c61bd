-- ------------------------------------------------------------------------------------------------------------
-- Views
-- ------------------------------------------------------------------------------------------------------------
-- The router's view: a plain indexed read.  `dirty` = changes are logged that are not folded in yet.
CREATE OR REPLACE VIEW storetopics.stores AS
SELECT s.chunks AS source, st.source_id, st.store_key, st.files, st.chunks, st.words, st.skipped,
       st.store_topics, st.topics, st.updated_at, st.folded_at,
       EXISTS (SELECT 1 FROM storetopics.pending p
                WHERE p.source_id = st.source_id AND (p.store_key = st.store_key OR p.resync OR p.deletes
                      -- a change whose store key was NULL when logged (e.g. a store key looked up in a parent
                      -- row that an ON DELETE CASCADE already removed) dirties the store that holds the file
                      OR (p.store_key IS NULL AND EXISTS (SELECT 1 FROM storetopics.file_terms f
                                                           WHERE f.source_id = p.source_id AND f.file_key = p.file_key
                                                             AND f.store_key = st.store_key)))) AS dirty
  FROM storetopics.store_state st
  JOIN storetopics.sources s ON s.id = st.source_id;

CREATE OR REPLACE VIEW storetopics.status AS
SELECT s.id AS source_id, s.chunks AS source, s.ts_config,
       (SELECT count(*) FROM storetopics.store_state st WHERE st.source_id = s.id) AS stores,
       (SELECT coalesce(sum(st.files), 0) FROM storetopics.store_state st WHERE st.source_id = s.id) AS files,
       (SELECT coalesce(sum(st.chunks), 0) FROM storetopics.store_state st WHERE st.source_id = s.id) AS chunks,
       (SELECT coalesce(sum(st.skipped), 0) FROM storetopics.store_state st WHERE st.source_id = s.id)
         AS skipped_text_rows,
       s.null_key_rows
         + (SELECT coalesce(sum(f.chunks), 0) FROM storetopics.file_terms f
             WHERE f.source_id = s.id AND f.store_key IS NULL) AS skipped_null_key_rows,
       (SELECT coalesce(sum(st.other_dim), 0) FROM storetopics.store_state st WHERE st.source_id = s.id)
         AS other_dimension_chunks,     -- vectors no cluster can take: another dimension than the store's fit
       (SELECT count(*) FROM storetopics.pending p WHERE p.source_id = s.id) AS pending_events,
       (SELECT min(p.logged_at) FROM storetopics.pending p WHERE p.source_id = s.id) AS oldest_pending,
       s.folded_at, s.attached_at
  FROM storetopics.sources s;
