-- storetopics 0.2: keys that outlive the table's DDL and rows on which a key expression fails.  The capture trigger
-- never fails an application's write: when it cannot key a statement's rows it logs a count check instead, with
-- the error (pending.error), which fold records (sources.key_error) and the status view shows.
ALTER TABLE storetopics.pending ADD COLUMN error text;
ALTER TABLE storetopics.sources
  -- the column each plain key is (store_key, file_key, content, embedding, files_key; NULL: an expression or none),
  -- so that a renamed column is followed
  ADD COLUMN key_attnums int2[],
  -- a key expression raised an error for some row: the source is read with row-by-row error handling from then on
  -- (such rows count as skipped) until resync()
  ADD COLUMN safe_keys boolean,
  ADD COLUMN key_error text,
  ADD COLUMN key_error_at timestamptz;
UPDATE storetopics.sources s
   SET safe_keys = false,
       key_attnums = ARRAY(SELECT (SELECT a.attnum FROM pg_attribute a
                                    WHERE a.attrelid = CASE WHEN k.i = 5 THEN s.files_table ELSE s.chunks END
                                      AND a.attname = k.name AND a.attnum > 0 AND NOT a.attisdropped
                                      AND (k.i IN (4, 5) OR k.sql = format('c.%I', k.name)))
                             FROM unnest(ARRAY[s.store_key, s.file_key, s.content, s.embedding, s.files_key],
                                         ARRAY[s.store_sql, s.file_sql, s.content_sql, NULL, NULL])
                                  WITH ORDINALITY AS k(name, sql, i)
                            ORDER BY k.i);
ALTER TABLE storetopics.sources ALTER COLUMN safe_keys SET DEFAULT false;
ALTER TABLE storetopics.sources ALTER COLUMN safe_keys SET NOT NULL;
-- _expr_type takes the key as given now (and proves it one expression itself).
DROP FUNCTION IF EXISTS storetopics._expr_type(regclass, text, text);
