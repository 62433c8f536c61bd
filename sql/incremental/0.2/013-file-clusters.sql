-- storetopics 0.2: a file's chunks per cluster in a table of their own.  In file_terms they shared a row with the
-- file's term arrays (~1.6 kB a file of 3 chunks of real text), so every fit, which assigns every file of the store
-- again, wrote every one of those rows anew: file_terms doubled on disk after a store's first fit (bench/README.md
-- has the figures).  A row here exists only for a file of a store that has clusters, with chunks assigned.
CREATE TABLE storetopics.file_clusters (
  source_id        int NOT NULL,
  store_key        text NOT NULL,
  file_key         text NOT NULL,
  -- the file's chunks and counted words as in file_terms, written with them: the clusters' words and phrases rank
  -- a cluster's files by the share of their chunks in it from this narrow table, and read the term arrays of the
  -- files they pick only (joined with file_terms' wide rows, refresh_words took 5 s after an upload at 1M chunks)
  chunks           int NOT NULL,
  words            bigint NOT NULL,
  -- the file's chunks per cluster of its store's current fit (parallel arrays, sorted by cluster id): how many
  -- joined each cluster, and how many of those lie beyond the cluster's radius (outliers)
  cluster_ids      int[] NOT NULL,
  cluster_chunks   int[] NOT NULL,
  cluster_outliers int[] NOT NULL,
  other_dim        int NOT NULL DEFAULT 0,  -- chunks with a vector no cluster of the store can take (dimension)
  -- how far the file lies from the clusters: the least, over its chunks that joined one, of the chunk's distance
  -- to the centroid over the cluster's radius (above 1: every chunk lies beyond its cluster's radius); NULL when
  -- not measured (rows that 0.1 kept, until the file is folded again or the store fitted again)
  distance_ratio   real
);
CREATE INDEX file_clusters_file ON storetopics.file_clusters (source_id, (md5(file_key)::uuid));
CREATE INDEX file_clusters_store ON storetopics.file_clusters (source_id, store_key);
INSERT INTO storetopics.file_clusters (source_id, store_key, file_key, chunks, words, cluster_ids, cluster_chunks,
                                       cluster_outliers, other_dim)
SELECT f.source_id, f.store_key, f.file_key, f.chunks, f.words, f.cluster_ids, f.cluster_chunks, f.cluster_outliers,
       f.other_dim
  FROM storetopics.file_terms f
 WHERE f.store_key IS NOT NULL AND (cardinality(f.cluster_ids) > 0 OR f.other_dim <> 0);
ALTER TABLE storetopics.file_terms DROP COLUMN cluster_ids, DROP COLUMN cluster_chunks, DROP COLUMN cluster_outliers,
  DROP COLUMN other_dim;
-- Each fold batch updates the counts of most of a store's terms: with room left on each page the new versions stay
-- on the page of the old (HOT: no index entry) and the next batch's pruning takes the old ones back, where full
-- pages sent every version to a new page.  100k realistic chunks: store_terms 32 -> 23 MB, catalog_terms 24 -> 15 MB.
ALTER TABLE storetopics.store_terms SET (fillfactor = 70);
ALTER TABLE storetopics.catalog_terms SET (fillfactor = 70);
