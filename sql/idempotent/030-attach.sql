-- ------------------------------------------------------------------------------------------------------------
-- Attach / detach, and who may do what
-- ------------------------------------------------------------------------------------------------------------
-- The public entry points that change a source (attach, detach, resync, configure, grant_read, verify) are SECURITY
-- DEFINER: they create functions in the schema, triggers on the table and rows in storetopics' tables, which no
-- tenant may do itself.  Inside them current_user is the extension's owner, so every check is made for the role
-- that called in (_caller); the internal functions they use are not executable by tenants.

-- The role that called in: the session's role as SET ROLE left it, or the login role.  Unlike current_user it is
-- not changed by SECURITY DEFINER, and nobody can set it to a role they could not become (SET ROLE checks that);
-- through a pooler that logs in as one role and SETs ROLE per tenant, it is the tenant.
CREATE OR REPLACE FUNCTION storetopics._caller() RETURNS regrole
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
RETURN quote_ident(coalesce(nullif(current_setting('role'), 'none'), session_user))::regrole;

-- Whether the caller may act as a role (is it, is a member with its privileges, or is a superuser).
CREATE OR REPLACE FUNCTION storetopics._may_act_as(p_role regrole) RETURNS boolean
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
RETURN pg_has_role(storetopics._caller(), p_role, 'USAGE');

-- Whether the caller is an administrator of storetopics: it may act as the owner of the schema (the role that
-- installed it, or a superuser).
CREATE OR REPLACE FUNCTION storetopics._is_admin() RETURNS boolean
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
RETURN storetopics._may_act_as((SELECT n.nspowner::regrole FROM pg_namespace n WHERE n.nspname = 'storetopics'));

-- The source of an attached table, for a caller who may act as its owner (else insufficient_privilege).
CREATE OR REPLACE FUNCTION storetopics._owned_source(p_chunks regclass) RETURNS storetopics.sources
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  src storetopics.sources;
BEGIN
  SELECT * INTO src FROM storetopics.sources s WHERE s.chunks = p_chunks;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'storetopics: % is not attached', p_chunks USING ERRCODE = 'undefined_object';
  ELSIF NOT storetopics._may_act_as(src.owner) THEN
    RAISE EXCEPTION 'storetopics: only the owner of % (%) may do that', p_chunks, src.owner
      USING ERRCODE = 'insufficient_privilege';
  END IF;
  RETURN src;
END $$;

-- Deletes every storetopics row of a source (no checks: callers check).
CREATE OR REPLACE FUNCTION storetopics._forget_source(p_source int) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  PERFORM storetopics._catalog_move(p_source, storetopics._catalog(p_source), NULL);
  DELETE FROM storetopics.pending WHERE source_id = p_source;
  DELETE FROM storetopics.file_terms WHERE source_id = p_source;
  DELETE FROM storetopics.file_clusters WHERE source_id = p_source;
  DELETE FROM storetopics.store_terms WHERE source_id = p_source;
  PERFORM storetopics._forget_novelty(p_source);
  DELETE FROM storetopics.store_state WHERE source_id = p_source;
  DELETE FROM storetopics.clusters WHERE source_id = p_source;
  DELETE FROM storetopics.label_ledger WHERE source_id = p_source;
  DELETE FROM storetopics.grants WHERE source_id = p_source;
  DELETE FROM storetopics.store_words WHERE source_id = p_source;
  -- the words learnt from the owner's texts, with the owner's last source
  DELETE FROM storetopics.term_words w USING storetopics.sources s
   WHERE s.id = p_source AND w.owner = s.owner
     AND NOT EXISTS (SELECT 1 FROM storetopics.sources o WHERE o.owner = s.owner AND o.id <> p_source);
  DELETE FROM storetopics.sources WHERE id = p_source;
END $$;

-- The capture triggers on the attached table and on every partition of it (statement triggers of a partitioned
-- table do not fire for statements that name a partition), dropped from tables that left the tree, and on
-- files_table.  Idempotent: attach, resync() and the DDL event trigger (partitions created or attached later) call
-- it.  settings.replica_capture makes them ENABLE ALWAYS, so rows written with session_replication_role = replica
-- (logical replication, pg_restore) are captured too.  Returns how many tables got triggers they lacked.
CREATE OR REPLACE FUNCTION storetopics._create_triggers(src storetopics.sources) RETURNS int
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  fn regprocedure := (storetopics._generated(src.id, 'capture') || '()')::regprocedure;
  v_mode text := CASE WHEN (storetopics._settings(src.id) ->> 'replica_capture')::boolean THEN 'ALWAYS' ELSE '' END;
  v_enabled "char" := CASE WHEN v_mode = 'ALWAYS' THEN 'A' ELSE 'O' END;   -- pg_trigger.tgenabled
  r record;
  v_new int := 0;
  -- its own DDL fires the DDL event trigger (_follow_ddl), which must not call it again
  v_was text := coalesce(current_setting('storetopics.in_ddl', true), '');
BEGIN
  PERFORM set_config('storetopics.in_ddl', 'on', true);
  FOR r IN SELECT t.tgrelid, t.tgname FROM pg_trigger t
            WHERE t.tgfoid = fn AND t.tgrelid <> ALL (storetopics._tree(src.chunks))
              AND t.tgrelid IS DISTINCT FROM src.files_table LOOP
    EXECUTE format('DROP TRIGGER %I ON %s', r.tgname, r.tgrelid::regclass);
  END LOOP;
  FOR r IN SELECT x.relid AS rel, k.name, k.ddl
             FROM unnest(storetopics._tree(src.chunks)) x(relid),
                  (VALUES ('storetopics_ins', 'AFTER INSERT ON %s REFERENCING NEW TABLE AS new_rows'),
                          ('storetopics_upd', 'AFTER UPDATE ON %s REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows'),
                          ('storetopics_del', 'AFTER DELETE ON %s'),
                          ('storetopics_trunc', 'AFTER TRUNCATE ON %s')) AS k(name, ddl)
           UNION ALL
           SELECT src.files_table, k.name, k.ddl
             FROM (VALUES (format('storetopics_%s_files_ins', src.id), 'AFTER INSERT ON %s REFERENCING NEW TABLE AS new_rows'),
                          (format('storetopics_%s_files_upd', src.id),
                           'AFTER UPDATE ON %s REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows'),
                          (format('storetopics_%s_files_del', src.id), 'AFTER DELETE ON %s REFERENCING OLD TABLE AS old_rows'))
                  AS k(name, ddl)
            WHERE src.files_table IS NOT NULL LOOP
    IF NOT EXISTS (SELECT 1 FROM pg_trigger t WHERE t.tgrelid = r.rel AND t.tgname = r.name) THEN
      EXECUTE format('CREATE TRIGGER %I ' || r.ddl || ' FOR EACH STATEMENT EXECUTE FUNCTION %s(%s)', r.name,
                     r.rel::regclass, storetopics._generated(src.id, 'capture'),
                     CASE WHEN r.rel = src.files_table THEN '''files''' ELSE '' END);
      v_new := v_new + 1;
    END IF;
    IF (SELECT t.tgenabled FROM pg_trigger t WHERE t.tgrelid = r.rel AND t.tgname = r.name) <> v_enabled THEN
      EXECUTE format('ALTER TABLE %s ENABLE %s TRIGGER %I', r.rel::regclass, v_mode, r.name);
    END IF;
  END LOOP;
  PERFORM set_config('storetopics.in_ddl', v_was, true);
  RETURN v_new;
END $$;

-- Attach storetopics to an application's chunk table; returns the source id.  The caller must be able to act as
-- the owner of the table (and of files_table); superusers can, and table owners may call it once an administrator
-- ran storetopics.grant_attach(role).  The keys are columns or SQL expressions over the chunk row `c`: they run as
-- the table's owner, whoever folds.
--   files_table, files_key: when the store key is looked up in another table (files(id, store_id) in
--     `(SELECT f.store_id FROM files f WHERE f.id = c.file_id)`), an INSERT, UPDATE or DELETE of that table moves
--     files between stores without touching a chunk.  Naming it installs three triggers on it that log the rows'
--     files_key (which must equal the chunks' file key as text) for a recount.
--   mirror, mirror_key, mirror_column: render() also copies each store's summary into the application's own table:
--     UPDATE mirror SET mirror_column = <summary> WHERE mirror_key::text = <store key> (NULL once the store is
--     empty), as the table's owner, who must hold UPDATE on that column and SELECT on it and on the key.
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
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_owner regrole := (SELECT c.relowner::regrole FROM pg_class c WHERE c.oid = chunks);
  v_file_type regtype;
  src storetopics.sources;
BEGIN
  v_file_type := storetopics._attach_check(chunks, store_key, file_key, content, embedding, files_table, files_key,
                                          mirror, mirror_key, mirror_column);
  PERFORM storetopics._validate_settings(settings);
  INSERT INTO storetopics.sources (chunks, owner, store_key, file_key, content, embedding, store_sql, file_sql,
                                   content_sql, file_type, ts_config, settings, files_table, files_key, mirror,
                                   mirror_key, mirror_column, key_attnums)
  VALUES (chunks, v_owner, store_key, file_key, content, embedding, storetopics._key_sql(chunks, store_key),
          storetopics._key_sql(chunks, file_key), storetopics._key_sql(chunks, content), v_file_type, ts_config,
          coalesce(settings, '{}'), files_table, CASE WHEN files_table IS NOT NULL THEN files_key END,
          mirror, CASE WHEN mirror IS NOT NULL THEN mirror_key END, CASE WHEN mirror IS NOT NULL THEN mirror_column END,
          ARRAY[storetopics._attnum(chunks, store_key), storetopics._attnum(chunks, file_key),
                storetopics._attnum(chunks, content), storetopics._attnum(chunks, embedding),
                storetopics._attnum(files_table, files_key)])
  RETURNING * INTO src;
  -- The first fold counts every row that is already there.
  INSERT INTO storetopics.pending (source_id, resync, logged_by) VALUES (src.id, true, v_owner);
  PERFORM storetopics._regenerate(src.id);
  PERFORM storetopics._warn_unindexed_file_key(chunks, file_key);
  PERFORM pg_notify('storetopics_dirty', src.id::text);
  RETURN src.id;
END $$;
COMMENT ON FUNCTION storetopics.attach(regclass, text, text, text, text, regconfig, jsonb, regclass, text, regclass,
                                      text, text) IS
  'Attach a chunk table: store_key and file_key (columns or SQL over the row c), content, embedding (NULL: keywords '
  'only); returns the source id.  The caller must be able to act as the table''s owner; the keys run as that owner.';

-- Every check attach() makes, and nothing else: nothing is installed and no source id is used up (`storetopics
-- attach --dry-run`).  Raises attach()'s error; returns the type of the file key.  Granted with attach().
CREATE OR REPLACE FUNCTION storetopics.attach_check(
  chunks regclass, store_key text, file_key text, content text DEFAULT 'content', embedding text DEFAULT NULL,
  ts_config regconfig DEFAULT 'pg_catalog.english', settings jsonb DEFAULT '{}', files_table regclass DEFAULT NULL,
  files_key text DEFAULT 'id', mirror regclass DEFAULT NULL, mirror_key text DEFAULT 'id',
  mirror_column text DEFAULT 'store_topics') RETURNS regtype
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  PERFORM storetopics._validate_settings(settings);
  RETURN storetopics._attach_check(chunks, store_key, file_key, content, embedding, files_table, files_key, mirror,
                                   mirror_key, mirror_column);
END $$;
COMMENT ON FUNCTION storetopics.attach_check(regclass, text, text, text, text, regconfig, jsonb, regclass, text,
                                            regclass, text, text) IS
  'Every check attach() makes with the same arguments, installing nothing (attach --dry-run); returns the file key''s type.';

-- attach()'s checks, for the caller: what it names exists and has the right type, and the caller may act as the
-- owner of every table it installs triggers on; a mirror must be writable by the table's owner.  Returns the type
-- of the file key (fold looks files up with it, so the application's index on it serves).
CREATE OR REPLACE FUNCTION storetopics._attach_check(
  p_chunks regclass, p_store_key text, p_file_key text, p_content text, p_embedding text, p_files_table regclass,
  p_files_key text, p_mirror regclass, p_mirror_key text, p_mirror_column text) RETURNS regtype
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_owner regrole := (SELECT c.relowner::regrole FROM pg_class c WHERE c.oid = p_chunks);
  v_file_type regtype;
BEGIN
  IF (SELECT relkind FROM pg_class WHERE oid = p_chunks) NOT IN ('r', 'p') THEN
    RAISE EXCEPTION 'storetopics: % is not a table', p_chunks USING ERRCODE = 'wrong_object_type';
  END IF;
  IF NOT storetopics._may_act_as(v_owner)
     OR (p_files_table IS NOT NULL
         AND NOT storetopics._may_act_as((SELECT relowner::regrole FROM pg_class WHERE oid = p_files_table))) THEN
    RAISE EXCEPTION 'storetopics: only the owner of % (or a member of its role) can attach it',
      CASE WHEN storetopics._may_act_as(v_owner) THEN p_files_table ELSE p_chunks END
      USING ERRCODE = 'insufficient_privilege';
  END IF;
  IF EXISTS (SELECT 1 FROM storetopics.sources s WHERE s.chunks = p_chunks) THEN
    RAISE EXCEPTION 'storetopics: % is already attached', p_chunks USING ERRCODE = 'duplicate_object',
      HINT = 'Detach it first with storetopics.detach(...).';
  END IF;
  v_file_type := storetopics._check_keys(p_chunks, p_store_key, p_file_key, p_content, p_embedding, p_files_table,
                                         p_files_key, NULL);
  IF p_mirror IS NOT NULL THEN
    PERFORM storetopics._mirror_check(v_owner, p_mirror, p_mirror_key, p_mirror_column);
  END IF;
  RETURN v_file_type;
END $$;

-- The keys of a source checked against its tables as they are now (at attach, and after DDL): store_key, file_key
-- and content are columns or one expression each (storetopics._expr_type), content is text, the embedding a
-- pgvector column, files_key a column of files_table.  Returns the file key's type.  source: how errors name the
-- source (NULL at attach).
CREATE OR REPLACE FUNCTION storetopics._check_keys(
  p_chunks regclass, p_store_key text, p_file_key text, p_content text, p_embedding text, p_files_table regclass,
  p_files_key text, source text) RETURNS regtype
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_type regtype;
  v_file_type regtype;
  v_of text := CASE WHEN source IS NULL THEN '' ELSE format(' (%s)', source) END;
BEGIN
  IF coalesce(trim(p_store_key), '') = '' OR coalesce(trim(p_file_key), '') = '' OR coalesce(trim(p_content), '') = '' THEN
    RAISE EXCEPTION 'storetopics: store_key, file_key and content are required' USING ERRCODE = 'null_value_not_allowed';
  END IF;
  PERFORM storetopics._expr_type(p_chunks, p_store_key, format('store_key %L%s', p_store_key, v_of));
  v_file_type := storetopics._expr_type(p_chunks, p_file_key, format('file_key %L%s', p_file_key, v_of));
  v_type := storetopics._expr_type(p_chunks, p_content, format('content %L%s', p_content, v_of));
  IF storetopics._base_type(v_type) NOT IN ('text'::regtype, 'character varying'::regtype, 'character'::regtype) THEN
    RAISE EXCEPTION 'storetopics: content % of % is %, not text', p_content, p_chunks::text || v_of, v_type
      USING ERRCODE = 'datatype_mismatch';
  END IF;
  IF p_embedding IS NOT NULL THEN
    SELECT a.atttypid::regtype INTO v_type FROM pg_attribute a
     WHERE a.attrelid = p_chunks AND a.attname = p_embedding AND a.attnum > 0 AND NOT a.attisdropped;
    IF v_type IS NULL THEN
      RAISE EXCEPTION 'storetopics: % has no column %', p_chunks, p_embedding || v_of USING ERRCODE = 'undefined_column';
    ELSIF (SELECT typname FROM pg_type WHERE oid = v_type) NOT IN ('vector', 'halfvec') THEN
      RAISE EXCEPTION 'storetopics: embedding column % of % is %, not a pgvector vector', p_embedding,
        p_chunks::text || v_of, v_type USING ERRCODE = 'datatype_mismatch';
    END IF;
  END IF;
  IF p_files_table IS NOT NULL THEN
    IF (SELECT relkind FROM pg_class WHERE oid = p_files_table) NOT IN ('r', 'p') THEN
      RAISE EXCEPTION 'storetopics: files_table % is not a table', p_files_table USING ERRCODE = 'wrong_object_type';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = p_files_table AND a.attname = p_files_key
                    AND a.attnum > 0 AND NOT a.attisdropped) THEN
      RAISE EXCEPTION 'storetopics: files_table % has no column %', p_files_table, p_files_key || v_of
        USING ERRCODE = 'undefined_column', HINT = 'files_key names its column that holds the chunks'' file key.';
    END IF;
  END IF;
  RETURN v_file_type;
END $$;

-- The attnum of a table's column (NULL: no such column, or an expression).
CREATE OR REPLACE FUNCTION storetopics._attnum(p_table regclass, p_column text) RETURNS int2
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
RETURN (SELECT a.attnum FROM pg_attribute a
         WHERE a.attrelid = p_table AND a.attname = p_column AND a.attnum > 0 AND NOT a.attisdropped);

-- fold() recounts every file a write touched (an insert, an update, a delete) by reading that file's chunks through
-- the file key: without an index whose first column is that key, each recount reads the whole table, so attach()
-- warns (it does not fail: a small table does without, and the index can come later).  Only a file key that is a
-- plain column is checked: whether an expression index serves an expression key is the planner's business, and
-- planning the attacher's expression here, as the extension's owner, could run it.  A partitioned table is covered
-- by an index on it (its partitions get one each) or by one on every partition.
CREATE OR REPLACE FUNCTION storetopics._warn_unindexed_file_key(p_chunks regclass, p_file_key text) RETURNS void
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_indexed boolean;
BEGIN
  IF storetopics._key_sql(p_chunks, p_file_key) <> format('c.%I', p_file_key) THEN
    RETURN;
  END IF;
  WITH keyed AS (       -- tables of the tree with a whole (not partial), valid index that starts with the file key
    SELECT i.indrelid FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
     WHERE i.indrelid = ANY (storetopics._tree(p_chunks)) AND a.attname = p_file_key AND i.indisvalid
       AND i.indpred IS NULL)
  SELECT p_chunks IN (SELECT l.indrelid FROM keyed l)
         OR coalesce((SELECT bool_and(r.oid IN (SELECT l.indrelid FROM keyed l))
                        FROM unnest(storetopics._tree(p_chunks)) x(relid) JOIN pg_class r ON r.oid = x.relid
                       WHERE r.relkind = 'r' AND r.oid <> p_chunks), false)
    INTO v_indexed;
  IF NOT v_indexed THEN
    RAISE WARNING 'storetopics: % has no index on its file key %', p_chunks, p_file_key
      USING DETAIL = 'Each file a write touches is recounted by reading its chunks through the file key: without '
                     'an index, every recount reads the whole table.',
            HINT = format('CREATE INDEX %sON %s (%I);',
                          CASE WHEN (SELECT c.relkind FROM pg_class c WHERE c.oid = p_chunks) = 'r'
                               THEN 'CONCURRENTLY ' ELSE '' END, p_chunks, p_file_key);
  END IF;
END $$;

-- A mirror target: a table with the key column and a text column of its own, which the table's owner may update
-- (the mirror writes as that owner).
CREATE OR REPLACE FUNCTION storetopics._mirror_check(p_owner regrole, p_mirror regclass, p_key text, p_column text)
RETURNS void
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_type regtype;
BEGIN
  IF (SELECT relkind FROM pg_class WHERE oid = p_mirror) NOT IN ('r', 'p') THEN
    RAISE EXCEPTION 'storetopics: mirror % is not a table', p_mirror USING ERRCODE = 'wrong_object_type';
  END IF;
  IF NOT EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = p_mirror AND a.attname = p_key
                  AND a.attnum > 0 AND NOT a.attisdropped) THEN
    RAISE EXCEPTION 'storetopics: mirror % has no column % (mirror_key)', p_mirror, p_key
      USING ERRCODE = 'undefined_column', HINT = 'mirror_key names its column that holds the store key.';
  END IF;
  SELECT a.atttypid::regtype INTO v_type FROM pg_attribute a
   WHERE a.attrelid = p_mirror AND a.attname = p_column AND a.attnum > 0 AND NOT a.attisdropped;
  IF v_type IS NULL THEN
    RAISE EXCEPTION 'storetopics: mirror % has no column % (mirror_column)', p_mirror, p_column
      USING ERRCODE = 'undefined_column', HINT = format('Add it: ALTER TABLE %s ADD COLUMN %I text', p_mirror, p_column);
  ELSIF v_type NOT IN ('text'::regtype, 'character varying'::regtype) OR p_column = p_key THEN
    RAISE EXCEPTION 'storetopics: mirror column % of % is %, not a text column of its own', p_column, p_mirror,
      v_type USING ERRCODE = 'datatype_mismatch';
  END IF;
  IF NOT has_column_privilege(p_owner, p_mirror, p_column, 'UPDATE')
     OR NOT has_column_privilege(p_owner, p_mirror, p_key, 'SELECT')
     OR NOT has_column_privilege(p_owner, p_mirror, p_column, 'SELECT') THEN
    RAISE EXCEPTION 'storetopics: % may not update %.% (the mirror writes as the table''s owner)', p_owner, p_mirror,
      p_column USING ERRCODE = 'insufficient_privilege',
      HINT = format('GRANT SELECT (%I, %I), UPDATE (%I) ON %s TO %s', p_key, p_column, p_column, p_mirror, p_owner);
  END IF;
END $$;

-- render()'s copy of a store's summary (NULL: the store is gone) into attach(..., mirror => ...), by the source's
-- generated mirror function, as the table's owner.  It never fails a render: a mirror table dropped, a column gone
-- or a right revoked is a WARNING, and the summary in storetopics.stores stays right.
CREATE OR REPLACE FUNCTION storetopics._mirror(src storetopics.sources, p_store text, p_text text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  IF src.mirror IS NULL THEN
    RETURN;
  END IF;
  BEGIN
    PERFORM storetopics._reader(src.id);   -- made current with the reader
    EXECUTE format('SELECT %s($1, $2)', storetopics._generated(src.id, 'mirror')) USING p_store, p_text;
  EXCEPTION WHEN OTHERS THEN
    RAISE WARNING 'storetopics: could not mirror the summary of store % of source % into %.%: %', p_store,
      src.id, src.mirror, src.mirror_column, SQLERRM;
  END;
END $$;

-- Detach by source id (also when the table is gone).  The caller must be able to act as the source's owner.
CREATE OR REPLACE FUNCTION storetopics._detach_source(p_source int) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  src storetopics.sources;
BEGIN
  SELECT * INTO src FROM storetopics.sources WHERE id = p_source FOR UPDATE;
  IF NOT FOUND THEN
    RETURN false;
  END IF;
  IF NOT storetopics._may_act_as(src.owner) THEN
    RAISE EXCEPTION 'storetopics: only the owner of % (%) can detach it', src.chunks, src.owner
      USING ERRCODE = 'insufficient_privilege';
  END IF;
  PERFORM storetopics._drop_generated(p_source);   -- the triggers go with the capture function
  PERFORM storetopics._forget_source(p_source);
  RETURN true;
END $$;
COMMENT ON FUNCTION storetopics._detach_source(int) IS
  'Detach a source by id (also when its table was dropped): triggers, generated functions and state go.';

CREATE OR REPLACE FUNCTION storetopics.detach(chunks regclass) RETURNS boolean
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
RETURN coalesce((SELECT storetopics._detach_source(s.id) FROM storetopics.sources s WHERE s.chunks = detach.chunks),
                false);
COMMENT ON FUNCTION storetopics.detach(regclass) IS
  'Detach a table: its triggers, generated functions and summaries go; the table is left as it is.';

-- A table dropped where no event trigger saw it (managed Postgres, where extensions may not make event triggers)
-- leaves its source behind: its stores are left out of every read until this forgets it.  The caller's own sources
-- (those it may act as the owner of); returns the ids they had.
CREATE OR REPLACE FUNCTION storetopics.detach_dropped() RETURNS SETOF int
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_source int;
BEGIN
  FOR v_source IN SELECT s.id FROM storetopics.sources s
                   WHERE NOT EXISTS (SELECT 1 FROM pg_class c WHERE c.oid = s.chunks)
                     AND storetopics._may_act_as(s.owner)
                   ORDER BY s.id LOOP
    IF storetopics._detach_source(v_source) THEN
      RETURN NEXT v_source;
    END IF;
  END LOOP;
END $$;
COMMENT ON FUNCTION storetopics.detach_dropped() IS
  'Forget the caller''s sources whose tables were dropped without an event trigger seeing it; returns their ids.';

-- Forget a source's state and recount everything on the next fold, after making its functions and triggers again
-- from its tables as they are now (renamed columns followed, partitions added since covered): what recovers a
-- source after DDL no event trigger saw.  Rows read row by row since a key raised for one are read set-based again
-- (the next fold finds out anew).
CREATE OR REPLACE FUNCTION storetopics.resync(chunks regclass) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  src storetopics.sources := storetopics._owned_source(chunks);
BEGIN
  UPDATE storetopics.sources s SET safe_keys = false, key_error = NULL, key_error_at = NULL WHERE s.id = src.id;
  PERFORM storetopics._regenerate(src.id);
  INSERT INTO storetopics.pending (source_id, resync, logged_by) VALUES (src.id, true, src.owner);
END $$;
COMMENT ON FUNCTION storetopics.resync(regclass) IS
  'Recount every row of an attached table at the next fold, after making its capture again from the table as it is '
  '(after DDL storetopics could not see, e.g. a rename in a table a key expression reads).';

-- Compare every file's live chunk count with the folded one at the next fold, and recount those that differ: finds
-- rows written while the capture triggers did not fire (session_replication_role = replica, ALTER TABLE ... DISABLE
-- TRIGGER, a partition attached with its rows).  The worker does it every settings.verify_every seconds.
-- chunks NULL: every source the caller may act for.  Returns how many sources will be checked.
CREATE OR REPLACE FUNCTION storetopics.verify(chunks regclass DEFAULT NULL) RETURNS int
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_n int;
BEGIN
  IF chunks IS NOT NULL THEN
    PERFORM storetopics._owned_source(chunks);
  END IF;
  INSERT INTO storetopics.pending (source_id, deletes, logged_by)
  SELECT s.id, true, s.owner FROM storetopics.sources s
   WHERE (verify.chunks IS NULL OR s.chunks = verify.chunks) AND storetopics._may_act_as(s.owner);
  GET DIAGNOSTICS v_n = ROW_COUNT;
  RETURN v_n;
END $$;
COMMENT ON FUNCTION storetopics.verify(regclass) IS
  'Check at the next fold that every file''s live chunk count matches what was folded, and recount those that '
  'differ (rows written while the capture triggers did not fire).  NULL: every source the caller owns.';

-- After DROP: an attached table dropped forgets its source (its triggers go with it); anything else dropped that a
-- remaining source's keys need (a key column, a table or function an expression names) is refused, with the error
-- and what to do instead.  A partitioned source may have lost a partition's rows: its counts are checked at the next
-- fold.  SECURITY DEFINER: it runs for whoever drops, and tenants may not touch storetopics' tables.  Installed
-- where the installing role may create event triggers (superuser); elsewhere the capture's net keeps the
-- application's writes going and fold fails with the error (storetopics._regenerate).
CREATE OR REPLACE FUNCTION storetopics._forget_dropped_tables() RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  r record;
BEGIN
  FOR r IN SELECT s.id FROM storetopics.sources s
             JOIN pg_event_trigger_dropped_objects() d
               ON d.classid = 'pg_class'::regclass AND d.objid = s.chunks AND d.objsubid = 0 LOOP
    PERFORM storetopics._drop_generated(r.id);
    PERFORM storetopics._forget_source(r.id);
  END LOOP;
  IF current_setting('storetopics.in_ddl', true) = 'on' THEN
    RETURN;   -- storetopics' own DROPs (a probe, a generated function made again)
  END IF;
  IF NOT EXISTS (SELECT 1 FROM pg_event_trigger_dropped_objects() d WHERE NOT d.is_temporary) THEN
    RETURN;
  END IF;
  FOR r IN SELECT s.id, s.chunks, (c.relkind = 'p') AS partitioned,
                  EXISTS (SELECT 1 FROM pg_event_trigger_dropped_objects() d
                           WHERE d.classid = 'pg_class'::regclass AND d.objsubid > 0
                             AND d.objid IN (s.chunks, s.files_table)) AS own_column
             FROM storetopics.sources s JOIN pg_class c ON c.oid = s.chunks
            ORDER BY s.id LOOP
    IF r.own_column OR storetopics._has_expression_key((SELECT x FROM storetopics.sources x WHERE x.id = r.id)) THEN
      BEGIN
        PERFORM storetopics._regenerate(r.id, true);
      EXCEPTION WHEN OTHERS THEN
        RAISE EXCEPTION 'storetopics: % would break the attachment of % (source %): %', tg_tag, r.chunks, r.id,
          SQLERRM USING ERRCODE = 'dependent_objects_still_exist',
          HINT = format('Detach it first (SELECT storetopics.detach(%L)), or keep what its keys use.', r.chunks);
      END;
    ELSIF r.partitioned AND EXISTS (SELECT 1 FROM pg_event_trigger_dropped_objects() d
                                     WHERE d.classid = 'pg_class'::regclass AND d.object_type = 'table') THEN
      INSERT INTO storetopics.pending (source_id, deletes, logged_by)
      SELECT s.id, true, s.owner FROM storetopics.sources s WHERE s.id = r.id;
    END IF;
  END LOOP;
END $$;

-- After CREATE TABLE or ALTER (ddl_command_end): every source whose table, partitions or files_table the command
-- touched, and every source with a key expression when the command altered anything (the expression may name it: a
-- function renamed, a column of another table), is made again from its tables as they are now
-- (storetopics._regenerate): plain keys follow renamed columns, the functions follow a renamed table or a key's new
-- type, new partitions get the triggers, and the counts are checked at the next fold (a partition attached with its
-- rows).  A change its keys do not survive is refused: the error names the source and what to do instead, and the
-- application's writes never meet a capture that no longer fits its table.
CREATE OR REPLACE FUNCTION storetopics._follow_ddl() RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  src storetopics.sources;
BEGIN
  IF current_setting('storetopics.in_ddl', true) = 'on' THEN
    RETURN;   -- storetopics' own DDL (generated functions, triggers, probes)
  END IF;
  FOR src IN SELECT s.* FROM storetopics.sources s
              WHERE EXISTS (SELECT 1 FROM pg_event_trigger_ddl_commands() d
                             WHERE d.classid = 'pg_class'::regclass
                               AND (d.objid = s.chunks OR d.objid = s.files_table
                                    OR s.chunks IN (SELECT a.relid FROM pg_partition_ancestors(d.objid) a)
                                    OR EXISTS (SELECT 1 FROM pg_trigger t
                                                WHERE t.tgrelid = d.objid AND t.tgname = 'storetopics_ins'
                                                  AND t.tgfoid = (storetopics._generated(s.id, 'capture')
                                                                  || '()')::regprocedure)))
                 OR (tg_tag <> 'CREATE TABLE' AND storetopics._has_expression_key(s))
              ORDER BY s.id LOOP
    BEGIN
      PERFORM storetopics._regenerate(src.id, true);
    EXCEPTION WHEN OTHERS THEN
      RAISE EXCEPTION 'storetopics: % would break the attachment of % (source %): %', tg_tag, src.chunks, src.id,
        SQLERRM USING ERRCODE = 'dependent_objects_still_exist',
        HINT = format('Detach it first (SELECT storetopics.detach(%L)) and attach it again with keys that fit the '
                      'new table, or leave the key''s columns as they are.', src.chunks);
    END;
  END LOOP;
END $$;

-- ------------------------------------------------------------------------------------------------------------
-- Grants
-- ------------------------------------------------------------------------------------------------------------
-- Lets a role that owns chunk tables attach them without being superuser: the public API, the views (which show a
-- role only the stores of sources it owns or was granted), nothing else.  Run by an administrator.
CREATE OR REPLACE FUNCTION storetopics.grant_attach(role_name name) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  EXECUTE format('GRANT USAGE ON SCHEMA storetopics TO %I', role_name);
  EXECUTE format('GRANT SELECT ON storetopics.stores, storetopics.status TO %I', role_name);
  EXECUTE format('GRANT EXECUTE ON FUNCTION storetopics.attach(regclass, text, text, text, text, regconfig, jsonb, '
                 'regclass, text, regclass, text, text), storetopics.attach_check(regclass, text, text, text, text, '
                 'regconfig, jsonb, regclass, text, regclass, text, text), storetopics.detach(regclass), '
                 'storetopics.detach_dropped(), '
                 'storetopics.resync(regclass), storetopics.verify(regclass), storetopics.settings(regclass), '
                 'storetopics.configure(regclass, jsonb), storetopics.pause(regclass), storetopics.resume(regclass), '
                 'storetopics.grant_read(regrole, regclass) TO %I', role_name);
  PERFORM storetopics._grant_routing(quote_ident(role_name));
END $$;
COMMENT ON FUNCTION storetopics.grant_attach(name) IS
  'Let a role attach the tables it owns (and read their summaries: the views, catalog(), route()).  Grants no '
  'CREATE on the schema.';

-- Lets a role run the worker's part (fold, render, backfill, the worker's functions) without being superuser or
-- owning the chunk tables: it may read and write storetopics' own tables and run its functions, including each
-- source's reader (which reads the chunk table as its owner); nothing of the application's.  Run by an administrator.
CREATE OR REPLACE FUNCTION storetopics.grant_worker(role_name name) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  INSERT INTO storetopics.grants (role, kind) VALUES (quote_ident(role_name)::regrole, 'worker') ON CONFLICT DO NOTHING;
  EXECUTE format('GRANT USAGE ON SCHEMA storetopics TO %I', role_name);
  EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA storetopics TO %I', role_name);
  EXECUTE format('GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA storetopics TO %I', role_name);
  EXECUTE format('GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA storetopics TO %I', role_name);
END $$;
COMMENT ON FUNCTION storetopics.grant_worker(name) IS
  'Let a role run the worker (fold, fit, label, render) on every source, without superuser.';

-- Lets a role (a router) read the summaries of one source, or of every source (chunks NULL: administrators only).
-- The caller must be able to act as the source's owner, and as the reader (or be an administrator).
CREATE OR REPLACE FUNCTION storetopics.grant_read(role_name regrole, chunks regclass DEFAULT NULL) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_source int;
BEGIN
  IF chunks IS NOT NULL THEN
    v_source := (storetopics._owned_source(chunks)).id;
  ELSIF NOT storetopics._is_admin() THEN
    RAISE EXCEPTION 'storetopics: only an administrator may grant reading every source'
      USING ERRCODE = 'insufficient_privilege', HINT = 'Name the table: grant_read(role, chunks).';
  END IF;
  -- What a reader's catalog() and route() offer is the reader's choice (or an administrator's): an owner may add its
  -- stores to the catalog of a role it may act as (its own router), not push them into another tenant's.
  IF NOT storetopics._may_act_as(role_name) AND NOT storetopics._is_admin() THEN
    RAISE EXCEPTION 'storetopics: % may not choose what % reads', storetopics._caller(), role_name
      USING ERRCODE = 'insufficient_privilege',
            DETAIL = 'Stores granted to a role appear in its catalog() and route().',
            HINT = format('An administrator may grant it, or make %s a member of %s first (GRANT %s TO %s).',
                          storetopics._caller(), role_name, role_name, storetopics._caller());
  END IF;
  INSERT INTO storetopics.grants (role, kind, source_id) VALUES (role_name, 'read', v_source) ON CONFLICT DO NOTHING;
  EXECUTE format('GRANT USAGE ON SCHEMA storetopics TO %s', role_name);
  EXECUTE format('GRANT SELECT ON storetopics.stores, storetopics.status TO %s', role_name);
  -- a monitoring role is a reader: metrics() shows it the sources it may read, like the views
  EXECUTE format('GRANT EXECUTE ON FUNCTION storetopics.metrics() TO %s', role_name);
  -- a router is a reader: catalog() and route() show and rank the stores it may read
  PERFORM storetopics._grant_routing(role_name::text);
END $$;
COMMENT ON FUNCTION storetopics.grant_read(regrole, regclass) IS
  'Let a role (a router, a monitoring role) read the summaries of one attached table, or of all (NULL; '
  'administrators only): the views stores and status, catalog(), route(), route_text() and metrics().  The caller '
  'must own the table and may act as the role, or be an administrator.';
