-- ------------------------------------------------------------------------------------------------------------
-- Capture: the trigger function generated per source
-- ------------------------------------------------------------------------------------------------------------
-- Generated once per attached table.  It runs as the table's owner (SECURITY DEFINER, so application roles need no
-- rights on storetopics), appends the distinct keys a statement touched and sends one NOTIFY hint.  An UPDATE that
-- changes none of the columns storetopics reads logs nothing (multiset difference of old and new rows).
CREATE OR REPLACE FUNCTION storetopics._capture_sql(src storetopics.sources) RETURNS text
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  relevant text := format('%s AS s, %s AS f, %s AS t%s', src.store_sql, src.file_sql, src.content_sql,
                          CASE WHEN src.embedding IS NULL THEN ''
                               ELSE format(', c.%I::text AS e', src.embedding) END);
  -- The same function also serves the triggers on files_table (they pass an argument): a files row updated (any
  -- column: the store key's lookup may read any of them) or deleted logs its file key, with no store key (the
  -- store it had is in file_terms; fold recounts the file wherever it is now).
  on_files text := CASE WHEN src.files_table IS NULL THEN '' ELSE format($b$
  IF TG_NARGS > 0 THEN
    IF TG_OP = 'DELETE' THEN
      INSERT INTO storetopics.pending (source_id, file_key) SELECT DISTINCT %1$s, r.%2$I::text FROM old_rows AS r;
    ELSE
      INSERT INTO storetopics.pending (source_id, file_key)
      SELECT DISTINCT %1$s, d.k FROM (
        (SELECT r.%2$I::text AS k, r::text AS v FROM old_rows AS r EXCEPT SELECT r.%2$I::text, r::text FROM new_rows AS r)
        UNION ALL
        (SELECT r.%2$I::text, r::text FROM new_rows AS r EXCEPT SELECT r.%2$I::text, r::text FROM old_rows AS r)) AS d;
    END IF;
    IF FOUND AND was_clean THEN
      PERFORM pg_notify('storetopics_dirty', '%1$s');
    END IF;
    RETURN NULL;
  END IF;$b$, src.id, src.files_key) END;
BEGIN
  RETURN format($f$
CREATE OR REPLACE FUNCTION %1$s() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $body$
DECLARE
  -- NOTIFY only when the source becomes dirty: a NOTIFY serialises commits on a global lock, so a burst of
  -- writers must not all send one.  The worker also polls, so a hint not sent is only a delay.
  was_clean boolean := NOT EXISTS (SELECT 1 FROM storetopics.pending WHERE source_id = %2$s);
BEGIN%6$s
  IF TG_OP = 'INSERT' THEN
    INSERT INTO storetopics.pending (source_id, store_key, file_key)
    SELECT %2$s, d.s::text, d.f::text FROM (SELECT DISTINCT %3$s AS s, %4$s AS f FROM new_rows AS c) d;
  ELSIF TG_OP = 'DELETE' THEN
    INSERT INTO storetopics.pending (source_id, deletes) VALUES (%2$s, true);
  ELSIF TG_OP = 'UPDATE' THEN
    INSERT INTO storetopics.pending (source_id, store_key, file_key)
    SELECT DISTINCT %2$s, d.s::text, d.f::text FROM (
      (SELECT %5$s FROM old_rows AS c EXCEPT ALL SELECT %5$s FROM new_rows AS c)
      UNION ALL
      (SELECT %5$s FROM new_rows AS c EXCEPT ALL SELECT %5$s FROM old_rows AS c)) AS d;
    IF NOT FOUND THEN
      RETURN NULL;
    END IF;
  ELSE -- TRUNCATE
    INSERT INTO storetopics.pending (source_id, resync) VALUES (%2$s, true);
  END IF;
  IF was_clean THEN
    PERFORM pg_notify('storetopics_dirty', '%2$s');
  END IF;
  RETURN NULL;
END
$body$;
$f$, src.capture_function, src.id, src.store_sql, src.file_sql, relevant, on_files);
END $$;

CREATE OR REPLACE FUNCTION storetopics._create_triggers(src storetopics.sources) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  EXECUTE storetopics._capture_sql(src);
  EXECUTE format('REVOKE ALL ON FUNCTION %s() FROM PUBLIC', src.capture_function);
  -- DROP EXTENSION storetopics must not leave triggers behind that would fail the application's writes.
  IF EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'storetopics') THEN
    EXECUTE format('ALTER FUNCTION %s() DEPENDS ON EXTENSION storetopics', src.capture_function);
  END IF;
  EXECUTE format('CREATE TRIGGER storetopics_ins AFTER INSERT ON %s REFERENCING NEW TABLE AS new_rows '
                 'FOR EACH STATEMENT EXECUTE FUNCTION %s()', src.chunks, src.capture_function);
  EXECUTE format('CREATE TRIGGER storetopics_upd AFTER UPDATE ON %s REFERENCING OLD TABLE AS old_rows '
                 'NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION %s()', src.chunks, src.capture_function);
  EXECUTE format('CREATE TRIGGER storetopics_del AFTER DELETE ON %s '
                 'FOR EACH STATEMENT EXECUTE FUNCTION %s()', src.chunks, src.capture_function);
  EXECUTE format('CREATE TRIGGER storetopics_trunc AFTER TRUNCATE ON %s '
                 'FOR EACH STATEMENT EXECUTE FUNCTION %s()', src.chunks, src.capture_function);
  IF src.files_table IS NOT NULL THEN
    EXECUTE format('CREATE TRIGGER %I AFTER UPDATE ON %s REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows '
                   'FOR EACH STATEMENT EXECUTE FUNCTION %s(''files'')', format('storetopics_%s_files_upd', src.id),
                   src.files_table, src.capture_function);
    EXECUTE format('CREATE TRIGGER %I AFTER DELETE ON %s REFERENCING OLD TABLE AS old_rows '
                   'FOR EACH STATEMENT EXECUTE FUNCTION %s(''files'')', format('storetopics_%s_files_del', src.id),
                   src.files_table, src.capture_function);
  END IF;
END $$;
