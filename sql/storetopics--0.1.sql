\echo Use "CREATE EXTENSION storetopics CASCADE" to load this file, or `storetopics install --dsn DSN`. \quit
-- storetopics 0.1: a short, machine-maintained summary of what each data store holds, kept in Postgres.
--
-- The same file installs two ways: as an extension (CREATE EXTENSION storetopics CASCADE, after `make install`)
-- and as a plain script (`storetopics install`, for managed Postgres), which skips the \echo line above and creates
-- the schema first.  Nothing here needs plpython3u: the trigger path and the keyword summary are plpgsql.
--
-- Where the work goes (measured, see bench/):
--   * the application's INSERT/UPDATE/DELETE fires one statement-level trigger that appends the distinct
--     (store, file) keys it touched to storetopics.pending.  No tokenising, no row per term, no shared row updated,
--     so writers never wait on each other or on storetopics;
--   * fold() later recounts each touched file from the live rows (set-based, parallel query), and applies the
--     difference to the store-wide term table.  A recount is absolute, so folding is idempotent and exact whatever
--     happened in between (updates, moves, deletes, TRUNCATE, rollbacks, concurrent writers).

-- ------------------------------------------------------------------------------------------------------------
-- Tables
-- ------------------------------------------------------------------------------------------------------------
CREATE TABLE storetopics.meta (
  key   text PRIMARY KEY,
  value text NOT NULL
);
INSERT INTO storetopics.meta VALUES ('version', '0.1');

-- One row per attached chunk table.
CREATE TABLE storetopics.sources (
  id               int GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  chunks           regclass NOT NULL UNIQUE,
  owner            name NOT NULL,               -- the role that owned the table when it was attached
  store_key        text NOT NULL,               -- SQL expression over the chunk row `c`, as given
  file_key         text NOT NULL,
  content          text NOT NULL,
  embedding        text,                        -- column name, NULL for keyword-only
  store_sql        text NOT NULL,               -- the same, normalised: c.col or (expression)
  file_sql         text NOT NULL,
  content_sql      text NOT NULL,
  file_type        regtype NOT NULL,            -- type of the file key expression (lets fold use the app's indexes)
  ts_config        regconfig NOT NULL DEFAULT 'pg_catalog.english',
  settings         jsonb NOT NULL DEFAULT '{}',
  capture_function text NOT NULL,               -- storetopics.capture_<id>()
  null_key_rows    bigint NOT NULL DEFAULT 0,   -- rows whose file key is NULL (never counted)
  folded_at        timestamptz,
  attached_at      timestamptz NOT NULL DEFAULT now()
);

-- The change log the triggers append to; fold() consumes it.  No unique constraint: appends never wait.
-- resync = true means "forget this source's state and recount every live file" (attach, TRUNCATE, resync()).
-- deletes = true means "rows were deleted": DELETE logs no keys (capturing the deleted rows would cost the
-- application's DELETE a third more); fold() finds the files that lost rows by comparing chunk counts.
CREATE TABLE storetopics.pending (
  source_id int NOT NULL,
  store_key text,
  file_key  text,
  resync    boolean NOT NULL DEFAULT false,
  deletes   boolean NOT NULL DEFAULT false,
  logged_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX pending_source_store ON storetopics.pending (source_id, store_key);

-- Every lexeme storetopics has counted, numbered once.  Per-file arrays and store statistics hold these numbers
-- instead of the strings: about half the storage, and joins on integers.
CREATE TABLE storetopics.lexemes (
  id     int GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  lexeme text NOT NULL UNIQUE
);

-- Per-file term counts: one row per (file, store) with parallel arrays of lexeme ids and their counts.  A row whose store_key is
-- NULL holds chunks of the file whose store key evaluated to NULL: counted as skipped, never summarised.
CREATE TABLE storetopics.file_terms (
  source_id int NOT NULL,
  file_key  text NOT NULL,
  store_key text,
  chunks    int NOT NULL,
  skipped   int NOT NULL,                    -- chunks whose text could not be used (NULL, blank, junk, too long)
  words     bigint NOT NULL,                 -- counted terms (after stopwords)
  term_ids  int[] NOT NULL,
  counts    int[] NOT NULL,
  UNIQUE NULLS NOT DISTINCT (source_id, file_key, store_key)
);

-- Store-wide statistics per term: in how many files (df), how often in all (total), and the sum of squared per-file
-- counts (total_sq).  All three are sums over files, so a deletion is an exact subtraction.
-- total_sq / total is the expected in-file count of an occurrence: high for a term dense in few files.
CREATE TABLE storetopics.store_terms (
  source_id int NOT NULL,
  store_key text NOT NULL,
  term_id   int NOT NULL,                    -- storetopics.lexemes
  files     int NOT NULL,
  total     bigint NOT NULL,
  total_sq  bigint NOT NULL,
  PRIMARY KEY (source_id, store_key, term_id)
);

-- One row per store: counters kept by fold(), the summary kept by render().
CREATE TABLE storetopics.store_state (
  source_id    int NOT NULL,
  store_key    text NOT NULL,
  files        bigint NOT NULL DEFAULT 0,
  chunks       bigint NOT NULL DEFAULT 0,
  words        bigint NOT NULL DEFAULT 0,
  skipped      bigint NOT NULL DEFAULT 0,
  store_topics text,                          -- what a router reads: <= 200 tokens
  topics       jsonb,                         -- the structured form
  folded_at    timestamptz,
  rendered_at  timestamptz,
  updated_at   timestamptz,                   -- last time store_topics changed
  PRIMARY KEY (source_id, store_key)
);

-- How people write a term: lexeme (stem) -> the most common surface word seen for it.
CREATE TABLE storetopics.term_words (
  ts_config regconfig NOT NULL,
  lexeme    text NOT NULL,
  word      text NOT NULL,
  PRIMARY KEY (ts_config, lexeme)
);

-- ------------------------------------------------------------------------------------------------------------
-- Views
-- ------------------------------------------------------------------------------------------------------------
-- The router's view: a plain indexed read.  `dirty` = changes are logged that are not folded in yet.
CREATE VIEW storetopics.stores AS
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

CREATE VIEW storetopics.status AS
SELECT s.id AS source_id, s.chunks AS source, s.ts_config,
       (SELECT count(*) FROM storetopics.store_state st WHERE st.source_id = s.id) AS stores,
       (SELECT coalesce(sum(st.files), 0) FROM storetopics.store_state st WHERE st.source_id = s.id) AS files,
       (SELECT coalesce(sum(st.chunks), 0) FROM storetopics.store_state st WHERE st.source_id = s.id) AS chunks,
       (SELECT coalesce(sum(st.skipped), 0) FROM storetopics.store_state st WHERE st.source_id = s.id)
         AS skipped_text_rows,
       s.null_key_rows
         + (SELECT coalesce(sum(f.chunks), 0) FROM storetopics.file_terms f
             WHERE f.source_id = s.id AND f.store_key IS NULL) AS skipped_null_key_rows,
       (SELECT count(*) FROM storetopics.pending p WHERE p.source_id = s.id) AS pending_events,
       (SELECT min(p.logged_at) FROM storetopics.pending p WHERE p.source_id = s.id) AS oldest_pending,
       s.folded_at, s.attached_at
  FROM storetopics.sources s;

-- ------------------------------------------------------------------------------------------------------------
-- Helpers
-- ------------------------------------------------------------------------------------------------------------
-- Text worth tokenising: not NULL, has a letter or digit, no control characters (binary junk), and small enough
-- for a tsvector (1 MB).  Other rows are counted as skipped.
CREATE FUNCTION storetopics.usable_text(t text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp
RETURN t IS NOT NULL AND octet_length(t) < 1048576 AND t ~ '[[:alnum:]]' AND t !~ '[\x01-\x08\x0e-\x1f]';

-- A term worth showing to a person: letters (any script), at least 3 of them, maybe inner hyphens or apostrophes.
CREATE FUNCTION storetopics.showable_term(t text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp
RETURN t ~ '^[[:alpha:]][[:alpha:]''-]*[[:alpha:]]$' AND length(t) >= 3 AND length(t) <= 40;

-- A key given to attach(): an existing column becomes c."col"; anything else is an SQL expression over the chunk
-- row, which must call the row `c` (e.g. `c.cmetadata->>'source'`), wrapped in parentheses.
CREATE FUNCTION storetopics._key_sql(tbl regclass, key text) RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
RETURN CASE
  WHEN EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = tbl AND a.attname = key AND a.attnum > 0
                AND NOT a.attisdropped)
  THEN format('c.%I', key)
  ELSE format('(%s)', key)
END;

-- The type of an expression over the table's rows, checked by the planner (clear errors for bad expressions).
CREATE FUNCTION storetopics._expr_type(tbl regclass, expr text, what text) RETURNS regtype
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

-- ------------------------------------------------------------------------------------------------------------
-- Capture: the trigger function generated per source
-- ------------------------------------------------------------------------------------------------------------
-- Generated once per attached table.  It runs as the table's owner (SECURITY DEFINER, so application roles need no
-- rights on storetopics), appends the distinct keys a statement touched and sends one NOTIFY hint.  An UPDATE that
-- changes none of the columns storetopics reads logs nothing (multiset difference of old and new rows).
CREATE FUNCTION storetopics._capture_sql(src storetopics.sources) RETURNS text
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  relevant text := format('%s AS s, %s AS f, %s AS t%s', src.store_sql, src.file_sql, src.content_sql,
                          CASE WHEN src.embedding IS NULL THEN ''
                               ELSE format(', c.%I::text AS e', src.embedding) END);
BEGIN
  RETURN format($f$
CREATE OR REPLACE FUNCTION %1$s() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $body$
DECLARE
  -- NOTIFY only when the source becomes dirty: a NOTIFY serialises commits on a global lock, so a burst of
  -- writers must not all send one.  The worker also polls, so a hint not sent is only a delay.
  was_clean boolean := NOT EXISTS (SELECT 1 FROM storetopics.pending WHERE source_id = %2$s);
BEGIN
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
$f$, src.capture_function, src.id, src.store_sql, src.file_sql, relevant);
END $$;

CREATE FUNCTION storetopics._create_triggers(src storetopics.sources) RETURNS void
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
END $$;

-- ------------------------------------------------------------------------------------------------------------
-- Attach / detach
-- ------------------------------------------------------------------------------------------------------------
-- Registers the source row.  SECURITY DEFINER so a table owner who is no superuser can attach; it checks that the
-- caller owns the table, and lets the owner role append to the change log.
CREATE FUNCTION storetopics._register_source(
  p_chunks regclass, p_store_key text, p_file_key text, p_content text, p_embedding text,
  p_store_sql text, p_file_sql text, p_content_sql text, p_file_type regtype, p_ts_config regconfig,
  p_settings jsonb) RETURNS storetopics.sources
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
                                   content_sql, file_type, ts_config, settings, capture_function)
  VALUES (p_chunks, v_owner, p_store_key, p_file_key, p_content, p_embedding, p_store_sql, p_file_sql,
          p_content_sql, p_file_type, p_ts_config, p_settings, 'pending')
  RETURNING * INTO src;
  UPDATE storetopics.sources SET capture_function = format('storetopics.capture_%s', src.id)
   WHERE id = src.id RETURNING * INTO src;
  -- The first fold counts every row that is already there.
  INSERT INTO storetopics.pending (source_id, resync) VALUES (src.id, true);
  EXECUTE format('GRANT USAGE ON SCHEMA storetopics TO %I', v_owner);
  EXECUTE format('GRANT INSERT, SELECT (source_id) ON storetopics.pending TO %I', v_owner);
  RETURN src;
END $$;

CREATE FUNCTION storetopics._unregister_source(p_source int) RETURNS void
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
CREATE FUNCTION storetopics._forget_source(p_source int) RETURNS void
LANGUAGE sql SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
  DELETE FROM storetopics.pending WHERE source_id = p_source;
  DELETE FROM storetopics.file_terms WHERE source_id = p_source;
  DELETE FROM storetopics.store_terms WHERE source_id = p_source;
  DELETE FROM storetopics.store_state WHERE source_id = p_source;
  DELETE FROM storetopics.sources WHERE id = p_source;
END;

-- DROP TABLE of an attached table also forgets its source (the table's triggers go with it).  Installed where the
-- installing role may create event triggers (superuser); elsewhere fold() and backfill() skip such sources.
CREATE FUNCTION storetopics._forget_dropped_tables() RETURNS event_trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  r record;
BEGIN
  FOR r IN SELECT s.id, s.capture_function FROM storetopics.sources s
             JOIN pg_event_trigger_dropped_objects() d
               ON d.classid = 'pg_class'::regclass AND d.objid = s.chunks AND d.objsubid = 0 LOOP
    EXECUTE format('DROP FUNCTION IF EXISTS %s()', r.capture_function);
    PERFORM storetopics._forget_source(r.id);
  END LOOP;
END $$;

-- Attach storetopics to an application's chunk table.  Runs as the caller, who must own the table (creating a
-- trigger needs that) and be able to create the capture function in schema storetopics (superusers can; others are
-- granted it with storetopics.grant_attach(role)).  Returns the source id.
CREATE FUNCTION storetopics.attach(
  chunks    regclass,
  store_key text,
  file_key  text,
  content   text DEFAULT 'content',
  embedding text DEFAULT NULL,
  ts_config regconfig DEFAULT 'pg_catalog.english',
  settings  jsonb DEFAULT '{}'
) RETURNS int
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_store_sql text; v_file_sql text; v_content_sql text;
  v_file_type regtype; v_content_type regtype; v_emb_type text;
  v_relkind char;
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

  src := storetopics._register_source(chunks, store_key, file_key, content, embedding, v_store_sql, v_file_sql,
                                      v_content_sql, v_file_type, ts_config, settings);
  PERFORM storetopics._create_triggers(src);
  PERFORM pg_notify('storetopics_dirty', src.id::text);
  RETURN src.id;
END $$;

-- Detach by source id (also when the table is gone): dropping the capture function drops its four triggers.
CREATE FUNCTION storetopics.detach_source(p_source int) RETURNS boolean
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

CREATE FUNCTION storetopics.detach(chunks regclass) RETURNS boolean
LANGUAGE sql SET search_path = pg_catalog, pg_temp
RETURN coalesce((SELECT storetopics.detach_source(s.id) FROM storetopics.sources s WHERE s.chunks = detach.chunks),
                false);

-- Lets a role that owns chunk tables attach them without being superuser.
CREATE FUNCTION storetopics.grant_attach(role_name name) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  EXECUTE format('GRANT USAGE, CREATE ON SCHEMA storetopics TO %I', role_name);
  EXECUTE format('GRANT INSERT, SELECT (source_id) ON storetopics.pending TO %I', role_name);
  EXECUTE format('GRANT SELECT ON storetopics.sources, storetopics.stores, storetopics.status TO %I', role_name);
  EXECUTE format('GRANT EXECUTE ON FUNCTION storetopics.attach(regclass, text, text, text, text, regconfig, jsonb), '
                 'storetopics.detach(regclass), storetopics.detach_source(int), storetopics._key_sql(regclass, text), '
                 'storetopics._expr_type(regclass, text, text), storetopics._capture_sql(storetopics.sources), '
                 'storetopics._create_triggers(storetopics.sources), '
                 'storetopics._register_source(regclass, text, text, text, text, text, '
                 'text, text, regtype, regconfig, jsonb), storetopics._unregister_source(int) TO %I', role_name);
END $$;

-- Forget a source's state and recount everything on the next fold.
CREATE FUNCTION storetopics.resync(chunks regclass) RETURNS void
LANGUAGE sql SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
  INSERT INTO storetopics.pending (source_id, resync)
  SELECT s.id, true FROM storetopics.sources s WHERE s.chunks = resync.chunks;
END;

-- ------------------------------------------------------------------------------------------------------------
-- Fold: bring the keyword state up to date with the logged changes
-- ------------------------------------------------------------------------------------------------------------
-- Recounts at most max_files touched files of one source and applies the difference.  Returns the number of files
-- recounted (0 = nothing was pending).  Serialised per source by a row lock on storetopics.sources; application
-- writers never take that lock.  Safe to call at any time, from any number of sessions.
CREATE FUNCTION storetopics.fold(p_source int, max_files int DEFAULT 5000) RETURNS int
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp SET work_mem = '128MB' AS $$
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
    UPDATE storetopics.store_state SET files = 0, chunks = 0, words = 0, skipped = 0, folded_at = now()
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

  -- 5. Store counters, by the same difference.
  CREATE TEMP TABLE storetopics_counts ON COMMIT DROP AS
  SELECT x.store_key, sum(x.files)::bigint AS files, sum(x.chunks)::bigint AS chunks, sum(x.words)::bigint AS words,
         sum(x.skipped)::bigint AS skipped
    FROM (SELECT f.store_key, -1 AS files, -f.chunks AS chunks, -f.words AS words, -f.skipped AS skipped
            FROM storetopics.file_terms f
           WHERE f.source_id = p_source AND f.file_key = ANY (v_files) AND f.store_key IS NOT NULL
          UNION ALL
          SELECT nf.store_key, 1, nf.chunks, nf.words, nf.skipped
            FROM pg_temp.storetopics_new_files nf
           WHERE nf.store_key IS NOT NULL) x
   GROUP BY 1;
  INSERT INTO storetopics.store_state AS st (source_id, store_key, files, chunks, words, skipped, folded_at)
  SELECT p_source, k.store_key, k.files, k.chunks, k.words, k.skipped, now() FROM pg_temp.storetopics_counts k
  ORDER BY k.store_key
  ON CONFLICT (source_id, store_key) DO UPDATE
     SET files = st.files + excluded.files, chunks = st.chunks + excluded.chunks,
         words = st.words + excluded.words, skipped = st.skipped + excluded.skipped, folded_at = now();
  DROP TABLE pg_temp.storetopics_counts;

  -- 6. Replace the files' own rows.
  DELETE FROM storetopics.file_terms WHERE source_id = p_source AND file_key = ANY (v_files);
  INSERT INTO storetopics.file_terms (source_id, file_key, store_key, chunks, skipped, words, term_ids, counts)
  SELECT p_source, nf.file_key, nf.store_key, nf.chunks, nf.skipped, nf.words, nf.term_ids, nf.counts
    FROM pg_temp.storetopics_new_files nf;

  GET DIAGNOSTICS v_n = ROW_COUNT;
  DROP TABLE pg_temp.storetopics_new_files;
  UPDATE storetopics.sources SET folded_at = now() WHERE id = p_source;
  RETURN cardinality(v_files);
END $$;

-- The slow path of fold(): one subtransaction per row, so one oversized text cannot fail a batch.
CREATE FUNCTION storetopics._tsvector_or_null(cfg regconfig, t text) RETURNS tsvector
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  IF NOT storetopics.usable_text(t) THEN
    RETURN NULL;
  END IF;
  RETURN to_tsvector(cfg, t);
EXCEPTION WHEN program_limit_exceeded THEN
  RETURN NULL;
END $$;

-- ------------------------------------------------------------------------------------------------------------
-- Keyword lists and the rendered summary
-- ------------------------------------------------------------------------------------------------------------
-- Two ranked lists per store, both computed from the exact counts, deterministic (ties broken by term):
--   dominant:    by total count (what the store is mostly about);
--   distinctive: what is dense and rare.  Two sources, in this order:
--     * outlier files: a file's novelty is the mean IDF of its counted words.  Files whose novelty stands out from
--       the store's own distribution (robust z-score >= 3.5) give their top terms by count x IDF.  This is how one
--       football file among 100k renovation files surfaces: ranked per file, not on store-wide sums.  A store made
--       of one-off tokens (names) has no outlier file, so its names do not flood the list;
--     * recurring dense terms: (total_sq / total) x IDF, for terms in at least three files whose occurrences come
--       in clusters (total_sq / total >= 2, i.e. one-off mentions are ignored; a name two files share is not a
--       theme).
CREATE FUNCTION storetopics.keywords(p_source int, p_store text, n_dominant int DEFAULT 10,
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
    SELECT w.file_key, sum(w.n * w.idf) / sum(w.n) AS nov FROM file_words w GROUP BY w.file_key
  ), spread AS (
    SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY nov) AS med FROM novelty
  ), mad AS (
    SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY abs(v.nov - s.med)) AS mad, s.med
      FROM novelty v, spread s GROUP BY s.med
  ), outliers AS (
    SELECT v.file_key, v.nov FROM novelty v, mad m
     WHERE (v.nov - m.med) / (1.4826 * m.mad + 1e-9) >= 3.5
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
CREATE FUNCTION storetopics._learn_words(p_source int, p_store text, p_lexemes text[]) RETURNS int
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
                         LATERAL (SELECT regexp_split_to_table(lower(t), '[^[:alpha:]''-]+')
                                  UNION ALL
                                  SELECT regexp_split_to_table(lower(t), '[^[:alpha:]'']+')) AS x(word)
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

CREATE FUNCTION storetopics._show(cfg regconfig, lexeme text) RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp
RETURN coalesce((SELECT w.word FROM storetopics.term_words w WHERE w.ts_config = cfg AND w.lexeme = _show.lexeme),
                lexeme);

CREATE FUNCTION storetopics._human_count(n bigint) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp
RETURN CASE WHEN n < 10000 THEN n::text
            WHEN n < 1000000 THEN round(n / 1000.0)::text || 'k'
            ELSE round(n / 1000000.0, 1)::text || 'M' END;

-- Render one store's summary from its current state.  Writes store_topics/topics only when they change, and then
-- sends NOTIFY storetopics_updated '<source id>:<store key>'.  Returns whether the text changed.
CREATE FUNCTION storetopics.render(p_source int, p_store text) RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  src storetopics.sources;
  st storetopics.store_state;
  v_kw jsonb;
  v_dom text[];
  v_dist text[];
  v_text text;
  v_topics jsonb;
BEGIN
  SELECT * INTO src FROM storetopics.sources WHERE id = p_source;
  SELECT * INTO st FROM storetopics.store_state WHERE source_id = p_source AND store_key = p_store FOR UPDATE;
  IF NOT FOUND THEN
    RETURN false;
  END IF;
  IF st.files <= 0 THEN
    DELETE FROM storetopics.store_state WHERE source_id = p_source AND store_key = p_store;
    PERFORM pg_notify('storetopics_updated', p_source || ':' || p_store);
    RETURN true;
  END IF;
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
  DROP TABLE pg_temp.storetopics_kw;

  v_text := format('%s files, %s chunks.', storetopics._human_count(st.files), storetopics._human_count(st.chunks));
  IF cardinality(v_dom) > 0 THEN
    v_text := v_text || ' Main terms: ' || array_to_string(v_dom, ', ') || '.';
  END IF;
  IF cardinality(v_dist) > 0 THEN
    v_text := v_text || ' Distinctive: ' || array_to_string(v_dist, ', ') || '.';
  END IF;
  v_topics := jsonb_build_object('version', 1, 'files', st.files, 'chunks', st.chunks, 'words', st.words,
                                 'skipped', st.skipped, 'clusters', '[]'::jsonb) || v_kw;

  UPDATE storetopics.store_state SET rendered_at = now() WHERE source_id = p_source AND store_key = p_store;
  IF st.store_topics IS NOT DISTINCT FROM v_text AND st.topics IS NOT DISTINCT FROM v_topics THEN
    RETURN false;
  END IF;
  UPDATE storetopics.store_state SET store_topics = v_text, topics = v_topics, updated_at = now()
   WHERE source_id = p_source AND store_key = p_store;
  PERFORM pg_notify('storetopics_updated', p_source || ':' || p_store);
  RETURN true;
END $$;

-- ------------------------------------------------------------------------------------------------------------
-- Backfill: everything up to date, synchronously, from SQL
-- ------------------------------------------------------------------------------------------------------------
-- backfill() brings every store of every source up to date; backfill('key') the stores with that key;
-- backfill(source => 'public.chunks') one source.  Folds all pending changes of the sources concerned (a file can
-- move between stores, so a source is folded as a whole), then renders the stores whose state changed.
CREATE FUNCTION storetopics.backfill(store_key text DEFAULT NULL, source regclass DEFAULT NULL)
RETURNS TABLE (source_id int, store text, files bigint, chunks bigint, changed boolean)
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  s record;
  v_started timestamptz := clock_timestamp();
  v_done int;
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
    RETURN QUERY
      SELECT y.source_id, y.store_key, y.files, y.chunks, storetopics.render(y.source_id, y.store_key)
        FROM storetopics.store_state y
       WHERE y.source_id = s.id AND (backfill.store_key IS NULL OR y.store_key = backfill.store_key)
         AND (y.rendered_at IS NULL OR y.folded_at >= y.rendered_at OR y.files <= 0)
       ORDER BY y.store_key;
  END LOOP;
  RAISE NOTICE 'storetopics: backfill took %', clock_timestamp() - v_started;
END $$;

-- ------------------------------------------------------------------------------------------------------------
-- Privileges and dumps
-- ------------------------------------------------------------------------------------------------------------
REVOKE ALL ON ALL TABLES IN SCHEMA storetopics FROM PUBLIC;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA storetopics FROM PUBLIC;
GRANT EXECUTE ON FUNCTION storetopics.usable_text(text), storetopics.showable_term(text),
  storetopics._human_count(bigint) TO PUBLIC;

DO $$
BEGIN
  IF (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) THEN
    CREATE EVENT TRIGGER storetopics_forget_dropped_tables ON sql_drop
      EXECUTE FUNCTION storetopics._forget_dropped_tables();
  END IF;
  IF EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'storetopics') THEN
    PERFORM pg_catalog.pg_extension_config_dump('storetopics.sources', '');
    PERFORM pg_catalog.pg_extension_config_dump('storetopics.pending', '');
    PERFORM pg_catalog.pg_extension_config_dump('storetopics.lexemes', '');
    PERFORM pg_catalog.pg_extension_config_dump('storetopics.file_terms', '');
    PERFORM pg_catalog.pg_extension_config_dump('storetopics.store_terms', '');
    PERFORM pg_catalog.pg_extension_config_dump('storetopics.store_state', '');
    PERFORM pg_catalog.pg_extension_config_dump('storetopics.term_words', '');
  END IF;
END $$;
