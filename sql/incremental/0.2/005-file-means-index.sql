-- storetopics 0.2: an index on the file means an assignment pass writes, so that re-assigning a whole store
-- (apply_fit) looks each row's file mean up instead of hashing all of them (storetopics._assign_sql).
CREATE INDEX file_means_key ON storetopics.file_means (source_id, store_key, file_key, dims);
