-- storetopics 0.2: render in proportion to what changed.  keywords() finds the store's outlier files by their
-- novelty (the mean IDF of their words); measured against the current document frequencies, one new file changes the
-- IDF of its words and so every other file's novelty, and every render recomputed all of them.  Novelty is now
-- measured against the store's basis: its document frequencies as of a moment, kept until they drifted by half
-- (storetopics._novelty_due).  A file's novelty against the basis depends on its own counts only, so it is computed
-- once per file (fold writes a file's row anew, so NULL, and render fills it in) and rendering after one upload
-- computes one file's.

-- The basis: the store's file count, and its terms' document frequencies (parallel arrays, by term id), as of the
-- render that took it.  incidences = sum(dfs), the drift gate's base.  Deleted with its source (_forget_source).
CREATE TABLE storetopics.novelty_basis (
  source_id  int NOT NULL,
  store_key  text NOT NULL,
  files      bigint NOT NULL,
  incidences bigint NOT NULL,
  term_ids   int[] NOT NULL,
  dfs        int[] NOT NULL,
  PRIMARY KEY (source_id, store_key)
);
-- A file's novelty against its store's basis; NULL until render (or keywords()) computes it.
ALTER TABLE storetopics.file_terms ADD COLUMN novelty float8;

-- The stores folded so far get their basis now, from their current counts, so an upgraded store renders what it
-- rendered before (the basis is the current state) and its first render computes nothing again.  The same
-- statements as storetopics._novelty_rebase.
INSERT INTO storetopics.novelty_basis (source_id, store_key, files, incidences, term_ids, dfs)
SELECT st.source_id, st.store_key, st.files, coalesce(sum(t.files), 0),
       coalesce(array_agg(t.term_id ORDER BY t.term_id) FILTER (WHERE t.term_id IS NOT NULL), '{}'),
       coalesce(array_agg(t.files ORDER BY t.term_id) FILTER (WHERE t.term_id IS NOT NULL), '{}')
  FROM storetopics.store_state st
  LEFT JOIN storetopics.store_terms t ON t.source_id = st.source_id AND t.store_key = st.store_key
 WHERE st.files > 0
 GROUP BY st.source_id, st.store_key, st.files;
UPDATE storetopics.file_terms f SET novelty = x.novelty
  FROM (SELECT f2.source_id, f2.file_key, f2.store_key,
               round((ln(greatest(b.files, 1)) - sum(u.n::bigint * round(ln(t.files) * 1e9)::bigint)
                                                 / (1e9 * f2.words))::numeric, 9)::float8 AS novelty
          FROM storetopics.file_terms f2
          JOIN storetopics.novelty_basis b ON b.source_id = f2.source_id AND b.store_key = f2.store_key
         CROSS JOIN LATERAL unnest(f2.term_ids, f2.counts) AS u(term_id, n)
          JOIN storetopics.store_terms t ON t.source_id = f2.source_id AND t.store_key = f2.store_key
                                        AND t.term_id = u.term_id
         WHERE f2.words > 0
         GROUP BY f2.source_id, f2.file_key, f2.store_key, f2.words, b.files) x
 WHERE f.source_id = x.source_id AND f.file_key = x.file_key AND f.store_key = x.store_key;

DO $$
BEGIN
  IF EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'storetopics') THEN
    PERFORM pg_catalog.pg_extension_config_dump('storetopics.novelty_basis', '');
  END IF;
END $$;
