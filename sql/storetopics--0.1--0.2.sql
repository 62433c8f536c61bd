\echo Use "ALTER EXTENSION storetopics UPDATE" to load this file, or `storetopics install --dsn DSN`. \quit
-- storetopics 0.2 (upgrade from 0.1): built by `make sql` from sql/incremental and sql/idempotent;
-- edit those, not this file.

-- idempotent/010-helpers.sql
-- ------------------------------------------------------------------------------------------------------------
-- Helpers
-- ------------------------------------------------------------------------------------------------------------
-- Text worth tokenising: not NULL, has a letter or digit, no control characters (binary junk), and small enough
-- for a tsvector (1 MB).  Other rows are counted as skipped.
CREATE OR REPLACE FUNCTION storetopics.usable_text(t text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp
RETURN t IS NOT NULL AND octet_length(t) < 1048576 AND t ~ '[[:alnum:]]' AND t !~ '[\x01-\x08\x0e-\x1f]';

-- A term worth showing to a person: letters (any script), at least 3 of them, maybe inner hyphens or apostrophes.
CREATE OR REPLACE FUNCTION storetopics.showable_term(t text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp
RETURN t ~ '^[[:alpha:]][[:alpha:]''-]*[[:alpha:]]$' AND length(t) >= 3 AND length(t) <= 40;

-- A key given to attach(): an existing column becomes c."col"; anything else is an SQL expression over the chunk
-- row, which must call the row `c` (e.g. `c.cmetadata->>'source'`), wrapped in parentheses.
CREATE OR REPLACE FUNCTION storetopics._key_sql(tbl regclass, key text) RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
RETURN CASE
  WHEN EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = tbl AND a.attname = key AND a.attnum > 0
                AND NOT a.attisdropped)
  THEN format('c.%I', key)
  ELSE format('(%s)', key)
END;

-- The type of an expression over the table's rows, checked by the planner (clear errors for bad expressions).
CREATE OR REPLACE FUNCTION storetopics._expr_type(tbl regclass, expr text, what text) RETURNS regtype
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  t regtype;
BEGIN
  EXECUTE format('CREATE TEMP VIEW storetopics_probe AS SELECT %s AS k FROM %s AS c', expr, tbl);
  SELECT a.atttypid::regtype INTO t FROM pg_attribute a
   WHERE a.attrelid = 'pg_temp.storetopics_probe'::regclass AND a.attname = 'k';
  DROP VIEW pg_temp.storetopics_probe;
  RETURN t;
EXCEPTION WHEN OTHERS THEN
  RAISE EXCEPTION 'storetopics: % is not a column or valid expression over %: %', what, tbl, SQLERRM
    USING ERRCODE = 'invalid_parameter_value',
          HINT = 'Give a column name, or an SQL expression that calls the chunk row c, e.g. c.cmetadata->>''source''.';
END $$;

-- idempotent/020-capture.sql
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

-- idempotent/030-attach.sql
-- ------------------------------------------------------------------------------------------------------------
-- Attach / detach
-- ------------------------------------------------------------------------------------------------------------
-- Registers the source row.  SECURITY DEFINER so a table owner who is no superuser can attach; it checks that the
-- caller owns the table, and lets the owner role append to the change log.
CREATE OR REPLACE FUNCTION storetopics._register_source(
  p_chunks regclass, p_store_key text, p_file_key text, p_content text, p_embedding text,
  p_store_sql text, p_file_sql text, p_content_sql text, p_file_type regtype, p_ts_config regconfig,
  p_settings jsonb, p_files_table regclass, p_files_key text, p_mirror regclass, p_mirror_key text,
  p_mirror_column text) RETURNS storetopics.sources
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_owner name;
  src storetopics.sources;
BEGIN
  SELECT pg_get_userbyid(relowner) INTO v_owner FROM pg_class WHERE oid = p_chunks;
  IF NOT pg_has_role(session_user, v_owner, 'USAGE') AND NOT pg_has_role(current_user, v_owner, 'USAGE')
     AND NOT pg_has_role(session_user, v_owner, 'MEMBER') THEN
    RAISE EXCEPTION 'storetopics: only the owner of % can attach it', p_chunks USING ERRCODE = 'insufficient_privilege';
  END IF;
  INSERT INTO storetopics.sources (chunks, owner, store_key, file_key, content, embedding, store_sql, file_sql,
                                   content_sql, file_type, ts_config, settings, capture_function,
                                   files_table, files_key, mirror, mirror_key, mirror_column)
  VALUES (p_chunks, v_owner, p_store_key, p_file_key, p_content, p_embedding, p_store_sql, p_file_sql,
          p_content_sql, p_file_type, p_ts_config, p_settings, 'pending',
          p_files_table, p_files_key, p_mirror, p_mirror_key, p_mirror_column)
  RETURNING * INTO src;
  UPDATE storetopics.sources SET capture_function = format('storetopics.capture_%s', src.id)
   WHERE id = src.id RETURNING * INTO src;
  -- The first fold counts every row that is already there.
  INSERT INTO storetopics.pending (source_id, resync) VALUES (src.id, true);
  EXECUTE format('GRANT USAGE ON SCHEMA storetopics TO %I', v_owner);
  EXECUTE format('GRANT INSERT, SELECT (source_id) ON storetopics.pending TO %I', v_owner);
  RETURN src;
END $$;

CREATE OR REPLACE FUNCTION storetopics._unregister_source(p_source int) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_owner name;
BEGIN
  SELECT owner INTO v_owner FROM storetopics.sources WHERE id = p_source FOR UPDATE;
  IF NOT FOUND THEN
    RETURN;
  END IF;
  IF NOT pg_has_role(session_user, v_owner, 'MEMBER') AND NOT pg_has_role(current_user, v_owner, 'MEMBER') THEN
    RAISE EXCEPTION 'storetopics: only the owner of the table can detach it' USING ERRCODE = 'insufficient_privilege';
  END IF;
  PERFORM storetopics._forget_source(p_source);
END $$;

-- Deletes every storetopics row of a source (no checks: callers check).
CREATE OR REPLACE FUNCTION storetopics._forget_source(p_source int) RETURNS void
LANGUAGE sql SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
  DELETE FROM storetopics.pending WHERE source_id = p_source;
  DELETE FROM storetopics.file_terms WHERE source_id = p_source;
  DELETE FROM storetopics.store_terms WHERE source_id = p_source;
  DELETE FROM storetopics.store_state WHERE source_id = p_source;
  DELETE FROM storetopics.clusters WHERE source_id = p_source;
  DELETE FROM storetopics.label_ledger WHERE source_id = p_source;
  DELETE FROM storetopics.sources WHERE id = p_source;
END;

-- DROP TABLE of an attached table also forgets its source (the table's triggers go with it).  Installed where the
-- installing role may create event triggers (superuser); elsewhere fold() and backfill() skip such sources.
CREATE OR REPLACE FUNCTION storetopics._forget_dropped_tables() RETURNS event_trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  r record;
BEGIN
  FOR r IN SELECT s.id, s.capture_function FROM storetopics.sources s
             JOIN pg_event_trigger_dropped_objects() d
               ON d.classid = 'pg_class'::regclass AND d.objid = s.chunks AND d.objsubid = 0 LOOP
    EXECUTE format('DROP FUNCTION IF EXISTS %s() CASCADE', r.capture_function);  -- with files_table's triggers
    PERFORM storetopics._forget_source(r.id);
  END LOOP;
END $$;

-- Attach storetopics to an application's chunk table.  Runs as the caller, who must own the table (creating a
-- trigger needs that) and be able to create the capture function in schema storetopics (superusers can; others are
-- granted it with storetopics.grant_attach(role)).  Returns the source id.
--   files_table, files_key: when the store key is looked up in another table (files(id, store_id) in
--     `(SELECT f.store_id FROM files f WHERE f.id = c.file_id)`), an UPDATE of that table moves files between stores
--     without touching a chunk.  Naming it installs two more triggers on it: updated or deleted rows log their
--     files_key (which must equal the chunks' file key as text) for a recount.  The caller must own it too.
--   mirror, mirror_key, mirror_column: render() also copies each store's summary into the application's own table:
--     UPDATE mirror SET mirror_column = <summary> WHERE mirror_key::text = <store key> (NULL once the store is
--     empty).  Runs as whoever renders (the worker needs UPDATE on that column); see _mirror_summary.
CREATE OR REPLACE FUNCTION storetopics.attach(
  chunks    regclass,
  store_key text,
  file_key  text,
  content   text DEFAULT 'content',
  embedding text DEFAULT NULL,
  ts_config regconfig DEFAULT 'pg_catalog.english',
  settings  jsonb DEFAULT '{}',
  files_table   regclass DEFAULT NULL,
  files_key     text DEFAULT 'id',
  mirror        regclass DEFAULT NULL,
  mirror_key    text DEFAULT 'id',
  mirror_column text DEFAULT 'store_topics'
) RETURNS int
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_store_sql text; v_file_sql text; v_content_sql text;
  v_file_type regtype; v_content_type regtype; v_emb_type text;
  v_relkind char;
  v_type regtype;
  src storetopics.sources;
BEGIN
  SELECT relkind INTO v_relkind FROM pg_class WHERE oid = chunks;
  IF v_relkind NOT IN ('r', 'p') THEN
    RAISE EXCEPTION 'storetopics: % is not a table', chunks USING ERRCODE = 'wrong_object_type';
  END IF;
  IF EXISTS (SELECT 1 FROM storetopics.sources s WHERE s.chunks = attach.chunks) THEN
    RAISE EXCEPTION 'storetopics: % is already attached', chunks USING ERRCODE = 'duplicate_object',
      HINT = 'Detach it first with storetopics.detach(...).';
  END IF;
  IF coalesce(trim(store_key), '') = '' OR coalesce(trim(file_key), '') = '' OR coalesce(trim(content), '') = '' THEN
    RAISE EXCEPTION 'storetopics: store_key, file_key and content are required' USING ERRCODE = 'null_value_not_allowed';
  END IF;
  v_store_sql := storetopics._key_sql(chunks, store_key);
  v_file_sql := storetopics._key_sql(chunks, file_key);
  v_content_sql := storetopics._key_sql(chunks, content);
  PERFORM storetopics._expr_type(chunks, v_store_sql, format('store_key %L', store_key));
  v_file_type := storetopics._expr_type(chunks, v_file_sql, format('file_key %L', file_key));
  v_content_type := storetopics._expr_type(chunks, v_content_sql, format('content %L', content));
  IF v_content_type NOT IN ('text'::regtype, 'character varying'::regtype, 'character'::regtype) THEN
    RAISE EXCEPTION 'storetopics: content % of % is %, not text', content, chunks, v_content_type
      USING ERRCODE = 'datatype_mismatch';
  END IF;
  IF embedding IS NOT NULL THEN
    SELECT t.typname INTO v_emb_type FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid
     WHERE a.attrelid = chunks AND a.attname = embedding AND a.attnum > 0 AND NOT a.attisdropped;
    IF v_emb_type IS NULL THEN
      RAISE EXCEPTION 'storetopics: % has no column %', chunks, embedding USING ERRCODE = 'undefined_column';
    ELSIF v_emb_type NOT IN ('vector', 'halfvec') THEN
      RAISE EXCEPTION 'storetopics: embedding column % of % is %, not a pgvector vector', embedding, chunks,
        v_emb_type USING ERRCODE = 'datatype_mismatch';
    END IF;
  END IF;
  IF files_table IS NOT NULL THEN
    IF (SELECT relkind FROM pg_class WHERE oid = files_table) NOT IN ('r', 'p') THEN
      RAISE EXCEPTION 'storetopics: files_table % is not a table', files_table USING ERRCODE = 'wrong_object_type';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = files_table AND a.attname = files_key
                    AND a.attnum > 0 AND NOT a.attisdropped) THEN
      RAISE EXCEPTION 'storetopics: files_table % has no column %', files_table, files_key
        USING ERRCODE = 'undefined_column', HINT = 'files_key names its column that holds the chunks'' file key.';
    END IF;
  END IF;
  IF mirror IS NOT NULL THEN
    IF (SELECT relkind FROM pg_class WHERE oid = mirror) NOT IN ('r', 'p') THEN
      RAISE EXCEPTION 'storetopics: mirror % is not a table', mirror USING ERRCODE = 'wrong_object_type';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = mirror AND a.attname = mirror_key
                    AND a.attnum > 0 AND NOT a.attisdropped) THEN
      RAISE EXCEPTION 'storetopics: mirror % has no column % (mirror_key)', mirror, mirror_key
        USING ERRCODE = 'undefined_column', HINT = 'mirror_key names its column that holds the store key.';
    END IF;
    SELECT a.atttypid::regtype INTO v_type FROM pg_attribute a
     WHERE a.attrelid = mirror AND a.attname = mirror_column AND a.attnum > 0 AND NOT a.attisdropped;
    IF v_type IS NULL THEN
      RAISE EXCEPTION 'storetopics: mirror % has no column % (mirror_column)', mirror, mirror_column
        USING ERRCODE = 'undefined_column',
              HINT = format('Add it: ALTER TABLE %s ADD COLUMN %I text', mirror, mirror_column);
    ELSIF v_type NOT IN ('text'::regtype, 'character varying'::regtype) OR mirror_column = mirror_key THEN
      RAISE EXCEPTION 'storetopics: mirror column % of % is %, not a text column of its own', mirror_column, mirror,
        v_type USING ERRCODE = 'datatype_mismatch';
    END IF;
  END IF;

  src := storetopics._register_source(chunks, store_key, file_key, content, embedding, v_store_sql, v_file_sql,
                                      v_content_sql, v_file_type, ts_config, settings,
                                      files_table, CASE WHEN files_table IS NOT NULL THEN files_key END,
                                      mirror, CASE WHEN mirror IS NOT NULL THEN mirror_key END,
                                      CASE WHEN mirror IS NOT NULL THEN mirror_column END);
  PERFORM storetopics._create_triggers(src);
  PERFORM pg_notify('storetopics_dirty', src.id::text);
  RETURN src.id;
END $$;

-- attach(..., mirror => ...): copies a store's summary (NULL: the store is gone) into the application's table.
-- Called by render() whenever it changes a store's store_topics.  Runs as the caller (the worker needs UPDATE on
-- the mirror column; a SECURITY DEFINER here would fire the application's triggers on that table as storetopics'
-- owner).  It never fails a fold or a render: a mirror table dropped, a column gone or a privilege missing is a
-- WARNING, and the summary in storetopics.stores stays right.
CREATE OR REPLACE FUNCTION storetopics._mirror_summary(p_source int, p_store text, p_text text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  src storetopics.sources;
BEGIN
  SELECT * INTO src FROM storetopics.sources WHERE id = p_source;
  IF src.mirror IS NULL THEN
    RETURN;
  END IF;
  BEGIN
    EXECUTE format('UPDATE %s SET %I = $1 WHERE %I::text = $2 AND %I IS DISTINCT FROM $1', src.mirror,
                   src.mirror_column, src.mirror_key, src.mirror_column)
      USING p_text, p_store;
  EXCEPTION WHEN OTHERS THEN
    RAISE WARNING 'storetopics: could not mirror the summary of store % of source % into %.%: %', p_store,
      p_source, src.mirror, src.mirror_column, SQLERRM;
  END;
END $$;

-- Detach by source id (also when the table is gone): dropping the capture function drops its four triggers.
CREATE OR REPLACE FUNCTION storetopics.detach_source(p_source int) RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  src storetopics.sources;
BEGIN
  SELECT * INTO src FROM storetopics.sources WHERE id = p_source;
  IF NOT FOUND THEN
    RETURN false;
  END IF;
  EXECUTE format('DROP FUNCTION IF EXISTS %s() CASCADE', src.capture_function);
  PERFORM storetopics._unregister_source(p_source);
  RETURN true;
END $$;

CREATE OR REPLACE FUNCTION storetopics.detach(chunks regclass) RETURNS boolean
LANGUAGE sql SET search_path = pg_catalog, pg_temp
RETURN coalesce((SELECT storetopics.detach_source(s.id) FROM storetopics.sources s WHERE s.chunks = detach.chunks),
                false);

-- Lets a role that owns chunk tables attach them without being superuser.
CREATE OR REPLACE FUNCTION storetopics.grant_attach(role_name name) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  EXECUTE format('GRANT USAGE, CREATE ON SCHEMA storetopics TO %I', role_name);
  EXECUTE format('GRANT INSERT, SELECT (source_id) ON storetopics.pending TO %I', role_name);
  EXECUTE format('GRANT SELECT ON storetopics.sources, storetopics.stores, storetopics.status TO %I', role_name);
  EXECUTE format('GRANT EXECUTE ON FUNCTION storetopics.attach(regclass, text, text, text, text, regconfig, jsonb, '
                 'regclass, text, regclass, text, text), '
                 'storetopics.detach(regclass), storetopics.detach_source(int), storetopics._key_sql(regclass, text), '
                 'storetopics._expr_type(regclass, text, text), storetopics._capture_sql(storetopics.sources), '
                 'storetopics._create_triggers(storetopics.sources), '
                 'storetopics._register_source(regclass, text, text, text, text, text, '
                 'text, text, regtype, regconfig, jsonb, regclass, text, regclass, text, text), '
                 'storetopics._unregister_source(int) TO %I', role_name);
END $$;

-- Lets a role run the worker's part (fold, render, backfill) without being superuser or owning the chunk tables:
-- it may read and write storetopics' own tables and run its functions; nothing else.  The tables' owners grant it
-- SELECT on their chunk tables (and on any table a key expression reads); a mirror also needs UPDATE on the mirror
-- column (without it the mirror is skipped with a warning).  Run by an administrator.
CREATE OR REPLACE FUNCTION storetopics.grant_worker(role_name name) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  EXECUTE format('GRANT USAGE ON SCHEMA storetopics TO %I', role_name);
  EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA storetopics TO %I', role_name);
  EXECUTE format('GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA storetopics TO %I', role_name);
  EXECUTE format('GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA storetopics TO %I', role_name);
END $$;

-- Forget a source's state and recount everything on the next fold.
CREATE OR REPLACE FUNCTION storetopics.resync(chunks regclass) RETURNS void
LANGUAGE sql SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
  INSERT INTO storetopics.pending (source_id, resync)
  SELECT s.id, true FROM storetopics.sources s WHERE s.chunks = resync.chunks;
END;

-- idempotent/040-fold.sql
-- ------------------------------------------------------------------------------------------------------------
-- Fold: bring the keyword state up to date with the logged changes
-- ------------------------------------------------------------------------------------------------------------
-- Recounts at most max_files touched files of one source and applies the difference.  Returns the number of files
-- recounted (0 = nothing was pending).  Serialised per source by a row lock on storetopics.sources; application
-- writers never take that lock.  Safe to call at any time, from any number of sessions.
-- (jit off here and in apply_fit: compiling the assignment's expressions took 1.2 s per statement and saved nothing,
-- 4.5 s vs 2.9 s for 100k chunks)
CREATE OR REPLACE FUNCTION storetopics.fold(p_source int, max_files int DEFAULT 5000) RETURNS int
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp SET work_mem = '128MB' SET jit = off AS $$
DECLARE
  src storetopics.sources;
  v_files text[];
  v_null_keys boolean;
  v_deleted_at timestamptz;
  v_filter text;
  v_tsv text;
  v_skip text;
  v_saved text[];
  v_n int;
BEGIN
  SELECT * INTO src FROM storetopics.sources WHERE id = p_source FOR UPDATE;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'storetopics: no source %', p_source USING ERRCODE = 'undefined_object';
  END IF;
  IF NOT EXISTS (SELECT 1 FROM pg_class WHERE oid = src.chunks) THEN
    RAISE EXCEPTION 'storetopics: the table of source % was dropped', p_source USING ERRCODE = 'undefined_table',
      HINT = format('Forget it with SELECT storetopics.detach_source(%s).', p_source);
  END IF;

  -- 1. A resync (attach, TRUNCATE): forget the state and log every live file, then fold those in batches.
  IF EXISTS (SELECT 1 FROM storetopics.pending WHERE source_id = p_source AND resync) THEN
    DELETE FROM storetopics.pending WHERE source_id = p_source AND (resync OR deletes);
    DELETE FROM storetopics.file_terms WHERE source_id = p_source;
    DELETE FROM storetopics.store_terms WHERE source_id = p_source;
    UPDATE storetopics.store_state SET files = 0, chunks = 0, words = 0, skipped = 0, other_dim = 0, folded_at = now(),
           version = version + 1
     WHERE source_id = p_source;
    UPDATE storetopics.clusters SET chunks = 0, files = 0, outliers = 0, outliers_at_fit = 0
     WHERE source_id = p_source;
    EXECUTE format('INSERT INTO storetopics.pending (source_id, store_key, file_key) '
                   'SELECT DISTINCT %s, (%s)::text, (%s)::text FROM %s AS c',
                   p_source, src.store_sql, src.file_sql, src.chunks);
    UPDATE storetopics.sources SET null_key_rows = 0 WHERE id = p_source;
  END IF;

  -- 1b. Rows were deleted: every file whose live chunk count differs from the one folded lost rows (only a DELETE
  --     changes a file's count without logging the file).  One pass over the file keys; an index on the file key
  --     makes it an index-only scan.  The same pass counts the rows whose file key is NULL.
  WITH d AS (DELETE FROM storetopics.pending WHERE source_id = p_source AND deletes RETURNING logged_at)
  SELECT max(d.logged_at) INTO v_deleted_at FROM d;
  IF v_deleted_at IS NOT NULL THEN
    EXECUTE format($q$
      CREATE TEMP TABLE storetopics_live ON COMMIT DROP AS
      SELECT (%1$s)::text AS file_key, count(*) AS chunks FROM %2$s AS c GROUP BY 1$q$, src.file_sql, src.chunks);
    SELECT coalesce(sum(l.chunks), 0) INTO src.null_key_rows FROM pg_temp.storetopics_live l WHERE l.file_key IS NULL;
    UPDATE storetopics.sources SET null_key_rows = src.null_key_rows WHERE id = p_source;
    -- logged when the deletes were: the files are as old as the events that touched them
    INSERT INTO storetopics.pending (source_id, file_key, logged_at)
    SELECT p_source, f.file_key, v_deleted_at
      FROM (SELECT f.file_key, sum(f.chunks) AS chunks FROM storetopics.file_terms f
             WHERE f.source_id = p_source GROUP BY 1) f
      LEFT JOIN pg_temp.storetopics_live l ON l.file_key = f.file_key
     WHERE l.chunks IS DISTINCT FROM f.chunks;
    DROP TABLE pg_temp.storetopics_live;
  END IF;

  -- 2. Claim a batch of touched files.
  v_files := ARRAY(SELECT DISTINCT file_key FROM storetopics.pending
                    WHERE source_id = p_source AND file_key IS NOT NULL ORDER BY 1 LIMIT max_files);
  -- One statement: a NULL-key event committed between a check and the DELETE would be lost.
  WITH d AS (DELETE FROM storetopics.pending
              WHERE source_id = p_source
                AND (file_key = ANY (v_files) OR (file_key IS NULL AND NOT resync AND NOT deletes))
             RETURNING file_key)
  SELECT coalesce(bool_or(d.file_key IS NULL), false) INTO v_null_keys FROM d;
  IF v_null_keys THEN
    EXECUTE format('SELECT count(*) FROM %s AS c WHERE (%s) IS NULL', src.chunks, src.file_sql)
      INTO src.null_key_rows;
    UPDATE storetopics.sources SET null_key_rows = src.null_key_rows WHERE id = p_source;
  END IF;
  IF cardinality(v_files) = 0 THEN
    UPDATE storetopics.sources SET folded_at = now() WHERE id = p_source;
    RETURN 0;
  END IF;

  -- 3. Recount those files from the live rows, in one scan.  Per (store, file, term): the count; plus one row per
  --    (store, file) with term NULL whose count(*) is the number of chunks and whose n is the number of skipped
  --    chunks.  Parallel query spreads the tokenising over the cores; the planner takes to_tsvector for cheap, so
  --    parallel plans are made free for this statement.
  v_filter := format('%s = ANY (%L::%s[])', src.file_sql, v_files, src.file_type);
  DROP TABLE IF EXISTS pg_temp.storetopics_new_terms, pg_temp.storetopics_new_files;
  v_saved := ARRAY[current_setting('parallel_setup_cost'), current_setting('parallel_tuple_cost'),
                   current_setting('min_parallel_table_scan_size'), current_setting('enable_sort')];
  PERFORM set_config('parallel_setup_cost', '0', true), set_config('parallel_tuple_cost', '0', true),
          set_config('min_parallel_table_scan_size', '0', true);
  -- tsv: the row's tsvector (NULL for unusable text or a NULL store key); skip: 1 for a skipped row.  Neither refers
  -- to the other, so the planner cannot end up tokenising a row twice.
  v_tsv := format('CASE WHEN (%s) IS NOT NULL AND storetopics.usable_text(%s) THEN to_tsvector(%L::regconfig, %s) END',
                  src.store_sql, src.content_sql, src.ts_config, src.content_sql);
  v_skip := format('(NOT storetopics.usable_text(%s))::int', src.content_sql);
  LOOP
    BEGIN
      EXECUTE format($q$
        CREATE TEMP TABLE storetopics_new_terms AS
        SELECT (%1$s)::text AS store_key, (%2$s)::text AS file_key, l.term, sum(l.n)::int AS n, count(*)::int AS rows
          FROM %3$s AS c
         CROSS JOIN LATERAL (SELECT x.lexeme, cardinality(x.positions) FROM unnest(%4$s) AS x
                             UNION ALL
                             SELECT NULL, %6$s) AS l(term, n)
         WHERE %5$s
         GROUP BY 1, 2, 3$q$, src.store_sql, src.file_sql, src.chunks, v_tsv, v_filter, v_skip);
      EXIT;
    EXCEPTION WHEN program_limit_exceeded THEN
      -- A text whose tsvector would pass 1 MB: redo this batch with one subtransaction per row, skipping such rows
      -- (this slow path tokenises each row twice).
      EXIT WHEN v_tsv LIKE 'storetopics._tsvector_or_null%';
      v_tsv := format('storetopics._tsvector_or_null(%L::regconfig, CASE WHEN (%s) IS NOT NULL THEN %s END)',
                      src.ts_config, src.store_sql, src.content_sql);
      v_skip := format('(%s IS NULL AND ((%s) IS NOT NULL OR NOT storetopics.usable_text(%s)))::int',
                       v_tsv, src.store_sql, src.content_sql);
    END;
  END LOOP;
  PERFORM set_config('parallel_setup_cost', v_saved[1], true), set_config('parallel_tuple_cost', v_saved[2], true),
          set_config('min_parallel_table_scan_size', v_saved[3], true);
  -- Number the lexemes not seen before (in sorted order, so concurrent folds of other sources cannot deadlock;
  -- only missing ones, so the identity is not used up by conflicts).
  INSERT INTO storetopics.lexemes (lexeme)
  SELECT t.term FROM (SELECT DISTINCT nt.term FROM pg_temp.storetopics_new_terms nt WHERE nt.term IS NOT NULL) t
   WHERE NOT EXISTS (SELECT 1 FROM storetopics.lexemes x WHERE x.lexeme = t.term)
   ORDER BY 1
  ON CONFLICT (lexeme) DO NOTHING;
  -- Grouping by hashing: array_agg needs no order here, and sorting ~1M rows per batch is the slow way.
  PERFORM set_config('enable_sort', 'off', true);
  -- Per file: counters and the term/count arrays (parallel arrays: both aggregates read the rows in the same
  -- order, so the pairs line up; no sort needed).  A NULL store key makes the file's chunks null-key rows.
  CREATE TEMP TABLE storetopics_new_files AS
  SELECT nt.store_key, nt.file_key,
         max(nt.rows) FILTER (WHERE nt.term IS NULL) AS chunks,
         max(nt.n) FILTER (WHERE nt.term IS NULL) AS skipped,
         coalesce(sum(nt.n) FILTER (WHERE nt.term IS NOT NULL), 0) AS words,
         coalesce(array_agg(x.id) FILTER (WHERE nt.term IS NOT NULL AND nt.store_key IS NOT NULL), '{}') AS term_ids,
         coalesce(array_agg(nt.n) FILTER (WHERE nt.term IS NOT NULL AND nt.store_key IS NOT NULL), '{}') AS counts
    FROM pg_temp.storetopics_new_terms nt
    LEFT JOIN storetopics.lexemes x ON x.lexeme = nt.term
   GROUP BY 1, 2;
  PERFORM set_config('enable_sort', v_saved[4], true);
  DROP TABLE pg_temp.storetopics_new_terms;
  -- The files' chunks per cluster of their store's fit (nothing to do while no store of the source has one).
  ALTER TABLE pg_temp.storetopics_new_files ADD cluster_ids int[] NOT NULL DEFAULT '{}',
    ADD cluster_chunks int[] NOT NULL DEFAULT '{}', ADD cluster_outliers int[] NOT NULL DEFAULT '{}',
    ADD other_dim int NOT NULL DEFAULT 0;
  IF src.embedding IS NOT NULL AND EXISTS (SELECT 1 FROM storetopics.clusters k WHERE k.source_id = p_source) THEN
    PERFORM storetopics._assign(src, v_filter);
    UPDATE pg_temp.storetopics_new_files nf SET cluster_ids = a.cluster_ids, cluster_chunks = a.cluster_chunks,
           cluster_outliers = a.cluster_outliers, other_dim = a.other_dim
      FROM pg_temp.storetopics_assign a WHERE a.store_key = nf.store_key AND a.file_key = nf.file_key;
    DROP TABLE pg_temp.storetopics_assign;
  END IF;

  -- 4. Store-wide term statistics: subtract the files' old counts, add the new ones.
  CREATE TEMP TABLE storetopics_delta ON COMMIT DROP AS
  SELECT d.store_key, d.term_id, sum(d.df)::int AS df, sum(d.tf)::bigint AS tf, sum(d.tf2)::bigint AS tf2
    FROM (SELECT f.store_key, u.term_id, -1 AS df, -u.n::bigint AS tf, -(u.n::bigint * u.n) AS tf2
            FROM storetopics.file_terms f, unnest(f.term_ids, f.counts) AS u(term_id, n)
           WHERE f.source_id = p_source AND f.file_key = ANY (v_files) AND f.store_key IS NOT NULL
          UNION ALL
          SELECT nf.store_key, u.term_id, 1, u.n, u.n::bigint * u.n
            FROM pg_temp.storetopics_new_files nf, unnest(nf.term_ids, nf.counts) AS u(term_id, n)
           WHERE nf.store_key IS NOT NULL) d
   GROUP BY 1, 2
  HAVING sum(d.df) <> 0 OR sum(d.tf) <> 0 OR sum(d.tf2) <> 0;

  INSERT INTO storetopics.store_terms AS t (source_id, store_key, term_id, files, total, total_sq)
  SELECT p_source, d.store_key, d.term_id, d.df, d.tf, d.tf2 FROM pg_temp.storetopics_delta d
  ORDER BY d.store_key, d.term_id
  ON CONFLICT (source_id, store_key, term_id) DO UPDATE
     SET files = t.files + excluded.files, total = t.total + excluded.total, total_sq = t.total_sq + excluded.total_sq;
  DELETE FROM storetopics.store_terms t USING pg_temp.storetopics_delta d
   WHERE t.source_id = p_source AND t.store_key = d.store_key AND t.term_id = d.term_id AND t.files <= 0;
  DROP TABLE pg_temp.storetopics_delta;

  -- 4b. Cluster sizes: the same difference over the files' cluster arrays.
  IF src.embedding IS NOT NULL THEN
    PERFORM storetopics._add_to_clusters(p_source, v_files);
  END IF;

  -- 5. Store counters, by the same difference.
  CREATE TEMP TABLE storetopics_counts ON COMMIT DROP AS
  SELECT x.store_key, sum(x.files)::bigint AS files, sum(x.chunks)::bigint AS chunks, sum(x.words)::bigint AS words,
         sum(x.skipped)::bigint AS skipped, sum(x.other_dim)::bigint AS other_dim
    FROM (SELECT f.store_key, -1 AS files, -f.chunks AS chunks, -f.words AS words, -f.skipped AS skipped,
                 -f.other_dim AS other_dim
            FROM storetopics.file_terms f
           WHERE f.source_id = p_source AND f.file_key = ANY (v_files) AND f.store_key IS NOT NULL
          UNION ALL
          SELECT nf.store_key, 1, nf.chunks, nf.words, nf.skipped, nf.other_dim
            FROM pg_temp.storetopics_new_files nf
           WHERE nf.store_key IS NOT NULL) x
   GROUP BY 1;
  INSERT INTO storetopics.store_state AS st (source_id, store_key, files, chunks, words, skipped, other_dim,
                                             folded_at)
  SELECT p_source, k.store_key, k.files, k.chunks, k.words, k.skipped, k.other_dim, now()
    FROM pg_temp.storetopics_counts k
  ORDER BY k.store_key
  ON CONFLICT (source_id, store_key) DO UPDATE
     SET files = st.files + excluded.files, chunks = st.chunks + excluded.chunks,
         words = st.words + excluded.words, skipped = st.skipped + excluded.skipped,
         other_dim = st.other_dim + excluded.other_dim, folded_at = now(), version = st.version + 1;
  DROP TABLE pg_temp.storetopics_counts;

  -- 6. Replace the files' own rows.
  DELETE FROM storetopics.file_terms WHERE source_id = p_source AND file_key = ANY (v_files);
  INSERT INTO storetopics.file_terms (source_id, file_key, store_key, chunks, skipped, words, term_ids, counts,
                                      cluster_ids, cluster_chunks, cluster_outliers, other_dim)
  SELECT p_source, nf.file_key, nf.store_key, nf.chunks, nf.skipped, nf.words, nf.term_ids, nf.counts,
         nf.cluster_ids, nf.cluster_chunks, nf.cluster_outliers, nf.other_dim
    FROM pg_temp.storetopics_new_files nf;

  GET DIAGNOSTICS v_n = ROW_COUNT;
  DROP TABLE pg_temp.storetopics_new_files;
  UPDATE storetopics.sources SET folded_at = now() WHERE id = p_source;
  -- Statistics of the state tables, when this batch alone wrote more files than the statistics know (a first
  -- backfill): without them the planner took the 20k-file state for "one row" and keywords() ran 96 s instead of
  -- 2.5 s.  Only the tables' owner (or a superuser) may; others leave it to autovacuum.
  PERFORM storetopics._analyze_if_stale(v_n);
  RETURN cardinality(v_files);
END $$;

-- ANALYZE the state tables when one statement just wrote at least 1,000 files' rows and more than their statistics
-- know of (a first backfill, the full reassignment after a store's first fit).  Only as the tables' owner (or a
-- superuser); others leave it to autovacuum.
CREATE OR REPLACE FUNCTION storetopics._analyze_if_stale(p_rows bigint) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  IF p_rows >= 1000 AND (SELECT c.reltuples FROM pg_class c WHERE c.oid = 'storetopics.file_terms'::regclass) < p_rows
     AND (pg_has_role(current_user, (SELECT relowner FROM pg_class WHERE oid = 'storetopics.file_terms'::regclass),
                      'USAGE')
          OR (SELECT rolsuper FROM pg_roles WHERE rolname = current_user)) THEN
    ANALYZE storetopics.file_terms, storetopics.store_terms, storetopics.lexemes;
  END IF;
END $$;

-- The slow path of fold(): one subtransaction per row, so one oversized text cannot fail a batch.
CREATE OR REPLACE FUNCTION storetopics._tsvector_or_null(cfg regconfig, t text) RETURNS tsvector
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  IF NOT storetopics.usable_text(t) THEN
    RETURN NULL;
  END IF;
  RETURN to_tsvector(cfg, t);
EXCEPTION WHEN program_limit_exceeded THEN
  RETURN NULL;
END $$;

-- idempotent/050-settings.sql
-- ------------------------------------------------------------------------------------------------------------
-- Settings: per source, jsonb over defaults, changeable with SQL without re-attaching
-- ------------------------------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION storetopics.default_settings() RETURNS jsonb
LANGUAGE sql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp
RETURN jsonb_build_object(
  'sample_size', 50000,          -- vectors a fit reads at most
  'seed', 0,                     -- sampling and KMeans seed: same data + same seed = same fit
  'k_min', 5, 'k_max', 30,       -- K searched by silhouette
  'silhouette_floor', 0.02,      -- best silhouette less than this above the same data with its structure destroyed
                                 -- (coordinates permuted): no real structure, the store is one theme
  'min_vectors', 20,             -- fewer vectors than this: no clustering
  'radius_percentile', 95,       -- a chunk beyond this percentile of its cluster's member distances is an outlier
  'refit_outliers', 0.05,        -- re-cluster when outliers since the fit pass this share of the store
  'reuse_distance', 0.05,        -- a re-fit cluster this close (cosine) to an old one keeps its id, label, words
  'keyword_shift', 0.05,         -- keyword gate: top terms shifted by more than this share
  'labeller', 'offline',         -- offline | anthropic
  'model', NULL,                 -- the labeller's model (NULL: its default)
  'prices', jsonb_build_object(  -- USD per million tokens, input and output
              'claude-haiku-4-5', jsonb_build_array(1.0, 5.0),
              'claude-3-5-haiku-latest', jsonb_build_array(0.8, 4.0),
              'claude-sonnet-4-5', jsonb_build_array(3.0, 15.0)),
  'embedding_model', NULL,       -- name of the model that made the vectors, recorded as the fit's space
  'debounce', 60,                -- seconds a store must be quiet before the worker refreshes it
  'max_staleness', 600,          -- ... but never longer than this under a continuous stream
  'paused', false);

CREATE OR REPLACE FUNCTION storetopics._settings(p_source int) RETURNS jsonb
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
RETURN storetopics.default_settings() || coalesce((SELECT s.settings FROM storetopics.sources s WHERE s.id = p_source),
                                                  '{}');

-- The effective settings of an attached table.
CREATE OR REPLACE FUNCTION storetopics.settings(chunks regclass) RETURNS jsonb
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
RETURN (SELECT storetopics._settings(s.id) FROM storetopics.sources s WHERE s.chunks = settings.chunks);

-- Change settings of an attached table: configure('t', '{"k_max": 12}'); a key set to null goes back to its
-- default.  Unknown keys and values of the wrong type are refused.  Returns the effective settings.
CREATE OR REPLACE FUNCTION storetopics.configure(chunks regclass, changes jsonb) RETURNS jsonb
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  d jsonb := storetopics.default_settings();
  k text;
  v jsonb;
  v_new jsonb;
  v_source int;
BEGIN
  SELECT s.id INTO v_source FROM storetopics.sources s WHERE s.chunks = configure.chunks FOR UPDATE;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'storetopics: % is not attached', chunks USING ERRCODE = 'undefined_object';
  END IF;
  IF jsonb_typeof(changes) IS DISTINCT FROM 'object' THEN
    RAISE EXCEPTION 'storetopics: settings must be a JSON object' USING ERRCODE = 'invalid_parameter_value';
  END IF;
  FOR k, v IN SELECT * FROM jsonb_each(changes) LOOP
    IF NOT d ? k THEN
      RAISE EXCEPTION 'storetopics: unknown setting %', k USING ERRCODE = 'invalid_parameter_value',
        HINT = 'Known settings: ' || (SELECT string_agg(x, ', ' ORDER BY x) FROM jsonb_object_keys(d) x);
    END IF;
    IF jsonb_typeof(v) <> 'null' AND jsonb_typeof(d -> k) <> 'null' AND jsonb_typeof(v) <> jsonb_typeof(d -> k) THEN
      RAISE EXCEPTION 'storetopics: setting % must be a %, not %', k, jsonb_typeof(d -> k), v
        USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF jsonb_typeof(v) = 'number' AND (v::numeric < 0 OR (k IN ('k_min', 'k_max', 'sample_size', 'min_vectors')
                                                          AND v::numeric < 1)) THEN
      RAISE EXCEPTION 'storetopics: setting % cannot be %', k, v USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF k = 'labeller' AND v #>> '{}' NOT IN ('offline', 'anthropic') THEN
      RAISE EXCEPTION 'storetopics: unknown labeller %', v USING ERRCODE = 'invalid_parameter_value',
        HINT = 'offline or anthropic';
    END IF;
  END LOOP;
  UPDATE storetopics.sources s
     SET settings = jsonb_strip_nulls(s.settings || changes)
   WHERE s.id = v_source;
  UPDATE storetopics.store_state SET version = version + 1 WHERE source_id = v_source;   -- labels shown may change
  v_new := storetopics._settings(v_source);
  IF (v_new ->> 'k_min')::int > (v_new ->> 'k_max')::int THEN
    RAISE EXCEPTION 'storetopics: k_min % is above k_max %', v_new ->> 'k_min', v_new ->> 'k_max'
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  RETURN v_new;
END $$;

CREATE OR REPLACE FUNCTION storetopics.pause(chunks regclass) RETURNS jsonb
LANGUAGE sql SET search_path = pg_catalog, pg_temp
RETURN storetopics.configure(chunks, '{"paused": true}');

CREATE OR REPLACE FUNCTION storetopics.resume(chunks regclass) RETURNS jsonb
LANGUAGE sql SET search_path = pg_catalog, pg_temp
RETURN storetopics.configure(chunks, '{"paused": null}');

-- idempotent/060-clusters.sql
-- ------------------------------------------------------------------------------------------------------------
-- Clusters: assignment of chunks to the current fit, kept by fold(); fits applied by apply_fit()
-- ------------------------------------------------------------------------------------------------------------
-- pgvector's schema, to name its operators in dynamic SQL (functions here run with search_path = pg_catalog).
CREATE OR REPLACE FUNCTION storetopics._vector_schema() RETURNS name
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
RETURN (SELECT t.typnamespace::regnamespace::name FROM pg_type t WHERE t.typname = 'vector'
         ORDER BY t.typnamespace = 'public'::regnamespace DESC LIMIT 1);

-- The row's vector as pgvector's `vector` (halfvec columns are cast).
CREATE OR REPLACE FUNCTION storetopics._embedding_sql(src storetopics.sources) RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
RETURN format('c.%I::%I.vector', src.embedding, storetopics._vector_schema());

-- How to name one chunk: its single-column primary key, else its ctid (good within one fit).
CREATE OR REPLACE FUNCTION storetopics._chunk_ref_sql(tbl regclass) RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
RETURN coalesce((SELECT format('c.%I::text', a.attname)
                   FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
                  WHERE i.indrelid = tbl AND i.indisprimary AND i.indnatts = 1),
                'c.ctid::text');

-- A chunk is clustered in its file's context: as the unit sum of its own direction and its file's mean direction
-- (files of one chunk: the chunk itself).  Read alone, a chunk such as "This package contains the documentation" or
-- a table of numbers says little about the topic its file is about; in context it goes where its file goes.  On
-- Debian descriptions (16 sections, chunks = paragraphs) this raised the NMI of the clusters against the sections
-- from 0.377 to 0.49.  Both the fit (_fit_input) and the assignment below use it, so distances and radii agree.
--
-- Assigns the chunk rows matching `filter` to their store's clusters, into pg_temp.storetopics_assign: per (store,
-- file), the chunks per nearest cluster of the store's fit, the outliers among them, and the chunks whose vector no
-- cluster can take (another dimension).
--
-- Two passes over the rows.  The first writes each file's mean direction to storetopics.file_means (one core:
-- PostgreSQL 15 runs no INSERT in parallel; a table, because parallel workers cannot read temp tables); the second,
-- parallel query, computes each chunk's vector in context once, its inner product with every centroid of its store,
-- and the nearest with least() over [inner product, slot] pairs (ties: the lower cluster id).  Everything per row is an expression or a function scan:
-- a LIMIT or aggregate subquery per row is never run by parallel workers, and that plan took 43 s for 1M chunks where
-- this one takes 8 s on 2 cores.  Centroids are unit vectors, so the cosine distance is 1 + (c <#> q) / |q| (a zero
-- vector is NaN, as cosine makes it: an outlier).  enable_nestloop is on here even when the caller turned it off
-- (apply_fit, for its own joins): the per-row function scans are nested loops, and a penalised plan is a worse one.
CREATE OR REPLACE FUNCTION storetopics._assign(src storetopics.sources, filter text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp SET work_mem = '128MB' SET jit = off SET enable_nestloop = on
AS $$
DECLARE
  v_vs name := storetopics._vector_schema();
  v_e text := storetopics._embedding_sql(src);
  v_slots int;
  v_saved text[] := ARRAY[current_setting('parallel_setup_cost'), current_setting('parallel_tuple_cost'),
                          current_setting('min_parallel_table_scan_size'), current_setting('enable_sort')];
BEGIN
  -- the most clusters a store of the source has: one least() argument per slot (a store with fewer: NULL slots)
  SELECT max(n) INTO v_slots
    FROM (SELECT count(*) AS n FROM storetopics.clusters k WHERE k.source_id = src.id GROUP BY k.store_key) x;
  DROP TABLE IF EXISTS pg_temp.storetopics_assign;
  PERFORM set_config('parallel_setup_cost', '0', true), set_config('parallel_tuple_cost', '0', true),
          set_config('min_parallel_table_scan_size', '0', true), set_config('enable_sort', 'off', true);
  -- the file's mean direction (per dimension: a file may hold vectors of two); sum, not avg: its state is a float4
  -- vector, half of avg's, so 100k files' states fit in work_mem; hashed, not sorted (sorting the vectors spilled)
  DELETE FROM storetopics.file_means WHERE source_id = src.id;
  EXECUTE format($q$
    INSERT INTO storetopics.file_means (source_id, store_key, file_key, dims, m)
    SELECT %1$s, (%2$s)::text, (%3$s)::text, %4$I.vector_dims(%5$s), %4$I.l2_normalize(%4$I.sum(%4$I.l2_normalize(%5$s)))
      FROM %6$s AS c
     WHERE %7$s AND (%2$s) IS NOT NULL AND %5$s IS NOT NULL
     GROUP BY 2, 3, 4$q$, src.id, src.store_sql, src.file_sql, v_vs, v_e, src.chunks, filter);
  EXECUTE format($q$
    CREATE TEMP TABLE storetopics_assign ON COMMIT DROP AS
    SELECT x.store_key, x.file_key,
           coalesce(array_agg(x.cluster_id ORDER BY x.cluster_id) FILTER (WHERE x.joined), '{}') AS cluster_ids,
           coalesce(array_agg(x.n ORDER BY x.cluster_id) FILTER (WHERE x.joined), '{}') AS cluster_chunks,
           coalesce(array_agg(x.o ORDER BY x.cluster_id) FILTER (WHERE x.joined), '{}') AS cluster_outliers,
           coalesce(sum(x.n) FILTER (WHERE x.other_dim), 0)::int AS other_dim
      FROM (SELECT y.store_key, y.file_key, y.joined, y.other_dim, y.cluster_id,
                   count(*)::int AS n, (count(*) FILTER (WHERE y.d > y.radius))::int AS o
              FROM (SELECT (%1$s)::text AS store_key, (%2$s)::text AS file_key,
                           a.m IS NOT NULL AS joined,
                           a.m IS NULL AND ks.dims IS NOT NULL AND %4$s IS NOT NULL AS other_dim,
                           ks.ids[a.m[2]::int] AS cluster_id, ks.radii[a.m[2]::int] AS radius,
                           CASE WHEN b.qn > 0 THEN 1 + a.m[1] / b.qn ELSE 'NaN'::float8 END AS d
                      FROM %3$s AS c
                      -- the store's clusters as arrays, in cluster id order
                      LEFT JOIN (SELECT k.store_key, array_agg(k.centroid ORDER BY k.cluster_id) AS cen,
                                        array_agg(k.cluster_id ORDER BY k.cluster_id) AS ids,
                                        array_agg(k.radius ORDER BY k.cluster_id) AS radii,
                                        min(%5$I.vector_dims(k.centroid)) AS dims
                                   FROM storetopics.clusters k WHERE k.source_id = %6$s GROUP BY 1) ks
                             ON ks.store_key = (%1$s)::text
                      LEFT JOIN storetopics.file_means fm
                             ON fm.source_id = %6$s AND fm.store_key = (%1$s)::text AND fm.file_key = (%2$s)::text
                            AND fm.dims = %5$I.vector_dims(%4$s)
                      -- q: the chunk in its file's context (not normalised again) and its length, each computed once
                      -- per row (a function scan's result is not inlined into the expressions that use it)
                      CROSS JOIN LATERAL unnest(ARRAY[CASE WHEN fm.m IS NULL THEN %4$s
                                                           ELSE %5$I.l2_normalize(%4$s) OPERATOR(%5$I.+) fm.m END]) AS q(q)
                      CROSS JOIN LATERAL unnest(ARRAY[%5$I.vector_norm(q.q)]) AS b(qn)
                      -- m = [inner product, slot] of the nearest centroid; NULL for a NULL vector, one of another
                      -- dimension, or a store without clusters
                      CROSS JOIN LATERAL unnest(ARRAY[ROW(CASE WHEN %5$I.vector_dims(q.q) = ks.dims
                                                               THEN least(%8$s) END)]) AS a(m float8[])
                     WHERE %7$s AND (%1$s) IS NOT NULL) y
             GROUP BY 1, 2, 3, 4, 5) x
     GROUP BY 1, 2$q$,
    src.store_sql, src.file_sql, src.chunks, v_e, v_vs, src.id, filter,
    coalesce((SELECT string_agg(format('ARRAY[ks.cen[%s] OPERATOR(%I.<#>) q.q, %s]', i, v_vs, i), ', ')
                FROM generate_series(1, v_slots) i), 'NULL::float8[]'));
  DELETE FROM storetopics.file_means WHERE source_id = src.id;
  PERFORM set_config('parallel_setup_cost', v_saved[1], true), set_config('parallel_tuple_cost', v_saved[2], true),
          set_config('min_parallel_table_scan_size', v_saved[3], true), set_config('enable_sort', v_saved[4], true);
END $$;

-- fold()'s step for clusters: subtract the files' old cluster arrays, add the new ones (in pg_temp's new files).
CREATE OR REPLACE FUNCTION storetopics._add_to_clusters(p_source int, p_files text[]) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  UPDATE storetopics.clusters k
     SET chunks = k.chunks + d.chunks, files = k.files + d.files, outliers = k.outliers + d.outliers
    FROM (SELECT x.store_key, x.cluster_id, sum(x.files) AS files, sum(x.chunks) AS chunks, sum(x.outliers) AS outliers
            FROM (SELECT f.store_key, u.cluster_id, -1 AS files, -u.n AS chunks, -u.o AS outliers
                    FROM storetopics.file_terms f,
                         unnest(f.cluster_ids, f.cluster_chunks, f.cluster_outliers) AS u(cluster_id, n, o)
                   WHERE f.source_id = p_source AND f.file_key = ANY (p_files) AND f.store_key IS NOT NULL
                  UNION ALL
                  SELECT nf.store_key, u.cluster_id, 1, u.n, u.o
                    FROM pg_temp.storetopics_new_files nf,
                         unnest(nf.cluster_ids, nf.cluster_chunks, nf.cluster_outliers) AS u(cluster_id, n, o)
                   WHERE nf.store_key IS NOT NULL) x
           GROUP BY 1, 2) d
   WHERE k.source_id = p_source AND k.store_key = d.store_key AND k.cluster_id = d.cluster_id
     AND (d.files <> 0 OR d.chunks <> 0 OR d.outliers <> 0);
END $$;

-- Whether a store's clustering is due, and why: 'no fit' (enough vectors, never fitted), 'outliers' (outliers since
-- the fit pass refit_outliers of the store), 'dimension' (most vectors have another dimension than the fit), or
-- NULL when the current fit still holds.
CREATE OR REPLACE FUNCTION storetopics.fit_due(p_source int, p_store text) RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
RETURN (
  SELECT CASE
    WHEN s.embedding IS NULL THEN NULL
    WHEN st.fit_at IS NULL THEN CASE WHEN st.chunks >= (cfg ->> 'min_vectors')::int THEN 'no fit' END
    WHEN st.other_dim * 2 > st.chunks THEN 'dimension'
    WHEN (SELECT sum(k.outliers - k.outliers_at_fit) FROM storetopics.clusters k
           WHERE k.source_id = p_source AND k.store_key = p_store)
         > (cfg ->> 'refit_outliers')::float8 * greatest(st.chunks, st.fit_chunks, 1) THEN 'outliers'
  END
    FROM storetopics.store_state st JOIN storetopics.sources s ON s.id = st.source_id,
         LATERAL storetopics._settings(s.id) AS cfg
   WHERE st.source_id = p_source AND st.store_key = p_store);

-- What a fit needs: the settings, a reproducible uniform sample of the store's vectors, each in its file's context
-- (as pgvector's binary form, concatenated: a few values instead of 50k rows), the chunk refs in the same order,
-- and the current clusters (ids and centroids) to match against.
--   Sampling: a store with at most sample_size chunks is read whole.  A larger one is sampled with TABLESAMPLE
--   SYSTEM (pages chosen by the seed, so only about sample_size/store_chunks of the table is read), then thinned
--   to sample_size by a hash of the chunk ref and the seed.  Only the dimension most of the sample has is kept.
-- A store's sample for a fit, in parts: part 0 carries everything (the settings, the sample's size n and dimension,
-- the previous fit's clusters, the sampling method, the fit generation it was read at) and the first vectors; parts
-- 1, 2, ... carry only the next vectors (concatenated pgvector binary sends, `part_size` of them per part) and their
-- chunk refs.  Parts keep every message and every allocation small: one 50k x 1536-d bytea made the worker's
-- client library hold the sample three times (1.9 GB peak); read part by part it is held once.
CREATE OR REPLACE FUNCTION storetopics._fit_input(p_source int, p_store text, part_size int DEFAULT 4096)
RETURNS TABLE (part int, settings jsonb, dim int, n int, vectors bytea, refs text[], old_ids int[],
               old_centroids bytea, old_radii real[], method text, generation int, space text)
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp SET work_mem = '256MB' AS $$
DECLARE
  src storetopics.sources;
  cfg jsonb;
  v_chunks bigint;
  v_rows float8;
  v_pct float8;
  v_limit int;
  v_seed int;
  v_vs name := storetopics._vector_schema();
  v_from text;
BEGIN
  SELECT * INTO src FROM storetopics.sources s WHERE s.id = p_source;
  IF src.embedding IS NULL THEN
    RAISE EXCEPTION 'storetopics: source % has no embedding column', p_source USING ERRCODE = 'invalid_parameter_value';
  END IF;
  cfg := storetopics._settings(p_source);
  v_limit := (cfg ->> 'sample_size')::int;
  v_seed := (cfg ->> 'seed')::int;
  SELECT st.chunks, st.fit_generation, st.fit_space INTO v_chunks, generation, space
    FROM storetopics.store_state st WHERE st.source_id = p_source AND st.store_key = p_store;
  SELECT greatest(c.reltuples, 1) INTO v_rows FROM pg_class c WHERE c.oid = src.chunks;
  -- pages to read, as a percentage of the table: enough for 1.3x the sample from this store's share of rows
  v_pct := 100.0 * 1.3 * v_limit / greatest(coalesce(v_chunks, 0), 1);
  IF coalesce(v_chunks, 0) <= v_limit OR v_pct >= 50 THEN
    v_from := format('%s AS c', src.chunks);
    method := 'whole store';
  ELSE
    v_from := format('%s AS c TABLESAMPLE SYSTEM (%s) REPEATABLE (%s)', src.chunks, v_pct, v_seed);
    method := format('tablesample system %s%%', round(v_pct::numeric, 2));
  END IF;
  EXECUTE format($q$
    CREATE TEMP TABLE storetopics_sample ON COMMIT DROP AS
    SELECT %1$s AS ref, (%7$s)::text AS file_key, %2$s AS e
      FROM %3$s
     WHERE (%4$s)::text = %5$L AND %2$s IS NOT NULL AND (%7$s) IS NOT NULL
     ORDER BY hashtext(%1$s || ':' || %6$s), 1
     LIMIT %8$s$q$,
    storetopics._chunk_ref_sql(src.chunks), storetopics._embedding_sql(src), v_from, src.store_sql, p_store,
    v_seed, src.file_sql, v_limit);
  -- each chunk in its file's context, as _assign puts it (the file's mean over the chunks the sample holds:
  -- all of them when the store is read whole; with TABLESAMPLE, those on the pages read, often all of a file's)
  EXECUTE format($q$
    UPDATE pg_temp.storetopics_sample s SET e = %1$I.l2_normalize(%1$I.l2_normalize(s.e) OPERATOR(%1$I.+) f.m)
      FROM (SELECT x.file_key, %1$I.vector_dims(x.e) AS dims, %1$I.l2_normalize(%1$I.sum(%1$I.l2_normalize(x.e))) AS m
              FROM pg_temp.storetopics_sample x GROUP BY 1, 2) f
     WHERE f.file_key = s.file_key AND f.dims = %1$I.vector_dims(s.e)$q$, v_vs);
  EXECUTE format('SELECT %1$I.vector_dims(e) FROM pg_temp.storetopics_sample GROUP BY 1 ORDER BY count(*) DESC, 1 LIMIT 1',
                 v_vs) INTO dim;
  EXECUTE format('SELECT count(*)::int FROM pg_temp.storetopics_sample WHERE %1$I.vector_dims(e) = $1', v_vs)
    INTO n USING dim;
  EXECUTE format($q$SELECT array_agg(k.cluster_id ORDER BY k.cluster_id),
                           string_agg(%1$I.vector_send(k.centroid), ''::bytea ORDER BY k.cluster_id),
                           array_agg(k.radius ORDER BY k.cluster_id)
                      FROM storetopics.clusters k
                     WHERE k.source_id = $1 AND k.store_key = $2 AND %1$I.vector_dims(k.centroid) = $3$q$, v_vs)
    INTO old_ids, old_centroids, old_radii USING p_source, p_store, dim;
  settings := cfg;
  part := 0;
  IF coalesce(n, 0) = 0 THEN
    refs := '{}';
    RETURN NEXT;
  END IF;
  FOR part, vectors, refs IN EXECUTE format($q$
      SELECT (s.i / $2)::int, string_agg(%1$I.vector_send(s.e), ''::bytea ORDER BY s.i), array_agg(s.ref ORDER BY s.i)
        FROM (SELECT x.ref, x.e, row_number() OVER (ORDER BY x.ref) - 1 AS i
                FROM pg_temp.storetopics_sample x WHERE %1$I.vector_dims(x.e) = $1) s
       GROUP BY 1 ORDER BY 1$q$, v_vs) USING dim, greatest(part_size, 1)
  LOOP
    RETURN NEXT;
    -- the rest only once, in part 0
    settings := NULL; dim := NULL; n := NULL; old_ids := NULL; old_centroids := NULL; old_radii := NULL;
    method := NULL; generation := NULL; space := NULL;
  END LOOP;
  DROP TABLE pg_temp.storetopics_sample;
END $$;

-- The WHERE condition that finds chunks by the refs _chunk_ref_sql gave (an index or TID scan).
CREATE OR REPLACE FUNCTION storetopics._chunk_lookup_sql(tbl regclass, refs text[]) RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
RETURN coalesce((SELECT format('c.%I = ANY (%L::%s[])', a.attname, refs, a.atttypid::regtype)
                   FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
                  WHERE i.indrelid = tbl AND i.indisprimary AND i.indnatts = 1),
                format('c.ctid = ANY (%L::tid[])', refs));

-- Apply a fit computed from _fit_input() (by plpython3u in the database, or by the worker/CLI): p_fit is
--   {"generation": the store's fit_generation the input was read at, "k", "silhouette", "single_theme", "sample",
--    "seed", "dim", "space", "seconds",
--    "clusters": [{"centroid": [..unit vector..], "radius", "size", "representatives": [chunk refs],
--                  "reuse": id of the old cluster it matched and barely moved from, or null,
--                  "inherit": id of the old cluster most of its members belonged to, or null}]}
-- A reused cluster keeps its row: centroid, radius, words, representatives and label, so re-fitting unchanged data
-- changes nothing a router sees and costs no labelling call.  A new cluster whose members mostly lay inside one old
-- cluster (a split, a merge, KMeans cutting the same region differently with another seed) inherits that cluster's
-- words and label: no call either.  Only a cluster of what the old fit called outliers is new.  The other old clusters go; new ones come with
-- representatives and c-TF-IDF words, and need a label.  Then every file of the store is assigned again (one pass
-- over its chunks) and the cluster sizes are recounted.  Compare-and-set: if another fit was applied since the
-- input was read, nothing is written.  Returns a jsonb report.
-- (Joins between a store's files and the pass's result are hashed: right after a big fold file_terms has no
-- statistics yet, and a nested loop over 10k x 10k files took 60 s instead of 0.1 s.)
CREATE OR REPLACE FUNCTION storetopics.apply_fit(p_source int, p_store text, p_fit jsonb) RETURNS jsonb
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp SET work_mem = '128MB' SET enable_nestloop = off SET jit = off
AS $$
DECLARE
  src storetopics.sources;
  st storetopics.store_state;
  v_vs name := storetopics._vector_schema();
  v_new int[];
  v_kept int;
  v_removed int;
  v_inherited int := 0;
  r record;
  v_reps jsonb;
  v_assigned bigint;
  v_updated bigint;
BEGIN
  SELECT * INTO src FROM storetopics.sources WHERE id = p_source FOR UPDATE;   -- one writer of a source's state
  SELECT * INTO st FROM storetopics.store_state WHERE source_id = p_source AND store_key = p_store FOR UPDATE;
  IF NOT FOUND THEN
    RETURN jsonb_build_object('applied', false, 'reason', 'no such store');
  END IF;
  IF (p_fit ->> 'generation')::int IS DISTINCT FROM st.fit_generation THEN
    RETURN jsonb_build_object('applied', false, 'reason', 'another fit was applied since this one read its sample');
  END IF;
  IF jsonb_typeof(p_fit -> 'clusters') <> 'array' OR jsonb_array_length(p_fit -> 'clusters') = 0 THEN
    RAISE EXCEPTION 'storetopics: a fit needs at least one cluster' USING ERRCODE = 'invalid_parameter_value';
  END IF;

  CREATE TEMP TABLE storetopics_fit ON COMMIT DROP AS
  SELECT e.pos::int AS pos, (e.c ->> 'reuse')::int AS reuse, (e.c ->> 'inherit')::int AS inherit,
         e.c -> 'centroid' AS centroid,
         (e.c ->> 'radius')::real AS radius, (e.c ->> 'size')::int AS size,
         ARRAY(SELECT jsonb_array_elements_text(e.c -> 'representatives')) AS refs, NULL::int AS cluster_id
    FROM jsonb_array_elements(p_fit -> 'clusters') WITH ORDINALITY AS e(c, pos);
  -- only clusters that still exist can be reused, each once
  UPDATE pg_temp.storetopics_fit f SET reuse = NULL
   WHERE f.reuse IS NOT NULL AND (NOT EXISTS (SELECT 1 FROM storetopics.clusters k WHERE k.source_id = p_source
                                                AND k.store_key = p_store AND k.cluster_id = f.reuse)
                                  OR EXISTS (SELECT 1 FROM pg_temp.storetopics_fit g WHERE g.reuse = f.reuse AND g.pos < f.pos));
  CREATE TEMP TABLE storetopics_old ON COMMIT DROP AS
  SELECT * FROM storetopics.clusters k WHERE k.source_id = p_source AND k.store_key = p_store;
  DELETE FROM storetopics.clusters k
   WHERE k.source_id = p_source AND k.store_key = p_store
     AND k.cluster_id NOT IN (SELECT f.reuse FROM pg_temp.storetopics_fit f WHERE f.reuse IS NOT NULL);
  GET DIAGNOSTICS v_removed = ROW_COUNT;
  UPDATE storetopics.clusters k SET fit_size = f.size
    FROM pg_temp.storetopics_fit f
   WHERE k.source_id = p_source AND k.store_key = p_store AND k.cluster_id = f.reuse;
  GET DIAGNOSTICS v_kept = ROW_COUNT;
  FOR r IN SELECT * FROM pg_temp.storetopics_fit f WHERE f.reuse IS NULL ORDER BY f.pos LOOP
    EXECUTE format('SELECT coalesce(jsonb_agg(jsonb_build_object(''id'', x.ref, ''file'', x.file, ''text'', x.txt) '
                   'ORDER BY array_position(%1$L::text[], x.ref)), ''[]'') '
                   'FROM (SELECT %2$s AS ref, (%3$s)::text AS file, left(%4$s, 1000) AS txt FROM %5$s AS c WHERE %6$s) x',
                   r.refs, storetopics._chunk_ref_sql(src.chunks), src.file_sql, src.content_sql, src.chunks,
                   storetopics._chunk_lookup_sql(src.chunks, r.refs))
      INTO v_reps;
    EXECUTE format('INSERT INTO storetopics.clusters (source_id, store_key, centroid, radius, fit_size, representatives, '
                   'keywords, label, labeller, label_model, label_needed, label_words) '
                   'SELECT $1, $2, ($3)::text::%I.vector, $4, $5, $6, coalesce(o.keywords, ''{}''), o.label, o.labeller, '
                   '       o.label_model, coalesce(o.label_needed, true), o.label_words '
                   '  FROM (SELECT 1) one LEFT JOIN pg_temp.storetopics_old o ON o.cluster_id = $7 '
                   'RETURNING cluster_id', v_vs)
      INTO r.cluster_id USING p_source, p_store, r.centroid, r.radius, r.size, v_reps, r.inherit;
    IF r.inherit IS NULL OR NOT EXISTS (SELECT 1 FROM pg_temp.storetopics_old o WHERE o.cluster_id = r.inherit) THEN
      v_new := v_new || r.cluster_id;
    ELSE
      v_inherited := v_inherited + 1;
    END IF;
  END LOOP;
  DROP TABLE pg_temp.storetopics_fit, pg_temp.storetopics_old;

  -- Every file of the store, assigned to the clusters now in place.
  PERFORM storetopics._assign(src, format('(%s)::text = %L', src.store_sql, p_store));
  ANALYZE pg_temp.storetopics_assign;
  UPDATE storetopics.file_terms f
     SET cluster_ids = a.cluster_ids, cluster_chunks = a.cluster_chunks, cluster_outliers = a.cluster_outliers,
         other_dim = a.other_dim
    FROM pg_temp.storetopics_assign a
   WHERE f.source_id = p_source AND f.store_key = p_store AND a.store_key = p_store AND f.file_key = a.file_key;
  GET DIAGNOSTICS v_updated = ROW_COUNT;
  -- (a 10k-file store backfilled in two batches kept the statistics of the first: render's keywords() then took
  -- 26 s per pass instead of 0.07 s until autovacuum came by)
  PERFORM storetopics._analyze_if_stale(v_updated);
  -- files of the store the pass did not see (their rows changed since; a pending event will recount them)
  UPDATE storetopics.file_terms f
     SET cluster_ids = '{}', cluster_chunks = '{}', cluster_outliers = '{}', other_dim = 0
   WHERE f.source_id = p_source AND f.store_key = p_store
     AND NOT EXISTS (SELECT 1 FROM pg_temp.storetopics_assign a WHERE a.file_key = f.file_key);
  DROP TABLE pg_temp.storetopics_assign;
  UPDATE storetopics.clusters k SET chunks = 0, files = 0, outliers = 0, outliers_at_fit = 0, outliers_seen = 0
   WHERE k.source_id = p_source AND k.store_key = p_store;
  UPDATE storetopics.clusters k
     SET chunks = x.chunks, files = x.files, outliers = x.outliers, outliers_at_fit = x.outliers,
         outliers_seen = x.outliers
    FROM (SELECT u.cluster_id, sum(u.n) AS chunks, count(*) AS files, sum(u.o) AS outliers
            FROM storetopics.file_terms f,
                 unnest(f.cluster_ids, f.cluster_chunks, f.cluster_outliers) AS u(cluster_id, n, o)
           WHERE f.source_id = p_source AND f.store_key = p_store
           GROUP BY 1) x
   WHERE k.source_id = p_source AND k.store_key = p_store AND k.cluster_id = x.cluster_id;
  SELECT coalesce(sum(k.chunks), 0) INTO v_assigned
    FROM storetopics.clusters k WHERE k.source_id = p_source AND k.store_key = p_store;

  UPDATE storetopics.store_state
     SET other_dim = (SELECT coalesce(sum(f.other_dim), 0) FROM storetopics.file_terms f
                       WHERE f.source_id = p_source AND f.store_key = p_store),
         fit_generation = fit_generation + 1, fit_at = now(), fit_k = (p_fit ->> 'k')::int,
         fit_silhouette = (p_fit ->> 'silhouette')::real, fit_single_theme = (p_fit ->> 'single_theme')::boolean,
         fit_sample = (p_fit ->> 'sample')::int, fit_seed = (p_fit ->> 'seed')::int, fit_dim = (p_fit ->> 'dim')::int,
         fit_space = p_fit ->> 'space', fit_seconds = (p_fit ->> 'seconds')::real, fit_chunks = v_assigned,
         version = version + 1
   WHERE source_id = p_source AND store_key = p_store;
  PERFORM storetopics.refresh_words(p_source, p_store);   -- every cluster's words, for the labeller
  RETURN jsonb_build_object('applied', true, 'generation', st.fit_generation + 1, 'k', (p_fit ->> 'k')::int,
                            'kept', v_kept, 'new', coalesce(cardinality(v_new), 0), 'inherited', v_inherited,
                            'removed', v_removed,
                            'assigned_chunks', v_assigned);
END $$;

-- Each cluster's distinctive words, c-TF-IDF (BERTopic's class-based TF-IDF) over the keyword state: a cluster's
-- term counts are those of its files, each weighted by the share of the file's chunks in the cluster (at most 400
-- files per cluster, the most committed first, ties by a hash of the key); tf(t, cluster) x log(1 + A / f(t)), A = average words per cluster, f(t) = count of t in all
-- clusters.  A term must occur in two of the cluster's files (one file's names are not the cluster's theme).
-- p_clusters: the clusters to update (NULL: all of the store).
CREATE OR REPLACE FUNCTION storetopics._cluster_keywords(p_source int, p_store text, p_clusters int[] DEFAULT NULL,
                                              n_words int DEFAULT 15) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_cfg regconfig := (SELECT s.ts_config FROM storetopics.sources s WHERE s.id = p_source);
BEGIN
  CREATE TEMP TABLE storetopics_ct ON COMMIT DROP AS
  WITH fc AS (
    SELECT f.file_key, f.term_ids, f.counts, u.cluster_id, u.n::float8 / greatest(f.chunks, 1) AS w
      FROM storetopics.file_terms f, unnest(f.cluster_ids, f.cluster_chunks) AS u(cluster_id, n)
     WHERE f.source_id = p_source AND f.store_key = p_store AND f.words > 0
  ), pick AS (
    SELECT * FROM (SELECT fc.*, row_number() OVER (PARTITION BY fc.cluster_id
                                                   ORDER BY fc.w DESC, hashtext(fc.file_key), fc.file_key) AS r
                     FROM fc) x
     WHERE x.r <= 400
  ), ct AS (
    SELECT p.cluster_id, u.term_id, sum(u.n * p.w) AS n, count(*) AS nfiles
      FROM pick p, unnest(p.term_ids, p.counts) AS u(term_id, n)
     GROUP BY 1, 2
  ), tot AS (
    SELECT ct.term_id, sum(ct.n) AS total FROM ct GROUP BY 1
  ), sizes AS (
    SELECT ct.cluster_id, sum(ct.n) AS size, (SELECT count(*) FROM pick p WHERE p.cluster_id = ct.cluster_id) AS files
      FROM ct GROUP BY 1
  ), scored AS (
    -- (a store that is one theme has one cluster: its words are then simply its most frequent ones).  No factor
    -- for the term's rarity in the store: a word every file of the store shares ("perl" in a Perl store) is what
    -- tells this store from others, and the routing benchmark lost 7 points of top-1 when labels lost such words.
    SELECT ct.cluster_id, x.lexeme,
           CASE WHEN a.clusters = 1 THEN ct.n ELSE ct.n / s.size * ln(1 + a.avg / t.total) END AS score
      FROM ct JOIN tot t USING (term_id) JOIN sizes s USING (cluster_id)
      JOIN storetopics.lexemes x ON x.id = ct.term_id,
           (SELECT avg(sizes.size) AS avg, count(*) AS clusters FROM sizes) a
     WHERE ct.nfiles >= least(2, s.files) AND storetopics.showable_term(x.lexeme)
       AND (p_clusters IS NULL OR ct.cluster_id = ANY (p_clusters))
  )
  -- (scores rounded before ranking: float sums depend on row order, equal words must tie whatever the order)
  SELECT * FROM (SELECT sc.*, row_number() OVER (PARTITION BY sc.cluster_id
                                                 ORDER BY round(sc.score::numeric, 9) DESC, sc.lexeme) AS r
                   FROM scored sc) y
   WHERE y.r <= n_words * 2;   -- room for words two lexemes share
  PERFORM storetopics._learn_words(p_source, p_store, ARRAY(SELECT DISTINCT c.lexeme FROM pg_temp.storetopics_ct c));
  UPDATE storetopics.clusters k
     SET keywords = coalesce(w.words, '{}')
    FROM storetopics.clusters k2
    LEFT JOIN (SELECT z.cluster_id, (array_agg(z.word ORDER BY z.r))[1:n_words] AS words
                 FROM (SELECT DISTINCT ON (c.cluster_id, storetopics._show(v_cfg, c.lexeme)) c.cluster_id, c.r,
                              storetopics._show(v_cfg, c.lexeme) AS word
                         FROM pg_temp.storetopics_ct c ORDER BY c.cluster_id, storetopics._show(v_cfg, c.lexeme), c.r) z
                GROUP BY 1) w ON w.cluster_id = k2.cluster_id
   WHERE k.source_id = p_source AND k.store_key = p_store
     AND k2.source_id = k.source_id AND k2.store_key = k.store_key AND k2.cluster_id = k.cluster_id
     AND (p_clusters IS NULL OR k.cluster_id = ANY (p_clusters));
  DROP TABLE pg_temp.storetopics_ct;
END $$;

-- The clusters' words are derived state: computed again from the current counts whenever the store changed since
-- (so a store whose additions were deleted again shows the very words, and offline labels, it had before).  Then
-- the keyword gate: a cluster named by the labeller whose words moved by more than keyword_shift (a share of its
-- top 10 words that are not even among the other's top 15, counted both ways) since it was named is due for a new
-- label; a burst that leaves the words alone costs no labelling call.  New
-- outliers change a cluster's words: this is how they mark it.  Cheap when nothing changed.  Returns the number of
-- clusters whose label became due.
CREATE OR REPLACE FUNCTION storetopics.refresh_words(p_source int, p_store text) RETURNS int
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  st storetopics.store_state;
  v_due int;
  v_shift float8;
BEGIN
  SELECT * INTO st FROM storetopics.store_state WHERE source_id = p_source AND store_key = p_store;
  IF NOT FOUND OR st.words_version = st.version
     OR NOT EXISTS (SELECT 1 FROM storetopics.clusters k WHERE k.source_id = p_source AND k.store_key = p_store) THEN
    RETURN 0;
  END IF;
  PERFORM storetopics._cluster_keywords(p_source, p_store);
  v_shift := (storetopics._settings(p_source) ->> 'keyword_shift')::float8;
  UPDATE storetopics.clusters k
     SET label_needed = true, label_failures = 0, label_retry_at = NULL
   WHERE k.source_id = p_source AND k.store_key = p_store AND NOT k.label_needed AND k.label_words IS NOT NULL
     -- moved: words of one top 10 that are not even in the other's top 15, both ways (so near-ties swapping
     -- places around the 10th word do not count)
     AND (SELECT count(*) FROM unnest(k.label_words[1:10]) w WHERE w <> ALL (k.keywords[1:15]))
         + (SELECT count(*) FROM unnest(k.keywords[1:10]) w WHERE w <> ALL (k.label_words[1:15]))
         > v_shift * 10;
  GET DIAGNOSTICS v_due = ROW_COUNT;
  UPDATE storetopics.clusters k SET outliers_seen = k.outliers
   WHERE k.source_id = p_source AND k.store_key = p_store AND k.outliers_seen <> k.outliers;
  UPDATE storetopics.store_state SET words_version = st.version
   WHERE source_id = p_source AND store_key = p_store;
  RETURN v_due;
END $$;

-- The offline label: the cluster's first three words (c-TF-IDF order) that say something new: a word is skipped
-- when it repeats one already taken, or is a part or a compound of one ("octave", "forge", "octave-forge").
-- Deterministic, no network.
CREATE OR REPLACE FUNCTION storetopics.offline_label(words text[]) RETURNS text
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  w text;
  taken text[] := '{}';
  parts text[] := '{}';
BEGIN
  FOREACH w IN ARRAY coalesce(words, '{}') LOOP
    CONTINUE WHEN NOT storetopics.showable_term(w);
    CONTINUE WHEN lower(w) = ANY (parts) OR regexp_split_to_array(lower(w), '-') && parts;
    taken := taken || w;
    parts := parts || lower(w) || regexp_split_to_array(lower(w), '-');
    EXIT WHEN cardinality(taken) = 3;
  END LOOP;
  RETURN CASE cardinality(taken) WHEN 0 THEN 'general topics' WHEN 1 THEN taken[1] || ' topics'
                                 ELSE array_to_string(taken, ' ') END;
END $$;

-- A label as stored must look like one: 1-48 characters, 2-5 words, letters first, no control characters.  The
-- labeller validates more (URLs, quotes, markup, instructions); this is the last line.
CREATE OR REPLACE FUNCTION storetopics.label_ok(label text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp
RETURN label IS NOT NULL AND length(label) BETWEEN 3 AND 48 AND label ~ '^[[:alnum:]]'
   AND label !~ '[[:cntrl:]<>`"{}\[\]|\\]' AND label !~* '(https?:|www\.)'
   AND cardinality(regexp_split_to_array(trim(label), '\s+')) BETWEEN 2 AND 5;

-- Clusters whose label is due from the configured labeller (none with the offline labeller, whose label is derived
-- from the words): new or changed clusters whose retry time has come.  What a labeller may see of a cluster: its
-- words and representative chunks, never the corpus.
CREATE OR REPLACE FUNCTION storetopics.labels_due(p_source int, p_store text)
RETURNS TABLE (cluster_id int, keywords text[], representatives jsonb, share float8, failures int)
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
  SELECT k.cluster_id, k.keywords, k.representatives,
         k.chunks::float8 / greatest((SELECT sum(k2.chunks) FROM storetopics.clusters k2
                                       WHERE k2.source_id = p_source AND k2.store_key = p_store), 1),
         k.label_failures
    FROM storetopics.clusters k
   WHERE k.source_id = p_source AND k.store_key = p_store AND k.label_needed AND k.chunks > 0
     AND coalesce(k.label_retry_at, '-infinity') <= now()
     AND storetopics._settings(p_source) ->> 'labeller' <> 'offline'
   ORDER BY k.chunks DESC, k.cluster_id;
END;

-- Write back one labelling call (the ledger records it whatever happened):
--   outcome 'ok':       the label is stored (if it still looks like a label, else it counts as rejected);
--   outcome 'rejected': the LLM answered with something that is no label (detail says why): the offline label is
--                       shown, the cluster is not asked again until it changes;
--   outcome 'error':    no answer (network, rate limit, server error): the old label stays, a retry is scheduled
--                       with exponential backoff and jitter (30 s doubling, capped at one hour).
-- Returns whether the cluster still existed.
CREATE OR REPLACE FUNCTION storetopics.record_label(p_source int, p_store text, p_cluster int, p_outcome text, p_label text,
                                         p_labeller text, p_model text DEFAULT NULL, p_input_tokens int DEFAULT 0,
                                         p_output_tokens int DEFAULT 0, p_detail text DEFAULT NULL) RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_price jsonb := storetopics._settings(p_source) #> ARRAY['prices', coalesce(p_model, '')];
  v_outcome text := p_outcome;
  v_detail text := p_detail;
BEGIN
  IF v_outcome = 'ok' AND NOT storetopics.label_ok(p_label) THEN
    v_outcome := 'rejected';
    v_detail := coalesce(v_detail, 'not a 2-5 word label');
  END IF;
  INSERT INTO storetopics.label_ledger (source_id, store_key, cluster_id, labeller, model, input_tokens,
                                        output_tokens, cost_usd, outcome, detail)
  VALUES (p_source, p_store, p_cluster, p_labeller, p_model, coalesce(p_input_tokens, 0), coalesce(p_output_tokens, 0),
          coalesce((coalesce(p_input_tokens, 0) * (v_price ->> 0)::numeric
                    + coalesce(p_output_tokens, 0) * (v_price ->> 1)::numeric) / 1e6, 0),
          v_outcome, left(v_detail, 500));
  IF v_outcome = 'ok' THEN
    UPDATE storetopics.clusters SET label = p_label, labeller = p_labeller, label_model = p_model,
           label_needed = false, label_error = NULL, label_failures = 0, label_retry_at = NULL,
           label_words = keywords[1:15]
     WHERE source_id = p_source AND store_key = p_store AND cluster_id = p_cluster;
  ELSIF v_outcome = 'rejected' THEN
    UPDATE storetopics.clusters SET label = NULL, labeller = p_labeller, label_model = p_model,
           label_needed = false, label_error = 'rejected: ' || v_detail, label_failures = 0, label_retry_at = NULL,
           label_words = keywords[1:15]
     WHERE source_id = p_source AND store_key = p_store AND cluster_id = p_cluster;
  ELSE
    UPDATE storetopics.clusters SET label_error = v_detail, label_failures = label_failures + 1,
           label_retry_at = now() + make_interval(secs => least(3600, 30 * 2 ^ least(label_failures, 20))
                                                          * (0.5 + random() / 2))
     WHERE source_id = p_source AND store_key = p_store AND cluster_id = p_cluster;
  END IF;
  IF NOT FOUND THEN
    RETURN false;
  END IF;
  IF v_outcome <> 'error' THEN
    UPDATE storetopics.store_state SET version = version + 1 WHERE source_id = p_source AND store_key = p_store;
  END IF;
  RETURN true;
END $$;

-- Clustering inside the database, where plpython3u is installed (storetopics._fit_in_database, created at install
-- time then).  Elsewhere the worker or the CLI (`storetopics backfill`) runs the same Python outside Postgres.
CREATE OR REPLACE FUNCTION storetopics.cluster(p_source int, p_store text) RETURNS jsonb
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_result jsonb;
BEGIN
  IF to_regprocedure('storetopics._fit_in_database(int, text)') IS NULL THEN
    RAISE EXCEPTION 'storetopics: clustering inside the database needs plpython3u'
      USING ERRCODE = 'feature_not_supported',
            HINT = 'Run `storetopics backfill` (CLI) or the worker, which cluster outside the database; or install '
                   'plpython3u (with numpy and scikit-learn) before storetopics.';
  END IF;
  EXECUTE 'SELECT storetopics._fit_in_database($1, $2)' INTO v_result USING p_source, p_store;
  RETURN v_result;
END $$;

-- idempotent/070-summary.sql
-- ------------------------------------------------------------------------------------------------------------
-- Keyword lists and the rendered summary
-- ------------------------------------------------------------------------------------------------------------
-- Two ranked lists per store, both computed from the exact counts, deterministic (ties broken by term):
--   dominant:    by total count (what the store is mostly about);
--   distinctive: what is dense and rare.  Two sources, in this order:
--     * outlier files: a file's novelty is the mean IDF of its counted words.  Files whose novelty stands out from the
--       store's own distribution (robust z-score >= 3.5) give their top terms by count x IDF.  This is how one football
--       file among 100k renovation files surfaces: ranked per file, not on store-wide sums.  A file the clustering also
--       finds apart (every chunk beyond its nearest cluster's radius) needs only z >= 2.5: two independent signals,
--       each moderately extreme (measured in Debian's haskell section: packages planted from other sections mostly had
--       z 2.5-4.4 with every chunk outside the clusters; 2 of the section's own 1,076 files had both).  The 3 most
--       novel such files are shown.  A store made of one-off tokens (names) has no outlier file, so its names do not
--       flood the list;
--     * recurring dense terms: (total_sq / total) x IDF, for terms in at least three files whose occurrences come
--       in clusters (total_sq / total >= 2, i.e. one-off mentions are ignored; a name two files share is not a
--       theme).
CREATE OR REPLACE FUNCTION storetopics.keywords(p_source int, p_store text, n_dominant int DEFAULT 10,
                                     n_distinctive int DEFAULT 8)
RETURNS TABLE (kind text, rank int, lexeme text, score float8, files int, total bigint, file_key text)
LANGUAGE sql STABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
  WITH st AS (
    SELECT greatest(s.files, 1)::float8 AS n FROM storetopics.store_state s
     WHERE s.source_id = p_source AND s.store_key = p_store
  ), terms AS (
    SELECT t.term_id, x.lexeme AS term, t.files, t.total, t.total_sq, ln(st.n / t.files) AS idf
      FROM storetopics.store_terms t JOIN storetopics.lexemes x ON x.id = t.term_id, st
     WHERE t.source_id = p_source AND t.store_key = p_store
  ), dominant AS (
    SELECT 'dominant'::text AS kind, t.term, t.total::float8 AS score, t.files, t.total, NULL::text AS file_key
      FROM terms t WHERE storetopics.showable_term(t.term)
     ORDER BY t.total DESC, t.term LIMIT n_dominant
  ), file_words AS (
    SELECT f.file_key, t.term, u.n, t.idf, t.files, t.total
      FROM storetopics.file_terms f
     CROSS JOIN LATERAL unnest(f.term_ids, f.counts) AS u(term_id, n)
      JOIN terms t ON t.term_id = u.term_id
     WHERE f.source_id = p_source AND f.store_key = p_store AND f.words > 0
  ), novelty AS (
    -- rounded: a float sum depends on the order rows arrive in, and files with the same words must tie exactly
    -- whatever the table's physical order (the same state renders the same text)
    SELECT w.file_key, round((sum(w.n * w.idf) / sum(w.n))::numeric, 9)::float8 AS nov
      FROM file_words w GROUP BY w.file_key
  ), spread AS (
    SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY nov) AS med FROM novelty
  ), mad AS (
    SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY abs(v.nov - s.med)) AS mad, s.med
      FROM novelty v, spread s GROUP BY s.med
  ), apart AS (
    -- files the clustering gives no topic: every one of their chunks lies beyond its nearest cluster's radius
    SELECT f.file_key FROM storetopics.file_terms f
     WHERE f.source_id = p_source AND f.store_key = p_store AND f.words > 0 AND cardinality(f.cluster_chunks) > 0
       AND (SELECT sum(o) FROM unnest(f.cluster_outliers) o) = (SELECT sum(c) FROM unnest(f.cluster_chunks) c)
  ), outliers AS (
    SELECT v.file_key, v.nov FROM novelty v CROSS JOIN mad m LEFT JOIN apart a ON a.file_key = v.file_key
     WHERE (v.nov - m.med) / (1.4826 * m.mad + 1e-9) >= CASE WHEN a.file_key IS NULL THEN 3.5 ELSE 2.5 END
     ORDER BY v.nov DESC, v.file_key LIMIT 3
  ), outlier_terms AS (
    -- the top 3 terms of each outlier file; a term two outlier files share is kept once, with its best file
    SELECT DISTINCT ON (x.term) x.term, x.score, x.files, x.total, x.file_key, x.nov FROM (
      SELECT w.term, w.n * w.idf AS score, w.files, w.total, w.file_key, o.nov,
             row_number() OVER (PARTITION BY w.file_key ORDER BY w.n * w.idf DESC, w.term) AS r
        FROM file_words w JOIN outliers o ON o.file_key = w.file_key
       WHERE storetopics.showable_term(w.term) AND w.idf > 0
         AND w.term NOT IN (SELECT d.term FROM dominant d)) x
     WHERE x.r <= 3
     ORDER BY x.term, x.nov DESC, x.score DESC, x.file_key
  ), dense AS (
    SELECT t.term, (t.total_sq::float8 / t.total) * t.idf AS score, t.files, t.total
      FROM terms t
     WHERE t.files >= 3 AND t.total_sq >= 2 * t.total AND t.idf > 0 AND storetopics.showable_term(t.term)
       AND t.term NOT IN (SELECT d.term FROM dominant d)
       AND t.term NOT IN (SELECT o.term FROM outlier_terms o)
  ), distinctive AS (
    SELECT 'distinctive'::text AS kind, x.term, x.score, x.files, x.total, x.file_key
      FROM (SELECT o.term, o.score, o.files, o.total, o.file_key, 0 AS pass, -o.nov AS k1, -o.score AS k2
              FROM outlier_terms o
            UNION ALL
            SELECT d.term, d.score, d.files, d.total, NULL, 1, 0, -d.score FROM dense d) x
     ORDER BY x.pass, x.k1, x.k2, x.term LIMIT n_distinctive
  )
  SELECT d.kind, (row_number() OVER (ORDER BY d.score DESC, d.term))::int, d.term, d.score, d.files, d.total,
         d.file_key FROM dominant d
  UNION ALL
  SELECT x.kind, (row_number() OVER ())::int, x.term, x.score, x.files, x.total, x.file_key FROM distinctive x;
END;

-- The words people wrote for some lexemes of a store, learnt from the texts of files that contain them and
-- remembered in storetopics.term_words.  Returns how many lexemes were learnt.
CREATE OR REPLACE FUNCTION storetopics._learn_words(p_source int, p_store text, p_lexemes text[]) RETURNS int
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  src storetopics.sources;
  v_missing text[];
  v_files text[];
  v_texts text[];
  v_n int;
BEGIN
  SELECT * INTO src FROM storetopics.sources WHERE id = p_source;
  -- One learner at a time: concurrent renders would insert the same words in different orders.
  PERFORM pg_advisory_xact_lock(hashtext('storetopics.term_words'));
  v_missing := ARRAY(SELECT DISTINCT l FROM unnest(p_lexemes) l
                      WHERE NOT EXISTS (SELECT 1 FROM storetopics.term_words w
                                         WHERE w.ts_config = src.ts_config AND w.lexeme = l));
  IF cardinality(v_missing) = 0 THEN
    RETURN 0;
  END IF;
  -- One file per missing lexeme (the first by key), then those files' texts.
  v_files := ARRAY(SELECT DISTINCT x.file_key FROM (
                     SELECT DISTINCT ON (u.term_id) u.term_id, f.file_key
                       FROM storetopics.file_terms f CROSS JOIN LATERAL unnest(f.term_ids) AS u(term_id)
                      WHERE f.source_id = p_source AND f.store_key = p_store
                        AND u.term_id = ANY (ARRAY(SELECT x.id FROM storetopics.lexemes x
                                                    WHERE x.lexeme = ANY (v_missing)))
                      ORDER BY u.term_id, f.file_key) x);
  EXECUTE format('SELECT array_agg(%s) FROM %s AS c WHERE %s = ANY (%L::%s[]) AND (%s)::text = %L',
                 src.content_sql, src.chunks, src.file_sql, v_files, src.file_type, src.store_sql, p_store)
    INTO v_texts;
  INSERT INTO storetopics.term_words (ts_config, lexeme, word)
  SELECT DISTINCT ON (m.lexeme) src.ts_config, m.lexeme, m.word
    -- Words are read both whole ("open-source") and split at hyphens ("open", "source").  A word speaks for a
    -- lexeme when it gives only that lexeme, or, for a hyphenated word, for its compound lexeme only.
    FROM (SELECT w.word, w.n, l.lexeme
            FROM (SELECT x.word, count(*) AS n
                    FROM unnest(v_texts) t,
                         -- (quotes and hyphens at either end are punctuation, not part of the word)
                         LATERAL (SELECT btrim(w, '''-') FROM regexp_split_to_table(lower(t), '[^[:alpha:]''-]+') w
                                  UNION ALL
                                  SELECT btrim(w, '''') FROM regexp_split_to_table(lower(t), '[^[:alpha:]'']+') w)
                           AS x(word)
                   WHERE storetopics.usable_text(t) AND length(x.word) BETWEEN 2 AND 40
                   GROUP BY x.word) w,
                 LATERAL (SELECT tsvector_to_array(to_tsvector(src.ts_config, w.word)) AS ls) v,
                 LATERAL unnest(v.ls) AS l(lexeme)
           WHERE l.lexeme = ANY (v_missing)
             AND (cardinality(v.ls) = 1 OR (strpos(w.word, '-') > 0 AND strpos(l.lexeme, '-') > 0))) m
   ORDER BY m.lexeme, m.n DESC, length(m.word), m.word
  ON CONFLICT DO NOTHING;
  GET DIAGNOSTICS v_n = ROW_COUNT;
  RETURN v_n;
END $$;

CREATE OR REPLACE FUNCTION storetopics._show(cfg regconfig, lexeme text) RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp
RETURN coalesce((SELECT w.word FROM storetopics.term_words w WHERE w.ts_config = cfg AND w.lexeme = _show.lexeme),
                lexeme);

CREATE OR REPLACE FUNCTION storetopics._human_count(n bigint) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp
RETURN CASE WHEN n < 10000 THEN n::text
            WHEN n < 1000000 THEN round(n / 1000.0)::text || 'k'
            ELSE round(n / 1000000.0, 1)::text || 'M' END;

-- Render one store's summary from its current state.  Writes store_topics/topics only when they change, and then
-- sends NOTIFY storetopics_updated '<source id>:<store key>'.  Returns whether the text changed.
CREATE OR REPLACE FUNCTION storetopics.render(p_source int, p_store text) RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  src storetopics.sources;
  st storetopics.store_state;
  v_kw jsonb;
  v_dom text[];
  v_dist text[];
  v_text text;
  v_topics jsonb;
  v_cfg jsonb := storetopics._settings(p_source);
  v_clusters jsonb;
  v_ignored int;
  v_topic_list text[];
  v_explained text[];
BEGIN
  SELECT * INTO src FROM storetopics.sources WHERE id = p_source;
  SELECT * INTO st FROM storetopics.store_state WHERE source_id = p_source AND store_key = p_store FOR UPDATE;
  IF NOT FOUND THEN
    RETURN false;
  END IF;
  IF st.files <= 0 THEN
    DELETE FROM storetopics.store_state WHERE source_id = p_source AND store_key = p_store;
    DELETE FROM storetopics.clusters WHERE source_id = p_source AND store_key = p_store;
    PERFORM storetopics._mirror_summary(p_source, p_store, NULL);
    PERFORM pg_notify('storetopics_updated', p_source || ':' || p_store);
    RETURN true;
  END IF;
  v_ignored := storetopics.refresh_words(p_source, p_store);   -- the clusters' words, from the current counts
  CREATE TEMP TABLE storetopics_kw ON COMMIT DROP AS
  SELECT * FROM storetopics.keywords(p_source, p_store);
  PERFORM storetopics._learn_words(p_source, p_store, ARRAY(SELECT k.lexeme FROM pg_temp.storetopics_kw k));

  -- Two lexemes can show as one word ("run", "running" -> ...); a word is shown once, where it ranks first.
  DELETE FROM pg_temp.storetopics_kw k USING pg_temp.storetopics_kw k2
   WHERE storetopics._show(src.ts_config, k.lexeme) = storetopics._show(src.ts_config, k2.lexeme)
     AND ((k2.kind = 'dominant' AND k.kind = 'distinctive') OR (k2.kind = k.kind AND k2.rank < k.rank));
  SELECT array_agg(storetopics._show(src.ts_config, k.lexeme) ORDER BY k.rank) FILTER (WHERE k.kind = 'dominant'),
         array_agg(storetopics._show(src.ts_config, k.lexeme) ORDER BY k.rank) FILTER (WHERE k.kind = 'distinctive'),
         jsonb_build_object(
           'dominant', coalesce(jsonb_agg(jsonb_build_object('term', storetopics._show(src.ts_config, k.lexeme),
                                 'lexeme', k.lexeme, 'count', k.total, 'files', k.files) ORDER BY k.rank)
                               FILTER (WHERE k.kind = 'dominant'), '[]'),
           'distinctive', coalesce(jsonb_agg(jsonb_build_object('term', storetopics._show(src.ts_config, k.lexeme),
                                 'lexeme', k.lexeme, 'score', round(k.score::numeric, 3), 'files', k.files,
                                 'count', k.total, 'file', k.file_key) ORDER BY k.rank)
                               FILTER (WHERE k.kind = 'distinctive'), '[]'))
    INTO v_dom, v_dist, v_kw
    FROM pg_temp.storetopics_kw k;
  -- The main terms a router is shown: the dominant terms that are more frequent here than in the source's other
  -- stores ("use", "package", "support" are frequent everywhere and tell stores apart no better than nothing).
  -- Compared with up to 50 sibling stores (chosen by a hash of their key: a few hundred index lookups); a store
  -- without two siblings keeps them all.
  v_dom := ARRAY(
    WITH sib AS (
      SELECT y.store_key, y.words FROM storetopics.store_state y
       WHERE y.source_id = p_source AND y.store_key <> p_store AND y.words > 0
       ORDER BY hashtext(y.store_key), y.store_key LIMIT 50
    ), base AS (
      SELECT count(*) AS n, coalesce(sum(sib.words), 0) AS words FROM sib
    ), lift AS (
      SELECT k.lexeme, k.rank,
             (k.total::float8 / greatest(st.words, 1))
             / ((coalesce((SELECT sum(t.total) FROM storetopics.store_terms t
                            WHERE t.source_id = p_source AND t.store_key IN (SELECT sib.store_key FROM sib)
                              AND t.term_id = (SELECT x.id FROM storetopics.lexemes x WHERE x.lexeme = k.lexeme)), 0)
                 + 1)::float8 / (b.words + 1)) AS lift
        FROM pg_temp.storetopics_kw k, base b
       WHERE k.kind = 'dominant'
    )
    SELECT storetopics._show(src.ts_config, l.lexeme) FROM lift l, base b
     WHERE b.n < 2 OR l.lift >= 1.5
     ORDER BY l.rank);
  DROP TABLE pg_temp.storetopics_kw;

  -- Clusters, largest first, with the label a router sees: the labeller's, or the offline one from the words.
  SELECT coalesce(jsonb_agg(jsonb_build_object(
           'id', k.cluster_id, 'label', k.shown, 'labeller', CASE WHEN k.shown = k.label THEN k.labeller ELSE 'offline' END,
           'share', round(k.share::numeric, 4), 'chunks', k.chunks, 'files', k.files, 'keywords', to_jsonb(k.keywords),
           'representatives', (SELECT coalesce(jsonb_agg(r -> 'id'), '[]') FROM jsonb_array_elements(k.representatives) r),
           'outliers', k.outliers - k.outliers_at_fit) ORDER BY k.chunks DESC, k.cluster_id), '[]'),
         array_agg(lower(k.shown || ' ' || array_to_string(k.keywords, ' ')))
    INTO v_clusters, v_explained
    FROM (SELECT k.*, CASE WHEN v_cfg ->> 'labeller' = 'offline' OR k.label IS NULL
                           THEN storetopics.offline_label(k.keywords) ELSE k.label END AS shown,
                 k.chunks::float8 / greatest(sum(k.chunks) OVER (), 1) AS share
            FROM storetopics.clusters k
           WHERE k.source_id = p_source AND k.store_key = p_store AND k.chunks > 0) k;
  v_explained := regexp_split_to_array(coalesce(array_to_string(v_explained, ' '), ''), '\s+');
  -- The topic list: clusters that show the same label are one topic to a reader (their shares add up).
  v_topic_list := ARRAY(SELECT format('%s (%s%%)', t.label, round(100 * t.share))
                          FROM (SELECT c ->> 'label' AS label, sum((c ->> 'share')::float8) AS share,
                                       min(o.i) AS first
                                  FROM jsonb_array_elements(v_clusters) WITH ORDINALITY AS o(c, i)
                                 GROUP BY 1) t
                         WHERE t.share >= 0.02
                         ORDER BY t.share DESC, t.first LIMIT 8);
  -- Distinctive words no cluster explains: the rare file that KMeans absorbs into a big cluster.
  v_dist := ARRAY(SELECT d FROM unnest(v_dist) WITH ORDINALITY AS u(d, i)
                   WHERE lower(d) <> ALL (coalesce(v_explained, '{}')) ORDER BY i);
  v_dom := v_dom[1:CASE WHEN cardinality(v_topic_list) > 0 THEN 6 ELSE 10 END];
  -- At most 200 tokens (cl100k), about 100 as a rule: 2 bytes per token is a bound English text stays far below
  -- (about 4 characters per token); trimmed from the least important end: distinctive words, main terms, topics.
  LOOP
    v_text := format('%s files, %s chunks.', storetopics._human_count(st.files), storetopics._human_count(st.chunks));
    IF cardinality(v_topic_list) > 0 THEN
      v_text := v_text || ' Topics: ' || array_to_string(v_topic_list, ', ') || '.';
    END IF;
    IF cardinality(v_dom) > 0 THEN
      v_text := v_text || ' Main terms: ' || array_to_string(v_dom, ', ') || '.';
    END IF;
    IF cardinality(v_dist) > 0 THEN
      v_text := v_text || ' Distinctive: ' || array_to_string(v_dist, ', ') || '.';
    END IF;
    EXIT WHEN octet_length(v_text) <= 400;
    IF cardinality(v_dist) > 2 THEN
      v_dist := v_dist[1:cardinality(v_dist) - 1];
    ELSIF cardinality(v_dom) > 3 THEN
      v_dom := v_dom[1:cardinality(v_dom) - 1];
    ELSIF cardinality(v_topic_list) > 3 THEN
      v_topic_list := v_topic_list[1:cardinality(v_topic_list) - 1];
    ELSIF cardinality(v_dist) > 0 THEN
      v_dist := v_dist[1:cardinality(v_dist) - 1];
    ELSIF cardinality(v_dom) > 0 THEN
      v_dom := v_dom[1:cardinality(v_dom) - 1];
    ELSIF cardinality(v_topic_list) > 0 THEN
      v_topic_list := v_topic_list[1:cardinality(v_topic_list) - 1];
    ELSE
      v_text := left(v_text, 200);
      EXIT;
    END IF;
  END LOOP;
  v_topics := jsonb_build_object('version', 1, 'files', st.files, 'chunks', st.chunks, 'words', st.words,
                                 'skipped', st.skipped, 'clusters', v_clusters,
                                 'fit', CASE WHEN st.fit_at IS NOT NULL THEN jsonb_build_object(
                                   'generation', st.fit_generation, 'at', st.fit_at, 'k', st.fit_k,
                                   'silhouette', round(st.fit_silhouette::numeric, 4),
                                   'single_theme', st.fit_single_theme, 'sample', st.fit_sample, 'dim', st.fit_dim,
                                   'space', st.fit_space, 'other_dimension_chunks', st.other_dim) END,
                                 'labeller', v_cfg ->> 'labeller',
                                 'cost', (SELECT jsonb_build_object('calls', count(*), 'input_tokens',
                                                   coalesce(sum(l.input_tokens), 0), 'output_tokens',
                                                   coalesce(sum(l.output_tokens), 0), 'usd', coalesce(sum(l.cost_usd), 0))
                                            FROM storetopics.label_ledger l
                                           WHERE l.source_id = p_source AND l.store_key = p_store)) || v_kw;

  UPDATE storetopics.store_state SET rendered_at = now(), rendered_version = st.version
   WHERE source_id = p_source AND store_key = p_store;
  IF st.store_topics IS NOT DISTINCT FROM v_text AND st.topics IS NOT DISTINCT FROM v_topics THEN
    RETURN false;
  END IF;
  UPDATE storetopics.store_state SET store_topics = v_text, topics = v_topics, updated_at = now()
   WHERE source_id = p_source AND store_key = p_store;
  PERFORM storetopics._mirror_summary(p_source, p_store, v_text);
  PERFORM pg_notify('storetopics_updated', p_source || ':' || p_store);
  RETURN true;
END $$;

-- idempotent/080-backfill.sql
-- ------------------------------------------------------------------------------------------------------------
-- Backfill: everything up to date, synchronously, from SQL
-- ------------------------------------------------------------------------------------------------------------
-- backfill() brings every store of every source up to date; backfill('key') the stores with that key;
-- backfill(source => 'public.chunks') one source.  Folds all pending changes of the sources concerned (a file can
-- move between stores, so a source is folded as a whole), then renders the stores whose state changed.
-- A store's summary is due for rendering when what it is rendered from changed since (fold, fit, labels and
-- settings bump store_state.version; a counter, not a clock, so no commit order can hide a change), or when the
-- store was emptied (render then removes it).
CREATE OR REPLACE FUNCTION storetopics.render_due(st storetopics.store_state) RETURNS boolean
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
RETURN st.rendered_version <> st.version OR st.files <= 0;

CREATE OR REPLACE FUNCTION storetopics.backfill(store_key text DEFAULT NULL, source regclass DEFAULT NULL)
RETURNS TABLE (source_id int, store text, files bigint, chunks bigint, changed boolean, clusters int)
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  s record;
  v_store record;
  v_started timestamptz := clock_timestamp();
  v_done int;
  v_in_db boolean := to_regprocedure('storetopics._fit_in_database(int, text)') IS NOT NULL;
  v_told boolean := false;
BEGIN
  FOR s IN SELECT x.id FROM storetopics.sources x
            WHERE (backfill.source IS NULL OR x.chunks = backfill.source)
              AND EXISTS (SELECT 1 FROM pg_class c WHERE c.oid = x.chunks)
              AND (backfill.store_key IS NULL
                   OR EXISTS (SELECT 1 FROM storetopics.store_state y
                               WHERE y.source_id = x.id AND y.store_key = backfill.store_key)
                   OR EXISTS (SELECT 1 FROM storetopics.pending p WHERE p.source_id = x.id))
            ORDER BY x.id LOOP
    LOOP
      v_done := storetopics.fold(s.id);
      -- Up to date as of the call: changes logged after it started do not keep it folding (and holding the
      -- source lock) for as long as writers keep writing.
      EXIT WHEN v_done = 0 OR NOT EXISTS (SELECT 1 FROM storetopics.pending p
                                           WHERE p.source_id = s.id AND p.logged_at < v_started);
      RAISE NOTICE 'storetopics: source %: folded % files', s.id, v_done;
    END LOOP;
    FOR v_store IN SELECT st.store_key FROM storetopics.store_state st
              WHERE st.source_id = s.id AND (backfill.store_key IS NULL OR st.store_key = backfill.store_key)
                AND st.files > 0 AND storetopics.fit_due(s.id, st.store_key) IS NOT NULL
              ORDER BY st.store_key LOOP
      IF v_in_db THEN
        -- clustering inside the database; labels are the offline ones (no network call inside a transaction)
        BEGIN
          PERFORM storetopics.cluster(s.id, v_store.store_key);
        EXCEPTION WHEN OTHERS THEN
          RAISE WARNING 'storetopics: clustering store % of source % failed, its summary keeps the keywords: %',
            v_store.store_key, s.id, SQLERRM;
        END;
      ELSIF NOT v_told THEN
        RAISE NOTICE 'storetopics: stores with embeddings are not clustered: plpython3u is not installed here'
          USING HINT = 'Run `storetopics backfill` (CLI) or the worker, which cluster outside the database.';
        v_told := true;
      END IF;
    END LOOP;
    RETURN QUERY
      SELECT y2.source_id, y2.store_key, y2.files, y2.chunks, storetopics.render(y2.source_id, y2.store_key),
             (SELECT count(*)::int FROM storetopics.clusters k
               WHERE k.source_id = y2.source_id AND k.store_key = y2.store_key AND k.chunks > 0)
        FROM storetopics.store_state y2
       WHERE y2.source_id = s.id AND (backfill.store_key IS NULL OR y2.store_key = backfill.store_key)
         AND storetopics.render_due(y2)
       ORDER BY y2.store_key;
  END LOOP;
  RAISE NOTICE 'storetopics: backfill took %', clock_timestamp() - v_started;
END $$;

-- idempotent/090-worker.sql
-- ------------------------------------------------------------------------------------------------------------
-- The worker: leases per store, debounce, heartbeats (storetopics worker)
-- ------------------------------------------------------------------------------------------------------------
-- Stores whose labelling calls failed this many times in a row, or whose passes failed this many times, show as
-- 'failing' (they keep being retried, with backoff, and recover by themselves).
CREATE OR REPLACE FUNCTION storetopics.failing_after() RETURNS int
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp
RETURN 3;

-- Whether a store has work the worker has not done: changes logged that may concern it (a NULL store key is a
-- delete, a resync or a key not known when logged), a render due, or a labelling retry come due.
CREATE OR REPLACE FUNCTION storetopics._store_dirty(p_source int, p_store text) RETURNS boolean
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
RETURN EXISTS (SELECT 1 FROM storetopics.pending p
                WHERE p.source_id = p_source AND (p.store_key = p_store OR p.store_key IS NULL))
    OR EXISTS (SELECT 1 FROM storetopics.store_state st
                WHERE st.source_id = p_source AND st.store_key = p_store AND storetopics.render_due(st))
    OR EXISTS (SELECT 1 FROM storetopics.clusters k
                WHERE k.source_id = p_source AND k.store_key = p_store AND k.label_needed AND k.chunks > 0
                  AND k.label_retry_at <= now()
                  AND storetopics._settings(p_source) ->> 'labeller' <> 'offline');

-- Record what changed since the last look: stores with logged changes, stores folded but not rendered since, and
-- stores whose labelling retry came due.  One session at a time (the others skip: the one syncing serves them).
-- A new change bumps the store's generation; the first one sets dirty_since.  Changes that name no store (deletes,
-- TRUNCATE, attach) are found by fold(), which bumps the versions of the stores they touched.
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
     WHERE p.store_key IS NOT NULL
     GROUP BY 1, 2
    UNION ALL
    SELECT st.source_id, st.store_key, coalesce(st.folded_at, now()), coalesce(st.folded_at, now()), false
      FROM storetopics.store_state st
     WHERE storetopics.render_due(st)
    UNION ALL
    SELECT k.source_id, k.store_key, min(k.label_retry_at), min(k.label_retry_at), true
      FROM storetopics.clusters k
     WHERE k.label_needed AND k.chunks > 0 AND k.label_retry_at <= now()
       AND storetopics._settings(k.source_id) ->> 'labeller' <> 'offline'
     GROUP BY 1, 2
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
     AND (excluded.generation = 1 OR w.leased_by IS NULL OR w.lease_expires < now());
END $$;

-- When a dirty store is due: quiet for `debounce` seconds since its last change, or dirty for `max_staleness`.
CREATE OR REPLACE FUNCTION storetopics._work_due_at(w storetopics.work, cfg jsonb) RETURNS timestamptz
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
RETURN CASE WHEN w.dirty_since IS NOT NULL THEN
  greatest(least(coalesce(w.changed_at, w.dirty_since) + make_interval(secs => (cfg ->> 'debounce')::float8),
                 w.dirty_since + make_interval(secs => (cfg ->> 'max_staleness')::float8)),
           coalesce(w.next_attempt_at, '-infinity')) END;

-- Sources whose logged changes name no store (deletes, TRUNCATE, attach, keys unknown when logged), debounced like
-- stores: the worker folds them, and the stores the fold touched become dirty.
CREATE OR REPLACE FUNCTION storetopics.sources_to_fold() RETURNS SETOF int
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
  SELECT p.source_id
    FROM storetopics.pending p
    JOIN storetopics.sources s ON s.id = p.source_id
   WHERE p.store_key IS NULL AND NOT (storetopics._settings(s.id) ->> 'paused')::boolean
   GROUP BY p.source_id
  HAVING least(max(p.logged_at) + make_interval(secs => (storetopics._settings(p.source_id) ->> 'debounce')::float8),
               min(p.logged_at) + make_interval(secs => (storetopics._settings(p.source_id) ->> 'max_staleness')::float8))
         <= now()
   ORDER BY 1;
END;

-- Register a worker, or beat its heart: last_seen, the store it works on, and its leases extended by p_lease
-- seconds.  Returns how many leases it still holds.
CREATE OR REPLACE FUNCTION storetopics.worker_heartbeat(p_worker text, p_host text DEFAULT NULL, p_pid int DEFAULT NULL,
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
-- Due: dirty, quiet for `debounce` or dirty for `max_staleness`, its backoff over, its source not paused, and no
-- live lease on it.  Returns the stores with the generation the result is checked against in work_done().
CREATE OR REPLACE FUNCTION storetopics.claim(p_worker text, p_lease float8 DEFAULT 60, p_limit int DEFAULT 1)
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
     CROSS JOIN LATERAL storetopics._settings(s.id) AS cfg
     WHERE w.dirty_since IS NOT NULL
       AND (w.leased_by IS NULL OR w.lease_expires < now())
       AND NOT (cfg ->> 'paused')::boolean
       AND storetopics._work_due_at(w, cfg) <= now()
     ORDER BY storetopics._work_due_at(w, cfg), w.source_id, w.store_key
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
-- nothing to do may sleep before polling again (it also wakes on NOTIFY storetopics_dirty).
CREATE OR REPLACE FUNCTION storetopics.next_due() RETURNS float8
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
RETURN greatest(0, extract(epoch FROM (
  SELECT min(greatest(storetopics._work_due_at(w, cfg), coalesce(w.lease_expires, '-infinity'))) - now()
    FROM storetopics.work w
    JOIN storetopics.sources s ON s.id = w.source_id
   CROSS JOIN LATERAL storetopics._settings(s.id) AS cfg
   WHERE w.dirty_since IS NOT NULL AND NOT (cfg ->> 'paused')::boolean)));

-- Whether p_worker still holds the lease on a store (checked before each labelling call and by work_render).
CREATE OR REPLACE FUNCTION storetopics.lease_held(p_worker text, p_source int, p_store text) RETURNS boolean
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
RETURN EXISTS (SELECT 1 FROM storetopics.work w
                WHERE w.source_id = p_source AND w.store_key = p_store AND w.leased_by = p_worker
                  AND w.lease_expires >= now());

-- render() for a lease holder: NULL (nothing written) when the lease was lost, e.g. the worker stalled past its
-- expiry and another worker took the store over.  The work row stays locked until the render commits.
CREATE OR REPLACE FUNCTION storetopics.work_render(p_worker text, p_source int, p_store text) RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  PERFORM 1 FROM storetopics.work w
    WHERE w.source_id = p_source AND w.store_key = p_store AND w.leased_by = p_worker AND w.lease_expires >= now()
      FOR UPDATE;
  IF NOT FOUND THEN
    RETURN NULL;
  END IF;
  RETURN storetopics.render(p_source, p_store);
END $$;

-- A pass over a store ended: release the lease.  Compare-and-set: the store becomes clean only if its generation
-- is still the one claimed and nothing is left to do (_store_dirty); otherwise it stays dirty (changes that came
-- during the pass are due after their own debounce).  A failed pass (p_error) keeps it dirty and backs off
-- exponentially with jitter (5 s doubling, capped at 10 minutes).  Returns 'clean', 'dirty', 'failed' or NULL
-- when the lease was no longer held (another worker has the store: nothing is written).
CREATE OR REPLACE FUNCTION storetopics.work_done(p_worker text, p_source int, p_store text, p_generation bigint,
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
CREATE OR REPLACE FUNCTION storetopics.worker_stop(p_worker text) RETURNS int
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
       CASE WHEN coalesce(w.attempts, 0) >= storetopics.failing_after()
              OR coalesce(k.label_failures, 0) >= storetopics.failing_after() THEN 'failing'
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
  LEFT JOIN LATERAL (SELECT max(c.label_failures) FILTER (WHERE c.label_needed) AS label_failures,
                            min(c.label_retry_at) FILTER (WHERE c.label_needed) AS label_retry_at,
                            (array_agg(c.label_error ORDER BY c.label_failures DESC)
                               FILTER (WHERE c.label_needed AND c.label_failures > 0))[1] AS label_error
                       FROM storetopics.clusters c
                      WHERE c.source_id = x.source_id AND c.store_key = x.store_key AND c.chunks > 0) k ON true
  LEFT JOIN LATERAL (SELECT count(*) AS calls, sum(g.cost_usd) AS cost_usd FROM storetopics.label_ledger g
                      WHERE g.source_id = x.source_id AND g.store_key = x.store_key) l ON true
 WHERE st.files > 0 OR w.dirty_since IS NOT NULL;
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

-- idempotent/100-views.sql
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

-- idempotent/900-privileges.sql
-- ------------------------------------------------------------------------------------------------------------
-- Privileges and dumps
-- ------------------------------------------------------------------------------------------------------------
REVOKE ALL ON ALL TABLES IN SCHEMA storetopics FROM PUBLIC;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA storetopics FROM PUBLIC;
GRANT EXECUTE ON FUNCTION storetopics.usable_text(text), storetopics.showable_term(text),
  storetopics._human_count(bigint) TO PUBLIC;

DO $$
DECLARE
  v_dir text;
BEGIN
  IF (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) THEN
    v_dir := (SELECT setting FROM pg_catalog.pg_config WHERE name = 'SHAREDIR') || '/extension';
    IF NOT EXISTS (SELECT 1 FROM pg_event_trigger WHERE evtname = 'storetopics_forget_dropped_tables') THEN
      CREATE EVENT TRIGGER storetopics_forget_dropped_tables ON sql_drop
        EXECUTE FUNCTION storetopics._forget_dropped_tables();
    END IF;
  END IF;
  -- Clustering inside the database, where plpython3u is installed: the module plpy/storetopics_clustering.py,
  -- installed by `make install` beside this script, does the work (the worker imports the same file).
  IF v_dir IS NOT NULL AND EXISTS (SELECT 1 FROM pg_language WHERE lanname = 'plpython3u') THEN
    EXECUTE format($f$
      CREATE OR REPLACE FUNCTION storetopics._fit_in_database(p_source int, p_store text) RETURNS jsonb
      LANGUAGE plpython3u SET search_path = pg_catalog, pg_temp AS $py$
import sys
if %L not in sys.path:
    sys.path.insert(0, %L)
import storetopics_clustering
return storetopics_clustering.fit_store(storetopics_clustering.PlpyDatabase(plpy), p_source, p_store)
$py$
$f$, v_dir, v_dir);
    REVOKE ALL ON FUNCTION storetopics._fit_in_database(int, text) FROM PUBLIC;
  END IF;
  IF EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'storetopics') THEN
    PERFORM pg_catalog.pg_extension_config_dump('storetopics.sources', '');
    PERFORM pg_catalog.pg_extension_config_dump('storetopics.pending', '');
    PERFORM pg_catalog.pg_extension_config_dump('storetopics.lexemes', '');
    PERFORM pg_catalog.pg_extension_config_dump('storetopics.file_terms', '');
    PERFORM pg_catalog.pg_extension_config_dump('storetopics.store_terms', '');
    PERFORM pg_catalog.pg_extension_config_dump('storetopics.store_state', '');
    PERFORM pg_catalog.pg_extension_config_dump('storetopics.term_words', '');
    PERFORM pg_catalog.pg_extension_config_dump('storetopics.clusters', '');
    PERFORM pg_catalog.pg_extension_config_dump('storetopics.label_ledger', '');
  END IF;
END $$;

UPDATE storetopics.meta SET value = '0.2' WHERE key = 'version';
