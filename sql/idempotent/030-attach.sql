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
