-- storetopics 0.2: a source's part of its catalog's size, kept by fold like the catalog's term sums: how many of
-- its stores hold files, and their files.  contrast_terms() adds these up over the catalog's sources instead of
-- reading every store's row, so rendering one store reads no other store's rows (bench/catalog.py).
ALTER TABLE storetopics.sources ADD COLUMN store_count int NOT NULL DEFAULT 0,
                                ADD COLUMN file_count bigint NOT NULL DEFAULT 0;
UPDATE storetopics.sources s SET store_count = x.stores, file_count = x.files
  FROM (SELECT st.source_id, count(*) FILTER (WHERE st.files > 0) AS stores, coalesce(sum(st.files), 0) AS files
          FROM storetopics.store_state st GROUP BY 1) x
 WHERE x.source_id = s.id;
