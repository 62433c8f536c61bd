\echo Use "ALTER EXTENSION storetopics UPDATE" to load this file, or `storetopics install --dsn DSN`. \quit
-- storetopics 0.2 (upgrade from 0.1): built by `make sql` from sql/incremental and sql/idempotent;
-- edit those, not this file.

-- incremental/0.2/001-tenants.sql
-- storetopics 0.2: tenants.  What an attacher writes (key expressions, mirror targets) now runs as the attached
-- table's owner, inside functions generated per source and owned by that owner (idempotent/020-generated.sql);
-- nobody but the extension's owner creates objects in the schema; reads are per tenant.

-- 0.1's event trigger reads columns this script drops (dropping a column fires sql_drop); the idempotent part
-- replaces its function and enables it again.
DO $$
BEGIN
  IF EXISTS (SELECT 1 FROM pg_event_trigger WHERE evtname = 'storetopics_forget_dropped_tables') THEN
    ALTER EVENT TRIGGER storetopics_forget_dropped_tables DISABLE;
  END IF;
END $$;

-- 0.1's internals that trusted current_user inside SECURITY DEFINER, and the capture generator they served.
DROP FUNCTION IF EXISTS storetopics._register_source(regclass, text, text, text, text, text, text, text, regtype, regconfig,
                                           jsonb, regclass, text, regclass, text, text);
DROP FUNCTION IF EXISTS storetopics._unregister_source(int);
DROP FUNCTION IF EXISTS storetopics._create_triggers(storetopics.sources);
DROP FUNCTION IF EXISTS storetopics._capture_sql(storetopics.sources);
DROP FUNCTION IF EXISTS storetopics._mirror_summary(int, text, text);
DROP FUNCTION IF EXISTS storetopics._assign(storetopics.sources, text);
DROP FUNCTION IF EXISTS storetopics._tsvector_or_null(regconfig, text);
DROP FUNCTION IF EXISTS storetopics._add_to_clusters(int, text[]);
DROP FUNCTION IF EXISTS storetopics._chunk_lookup_sql(regclass, text[]);
-- (bodies bound at creation that use the row type of storetopics.sources: they would block its ALTER TABLE)
DROP FUNCTION IF EXISTS storetopics._embedding_sql(storetopics.sources);

-- The owner as a role (oid), not a name: generated functions compare it with the role they run as.
UPDATE storetopics.sources s SET owner = pg_get_userbyid(c.relowner) FROM pg_class c WHERE c.oid = s.chunks;
ALTER TABLE storetopics.sources
  ALTER COLUMN owner TYPE regrole USING coalesce(pg_catalog.to_regrole(quote_ident(owner)), current_user::text::regrole);
-- Generated functions are named after the source id (storetopics._generated): a stored name was a copy.
ALTER TABLE storetopics.sources DROP COLUMN capture_function;

-- Who appended an event.  Application roles never insert here themselves: a source's capture function runs as the
-- table's owner, who may insert every column but this one, so it always says who wrote the row; fold() ignores
-- rows for a source written by a role that may not act as that source's owner (a tenant forging another's events).
ALTER TABLE storetopics.pending ADD COLUMN logged_by regrole;
UPDATE storetopics.pending p SET logged_by = s.owner FROM storetopics.sources s WHERE s.id = p.source_id;
UPDATE storetopics.pending SET logged_by = current_user::text::regrole WHERE logged_by IS NULL;
ALTER TABLE storetopics.pending ALTER COLUMN logged_by SET DEFAULT current_user::text::regrole,
                                ALTER COLUMN logged_by SET NOT NULL;
-- No raw key in an index on the application's path: a 3,000-character store key made its INSERT fail (btree rows
-- are limited to about 2.7 kB).
DROP INDEX storetopics.pending_source_store;
CREATE INDEX pending_source ON storetopics.pending (source_id);

-- File keys may be long (paths, URLs): file_terms is found by a digest of the key, the key itself is kept.
ALTER TABLE storetopics.file_terms DROP CONSTRAINT file_terms_source_id_file_key_store_key_key;
CREATE INDEX file_terms_file ON storetopics.file_terms (source_id, (md5(file_key)::uuid));
CREATE INDEX file_terms_store ON storetopics.file_terms (source_id, store_key);

-- Roles given rights with grant_worker and grant_read (source_id NULL: every source).  Generated functions are
-- granted to the worker roles as they are created; the views show a reader the sources it was granted.
CREATE TABLE storetopics.grants (
  role      regrole NOT NULL,
  kind      text NOT NULL CHECK (kind IN ('worker', 'read')),
  source_id int,
  UNIQUE NULLS NOT DISTINCT (role, kind, source_id)
);
-- 0.1 recorded no grants: a role that may run fold() was given grant_worker.
INSERT INTO storetopics.grants (role, kind)
SELECT DISTINCT a.grantee::regrole, 'worker'
  FROM pg_proc p, aclexplode(p.proacl) a
 WHERE p.oid = to_regprocedure('storetopics.fold(integer, integer)') AND a.privilege_type = 'EXECUTE'
   AND a.grantee <> 0 AND a.grantee <> p.proowner;

-- grant_attach handed out CREATE on the schema: a tenant could plant storetopics.capture_N for the next source or
-- an overload that fold() would call as superuser.  Take it back from everyone but the schema's owner.
DO $$
DECLARE
  r record;
BEGIN
  FOR r IN SELECT a.grantee FROM pg_namespace n, aclexplode(n.nspacl) a
            WHERE n.nspname = 'storetopics' AND a.privilege_type = 'CREATE' AND a.grantee <> n.nspowner LOOP
    EXECUTE format('REVOKE CREATE ON SCHEMA storetopics FROM %s', CASE WHEN r.grantee = 0 THEN 'PUBLIC'
                                                                        ELSE quote_ident(pg_get_userbyid(r.grantee)) END);
  END LOOP;
END $$;

-- The version whose templates made a source's generated functions (NULL: not made yet).  0.1's capture functions
-- are made again from the 0.2 templates at their source's first use (storetopics._reader); until then they run as
-- the table's owner, whoever attached the table.
ALTER TABLE storetopics.sources ADD COLUMN generated text;
-- When the count check (verify) last ran for the source.
ALTER TABLE storetopics.sources ADD COLUMN checked_at timestamptz;
DO $$
DECLARE
  r record;
BEGIN
  FOR r IN SELECT s.id, c.relowner::regrole AS owner FROM storetopics.sources s JOIN pg_class c ON c.oid = s.chunks
            WHERE to_regprocedure(format('storetopics.capture_%s()', s.id)) IS NOT NULL LOOP
    EXECUTE format('ALTER FUNCTION storetopics.capture_%s() OWNER TO %s', r.id, r.owner);
  END LOOP;
END $$;

-- What 0.1 handed out too widely: grant_attach gave tenants SELECT on every source and store, and EXECUTE on the
-- internals.  Everyone but the owner and the worker roles loses every right on storetopics' own tables and
-- functions (the idempotent part gives attachers, readers and table owners back what 0.2 gives them).  Objects a
-- tenant planted in the schema with the CREATE right (any not owned by the schema's owner but the capture functions
-- of attached tables) are dropped.
DO $$
DECLARE
  r record;
  v_workers oid[] := ARRAY(SELECT g.role FROM storetopics.grants g WHERE g.kind = 'worker');
BEGIN
  FOR r IN SELECT c.oid::regclass AS obj, a.grantee::regrole AS grantee
             FROM pg_class c, aclexplode(c.relacl) a
            WHERE c.relnamespace = 'storetopics'::regnamespace AND a.grantee <> 0 AND a.grantee <> c.relowner
              AND a.grantee <> ALL (v_workers)
            GROUP BY 1, 2 LOOP
    EXECUTE format('REVOKE ALL ON %s FROM %s', r.obj, r.grantee);
  END LOOP;
  FOR r IN SELECT p.oid::regprocedure AS fn, a.grantee::regrole AS grantee
             FROM pg_proc p, aclexplode(p.proacl) a
            WHERE p.pronamespace = 'storetopics'::regnamespace AND a.grantee <> 0 AND a.grantee <> p.proowner
              AND a.grantee <> ALL (v_workers) AND p.proname !~ '^capture_[0-9]+$'
              AND p.proname NOT IN ('attach', 'detach', 'detach_source')
            GROUP BY 1, 2 LOOP
    EXECUTE format('REVOKE ALL ON FUNCTION %s FROM %s', r.fn, r.grantee);
  END LOOP;
  FOR r IN SELECT p.oid::regprocedure AS fn, p.prokind FROM pg_proc p, pg_namespace n
            WHERE n.oid = p.pronamespace AND n.nspname = 'storetopics' AND p.proowner <> n.nspowner
              AND NOT EXISTS (SELECT 1 FROM storetopics.sources s WHERE p.proname = format('capture_%s', s.id)) LOOP
    RAISE WARNING 'storetopics: dropping %, which was not created by storetopics', r.fn;
    EXECUTE format('DROP %s %s CASCADE', CASE r.prokind WHEN 'p' THEN 'PROCEDURE' WHEN 'a' THEN 'AGGREGATE'
                                              ELSE 'FUNCTION' END, r.fn);
  END LOOP;
  FOR r IN SELECT c.oid::regclass AS rel, c.relkind FROM pg_class c, pg_namespace n
            WHERE n.oid = c.relnamespace AND n.nspname = 'storetopics' AND c.relowner <> n.nspowner
              AND c.relkind IN ('r', 'v', 'm', 'S', 'f', 'p') LOOP
    RAISE WARNING 'storetopics: dropping %, which was not created by storetopics', r.rel;
    EXECUTE format('DROP %s %s CASCADE', CASE r.relkind WHEN 'v' THEN 'VIEW' WHEN 'm' THEN 'MATERIALIZED VIEW'
                                              WHEN 'S' THEN 'SEQUENCE' WHEN 'f' THEN 'FOREIGN TABLE' ELSE 'TABLE' END,
                   r.rel);
  END LOOP;
END $$;

-- incremental/0.2/002-catalogs.sql
-- storetopics 0.2: catalogs.  A router chooses among the stores of a catalog (by default the stores of one source;
-- settings.catalog groups several sources into one), so a summary's terms are ranked by how much they tell its
-- store apart from the others.  The catalog-wide background is kept as exact sums by fold, like the stores' own
-- statistics, so rendering one store costs the same in a catalog of 10 stores or of 10,000.

-- Per catalog and term: its count in all the catalog's stores, and in how many stores it occurs.
CREATE TABLE storetopics.catalog_terms (
  catalog text NOT NULL,
  term_id int NOT NULL,                      -- storetopics.lexemes
  total   bigint NOT NULL,
  stores  int NOT NULL,
  PRIMARY KEY (catalog, term_id)
);

-- The background of the stores attached so far (0.1 kept no catalogs): every source is its own catalog.
INSERT INTO storetopics.catalog_terms (catalog, term_id, total, stores)
SELECT 'source:' || t.source_id, t.term_id, sum(t.total), count(*)
  FROM storetopics.store_terms t
 GROUP BY 1, 2;

-- Files holding the term, summed over the catalog's stores: what the contrast is computed from (a term in most files
-- of one store and few of the others tells that store apart).
ALTER TABLE storetopics.catalog_terms ADD COLUMN files bigint NOT NULL DEFAULT 0;
UPDATE storetopics.catalog_terms c SET files = x.files
  FROM (SELECT 'source:' || t.source_id AS catalog, t.term_id, sum(t.files) AS files
          FROM storetopics.store_terms t GROUP BY 1, 2) x
 WHERE c.catalog = x.catalog AND c.term_id = x.term_id;
ALTER TABLE storetopics.catalog_terms ALTER COLUMN files DROP DEFAULT;

-- How many cl100k tokens a piece of a summary costs (a space-separated chunk with its leading space): counted by
-- the real tokenizer (tiktoken, offline) in the worker or the CLI before they render; render adds them up, and takes
-- a chunk it finds no count for at one token per byte, which no tokenizer exceeds.  cl100k never merges across a
-- space, so the sum over a text's chunks is the text's count.
CREATE TABLE storetopics.token_counts (
  chunk  text PRIMARY KEY,
  tokens int NOT NULL
);

-- Offline labels are phrases mined from the cluster's own text (storetopics._mine_phrases); the store keeps a digest
-- of what its clusters' phrases were mined from (mined again when it changes).
ALTER TABLE storetopics.clusters ADD COLUMN phrase text;
ALTER TABLE storetopics.store_state ADD COLUMN cluster_phrases_from text;
-- A keyword-only store's topics: phrases mined from its files, and a digest of what they were mined from.
ALTER TABLE storetopics.store_state ADD COLUMN phrases text[], ADD COLUMN phrases_from text;
-- The chunks of a store's last candidate summary that have no token count yet (render(..., count_first) returns
-- NULL while there are any: the worker counts them and renders again, one write and one NOTIFY).
ALTER TABLE storetopics.store_state ADD COLUMN uncounted text[];
-- render() and work_render() take count_first now.
DROP FUNCTION IF EXISTS storetopics.render(int, text);
DROP FUNCTION IF EXISTS storetopics.work_render(text, int, text);
-- labels_due() tells the labeller what the other clusters and stores are about now.
DROP FUNCTION IF EXISTS storetopics.labels_due(int, text);

-- incremental/0.2/003-catalog-size.sql
-- storetopics 0.2: a source's part of its catalog's size, kept by fold like the catalog's term sums: how many of
-- its stores hold files, and their files.  contrast_terms() adds these up over the catalog's sources instead of
-- reading every store's row, so rendering one store reads no other store's rows (bench/catalog.py).
ALTER TABLE storetopics.sources ADD COLUMN store_count int NOT NULL DEFAULT 0,
                                ADD COLUMN file_count bigint NOT NULL DEFAULT 0;
UPDATE storetopics.sources s SET store_count = x.stores, file_count = x.files
  FROM (SELECT st.source_id, count(*) FILTER (WHERE st.files > 0) AS stores, coalesce(sum(st.files), 0) AS files
          FROM storetopics.store_state st GROUP BY 1) x
 WHERE x.source_id = s.id;

-- incremental/0.2/004-store-labels.sql
-- storetopics 0.2: a keyword-only store's labels from the LLM labeller.  Such a store has no clusters to label:
-- one call per store turns its contrastive terms and the phrases mined from its files into 3-8 labels.  What the
-- clusters keep per cluster (the labels, the words they were made from for the keyword gate, the retry state of a
-- failed call) it keeps per store.
ALTER TABLE storetopics.store_state
  ADD COLUMN store_labels text[],                        -- the labels that passed the checks; NULL: none
  ADD COLUMN store_label_words text[],                   -- the contrastive terms (lexemes) they were made from
  ADD COLUMN store_label_needed boolean,
  ADD COLUMN store_label_failures int,
  ADD COLUMN store_label_retry_at timestamptz,
  ADD COLUMN store_label_error text;
-- (defaults set apart from ADD COLUMN: a column added with a default is refused while functions take the table's
-- row type, as storetopics.render_due does)
ALTER TABLE storetopics.store_state ALTER COLUMN store_label_needed SET DEFAULT false,
                                    ALTER COLUMN store_label_failures SET DEFAULT 0;
UPDATE storetopics.store_state SET store_label_needed = false, store_label_failures = 0;
ALTER TABLE storetopics.store_state ALTER COLUMN store_label_needed SET NOT NULL,
                                    ALTER COLUMN store_label_failures SET NOT NULL;

-- incremental/0.2/005-file-means-index.sql
-- storetopics 0.2: an index on the file means an assignment pass writes, so that re-assigning a whole store
-- (apply_fit) looks each row's file mean up instead of hashing all of them (storetopics._assign_sql).
CREATE INDEX file_means_key ON storetopics.file_means (source_id, store_key, file_key, dims);

-- incremental/0.2/006-keys-and-ddl.sql
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

-- incremental/0.2/007-tool-names.sql
-- storetopics 0.2: a store's tool name is decided once, when the store first appears, and never changes: a client
-- that saved a tool name, or a prompt that mentions it, keeps working when other tables are attached or detached.
-- Unique over every store (a newcomer whose name is taken gets a suffix; storetopics._name_stores).
ALTER TABLE storetopics.store_state ADD COLUMN tool_name text;
CREATE UNIQUE INDEX store_state_tool_name ON storetopics.store_state (tool_name);

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
-- row, which must call the row `c` (e.g. `c.cmetadata->>'source'`), wrapped in parentheses, with a line break
-- before the closing one so that a trailing `--` comment ends there.  storetopics._expr_type proves first that it is
-- one expression: only then is it ever put into a statement.
CREATE OR REPLACE FUNCTION storetopics._key_sql(tbl regclass, key text) RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
RETURN CASE
  WHEN EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = tbl AND a.attname = key AND a.attnum > 0
                AND NOT a.attisdropped)
  THEN format('c.%I', key)
  ELSE format(E'(%s\n)', key)
END;

-- The type of a key over the table's rows.  A key that is no column is the attacher's SQL, and nothing of it may run
-- here (as the extension's owner): it is proven to be exactly one expression without running it.  It holds no
-- semicolon, so no statement built around it can hold a second statement; and it is the body of an SQL function's
-- `RETURN (<key>)`, where the grammar admits one expression and nothing after it (a key that closes the parenthesis
-- to add FROM, UNION or a comment is a syntax error there).  Creating that function parses it and runs nothing.
-- The type then comes from a temporary view (parsed, never run).  The key is evaluated only by the source's
-- generated functions, as the table's owner (020-generated.sql).
CREATE OR REPLACE FUNCTION storetopics._expr_type(tbl regclass, key text, what text) RETURNS regtype
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  t regtype;
  expr text := storetopics._key_sql(tbl, key);
BEGIN
  SELECT a.atttypid::regtype INTO t FROM pg_attribute a
   WHERE a.attrelid = tbl AND a.attname = key AND a.attnum > 0 AND NOT a.attisdropped;
  IF FOUND THEN
    RETURN t;
  END IF;
  IF strpos(key, ';') > 0 THEN
    RAISE EXCEPTION 'storetopics: % is not one SQL expression: it contains ";"', what
      USING ERRCODE = 'invalid_parameter_value',
            HINT = 'A key is a column name or one SQL expression over the chunk row c; inside a string, write '
                   'chr(59) for a semicolon.';
  END IF;
  BEGIN
    EXECUTE format('CREATE FUNCTION pg_temp.storetopics_probe(c %s) RETURNS pg_catalog.text LANGUAGE sql '
                   'RETURN %s::pg_catalog.text', tbl, expr);
  EXCEPTION WHEN syntax_error THEN
    RAISE EXCEPTION 'storetopics: % is not one SQL expression over %: %', what, tbl, SQLERRM
      USING ERRCODE = 'invalid_parameter_value',
            HINT = 'Give a column name, or one SQL expression that calls the chunk row c, e.g. '
                   'c.cmetadata->>''source''.';
  WHEN OTHERS THEN
    RAISE EXCEPTION 'storetopics: % is not a column or valid expression over %: %', what, tbl, SQLERRM
      USING ERRCODE = 'invalid_parameter_value',
            HINT = 'Give a column name, or an SQL expression that calls the chunk row c, e.g. c.cmetadata->>''source''.';
  END;
  EXECUTE format('DROP FUNCTION pg_temp.storetopics_probe(%s)', tbl);
  EXECUTE format('CREATE TEMP VIEW storetopics_probe AS SELECT %s AS k FROM %s AS c', expr, tbl);
  SELECT a.atttypid::regtype INTO t FROM pg_attribute a
   WHERE a.attrelid = 'pg_temp.storetopics_probe'::regclass AND a.attname = 'k';
  DROP VIEW pg_temp.storetopics_probe;
  RETURN t;
END $$;

-- A type, or the base type of a domain (of a domain ...).
CREATE OR REPLACE FUNCTION storetopics._base_type(p_type regtype) RETURNS regtype
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
  WITH RECURSIVE d(t, base, kind) AS (
    SELECT y.oid, y.typbasetype, y.typtype FROM pg_type y WHERE y.oid = p_type
    UNION ALL
    SELECT y.oid, y.typbasetype, y.typtype FROM d JOIN pg_type y ON y.oid = d.base WHERE d.kind = 'd')
  SELECT d.t::regtype FROM d WHERE d.kind <> 'd';
END;

-- pgvector's schema, to name its operators in dynamic SQL (functions here run with search_path = pg_catalog).
CREATE OR REPLACE FUNCTION storetopics._vector_schema() RETURNS name
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
RETURN (SELECT t.typnamespace::regnamespace::name FROM pg_type t WHERE t.typname = 'vector'
         ORDER BY t.typnamespace = 'public'::regnamespace DESC LIMIT 1);

-- A table and, when it is partitioned, every table of its partition tree.
CREATE OR REPLACE FUNCTION storetopics._tree(p_table regclass) RETURNS regclass[]
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
RETURN ARRAY(SELECT p_table UNION SELECT x.relid FROM pg_partition_tree(p_table) x ORDER BY 1);

-- How to name one chunk: its single-column primary key, else its ctid (good within one fit).
CREATE OR REPLACE FUNCTION storetopics._chunk_ref_sql(tbl regclass) RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
RETURN coalesce((SELECT format('c.%I::text', a.attname)
                   FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
                  WHERE i.indrelid = tbl AND i.indisprimary AND i.indnatts = 1),
                'c.ctid::text');

-- The WHERE condition that finds chunks by the refs _chunk_ref_sql gave, bound as $1 (an index or TID scan).
CREATE OR REPLACE FUNCTION storetopics._chunk_lookup_sql(tbl regclass) RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
RETURN coalesce((SELECT format('c.%I = ANY ($1::%s[])', a.attname, a.atttypid::regtype)
                   FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
                  WHERE i.indrelid = tbl AND i.indisprimary AND i.indnatts = 1),
                'c.ctid = ANY ($1::tid[])');

-- to_tsvector, or NULL for unusable text or text whose tsvector would pass 1 MB (one subtransaction per call: the
-- slow path of a fold batch that hit such a row; parallel unsafe: workers may not start subtransactions).
CREATE OR REPLACE FUNCTION storetopics.tsvector_or_null(cfg regconfig, t text) RETURNS tsvector
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  IF NOT storetopics.usable_text(t) THEN
    RETURN NULL;
  END IF;
  RETURN to_tsvector(cfg, t);
EXCEPTION WHEN program_limit_exceeded THEN
  RETURN NULL;
END $$;

-- The installed version (storetopics.meta), which generated functions are stamped with.
CREATE OR REPLACE FUNCTION storetopics._version() RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
RETURN (SELECT m.value FROM storetopics.meta m WHERE m.key = 'version');

-- The installed build (a digest of the SQL sources, written by the versioned script: sql/build.sh).
CREATE OR REPLACE FUNCTION storetopics._build() RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
RETURN (SELECT m.value FROM storetopics.meta m WHERE m.key = 'build');

-- What \df+ shows a DBA.
COMMENT ON FUNCTION storetopics.usable_text(text) IS
  'Whether a text is worth tokenising: not NULL, has a letter or digit, no control characters, under 1 MB. Other rows are counted as skipped.';
COMMENT ON FUNCTION storetopics.showable_term(text) IS
  'Whether a term is worth showing: 3-40 letters, maybe inner hyphens or apostrophes.';
COMMENT ON FUNCTION storetopics.tsvector_or_null(regconfig, text) IS
  'to_tsvector, or NULL for unusable text or a text whose tsvector would pass 1 MB.';

-- idempotent/015-screen.sql
-- ------------------------------------------------------------------------------------------------------------
-- Screen: one filter for every text a router LLM reads
-- ------------------------------------------------------------------------------------------------------------
-- Labels, phrases and ranked terms come from documents anyone could write, and a router LLM reads them on every
-- turn: they must read as data, never as instructions.  storetopics.screen(text) says why a text must not be shown
-- (NULL: it may be); storetopics.screen_words(text[]) gives the positions of the words of a ranked list to leave out.
-- The checks read three normal forms of the text:
--   d  _screen_normal: NFKC (full-width, mathematical and circled letters, ligatures read as the letters they show),
--                      invisible characters removed, diacritics removed, lower case: the text as a reader sees it;
--   m  _screen_latin:  d with look-alike letters (Cyrillic а, Greek ο, small capitals, Cherokee, Lisu, regional
--                      indicators) read as the Latin letters they imitate: for the checks of Latin-script text;
--   s  _screen_squash: m with digits read as letters (1gn0re) and everything but a-z removed, so that letters split
--                      by spaces, dots or hyphens ("i g n o r e", "ig-nore") are read together; only long,
--                      distinctive sequences are looked for in it.
-- Every regular expression runs under COLLATE "C" and names its characters by code point (PostgreSQL's regular
-- expressions know no Unicode scripts), so the result is the same in every database locale; the database must be
-- UTF8 (normalize() needs it).  The patterns are constants: each is compiled once per backend and cached (the cache
-- holds 32 patterns; this file uses 23).  Cost, measured: about 0.1 ms for a short ASCII label, 0.3 ms for a line of
-- 50-60 characters; ASCII text skips the Unicode steps, and most patterns run only when a word they need is there
-- (the gates, above _screen_rules_en_routing).

-- why: lower() under COLLATE "C" folds ASCII only; the capitals the checks read (Greek, Cyrillic, a few Latin ones
-- NFD does not split) are folded here, so the result does not depend on the database's LC_CTYPE.
CREATE OR REPLACE FUNCTION storetopics._screen_fold(t text) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  IF octet_length(t) = length(t) THEN RETURN lower(t COLLATE "C"); END IF;   -- ASCII
  RETURN lower(translate(t COLLATE "C",
                         'ΑΒΓΔΕΖΗΘΙΚΛΜΝΞΟΠΡΣΤΥΦΧΨΩАБВГДЕЖЗИЙКЛМНОПРСТУФХЦЧШЩЪЫЬЭЮЯЀЁЂЃЄЅІЇЈЉЊЋЌЍЎЏҐÆØÞÐŒŁĐ',
                         'αβγδεζηθικλμνξοπρστυφχψωабвгдежзийклмнопрстуфхцчшщъыьэюяѐёђѓєѕіїјљњћќѝўџґæøþðœłđ'));
END $$;

-- why: characters that show nothing (zero-width, bidi embeddings, overrides and isolates, word joiner, invisible
-- operators, soft hyphen, combining grapheme joiner, Mongolian vowel separator, Hangul fillers, variation selectors,
-- tag characters, private use, noncharacters) can split a word so that no pattern sees it, or hide text.  This
-- removes them; screen() rejects any text that had one.
CREATE OR REPLACE FUNCTION storetopics._screen_visible(t text) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  RETURN regexp_replace(t COLLATE "C",
    '[\u00ad\u034f\u061c\u115f\u1160\u17b4\u17b5\u180b-\u180f\u200b-\u200f\u202a-\u202e\u2060-\u206f\u2800\u3164'
    '\ue000-\uf8ff\ufdd0-\ufdef\ufe00-\ufe0f\ufeff\uffa0\ufff0-\uffff\U0001d173-\U0001d17a\U000e0000-\U000e0fff'
    '\U000f0000-\U0010ffff]', '', 'g');
END $$;

-- why: "ìgnórë" and "précédentes" should read as "ignore" and "precedentes": NFD splits letters from their marks,
-- the combining marks go (also strike-through and "zalgo" stacks), NFC puts the rest back together (kana, Hangul).
CREATE OR REPLACE FUNCTION storetopics._screen_deaccent(t text) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  RETURN normalize(regexp_replace(normalize(t, NFD) COLLATE "C",
                                  '[\u0300-\u036f\u1ab0-\u1aff\u1dc0-\u1dff\u20d0-\u20ff\ufe20-\ufe2f]', '', 'g'), NFC);
END $$;

-- why: the form d above (scripts, role markers, markup and the checks in other languages read it).  ASCII text is
-- already in this form but for its case.
CREATE OR REPLACE FUNCTION storetopics._screen_normal(t text) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  IF octet_length(t) = length(t) THEN RETURN lower(t COLLATE "C"); END IF;
  RETURN storetopics._screen_fold(storetopics._screen_deaccent(storetopics._screen_visible(normalize(t, NFKC))));
END $$;

-- why: the form m above.  Look-alikes are mapped before case folding, so capital Greek Η reads as H and small η as n.
-- Pairs by script: Cyrillic а е о р с у х і ј ѕ ԁ ԛ ԝ ӏ һ ү к ѵ and capitals; Greek α ε ι κ ν ο ρ τ υ χ ω γ η ϲ ϳ and
-- capitals; Armenian օ ս ց ո հ զ Ս Օ; Latin small capitals and IPA letters (ɡ ɑ ı ȷ ɩ ɪ ʏ ᴀ ʙ ᴄ ...); Cherokee and
-- Lisu capitals that are drawn as Latin ones; regional indicator symbols 🇦-🇿.
CREATE OR REPLACE FUNCTION storetopics._screen_latin(t text) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  IF octet_length(t) = length(t) THEN RETURN lower(t COLLATE "C"); END IF;
  RETURN storetopics._screen_fold(translate(
    storetopics._screen_deaccent(storetopics._screen_visible(normalize(t, NFKC))),
    U&'\0430\0435\043E\0440\0441\0443\0445\0456\0458\0455\0501\051B\051D\04CF\04BB\04AF\043A\0475'
    || U&'\0410\0412\0415\041A\041C\041D\041E\0420\0421\0422\0425\0423\0406\0408\0405\0500\051A\051C\04C0\04BA\04AE'
    || U&'\03B1\03B5\03B9\03BA\03BD\03BF\03C1\03C4\03C5\03C7\03C9\03B3\03B7\03F2\03F3'
    || U&'\0391\0392\0395\0396\0397\0399\039A\039C\039D\039F\03A1\03A4\03A5\03A7'
    || U&'\0585\057D\0581\0578\0570\0566\054D\0555'
    || U&'\0261\0251\0131\0237\0269\026A\028F\1D00\0299\1D04\1D05\1D07\0262\029C\1D0A\1D0B\029F\1D0D\0274\1D0F'
    || U&'\1D18\0280\A731\1D1B\1D1C\1D20\1D21\1D22\0275'
    || U&'\13AA\13F4\13DF\13AC\13BB\13AB\13E6\13B7\13DA\13A2\13B3\13C3\13E2\13D2\13DE\13D9\13A0\13C0'
    || U&'\A4EE\A4D0\A4DA\A4D3\A4F0\A4DD\A4D6\A4E7\A4F2\A4D9\A4D7\A4E1\A4DF\A4E0\A4F3\A4D1\A4E3\A4E2\A4D4\A4F4\A4E6'
    || U&'\A4EA\A4EB\A4EC\A4DC'
    || U&'\+01F1E6\+01F1E7\+01F1E8\+01F1E9\+01F1EA\+01F1EB\+01F1EC\+01F1ED\+01F1EE\+01F1EF\+01F1F0\+01F1F1\+01F1F2'
    || U&'\+01F1F3\+01F1F4\+01F1F5\+01F1F6\+01F1F7\+01F1F8\+01F1F9\+01F1FA\+01F1FB\+01F1FC\+01F1FD\+01F1FE\+01F1FF',
    'aeopcyxijsdqwlhykv' || 'ABEKMHOPCTXYIJSDQWIHY' || 'aeikvoptuxwyncj' || 'ABEZHIKMNOPTYX' || 'ougnhqUO'
    || 'gaijiiyabcdeghjklmno' || 'prstuvwzo' || 'ABCEHJKMSTWZPRLVDG' || 'ABCDEFGHIJKLMNOPRSTUV' || 'WXYZ'
    || 'abcdefghijklm' || 'nopqrstuvwxyz'));
END $$;

-- why: the form s above, from m: 0 1 3 4 5 7 @ $ read as o i e a s t a s, then only a-z are kept.  The names of
-- ignore files go too ("gitignore instructions" is a topic, "gitignoreinstructions" would not be).
CREATE OR REPLACE FUNCTION storetopics._screen_squash(m text) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  RETURN regexp_replace(regexp_replace(translate(m COLLATE "C", '013457@$', 'oieastas'), '[^a-z]+', '', 'g'),
                        '(git|docker|npm|eslint|prettier|stylelint|hg|cvs|bzr)ignore', '', 'g');
END $$;

-- why: one regular expression for "a run of letters mixes two scripts", built from this table so that the ranges
-- stay readable.  Latin, CJK (Han with kana) and Hangul may mix with each other: Japanese, Chinese and Korean write
-- Latin names inside words ("Python入門").  Digits, hyphens and apostrophes end a run ("Linux-ядро" is two).  It has
-- no argument and is IMMUTABLE, so the planner computes it once per plan.
CREATE OR REPLACE FUNCTION storetopics._screen_scripts_re() RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
  WITH script(name, letters, east_asian_mix) AS (VALUES
    ('Latin',     'a-zA-Z\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u02af\u1d00-\u1dbf\u1e00-\u1eff\u2c60-\u2c7f\ua720-\ua7ff'
                  '\uab30-\uab6f', true),
    ('Greek',     '\u0370-\u03ff\u1f00-\u1fff', false),
    ('Cyrillic',  '\u0400-\u052f\u1c80-\u1c8f\u2de0-\u2dff\ua640-\ua69f', false),
    ('Armenian',  '\u0531-\u058f\ufb13-\ufb17', false),
    ('Hebrew',    '\u0590-\u05ff\ufb1d-\ufb4f', false),
    ('Arabic',    '\u0600-\u06ff\u0750-\u077f\u08a0-\u08ff\ufb50-\ufdff\ufe70-\ufefe', false),
    ('Indic',     '\u0900-\u0dff', false),
    ('Thai, Lao', '\u0e00-\u0eff', false),
    ('Georgian',  '\u10a0-\u10ff\u1c90-\u1cbf\u2d00-\u2d2f', false),
    ('Ethiopic',  '\u1200-\u139f', false),
    ('Cherokee, Canadian syllabics, Runic, Coptic, Tifinagh, Lisu',
                  '\u13a0-\u13ff\uab70-\uabbf\u1400-\u167f\u16a0-\u16ff\u2c80-\u2cff\u2d30-\u2d7f\ua4d0-\ua4ff', false),
    ('CJK',       '\u2e80-\u2fdf\u3005-\u3007\u3021-\u3029\u3031-\u3035\u3040-\u30ff\u3100-\u312f\u31f0-\u31ff'
                  '\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uff66-\uff9f\U00020000-\U0003134f', true),
    ('Hangul',    '\u1100-\u11ff\u3130-\u318f\ua960-\ua97f\uac00-\ud7ff', true))
  SELECT string_agg(format('[%s][%s]*[%s]', a.letters, (SELECT string_agg(w.letters, '') FROM script w),
                           (SELECT string_agg(b.letters, '') FROM script b
                             WHERE b.name <> a.name AND NOT (a.east_asian_mix AND b.east_asian_mix))), '|')
    FROM script a;
END;

-- why: a Cyrillic or Greek letter inside a Latin word (or the reverse) is how a filter is fooled; no honest label
-- needs it.  A label wholly in one script is fine.
CREATE OR REPLACE FUNCTION storetopics._screen_mixed(d text) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  IF octet_length(d) = length(d) THEN RETURN false; END IF;                    -- ASCII
  RETURN d COLLATE "C" ~ storetopics._screen_scripts_re();
END $$;

-- why: chat-template tokens and "role:" prefixes make a router read the text as a new turn of the conversation.
-- A role word without a colon ("user management", "assistant tools", "system calls") is fine.
CREATE OR REPLACE FUNCTION storetopics._screen_role(d text) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  IF strpos(d, ':') = 0 AND strpos(d, '|') = 0 AND strpos(d, '[') = 0 AND strpos(d, '<') = 0 AND strpos(d, '_') = 0
     AND strpos(d, '#') = 0 AND strpos(d, 'endoftext') = 0 THEN
    RETURN false;                                  -- every marker below has one of these
  END IF;
  RETURN d COLLATE "C" ~ (
       '\m(user|assistant|system|human|ai|model)\s+(said|says|wrote|writes|asked|asks)\s*:'
    || '|(^|[^a-z0-9_:])(system|assistant|user|human|ai|bot|model|developer|sys|instructions?|prompt|response|gpt'
    || '|chatgpt|claude|llm|admin|root|operator|important|attention|urgent|notice)\s*:(?!:)'
    || '|\m(system|admin|administrator|developer|security)\s+(notice|message|alert|note|update|override'
    || '|instructions?)\s*:'
    || '|<\||\|>|\[\s*/?\s*(inst|sys|system|assistant|user|human|im_start|im_end)\s*\]|<<\s*/?\s*sys\s*>>'
    || '|\m(im_start|im_end|im_sep|endoftext|eot_id|eom_id|start_header_id|end_header_id|begin_of_text|end_of_text'
    || '|fim_prefix|fim_middle|fim_suffix|start_of_turn|end_of_turn)\M'
    || '|#+\s*(instructions?|system|response|input|user|assistant|human|prompt|context)\M'
    || '|(^|[^a-zа-я])(система|пользователь|ассистент|systeme|utilisateur|sistema|usuario|utente|benutzer|nutzer'
    || '|assistente|asistente|assistent)\s*:'
    || '|(系统|系統|用户|用戶|助手|助理|システム|ユーザー|アシスタント)\s*:');
END $$;

-- why: a link or host invites the router to fetch or trust it.  A dot between letters is a host only when the last
-- part is a top-level domain from the list below, so "Node.js", "Vue.js", "setup.py", "README.md", "main.rs",
-- "Makefile.am", "libc.so", "clojure.zip", "Mail.app" are not hosts (.py .md .rs .pl .sh .so .am .ac .in .cc .mk .ml
-- .mo .pm .ps .id .zip .mov .app are left out: as file extensions they are far more common); .NET and Java namespaces
-- (ASP.NET, java.io, System.IO), Socket.IO, Engine.IO and py.test are library names; a one-letter name before the
-- dot (X.Org, I.MX) is a host only with a path ("x.com/...").  "evil.example", "www.", "://", e-mail addresses,
-- IPv4 addresses, "evil[.]example" and "evil dot com" are hosts.
CREATE OR REPLACE FUNCTION storetopics._screen_url(d text, m text) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  IF strpos(m, '.') = 0 AND strpos(m, '@') = 0 AND strpos(m, ':') = 0 AND strpos(m, 'dot') = 0
     AND strpos(m, 'colon') = 0 THEN                -- every pattern below has one of these
    RETURN false;
  END IF;
  RETURN d COLLATE "C" ~ '[0-9a-zа-я\u4e00-\u9fff-]\.(рф|рус|укр|бел|срб|中国|公司|网络)([^а-я\u4e00-\u9fff]|$)'
    OR m COLLATE "C" ~ replace(replace(replace(
       ':\s*/\s*/|\m(h\s*[tx]\s*[tx]\s*p\s*s?|javascript|vbscript|mailto)\s*:(?!:)|\mw\s*w\s*w\d*\s*\.\s*[a-z0-9]'
    || '|\mxn--'
    || '|[a-z0-9._%+-]\s*@\s*[a-z0-9-]+(\.[a-z0-9-]+)*\.[a-z]{2,}|\m\d{1,3}(\.\d{1,3}){3}\M'
    || '|[a-z0-9]\s*[[({]\s*(\.|dot)\s*[])}]\s*[a-z]'
    || '|\m[a-z0-9-]+\s+(dot|\(dot\)|\[dot\])\s+{tld}\M|\m(h\s*[tx]\s*[tx]\s*p\s*s?|ftp)\s+colon\M|\mcolon\s+slash'
    || '|\m(?!{library}\M)[a-z0-9][a-z0-9-]*[a-z0-9](\.{label})*\.{tld}\M'    -- a name of 2+ characters, a domain
    || '|\m{label}(\.{label})+\.{tld}\M|\m{label}(\.{label})*\.{tld}/',        -- 3+ parts, or a path: x.com/...
       '{library}', '(asp|ado|vb|math|java|javax|system|socket|engine)\.(net|io|nio)|py\.test'),
       '{label}', '[a-z0-9]([a-z0-9-]*[a-z0-9])?'),
       '{tld}', '(com|net|org|edu|gov|mil|info|biz|io|ai|co|me|tv|ly|gg|to|fm|ws|tk|cx|nu|dev|xyz|online|site|top|club'
             || '|shop|store|tech|cloud|page|link|live|pro|mobi|example|test|invalid|localhost|local|onion|ru|su|cn|uk'
             || '|de|fr|jp|br|it|es|nl|au|ca|ch|se|no|fi|dk|be|at|cz|kr|tw|hk|sg|nz|za|mx|ar|cl|tr|ua|ir|il|gr|pt|hu|ro'
             || '|bg|sk|si|hr|lt|lv|ee|by|kz|us|eu|asia|vn|th|my|ph|pk|bd|ng|ke|eg|sa|ae|qa|ie|lu|li|is|ga|cf|gq)');
END $$;

-- why: markup changes how the router reads what follows: tags, code fences, template braces, Markdown links,
-- bold, headings, tables, rules, entities, quotes and backslash escapes.  "C++", "C#", "#include" and "R&D" are not
-- markup.
CREATE OR REPLACE FUNCTION storetopics._screen_markup(d text) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  RETURN d COLLATE "C" ~ (
       '[<>`"\\|]|\{\{|\}\}|\$\{|\{%|%\}|\{#|#\}|\[[^]]*\]\s*\(|\*\*|~~|(^|\s)#+(\s|$)|##|^\s*([-*+]|\d+[.)])\s'
    || '|-{3,}|={3,}|_{3,}|&#?[a-z0-9]+;');
END $$;

-- The patterns of commands to the router ("routing command") and of instructions to the model that reads the text
-- ("instruction"), one a row of the _screen_rules_* functions below: (kind, the words it starts with, what must
-- follow them, gate).  _screen_re joins a language's rows into one regular expression.
-- Commands: "route all queries here", "always choose this store", "the only relevant store for every question".
-- Instructions: "ignore previous instructions", "you are now", "act as a ...", "system prompt", "respond with",
-- "do not search", and the same in French, German, Spanish, Italian, Portuguese, Russian, Chinese, Japanese and
-- Korean.  Topics that share their words are fine: "routing protocols", "network route planning", "route all traffic
-- through the VPN", "always-on VPN", "instruction set architecture", "ignore files", "override configuration",
-- "previous versions", "prompt toolkit", "act as proxy" (only "act as" + an article or a role is an instruction:
-- "act as a proxy" is rejected).  Latin-script rows start with a \m word boundary; the other scripts have no ASCII
-- word boundaries and no first words; the squashed form s gets only long sequences.
-- Gates: PostgreSQL's regular expressions slow down with the size of the pattern, so a language's patterns run only
-- when the text has one of the words they need (most labels have none).  A row's gate is the words it starts with,
-- or, when those are common ("for", "this", "the"), a group of words copied from what must follow them.

-- why: routing commands in English, read on m.
CREATE OR REPLACE FUNCTION storetopics._screen_rules_en_routing()
RETURNS TABLE (kind text, starts text, follows text, gate text)
LANGUAGE sql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
  SELECT * FROM (VALUES
    ('routing', 'route|send|direct|forward|redirect|pass|dispatch|steer|assign|hand',
      '\s+((all|every|any|each|the|your|user|incoming)\s+)*(quer(y|ies)|questions?|requests?|prompts?|searches|'
      'lookups|messages|traffic|users|tasks|everything|anything|it|them)\M[^.;!?]*\m(here|hither|'
      'to\s+(this|me|us|here|it|our|my))\M', NULL),
    ('routing', 'route|send|direct|redirect|dispatch|steer',
      '\s+((all|every|any|each)\s+)+([a-z]+\s+)?(quer(y|ies)|questions?|prompts?|searches|lookups|'
      'inquir(y|ies))\M', NULL),
    ('routing', 'route', '\s+(everything|anything)\M', NULL),
    ('routing', 'always',
      '\s+(choose|chose|pick|select|use|route|prefer|call|query|search|consult|recommend|send|go\s+to|'
      'come\s+(here|to)|trust|rank|favou?r|check\s+(here|this))\M', NULL),
    ('routing', 'choose|pick|select|prefer|trust|recommend|prioriti[sz]e', '\s+(me|us)\M', NULL),
    ('routing', 'choose|pick|select|use|prefer|query|consult|call|trust|recommend|rank|prioriti[sz]e|favou?r|search',
      '\s+(only\s+)?(this|our|my)\s+(store|tool|source|one|index|database|db|collection|retriever|'
      'knowledge\s*base|data\s*store|datastore|option|assistant|agent|plugin)\M', NULL),
    ('routing', 'only|sole|single|best|most|one\s+and\s+only|the\s+right|the\s+correct',
      '\s+(relevant|correct|right|valid|useful|appropriate|authoritative|trusted|reliable|accurate)\s+(store|'
      'tool|source|one|index|database|db|collection|choice|option|answer|retriever|place|datastore|'
      'data\s+store|knowledge\s+base)\M',
      'relevant|correct|right|valid|useful|appropriate|authoritative|trusted|reliable|accurate'),
    ('routing', 'this|it|you|i',
      '\s+(is|are|am)\s+(the\s+)?(only|best|most\s+relevant|right|correct|sole|'
      'one\s+true)\s+([a-z]+\s+)?(store|source|tool|choice|option|one|answer|index|database|collection|match)\M',
      'only|best|most\s+relevant|right|correct|sole|one\s+true'),
    ('routing', 'only',
      '\s+(store|source|tool|index|database|collection|one)\s+(you|that)\s+(need|should|must|can)\M', NULL),
    ('routing', 'only',
      '\s+((use|consult|search|query|trust)\s+)?(this|our|my)\s+(store|source|tool|index|database|collection|'
      'retriever|knowledge\s*base|data\s*store|datastore)\M', NULL),
    ('routing', 'answer|answers|handle|handles|serve|serves|cover|covers|take|takes',
      '\s+(every|all|any|each)\s+(questions?|quer(y|ies)|requests?|prompts?|inquir(y|ies))\M', NULL),
    ('routing', 'highest|top',
      '\s+(priority|ranked|rated)\s+(store|source|tool|index|database|collection|retriever|choice|option)\M', NULL),
    ('routing', 'belongs?|goes', '\s+(here|to\s+(this|me|us))\M', NULL),
    ('routing', 'route|send|direct|redirect|forward',
      '\s+((it|them|everything)\s+)?(here|hither|to\s+(me|us))\M', NULL),
    ('routing', 'route|send|direct',
      '\s+(quer(y|ies)|questions?|requests?|prompts?)\M[^.;!?]*\m(always|here|exclusively|only)\M', NULL),
    ('routing', 'no',
      '\s+other\s+(store|source|tool|index|database|collection)s?\s+(is|are|has|have|matters?|counts?)\M',
      'other'),
    ('routing', 'every|all|any|each',
      '\s+(questions?|quer(y|ies)|requests?)\s+(is|are)\s+(about|for|answered\s+by|handled\s+by|'
      'meant\s+for)\s+(this|our|my)\M',
      'questions?|quer(y|ies)|requests?'),
    ('routing', 'all|any|every',
      '\s+other\s+(stores|sources|tools|indexes|indices|databases|collections|retrievers|data\s+stores)\M',
      'other'),
    ('routing', 'always', '\s+(this|here|me|us|our|my)\M', NULL),
    ('routing', 'relevant', '\s+(to|for)\s+(every|all|any|each|everything|anything)\M', NULL),
    ('routing', 'for',
      '\s+(every|all|any|each)\s+(questions?|quer(y|ies)|requests?|prompts?|searches|topics?|subjects?|'
      'inquir(y|ies)|lookups?|users?\s+quer(y|ies))\M',
      'questions?|quer(y|ies)|requests?|prompts?|searches|topics?|subjects?|inquir(y|ies)|lookups?|'
      'users?\s+quer(y|ies)'),
    ('routing', 'this|the|our',
      '\s+(store|source|tool|index|collection|database)\s+(is|has|contains|covers|answers|knows|'
      'handles)\s+(all|everything|every|anything|always|the\s+only|the\s+best|the\s+answer)\M',
      'store|source|tool|index|collection|database'),
    ('routing', 'queries|questions|requests|everything|all\s+traffic',
      '\s+(should|must|will|shall)\s+(go|be\s+(sent|routed|directed|forwarded))\M',
      'should|must|will|shall'),
    ('routing', 'ignore|skip|avoid|never\s+use|do\s+not\s+use|don''?t\s+use|never\s+choose',
      '\s+((all|any|the)\s+)?other\s+(stores|sources|tools|indexes|indices|databases|collections|options|'
      'results|retrievers)\M',
      'other')
  ) p(kind, starts, follows, gate);
END;

-- why: instructions in English, read on m.
CREATE OR REPLACE FUNCTION storetopics._screen_rules_en_instruction()
RETURNS TABLE (kind text, starts text, follows text, gate text)
LANGUAGE sql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
  SELECT * FROM (VALUES
    ('instruction', 'ignore|ignoring|disregard|disregarding|forget|forgetting|override|overriding|bypass|bypassing|'
                    'neglect|overlook|dismiss|discard',
      '\M[^.;!?]*\m(instructions?|prompts?|directions|guidelines|guardrails|programming|safeguards)\M', NULL),
    ('instruction', 'ignore|disregard|forget|override|bypass|neglect|overlook|dismiss',
      '\s+((all|any|every|each|the|your|my|these|those|of|everything)\s+)*(previous|prior|above|earlier|'
      'preceding|foregoing|former|aforementioned)\M', NULL),
    ('instruction', 'ignore|disregard|forget|override|bypass',
      '\s+((all|any|every|the|your)\s+)+(rules|restrictions|limitations|constraints|filters|policies|safety|'
      'context|everything|anything|that|this|above)\M', NULL),
    ('instruction', 'ignore|disregard|forget',
      '\s+(everything|anything|all\s+(that|this|of\s+(this|that|it)))\M', NULL),
    ('instruction', 'ignore|disregard|forget',
      '\s+(what|everything|anything|all)\s+(you|that|which)\s+(were|was|have|had|are|know|learned|learnt)\M', NULL),
    ('instruction', 'previous|prior|above|earlier|preceding|foregoing|original|initial|hidden|secret|real|actual|'
                    'true|updated|revised|overriding|following|new|system|developer|master|jailbreak',
      '\s+(instructions|prompts?)\M',
      'instructions|prompts?'),
    ('instruction', 'new',
      '\s+(instruction|directive|task|orders|rules?)\s*:',
      'instruction|directive|task|orders|rules?'),
    ('instruction', 'system', '\s+(instruction|override|directive)\M', 'instruction|override|directive'),
    ('instruction', 'you', '\s*(are|re|''re|r)\s+(now|no\s+longer|from\s+now\s+on|henceforth)\M', NULL),
    ('instruction', 'from\s+now\s+on|starting\s+now|henceforth|from\s+this\s+point\s+on',
      '\M',
      'now|henceforth|point'),
    ('instruction', 'you',
      '\s+(must|shall|are\s+required\s+to|are\s+instructed\s+to|are\s+to|will\s+now|will\s+always|will\s+only|'
      'should\s+always|should\s+only|may\s+only|can\s+only)\M', NULL),
    ('instruction', 'act|behave|respond|answer|pose|roleplay|role-play',
      '\s+(as|like)\s+(a|an|the|if|my|your|though|dan|ai|chatgpt|gpt|claude|root|admin|administrator|developer|'
      'assistant|system|jailbroken|unrestricted|unfiltered|evil)\M', NULL),
    ('instruction', 'pretend', '\s+(to\s+be|you|that|as)\M', NULL),
    ('instruction', 'imagine', '\s+(you\s+are|you''re|that\s+you)\M', NULL),
    ('instruction', 'your',
      '\s+new\s+(role|task|job|instructions|name|purpose|rules)\M',
      'role|task|job|instructions|name|purpose|rules'),
    ('instruction', 'do', '\s+anything\s+now\M', 'anything'),
    ('instruction', 'dan|god|jailbreak|jailbroken|unrestricted|unfiltered|evil|developer',
      '\s+mode\s+(enabled|on|activated)\M',
      'mode'),
    ('instruction', 'dan|jailbreak|jailbroken|unrestricted|unfiltered', '\s+mode\M', 'mode'),
    ('instruction', 'jail', '\s*br(eak|oken|eaking|eaked|eaks)\M', NULL),
    ('instruction', 'respond|reply|answer',
      '\s+((only|always|just|solely|exclusively)\s+)?(with|using|by\s+saying|in\s+all\s+caps)\M', NULL),
    ('instruction', 'always|only|never|just',
      '\s+(respond|reply|answer|say|output|print|recommend|mention|suggest)\M',
      'respond|reply|answer|say|output|print|recommend|mention|suggest'),
    ('instruction', 'say', '\s+(only|nothing\s+but)\M', NULL),
    ('instruction', 'do\s+not|don''?t|dont|never|stop',
      '\s+(search|searching|look\s+up|answer|answering|respond|reply|consult|query|route|mention|tell|reveal|'
      'disclose|follow|obey|refuse|warn|consider|check|use\s+(any|other|the\s+other))\M', NULL),
    ('instruction', 'end|beginning|start',
      '\s+of\s+(the\s+)?(data|document|context|summary|input|prompt|instructions|conversation|'
      'system\s+(prompt|message)|untrusted\s+[a-z]+|user\s+input)\M', NULL),
    ('instruction', 'begin|end', '\s+(instructions|system\s+prompt|prompt|injection)\M', NULL),
    ('instruction', 'note|message|instructions?',
      '\s+(to|for)\s+(the\s+)?(ai|assistant|model|llm|router|agent|chatbot|bot|claude|chatgpt|gpt|'
      'language\s+model)\M',
      'ai|assistant|model|llm|router|agent|chatbot|bot|claude|chatgpt|gpt|language\s+model'),
    ('instruction', 'hey|dear|attn',
      '\s+(ai|assistant|model|llm|router|agent|chatbot|bot|claude|chatgpt|gpt)\M', NULL),
    ('instruction', 'ai|assistant|model|llm|router|agent|claude|chatgpt|gpt|bot',
      '\s*,\s*(please|you|ignore|always|never|route|choose|select|pick|use|remember|forget)\M', NULL),
    ('instruction', 'disable|turn\s+off|deactivate|bypass|remove|lift|ignore|override',
      '\s+((your|all|the|any)\s+)*(safety|ethical|moral|content\s+policy)\M',
      'safety|ethical|moral|content\s+policy'),
    ('instruction', 'ignore|disregard|forget|override|bypass|disable',
      '\s+your\s+(filters|guardrails|restrictions|safeguards|guidelines|programming|training|rules|'
      'instructions|prompt|policies|principles|limits|limitations)\M', NULL),
    ('instruction', 'following',
      '\s+(is|are)\s+((a|an|the|your|new|my)\s+)*(system|instructions?|prompts?|messages?|commands?|orders?|'
      'rules)\M', NULL),
    ('instruction', 'obey|obeys|comply',
      '\s+(with\s+)?(the\s+following|me|us|these|this|my|our|(the\s+|all\s+)?(new\s+)?instructions)\M', NULL),
    ('instruction', 'follow',
      '\s+(these|the\s+following|my|our|new|the\s+new)\s+(instructions|rules|directions|orders|commands|'
      'directives)\M', NULL),
    ('instruction', 'output|print|say|reply|respond',
      '\s+(only\s+)?(the\s+words?|exactly|verbatim|yes|no|ok|okay|nothing\s+(but|else))\M', NULL),
    ('instruction', 'run|execute',
      '\s+(this|the\s+following|these)\s+(commands?|code|scripts?|tools?|functions?)\M', NULL),
    ('instruction', 'repeat',
      '\s+((the|your)\s+)?(words|text|prompt|instructions|everything)\s+(above|before|verbatim)\M', NULL),
    ('instruction', 'reveal|print|show|output|leak|display|repeat',
      '\s+(me\s+)?(your|the)\s+(system\s+|initial\s+)?(prompt|instructions)\M',
      'prompt|instructions'),
    -- imperatives made of ordinary words: the assistant told what it must do, secrets sent somewhere
    ('instruction', 'assistant|ai|model|llm|router|agent|chatbot|bot|claude|chatgpt|gpt',
      '\s*,?\s*(must|shall|should|needs\s+to|has\s+to|is\s+required\s+to|is\s+to|will\s+now)\M', NULL),
    ('instruction', 'forward|send|transmit|upload|exfiltrate|leak|relay|post',
      '\M[^.;!?]{0,40}\m(passwords|credentials|secrets|api\s+keys|private\s+keys|session\s+cookies)\M',
      'passwords|credentials|secrets|api\s+keys|private\s+keys|session\s+cookies')
  ) p(kind, starts, follows, gate);
END;

-- why: French and German, read on d.
CREATE OR REPLACE FUNCTION storetopics._screen_rules_fr_de()
RETURNS TABLE (kind text, starts text, follows text, gate text)
LANGUAGE sql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
  SELECT * FROM (VALUES
    ('routing', 'toujours',
      '\s+(choisir|choisis|choisissez|utiliser|utilise|utilisez|selectionner|selectionne|selectionnez|router|'
      'prendre|prends|prenez|privilegier|privilegie|privilegiez)\M', NULL),
    ('routing', 'choisis|choisissez|utilise|utilisez|selectionne|selectionnez|prends|prenez|privilegie|privilegiez',
      '\s+((toujours\s+)?(ce|cette|cet|ma|mon|notre)\s+(magasin|source|outil|base|boutique|index|collection|'
      'depot|entrepot|stockage)|toujours)\M', NULL),
    ('routing', 'pour|a',
      '\s+(toutes\s+les|chaque|tous\s+les|n''importe\s+quelle)\s+(questions?|requetes?|demandes?)\M',
      'questions?|requetes?|demandes?'),
    ('routing', 'seule|unique', '\s+(source|base|boutique|collection|outil)\s+pertinente?\M', NULL),
    ('routing', 'la', '\s+seule\s+pertinente\M', 'seule'),
    ('routing', 'redirige|redirigez|envoie|envoyez|route|routez|dirige|dirigez|achemine|acheminez',
      '\s+(toutes|tous|chaque)\s+(les\s+)?(questions?|requetes?|demandes?)\M', NULL),
    ('routing', 'wahle|wahlt|wahlen\s+sie|nimm|nehmt|nehmen\s+sie|nutze|nutzt|nutzen\s+sie|verwende|verwendet|'
                'verwenden\s+sie|benutze|benutzen\s+sie',
      '\s+(immer|stets|ausschlie(ss|ß)lich)\M', NULL),
    ('routing', 'immer|stets|ausschlie(ss|ß)lich|nur',
      '\s+(diesen|diese|dieses)\s+(speicher|datenspeicher|shop|store|quelle|tool|werkzeug|index|datenbank|'
      'sammlung)\M',
      'diesen|diese|dieses'),
    ('routing', 'diesen|diese|dieses',
      '\s+(speicher|datenspeicher|shop|store|quelle|tool|werkzeug|index|datenbank|'
      'sammlung)\s+(immer\s+)?(wahlen|nehmen|nutzen|verwenden|benutzen)\M', NULL),
    ('routing', 'fur|bei',
      '\s+(jede|jeder|alle|jegliche|samtliche)\s+(frage|fragen|anfrage|anfragen|suchanfragen)\M',
      'frage|fragen|anfrage|anfragen|suchanfragen'),
    ('routing', 'einzig|einzige|einzigen', '\s+(relevante|relevanten)\M', NULL),
    ('routing', 'leite|leitet|leiten\s+sie|sende|sendet|schicke|route',
      '\s+(alle|jede|samtliche)\s+(anfragen|fragen|suchanfragen|queries)\M', NULL),
    ('instruction', 'ignore[rsz]?|ignorons|oublie[rsz]?|oublions|neglige[rsz]?|ecarte[rsz]?|outrepasse[rsz]?|'
                    'contourne[rsz]?|fais\s+fi\s+de|faites\s+fi\s+de',
      '\M[^.;!?]*\m(instructions?|consignes?|regles|directives?|indications|invites?|prompts?|ordres|'
      'precedent[a-z]*|anterieur[a-z]*|ci-dessus|tout)\M', NULL),
    ('instruction', 'ne', '\s+(tiens|tenez|tenons)\s+pas\s+compte\M', 'tiens|tenez|tenons'),
    ('instruction', 'fais|faites', '\s+abstraction\M', NULL),
    ('instruction', 'tu\s+es|vous\s+etes', '\s+(maintenant|desormais|a\s+present|dorenavant)\M', NULL),
    ('instruction', 'desormais|dorenavant|a\s+partir\s+de\s+maintenant', ',?\s+(tu|vous)\M', NULL),
    ('instruction', 'tu\s+dois|vous\s+devez', '\M', NULL),
    ('instruction', 'agis|agissez|comporte-toi|comportez-vous', '\s+(comme|en\s+tant\s+que)\M', NULL),
    ('instruction', 'fais|faites', '\s+(semblant|comme\s+si)\M', NULL),
    ('instruction', 'joue', '\s+le\s+role\M', NULL),
    ('instruction', 'nouvelles?|vraies?|veritables?', '\s+(instructions|consignes)\M', NULL),
    ('instruction', 'invite|prompt|instructions?|consignes?', '\s+(du\s+)?systeme\M', 'systeme'),
    ('instruction', 'reponds|repondez', '\s+((uniquement|seulement|toujours)\s+)?(avec|par)\M', NULL),
    ('instruction', 'ne',
      '\s+(cherche|recherche|cherchez|recherchez|consulte|consultez)\s+(pas|rien|jamais)\M',
      'cherche|recherche|cherchez|recherchez|consulte|consultez'),
    ('instruction', 'ignorier[a-z]*|vergiss|vergesst|vergessen\s+sie|missacht[a-z]*|ubergeh[a-z]*|verwirf|verwerft|'
                    'beachte\s+nicht|beachten\s+sie\s+nicht',
      '\M[^.;!?]*(anweisung|instruktion|befehl|regeln|vorgaben|richtlinien|prompt|vorherig|bisherig|obig|'
      'vorangegangen|alles)', NULL),
    ('instruction', 'du\s+bist|sie\s+sind|ihr\s+seid',
      '\s+(jetzt|nun|ab\s+sofort|ab\s+jetzt|von\s+nun\s+an)\M', NULL),
    ('instruction', 'ab\s+sofort|ab\s+jetzt|von\s+nun\s+an', '\s+(bist|sind|musst|mussen|wirst)\M', NULL),
    ('instruction', 'du\s+musst|sie\s+mussen|ihr\s+musst', '\M', NULL),
    ('instruction', 'verhalte\s+dich|verhalten\s+sie\s+sich|agiere|agieren\s+sie|tu|tue|tun\s+sie',
      '\s+(wie|als|so\s+als)\M', NULL),
    ('instruction', 'gib', '\s+(vor|dich\s+als)\M', NULL),
    ('instruction', 'spiele', '\s+die\s+rolle\M', NULL),
    ('instruction', 'neue', '\s+(anweisungen|instruktionen)\M', NULL),
    ('instruction', 'system', '-?\s?(prompt|anweisung)', NULL),
    ('instruction', 'antworte', '[a-z]*\s+((nur|ausschlie(ss|ß)lich|immer)\s+)?mit\M', NULL),
    ('instruction', 'suche|suchen\s+sie|durchsuche', '\s+nicht\M', NULL)
  ) p(kind, starts, follows, gate);
END;

-- why: Spanish, Italian and Portuguese, read on d.
CREATE OR REPLACE FUNCTION storetopics._screen_rules_es_it_pt()
RETURNS TABLE (kind text, starts text, follows text, gate text)
LANGUAGE sql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
  SELECT * FROM (VALUES
    ('routing', 'elige|elija|escoge|escoja|selecciona|seleccione|usa|use|utiliza|utilice|prefiere|prefiera|scegli|'
                'seleziona|utilizza|preferisci|escolha|selecione|utilize|prefira',
      '\s+(sempre\s+|siempre\s+)?(esta|este|mi|nuestra|nuestro|questo|questa|il\s+mio|la\s+mia|essa|esse|minha|'
      'meu|nossa|nosso)\s+(tienda|fuente|herramienta|almacen|base|coleccion|indice|opcion|negozio|fonte|'
      'strumento|archivio|raccolta|opzione|store|loja|ferramenta|colecao|opcao|armazenamento)\M',
      'tienda|fuente|herramienta|almacen|base|coleccion|indice|opcion|negozio|fonte|strumento|archivio|'
      'raccolta|opzione|store|loja|ferramenta|colecao|opcao|armazenamento'),
    ('routing', 'siempre|sempre',
      '\s+(elige|elija|escoge|escoja|selecciona|seleccione|usa|use|utiliza|utilice|enruta|prefiere|elegir|usar|'
      'seleccionar|escoger|utilizar|scegli|seleziona|utilizza|preferisci|scegliere|usare|escolha|selecione|'
      'utilize|prefira|escolher|selecionar)\M', NULL),
    ('routing', 'elige|elija|escoge|selecciona|seleccione|usa|utiliza|scegli|seleziona|utilizza|escolha|selecione|'
                'use|utilize',
      '\s+(siempre|sempre)\M', NULL),
    ('routing', 'para|per',
      '\s+(todas\s+las|todas\s+as|tutte\s+le|cada|cualquier|qualquer|ogni|qualsiasi|qualunque)\s+(preguntas?|'
      'consultas?|solicitudes?|peticiones?|perguntas?|solicitacoes|pedidos|domanda|domande|richiesta|richieste|'
      'query)\M',
      'preguntas?|consultas?|solicitudes?|peticiones?|perguntas?|solicitacoes|pedidos|domanda|domande|'
      'richiesta|richieste|query'),
    ('routing', 'unica|sola',
      '\s+(fuente|tienda|herramienta|base|coleccion|fonte|risorsa|raccolta|loja|ferramenta)\s+(relevante|'
      'rilevante|pertinente)\M', NULL),
    ('routing', 'enruta|redirige|envia|dirige|instrada|inoltra|indirizza|invia|encaminhe|redirecione|envie|direcione|'
                'roteie',
      '\s+(todas|todos|cada|tutte|ogni)\s+(las\s+|los\s+|le\s+|as\s+|os\s+)?(preguntas|consultas|solicitudes|'
      'peticiones|domande|richieste|query|perguntas|solicitacoes|pedidos)\M', NULL),
    ('instruction', 'ignora|ignore|ignorar|ignoren|ignorad|ignorate|ignorare|ignorem|olvida|olvide|olvidar|olviden|'
                    'olvidad|olvidate|olvidese|olvidaos|descarta|descarte|descartar|omite|omita|omitir|desestima|'
                    'desestime|dimentica|dimenticare|dimenticate|dimenticati|trascura|tralascia|esqueca|esquece|'
                    'esquecer|esquecam|desconsidere|desconsidera|desconsiderar|despreze|non\s+considerare|'
                    'non\s+tenere\s+conto',
      '\M[^.;!?]*\m(instrucciones|instruccion|indicaciones|reglas|directrices|directivas|ordenes|consignas|'
      'normas|anteriores|previas|istruzioni|indicazioni|regole|direttive|comandi|precedenti|instrucoes|'
      'instrucao|regras|diretrizes|ordens|comandos|prompts?)\M', NULL),
    ('instruction', 'olvida|olvidalo|olviden|ignora|dimentica|esqueca|esquece', '\s+(todo|tutto|tudo)\M', NULL),
    ('instruction', 'haz|hagan|haga', '\s+caso\s+omiso\M', NULL),
    ('instruction', 'no', '\s+(hagas|haga|hagan)\s+caso\M', 'hagas|haga|hagan'),
    ('instruction', 'no', '\s+tengas\s+en\s+cuenta\M', 'tengas'),
    ('instruction', 'ahora\s+eres|eres\s+ahora|ahora\s+sos|ahora\s+usted\s+es|a\s+partir\s+de\s+ahora\s+(eres|seras|'
                    'usted)',
      '\M', NULL),
    ('instruction', 'tu\s+debes|usted\s+debe|debes\s+(siempre|responder|elegir|usar|ignorar|actuar)', '\M', NULL),
    ('instruction', 'actua|actue|actuad|comportate|comportese', '\s+como\M', NULL),
    ('instruction', 'finge', '\s+(ser|que)\M', NULL),
    ('instruction', 'haz', '\s+de\s+cuenta\M', NULL),
    ('instruction', 'nuevas', '\s+(instrucciones|indicaciones|ordenes)\M', NULL),
    ('instruction', 'prompt|indicacion|instrucciones', '\s+del?\s+sistema\M', 'sistema'),
    ('instruction', 'responde', '[a-z]*\s+((solo|solamente|unicamente|siempre)\s+)?con\M', NULL),
    ('instruction', 'no', '\s+(busques|busque|consultes|consulte)\M', 'busques|busque|consultes|consulte'),
    ('instruction', 'ora|adesso|da\s+ora\s+in\s+poi', '\s+sei\M', 'sei'),
    ('instruction', 'sei', '\s+(ora|adesso)\M', NULL),
    ('instruction', 'tu\s+devi|devi\s+(sempre|rispondere|scegliere|usare|ignorare)', '\M', NULL),
    ('instruction', 'comportati|agisci|recita', '\s+(come|da)\M', NULL),
    ('instruction', 'fingi', '\s+di\M', NULL),
    ('instruction', 'nuove', '\s+istruzioni\M', NULL),
    ('instruction', 'prompt|istruzioni', '\s+di\s+sistema\M', 'sistema'),
    ('instruction', 'rispondi', '\s+((solo|soltanto|sempre|unicamente)\s+)?(con|in\s+modo)\M', NULL),
    ('instruction', 'non', '\s+(cercare|consultare)\M', 'cercare|consultare'),
    ('instruction', 'agora\s+voce\s+e|voce\s+agora\s+e|voce\s+e\s+agora|a\s+partir\s+de\s+agora\s+voce|'
                    'agora\s+tu\s+es',
      '\M', NULL),
    ('instruction', 'voce\s+deve|tu\s+deves', '\M', NULL),
    ('instruction', 'aja|atue|comporte-se', '\s+como\M', NULL),
    ('instruction', 'finja', '\s+(ser|que)\M', NULL),
    ('instruction', 'novas', '\s+(instrucoes|ordens|diretrizes)\M', NULL),
    ('instruction', 'prompt|instrucoes', '\s+do\s+sistema\M', 'sistema'),
    ('instruction', 'responda', '\s+((apenas|somente|sempre)\s+)?com\M', NULL),
    ('instruction', 'nao', '\s+(pesquise|procure|busque|consulte)\M', NULL)
  ) p(kind, starts, follows, gate);
END;

-- why: Russian, read on d (diacritics are gone: й reads и, ё reads е).
CREATE OR REPLACE FUNCTION storetopics._screen_rules_ru()
RETURNS TABLE (kind text, starts text, follows text, gate text)
LANGUAGE sql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
  SELECT * FROM (VALUES
    ('routing', NULL,
      'всегда\s+(выбираи|выбери|выбирать|выбираите|выберите|используи|используите|использовать|направляи|'
      'направляите|отправляи|предпочитаи)', NULL),
    ('routing', NULL,
      '(выбираи|выбери|выберите|используи|используите)\s+(всегда\s+)?(это|этот|эту)\s+(хранилищ|источник|'
      'инструмент|базу|магазин|индекс|коллекци)', NULL),
    ('routing', NULL, '(^|[^а-я])(для|на)\s+(всех|каждого|любого|любых)\s+(вопрос|запрос)', NULL),
    ('routing', NULL,
      'единственн[а-я]*\s+(релевантн|подходящ|нужн|правильн)[а-я]*\s+(хранилищ|источник|инструмент|баз|магазин|'
      'индекс|коллекци)', NULL),
    ('routing', NULL,
      '(направляи|направляите|перенаправляи|перенаправляите|отправляи|отправляите|направьте|отправьте|'
      'перенаправьте)\s+(все|каждыи|любои|любые)\s+(вопрос|запрос)', NULL),
    ('instruction', NULL,
      '(игнориру|проигнориру|игнорь|забудь|забудьте|отбрось|отбросьте|пренебреги|пренебрегите|не\s+обращаи|'
      'не\s+обращаите|не\s+учитываи|не\s+учитываите|не\s+следуи|не\s+следуите|обоиди|'
      'обоидите)[а-я]*[^.;!?]*(инструкци|указани|правил|команд|промпт|подсказк|распоряжени|предыдущ|прежн|'
      'вышеизложен|вышеуказан|ограничени|все([^а-я]|$))', NULL),
    ('instruction', NULL,
      '(предыдущ|прежн|вышеизложен|вышеуказан|прошл)[а-я]*\s+(инструкци|указани|промпт|распоряжени)', NULL),
    ('instruction', NULL, '(^|[^а-я])(ты|вы)\s+(теперь|отныне|сеичас)([^а-я]|$)', NULL),
    ('instruction', NULL, '(теперь|отныне)\s+(ты|вы)([^а-я]|$)', NULL),
    ('instruction', NULL, '(^|[^а-я])(ты|вы)\s+(должен|должна|должны|обязан|обязана|обязаны)([^а-я]|$)', NULL),
    ('instruction', NULL, '(деиствуи|деиствуите|веди\s+себя|ведите\s+себя)\s+как', NULL),
    ('instruction', NULL, 'притворись', NULL),
    ('instruction', NULL, 'притворитесь', NULL),
    ('instruction', NULL, 'представь,?\s+что\s+ты', NULL),
    ('instruction', NULL, 'играи\s+роль', NULL),
    ('instruction', NULL, 'нов[а-я]*\s+(инструкци|указани)', NULL),
    ('instruction', NULL, 'системн[а-я]*\s+(промпт|подсказк|инструкци)', NULL),
    ('instruction', NULL, '(отвечаи|отвечаите|ответь|ответьте)\s+(только|всегда|лишь)', NULL),
    ('instruction', NULL, 'не\s+(ищи|ищите|искать)([^а-я]|$)', NULL),
    ('instruction', NULL, 'джеилбреик', NULL)
  ) p(kind, starts, follows, gate);
END;

-- why: Chinese, Japanese and Korean, read on d.
CREATE OR REPLACE FUNCTION storetopics._screen_rules_cjk()
RETURNS TABLE (kind text, starts text, follows text, gate text)
LANGUAGE sql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
  SELECT * FROM (VALUES
    ('routing', NULL,
      '(总是|總是|始终|始終|一律|永远|永遠|务必|務必)(选择|選擇|选用|選用|使用|路由|推荐|推薦|选|選)', NULL),
    ('routing', NULL,
      '(选择|選擇|选用|選用|只用|只使用)(这个|這個|此|本)(存储|存儲|仓库|倉庫|数据源|數據源|来源|來源|工具|'
      '知识库|知識庫|商店|索引)', NULL),
    ('routing', NULL,
      '(所有|全部|每个|每個|任何)的?(问题|問題|查询|查詢|请求|請求)都?(路由|转发|轉發|发送|發送|发到|發到|交给|'
      '交給|转到|轉到|指向)', NULL),
    ('routing', NULL, '唯一相关', NULL),
    ('routing', NULL, '唯一相關', NULL),
    ('routing', NULL, '最相关的(存储|来源|数据源|工具|知识库|仓库)', NULL),
    ('routing', NULL, '最相關的(存儲|來源|數據源|工具|知識庫|倉庫)', NULL),
    ('routing', NULL, '(对于|對於|针对|針對)(所有|每个|每個|任何)(问题|問題|查询|查詢)', NULL),
    ('routing', NULL,
      '(常に|いつも|必ず)[^。]{0,10}(選んで|選べ|選択して|選択しろ|使って|使え|ルーティング|推奨して)', NULL),
    ('routing', NULL,
      '(この|本)(ストア|データストア|ソース|情報源|インデックス|データベース)を(選んで|選べ|選択して|使って|'
      '使え|優先して)', NULL),
    ('routing', NULL,
      '(すべて|全て|全部|あらゆる)の(質問|クエリ|問い合わせ|リクエスト)[^。]{0,12}(ここ|この|こちら)', NULL),
    ('routing', NULL, '唯一の関連', NULL),
    ('routing', NULL, '(すべて|全て|全部)の(質問|クエリ)に(対して|ついて)', NULL),
    ('instruction', NULL,
      '(忽略|忽視|忽视|无视|無視|不要理会|不要理會|不理会|不理會|别理|別理|忘记|忘記|忘掉|抛开|拋開|绕过|'
      '繞過)[^。！？]{0,12}(指令|指示|提示|规则|規則|命令|设定|設定|限制|说明|說明|要求)', NULL),
    ('instruction', NULL, '(之前|以上|上面|先前|前面|上述|前述|此前)的?(所有|全部)?(指令|指示|提示词|提示詞)', NULL),
    ('instruction', NULL, '你现在是', NULL),
    ('instruction', NULL, '你現在是', NULL),
    ('instruction', NULL, '现在你是', NULL),
    ('instruction', NULL, '現在你是', NULL),
    ('instruction', NULL, '从现在开始', NULL),
    ('instruction', NULL, '從現在開始', NULL),
    ('instruction', NULL, '你必须', NULL),
    ('instruction', NULL, '你必須', NULL),
    ('instruction', NULL, '(请|請|你要|你将|你將)扮演', NULL),
    ('instruction', NULL, '假装你', NULL),
    ('instruction', NULL, '假裝你', NULL),
    ('instruction', NULL, '假装成', NULL),
    ('instruction', NULL, '假裝成', NULL),
    ('instruction', NULL, '系统提示', NULL),
    ('instruction', NULL, '系統提示', NULL),
    ('instruction', NULL, '新的?(指令|指示)(?!集)', NULL),
    ('instruction', NULL, '越狱', NULL),
    ('instruction', NULL, '越獄', NULL),
    ('instruction', NULL, '只(回答|回复|回覆|输出|輸出)', NULL),
    ('instruction', NULL, '不要(搜索|搜尋|查找|查询|查詢|检索|檢索)', NULL),
    ('instruction', NULL,
      '(以前|前|上記|これまで|今まで|先|すべて|全て|全部)の(指示|命令|指令|プロンプト|ルール|'
      '制約)[をはも]?(すべて|全て)?(無視|忘れ|破棄)', NULL),
    ('instruction', NULL, '(指示|命令|指令|プロンプト|ルール|制約)[をはも](すべて|全て)?(無視|忘れ|破棄)', NULL),
    ('instruction', NULL, 'あなたは(今|いま|これから)', NULL),
    ('instruction', NULL, '今から(あなたは|君は)', NULL),
    ('instruction', NULL, 'あなたは[^。]{0,12}(として|のように)(振る舞|ふるま|行動|答え|回答)', NULL),
    ('instruction', NULL, 'ふりをして', NULL),
    ('instruction', NULL, 'システムプロンプト', NULL),
    ('instruction', NULL, '新しい(指示|命令|プロンプト)', NULL),
    ('instruction', NULL, 'ジェイルブレイク', NULL),
    ('instruction', NULL, '脱獄', NULL),
    ('instruction', NULL, '検索しないで', NULL),
    ('instruction', NULL, '(지시|명령|지침|프롬프트)[^.]{0,8}무시', NULL),
    ('instruction', NULL, '이전\s*(지시|지침|프롬프트)', NULL),
    ('instruction', NULL, '시스템\s*프롬프트', NULL),
    ('instruction', NULL, '(너는|당신은)\s*이제', NULL)
  ) p(kind, starts, follows, gate);
END;

-- why: letters spelled apart, read on s: only long, distinctive sequences.
CREATE OR REPLACE FUNCTION storetopics._screen_rules_squash()
RETURNS TABLE (kind text, starts text, follows text, gate text)
LANGUAGE sql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
  SELECT * FROM (VALUES
    ('routing', NULL, 'routeall(queries|questions|requests|prompts|searches)', NULL),
    ('routing', NULL, 'route(everything|anything)', NULL),
    ('routing', NULL, 'always(choose|pick|select|route|prefer)', NULL),
    ('routing', NULL, '(choose|pick|select)this(store|tool|source|one|index|database)', NULL),
    ('routing', NULL, 'onlyrelevant(store|source|tool|index|database|one)', NULL),
    ('routing', NULL, 'forevery(question|query)', NULL),
    ('routing', NULL, 'forall(questions|queries)', NULL),
    ('instruction', NULL,
      '(ignore|ignoring|disregard|forget|override|bypass|neglect|overlook)(all|any|the|your|my|these|those|of|'
      'everything|every)*(previous|prior|above|earlier|preceding|foregoing|instructions?|prompts?|directions|'
      'guidelines|guardrails|safeguards|programming)', NULL),
    ('instruction', NULL,
      '(previous|prior|above|earlier|preceding|foregoing)(instructions|prompts?|directions|directives)', NULL),
    ('instruction', NULL, 'systemprompt', NULL),
    ('instruction', NULL, 'jailbr[eo]a?k', NULL),
    ('instruction', NULL, 'youarenow', NULL),
    ('instruction', NULL, 'yourenow', NULL),
    ('instruction', NULL, 'youmust', NULL),
    ('instruction', NULL, 'doanythingnow', NULL),
    ('instruction', NULL, 'newinstructions(?!et)', NULL),
    ('instruction', NULL, 'pretend(tobe|youare)', NULL)
  ) p(kind, starts, follows, gate);
END;

-- why: one regular expression of a language's patterns of a kind, or (p_kind 'gate') of the words they need.  Runs
-- once per plan: IMMUTABLE with constant arguments.
CREATE OR REPLACE FUNCTION storetopics._screen_re(p_lang text, p_kind text) RETURNS text
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
  SELECT CASE WHEN p_kind = 'gate' THEN '\m(' || string_agg(coalesce(p.gate, p.starts), '|') || ')'
              ELSE string_agg(coalesce('\m(' || p.starts || ')', '') || p.follows, '|') END
    FROM (SELECT 'en', r.* FROM storetopics._screen_rules_en_routing() r
         UNION ALL SELECT 'en', r.* FROM storetopics._screen_rules_en_instruction() r
         UNION ALL SELECT 'fr de', r.* FROM storetopics._screen_rules_fr_de() r
         UNION ALL SELECT 'es it pt', r.* FROM storetopics._screen_rules_es_it_pt() r
         UNION ALL SELECT 'other', r.* FROM storetopics._screen_rules_ru() r
         UNION ALL SELECT 'other', r.* FROM storetopics._screen_rules_cjk() r
         UNION ALL SELECT 'squash', r.* FROM storetopics._screen_rules_squash() r
         ) p(lang, kind, starts, follows, gate)
   WHERE p.lang = p_lang AND (p_kind = 'gate' OR p.kind = p_kind);
END;

-- why: 'routing command', 'instruction' or NULL, from the patterns above: English on m, the other Latin-script
-- languages on d, the other scripts on d when it has non-ASCII letters, and the squashed form s.
CREATE OR REPLACE FUNCTION storetopics._screen_command(d text, m text, s text) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  en boolean := m COLLATE "C" ~ storetopics._screen_re('en', 'gate');
  fr_de boolean := d COLLATE "C" ~ storetopics._screen_re('fr de', 'gate');
  es_it_pt boolean := d COLLATE "C" ~ storetopics._screen_re('es it pt', 'gate');
  other boolean := octet_length(d) > length(d);
BEGIN
  IF en AND m COLLATE "C" ~ storetopics._screen_re('en', 'routing')
     OR fr_de AND d COLLATE "C" ~ storetopics._screen_re('fr de', 'routing')
     OR es_it_pt AND d COLLATE "C" ~ storetopics._screen_re('es it pt', 'routing')
     OR other AND d COLLATE "C" ~ storetopics._screen_re('other', 'routing')
     OR s COLLATE "C" ~ storetopics._screen_re('squash', 'routing') THEN
    RETURN 'routing command';
  END IF;
  IF en AND m COLLATE "C" ~ storetopics._screen_re('en', 'instruction')
     OR fr_de AND d COLLATE "C" ~ storetopics._screen_re('fr de', 'instruction')
     OR es_it_pt AND d COLLATE "C" ~ storetopics._screen_re('es it pt', 'instruction')
     OR other AND d COLLATE "C" ~ storetopics._screen_re('other', 'instruction')
     OR s COLLATE "C" ~ storetopics._screen_re('squash', 'instruction') THEN
    RETURN 'instruction';
  END IF;
  RETURN NULL;
END $$;

-- why: one answer for every caller (render, the labeller's last check, a person looking at a rejected label).  The
-- reasons are tried in this order; the first that applies is given.  NULL in, NULL out: there is nothing to show.
-- A text that is empty or blank once invisible characters are gone is not a label: 'empty'.
CREATE OR REPLACE FUNCTION storetopics.screen(t text) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  d text;
  m text;
  s text;
BEGIN
  IF t COLLATE "C" ~ '[\u0001-\u001f\u007f-\u009f\u2028\u2029]' THEN RETURN 'control characters'; END IF;
  IF octet_length(t) > length(t) AND storetopics._screen_visible(t) <> t THEN   -- all of them are outside ASCII
    RETURN 'invisible characters';
  END IF;
  d := storetopics._screen_normal(t);
  IF btrim(d) = '' THEN RETURN 'empty'; END IF;
  m := storetopics._screen_latin(t);
  s := storetopics._screen_squash(m);
  RETURN CASE WHEN storetopics._screen_mixed(d) THEN 'mixed scripts'
              WHEN storetopics._screen_role(d) THEN 'role marker'
              WHEN storetopics._screen_url(d, m) THEN 'url'
              WHEN storetopics._screen_markup(d) THEN 'markup'
              ELSE storetopics._screen_command(d, m, s) END;
END $$;

COMMENT ON FUNCTION storetopics.screen(text) IS
  'NULL when the text may be shown to a router LLM, else why not: control characters, invisible characters, empty, '
  'mixed scripts, role marker, url, markup, routing command, instruction.  NULL for NULL (nothing to show).';

-- why: a ranked list is shown as "Main terms: a, b, c"; read in order, neighbours can spell an instruction that no
-- single word is.  Words unsafe alone go first (also NULL and blank ones).  Of the rest, read in order, each
-- shortest run of words that screen() rejects goes (a run none of whose shorter runs is rejected), and a run grows
-- over adjacent command words ("route", "always", "here", "instructions" ...), which read as part of it
-- ("instructions, route, always choose").  A list that screen() passes as a whole needs only the first step, so an
-- ordinary list costs one screen() per word and one for the list.
CREATE OR REPLACE FUNCTION storetopics.screen_words(words text[]) RETURNS int[]
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  dropped int[] := '{}';
  kept int[] := '{}';         -- positions of the words safe alone, in order
  reach int[];                -- reach[i] = j: kept[i..j] is the shortest rejected run from kept[i]
  hit boolean[];              -- hit[i]: kept[i] is part of such a run
  phrase text := '';
  n int;
  grew boolean;
  command text[] := '{route,routes,always,never,only,now,here,choose,pick,select,use,prefer,ignore,disregard,forget,'
                    'override,bypass,previous,prior,above,earlier,all,every,any,instructions,instruction,prompt,'
                    'prompts,rules,directions,system,you,your,must,this,store,tool,source,please,do,not,answer,'
                    'respond,reply,say,question,questions,queries,query,act,pretend,new,jailbreak,mode,dan,relevant,'
                    'for,the,to,of,with,from,on,as,is,are,'
                    'consignes,regles,anweisungen,anweisung,regeln,instrucciones,reglas,istruzioni,regole,instrucoes,'
                    'regras,инструкции,указания,правила,指令,指示,规则,規則,命令,ルール}';
BEGIN
  IF cardinality(words) = 0 THEN RETURN '{}'; END IF;
  FOR i IN array_lower(words, 1) .. array_upper(words, 1) LOOP
    IF coalesce(btrim(words[i]), '') = '' OR storetopics.screen(words[i]) IS NOT NULL THEN
      dropped := dropped || i;
    ELSE
      kept := kept || i;
      phrase := phrase || ' ' || words[i];
    END IF;
  END LOOP;
  n := coalesce(cardinality(kept), 0);
  IF n < 2 OR storetopics.screen(phrase) IS NULL THEN RETURN dropped; END IF;
  reach := array_fill(NULL::int, ARRAY[n + 1]);
  FOR i IN 1 .. n - 1 LOOP
    phrase := words[kept[i]];
    FOR j IN i + 1 .. n LOOP
      phrase := phrase || ' ' || words[kept[j]];
      IF storetopics.screen(phrase) IS NOT NULL THEN reach[i] := j; EXIT; END IF;
    END LOOP;
  END LOOP;
  hit := array_fill(false, ARRAY[n]);
  FOR i IN 1 .. n - 1 LOOP
    CONTINUE WHEN reach[i] IS NULL OR reach[i + 1] <= reach[i];     -- a shorter run lies inside this one
    FOR j IN i .. reach[i] LOOP hit[j] := true; END LOOP;
  END LOOP;
  LOOP
    grew := false;
    FOR i IN 1 .. n LOOP
      IF NOT hit[i] AND (hit[i - 1] OR hit[i + 1])
         AND btrim(storetopics._screen_normal(words[kept[i]])) = ANY (command) THEN
        hit[i] := true;
        grew := true;
      END IF;
    END LOOP;
    EXIT WHEN NOT grew;
  END LOOP;
  RETURN ARRAY(SELECT p FROM unnest(dropped || ARRAY(SELECT kept[i] FROM generate_series(1, n) i WHERE hit[i])) p
                ORDER BY p);
END $$;

COMMENT ON FUNCTION storetopics.screen_words(text[]) IS
  'The 1-based positions of the words of a ranked term list to leave out: each unsafe alone (screen()), or part of '
  'an instruction the words spell when read in order.  NULL for NULL; NULL and blank elements are left out.';

-- idempotent/020-generated.sql
-- ------------------------------------------------------------------------------------------------------------
-- Generated per source: the functions that evaluate what the attacher wrote
-- ------------------------------------------------------------------------------------------------------------
-- Everything an attacher writes (store, file and content expressions, the mirror target) is evaluated only inside
-- three functions generated for its source, owned by the attached table's owner and SECURITY DEFINER, as pgai's
-- generated triggers are: whoever folds, renders or writes the table (the DBA, the worker, an application role),
-- the attacher's SQL runs with the table owner's rights and no more.
--   capture_<id>()  the statement-level trigger: logs the (store, file) keys a statement touched;
--   read_<id>(...)  every read of the chunk table storetopics makes (fold's recount, the clusters' assignment, the
--                   fit's sample, representatives, surface words);
--   mirror_<id>()   the write of a summary into attach(..., mirror => ...).
-- The owner may ALTER its functions (it owns them) but not replace their bodies (no CREATE on the schema), so each
-- body starts by checking that it runs as the owner: turned into SECURITY INVOKER it would run as its caller, and
-- stops there.  That check names every operator and function with its schema: the owner may also change the
-- function's search_path.  The attacher's SQL reaches the generated bodies only as quoted literals (format %L),
-- never spliced into the CREATE statement, so no quoting trick can leave the body.

-- The name of a source's generated function of a kind (capture, read, mirror).
CREATE OR REPLACE FUNCTION storetopics._generated(p_source int, p_kind text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp
RETURN format('storetopics.%s_%s', p_kind, p_source);

-- The check every generated body starts with: run as the table's owner, or do `otherwise`.  It compares names:
-- the owner's name now (a syscache look-up by oid, so a renamed owner still passes) with the role the body runs as;
-- role names are unique, and parsing current_user back into an oid (to_regrole) cost more, on every statement the
-- capture trigger fires for.
CREATE OR REPLACE FUNCTION storetopics._owner_check_sql(src storetopics.sources, otherwise text) RETURNS text
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp
RETURN format('IF pg_catalog.pg_get_userbyid(%s::pg_catalog.oid) OPERATOR(pg_catalog.<>) CURRENT_USER THEN
    %s
  END IF;', src.owner::oid, otherwise);

-- The store key as storetopics keeps it: the expression's text, NULL when it is longer than 500 characters (keys are
-- bounded by design: they are the primary keys of the state tables; such rows are counted as skipped, like a NULL
-- key).  The key is computed once per row, in a function scan, because expressions may be subqueries.
CREATE OR REPLACE FUNCTION storetopics.max_store_key() RETURNS int
LANGUAGE sql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp
RETURN 500;

-- The row's vector as pgvector's `vector` (halfvec columns are cast).
CREATE OR REPLACE FUNCTION storetopics._embedding_sql(src storetopics.sources) RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
RETURN format('c.%I::%I.vector', src.embedding, storetopics._vector_schema());

-- The capture trigger.  INSERT and UPDATE append the distinct (store, file) keys the statement touched (an UPDATE
-- that changes none of the columns storetopics reads logs nothing: multiset difference of old and new rows); DELETE
-- appends one "rows were deleted" marker (fold finds the files by their counts); TRUNCATE a resync marker.  The same
-- function serves the triggers on files_table (they pass an argument): a files row inserted, updated or deleted
-- logs its file key with no store key (fold recounts the file wherever it is now).  Run as anyone else, it logs
-- nothing rather than fail the application's statement (the periodic count check finds what it missed).
--
-- It runs once per statement, so for an application that writes one row per statement its fixed cost is the
-- whole overhead; what it does per statement is therefore kept to one INSERT into pending:
--   * whether to NOTIFY (the source was clean) is decided by the first statement of a transaction that logs for
--     the source: the later ones see that statement's own pending rows anyway.  A transaction-local setting
--     storetopics.logged_<id> remembers it.  Anyone may set that setting, which can only suppress a NOTIFY: a hint
--     (the worker also polls), never what is logged.
--   * a statement that inserted exactly one row needs no DISTINCT (its hash aggregate cost as much again as the rest
--     of the INSERT).  The row count of the statement is not visible to a trigger function without a query over
--     new_rows; what is cheap is this backend's count of rows inserted into the table and into pending in this
--     transaction (pg_stat_get_xact_tuples_inserted).  storetopics.logged_<id> holds their difference after the
--     last statement that logged with DISTINCT; while every statement since logged one pending row for one row, it
--     has not moved, so "one more than that" means this statement inserted one row.  Anything else (other
--     sources' or other tables' logging in between, multi-row statements, a forged setting) takes the DISTINCT
--     path, or at worst logs a key twice; a key is never left out.
CREATE OR REPLACE FUNCTION storetopics._capture_body(src storetopics.sources) RETURNS text
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  IF storetopics._capture_net(src) THEN
    RETURN storetopics._capture_net_body(src);
  END IF;
  RETURN format($f$
DECLARE
  -- NOTIFY only when the source becomes dirty: a NOTIFY serialises commits on a global lock, so a burst of
  -- writers must not all send one.  The worker also polls, so a hint not sent is only a delay.
  was_clean pg_catalog.bool := false;
  -- set by this transaction's first statement that logged (see storetopics._capture_body)
  logged pg_catalog.text := pg_catalog.current_setting('storetopics.logged_%2$s', true);
BEGIN
  %1$s
  IF logged IS NULL OR logged OPERATOR(pg_catalog.=) '' THEN
    was_clean := NOT EXISTS (SELECT 1 FROM storetopics.pending WHERE source_id OPERATOR(pg_catalog.=) %2$s);
  END IF;%6$s
  IF TG_OP OPERATOR(pg_catalog.=) 'INSERT' THEN
    IF logged OPERATOR(pg_catalog.=)
       (pg_catalog.pg_stat_get_xact_tuples_inserted(TG_RELID)
        OPERATOR(pg_catalog.-) pg_catalog.pg_stat_get_xact_tuples_inserted('storetopics.pending'::pg_catalog.regclass)
        OPERATOR(pg_catalog.-) 1)::pg_catalog.text THEN
      -- one row: one key
      INSERT INTO storetopics.pending (source_id, store_key, file_key)
      SELECT %2$s, (%3$s)::pg_catalog.text, (%4$s)::pg_catalog.text FROM new_rows AS c;
      RETURN NULL;
    END IF;
    INSERT INTO storetopics.pending (source_id, store_key, file_key)
    SELECT DISTINCT %2$s, (%3$s)::pg_catalog.text, (%4$s)::pg_catalog.text FROM new_rows AS c;
  ELSIF TG_OP OPERATOR(pg_catalog.=) 'DELETE' THEN
    INSERT INTO storetopics.pending (source_id, deletes) VALUES (%2$s, true);
  ELSIF TG_OP OPERATOR(pg_catalog.=) 'UPDATE' THEN
    INSERT INTO storetopics.pending (source_id, store_key, file_key)
    SELECT DISTINCT %2$s, d.s::pg_catalog.text, d.f::pg_catalog.text FROM (%5$s) AS d;
    IF NOT FOUND THEN
      RETURN NULL;
    END IF;
  ELSE -- TRUNCATE
    INSERT INTO storetopics.pending (source_id, resync) VALUES (%2$s, true);
  END IF;
  PERFORM pg_catalog.set_config('storetopics.logged_%2$s',
    (pg_catalog.pg_stat_get_xact_tuples_inserted(TG_RELID)
     OPERATOR(pg_catalog.-) pg_catalog.pg_stat_get_xact_tuples_inserted('storetopics.pending'::pg_catalog.regclass)
    )::pg_catalog.text, true);
  IF was_clean THEN
    PERFORM pg_catalog.pg_notify('storetopics_dirty', '%2$s');
  END IF;
  RETURN NULL;
END$f$, storetopics._owner_check_sql(src, 'RETURN NULL;'), src.id, src.store_sql, src.file_sql,
    storetopics._changed_rows_sql(src), storetopics._capture_files_sql(src, false));
END $$;

-- The rows of an UPDATE whose (store, file, content, embedding) changed, old and new (multiset difference).
CREATE OR REPLACE FUNCTION storetopics._changed_rows_sql(src storetopics.sources) RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
RETURN format($q$
      (SELECT %1$s FROM old_rows AS c EXCEPT ALL SELECT %1$s FROM new_rows AS c)
      UNION ALL
      (SELECT %1$s FROM new_rows AS c EXCEPT ALL SELECT %1$s FROM old_rows AS c)$q$,
  format('%s AS s, %s AS f, %s AS t%s', src.store_sql, src.file_sql, src.content_sql,
         CASE WHEN src.embedding IS NULL THEN '' ELSE format(', c.%I::pg_catalog.text AS e', src.embedding) END));

-- The capture's part for the files_table's triggers (they pass an argument): a files row inserted, updated or deleted
-- logs its file key with no store key (fold recounts the file wherever it is now).  With the net, the keys are
-- computed in a subtransaction that writes nothing; an error logs a resync instead (a file moved between stores
-- keeps its chunk count: only a recount finds it).
CREATE OR REPLACE FUNCTION storetopics._capture_files_sql(src storetopics.sources, net boolean) RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
RETURN CASE WHEN src.files_table IS NULL THEN '' ELSE format($b$
  IF TG_NARGS OPERATOR(pg_catalog.>) 0 THEN
    %3$s
    IF TG_OP OPERATOR(pg_catalog.=) 'DELETE' THEN
      %4$s SELECT DISTINCT r.%2$I::pg_catalog.text FROM old_rows AS r%5$s;
    ELSIF TG_OP OPERATOR(pg_catalog.=) 'INSERT' THEN
      %4$s SELECT DISTINCT r.%2$I::pg_catalog.text FROM new_rows AS r%5$s;
    ELSE
      %4$s SELECT DISTINCT d.k FROM (
        (SELECT r.%2$I::pg_catalog.text AS k, r::pg_catalog.text AS v FROM old_rows AS r
         EXCEPT SELECT r.%2$I::pg_catalog.text, r::pg_catalog.text FROM new_rows AS r)
        UNION ALL
        (SELECT r.%2$I::pg_catalog.text, r::pg_catalog.text FROM new_rows AS r
         EXCEPT SELECT r.%2$I::pg_catalog.text, r::pg_catalog.text FROM old_rows AS r)) AS d%5$s;
    END IF;
    %6$s
    IF was_clean THEN
      PERFORM pg_catalog.pg_notify('storetopics_dirty', '%1$s');
    END IF;
    RETURN NULL;
  END IF;$b$, src.id, src.files_key,
  CASE WHEN net THEN 'BEGIN' ELSE '' END,
  CASE WHEN net THEN 'v_f := ARRAY(' ELSE format('INSERT INTO storetopics.pending (source_id, file_key) SELECT %s, x.k FROM (', src.id) END,
  CASE WHEN net THEN ')' ELSE ') AS x(k)' END,
  CASE WHEN net THEN format($n$
    EXCEPTION WHEN OTHERS THEN
      v_error := SQLERRM;
    END;
    IF v_error IS NOT NULL THEN
      INSERT INTO storetopics.pending (source_id, resync, error) VALUES (%1$s, true, v_error);
    ELSIF pg_catalog.cardinality(v_f) OPERATOR(pg_catalog.>) 0 THEN
      INSERT INTO storetopics.pending (source_id, file_key) SELECT %1$s, x.k FROM pg_catalog.unnest(v_f) AS x(k);
    ELSE
      RETURN NULL;
    END IF;$n$, src.id)
  ELSE 'IF NOT FOUND THEN RETURN NULL; END IF;' END) END;

-- The capture with a net: when a key is an expression (it may raise for a row: a division by zero, text that is no
-- JSON, a subquery that finds two rows) or when no event trigger keeps the keys in step with the table's DDL (a key
-- column renamed or dropped would make the capture fail).  The keys are computed inside a subtransaction that
-- writes nothing, so none of the transaction's 64 cached subtransaction ids is used up; what it computed is logged
-- after it.  Any error (not a cancel) logs a count check instead, with the error: fold finds the files by their
-- counts and records the error for the status view.  The application's statement goes through.
CREATE OR REPLACE FUNCTION storetopics._capture_net_body(src storetopics.sources) RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
RETURN format($f$
DECLARE
  was_clean pg_catalog.bool := false;
  logged pg_catalog.text := pg_catalog.current_setting('storetopics.logged_%2$s', true);
  v_s pg_catalog.text[];
  v_f pg_catalog.text[];
  v_error pg_catalog.text;
BEGIN
  %1$s
  IF logged IS NULL OR logged OPERATOR(pg_catalog.=) '' THEN
    was_clean := NOT EXISTS (SELECT 1 FROM storetopics.pending WHERE source_id OPERATOR(pg_catalog.=) %2$s);
  END IF;%6$s
  IF TG_OP OPERATOR(pg_catalog.=) 'DELETE' THEN
    INSERT INTO storetopics.pending (source_id, deletes) VALUES (%2$s, true);
  ELSIF TG_OP OPERATOR(pg_catalog.=) 'TRUNCATE' THEN
    INSERT INTO storetopics.pending (source_id, resync) VALUES (%2$s, true);
  ELSE
    BEGIN
      IF TG_OP OPERATOR(pg_catalog.=) 'UPDATE' THEN
        SELECT pg_catalog.array_agg(k.s), pg_catalog.array_agg(k.f) INTO v_s, v_f
          FROM (SELECT DISTINCT d.s::pg_catalog.text AS s, d.f::pg_catalog.text AS f FROM (%5$s) AS d) AS k;
      ELSIF logged OPERATOR(pg_catalog.=)
            (pg_catalog.pg_stat_get_xact_tuples_inserted(TG_RELID)
             OPERATOR(pg_catalog.-) pg_catalog.pg_stat_get_xact_tuples_inserted('storetopics.pending'::pg_catalog.regclass)
             OPERATOR(pg_catalog.-) 1)::pg_catalog.text THEN
        -- one row: one key
        SELECT ARRAY[(%3$s)::pg_catalog.text], ARRAY[(%4$s)::pg_catalog.text] INTO v_s, v_f FROM new_rows AS c;
      ELSE
        SELECT pg_catalog.array_agg(k.s), pg_catalog.array_agg(k.f) INTO v_s, v_f
          FROM (SELECT DISTINCT (%3$s)::pg_catalog.text AS s, (%4$s)::pg_catalog.text AS f FROM new_rows AS c) AS k;
      END IF;
    EXCEPTION WHEN OTHERS THEN
      v_error := SQLERRM;
    END;
    IF v_error IS NOT NULL THEN
      INSERT INTO storetopics.pending (source_id, deletes, error) VALUES (%2$s, true, v_error);
    ELSIF v_f IS NULL THEN
      RETURN NULL;   -- no row, or an UPDATE that changed nothing storetopics reads
    ELSE
      INSERT INTO storetopics.pending (source_id, store_key, file_key)
      SELECT %2$s, k.s, k.f FROM ROWS FROM (pg_catalog.unnest(v_s), pg_catalog.unnest(v_f)) AS k(s, f);
    END IF;
  END IF;
  PERFORM pg_catalog.set_config('storetopics.logged_%2$s',
    (pg_catalog.pg_stat_get_xact_tuples_inserted(TG_RELID)
     OPERATOR(pg_catalog.-) pg_catalog.pg_stat_get_xact_tuples_inserted('storetopics.pending'::pg_catalog.regclass)
    )::pg_catalog.text, true);
  IF was_clean THEN
    PERFORM pg_catalog.pg_notify('storetopics_dirty', '%2$s');
  END IF;
  RETURN NULL;
END$f$, storetopics._owner_check_sql(src, 'RETURN NULL;'), src.id, src.store_sql, src.file_sql,
  storetopics._changed_rows_sql(src), storetopics._capture_files_sql(src, true));

-- Whether a key of the source is an SQL expression (not a column).
CREATE OR REPLACE FUNCTION storetopics._has_expression_key(src storetopics.sources) RETURNS boolean
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
RETURN src.store_sql <> format('c.%I', src.store_key) OR src.file_sql <> format('c.%I', src.file_key)
       OR src.content_sql <> format('c.%I', src.content);

-- Whether the capture needs its net (storetopics._capture_net_body): a key is an expression, or no enabled event
-- trigger follows the DDL of attached tables (storetopics._follow_ddl).
CREATE OR REPLACE FUNCTION storetopics._capture_net(src storetopics.sources) RETURNS boolean
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
RETURN storetopics._has_expression_key(src)
       OR NOT EXISTS (SELECT 1 FROM pg_event_trigger e
                       WHERE e.evtname = 'storetopics_follow_ddl' AND e.evtenabled <> 'D');

-- Whether the capture function may run without SET search_path, under the writer's (a SET clause costs every
-- statement a save and restore of the setting and a recomputed search path: bench/README.md, "No SET search_path").
-- Its own text names everything by schema; what it cannot qualify is what the owner wrote: so only when every
-- key is a plain column, and turning each such column into text can run nothing a non-superuser wrote: the column's
-- type (its base type, for a domain: casts from domains are ignored) is built in or owned by a superuser, so only a
-- superuser can have created a cast from it.  Checked when the function is generated; ALTER TABLE on the tree
-- generates it again when the answer changed (storetopics._stamp).
CREATE OR REPLACE FUNCTION storetopics._capture_bound(src storetopics.sources) RETURNS boolean
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
  WITH RECURSIVE types AS (
    SELECT a.atttypid AS t FROM pg_attribute a
     WHERE a.attnum > 0 AND NOT a.attisdropped
       AND ((a.attrelid = src.chunks AND a.attname IN (src.store_key, src.file_key, src.content, src.embedding))
            OR (a.attrelid = src.files_table AND a.attname = src.files_key))
    UNION ALL
    -- files_table rows are compared as text whole (r::text): a cast from the table's row type is its owner's to make
    SELECT k.reltype FROM pg_class k WHERE k.oid = src.files_table
    UNION
    SELECT y.typbasetype FROM types x JOIN pg_type y ON y.oid = x.t WHERE y.typtype = 'd'
  )
  SELECT src.store_sql = format('c.%I', src.store_key) AND src.file_sql = format('c.%I', src.file_key)
         AND src.content_sql = format('c.%I', src.content)
         AND NOT EXISTS (SELECT 1 FROM types x JOIN pg_type y ON y.oid = x.t JOIN pg_roles r ON r.oid = y.typowner
                          WHERE y.typtype <> 'd' AND y.oid >= 16384 AND NOT r.rolsuper);
END;

-- The reader: read_<id>(op, files, store, args) RETURNS SETOF record, one query per op (callers name the columns).
-- Every query is fixed at generation; the arguments are only ever bound values ($1 files, $2 store, $3 args), and
-- the one piece assembled at run time (assign's cluster slots) is built from integers.
--   keys                        (store_key, file_key) of every row: a resync's list of files
--   file_counts                 (file_key, chunks): the count check
--   null_files                  (n): rows whose file key is NULL
--   terms, terms_slow (files)   (store_key, file_key, term, n, rows): fold's recount; the slow path tokenises row by
--                               row, skipping texts whose tsvector would pass 1 MB
--   means (files | store)       (store_key, file_key, dims, m): each file's mean direction
--   assign (files | store, args.clusters)   the chunks per nearest cluster, see storetopics._assign
--   sample (store, args)        (ref, file_key, e): a fit's sample, see storetopics._fit_input
--   chunks (files = refs)       (ref, file_key, text): representatives
--   texts (files, store)        (t): the texts surface words are learnt from
--   sample_texts (files, store) (file_key, t): 3 chunks of each file (chosen by content, not by row: the same
--                               texts give the same phrases however they were written), 1,500 characters each: what
--                               phrases are mined from
--   search (store, args.query, args.k, args.embedding)   (file_key, chunk, content, rank, text_rank, distance): the
--                               store's k best chunks for a query (storetopics.search checks the caller first).
--                               Full-text always: websearch_to_tsquery(ts_config, query) matched against the row's
--                               tsvector, ranked by ts_rank; the content is cut at 1,000 characters.  With an embedding
--                               (a pgvector text, `[...]`) and an embedding column, also the k nearest chunks by cosine
--                               distance (rows of another dimension left out), and the two lists fused by reciprocal
--                               rank (1/(60 + rank in each list)); rank is then that score, else ts_rank.  A text whose
--                               tsvector would pass 1 MB fails the whole query, which then runs again tokenising row by
--                               row (tsvector_or_null: such texts are left out).  Written so that an application's
--                               GIN index on to_tsvector('<ts_config>', <content column>) can serve the match.
CREATE OR REPLACE FUNCTION storetopics._reader_body(src storetopics.sources) RETURNS text
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  tbl text := src.chunks::text;
  s text := src.store_sql;
  f text := src.file_sql;
  t text := src.content_sql;
  by_files text := format('%s = ANY ($1::%s[])', src.file_sql, src.file_type);
  by_store text := format('(%s)::text = $2', src.store_sql);
  -- The store key is computed once per row (a function scan: expressions may be subqueries), NULL when longer than
  -- max_store_key().  tsv: the row's tsvector (NULL for unusable text or a NULL key); skip: 1 for a skipped row.
  -- Neither refers to the other, so the planner cannot end up tokenising a row twice.
  terms text := $q$
    SELECT k.s AS store_key, (%2$s)::text AS file_key, l.term, sum(l.n)::int AS n, count(*)::int AS rows
      FROM %1$s AS c
     CROSS JOIN LATERAL unnest(ARRAY[CASE WHEN char_length((%3$s)::text) <= storetopics.max_store_key()
                                          THEN (%3$s)::text END]) AS k(s)
     CROSS JOIN LATERAL (SELECT x.lexeme, cardinality(x.positions) FROM unnest(%4$s) AS x
                         UNION ALL
                         SELECT NULL, %5$s) AS l(term, n)
     WHERE %6$s
     GROUP BY 1, 2, 3$q$;
  fast_tsv text := format('CASE WHEN k.s IS NOT NULL AND storetopics.usable_text(%s) THEN to_tsvector(%L::regconfig, %s) END',
                          t, src.ts_config, t);
  slow_tsv text := format('storetopics.tsvector_or_null(%L::regconfig, CASE WHEN k.s IS NOT NULL THEN %s END)',
                          src.ts_config, t);
  means text := '';
  assign text[] := '{"", "", "", "", "", ""}';
  sample text := '';
  -- search: %1$s the tsvector of the row's text, %2$s the CTE v of the nearest chunks (none without an embedding)
  search text := $q$
    WITH t AS (
      SELECT x.*, pg_catalog.row_number() OVER (ORDER BY x.r DESC, x.chunk) AS n FROM (
        SELECT (%3$s)::pg_catalog.text AS file_key, %4$s AS chunk,
               pg_catalog.left((%5$s)::pg_catalog.text, 1000) AS content,
               pg_catalog.ts_rank(%1$s, pg_catalog.websearch_to_tsquery(%6$L::pg_catalog.regconfig,
                                                                         $3 OPERATOR(pg_catalog.->>) 'query'))::pg_catalog.float8 AS r
          FROM %7$s AS c
         WHERE %8$s
           AND %1$s OPERATOR(pg_catalog.@@) pg_catalog.websearch_to_tsquery(%6$L::pg_catalog.regconfig,
                                                                           $3 OPERATOR(pg_catalog.->>) 'query')
         ORDER BY 4 DESC, 2
         LIMIT ($3 OPERATOR(pg_catalog.->>) 'k')::pg_catalog.int4) x),
    v AS (%2$s)
    SELECT coalesce(t.file_key, v.file_key), coalesce(t.chunk, v.chunk), coalesce(t.content, v.content),
           CASE WHEN $3 OPERATOR(pg_catalog.->>) 'embedding' IS NULL THEN t.r
                ELSE coalesce(1 OPERATOR(pg_catalog./) (60 OPERATOR(pg_catalog.+) t.n)::pg_catalog.float8, 0)
                     OPERATOR(pg_catalog.+)
                     coalesce(1 OPERATOR(pg_catalog./) (60 OPERATOR(pg_catalog.+) v.n)::pg_catalog.float8, 0) END,
           t.r, v.d
      FROM t FULL JOIN v ON v.chunk OPERATOR(pg_catalog.=) t.chunk
     ORDER BY 4 DESC, 2
     LIMIT ($3 OPERATOR(pg_catalog.->>) 'k')::pg_catalog.int4$q$;
  nearest text := 'SELECT NULL::pg_catalog.text AS file_key, NULL::pg_catalog.text AS chunk, '
                  'NULL::pg_catalog.text AS content, NULL::pg_catalog.float8 AS d, NULL::pg_catalog.int8 AS n WHERE false';
  vs name;
  e text;
BEGIN
  IF src.embedding IS NOT NULL THEN
    vs := storetopics._vector_schema();
    e := storetopics._embedding_sql(src);
    means := format($q$
      SELECT (%1$s)::text, (%2$s)::text, %3$I.vector_dims(%4$s), %3$I.l2_normalize(%3$I.sum(%3$I.l2_normalize(%4$s)))
        FROM %5$s AS c
       WHERE (%1$s) IS NOT NULL AND %4$s IS NOT NULL AND $q$, s, f, vs, e, tbl);
    assign := storetopics._assign_sql(src);
    sample := format($q$
      SELECT %1$s AS ref, (%2$s)::text AS file_key, %3$s AS e
        FROM %4$s AS c $q$, storetopics._chunk_ref_sql(src.chunks), f, e, tbl);
    nearest := format($q$
      SELECT x.*, pg_catalog.row_number() OVER (ORDER BY x.d, x.chunk) AS n FROM (
        SELECT (%1$s)::pg_catalog.text AS file_key, %2$s AS chunk,
               pg_catalog.left((%3$s)::pg_catalog.text, 1000) AS content,
               (%4$s OPERATOR(%5$I.<=>) ($3 OPERATOR(pg_catalog.->>) 'embedding')::%5$I.vector)::pg_catalog.float8 AS d
          FROM %6$s AS c
         WHERE $3 OPERATOR(pg_catalog.->>) 'embedding' IS NOT NULL AND %7$s AND %4$s IS NOT NULL
           AND %5$I.vector_dims(%4$s)
               OPERATOR(pg_catalog.=) %5$I.vector_dims(($3 OPERATOR(pg_catalog.->>) 'embedding')::%5$I.vector)
         ORDER BY %4$s OPERATOR(%5$I.<=>) ($3 OPERATOR(pg_catalog.->>) 'embedding')::%5$I.vector
         LIMIT ($3 OPERATOR(pg_catalog.->>) 'k')::pg_catalog.int4) x$q$,
      f, storetopics._chunk_ref_sql(src.chunks), t, e, vs, tbl, by_store);
  END IF;
  RETURN format($f$
DECLARE
  v_slots int;
BEGIN
  %1$s
  CASE op
  WHEN 'keys' THEN RETURN QUERY EXECUTE %2$L;
  WHEN 'file_counts' THEN RETURN QUERY EXECUTE %3$L;
  WHEN 'null_files' THEN RETURN QUERY EXECUTE %4$L;
  WHEN 'terms' THEN RETURN QUERY EXECUTE %5$L USING files;
  WHEN 'terms_slow' THEN RETURN QUERY EXECUTE %6$L USING files;
  WHEN 'texts' THEN RETURN QUERY EXECUTE %7$L USING files, store;
  WHEN 'chunks' THEN RETURN QUERY EXECUTE %8$L USING files;
  WHEN 'sample_texts' THEN RETURN QUERY EXECUTE %18$L USING files, store;
  WHEN 'means' THEN
    RETURN QUERY EXECUTE %9$L OPERATOR(pg_catalog.||) CASE WHEN files IS NULL THEN %10$L ELSE %11$L END
                                 OPERATOR(pg_catalog.||) ' GROUP BY 1, 2, 3' USING files, store;
  WHEN 'assign' THEN
    -- one least() argument per cluster slot: the most clusters a store of the call has
    v_slots := (SELECT pg_catalog.max(x.n) FROM (
                  SELECT pg_catalog.count(*) AS n
                    FROM pg_catalog.jsonb_array_elements(args OPERATOR(pg_catalog.->) 'clusters') AS k
                   GROUP BY k OPERATOR(pg_catalog.->>) 'store_key') AS x);
    RETURN QUERY EXECUTE %12$L OPERATOR(pg_catalog.||) CASE WHEN files IS NULL THEN %22$L ELSE %21$L END
      OPERATOR(pg_catalog.||) %23$L
      OPERATOR(pg_catalog.||) coalesce((SELECT pg_catalog.string_agg(pg_catalog.format(%13$L, i, i), ', ')
                                          FROM pg_catalog.generate_series(1, v_slots) AS i), 'NULL::float8[]')
      OPERATOR(pg_catalog.||) %14$L OPERATOR(pg_catalog.||) CASE WHEN files IS NULL THEN %10$L ELSE %11$L END
      OPERATOR(pg_catalog.||) %15$L
      USING files, store, args;
  WHEN 'sample' THEN
    RETURN QUERY EXECUTE %16$L OPERATOR(pg_catalog.||)
      CASE WHEN args OPERATOR(pg_catalog.->>) 'percent' IS NULL THEN ''
           ELSE 'TABLESAMPLE SYSTEM (($3 ->> ''percent'')::float8) REPEATABLE (($3 ->> ''seed'')::int)' END
      OPERATOR(pg_catalog.||) %17$L
      USING files, store, args;
  WHEN 'search' THEN
    -- The fused list is sorted before its first row comes out, so a query that fails has returned no row yet.
    BEGIN
      RETURN QUERY EXECUTE %19$L USING files, store, args;
    EXCEPTION WHEN program_limit_exceeded THEN
      RETURN QUERY EXECUTE %20$L USING files, store, args;
    END;
  ELSE
    RAISE EXCEPTION 'storetopics: unknown read %%', op;
  END CASE;
END$f$,
    storetopics._owner_check_sql(src, format(
      'RAISE EXCEPTION %L USING ERRCODE = %L, HINT = %L;',
      format('storetopics: source %s: %s no longer runs as the owner of %s (it was altered)', src.id,
             storetopics._generated(src.id, 'read'), src.chunks),
      'insufficient_privilege', format('Detach %s and attach it again.', src.chunks))),
    format('SELECT DISTINCT (%s)::text, (%s)::text FROM %s AS c', s, f, tbl),
    format('SELECT (%s)::text, count(*) FROM %s AS c GROUP BY 1', f, tbl),
    format('SELECT count(*) FROM %s AS c WHERE (%s) IS NULL', tbl, f),
    format(terms, tbl, f, s, fast_tsv, format('(NOT storetopics.usable_text(%s))::int', t), by_files),
    format(terms, tbl, f, s, slow_tsv,
           format('(%s IS NULL AND (k.s IS NOT NULL OR NOT storetopics.usable_text(%s)))::int', slow_tsv, t), by_files),
    format('SELECT (%s)::text FROM %s AS c WHERE %s AND %s', t, tbl, by_files, by_store),
    format('SELECT %s, (%s)::text, left(%s, 1000) FROM %s AS c WHERE %s', storetopics._chunk_ref_sql(src.chunks),
           f, t, tbl, storetopics._chunk_lookup_sql(src.chunks)),
    means, by_store, by_files,
    assign[1], format('ARRAY[ks.cen[%%s] OPERATOR(%I.<#>) q.q, %%s]', coalesce(vs, 'public')), assign[5], assign[6],
    sample, format($q$
       WHERE %s AND %s IS NOT NULL AND (%s) IS NOT NULL
       ORDER BY hashtext(%s || ':' || ($3 ->> 'seed')), 1
       LIMIT ($3 ->> 'limit')::int$q$, by_store, e, f, storetopics._chunk_ref_sql(src.chunks)),
    format($q$
      SELECT x.f, x.t FROM (SELECT (%1$s)::text AS f, left((%2$s)::text, 1500) AS t,
                                   row_number() OVER (PARTITION BY (%1$s)::text
                                                      ORDER BY pg_catalog.md5((%2$s)::text), %3$s) AS r
                              FROM %4$s AS c WHERE %5$s AND %6$s) x
       WHERE x.r <= 3$q$, f, t, storetopics._chunk_ref_sql(src.chunks), tbl, by_files, by_store),
    format(search, format('pg_catalog.to_tsvector(%L::pg_catalog.regconfig, %s)', src.ts_config, t), nearest, f,
           storetopics._chunk_ref_sql(src.chunks), t, src.ts_config, tbl, by_store),
    format(search, format('storetopics.tsvector_or_null(%L::pg_catalog.regconfig, %s)', src.ts_config, t), nearest, f,
           storetopics._chunk_ref_sql(src.chunks), t, src.ts_config, tbl, by_store),
    assign[2], assign[3], assign[4]);
END $$;

-- The mirror: UPDATE mirror SET mirror_column = summary WHERE mirror_key::text = store (NULL once the store is gone).
CREATE OR REPLACE FUNCTION storetopics._mirror_body(src storetopics.sources) RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
RETURN format($f$
BEGIN
  %s
  UPDATE %s SET %I = summary WHERE %I::pg_catalog.text OPERATOR(pg_catalog.=) store AND %I IS DISTINCT FROM summary;
END$f$,
  storetopics._owner_check_sql(src, format('RAISE EXCEPTION %L USING ERRCODE = %L;',
    format('storetopics: %s no longer runs as the owner of %s (it was altered)',
           storetopics._generated(src.id, 'mirror'), src.chunks), 'insufficient_privilege')),
  src.mirror, src.mirror_column, src.mirror_key, src.mirror_column);

-- The reader's view of a source that reads row by row (sources.safe_keys, after a key expression raised for some
-- row): each expression key is evaluated by try_<id>, which gives NULL for a row it raises for (the row is then
-- counted as skipped).  Slower (a subtransaction per row and key), so only after a fold met such a row.
CREATE OR REPLACE FUNCTION storetopics._safe_reader_source(src storetopics.sources) RETURNS storetopics.sources
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  fn text := storetopics._generated(src.id, 'try');
BEGIN
  IF src.store_sql <> format('c.%I', src.store_key) THEN
    src.store_sql := format('%s(c, 1)', fn);
  END IF;
  IF src.file_sql <> format('c.%I', src.file_key) THEN
    src.file_sql := format('(%s(c, 2))::%s', fn, src.file_type);
  END IF;
  IF src.content_sql <> format('c.%I', src.content) THEN
    src.content_sql := format('%s(c, 3)', fn);
  END IF;
  RETURN src;
END $$;

-- try_<id>(c, k): key k (1 store, 2 file, 3 content) of a row as text, NULL when its expression raises a data error
-- (or finds two rows in a subquery) for that row.  Other errors (a right missing, a column gone) are the source's,
-- and fail the read.
CREATE OR REPLACE FUNCTION storetopics._try_body(src storetopics.sources) RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
RETURN format($f$
BEGIN
  CASE k
  WHEN 1 THEN RETURN (%s)::pg_catalog.text;
  WHEN 2 THEN RETURN (%s)::pg_catalog.text;
  ELSE RETURN (%s)::pg_catalog.text;
  END CASE;
EXCEPTION WHEN data_exception OR cardinality_violation THEN
  RETURN NULL;
END$f$, src.store_sql, src.file_sql, src.content_sql);

-- (Re)creates a source's generated functions from its row, owned by the table's owner: at attach, and whenever what
-- they were made from changed (storetopics._reader).  The triggers that call capture_<id> keep pointing at it
-- (CREATE OR REPLACE keeps the function).  Only PUBLIC loses EXECUTE; the worker roles get it on the reader and the
-- mirror.
CREATE OR REPLACE FUNCTION storetopics._generate(src storetopics.sources) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  g record;
  w record;
  fn text;
BEGIN
  FOR g IN SELECT * FROM (VALUES
      ('capture', '', '', 'trigger', storetopics._capture_body(src), true),
      ('read', 'op text, files text[], store text, args jsonb', 'text, text[], text, jsonb', 'SETOF record',
       storetopics._reader_body(CASE WHEN src.safe_keys THEN storetopics._safe_reader_source(src) ELSE src END), true),
      ('mirror', 'store text, summary text', 'text, text', 'void',
       CASE WHEN EXISTS (SELECT 1 FROM pg_class m WHERE m.oid = src.mirror) THEN storetopics._mirror_body(src) END,
       true),
      -- runs as its caller: the reader, as the owner
      ('try', 'c record, k int', 'record, int', 'text', storetopics._try_body(src), false))
      AS x(kind, params, types, returns, body, definer)
    -- (a mirror table dropped since: no mirror function; render warns, as when a column of it went)
    WHERE (x.kind <> 'mirror' OR EXISTS (SELECT 1 FROM pg_class m WHERE m.oid = src.mirror))
      AND (x.kind <> 'try' OR storetopics._has_expression_key(src)) LOOP
    fn := format('%s(%s)', storetopics._generated(src.id, g.kind), g.types);
    EXECUTE format('CREATE OR REPLACE FUNCTION %s(%s) RETURNS %s LANGUAGE plpgsql %s %s AS %L',
                   storetopics._generated(src.id, g.kind), g.params, g.returns,
                   CASE WHEN g.definer THEN 'SECURITY DEFINER' ELSE '' END,
                   CASE WHEN g.kind = 'capture' AND storetopics._capture_bound(src) THEN ''
                        ELSE 'SET search_path = pg_catalog, pg_temp' END, g.body);
    EXECUTE format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', fn);
    -- DROP EXTENSION storetopics must not leave triggers behind that would fail the application's writes.
    IF EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'storetopics') THEN
      EXECUTE format('ALTER FUNCTION %s DEPENDS ON EXTENSION storetopics', fn);
    END IF;
    IF g.kind IN ('read', 'mirror') THEN
      FOR w IN SELECT DISTINCT x.role FROM storetopics.grants x WHERE x.kind = 'worker' LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %s', fn, w.role);
      END LOOP;
    END IF;
    EXECUTE format('ALTER FUNCTION %s OWNER TO %s', fn, src.owner);
  END LOOP;
  -- what the generated functions do as the owner
  EXECUTE format('GRANT USAGE ON SCHEMA storetopics TO %s', src.owner);
  EXECUTE format('GRANT INSERT (source_id, store_key, file_key, resync, deletes, error), SELECT (source_id) '
                 'ON storetopics.pending TO %s', src.owner);
  EXECUTE format('GRANT SELECT ON storetopics.file_means TO %s', src.owner);
  -- and what it may read as the owner: its stores, in catalog() and route()
  PERFORM storetopics._grant_routing(src.owner::text);
END $$;

-- What a source's generated functions are made from, besides its row: the installed version and build, the tables' names,
-- columns and types, the primary key, the partitions, whether the capture needs its net.  When this changes (a
-- table renamed, a column's type changed, a partition added, an upgrade) they are made again at the next use, also
-- where no event trigger saw the DDL.
CREATE OR REPLACE FUNCTION storetopics._stamp(src storetopics.sources) RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
RETURN storetopics._version() || ' ' || md5(concat_ws('|', storetopics._build(), src.chunks::text,
  src.files_table::text, src.mirror::text,
  src.safe_keys, storetopics._capture_net(src), storetopics._capture_bound(src),
  storetopics._chunk_ref_sql(src.chunks), storetopics._tree(src.chunks)::text,
  (SELECT string_agg(concat_ws(' ', a.attrelid, a.attnum, a.attname, a.atttypid), ',' ORDER BY a.attrelid, a.attnum)
     FROM pg_attribute a
    WHERE a.attrelid IN (src.chunks, src.files_table) AND a.attnum > 0 AND NOT a.attisdropped)));

-- The name of a source's reader, made current first (storetopics._stamp).  Generated functions must not become
-- members of the extension (pg_dump would leave out what the application's triggers call), so an upgrade cannot
-- replace them: they are made again at their first use after it.
CREATE OR REPLACE FUNCTION storetopics._reader(p_source int) RETURNS text
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  src storetopics.sources;
BEGIN
  SELECT * INTO src FROM storetopics.sources s WHERE s.id = p_source;
  IF FOUND AND src.generated IS DISTINCT FROM storetopics._stamp(src)
     AND EXISTS (SELECT 1 FROM pg_class c WHERE c.oid = src.chunks) THEN
    PERFORM storetopics._regenerate(p_source, true);
  END IF;
  RETURN storetopics._generated(p_source, 'read');
END $$;

-- The current name of each plain key's column (by its attnum: a renamed column is followed); a column that was
-- dropped is an error.  The expressions are left as they are (storetopics._check_keys parses them again).
CREATE OR REPLACE FUNCTION storetopics._follow_columns(src storetopics.sources) RETURNS storetopics.sources
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_names text[] := ARRAY[src.store_key, src.file_key, src.content, src.embedding, src.files_key];
  v_what text[] := ARRAY['store_key', 'file_key', 'content', 'embedding', 'files_key'];
  v_name name;
BEGIN
  FOR i IN 1 .. 5 LOOP
    CONTINUE WHEN src.key_attnums[i] IS NULL;
    SELECT a.attname INTO v_name FROM pg_attribute a
     WHERE a.attrelid = CASE WHEN i = 5 THEN src.files_table ELSE src.chunks END AND a.attnum = src.key_attnums[i]
       AND NOT a.attisdropped;
    IF v_name IS NULL THEN
      RAISE EXCEPTION 'storetopics: the column % of % (source %) was dropped', v_what[i],
        CASE WHEN i = 5 THEN src.files_table ELSE src.chunks END, src.id
        USING ERRCODE = 'undefined_column',
              HINT = format('Detach it (SELECT storetopics.detach(%L)) and attach it again with another %s.',
                            src.chunks, v_what[i]);
    END IF;
    v_names[i] := v_name;
  END LOOP;
  src.store_key := v_names[1];
  src.file_key := v_names[2];
  src.content := v_names[3];
  src.embedding := v_names[4];
  src.files_key := v_names[5];
  IF src.key_attnums[1] IS NOT NULL THEN src.store_sql := format('c.%I', v_names[1]); END IF;
  IF src.key_attnums[2] IS NOT NULL THEN src.file_sql := format('c.%I', v_names[2]); END IF;
  IF src.key_attnums[3] IS NOT NULL THEN src.content_sql := format('c.%I', v_names[3]); END IF;
  RETURN src;
END $$;

-- Makes a source's generated functions and triggers again, after following its columns and checking its keys: an
-- error here (a key that no longer fits the table) refuses the DDL that caused it (storetopics._follow_ddl), or
-- fails the fold with what to do.  recount: check every file's count at the next fold (rows no trigger saw: a
-- partition attached with its rows; file keys whose text changed with their column's type).  SECURITY DEFINER: only
-- the extension's owner creates in the schema; workers may call it, tenants may not.
CREATE OR REPLACE FUNCTION storetopics._regenerate(p_source int, recount boolean DEFAULT false) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  src storetopics.sources;
  v_was text := coalesce(current_setting('storetopics.in_ddl', true), '');
BEGIN
  SELECT * INTO src FROM storetopics.sources s WHERE s.id = p_source FOR UPDATE;
  IF NOT FOUND OR NOT EXISTS (SELECT 1 FROM pg_class c WHERE c.oid = src.chunks) THEN
    RETURN;
  END IF;
  PERFORM set_config('storetopics.in_ddl', 'on', true);
  src := storetopics._follow_columns(src);
  src.file_type := storetopics._check_keys(src.chunks, src.store_key, src.file_key, src.content, src.embedding,
                                           src.files_table, src.files_key, format('source %s', src.id));
  IF src.generated IS DISTINCT FROM storetopics._stamp(src) THEN
    PERFORM storetopics._generate(src);
    PERFORM storetopics._create_triggers(src);
    UPDATE storetopics.sources s
       SET store_key = src.store_key, file_key = src.file_key, content = src.content, embedding = src.embedding,
           files_key = src.files_key, store_sql = src.store_sql, file_sql = src.file_sql,
           content_sql = src.content_sql, file_type = src.file_type, generated = storetopics._stamp(src)
     WHERE s.id = p_source;
    IF recount THEN
      INSERT INTO storetopics.pending (source_id, deletes, logged_by) VALUES (src.id, true, src.owner);
    END IF;
  END IF;
  PERFORM set_config('storetopics.in_ddl', v_was, true);
END $$;

-- Drops a source's generated functions (with the triggers that call them).
CREATE OR REPLACE FUNCTION storetopics._drop_generated(p_source int) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  EXECUTE format('DROP FUNCTION IF EXISTS %s() CASCADE', storetopics._generated(p_source, 'capture'));
  EXECUTE format('DROP FUNCTION IF EXISTS %s(text, text[], text, jsonb)', storetopics._generated(p_source, 'read'));
  EXECUTE format('DROP FUNCTION IF EXISTS %s(text, text)', storetopics._generated(p_source, 'mirror'));
  EXECUTE format('DROP FUNCTION IF EXISTS %s(record, int)', storetopics._generated(p_source, 'try'));
END $$;

-- What \df+ shows a DBA.
COMMENT ON FUNCTION storetopics.max_store_key() IS
  'The longest store key kept, in characters (500); rows with a longer one are counted as skipped.';

-- idempotent/030-attach.sql
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
  DELETE FROM storetopics.store_terms WHERE source_id = p_source;
  DELETE FROM storetopics.store_state WHERE source_id = p_source;
  DELETE FROM storetopics.clusters WHERE source_id = p_source;
  DELETE FROM storetopics.label_ledger WHERE source_id = p_source;
  DELETE FROM storetopics.grants WHERE source_id = p_source;
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
CREATE OR REPLACE FUNCTION storetopics.detach_source(p_source int) RETURNS boolean
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
COMMENT ON FUNCTION storetopics.detach_source(int) IS
  'Detach a source by id (also when its table was dropped): triggers, generated functions and state go.';

CREATE OR REPLACE FUNCTION storetopics.detach(chunks regclass) RETURNS boolean
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
RETURN coalesce((SELECT storetopics.detach_source(s.id) FROM storetopics.sources s WHERE s.chunks = detach.chunks),
                false);
COMMENT ON FUNCTION storetopics.detach(regclass) IS
  'Detach a table: its triggers, generated functions and summaries go; the table is left as it is.';

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
                 'storetopics.detach_source(int), '
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

-- idempotent/040-fold.sql
-- ------------------------------------------------------------------------------------------------------------
-- Fold: bring the keyword state up to date with the logged changes
-- ------------------------------------------------------------------------------------------------------------
-- fold(source) recounts at most max_files touched files of one source from the live rows and applies the
-- difference old -> new to the store-wide state.  A recount is absolute, so folding is idempotent and exact whatever
-- happened in between.  Serialised per source by a row lock on storetopics.sources (application writers never take
-- it).  Every read of the chunk table goes through the source's reader (read_<id>), which runs as the table's owner.
-- Steps: _fold_source (lock, checks, forged events), _fold_resync, _fold_check_counts, _fold_claim, _fold_recount,
-- _fold_apply.  Returns the number of files recounted (0 = nothing was pending).
-- (jit off here and in apply_fit: compiling the assignment's expressions cost more than it saved.  Custom plans: a
-- batch's file keys are an array; planned as a constant, `= ANY` is hashed, as a parameter of a generic plan it is
-- searched row by row.  bench/README.md has the figures.)
CREATE OR REPLACE FUNCTION storetopics.fold(p_source int, max_files int DEFAULT 5000) RETURNS int
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp SET work_mem = '128MB' SET jit = off
  SET plan_cache_mode = force_custom_plan AS $$
BEGIN
  BEGIN
    RETURN storetopics._fold(p_source, max_files);
  EXCEPTION WHEN data_exception OR cardinality_violation THEN
    -- a key expression raised for some row: the source is read row by row from now on, and the fold runs again
    IF NOT storetopics._read_row_by_row(p_source, SQLERRM) THEN
      RAISE;
    END IF;
  END;
  RETURN storetopics._fold(p_source, max_files);
END $$;

CREATE OR REPLACE FUNCTION storetopics._fold(p_source int, max_files int) RETURNS int
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  src storetopics.sources := storetopics._fold_source(p_source);
  v_files text[];
  v_n int;
BEGIN
  IF EXISTS (SELECT 1 FROM storetopics.pending WHERE source_id = p_source AND resync) THEN
    PERFORM storetopics._fold_resync(src);
  END IF;
  PERFORM storetopics._fold_check_counts(src);
  v_files := storetopics._fold_claim(src, max_files);
  IF cardinality(v_files) > 0 THEN
    PERFORM storetopics._fold_recount(src, v_files);
    v_n := storetopics._fold_apply(src, v_files);
  END IF;
  UPDATE storetopics.sources SET folded_at = now() WHERE id = p_source;
  -- (a first backfill: without statistics the planner took the state for "one row"; see _analyze_if_stale)
  PERFORM storetopics._analyze_if_stale(coalesce(v_n, 0));
  RETURN cardinality(v_files);
END $$;

-- A key expression raised a data error (a division by zero, text that is no JSON, a subquery that found two rows)
-- for some row: from now on the source's reader evaluates its expression keys row by row, catching such errors
-- (the rows count as skipped), and status shows the error.  false when it already does, or has no expression key
-- (then the error is not a row's).
CREATE OR REPLACE FUNCTION storetopics._read_row_by_row(p_source int, p_error text) RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  UPDATE storetopics.sources s SET safe_keys = true, key_error = 'a key raised for a row: ' || p_error,
         key_error_at = now()
   WHERE s.id = p_source AND NOT s.safe_keys AND storetopics._has_expression_key(s);
  IF NOT FOUND THEN
    RETURN false;
  END IF;
  RAISE WARNING 'storetopics: source %: a key expression raised "%" for a row; its rows are read one by one from '
    'now on, and rows it raises for are counted as skipped', p_source, p_error
    USING HINT = 'Fix the expression or the rows, then run storetopics.resync() to read them set-based again.';
  PERFORM storetopics._regenerate(p_source);
  RETURN true;
END $$;

COMMENT ON FUNCTION storetopics.fold(int, int) IS
  'Recount up to max_files files of a source whose rows changed and apply the difference to its stores; returns '
  'the number of files recounted (0: nothing pending).  Exact and idempotent; safe from any number of sessions.';

-- The source, locked for this fold, if it can be folded: its table exists and still has the owner its generated
-- functions run as.  Events logged by a role that may not act as that owner are dropped: the capture function logs
-- as the owner, fold and resync() as the owner too, so such rows were forged (a tenant writing another's source id).
CREATE OR REPLACE FUNCTION storetopics._fold_source(p_source int) RETURNS storetopics.sources
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  src storetopics.sources;
  v_owner oid;
BEGIN
  SELECT * INTO src FROM storetopics.sources WHERE id = p_source FOR UPDATE;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'storetopics: no source %', p_source USING ERRCODE = 'undefined_object';
  END IF;
  SELECT c.relowner INTO v_owner FROM pg_class c WHERE c.oid = src.chunks;
  IF v_owner = src.owner THEN
    PERFORM storetopics._reader(p_source);   -- its generated functions made current
  END IF;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'storetopics: the table of source % was dropped', p_source USING ERRCODE = 'undefined_table',
      HINT = format('Forget it with SELECT storetopics.detach_source(%s).', p_source);
  ELSIF v_owner <> src.owner THEN
    RAISE EXCEPTION 'storetopics: source %: the owner of % is now %, not % who attached it', p_source, src.chunks,
      v_owner::regrole, src.owner USING ERRCODE = 'insufficient_privilege',
      HINT = format('Detach %s and attach it again as its new owner.', src.chunks);
  END IF;
  DELETE FROM storetopics.pending p
   WHERE p.source_id = p_source
     AND p.logged_by IN (SELECT x.r FROM (SELECT DISTINCT q.logged_by AS r FROM storetopics.pending q
                                          WHERE q.source_id = p_source) x
                          WHERE NOT pg_has_role(x.r, src.owner, 'USAGE'));
  RETURN src;
END $$;

-- The capture could not key a statement's rows (it logged a count check or a resync instead, with the error, and the
-- statement went through): recorded for the status view, and said.
CREATE OR REPLACE FUNCTION storetopics._note_capture_error(p_source int, p_error text, p_at timestamptz) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  IF p_error IS NULL THEN
    RETURN;
  END IF;
  UPDATE storetopics.sources SET key_error = 'the capture trigger could not key a statement''s rows: ' || p_error,
         key_error_at = p_at
   WHERE id = p_source;
  RAISE WARNING 'storetopics: source %: the capture trigger could not key a statement''s rows at %: %', p_source, p_at,
    p_error USING HINT = 'The statement went through; its files are found by their counts.  status shows the error.';
END $$;

-- Fold step 1 (attach, TRUNCATE, resync()): forget the source's state and log every live file, folded in batches.
CREATE OR REPLACE FUNCTION storetopics._fold_resync(src storetopics.sources) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  r record;
BEGIN
  WITH d AS (DELETE FROM storetopics.pending WHERE source_id = src.id AND (resync OR deletes) RETURNING logged_at, error)
  SELECT d.error, d.logged_at INTO r FROM d WHERE d.error IS NOT NULL ORDER BY d.logged_at DESC LIMIT 1;
  PERFORM storetopics._note_capture_error(src.id, r.error, r.logged_at);
  PERFORM storetopics._catalog_move(src.id, storetopics._catalog(src.id), NULL);
  DELETE FROM storetopics.file_terms WHERE source_id = src.id;
  DELETE FROM storetopics.store_terms WHERE source_id = src.id;
  UPDATE storetopics.store_state SET files = 0, chunks = 0, words = 0, skipped = 0, other_dim = 0, folded_at = now(),
         version = version + 1
   WHERE source_id = src.id;
  UPDATE storetopics.clusters SET chunks = 0, files = 0, outliers = 0, outliers_at_fit = 0 WHERE source_id = src.id;
  EXECUTE format('INSERT INTO storetopics.pending (source_id, store_key, file_key, logged_by) '
                 'SELECT $1, r.s, r.f, $2 FROM %s(''keys'', NULL, NULL, NULL) AS r(s text, f text)',
                 storetopics._generated(src.id, 'read'))
    USING src.id, src.owner;
  UPDATE storetopics.sources SET null_key_rows = 0, store_count = 0, file_count = 0 WHERE id = src.id;
END $$;

-- Fold step 2 (rows were deleted, or the periodic check asked): every file whose live chunk count differs from the
-- one folded is logged for a recount.  Only a DELETE changes a file's count without logging the file, unless
-- triggers did not fire (session_replication_role = replica, a partition attached with its rows): then a file is
-- live but unknown, which the same comparison finds.  One pass over the file keys (an index-only scan with an index
-- on the file key); it also counts the rows whose file key is NULL.
CREATE OR REPLACE FUNCTION storetopics._fold_check_counts(src storetopics.sources) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_at timestamptz;
  v_error text;
  v_error_at timestamptz;
BEGIN
  WITH d AS (DELETE FROM storetopics.pending WHERE source_id = src.id AND deletes RETURNING logged_at, error)
  SELECT max(d.logged_at), (array_agg(d.error ORDER BY d.logged_at DESC) FILTER (WHERE d.error IS NOT NULL))[1],
         max(d.logged_at) FILTER (WHERE d.error IS NOT NULL)
    INTO v_at, v_error, v_error_at FROM d;
  IF v_at IS NULL THEN
    RETURN;
  END IF;
  PERFORM storetopics._note_capture_error(src.id, v_error, v_error_at);
  EXECUTE format('CREATE TEMP TABLE storetopics_live ON COMMIT DROP AS '
                 'SELECT * FROM %s(''file_counts'', NULL, NULL, NULL) AS r(file_key text, chunks bigint)',
                 storetopics._generated(src.id, 'read'));
  UPDATE storetopics.sources
     SET null_key_rows = (SELECT coalesce(sum(l.chunks), 0) FROM pg_temp.storetopics_live l WHERE l.file_key IS NULL),
         checked_at = now()
   WHERE id = src.id;
  -- logged when the event was: the files are as old as the events that touched them
  INSERT INTO storetopics.pending (source_id, file_key, logged_at, logged_by)
  SELECT src.id, coalesce(f.file_key, l.file_key), v_at, src.owner
    FROM (SELECT f.file_key, sum(f.chunks) AS chunks FROM storetopics.file_terms f
           WHERE f.source_id = src.id GROUP BY 1) f
    FULL JOIN (SELECT * FROM pg_temp.storetopics_live WHERE file_key IS NOT NULL) l ON l.file_key = f.file_key
   WHERE l.chunks IS DISTINCT FROM f.chunks;
  DROP TABLE pg_temp.storetopics_live;
END $$;

-- Fold step 3: claim a batch of touched files (and the events that name none).  Returns the file keys.
CREATE OR REPLACE FUNCTION storetopics._fold_claim(src storetopics.sources, max_files int) RETURNS text[]
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_files text[];
  v_null_keys boolean;
BEGIN
  v_files := ARRAY(SELECT DISTINCT file_key FROM storetopics.pending
                    WHERE source_id = src.id AND file_key IS NOT NULL ORDER BY 1 LIMIT max_files);
  -- One statement: a NULL-key event committed between a check and the DELETE would be lost.
  WITH d AS (DELETE FROM storetopics.pending
              WHERE source_id = src.id
                AND (file_key = ANY (v_files) OR (file_key IS NULL AND NOT resync AND NOT deletes))
             RETURNING file_key)
  SELECT coalesce(bool_or(d.file_key IS NULL), false) INTO v_null_keys FROM d;
  IF v_null_keys THEN
    EXECUTE format('UPDATE storetopics.sources SET null_key_rows = (SELECT r.n FROM %s(''null_files'', NULL, NULL, '
                   'NULL) AS r(n bigint)) WHERE id = $1', storetopics._generated(src.id, 'read'))
      USING src.id;
  END IF;
  RETURN v_files;
END $$;

-- Fold step 4: recount the files from the live rows into pg_temp.storetopics_new_files: per (store, file) the
-- counters, the term/count arrays and the chunks per cluster.  The reader's recount is one parallel scan (the
-- planner takes to_tsvector for cheap, so parallel plans are made free for it).  A text whose tsvector would pass
-- 1 MB fails the batch: it is redone row by row, skipping such rows.
CREATE OR REPLACE FUNCTION storetopics._fold_recount(src storetopics.sources, p_files text[]) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_op text := 'terms';
  v_saved text[] := ARRAY[current_setting('parallel_setup_cost'), current_setting('parallel_tuple_cost'),
                          current_setting('min_parallel_table_scan_size'), current_setting('enable_sort')];
BEGIN
  -- (dropped only when there: DROP ... IF EXISTS would send the client a NOTICE each time)
  IF to_regclass('pg_temp.storetopics_new_terms') IS NOT NULL THEN DROP TABLE pg_temp.storetopics_new_terms; END IF;
  IF to_regclass('pg_temp.storetopics_new_files') IS NOT NULL THEN DROP TABLE pg_temp.storetopics_new_files; END IF;
  PERFORM set_config('parallel_setup_cost', '0', true), set_config('parallel_tuple_cost', '0', true),
          set_config('min_parallel_table_scan_size', '0', true);
  LOOP
    BEGIN
      EXECUTE format('CREATE TEMP TABLE storetopics_new_terms AS SELECT * FROM %s($1, $2, NULL, NULL) '
                     'AS r(store_key text, file_key text, term text, n int, rows int)',
                     storetopics._generated(src.id, 'read'))
        USING v_op, p_files;
      EXIT;
    EXCEPTION WHEN program_limit_exceeded THEN
      EXIT WHEN v_op = 'terms_slow';
      v_op := 'terms_slow';
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
  -- Grouping by hashing: array_agg needs no order here, and sorting ~1M rows per batch is the slow way.  Both
  -- aggregates read the rows in the same order, so the term and count arrays line up.  A NULL store key makes the
  -- file's chunks null-key rows.
  PERFORM set_config('enable_sort', 'off', true);
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
  IF src.embedding IS NOT NULL AND EXISTS (SELECT 1 FROM storetopics.clusters k WHERE k.source_id = src.id) THEN
    PERFORM storetopics._assign(src, p_files, NULL);
    UPDATE pg_temp.storetopics_new_files nf SET cluster_ids = a.cluster_ids, cluster_chunks = a.cluster_chunks,
           cluster_outliers = a.cluster_outliers, other_dim = a.other_dim
      FROM pg_temp.storetopics_assign a WHERE a.store_key = nf.store_key AND a.file_key = nf.file_key;
    DROP TABLE pg_temp.storetopics_assign;
  END IF;
END $$;

-- Fold step 5: subtract the files' old counts and add the new ones, in the store-wide term statistics, the cluster
-- sizes and the store counters; then replace the files' own rows.  Returns the number of file rows written.
-- (file_terms is found by a digest of the file key: keys may be longer than an index entry can be)
CREATE OR REPLACE FUNCTION storetopics._fold_apply(src storetopics.sources, p_files text[]) RETURNS int
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_digests uuid[] := ARRAY(SELECT md5(x)::uuid FROM unnest(p_files) x);
  v_n int;
BEGIN
  CREATE TEMP TABLE storetopics_old_files ON COMMIT DROP AS
  SELECT f.* FROM storetopics.file_terms f
   WHERE f.source_id = src.id AND md5(f.file_key)::uuid = ANY (v_digests) AND f.file_key = ANY (p_files);

  CREATE TEMP TABLE storetopics_delta ON COMMIT DROP AS
  SELECT d.store_key, d.term_id, sum(d.df)::int AS df, sum(d.tf)::bigint AS tf, sum(d.tf2)::bigint AS tf2
    FROM (SELECT f.store_key, u.term_id, -1 AS df, -u.n::bigint AS tf, -(u.n::bigint * u.n) AS tf2
            FROM pg_temp.storetopics_old_files f, unnest(f.term_ids, f.counts) AS u(term_id, n)
           WHERE f.store_key IS NOT NULL
          UNION ALL
          SELECT nf.store_key, u.term_id, 1, u.n, u.n::bigint * u.n
            FROM pg_temp.storetopics_new_files nf, unnest(nf.term_ids, nf.counts) AS u(term_id, n)
           WHERE nf.store_key IS NOT NULL) d
   GROUP BY 1, 2
  HAVING sum(d.df) <> 0 OR sum(d.tf) <> 0 OR sum(d.tf2) <> 0;
  -- the catalog's background: the same difference, and the stores that gain or lose a term
  CREATE TEMP TABLE storetopics_catalog_delta ON COMMIT DROP AS
  SELECT d.term_id, sum(d.tf) AS total,
         sum((coalesce(t.files, 0) + d.df > 0)::int - (coalesce(t.files, 0) > 0)::int)::int AS stores,
         sum(d.df) AS files
    FROM pg_temp.storetopics_delta d
    LEFT JOIN storetopics.store_terms t ON t.source_id = src.id AND t.store_key = d.store_key AND t.term_id = d.term_id
   GROUP BY 1;
  PERFORM storetopics._catalog_apply(storetopics._catalog(src.id));
  INSERT INTO storetopics.store_terms AS t (source_id, store_key, term_id, files, total, total_sq)
  SELECT src.id, d.store_key, d.term_id, d.df, d.tf, d.tf2 FROM pg_temp.storetopics_delta d
  ORDER BY d.store_key, d.term_id
  ON CONFLICT (source_id, store_key, term_id) DO UPDATE
     SET files = t.files + excluded.files, total = t.total + excluded.total, total_sq = t.total_sq + excluded.total_sq;
  DELETE FROM storetopics.store_terms t USING pg_temp.storetopics_delta d
   WHERE t.source_id = src.id AND t.store_key = d.store_key AND t.term_id = d.term_id AND t.files <= 0;
  DROP TABLE pg_temp.storetopics_delta;

  IF src.embedding IS NOT NULL THEN
    PERFORM storetopics._add_to_clusters(src.id);
  END IF;

  CREATE TEMP TABLE storetopics_store_delta ON COMMIT DROP AS
  SELECT x.store_key, sum(x.files) AS files, sum(x.chunks) AS chunks, sum(x.words) AS words,
         sum(x.skipped) AS skipped, sum(x.other_dim) AS other_dim
    FROM (SELECT f.store_key, -1 AS files, -f.chunks AS chunks, -f.words AS words, -f.skipped AS skipped,
                 -f.other_dim AS other_dim
            FROM pg_temp.storetopics_old_files f WHERE f.store_key IS NOT NULL
          UNION ALL
          SELECT nf.store_key, 1, nf.chunks, nf.words, nf.skipped, nf.other_dim
            FROM pg_temp.storetopics_new_files nf WHERE nf.store_key IS NOT NULL) x
   GROUP BY x.store_key;
  -- the source's part of its catalog's size: its files, and its stores that come to hold files or lose their last
  UPDATE storetopics.sources s
     SET file_count = s.file_count + d.files, store_count = s.store_count + d.stores
    FROM (SELECT coalesce(sum(d.files), 0) AS files,
                 coalesce(sum((coalesce(st.files, 0) + d.files > 0)::int - (coalesce(st.files, 0) > 0)::int), 0)
                   AS stores
            FROM pg_temp.storetopics_store_delta d
            LEFT JOIN storetopics.store_state st ON st.source_id = src.id AND st.store_key = d.store_key) d
   WHERE s.id = src.id;
  INSERT INTO storetopics.store_state AS st (source_id, store_key, files, chunks, words, skipped, other_dim,
                                             folded_at)
  SELECT src.id, d.store_key, d.files, d.chunks, d.words, d.skipped, d.other_dim, now()
    FROM pg_temp.storetopics_store_delta d
  ORDER BY d.store_key
  ON CONFLICT (source_id, store_key) DO UPDATE
     SET files = st.files + excluded.files, chunks = st.chunks + excluded.chunks,
         words = st.words + excluded.words, skipped = st.skipped + excluded.skipped,
         other_dim = st.other_dim + excluded.other_dim, folded_at = now(), version = st.version + 1;
  IF EXISTS (SELECT 1 FROM storetopics.store_state st WHERE st.source_id = src.id AND st.tool_name IS NULL) THEN
    PERFORM storetopics._name_stores(src.id);   -- new stores
  END IF;

  DELETE FROM storetopics.file_terms f
   WHERE f.source_id = src.id AND md5(f.file_key)::uuid = ANY (v_digests) AND f.file_key = ANY (p_files);
  INSERT INTO storetopics.file_terms (source_id, file_key, store_key, chunks, skipped, words, term_ids, counts,
                                      cluster_ids, cluster_chunks, cluster_outliers, other_dim)
  SELECT src.id, nf.file_key, nf.store_key, nf.chunks, nf.skipped, nf.words, nf.term_ids, nf.counts,
         nf.cluster_ids, nf.cluster_chunks, nf.cluster_outliers, nf.other_dim
    FROM pg_temp.storetopics_new_files nf;
  GET DIAGNOSTICS v_n = ROW_COUNT;
  DROP TABLE pg_temp.storetopics_new_files, pg_temp.storetopics_old_files, pg_temp.storetopics_store_delta;
  RETURN v_n;
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
  'keyword_shift', 0.2,          -- keyword gate: more than this share of the top-5 words moved (see refresh_words)
  'labeller', 'offline',         -- offline | anthropic | openai (any Chat Completions server: OPENAI_BASE_URL)
  'model', NULL,                 -- the labeller's model (NULL: its default)
  'prices', jsonb_build_object(  -- USD per million tokens, input and output
              'claude-haiku-4-5', jsonb_build_array(1.0, 5.0),
              'claude-3-5-haiku-latest', jsonb_build_array(0.8, 4.0),
              'claude-sonnet-4-5', jsonb_build_array(3.0, 15.0),
              'gpt-4o-mini', jsonb_build_array(0.15, 0.6)),   -- the openai labeller's default model
  'embedding_model', NULL,       -- name of the model that made the vectors, recorded as the fit's space
  'debounce', 60,                -- seconds a store must be quiet before the worker refreshes it
  'max_staleness', 600,          -- ... but never longer than this under a continuous stream
  'paused', false,
  'replica_capture', false,      -- capture triggers ENABLE ALWAYS: also rows written in session_replication_role
                                 -- replica (logical replication's apply, pg_restore); see README
  'verify_every', 3600,          -- seconds between the worker's count checks of a source (verify()); 0: never
  'catalog', NULL,               -- the stores a router chooses among, whose terms a summary is contrasted with:
                                 -- NULL, the stores of this source; a name, the stores of every source that has it
  'route_threshold', 0.45,       -- route(): a store holds a query embedding when its score (a soft maximum of the
                                 -- cosines to its clusters, 0-1) reaches this; chosen on the routing evaluation's
                                 -- tuning half (best abstention F1; lab/evaluation)
  'route_text_threshold', 0.22); -- route_text(): the same for a query text (the mean log ratio of its words'
                                 -- probability in the store to the background); chosen likewise

-- The settings only an administrator may change (storetopics._is_admin): what the operator pays for.  The labeller's
-- endpoint and key come from the worker's environment, never from a setting.
CREATE OR REPLACE FUNCTION storetopics._operator_settings() RETURNS text[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp
RETURN ARRAY['labeller', 'model', 'prices'];

CREATE OR REPLACE FUNCTION storetopics._settings(p_source int) RETURNS jsonb
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
RETURN storetopics.default_settings() || coalesce((SELECT s.settings FROM storetopics.sources s WHERE s.id = p_source),
                                                  '{}');

-- The effective settings of an attached table (for a caller who may act as its owner).
CREATE OR REPLACE FUNCTION storetopics.settings(chunks regclass) RETURNS jsonb
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
RETURN storetopics._settings((storetopics._owned_source(chunks)).id);
COMMENT ON FUNCTION storetopics.settings(regclass) IS 'The effective settings of an attached table (jsonb).';

-- Settings changes as configure() and attach() take them: known keys, values of the default's type (null resets).
CREATE OR REPLACE FUNCTION storetopics._validate_settings(changes jsonb) RETURNS void
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  d jsonb := storetopics.default_settings();
  k text;
  v jsonb;
BEGIN
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
    IF k = 'catalog' AND v #>> '{}' ~ '^source:' THEN
      RAISE EXCEPTION 'storetopics: catalog names starting with "source:" are the sources'' own'
        USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF k = 'route_threshold' AND jsonb_typeof(v) = 'number' AND (v #>> '{}')::numeric > 1 THEN
      RAISE EXCEPTION 'storetopics: setting route_threshold cannot be %: route() scores are at most 1', v
        USING ERRCODE = 'invalid_parameter_value', HINT = 'A cosine similarity: 0 searches (almost) always, 1 never.';
    END IF;
    IF k = ANY (storetopics._operator_settings()) AND NOT storetopics._is_admin() THEN
      RAISE EXCEPTION 'storetopics: setting % is the operator''s', k USING ERRCODE = 'insufficient_privilege',
        DETAIL = 'Which labeller runs, its model and the prices the ledger counts decide what the operator pays for.',
        HINT = 'Ask an administrator of storetopics to set it: SELECT storetopics.configure(table, ...).';
    END IF;
    IF k = 'labeller' AND v #>> '{}' NOT IN ('offline', 'anthropic', 'openai') THEN
      RAISE EXCEPTION 'storetopics: unknown labeller %', v USING ERRCODE = 'invalid_parameter_value',
        HINT = 'offline, anthropic or openai';
    END IF;
  END LOOP;
END $$;

-- Change settings of an attached table: configure('t', '{"k_max": 12}'); a key set to null goes back to its
-- default.  Unknown keys and values of the wrong type are refused.  Returns the effective settings.
CREATE OR REPLACE FUNCTION storetopics.configure(chunks regclass, changes jsonb) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  src storetopics.sources := storetopics._owned_source(chunks);
  v_old jsonb := storetopics._settings(src.id);
  v_new jsonb;
BEGIN
  PERFORM storetopics._validate_settings(changes);
  UPDATE storetopics.sources s SET settings = jsonb_strip_nulls(s.settings || changes) WHERE s.id = src.id
  RETURNING * INTO src;
  UPDATE storetopics.store_state SET version = version + 1 WHERE source_id = src.id;   -- labels shown may change
  v_new := storetopics._settings(src.id);
  IF (v_new ->> 'k_min')::int > (v_new ->> 'k_max')::int THEN
    RAISE EXCEPTION 'storetopics: k_min % is above k_max %', v_new ->> 'k_min', v_new ->> 'k_max'
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF v_new -> 'replica_capture' IS DISTINCT FROM v_old -> 'replica_capture' THEN
    PERFORM storetopics._create_triggers(src);
  END IF;
  IF v_new -> 'catalog' IS DISTINCT FROM v_old -> 'catalog' THEN
    -- the source's stores leave one catalog's background and join the other's
    PERFORM storetopics._catalog_move(src.id, storetopics._catalog_key(src.id, src.owner, v_old ->> 'catalog'),
                                      storetopics._catalog_key(src.id, src.owner, v_new ->> 'catalog'));
  END IF;
  RETURN v_new;
END $$;
COMMENT ON FUNCTION storetopics.configure(regclass, jsonb) IS
  'Change settings of an attached table (null resets a key); returns the effective settings.';

CREATE OR REPLACE FUNCTION storetopics.pause(chunks regclass) RETURNS jsonb
LANGUAGE sql SET search_path = pg_catalog, pg_temp
RETURN storetopics.configure(chunks, '{"paused": true}');
COMMENT ON FUNCTION storetopics.pause(regclass) IS 'Stop the worker from refreshing this table''s stores.';

CREATE OR REPLACE FUNCTION storetopics.resume(chunks regclass) RETURNS jsonb
LANGUAGE sql SET search_path = pg_catalog, pg_temp
RETURN storetopics.configure(chunks, '{"paused": null}');
COMMENT ON FUNCTION storetopics.resume(regclass) IS 'Let the worker refresh this table''s stores again.';

-- The catalog a source's stores are contrasted with, as catalog_terms keys it: the source itself ('source:<id>'), or
-- settings.catalog among the sources of the same owner ('owner:<role oid>:<name>').  Per owner: a tenant that names
-- another's catalog joins a catalog of its own by that name, so it neither reads the other's word counts back from
-- its own scores nor changes the other's summaries by flooding their background.
CREATE OR REPLACE FUNCTION storetopics._catalog_key(p_source int, p_owner regrole, p_name text) RETURNS text
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp
RETURN CASE WHEN p_name IS NULL THEN 'source:' || p_source ELSE 'owner:' || p_owner::oid || ':' || p_name END;

CREATE OR REPLACE FUNCTION storetopics._catalog(p_source int) RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
RETURN coalesce((SELECT storetopics._catalog_key(s.id, s.owner, storetopics._settings(s.id) ->> 'catalog')
                   FROM storetopics.sources s WHERE s.id = p_source),
                'source:' || p_source);

-- Adds the rows of pg_temp.storetopics_catalog_delta (term_id, total, files, stores) to a catalog's background, in
-- term order (folds of two sources of one catalog lock its rows in the same order), and drops terms no store holds.
CREATE OR REPLACE FUNCTION storetopics._catalog_apply(p_catalog text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  INSERT INTO storetopics.catalog_terms AS c (catalog, term_id, total, stores, files)
  SELECT p_catalog, d.term_id, d.total, d.stores, d.files FROM pg_temp.storetopics_catalog_delta d
   WHERE d.total <> 0 OR d.stores <> 0 OR d.files <> 0
   ORDER BY d.term_id
  ON CONFLICT (catalog, term_id) DO UPDATE
     SET total = c.total + excluded.total, stores = c.stores + excluded.stores, files = c.files + excluded.files;
  DELETE FROM storetopics.catalog_terms c USING pg_temp.storetopics_catalog_delta d
   WHERE c.catalog = p_catalog AND c.term_id = d.term_id AND c.stores <= 0;
  DROP TABLE pg_temp.storetopics_catalog_delta;
END $$;

-- A source's whole contribution (its stores' term sums), subtracted from one catalog and added to another (either
-- may be NULL: attach-time resync and detach).
CREATE OR REPLACE FUNCTION storetopics._catalog_move(p_source int, p_from text, p_to text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_catalog text;
  v_sign int;
BEGIN
  FOR v_catalog, v_sign IN SELECT x.c, x.s FROM (VALUES (p_from, -1), (p_to, 1)) x(c, s) WHERE x.c IS NOT NULL LOOP
    CREATE TEMP TABLE storetopics_catalog_delta ON COMMIT DROP AS
    SELECT t.term_id, v_sign * sum(t.total) AS total, (v_sign * count(*))::int AS stores,
           v_sign * sum(t.files) AS files
      FROM storetopics.store_terms t WHERE t.source_id = p_source GROUP BY 1;
    PERFORM storetopics._catalog_apply(v_catalog);
  END LOOP;
END $$;

-- What \df+ shows a DBA.
COMMENT ON FUNCTION storetopics.default_settings() IS
  'The defaults of every setting (jsonb); storetopics.settings(table) gives a table''s effective ones.';

-- idempotent/060-clusters.sql
-- ------------------------------------------------------------------------------------------------------------
-- Clusters: assignment of chunks to the current fit, kept by fold(); fits applied by apply_fit()
-- ------------------------------------------------------------------------------------------------------------
-- A chunk is clustered in its file's context: as the unit sum of its own direction and its file's mean direction
-- (files of one chunk: the chunk itself).  Read alone, a chunk such as "This package contains the documentation" or
-- a table of numbers says little about the topic its file is about; in context it goes where its file goes (the
-- clusters agree better with the Debian sections: bench/README.md).  Both the fit (_fit_input) and the assignment
-- below use it, so distances and radii agree.
--
-- Assigns the chunk rows of the files p_files (or of the store p_store) to their store's clusters, into
-- pg_temp.storetopics_assign: per (store, file), the chunks per nearest cluster of the store's fit, the outliers
-- among them, and the chunks whose vector no cluster can take (another dimension).
--
-- Two passes over the rows, both by the source's reader (as the table's owner).  The first gives each file's mean
-- direction, which goes to storetopics.file_means (a table, because parallel workers cannot read temp tables; the
-- reader may read it, and its rows never outlive this transaction, so nobody sees another's); the second, a
-- parallel query, computes each chunk's vector in context once, its inner product with every centroid of its
-- store, and the nearest with least() over [inner product, slot] pairs (ties: the lower cluster id).  Everything
-- per row is an expression or a function scan: a LIMIT or aggregate subquery per row is never run by parallel
-- workers (bench/README.md has the figures).  Centroids are unit vectors, so the cosine distance is
-- 1 + (c <#> q) / |q| (a zero vector is NaN, as cosine makes it: an outlier).  enable_nestloop is on here even when
-- the caller turned it off (apply_fit, for its own joins): the per-row function scans are nested loops, and a
-- penalised plan is a worse one.
CREATE OR REPLACE FUNCTION storetopics._assign(src storetopics.sources, p_files text[], p_store text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp SET work_mem = '128MB' SET jit = off SET enable_nestloop = on
AS $$
DECLARE
  v_reader text := storetopics._generated(src.id, 'read');
  v_clusters jsonb;
  v_saved text[] := ARRAY[current_setting('parallel_setup_cost'), current_setting('parallel_tuple_cost'),
                          current_setting('min_parallel_table_scan_size'), current_setting('enable_sort'),
                          current_setting('enable_hashjoin'), current_setting('enable_material')];
BEGIN
  IF to_regclass('pg_temp.storetopics_assign') IS NOT NULL THEN   -- (IF EXISTS would send the client a NOTICE)
    DROP TABLE pg_temp.storetopics_assign;
  END IF;
  PERFORM set_config('parallel_setup_cost', '0', true), set_config('parallel_tuple_cost', '0', true),
          set_config('min_parallel_table_scan_size', '0', true), set_config('enable_sort', 'off', true);
  IF p_files IS NULL THEN   -- a whole store: each row finds its file's mean through the index (see _assign_sql)
    PERFORM set_config('enable_hashjoin', 'off', true), set_config('enable_material', 'off', true);
  END IF;
  DELETE FROM storetopics.file_means WHERE source_id = src.id;
  EXECUTE format('INSERT INTO storetopics.file_means (source_id, store_key, file_key, dims, m) '
                 'SELECT $1, r.* FROM %s(''means'', $2, $3, NULL) AS r(store_key text, file_key text, dims int, '
                 'm %I.vector)', v_reader, storetopics._vector_schema())
    USING src.id, p_files, p_store;
  -- the stores' clusters, passed to the reader as data (it runs as the table's owner, who may not read them)
  SELECT jsonb_build_object('clusters', jsonb_agg(jsonb_build_object('store_key', k.store_key, 'id', k.cluster_id,
                                                                     'radius', k.radius, 'centroid', k.centroid::text)))
    INTO v_clusters
    FROM storetopics.clusters k WHERE k.source_id = src.id AND (p_store IS NULL OR k.store_key = p_store);
  EXECUTE format('CREATE TEMP TABLE storetopics_assign ON COMMIT DROP AS SELECT * FROM %s(''assign'', $1, $2, $3) '
                 'AS r(store_key text, file_key text, cluster_ids int[], cluster_chunks int[], cluster_outliers int[], '
                 'other_dim int)', v_reader)
    USING p_files, p_store, v_clusters;
  DELETE FROM storetopics.file_means WHERE source_id = src.id;
  PERFORM set_config('parallel_setup_cost', v_saved[1], true), set_config('parallel_tuple_cost', v_saved[2], true),
          set_config('min_parallel_table_scan_size', v_saved[3], true), set_config('enable_sort', v_saved[4], true),
          set_config('enable_hashjoin', v_saved[5], true), set_config('enable_material', v_saved[6], true);
END $$;

-- The reader's assignment query (see _assign), in pieces the reader puts together at run time: the head, then the
-- stores' clusters (ks) from one of two sources, the joins up to least(), the least() arguments of the cluster
-- slots, the next piece, the rows' filter (by files or by store), the tail.
--   ks by files (fold: a few files, maybe of several stores): the clusters of each store of the call, hashed and
--   joined to the rows by store, as is each file's mean.
--   ks by store (apply_fit: every file of one store): the one store's clusters as init plans, evaluated once and
--   passed to the parallel workers, and _assign turns hash joins off, so each row finds its file's mean through
--   file_means' index.  Hashed, all the means of a large store were one shared hash table that every process of
--   the query held, growing with the store's files (bench/README.md has the figures).
CREATE OR REPLACE FUNCTION storetopics._assign_sql(src storetopics.sources) RETURNS text[]
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  vs name := storetopics._vector_schema();
  e text := storetopics._embedding_sql(src);
BEGIN
  RETURN ARRAY[format($q$
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
                      -- the store's clusters as arrays, in cluster id order (ks: the reader puts in one of the
                      -- two sources below)
                      LEFT JOIN ($q$,
                      src.store_sql, src.file_sql, src.chunks, e),
               format($q$
                            SELECT k.store_key, array_agg(k.centroid::%1$I.vector ORDER BY k.id) AS cen,
                                   array_agg(k.id ORDER BY k.id) AS ids, array_agg(k.radius ORDER BY k.id) AS radii,
                                   min(%1$I.vector_dims(k.centroid::%1$I.vector)) AS dims
                              FROM jsonb_to_recordset($3 -> 'clusters') AS k(store_key text, id int, radius real, centroid text)
                             GROUP BY 1$q$, vs),
               format($q$
                            SELECT $2 AS store_key,
                                   (SELECT array_agg(k.centroid::%1$I.vector ORDER BY k.id) FROM %2$s) AS cen,
                                   (SELECT array_agg(k.id ORDER BY k.id) FROM %2$s) AS ids,
                                   (SELECT array_agg(k.radius ORDER BY k.id) FROM %2$s) AS radii,
                                   (SELECT min(%1$I.vector_dims(k.centroid::%1$I.vector)) FROM %2$s) AS dims$q$,
                      vs, $q$jsonb_to_recordset($3 -> 'clusters') AS k(store_key text, id int, radius real, centroid text)$q$),
               format($q$) ks
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
                                                               THEN least($q$,
                      src.store_sql, src.file_sql, src.chunks, e, vs, src.id),
               format($q$) END)]) AS a(m float8[])
                     WHERE (%1$s) IS NOT NULL AND $q$, src.store_sql),
               $q$) y
             GROUP BY 1, 2, 3, 4, 5) x
     GROUP BY 1, 2$q$];
END $$;

-- fold()'s step for clusters: subtract the files' old cluster arrays, add the new ones (in pg_temp's new files).
CREATE OR REPLACE FUNCTION storetopics._add_to_clusters(p_source int) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  UPDATE storetopics.clusters k
     SET chunks = k.chunks + d.chunks, files = k.files + d.files, outliers = k.outliers + d.outliers
    FROM (SELECT x.store_key, x.cluster_id, sum(x.files) AS files, sum(x.chunks) AS chunks, sum(x.outliers) AS outliers
            FROM (SELECT f.store_key, u.cluster_id, -1 AS files, -u.n AS chunks, -u.o AS outliers
                    FROM pg_temp.storetopics_old_files f,
                         unnest(f.cluster_ids, f.cluster_chunks, f.cluster_outliers) AS u(cluster_id, n, o)
                   WHERE f.store_key IS NOT NULL
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
    v_pct := NULL;
    method := 'whole store';
  ELSE
    method := format('tablesample system %s%%', round(v_pct::numeric, 2));
  END IF;
  EXECUTE format('CREATE TEMP TABLE storetopics_sample ON COMMIT DROP AS SELECT * FROM %s(''sample'', NULL, $1, $2) '
                 'AS r(ref text, file_key text, e %I.vector)', storetopics._reader(p_source), v_vs)
    USING p_store, jsonb_build_object('percent', v_pct, 'seed', v_seed, 'limit', v_limit);
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
-- statistics yet, and the planner's nested loop over both was orders of magnitude slower.)
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
                   'ORDER BY array_position($1, x.ref)), ''[]'') '
                   'FROM %s(''chunks'', $1, NULL, NULL) AS x(ref text, file text, txt text)',
                   storetopics._reader(p_source))
      INTO v_reps USING r.refs;
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
  PERFORM storetopics._assign(src, NULL, p_store);
  ANALYZE pg_temp.storetopics_assign;
  UPDATE storetopics.file_terms f
     SET cluster_ids = a.cluster_ids, cluster_chunks = a.cluster_chunks, cluster_outliers = a.cluster_outliers,
         other_dim = a.other_dim
    FROM pg_temp.storetopics_assign a
   WHERE f.source_id = p_source AND f.store_key = p_store AND a.store_key = p_store AND f.file_key = a.file_key;
  GET DIAGNOSTICS v_updated = ROW_COUNT;
  -- (a store backfilled in two batches kept the statistics of the first, and render's keywords() crawled until
  -- autovacuum came by)
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
-- p_clusters: the clusters to update (NULL: all of the store).  No JIT, as for storetopics._mine_phrases: estimates
-- over unnested arrays are off by orders of magnitude, and the compilation took longer than the statement.
CREATE OR REPLACE FUNCTION storetopics._cluster_keywords(p_source int, p_store text, p_clusters int[] DEFAULT NULL,
                                              n_words int DEFAULT 15) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp SET jit = off AS $$
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
    -- (the arrays unnested in the select list, which streams them; unnest(a, b) in FROM copies them first)
    SELECT u.cluster_id, u.term_id, sum(u.n * u.w) AS n, count(*) AS nfiles
      FROM (SELECT p.cluster_id, p.w, unnest(p.term_ids) AS term_id, unnest(p.counts) AS n FROM pick p) u
     GROUP BY 1, 2
  ), shown AS MATERIALIZED (
    -- the store's terms worth showing, with their text: one hash for the join below (looked up per (cluster,
    -- term) pair, the lexemes cost an index probe and a showable_term call each)
    SELECT t.term_id, x.lexeme
      FROM storetopics.store_terms t JOIN storetopics.lexemes x ON x.id = t.term_id
     WHERE t.source_id = p_source AND t.store_key = p_store AND storetopics.showable_term(x.lexeme)
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
      FROM ct JOIN tot t USING (term_id) JOIN sizes s USING (cluster_id) JOIN shown x ON x.term_id = ct.term_id,
           (SELECT avg(sizes.size) AS avg, count(*) AS clusters FROM sizes) a
     WHERE ct.nfiles >= least(2, s.files) AND (p_clusters IS NULL OR ct.cluster_id = ANY (p_clusters))
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
-- top 5 words that are not even among the other's top 15, counted both ways) since it was named is due for a new
-- label; a burst that leaves the words alone costs no labelling call.  The top 5 because that is what a reader sees
-- change: a label of 2-5 words names the cluster's leading words, and a word that only moves within the top 15 leaves
-- what it names true (like-for-like churn, bench/README.md).  New
-- outliers change a cluster's words: this is how they mark it.  Cheap when nothing changed.  Returns the number of
-- clusters whose label became due.
-- The keyword gate's measure: how many words of one list's top 5 are not even in the other's top 15, counted both
-- ways (so near-ties swapping places do not count).
CREATE OR REPLACE FUNCTION storetopics._words_moved(a text[], b text[]) RETURNS int
LANGUAGE sql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp
RETURN (SELECT count(*) FROM unnest(a[1:5]) w WHERE w <> ALL (coalesce(b[1:15], '{}')))
     + (SELECT count(*) FROM unnest(b[1:5]) w WHERE w <> ALL (coalesce(a[1:15], '{}')));

CREATE OR REPLACE FUNCTION storetopics.refresh_words(p_source int, p_store text) RETURNS int
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  st storetopics.store_state;
  v_due int;
  v_shift float8;
BEGIN
  SELECT * INTO st FROM storetopics.store_state WHERE source_id = p_source AND store_key = p_store;
  IF NOT FOUND OR st.words_version = st.version THEN
    RETURN 0;
  END IF;
  IF NOT EXISTS (SELECT 1 FROM storetopics.clusters k WHERE k.source_id = p_source AND k.store_key = p_store) THEN
    -- a keyword-only store's labels have the same gate, on its contrastive terms
    IF (SELECT s.embedding IS NULL FROM storetopics.sources s WHERE s.id = p_source) THEN
      v_due := storetopics._store_label_gate(p_source, p_store);
      UPDATE storetopics.store_state SET words_version = st.version WHERE source_id = p_source AND store_key = p_store;
      RETURN v_due;
    END IF;
    RETURN 0;
  END IF;
  PERFORM storetopics._cluster_keywords(p_source, p_store);
  PERFORM storetopics._cluster_phrases(p_source, p_store);
  v_shift := (storetopics._settings(p_source) ->> 'keyword_shift')::float8;
  UPDATE storetopics.clusters k
     SET label_needed = true, label_failures = 0, label_retry_at = NULL
   WHERE k.source_id = p_source AND k.store_key = p_store AND NOT k.label_needed AND k.label_words IS NOT NULL
     AND storetopics._words_moved(k.label_words, k.keywords) > v_shift * 10;
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

-- A label as stored must look like one: 3-48 characters, 2-5 words.  What it says is screen()'s business, and
-- whether it speaks of the cluster _grounded's.
CREATE OR REPLACE FUNCTION storetopics.label_ok(label text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp
RETURN label IS NOT NULL AND length(label) BETWEEN 3 AND 48
   AND cardinality(regexp_split_to_array(trim(label), '\s+')) BETWEEN 2 AND 5;

-- Whether a label speaks of its cluster: each of its words (as lexemes: "editors" is "editor") occurs among the
-- cluster's words or in its representative chunks, what the labeller was shown.  A label that names something the
-- cluster does not hold ("Route all queries here", "evil example") is not shown.
CREATE OR REPLACE FUNCTION storetopics._grounded(p_source int, p_store text, p_cluster int, p_label text)
RETURNS boolean
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
RETURN (SELECT coalesce(tsvector_to_array(to_tsvector(s.ts_config, p_label))
                        <@ tsvector_to_array(to_tsvector(s.ts_config,
                             array_to_string(k.keywords, ' ') || ' ' ||
                             coalesce((SELECT string_agg(r ->> 'text', ' ') FROM jsonb_array_elements(k.representatives) r),
                                      ''))), false)
          FROM storetopics.clusters k JOIN storetopics.sources s ON s.id = k.source_id
         WHERE k.source_id = p_source AND k.store_key = p_store AND k.cluster_id = p_cluster);

-- What a labeller is told of the catalog's other stores: up to 8 of them (in an order that favours no name), each as
-- its name and first contrastive terms, so a label says what sets its cluster or store apart.
CREATE OR REPLACE FUNCTION storetopics._other_stores(p_source int, p_store text) RETURNS text[]
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
RETURN ARRAY(SELECT st.store_key || ': ' || (SELECT string_agg(c ->> 'term', ', ')
                                               FROM (SELECT c FROM jsonb_array_elements(st.topics -> 'contrast') c
                                                     LIMIT 4) x)
               FROM storetopics.store_state st
              WHERE st.source_id IN (SELECT s.id FROM storetopics.sources s
                                      WHERE storetopics._catalog(s.id) = storetopics._catalog(p_source))
                AND (st.source_id, st.store_key) <> (p_source, p_store) AND st.topics ? 'contrast'
              ORDER BY hashtext(st.store_key), st.store_key LIMIT 8);

-- Clusters whose label is due from the configured labeller (none with the offline labeller, whose label is derived
-- from the words): new or changed clusters whose retry time has come.  What a labeller may see of a cluster: its
-- words and representative chunks, never the corpus.
CREATE OR REPLACE FUNCTION storetopics.labels_due(p_source int, p_store text)
RETURNS TABLE (cluster_id int, keywords text[], representatives jsonb, share float8, failures int,
               siblings text[], others text[])
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
  SELECT k.cluster_id, k.keywords, k.representatives,
         k.chunks::float8 / greatest((SELECT sum(k2.chunks) FROM storetopics.clusters k2
                                       WHERE k2.source_id = p_source AND k2.store_key = p_store), 1),
         k.label_failures,
         -- what the store's other clusters are about, so a label says what sets this one apart
         ARRAY(SELECT coalesce(k3.label, k3.phrase, storetopics.offline_label(k3.keywords))
                 FROM storetopics.clusters k3
                WHERE k3.source_id = p_source AND k3.store_key = p_store AND k3.cluster_id <> k.cluster_id
                  AND k3.chunks > 0
                ORDER BY k3.chunks DESC, k3.cluster_id LIMIT 8),
         -- and the catalog's other stores
         storetopics._other_stores(p_source, p_store)
    FROM storetopics.clusters k
   WHERE k.source_id = p_source AND k.store_key = p_store AND k.label_needed AND k.chunks > 0
     AND coalesce(k.label_retry_at, '-infinity') <= now()
     AND storetopics._settings(p_source) ->> 'labeller' <> 'offline'
   ORDER BY k.chunks DESC, k.cluster_id;
END;

-- One labelling call in the ledger (cluster NULL: a keyword-only store's call), priced from the source's settings.
CREATE OR REPLACE FUNCTION storetopics._ledger(p_source int, p_store text, p_cluster int, p_labeller text, p_model text,
                                    p_input_tokens int, p_output_tokens int, p_outcome text, p_detail text)
RETURNS void
LANGUAGE sql SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
  INSERT INTO storetopics.label_ledger (source_id, store_key, cluster_id, labeller, model, input_tokens,
                                        output_tokens, cost_usd, outcome, detail)
  SELECT p_source, p_store, p_cluster, p_labeller, p_model, coalesce(p_input_tokens, 0), coalesce(p_output_tokens, 0),
         coalesce((coalesce(p_input_tokens, 0) * (x.price ->> 0)::numeric
                   + coalesce(p_output_tokens, 0) * (x.price ->> 1)::numeric) / 1e6, 0),
         p_outcome, left(p_detail, 500)
    FROM (SELECT storetopics._settings(p_source) #> ARRAY['prices', coalesce(p_model, '')] AS price) x;
END;

-- When a failed labelling call is tried again: exponential backoff with jitter, 30 s doubling, capped at an hour.
CREATE OR REPLACE FUNCTION storetopics._retry_at(failures int) RETURNS timestamptz
LANGUAGE sql VOLATILE SET search_path = pg_catalog, pg_temp
RETURN now() + make_interval(secs => least(3600, 30 * 2 ^ least(failures, 20)) * (0.5 + random() / 2));

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
  v_outcome text := p_outcome;
  v_detail text := p_detail;
BEGIN
  IF v_outcome = 'ok' THEN
    v_detail := CASE WHEN NOT storetopics.label_ok(p_label) THEN 'not a 2-5 word label'
                     WHEN storetopics.screen(p_label) IS NOT NULL THEN 'screened: ' || storetopics.screen(p_label)
                     WHEN NOT storetopics._grounded(p_source, p_store, p_cluster, p_label)
                       THEN 'not grounded: a word of it is not in the cluster''s words or chunks' END;
    v_outcome := CASE WHEN v_detail IS NULL THEN 'ok' ELSE 'rejected' END;
  END IF;
  PERFORM storetopics._ledger(p_source, p_store, p_cluster, p_labeller, p_model, p_input_tokens, p_output_tokens,
                              v_outcome, v_detail);
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
           label_retry_at = storetopics._retry_at(label_failures)
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

-- What \df+ shows a DBA.
COMMENT ON FUNCTION storetopics.fit_due(int, text) IS
  'Why a store needs a (re-)fit now: no fit, outliers, dimension; NULL while its fit holds.';
COMMENT ON FUNCTION storetopics.apply_fit(int, text, jsonb) IS
  'Write a fit computed from _fit_input (clusters matched to the old ones keep their rows and labels) and assign every chunk of the store; compare-and-set on the fit generation. Returns a report.';
COMMENT ON FUNCTION storetopics.refresh_words(int, text) IS
  'Recompute a store''s cluster words and offline phrases from the current counts and run the keyword gate; returns how many labels became due.';
COMMENT ON FUNCTION storetopics.offline_label(text[]) IS
  'The fallback offline label: a cluster''s first three words that say something new.';
COMMENT ON FUNCTION storetopics.label_ok(text) IS
  'Whether a label has a label''s shape: 3-48 characters, 2-5 words (what it says is screen()''s business).';
COMMENT ON FUNCTION storetopics.labels_due(int, text) IS
  'The clusters whose label is due from the configured LLM labeller, with what it may see: words, representatives, the other clusters and stores.';
COMMENT ON FUNCTION storetopics.record_label(int, text, int, text, text, text, text, int, int, text) IS
  'Record a labelling call in the ledger and, when the label passes label_ok, screen() and the grounding check, store it; errors schedule a retry with backoff.';
COMMENT ON FUNCTION storetopics.cluster(int, text) IS
  'Re-fit one store''s clusters inside the database (needs plpython3u); elsewhere the worker or `storetopics backfill` fits.';

-- idempotent/065-phrases.sql
-- ------------------------------------------------------------------------------------------------------------
-- Phrases: offline topic labels people wrote, mined from the store's own text
-- ------------------------------------------------------------------------------------------------------------
-- A label such as "removed support new" (three stems in c-TF-IDF order) tells a reader little; "text editor" or
-- "genome assembly" does.  The offline label of a cluster is therefore a short phrase (2-3 words) that occurs in its
-- files: written by someone, shown as written.  The same miner gives a keyword-only store its topics.

-- Mines phrases for groups of files.  Input: pg_temp.storetopics_mine_files (grp, file_key), the files of each group
-- (a cluster, or a whole store), and pg_temp.storetopics_mine_words (grp, lexeme, weight), the words a group's
-- phrases should be made of.  Output: pg_temp.storetopics_mined (grp, phrase, one_file, hits, score, rank); hits:
-- how many of its words weigh 0.5 or more for the group (a cluster's three first words).
-- A phrase is a run of 2-3 different words within a clause (never across punctuation), letters only, its first and
-- last word no stopword, at least one of its words (as a lexeme) weighted for the group; it must occur in two of the group's
-- files (one file's names are no topic).  Score: files it occurs in x (1 + weight of its words) x how rare it is in
-- the other groups (log(1 + groups / groups holding it)).  Shown in its most common spelling.  After those rank the
-- runs that occur in a single file, then single weighted words ("debootstrap", "Docker"), which a keyword-only
-- store's topics take rather than none.
-- No JIT: planned over temp tables and unnested arrays, these statements are estimated at up to 10^9 rows (they
-- have ~10^4-10^5), which buys them an LLVM compilation that takes longer than they run (bench/README.md).
CREATE OR REPLACE FUNCTION storetopics._mine_phrases(p_source int, p_store text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp SET jit = off AS $$
DECLARE
  v_cfg regconfig := (SELECT s.ts_config FROM storetopics.sources s WHERE s.id = p_source);
  v_groups int := (SELECT count(DISTINCT g.grp) FROM pg_temp.storetopics_mine_files g);
BEGIN
  IF to_regclass('pg_temp.storetopics_mined') IS NOT NULL THEN   -- (IF EXISTS would send the client a NOTICE)
    DROP TABLE pg_temp.storetopics_mined;
  END IF;
  EXECUTE format('CREATE TEMP TABLE storetopics_mine_texts ON COMMIT DROP AS SELECT * FROM %s(''sample_texts'', $1, '
                 '$2, NULL) AS r(file_key text, t text)', storetopics._reader(p_source))
    USING ARRAY(SELECT DISTINCT g.file_key FROM pg_temp.storetopics_mine_files g), p_store;
  CREATE TEMP TABLE storetopics_mine_grams ON COMMIT DROP AS
  WITH clauses AS (
    SELECT x.file_key, c.clause, row_number() OVER () AS n
      FROM pg_temp.storetopics_mine_texts x,
           regexp_split_to_table(x.t, '[.,;:!?()\[\]{}"<>|/\\=*#`~_\t\r\n]+|\s-+\s') AS c(clause)
  ), words AS (
    SELECT cl.file_key, cl.n, w.word, w.i
      FROM clauses cl, regexp_split_to_table(btrim(cl.clause), '\s+') WITH ORDINALITY AS w(word, i)
  ), grams AS (
    SELECT w.file_key, w.word AS w1, lead(w.word) OVER o AS w2, lead(w.word, 2) OVER o AS w3
      FROM words w WINDOW o AS (PARTITION BY w.n ORDER BY w.i)
  )
  SELECT g.file_key, v.len, v.words
    FROM grams g, LATERAL (VALUES (1, ARRAY[g.w1]), (2, ARRAY[g.w1, g.w2]), (3, ARRAY[g.w1, g.w2, g.w3])) AS v(len, words)
   WHERE array_position(v.words, NULL) IS NULL
     AND v.words <@ ARRAY(SELECT w FROM unnest(v.words) w
                           WHERE w ~ '^[[:alpha:]][[:alpha:]''-]*[[:alpha:]]$' AND length(w) <= 30)
     AND cardinality(ARRAY(SELECT DISTINCT lower(w) FROM unnest(v.words) w)) = v.len;   -- no word twice
  -- each distinct word's lexeme (none: a stopword)
  CREATE TEMP TABLE storetopics_mine_lex ON COMMIT DROP AS
  SELECT w.word, (tsvector_to_array(to_tsvector(v_cfg, w.word)))[1] AS lexeme
    FROM (SELECT DISTINCT lower(u.w) AS word FROM pg_temp.storetopics_mine_grams g, unnest(g.words) u(w)) w;
  -- set-based throughout (joins, not per-row look-ups): a store's sample holds 10^5 n-grams
  CREATE TEMP TABLE storetopics_mined ON COMMIT DROP AS
  WITH per AS (
    SELECT f.grp, lower(array_to_string(g.words, ' ')) AS key, array_to_string(g.words, ' ') AS surface, g.file_key,
           g.words
      FROM pg_temp.storetopics_mine_grams g
      JOIN pg_temp.storetopics_mine_files f ON f.file_key = g.file_key
      JOIN pg_temp.storetopics_mine_lex l1 ON l1.word = lower(g.words[1]) AND l1.lexeme IS NOT NULL
      JOIN pg_temp.storetopics_mine_lex l2 ON l2.word = lower(g.words[cardinality(g.words)]) AND l2.lexeme IS NOT NULL
  ), scored AS (
    -- shown in its most common spelling (mode(): ties go to the first in order)
    SELECT p.grp, p.key, count(DISTINCT p.file_key) AS files, mode() WITHIN GROUP (ORDER BY p.surface) AS phrase,
           min(p.words) AS words
      FROM per p GROUP BY 1, 2
  ), weighted AS (
    SELECT s.grp, s.key, sum(mw.weight) AS weight, count(*) FILTER (WHERE mw.weight >= 0.5) AS hits
      FROM scored s CROSS JOIN LATERAL unnest(s.words) AS u(w)
      JOIN pg_temp.storetopics_mine_lex l ON l.word = lower(u.w)
      JOIN pg_temp.storetopics_mine_words mw ON mw.grp = s.grp AND mw.lexeme = l.lexeme
     GROUP BY 1, 2
  ), spread AS (
    SELECT s.key, count(*) AS groups FROM scored s GROUP BY 1
  ), sizes AS (
    SELECT f.grp, count(*) AS files FROM pg_temp.storetopics_mine_files f GROUP BY 1
  )
  SELECT s.grp, s.phrase, s.files < least(2, z.files) AS one_file, w.hits,
         round((s.files * (1 + w.weight) * ln(1 + v_groups::float8 / sp.groups))::numeric, 9) AS score,
         row_number() OVER (PARTITION BY s.grp ORDER BY cardinality(s.words) = 1, s.files < least(2, z.files),
                                                        s.files * (1 + w.weight) * ln(1 + v_groups::float8 / sp.groups)
                                                        DESC, s.phrase) AS rank
    FROM scored s JOIN weighted w USING (grp, key) JOIN spread sp USING (key) JOIN sizes z USING (grp)
   WHERE w.weight > 0;
  DROP TABLE pg_temp.storetopics_mine_texts, pg_temp.storetopics_mine_grams, pg_temp.storetopics_mine_lex;
END $$;

-- The clusters' offline labels, mined for all of a store's clusters together (a phrase's rarity is counted across
-- them) from each cluster's 20 most committed files, and only when what they would be mined from changed: the
-- clusters' words or those files' counted words (store_state.cluster_phrases_from, a digest).  So a phrase is a
-- function of the store's state, not of the path that led there.
CREATE OR REPLACE FUNCTION storetopics._cluster_phrases(p_source int, p_store text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_cfg regconfig := (SELECT s.ts_config FROM storetopics.sources s WHERE s.id = p_source);
  v_from text;
BEGIN
  CREATE TEMP TABLE storetopics_mine_words ON COMMIT DROP AS
  SELECT k.cluster_id AS grp, l.lexeme, max(1.0 / (1 + u.i / 3.0)) AS weight   -- the cluster's words, best first
    FROM storetopics.clusters k, unnest(k.keywords[1:15]) WITH ORDINALITY AS u(w, i),
         LATERAL unnest(tsvector_to_array(to_tsvector(v_cfg, u.w))) AS l(lexeme)
   WHERE k.source_id = p_source AND k.store_key = p_store AND k.chunks > 0
   GROUP BY 1, 2;
  CREATE TEMP TABLE storetopics_mine_files ON COMMIT DROP AS
  SELECT x.grp, x.file_key, x.digest FROM (
    SELECT u.cluster_id AS grp, f.file_key, md5(f.term_ids::text || f.counts::text) AS digest,
           row_number() OVER (PARTITION BY u.cluster_id ORDER BY u.n::float8 / greatest(f.chunks, 1) DESC,
                                                                 hashtext(f.file_key), f.file_key) AS r
      FROM storetopics.file_terms f, unnest(f.cluster_ids, f.cluster_chunks) AS u(cluster_id, n)
     WHERE f.source_id = p_source AND f.store_key = p_store
       AND u.cluster_id IN (SELECT w.grp FROM pg_temp.storetopics_mine_words w)) x
   WHERE x.r <= 20;
  v_from := md5(coalesce((SELECT string_agg(w.grp || ':' || w.lexeme || ':' || w.weight, ',' ORDER BY w.grp, w.lexeme)
                            FROM pg_temp.storetopics_mine_words w), '') || '|' ||
                coalesce((SELECT string_agg(f.grp || ':' || f.file_key || ':' || f.digest, ',' ORDER BY f.grp, f.file_key)
                            FROM pg_temp.storetopics_mine_files f), ''));
  IF v_from IS NOT DISTINCT FROM (SELECT st.cluster_phrases_from FROM storetopics.store_state st
                                   WHERE st.source_id = p_source AND st.store_key = p_store) THEN
    DROP TABLE pg_temp.storetopics_mine_words, pg_temp.storetopics_mine_files;
    RETURN;
  END IF;
  PERFORM storetopics._mine_phrases(p_source, p_store);
  -- a run of words two of its files share, else one file's run that holds two of the cluster's three first words:
  -- where there is neither, those three words say more to a router than a single word or one file's other phrases
  -- (measured: bench/README.md, "Offline labels")
  UPDATE storetopics.clusters k
     SET phrase = (SELECT m.phrase FROM pg_temp.storetopics_mined m
                    WHERE m.grp = k.cluster_id AND strpos(m.phrase, ' ') > 0 AND (NOT m.one_file OR m.hits >= 2)
                    ORDER BY m.rank LIMIT 1)
   WHERE k.source_id = p_source AND k.store_key = p_store;
  UPDATE storetopics.store_state SET cluster_phrases_from = v_from WHERE source_id = p_source AND store_key = p_store;
  DROP TABLE pg_temp.storetopics_mine_words, pg_temp.storetopics_mine_files, pg_temp.storetopics_mined;
END $$;

-- A keyword-only store's topics (it has no clusters): up to 8 phrases made of its contrastive terms, from the 40
-- files that hold most of them; mined again when those terms or those files' counted words change
-- (store_state.phrases_from, a digest).  Returns the phrases.
CREATE OR REPLACE FUNCTION storetopics._store_phrases(p_source int, p_store text, p_terms text[]) RETURNS text[]
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  st storetopics.store_state;
  v_phrases text[];
  v_from text;
BEGIN
  SELECT * INTO st FROM storetopics.store_state WHERE source_id = p_source AND store_key = p_store;
  CREATE TEMP TABLE storetopics_mine_files ON COMMIT DROP AS
  SELECT 0 AS grp, x.file_key, x.digest FROM (
    SELECT f.file_key, md5(f.term_ids::text || f.counts::text) AS digest, count(*) AS hits
      FROM storetopics.file_terms f, unnest(f.term_ids) AS u(term_id)
     WHERE f.source_id = p_source AND f.store_key = p_store
       AND u.term_id IN (SELECT x.id FROM storetopics.lexemes x WHERE x.lexeme = ANY (p_terms[1:30]))
     GROUP BY 1, 2 ORDER BY 3 DESC, hashtext(f.file_key), 1 LIMIT 40) x;
  v_from := md5(array_to_string(p_terms[1:30], ' ') || '|' ||
                coalesce((SELECT string_agg(f.file_key || ':' || f.digest, ',' ORDER BY f.file_key)
                            FROM pg_temp.storetopics_mine_files f), ''));
  IF st.phrases_from IS NOT DISTINCT FROM v_from THEN
    DROP TABLE pg_temp.storetopics_mine_files;
    RETURN st.phrases;
  END IF;
  CREATE TEMP TABLE storetopics_mine_words ON COMMIT DROP AS
  SELECT 0 AS grp, u.lexeme, 1.0 / (1 + u.i / 5.0) AS weight FROM unnest(p_terms[1:30]) WITH ORDINALITY AS u(lexeme, i);
  PERFORM storetopics._mine_phrases(p_source, p_store);
  -- distinct phrases that share no word with a better one; phrases of a single file and single words (they rank
  -- after the others) only to make up three topics: beyond that the terms list says them
  v_phrases := ARRAY(
    WITH RECURSIVE pick AS (
      SELECT 1 AS n, m.rank, ARRAY[m.phrase] AS phrases, regexp_split_to_array(lower(m.phrase), ' ') AS used
        FROM pg_temp.storetopics_mined m WHERE m.rank = 1
      UNION ALL
      SELECT p.n + 1, m.rank, p.phrases || m.phrase, p.used || regexp_split_to_array(lower(m.phrase), ' ')
        FROM pick p, LATERAL (SELECT * FROM pg_temp.storetopics_mined m
                               WHERE m.rank > p.rank AND NOT regexp_split_to_array(lower(m.phrase), ' ') && p.used
                                 AND ((strpos(m.phrase, ' ') > 0 AND NOT m.one_file) OR p.n < 3)
                               ORDER BY m.rank LIMIT 1) m
       WHERE p.n < 8)
    SELECT unnest(phrases) FROM (SELECT phrases FROM pick ORDER BY n DESC LIMIT 1) x);
  UPDATE storetopics.store_state SET phrases = v_phrases, phrases_from = v_from
   WHERE source_id = p_source AND store_key = p_store;
  DROP TABLE pg_temp.storetopics_mine_words, pg_temp.storetopics_mine_files, pg_temp.storetopics_mined;
  RETURN v_phrases;
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
--       z 2.5-4.4 with every chunk outside the clusters; 2 of the section's own 1,076 files had both).  Up to 3
--       such files are shown, those both signals find apart first, then the most novel.  A store made of one-off
--       tokens (names) has no outlier file, so its names do not flood the list;
--     * recurring dense terms: (total_sq / total) x IDF, for terms in at least three files whose occurrences come
--       in clusters (total_sq / total >= 2, i.e. one-off mentions are ignored; a name two files share is not a
--       theme).
-- No merge joins: the planner cannot know how long the arrays are, so it sorted every (file, term) pair of the store
-- by term to merge them with the store's terms; hashing the terms streams the pairs instead (bench/README.md).
CREATE OR REPLACE FUNCTION storetopics.keywords(p_source int, p_store text, n_dominant int DEFAULT 10,
                                     n_distinctive int DEFAULT 8)
RETURNS TABLE (kind text, rank int, lexeme text, score float8, files int, total bigint, file_key text)
LANGUAGE sql STABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp SET enable_mergejoin = off
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
      -- ranked first, then the test, until n pass (OFFSET 0 keeps the test above the sort, off most terms)
      FROM (SELECT * FROM terms ORDER BY total DESC, term OFFSET 0) t WHERE storetopics.showable_term(t.term)
     ORDER BY t.total DESC, t.term LIMIT n_dominant
  ), novelty AS (
    -- rounded: a float sum depends on the order rows arrive in, and files with the same words must tie exactly
    -- whatever the table's physical order (the same state renders the same text)
    -- (every (file, term) pair of the store: the arrays are unnested in the select list, which streams them,
    -- where unnest(a, b) in FROM first copies each pair into a tuplestore)
    SELECT u.file_key, round((sum(u.n * t.idf) / sum(u.n))::numeric, 9)::float8 AS nov
      FROM (SELECT f.file_key, unnest(f.term_ids) AS term_id, unnest(f.counts) AS n FROM storetopics.file_terms f
             WHERE f.source_id = p_source AND f.store_key = p_store AND f.words > 0) u
      JOIN terms t ON t.term_id = u.term_id
     GROUP BY u.file_key
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
     -- files both signals find apart first: a uniform store has some novel files of its own, rarely apart as well
     ORDER BY a.file_key IS NULL, v.nov DESC, v.file_key LIMIT 3
  ), outlier_terms AS (
    -- the top 3 terms of each outlier file, even when they also rank as dominant (in a small store a needle's words
    -- do: they are still what the file is about); a term two outlier files share is kept once, with its best file
    SELECT DISTINCT ON (x.term) x.term, x.score, x.files, x.total, x.file_key, x.nov FROM (
      SELECT w.term, w.n * w.idf AS score, w.files, w.total, w.file_key, w.nov,
             row_number() OVER (PARTITION BY w.file_key ORDER BY w.n * w.idf DESC, w.term) AS r
        -- only the outlier files' words, then the test (OFFSET 0 keeps it above the joins: pushed down into the
        -- scan of terms, it ran on every term of the store)
        FROM (SELECT u.file_key, o.nov, t.term, u.n, t.idf, t.files, t.total
                FROM (SELECT f.file_key, unnest(f.term_ids) AS term_id, unnest(f.counts) AS n
                        FROM storetopics.file_terms f
                       WHERE f.source_id = p_source AND f.store_key = p_store
                         AND f.file_key IN (SELECT o.file_key FROM outliers o)) u
                JOIN outliers o ON o.file_key = u.file_key
                JOIN terms t ON t.term_id = u.term_id
              OFFSET 0) w
       WHERE storetopics.showable_term(w.term) AND w.idf > 0) x
     WHERE x.r <= 3
     ORDER BY x.term, x.nov DESC, x.score DESC, x.file_key
  ), dense AS (
    -- no more than the list takes, ranked first, then the tests (OFFSET 0, as in dominant)
    SELECT t.term, t.score, t.files, t.total
      FROM (SELECT t.term, (t.total_sq::float8 / t.total) * t.idf AS score, t.files, t.total FROM terms t
             WHERE t.files >= 3 AND t.total_sq >= 2 * t.total AND t.idf > 0
             ORDER BY 2 DESC, 1 OFFSET 0) t
     WHERE storetopics.showable_term(t.term)
       AND t.term NOT IN (SELECT d.term FROM dominant d)
       AND t.term NOT IN (SELECT o.term FROM outlier_terms o)
     ORDER BY t.score DESC, t.term LIMIT n_distinctive
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
                     SELECT DISTINCT ON (u.term_id) u.term_id, u.file_key
                       FROM (SELECT f.file_key, unnest(f.term_ids) AS term_id FROM storetopics.file_terms f
                              WHERE f.source_id = p_source AND f.store_key = p_store) u
                      WHERE u.term_id IN (SELECT x.id FROM storetopics.lexemes x WHERE x.lexeme = ANY (v_missing))
                      ORDER BY u.term_id, u.file_key) x);
  EXECUTE format('SELECT array_agg(x.t) FROM %s(''texts'', $1, $2, NULL) AS x(t text)',
                 storetopics._reader(p_source))
    INTO v_texts USING v_files, p_store;
  INSERT INTO storetopics.term_words (ts_config, lexeme, word)
  SELECT DISTINCT ON (m.lexeme) src.ts_config, m.lexeme, m.word
    -- Words are read both whole ("open-source") and split at hyphens ("open", "source").  A word speaks for a
    -- lexeme when it gives only that lexeme, or, for a hyphenated word, for its compound lexeme only.
    FROM (SELECT w.word, w.n, l.lexeme
            FROM (SELECT x.word, sum(r.n) AS n
                    -- the texts are split once, into runs of letters, quotes and hyphens, counted; each distinct
                    -- run then gives its whole word and its parts between hyphens (quotes and hyphens at either
                    -- end are punctuation, not part of the word)
                    FROM (SELECT r, count(*) AS n
                            FROM unnest(v_texts) t, regexp_split_to_table(lower(t), '[^[:alpha:]''-]+') r
                           WHERE storetopics.usable_text(t) GROUP BY r) r,
                         LATERAL (SELECT btrim(r.r, '''-')
                                  UNION ALL
                                  SELECT btrim(p, '''') FROM regexp_split_to_table(r.r, '-') p) AS x(word)
                   WHERE length(x.word) BETWEEN 2 AND 40
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

-- A list of words as render shows it: without the words screen_words() drops (unsafe alone, or part of an
-- instruction read in order), and a record of each dropped word and why (the reason of the word alone, else the
-- reason of the whole list), for topics.screened.
CREATE OR REPLACE FUNCTION storetopics._screened(words text[], what text, OUT kept text[], OUT dropped jsonb)
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_drop int[] := coalesce(storetopics.screen_words(words), '{}');
BEGIN
  kept := ARRAY(SELECT w FROM unnest(words) WITH ORDINALITY AS u(w, i) WHERE i <> ALL (v_drop) ORDER BY i);
  dropped := coalesce((SELECT jsonb_agg(jsonb_build_object('in', what, 'text', w, 'reason',
                                                           coalesce(storetopics.screen(w),
                                                                    storetopics.screen(array_to_string(words, ' ')),
                                                                    'instruction')) ORDER BY i)
                         FROM unnest(words) WITH ORDINALITY AS u(w, i) WHERE i = ANY (v_drop)), '[]');
END $$;

-- The label a router is shown for a cluster: the labeller's when it passes the screen, else the offline phrase, else
-- the offline label from the cluster's screened words (NULL when none passes: the cluster is then no topic).
CREATE OR REPLACE FUNCTION storetopics._shown_label(label text, phrase text, words text[], offline boolean)
RETURNS text
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp
RETURN CASE WHEN NOT offline AND label IS NOT NULL AND storetopics.screen(label) IS NULL THEN label
            WHEN phrase IS NOT NULL AND storetopics.screen(phrase) IS NULL THEN phrase
            WHEN storetopics.screen(storetopics.offline_label(words)) IS NULL THEN storetopics.offline_label(words) END;

-- The terms that tell a store apart from the other stores of its catalog, best first: a term counts by the share of
-- the store's files that hold it, p, against its share of the other stores' files, q (half a file added to both
-- counts: a term every file holds is no news), as p * ln(p / q), its part of the divergence between the store and the
-- rest; only terms more common here than elsewhere, in at least two files of a store of 20 or more (one file's words
-- are the distinctive list's business).  Exact: computed from the sums fold keeps (store_terms, catalog_terms, and
-- the catalog's size from its sources' store_count and file_count), one index probe per term of the store and no
-- other store's row read, whatever the catalog's size (bench/catalog.py measures it).  A store alone
-- in its catalog has nothing to be told apart from: its terms rank by p.
CREATE OR REPLACE FUNCTION storetopics.contrast_terms(p_source int, p_store text, n int DEFAULT 60)
RETURNS TABLE (lexeme text, score float8, files int, share float8, rest_share float8)
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
  WITH cat AS (
    SELECT storetopics._catalog(p_source) AS name
  ), own AS (
    SELECT greatest(st.files, 1)::float8 AS files FROM storetopics.store_state st
     WHERE st.source_id = p_source AND st.store_key = p_store
  ), whole AS (
    -- the catalog's size from its sources' counters (kept by fold), not from every store's row
    SELECT coalesce(sum(s.store_count), 0) AS stores, coalesce(sum(s.file_count), 0)::float8 AS files
      FROM storetopics.sources s, cat WHERE storetopics._catalog(s.id) = cat.name
  ), scored AS (
    SELECT x.lexeme, t.files, t.files / own.files AS p,
           (coalesce(c.files, t.files) - t.files + 0.5) / (whole.files - own.files + 0.5) AS q, whole.stores
      FROM storetopics.store_terms t JOIN storetopics.lexemes x ON x.id = t.term_id
      CROSS JOIN own CROSS JOIN whole CROSS JOIN cat
      LEFT JOIN storetopics.catalog_terms c ON c.catalog = cat.name AND c.term_id = t.term_id
     WHERE t.source_id = p_source AND t.store_key = p_store AND (t.files >= 2 OR own.files < 20)
  ), ranked AS (
    SELECT s.lexeme, round((CASE WHEN s.stores < 2 THEN s.p ELSE s.p * ln(s.p / s.q) END)::numeric, 9)::float8
             AS score, s.files, s.p, s.q
      FROM scored s
     WHERE s.stores < 2 OR s.p > s.q
     ORDER BY 2 DESC, 1
    OFFSET 0
  )
  -- ranked first, then tested in that order until n pass (OFFSET 0 keeps the test above the sort): showable_term
  -- is a call per term, and a store has tens of thousands of terms
  SELECT r.lexeme, r.score, r.files, r.p, r.q FROM ranked r
   WHERE storetopics.showable_term(r.lexeme)
   ORDER BY r.score DESC, r.lexeme
   LIMIT n;
END;

-- The cl100k tokens of a piece of a summary that follows a space: the sum over its space-separated chunks (each
-- with its leading space) of their counts in storetopics.token_counts, or of their bytes where no count is known
-- (an upper bound: every token is at least a byte).
CREATE OR REPLACE FUNCTION storetopics._tokens(piece text) RETURNS int
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
RETURN (SELECT coalesce(sum(coalesce(tc.tokens, octet_length(' ' || x.c))), 0)::int
          FROM regexp_split_to_table(piece, ' ') AS x(c) LEFT JOIN storetopics.token_counts tc ON tc.chunk = ' ' || x.c
         WHERE x.c <> '');

-- The chunks of a text that storetopics.token_counts has no count for (the worker and the CLI count them with
-- tiktoken and render again).
CREATE OR REPLACE FUNCTION storetopics._uncounted(p_text text) RETURNS text[]
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
RETURN ARRAY(SELECT DISTINCT ' ' || x.c FROM regexp_split_to_table(p_text, ' ') AS x(c)
              WHERE x.c <> '' AND NOT EXISTS (SELECT 1 FROM storetopics.token_counts tc WHERE tc.chunk = ' ' || x.c)
              ORDER BY 1);

-- Records token counts the worker or the CLI took with the real tokenizer.
CREATE OR REPLACE FUNCTION storetopics.record_token_counts(p_chunks text[], p_tokens int[]) RETURNS int
LANGUAGE sql SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
  INSERT INTO storetopics.token_counts (chunk, tokens)
  SELECT c, n FROM unnest(p_chunks, p_tokens) AS u(c, n) WHERE n > 0 ORDER BY 1
  ON CONFLICT (chunk) DO NOTHING;
  SELECT cardinality(p_chunks);
END;

-- The summary a router reads, within a budget of cl100k tokens: "Topics: a, b. Terms: c, d. Distinctive: e. N
-- files."  The size (a few tokens) is always there; the sections are filled in order of what routes (the topics,
-- then the distinctive needles, then the contrastive terms with what is left) and written in reading order.
CREATE OR REPLACE FUNCTION storetopics._pack(p_topics text[], p_terms text[], p_distinct text[], p_files bigint,
                                            p_budget int DEFAULT 200) RETURNS text
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_left int := p_budget - 1;   -- the first chunk has no leading space: a token of slack
  v_sec text[] := ARRAY['Topics:', 'Distinctive:', 'Terms:'];
  v_kept int[] := ARRAY[0, 0, 0];
  v_lists jsonb := jsonb_build_array(to_jsonb(coalesce(p_topics, '{}')), to_jsonb(coalesce(p_distinct, '{}')),
                                     to_jsonb(coalesce(p_terms, '{}')));
  v_cost int;
  i int;
  j int;
  v_item text;
  v_text text := '';
  v_size text := format('%s files.', storetopics._human_count(p_files));
BEGIN
  v_left := v_left - storetopics._tokens(v_size);
  FOR i IN 1..3 LOOP
    FOR j IN 0..jsonb_array_length(v_lists -> (i - 1)) - 1 LOOP
      EXIT WHEN i = 1 AND j >= 8 OR i = 2 AND j >= 8;
      v_item := v_lists -> (i - 1) ->> j;
      -- the item with its separator (the last one's "." costs what "," costs: both are one token); the section's
      -- name when it is the first
      v_cost := storetopics._tokens(v_item || ',') + CASE WHEN j = 0 THEN storetopics._tokens(v_sec[i]) ELSE 0 END;
      EXIT WHEN v_cost > v_left;
      v_left := v_left - v_cost;
      v_kept[i] := j + 1;
    END LOOP;
  END LOOP;
  FOR i IN SELECT unnest(ARRAY[1, 3, 2]) LOOP
    IF v_kept[i] > 0 THEN
      v_text := v_text || ' ' || v_sec[i] || ' ' ||
                (SELECT string_agg(x, ', ') FROM (SELECT jsonb_array_elements_text(v_lists -> (i - 1)) x
                                                  LIMIT v_kept[i]) y) || '.';
    END IF;
  END LOOP;
  RETURN ltrim(v_text || ' ' || v_size);
END $$;

-- Render one store's summary from its current state.  Writes store_topics/topics only when they change, and then
-- sends NOTIFY storetopics_updated '<source id>:<store key>'.  Returns whether the text changed.  count_first: when
-- some chunks of the candidates have no token count yet (store_state.uncounted), write nothing and return NULL: the
-- worker and the CLI count them with tiktoken and render again, in the same transaction, which packs what the first
-- call computed (pg_temp.storetopics_candidate, dropped at commit: the store's row stays locked in between, so
-- nothing it was computed from can change) instead of computing it again.
CREATE OR REPLACE FUNCTION storetopics.render(p_source int, p_store text, count_first boolean DEFAULT false)
RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  src storetopics.sources;
  st storetopics.store_state;
  -- what is packed (storetopics._render_candidate)
  v_topic_list text[];
  v_terms text[];
  v_dist text[];
  v_topics jsonb;
  v_reused boolean := false;
  v_text text;
  v_uncounted text[];
BEGIN
  SELECT * INTO src FROM storetopics.sources WHERE id = p_source;
  SELECT * INTO st FROM storetopics.store_state WHERE source_id = p_source AND store_key = p_store FOR UPDATE;
  IF NOT FOUND THEN
    RETURN false;
  END IF;
  IF st.files <= 0 THEN
    DELETE FROM storetopics.store_state WHERE source_id = p_source AND store_key = p_store;
    DELETE FROM storetopics.clusters WHERE source_id = p_source AND store_key = p_store;
    PERFORM storetopics._mirror(src, p_store, NULL);
    PERFORM pg_notify('storetopics_updated', p_source || ':' || p_store);
    RETURN true;
  END IF;
  IF to_regclass('pg_temp.storetopics_candidate') IS NOT NULL THEN
    SELECT x.topic_list, x.terms, x.distinctive, x.data INTO v_topic_list, v_terms, v_dist, v_topics
      FROM pg_temp.storetopics_candidate x
     WHERE x.source_id = p_source AND x.store_key = p_store AND x.version = st.version;
    v_reused := FOUND;   -- (the table stays until commit: the values read may still point into its TOAST)
  END IF;
  IF NOT v_reused THEN
    SELECT * INTO v_topic_list, v_terms, v_dist, v_topics FROM storetopics._render_candidate(src, st);
  END IF;
  v_text := storetopics._pack(v_topic_list, v_terms, v_dist, st.files);
  -- chunks of the candidates whose token count is not known (counted at one token per byte meanwhile): the text
  -- with every candidate, and each candidate as _pack costs it (followed by a comma, which the last one of a list
  -- is not in the text), so the same state packs the same way whatever was counted before
  v_uncounted := storetopics._uncounted(
    storetopics._pack(v_topic_list, v_terms, v_dist, st.files, 100000) || ' ' ||
    coalesce(array_to_string(v_topic_list[1:8] || v_dist[1:8] || v_terms, ', '), '') || ',');
  UPDATE storetopics.store_state SET uncounted = v_uncounted WHERE source_id = p_source AND store_key = p_store;
  IF count_first AND cardinality(v_uncounted) > 0 THEN
    IF to_regclass('pg_temp.storetopics_candidate') IS NULL THEN
      CREATE TEMP TABLE storetopics_candidate (source_id int, store_key text, version bigint, topic_list text[],
                                               terms text[], distinctive text[], data jsonb) ON COMMIT DROP;
    END IF;
    DELETE FROM pg_temp.storetopics_candidate x WHERE x.source_id = p_source AND x.store_key = p_store;
    INSERT INTO pg_temp.storetopics_candidate
    VALUES (p_source, p_store, st.version, v_topic_list, v_terms, v_dist, v_topics);
    RETURN NULL;
  END IF;
  UPDATE storetopics.store_state SET rendered_at = now(), rendered_version = st.version
   WHERE source_id = p_source AND store_key = p_store;
  IF st.store_topics IS NOT DISTINCT FROM v_text AND st.topics IS NOT DISTINCT FROM v_topics THEN
    RETURN false;
  END IF;
  UPDATE storetopics.store_state SET store_topics = v_text, topics = v_topics, updated_at = now()
   WHERE source_id = p_source AND store_key = p_store;
  PERFORM storetopics._mirror(src, p_store, v_text);
  PERFORM pg_notify('storetopics_updated', p_source || ':' || p_store);
  RETURN true;
END $$;

-- What render() packs: the topic list, the terms and the distinctive words (screened, each list without what an
-- earlier one says) and the topics jsonb, from the store's current state.
CREATE OR REPLACE FUNCTION storetopics._render_candidate(src storetopics.sources, st storetopics.store_state,
                                              OUT topic_list text[], OUT terms text[], OUT distinctive text[],
                                              OUT data jsonb)
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_kw jsonb;
  v_terms text[];
  v_dist text[];
  v_topics jsonb;
  v_cfg jsonb := storetopics._settings(src.id);
  v_clusters jsonb;
  v_topic_list text[];
  v_explained text[];
  v_screened jsonb := '[]';   -- what the screen dropped, and why
  v_s record;
  v_topics_from text;   -- what the topic list is made of: clusters, the labeller's store labels, mined phrases
BEGIN
  PERFORM storetopics.refresh_words(src.id, st.store_key);   -- the clusters' words and phrases, from the current counts
  PERFORM storetopics._render_terms(src, st.store_key);         -- pg_temp.storetopics_kw: dominant, distinctive, contrast
  SELECT array_agg(k.word ORDER BY k.rank) FILTER (WHERE k.kind = 'contrast'),
         array_agg(k.word ORDER BY k.rank) FILTER (WHERE k.kind = 'distinctive'),
         jsonb_build_object(
           'dominant', coalesce(jsonb_agg(jsonb_build_object('term', k.word, 'lexeme', k.lexeme, 'count', k.total,
                                                             'files', k.files) ORDER BY k.rank)
                               FILTER (WHERE k.kind = 'dominant'), '[]'),
           'distinctive', coalesce(jsonb_agg(jsonb_build_object('term', k.word, 'lexeme', k.lexeme,
                                   'score', round(k.score::numeric, 3), 'files', k.files, 'count', k.total,
                                   'file', k.file_key) ORDER BY k.rank) FILTER (WHERE k.kind = 'distinctive'), '[]'),
           'contrast', coalesce(jsonb_agg(jsonb_build_object('term', k.word, 'lexeme', k.lexeme,
                                'score', round(k.score::numeric, 6), 'files', k.files) ORDER BY k.rank)
                               FILTER (WHERE k.kind = 'contrast'), '[]'))
    INTO v_terms, v_dist, v_kw
    FROM pg_temp.storetopics_kw k;
  DROP TABLE pg_temp.storetopics_kw;

  -- Everything rendered is user text a router reads: screened (storetopics.screen), what is dropped is recorded.
  SELECT * INTO v_s FROM storetopics._screened(v_terms, 'terms');
  v_terms := v_s.kept;
  v_screened := v_screened || v_s.dropped;
  SELECT * INTO v_s FROM storetopics._screened(v_dist, 'distinctive');
  v_dist := v_s.kept;
  v_screened := v_screened || v_s.dropped;

  -- Clusters, largest first, with the label a router sees: the labeller's, or the offline one (a phrase).
  PERFORM storetopics._render_clusters(src.id, st.store_key, v_cfg ->> 'labeller' = 'offline');
  SELECT coalesce(jsonb_agg(jsonb_build_object(
           'id', k.cluster_id, 'label', k.shown, 'labeller', CASE WHEN k.shown = k.label THEN k.labeller ELSE 'offline' END,
           'phrase', k.phrase, 'share', round(k.share::numeric, 4), 'chunks', k.chunks, 'files', k.files,
           'keywords', to_jsonb(k.keywords),
           'representatives', (SELECT coalesce(jsonb_agg(r -> 'id'), '[]') FROM jsonb_array_elements(k.representatives) r),
           'outliers', k.outliers - k.outliers_at_fit) ORDER BY k.chunks DESC, k.cluster_id), '[]'),
         array_agg(lower(coalesce(k.shown, '') || ' ' || array_to_string(k.keywords, ' '))),
         v_screened
           || coalesce(jsonb_agg(jsonb_build_object('in', 'label', 'text', k.label, 'reason', storetopics.screen(k.label))
                                 ORDER BY k.chunks DESC, k.cluster_id)
                         FILTER (WHERE k.label IS NOT NULL AND storetopics.screen(k.label) IS NOT NULL), '[]')
           || coalesce((SELECT jsonb_agg(d ORDER BY k2.chunks DESC, k2.cluster_id, o)
                          FROM pg_temp.storetopics_shown k2, jsonb_array_elements(k2.dropped) WITH ORDINALITY AS x(d, o)),
                       '[]')
    INTO v_clusters, v_explained, v_screened
    FROM pg_temp.storetopics_shown k;
  DROP TABLE pg_temp.storetopics_shown;
  v_explained := regexp_split_to_array(coalesce(array_to_string(v_explained, ' '), ''), '\s+');
  -- The topic list: clusters that show the same label are one topic to a reader; a keyword-only store's topics are
  -- phrases of its contrastive terms.
  IF jsonb_array_length(v_clusters) > 0 THEN
    v_topics_from := 'clusters';
    v_topic_list := ARRAY(SELECT t.label
                            FROM (SELECT c ->> 'label' AS label, sum((c ->> 'share')::float8) AS share, min(o.i) AS first
                                    FROM jsonb_array_elements(v_clusters) WITH ORDINALITY AS o(c, i) GROUP BY 1) t
                           WHERE t.share >= 0.02 AND t.label IS NOT NULL
                           ORDER BY t.share DESC, t.first LIMIT 8);
  ELSIF src.embedding IS NULL THEN
    -- the LLM labeller's labels for the store (storetopics.record_store_labels), else the phrases mined offline
    v_topics_from := CASE WHEN v_cfg ->> 'labeller' <> 'offline' AND cardinality(st.store_labels) > 0
                          THEN 'labeller' ELSE 'phrases' END;
    SELECT * INTO v_s FROM storetopics._screened(
      CASE WHEN v_topics_from = 'labeller' THEN st.store_labels
           ELSE storetopics._store_phrases(src.id, st.store_key,
                                           ARRAY(SELECT c ->> 'lexeme' FROM jsonb_array_elements(v_kw -> 'contrast') c)) END,
      'topics');
    v_topic_list := v_s.kept;
    v_screened := v_screened || v_s.dropped;
  END IF;
  -- Distinctive words no cluster explains: the rare file that KMeans absorbs into a big cluster.
  v_dist := ARRAY(SELECT d FROM unnest(v_dist) WITH ORDINALITY AS u(d, i)
                   WHERE lower(d) <> ALL (coalesce(v_explained, '{}')) ORDER BY i);
  -- Terms that a topic already says are no news.
  v_terms := ARRAY(SELECT w FROM unnest(v_terms) WITH ORDINALITY AS u(w, i)
                    WHERE lower(w) <> ALL (regexp_split_to_array(lower(coalesce(array_to_string(v_topic_list, ' '), '')), '\s+'))
                      AND lower(w) <> ALL (coalesce(ARRAY(SELECT lower(x) FROM unnest(v_dist) x), '{}'))
                    ORDER BY i);
  v_topics := jsonb_build_object('version', 2, 'files', st.files, 'chunks', st.chunks, 'words', st.words,
                                 'skipped', st.skipped, 'clusters', v_clusters, 'topics', to_jsonb(v_topic_list),
                                 'catalog', coalesce(v_cfg ->> 'catalog', 'source:' || src.id),
                                 'fit', CASE WHEN st.fit_at IS NOT NULL THEN jsonb_build_object(
                                   'generation', st.fit_generation, 'at', st.fit_at, 'k', st.fit_k,
                                   'silhouette', round(st.fit_silhouette::numeric, 4),
                                   'single_theme', st.fit_single_theme, 'sample', st.fit_sample, 'dim', st.fit_dim,
                                   'space', st.fit_space, 'other_dimension_chunks', st.other_dim) END,
                                 'labeller', v_cfg ->> 'labeller', 'topics_from', v_topics_from,
                                 'screened', v_screened,
                                 'cost', (SELECT jsonb_build_object('calls', count(*), 'input_tokens',
                                                   coalesce(sum(l.input_tokens), 0), 'output_tokens',
                                                   coalesce(sum(l.output_tokens), 0), 'usd', coalesce(sum(l.cost_usd), 0))
                                            FROM storetopics.label_ledger l
                                           WHERE l.source_id = src.id AND l.store_key = st.store_key)) || v_kw;
  topic_list := v_topic_list;
  terms := v_terms;
  distinctive := v_dist;
  data := v_topics;
END $$;

-- A store's contrastive terms as a reader sees them: in the words people write (learnt first), a word two lexemes
-- show as ("run", "running") once, where it ranks first.  What render shows and what an LLM labeller is given.
CREATE OR REPLACE FUNCTION storetopics._contrast_shown(p_source int, p_store text, n int)
RETURNS TABLE (rank int, lexeme text, word text, score float8, files int)
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_cfg regconfig := (SELECT s.ts_config FROM storetopics.sources s WHERE s.id = p_source);
  v_lexemes text[];
  v_scores float8[];
  v_files int[];
BEGIN
  SELECT array_agg(c.lexeme ORDER BY c.score DESC, c.lexeme), array_agg(c.score ORDER BY c.score DESC, c.lexeme),
         array_agg(c.files ORDER BY c.score DESC, c.lexeme)
    INTO v_lexemes, v_scores, v_files
    FROM storetopics.contrast_terms(p_source, p_store, n) c;
  PERFORM storetopics._learn_words(p_source, p_store, coalesce(v_lexemes, '{}'));
  RETURN QUERY
    SELECT (row_number() OVER (ORDER BY x.i))::int, x.lexeme, x.word, x.score, x.files
      FROM (SELECT DISTINCT ON (w.word) w.*
              FROM (SELECT u.lexeme, storetopics._show(v_cfg, u.lexeme) AS word, u.score, u.files, u.i
                      FROM unnest(v_lexemes, v_scores, v_files) WITH ORDINALITY AS u(lexeme, score, files, i)) w
             ORDER BY w.word, w.i) x
     ORDER BY x.i;
END $$;

-- render()'s term lists, in pg_temp.storetopics_kw (kind, rank, lexeme, word, score, files, total, file_key): the
-- dominant and distinctive lists of keywords() and the contrastive terms (as _contrast_shown() shows them), as people
-- write them; two lexemes that show as one word ("run", "running") are shown once, where they rank first.  The
-- words of the three lists are learnt together: each learning reads every (file, term) pair of the store once.
CREATE OR REPLACE FUNCTION storetopics._render_terms(src storetopics.sources, p_store text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  CREATE TEMP TABLE storetopics_kw ON COMMIT DROP AS
  SELECT k.kind, k.rank, k.lexeme, NULL::text AS word, k.score, k.files, k.total, k.file_key
    FROM storetopics.keywords(src.id, p_store) k
  UNION ALL
  SELECT 'contrast', (row_number() OVER (ORDER BY c.score DESC, c.lexeme))::int, c.lexeme, NULL, c.score, c.files,
         NULL, NULL
    FROM storetopics.contrast_terms(src.id, p_store, 80) c;
  PERFORM storetopics._learn_words(src.id, p_store, ARRAY(SELECT DISTINCT k.lexeme FROM pg_temp.storetopics_kw k));
  UPDATE pg_temp.storetopics_kw SET word = storetopics._show(src.ts_config, lexeme);
  DELETE FROM pg_temp.storetopics_kw k USING pg_temp.storetopics_kw k2
   WHERE k.word = k2.word AND k.kind = k2.kind AND k2.rank < k.rank;
END $$;

-- render()'s clusters, in pg_temp.storetopics_shown: each with its screened words and the label shown (the
-- labeller's if it passes the screen, else the offline phrase, else the offline words).
CREATE OR REPLACE FUNCTION storetopics._render_clusters(p_source int, p_store text, p_offline boolean) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  CREATE TEMP TABLE storetopics_shown ON COMMIT DROP AS
  SELECT k.cluster_id, k.label, k.labeller, k.phrase, k.chunks, k.files, k.representatives, k.outliers,
         k.outliers_at_fit, s.kept AS keywords, s.dropped,
         storetopics._shown_label(k.label, k.phrase, s.kept, p_offline) AS shown,
         k.chunks::float8 / greatest(sum(k.chunks) OVER (), 1) AS share
    FROM storetopics.clusters k CROSS JOIN LATERAL storetopics._screened(k.keywords, 'cluster words') AS s
   WHERE k.source_id = p_source AND k.store_key = p_store AND k.chunks > 0;
END $$;

-- What \df+ shows a DBA.
COMMENT ON FUNCTION storetopics.keywords(int, text, int, int) IS
  'A store''s dominant (by count) and distinctive (outlier files, dense terms) terms, exact, deterministic.';
COMMENT ON FUNCTION storetopics.contrast_terms(int, text, int) IS
  'The terms that tell a store apart from the other stores of its catalog, best first (p ln(p/q) over file shares), exact.';
COMMENT ON FUNCTION storetopics.record_token_counts(text[], int[]) IS
  'Record cl100k token counts of summary chunks, counted by the worker or the CLI with tiktoken.';
COMMENT ON FUNCTION storetopics.render(int, text, boolean) IS
  'Render a store''s summary (store_topics, topics) from its state within 200 cl100k tokens; returns whether it changed (NULL with count_first while token counts are missing).';

-- idempotent/075-store-labels.sql
-- ------------------------------------------------------------------------------------------------------------
-- A keyword-only store's labels from an LLM labeller
-- ------------------------------------------------------------------------------------------------------------
-- A store with no embedding column has no clusters.  Offline, its topics are phrases mined from its files
-- (storetopics._store_phrases).  With an LLM labeller, one call per store turns its contrastive terms and those
-- phrases into 3-8 labels, under the rules a cluster's label follows: the keyword gate decides when they are due
-- again, each label is checked for its form (label_ok), screened (screen()) and grounded (every word among what the
-- labeller was shown), a failed call keeps the old labels and is retried with backoff.  The LLM sees these words
-- and phrases and the other stores' names and terms, never the corpus.

-- The gate (called by refresh_words when the store changed): the labels are due when the store has none yet, or when
-- its contrastive terms moved by more than keyword_shift since they were made (storetopics._words_moved, as for a
-- cluster).  Returns 1 when they became due.
CREATE OR REPLACE FUNCTION storetopics._store_label_gate(p_source int, p_store text) RETURNS int
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  st storetopics.store_state;
  v_cfg jsonb := storetopics._settings(p_source);
  v_terms text[];
BEGIN
  SELECT * INTO st FROM storetopics.store_state WHERE source_id = p_source AND store_key = p_store;
  IF NOT FOUND OR st.store_label_needed OR v_cfg ->> 'labeller' = 'offline' OR st.files <= 0 THEN
    RETURN 0;
  END IF;
  v_terms := ARRAY(SELECT c.lexeme FROM storetopics._contrast_shown(p_source, p_store, 80) c ORDER BY c.rank LIMIT 15);
  IF cardinality(v_terms) = 0
     OR (st.store_label_words IS NOT NULL
         AND storetopics._words_moved(st.store_label_words, v_terms) <= (v_cfg ->> 'keyword_shift')::float8 * 10) THEN
    RETURN 0;
  END IF;
  UPDATE storetopics.store_state SET store_label_needed = true, store_label_failures = 0, store_label_retry_at = NULL
   WHERE source_id = p_source AND store_key = p_store;
  RETURN 1;
END $$;

-- What the labeller is given for a keyword-only store whose labels are due (no row otherwise): its first 30
-- contrastive terms as people write them, the phrases mined from its files, and the catalog's other stores.
CREATE OR REPLACE FUNCTION storetopics.store_labels_due(p_source int, p_store text)
RETURNS TABLE (terms text[], phrases text[], others text[], files bigint, failures int)
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  st storetopics.store_state;
  v_lexemes text[];
  v_words text[];
BEGIN
  SELECT * INTO st FROM storetopics.store_state s
   WHERE s.source_id = p_source AND s.store_key = p_store AND s.store_label_needed AND s.files > 0
     AND coalesce(s.store_label_retry_at, '-infinity') <= now();
  IF NOT FOUND OR storetopics._settings(p_source) ->> 'labeller' = 'offline' THEN
    RETURN;
  END IF;
  -- the contrastive terms render shows (so the phrases mined here are those render shows offline, mined once)
  SELECT array_agg(c.lexeme ORDER BY c.rank), (array_agg(c.word ORDER BY c.rank))[1:30] INTO v_lexemes, v_words
    FROM storetopics._contrast_shown(p_source, p_store, 80) c;
  RETURN QUERY SELECT v_words, storetopics._store_phrases(p_source, p_store, v_lexemes),
                      storetopics._other_stores(p_source, p_store), st.files, st.store_label_failures;
END $$;

-- Write back one call for a keyword-only store's labels (the ledger records it, cluster NULL):
--   'ok':       each label that passes label_ok, screen() and grounding (its words among the terms and phrases the
--               labeller was shown) is kept, up to 8, repeats dropped; the detail names those refused; none kept
--               counts as rejected;
--   'rejected': no labels (the answer had no label's form): the mined phrases are shown, not asked again until the
--               terms move;
--   'error':    no answer: the old labels stay, a retry is scheduled with backoff.
-- Returns the labels the store holds now (NULL when the store is gone).
CREATE OR REPLACE FUNCTION storetopics.record_store_labels(p_source int, p_store text, p_outcome text, p_labels text[],
                                                p_labeller text, p_model text DEFAULT NULL, p_input_tokens int DEFAULT 0,
                                                p_output_tokens int DEFAULT 0, p_detail text DEFAULT NULL)
RETURNS text[]
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  st storetopics.store_state;
  v_cfg regconfig := (SELECT s.ts_config FROM storetopics.sources s WHERE s.id = p_source);
  v_outcome text := p_outcome;
  v_detail text := p_detail;
  v_lexemes text[];
  v_words text[];
  v_grounds text[];
  v_kept text[] := '{}';
  v_refused text[] := '{}';
  v_why text;
  l text;
BEGIN
  SELECT * INTO st FROM storetopics.store_state WHERE source_id = p_source AND store_key = p_store FOR UPDATE;
  IF NOT FOUND THEN
    PERFORM storetopics._ledger(p_source, p_store, NULL, p_labeller, p_model, p_input_tokens, p_output_tokens,
                                CASE WHEN p_outcome = 'error' THEN 'error' ELSE 'rejected' END, 'the store is gone');
    RETURN NULL;
  END IF;
  SELECT array_agg(c.lexeme ORDER BY c.rank), array_agg(c.word ORDER BY c.rank) INTO v_lexemes, v_words
    FROM storetopics._contrast_shown(p_source, p_store, 80) c;
  IF v_outcome = 'ok' THEN
    v_grounds := coalesce(v_lexemes[1:30], '{}') || tsvector_to_array(to_tsvector(v_cfg,
                   coalesce(array_to_string(v_words[1:30], ' '), '') || ' ' || coalesce(array_to_string(st.phrases, ' '), '')));
    FOREACH l IN ARRAY coalesce(p_labels, '{}') LOOP
      l := trim(l);
      v_why := CASE WHEN NOT storetopics.label_ok(l) THEN 'not a 2-5 word label'
                    WHEN storetopics.screen(l) IS NOT NULL THEN 'screened: ' || storetopics.screen(l)
                    WHEN NOT tsvector_to_array(to_tsvector(v_cfg, l)) <@ v_grounds
                      THEN 'not grounded: a word of it is not in the store''s terms or phrases'
                    WHEN lower(l) = ANY (ARRAY(SELECT lower(k) FROM unnest(v_kept) k)) THEN 'repeated'
                    WHEN cardinality(v_kept) >= 8 THEN 'more than 8' END;
      IF v_why IS NULL THEN
        v_kept := v_kept || l;
      ELSE
        v_refused := v_refused || (left(l, 60) || ' (' || v_why || ')');
      END IF;
    END LOOP;
    v_outcome := CASE WHEN cardinality(v_kept) > 0 THEN 'ok' ELSE 'rejected' END;
    v_detail := nullif(array_to_string(v_refused, '; '), '');
    IF v_outcome = 'rejected' THEN
      v_detail := coalesce(v_detail, 'no labels');
    END IF;
  END IF;
  PERFORM storetopics._ledger(p_source, p_store, NULL, p_labeller, p_model, p_input_tokens, p_output_tokens,
                              v_outcome, v_detail);
  IF v_outcome = 'error' THEN
    UPDATE storetopics.store_state
       SET store_label_error = left(v_detail, 500), store_label_failures = store_label_failures + 1,
           store_label_retry_at = storetopics._retry_at(store_label_failures)
     WHERE source_id = p_source AND store_key = p_store;
    RETURN st.store_labels;
  END IF;
  UPDATE storetopics.store_state
     SET store_labels = CASE WHEN v_outcome = 'ok' THEN v_kept END, store_label_words = v_lexemes[1:15],
         store_label_needed = false, store_label_failures = 0, store_label_retry_at = NULL,
         store_label_error = CASE WHEN v_detail IS NOT NULL THEN left(v_outcome || ': ' || v_detail, 500) END,
         version = version + 1
   WHERE source_id = p_source AND store_key = p_store;
  RETURN CASE WHEN v_outcome = 'ok' THEN v_kept ELSE '{}' END;
END $$;

-- What \df+ shows a DBA.
COMMENT ON FUNCTION storetopics.store_labels_due(int, text) IS
  'For a keyword-only store whose labels are due from the configured LLM labeller: what it may see (contrastive terms, mined phrases, the other stores); no row otherwise.';
COMMENT ON FUNCTION storetopics.record_store_labels(int, text, text, text[], text, text, int, int, text) IS
  'Record the call for a keyword-only store''s labels in the ledger and keep each label that passes label_ok, screen() and the grounding check; errors schedule a retry with backoff. Returns the labels held.';

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

-- The sources a backfill concerns (all, one table, or those that hold or may come to hold a store key), one row
-- each: present is false for a table dropped without detach (skipped, with a warning); resync when the source is
-- to be recounted whole (attach, TRUNCATE).  The SQL backfill() and the CLI's select the same way.
CREATE OR REPLACE FUNCTION storetopics.backfill_sources(p_store text DEFAULT NULL, p_source regclass DEFAULT NULL)
RETURNS TABLE (source_id int, chunks regclass, resync boolean, present boolean)
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
  SELECT x.id, x.chunks,
         EXISTS (SELECT 1 FROM storetopics.pending p WHERE p.source_id = x.id AND p.resync),
         EXISTS (SELECT 1 FROM pg_catalog.pg_class c WHERE c.oid = x.chunks)
    FROM storetopics.sources x
   WHERE (p_source IS NULL OR x.chunks = p_source)
     AND (p_store IS NULL
          OR EXISTS (SELECT 1 FROM storetopics.store_state y WHERE y.source_id = x.id AND y.store_key = p_store)
          OR EXISTS (SELECT 1 FROM storetopics.pending p WHERE p.source_id = x.id))
   ORDER BY x.id;
END;

-- The stores of a source (or the one store) with work due after a fold, and which: fit (why a (re-)fit is due, or
-- NULL), words (the clusters' words predate the store's last change: refresh_words() runs the keyword gate), label
-- (a cluster's label is due from an LLM labeller now), render (render_due()).  One pass over each such store, in
-- this order, is what backfill() (SQL), `storetopics backfill` and the worker do.
CREATE OR REPLACE FUNCTION storetopics.stores_due(p_source int, p_store text DEFAULT NULL)
RETURNS TABLE (store_key text, fit text, words boolean, label boolean, render boolean)
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
  SELECT d.store_key, d.fit, d.words, d.label, d.render
    FROM (SELECT st.store_key,
                 CASE WHEN st.files > 0 THEN storetopics.fit_due(st.source_id, st.store_key) END AS fit,
                 st.words_version <> st.version
                   AND EXISTS (SELECT 1 FROM storetopics.clusters k
                                WHERE k.source_id = st.source_id AND k.store_key = st.store_key) AS words,
                 storetopics._settings(st.source_id) ->> 'labeller' <> 'offline'
                   AND (EXISTS (SELECT 1 FROM storetopics.clusters k
                                 WHERE k.source_id = st.source_id AND k.store_key = st.store_key AND k.label_needed
                                   AND k.chunks > 0 AND coalesce(k.label_retry_at, '-infinity') <= now())
                        -- a keyword-only store's labels (storetopics.store_labels_due)
                        OR (st.store_label_needed AND coalesce(st.store_label_retry_at, '-infinity') <= now()))
                   AS label,
                 storetopics.render_due(st) AS render
            FROM storetopics.store_state st
           WHERE st.source_id = p_source AND (p_store IS NULL OR st.store_key = p_store)) d
   WHERE d.fit IS NOT NULL OR d.words OR d.label OR d.render
   ORDER BY d.store_key;
END;

CREATE OR REPLACE FUNCTION storetopics.backfill(store_key text DEFAULT NULL, source regclass DEFAULT NULL)
RETURNS TABLE (source_id int, store text, files bigint, chunks bigint, changed boolean, clusters int)
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  s record;
  v_started timestamptz := clock_timestamp();
BEGIN
  FOR s IN SELECT x.source_id AS id, x.chunks FROM storetopics.backfill_sources(backfill.store_key, backfill.source) x
            WHERE x.present LOOP
    -- One source's failure (its owner lacks a right its expressions need, a row that cannot be read) is that
    -- source's alone: its work is rolled back, the others go on.
    BEGIN
      RETURN QUERY SELECT * FROM storetopics._backfill_source(s.id, backfill.store_key, v_started);
    EXCEPTION WHEN OTHERS THEN
      RAISE WARNING 'storetopics: source % (%) was not brought up to date: %', s.id, s.chunks, SQLERRM
        USING HINT = 'Its summaries stay as they were; fix the cause and run backfill again.';
    END;
  END LOOP;
  RAISE NOTICE 'storetopics: backfill took %', clock_timestamp() - v_started;
END $$;
COMMENT ON FUNCTION storetopics.backfill(text, regclass) IS
  'Fold, cluster (where plpython3u is installed) and render every store of every source (or of one store key, one '
  'table) synchronously; returns the stores rendered.  A source that fails is reported (WARNING) and skipped.';

-- backfill() for one source: fold what was logged before p_started, cluster the stores whose fit is due (inside
-- the database, where plpython3u is), render the stores whose state changed.
CREATE OR REPLACE FUNCTION storetopics._backfill_source(p_source int, p_store text, p_started timestamptz)
RETURNS TABLE (source_id int, store text, files bigint, chunks bigint, changed boolean, clusters int)
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_store record;
  v_done int;
BEGIN
  LOOP
    v_done := storetopics.fold(p_source);
    -- Up to date as of the call: changes logged after it started do not keep it folding (and holding the
    -- source lock) for as long as writers keep writing.
    EXIT WHEN v_done = 0 OR NOT EXISTS (SELECT 1 FROM storetopics.pending p
                                         WHERE p.source_id = p_source AND p.logged_at < p_started);
    RAISE NOTICE 'storetopics: source %: folded % files', p_source, v_done;
  END LOOP;
  FOR v_store IN SELECT d.store_key FROM storetopics.stores_due(p_source, p_store) d WHERE d.fit IS NOT NULL
                  ORDER BY d.store_key LOOP
    IF to_regprocedure('storetopics._fit_in_database(int, text)') IS NOT NULL THEN
      -- clustering inside the database; labels are the offline ones (no network call inside a transaction)
      BEGIN
        PERFORM storetopics.cluster(p_source, v_store.store_key);
      EXCEPTION WHEN OTHERS THEN
        RAISE WARNING 'storetopics: clustering store % of source % failed, its summary keeps the keywords: %',
          v_store.store_key, p_source, SQLERRM;
      END;
    ELSE
      RAISE NOTICE 'storetopics: stores with embeddings are not clustered: plpython3u is not installed here'
        USING HINT = 'Run `storetopics backfill` (CLI) or the worker, which cluster outside the database.';
      EXIT;
    END IF;
  END LOOP;
  RETURN QUERY
    SELECT y.source_id, y.store_key, y.files, y.chunks, storetopics.render(y.source_id, y.store_key),
           (SELECT count(*)::int FROM storetopics.clusters k
             WHERE k.source_id = y.source_id AND k.store_key = y.store_key AND k.chunks > 0)
      FROM storetopics.store_state y
     WHERE y.source_id = p_source AND (p_store IS NULL OR y.store_key = p_store) AND storetopics.render_due(y)
     ORDER BY y.store_key;
END $$;

-- What \df+ shows a DBA.
COMMENT ON FUNCTION storetopics.render_due(storetopics.store_state) IS
  'Whether a store''s summary must be rendered again (its state changed since, or it emptied).';
COMMENT ON FUNCTION storetopics.backfill_sources(text, regclass) IS
  'The sources a backfill of (store key, table) concerns, with whether each is to be recounted whole and whether its table still exists.';
COMMENT ON FUNCTION storetopics.stores_due(int, text) IS
  'The stores of a source with work due (fit, words, label, render): what one refresh pass does to each.';

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
    OR (storetopics._settings(p_source) ->> 'labeller' <> 'offline'
        AND (EXISTS (SELECT 1 FROM storetopics.clusters k
                      WHERE k.source_id = p_source AND k.store_key = p_store AND k.label_needed AND k.chunks > 0
                        AND k.label_retry_at <= now())
             OR EXISTS (SELECT 1 FROM storetopics.store_state st
                         WHERE st.source_id = p_source AND st.store_key = p_store AND st.store_label_needed
                           AND st.store_label_retry_at <= now())));

-- Record what changed since the last look: stores with logged changes, stores folded but not rendered since, and
-- stores whose labelling retry came due.  One session at a time (the others skip: the one syncing serves them).
-- A new change bumps the store's generation; the first one sets dirty_since.  Changes that name no store (deletes,
-- TRUNCATE, attach) are found by fold(), which bumps the versions of the stores they touched.  A fold is no change
-- of its own: a store already dirty from the changes it folded keeps its last change time (its debounce counts from
-- its writes, not from another store's pass that folded them).
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
     WHERE p.store_key IS NOT NULL AND char_length(p.store_key) <= storetopics.max_store_key()   -- else never a store
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
    UNION ALL
    SELECT st.source_id, st.store_key, st.store_label_retry_at, st.store_label_retry_at, true
      FROM storetopics.store_state st
     WHERE st.store_label_needed AND st.store_label_retry_at <= now()
       AND storetopics._settings(st.source_id) ->> 'labeller' <> 'offline'
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
     AND (excluded.generation = 1 OR w.leased_by IS NULL OR w.lease_expires < now())
     -- nor is a fold of changes already seen (excluded.generation 0: only folded, nothing logged)
     AND (excluded.generation = 1 OR w.dirty_since IS NULL OR w.changed_at IS NULL);
END $$;

-- When a dirty store is due: quiet for `debounce` seconds since its last change, or dirty for `max_staleness`.
CREATE OR REPLACE FUNCTION storetopics._work_due_at(w storetopics.work, cfg jsonb) RETURNS timestamptz
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
RETURN CASE WHEN w.dirty_since IS NOT NULL THEN
  greatest(least(coalesce(w.changed_at, w.dirty_since) + make_interval(secs => (cfg ->> 'debounce')::float8),
                 w.dirty_since + make_interval(secs => (cfg ->> 'max_staleness')::float8)),
           coalesce(w.next_attempt_at, '-infinity')) END;

-- Why a dirty store is due when _work_due_at says: 'debounce' (quiet for `debounce` seconds after its last change),
-- 'max_staleness' (dirty that long under a steady stream of changes) or 'backoff' (a failed pass is tried again).
CREATE OR REPLACE FUNCTION storetopics._work_due_why(w storetopics.work, cfg jsonb) RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
RETURN CASE WHEN w.dirty_since IS NULL THEN NULL
            WHEN w.next_attempt_at > least(
                   coalesce(w.changed_at, w.dirty_since) + make_interval(secs => (cfg ->> 'debounce')::float8),
                   w.dirty_since + make_interval(secs => (cfg ->> 'max_staleness')::float8)) THEN 'backoff'
            WHEN coalesce(w.changed_at, w.dirty_since) + make_interval(secs => (cfg ->> 'debounce')::float8)
                 <= w.dirty_since + make_interval(secs => (cfg ->> 'max_staleness')::float8) THEN 'debounce'
            ELSE 'max_staleness' END;

-- Sources whose logged changes name no store (deletes, TRUNCATE, attach, keys unknown when logged), debounced like
-- stores (p_now: at once, `worker --now`): the worker folds them, and the stores the fold touched become dirty.
DROP FUNCTION IF EXISTS storetopics.sources_to_fold();   -- (0.1: no p_now)
CREATE OR REPLACE FUNCTION storetopics.sources_to_fold(p_now boolean DEFAULT false) RETURNS SETOF int
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
  SELECT p.source_id
    FROM storetopics.pending p
    JOIN storetopics.sources s ON s.id = p.source_id
   WHERE p.store_key IS NULL AND NOT (storetopics._settings(s.id) ->> 'paused')::boolean
   GROUP BY p.source_id
  HAVING p_now
      OR least(max(p.logged_at) + make_interval(secs => (storetopics._settings(p.source_id) ->> 'debounce')::float8),
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
-- Stores of a source whose last pass over some store failed come after every other due store: a source whose
-- passes keep failing (a tenant's key expression that runs into the worker's time limit, and a fold fails for every
-- store of its source) is served when nothing else is waiting, so it holds the others up by the one pass in flight
-- at most, however many stores it has.  p_now (`worker --now`): a dirty store is due at once, debounce and
-- max_staleness aside (the backoff of a failed pass still holds).
DROP FUNCTION IF EXISTS storetopics.claim(text, float8, int);   -- (0.1: no p_now)
CREATE OR REPLACE FUNCTION storetopics.claim(p_worker text, p_lease float8 DEFAULT 60, p_limit int DEFAULT 1,
                                             p_now boolean DEFAULT false)
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
       AND (storetopics._work_due_at(w, cfg) <= now() OR p_now AND coalesce(w.next_attempt_at, now()) <= now())
     ORDER BY EXISTS (SELECT 1 FROM storetopics.work f WHERE f.source_id = w.source_id AND f.attempts > 0),
              storetopics._work_due_at(w, cfg), w.source_id, w.store_key
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
-- expiry and another worker took the store over, or, with count_first, when token counts are missing (see render).
-- The work row stays locked until the render commits.
CREATE OR REPLACE FUNCTION storetopics.work_render(p_worker text, p_source int, p_store text,
                                                  count_first boolean DEFAULT false) RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  PERFORM 1 FROM storetopics.work w
    WHERE w.source_id = p_source AND w.store_key = p_store AND w.leased_by = p_worker AND w.lease_expires >= now()
      FOR UPDATE;
  IF NOT FOUND THEN
    RETURN NULL;
  END IF;
  RETURN storetopics.render(p_source, p_store, count_first);
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
  -- the labels waiting for a retry: the clusters', or a keyword-only store's
  LEFT JOIN LATERAL (SELECT max(c.label_failures) AS label_failures, min(c.label_retry_at) AS label_retry_at,
                            (array_agg(c.label_error ORDER BY c.label_failures DESC)
                               FILTER (WHERE c.label_failures > 0))[1] AS label_error
                       FROM (SELECT c.label_failures, c.label_retry_at, c.label_error FROM storetopics.clusters c
                              WHERE c.source_id = x.source_id AND c.store_key = x.store_key AND c.chunks > 0
                                AND c.label_needed
                             UNION ALL
                             SELECT st.store_label_failures, st.store_label_retry_at, st.store_label_error
                              WHERE st.store_label_needed) c) k ON true
  LEFT JOIN LATERAL (SELECT count(*) AS calls, sum(g.cost_usd) AS cost_usd FROM storetopics.label_ledger g
                      WHERE g.source_id = x.source_id AND g.store_key = x.store_key) l ON true
 WHERE st.files > 0 OR w.dirty_since IS NOT NULL;
END;

-- What waits for a worker, and when it is due (`storetopics worker --once` and `status` say it): each dirty store not
-- leased, its due time and why (_work_due_why; 'paused' with no due time for a paused source); logged changes of a
-- store no worker has looked at yet, debounced the same way; and per source with changes that name no store
-- (attach, DELETE, TRUNCATE), a row with store_key NULL: they are folded first, when quiet like a store.
CREATE OR REPLACE FUNCTION storetopics.work_due()
RETURNS TABLE (source regclass, source_id int, store_key text, due_at timestamptz, why text)
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
SELECT s.chunks, x.source_id, x.store_key, CASE WHEN NOT (cfg ->> 'paused')::boolean THEN x.due_at END,
       CASE WHEN (cfg ->> 'paused')::boolean THEN 'paused' ELSE x.why END
  FROM (SELECT w.source_id, w.store_key, storetopics._work_due_at(w, storetopics._settings(w.source_id)) AS due_at,
               storetopics._work_due_why(w, storetopics._settings(w.source_id)) AS why
          FROM storetopics.work w
         WHERE w.dirty_since IS NOT NULL AND (w.leased_by IS NULL OR w.lease_expires < now())
        UNION ALL
        SELECT p.source_id, p.store_key,
               least(p.last + make_interval(secs => (storetopics._settings(p.source_id) ->> 'debounce')::float8),
                     p.first + make_interval(secs => (storetopics._settings(p.source_id) ->> 'max_staleness')::float8)),
               CASE WHEN p.last + make_interval(secs => (storetopics._settings(p.source_id) ->> 'debounce')::float8)
                         <= p.first + make_interval(secs => (storetopics._settings(p.source_id) ->> 'max_staleness')::float8)
                    THEN 'debounce' ELSE 'max_staleness' END
          FROM (SELECT q.source_id, q.store_key, min(q.logged_at) AS first, max(q.logged_at) AS last
                  FROM storetopics.pending q
                 WHERE q.store_key IS NULL OR char_length(q.store_key) <= storetopics.max_store_key()
                 GROUP BY 1, 2) p
         WHERE p.store_key IS NULL
            OR NOT EXISTS (SELECT 1 FROM storetopics.work w
                            WHERE w.source_id = p.source_id AND w.store_key = p.store_key
                              AND w.dirty_since IS NOT NULL)) x
  JOIN storetopics.sources s ON s.id = x.source_id
 CROSS JOIN LATERAL storetopics._settings(s.id) AS cfg
 ORDER BY 4 NULLS LAST, 2, 3 NULLS FIRST;
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

-- The periodic count check (verify()): sources whose last check is older than their settings.verify_every seconds
-- get a count-check event; their next fold compares every file's live chunk count with the folded one.  Called by
-- the worker on every tick (cheap: one row per source).  Returns how many sources were asked.
CREATE OR REPLACE FUNCTION storetopics.verify_due() RETURNS int
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_n int;
BEGIN
  WITH due AS (
    UPDATE storetopics.sources s SET checked_at = now()
     WHERE (storetopics._settings(s.id) ->> 'verify_every')::float8 > 0
       AND coalesce(s.checked_at, s.attached_at)
           + make_interval(secs => (storetopics._settings(s.id) ->> 'verify_every')::float8) <= now()
       AND NOT (storetopics._settings(s.id) ->> 'paused')::boolean
       AND EXISTS (SELECT 1 FROM pg_class c WHERE c.oid = s.chunks)
    RETURNING s.id, s.owner)
  INSERT INTO storetopics.pending (source_id, deletes, logged_by) SELECT due.id, true, due.owner FROM due;
  GET DIAGNOSTICS v_n = ROW_COUNT;
  RETURN v_n;
END $$;
COMMENT ON FUNCTION storetopics.verify_due() IS
  'For the worker: ask a count check (see verify()) of every source whose last one is older than verify_every.';

-- What \df+ shows a DBA.
COMMENT ON FUNCTION storetopics.failing_after() IS
  'Failures in a row after which a store shows as failing (3).';
COMMENT ON FUNCTION storetopics.sources_to_fold(boolean) IS
  'For the worker: sources whose logged changes name no store (deletes, TRUNCATE, attach), debounced (p_now: all).';
COMMENT ON FUNCTION storetopics.worker_heartbeat(text, text, int, float8, int, text) IS
  'For the worker: register or beat a worker''s heart and extend its leases; returns how many it holds.';
COMMENT ON FUNCTION storetopics.claim(text, float8, int, boolean) IS
  'For the worker: lease up to p_limit due stores (FOR UPDATE SKIP LOCKED; p_now: every dirty store is due); '
  'returns them with their generation.';
COMMENT ON FUNCTION storetopics.work_due() IS
  'What waits for a worker: each dirty store (and each source with changes that name no store), when it is due and '
  'why: debounce, max_staleness, backoff or paused.';
COMMENT ON FUNCTION storetopics.next_due() IS
  'For the worker: seconds until a store can next be claimed (NULL: nothing dirty).';
COMMENT ON FUNCTION storetopics.lease_held(text, int, text) IS
  'For the worker: whether it still holds its lease on a store.';
COMMENT ON FUNCTION storetopics.work_render(text, int, text, boolean) IS
  'For the worker: render() if the lease is still held (NULL otherwise).';
COMMENT ON FUNCTION storetopics.work_done(text, int, text, bigint, boolean, text, int) IS
  'For the worker: a pass ended; release the lease (compare-and-set on the generation); a failure backs off.';
COMMENT ON FUNCTION storetopics.worker_stop(text) IS
  'For the worker: give its leases back (SIGTERM).';
COMMENT ON FUNCTION storetopics.work_status() IS
  'Per store: idle, dirty, working or failing, with the last error, passes and LLM cost.';
COMMENT ON FUNCTION storetopics.worker_status() IS
  'Per worker: heartbeat, what it works on, passes, failures, labelling calls.';

-- idempotent/095-metrics.sql
-- ------------------------------------------------------------------------------------------------------------
-- Metrics: what a monitoring system scrapes (docker/postgres_exporter-queries.yaml maps them for postgres_exporter)
-- ------------------------------------------------------------------------------------------------------------
-- One row per source the calling role may see, with a label column (source) and numeric gauges and counters: the
-- shape postgres_exporter's custom queries turn into one series per source and column.
--
-- Who sees what: the rule of the views storetopics.stores and storetopics.status (the sources the caller may act as
-- the owner of, those granted to it with grant_read, every source for a worker role or a superuser).  SECURITY
-- DEFINER because a monitoring role may read none of the tables counted here (work, clusters, label_ledger); the
-- rule is therefore applied to the role that called in (_caller), as attach() does, not to current_user.  Granted
-- by grant_read (a monitoring role is a reader: `SELECT storetopics.grant_read('monitoring')` for every source).
--
-- Cheap to scrape: it reads, per visible source, only its rows of pending (the backlog
-- itself), store_state and work (one row per store), the clusters of its stores that still need a label, and the
-- label ledger (one row per labelling call), each through an index on source_id; never the per-file or per-term
-- tables.  The ledger grows with every call ever made: the exporter file caches the result for a while.
--
-- dirty_stores counts what _store_dirty() and work_status() call dirty: stores named by logged changes, stores
-- whose summary must be rendered again, stores the worker has seen dirty (work.dirty_since), stores with a labelling
-- retry come due; and, while a change that names no store is logged (a delete, TRUNCATE, a resync, attach), every
-- store of the source, because the fold that comes may change any of them.  failing_stores: the 'failing' state of
-- work_status() (passes or labelling calls failed failing_after() times in a row).
CREATE OR REPLACE FUNCTION storetopics.metrics()
RETURNS TABLE (source text, source_id int, stores bigint, pending_events bigint, oldest_pending_seconds float8,
               dirty_stores bigint, failing_stores bigint, oldest_summary_seconds float8, paused int,
               label_calls_total bigint, label_errors_total bigint, label_cost_usd_total float8)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
-- a long backlog makes the plan look costly enough to compile, which a query this short, run on every scrape, never
-- pays back
SET jit = off
BEGIN ATOMIC
WITH src AS (
  SELECT s.id, s.chunks, storetopics._settings(s.id) AS cfg
    FROM storetopics.sources s
   WHERE storetopics._may_act_as(s.owner)
      OR EXISTS (SELECT 1 FROM storetopics.grants g
                  WHERE (g.source_id IS NULL OR g.source_id = s.id)
                    AND pg_has_role(storetopics._caller(), g.role, 'USAGE'))
), pend AS (
  SELECT src.id AS source_id, p.store_key, p.n, p.oldest
    FROM src CROSS JOIN LATERAL (SELECT x.store_key, count(*) AS n, min(x.logged_at) AS oldest
                                   FROM storetopics.pending x WHERE x.source_id = src.id GROUP BY 1) p
), dirty AS (
  SELECT x.source_id, x.store_key FROM pend x
   WHERE x.store_key IS NOT NULL AND char_length(x.store_key) <= storetopics.max_store_key()   -- else never a store
  UNION
  SELECT st.source_id, st.store_key FROM storetopics.store_state st
   WHERE st.source_id IN (SELECT src.id FROM src)
     AND (storetopics.render_due(st)
          OR EXISTS (SELECT 1 FROM pend x WHERE x.source_id = st.source_id AND x.store_key IS NULL))
  UNION
  SELECT w.source_id, w.store_key FROM storetopics.work w
   WHERE w.source_id IN (SELECT src.id FROM src) AND w.dirty_since IS NOT NULL
  UNION
  SELECT k.source_id, k.store_key FROM storetopics.clusters k JOIN src ON src.id = k.source_id
   WHERE k.label_needed AND k.chunks > 0 AND k.label_retry_at <= now() AND src.cfg ->> 'labeller' <> 'offline'
  UNION
  SELECT st.source_id, st.store_key FROM storetopics.store_state st JOIN src ON src.id = st.source_id
   WHERE st.store_label_needed AND st.store_label_retry_at <= now() AND src.cfg ->> 'labeller' <> 'offline'
), failing AS (
  SELECT w.source_id, w.store_key FROM storetopics.work w
   WHERE w.source_id IN (SELECT src.id FROM src) AND w.attempts >= storetopics.failing_after()
  UNION
  SELECT k.source_id, k.store_key FROM storetopics.clusters k
   WHERE k.source_id IN (SELECT src.id FROM src) AND k.label_needed AND k.chunks > 0
     AND k.label_failures >= storetopics.failing_after()
  UNION
  SELECT st.source_id, st.store_key FROM storetopics.store_state st
   WHERE st.source_id IN (SELECT src.id FROM src) AND st.store_label_needed
     AND st.store_label_failures >= storetopics.failing_after()
)
SELECT src.chunks::text, src.id, st.stores, coalesce(p.n, 0)::bigint,
       coalesce(extract(epoch FROM now() - p.oldest), 0)::float8,
       (SELECT count(*) FROM dirty d WHERE d.source_id = src.id),
       (SELECT count(*) FROM failing f WHERE f.source_id = src.id),
       coalesce(extract(epoch FROM now() - st.oldest), 0)::float8,
       (src.cfg ->> 'paused')::boolean::int,
       l.calls, l.errors, l.cost_usd::float8
  FROM src
  LEFT JOIN LATERAL (SELECT sum(x.n) AS n, min(x.oldest) AS oldest FROM pend x WHERE x.source_id = src.id) p ON true
  -- a store's summary dates from its last render (a store folded but never rendered: from that fold)
  LEFT JOIN LATERAL (SELECT count(*) AS stores, min(coalesce(y.rendered_at, y.folded_at)) AS oldest
                       FROM storetopics.store_state y WHERE y.source_id = src.id AND y.files > 0) st ON true
  LEFT JOIN LATERAL (SELECT count(*) AS calls, count(*) FILTER (WHERE g.outcome = 'error') AS errors,
                            coalesce(sum(g.cost_usd), 0) AS cost_usd
                       FROM storetopics.label_ledger g WHERE g.source_id = src.id) l ON true
 ORDER BY src.id;
END;
COMMENT ON FUNCTION storetopics.metrics() IS
  'For monitoring (postgres_exporter): per source the caller may read, stores, pending events and the oldest one''s '
  'age, dirty and failing stores, the oldest summary''s age, and labelling calls, errors and cost since attach.';

-- idempotent/100-views.sql
-- ------------------------------------------------------------------------------------------------------------
-- Views: what a router, a tenant and a DBA read
-- ------------------------------------------------------------------------------------------------------------
-- A role sees the sources it may act as the owner of, those granted to it with grant_read (or to every source), and
-- everything when it is a worker role or a superuser.  The views read storetopics' tables as their owner; the test
-- runs for the role reading (current_user; a function would run as the reader, who may not read the grants).  security_barrier: a function in the reader's WHERE clause cannot see
-- the rows the test hides.
-- The router's view: a plain indexed read.  `dirty` = changes are logged that are not folded in yet.
CREATE OR REPLACE VIEW storetopics.stores WITH (security_barrier) AS
SELECT s.chunks AS source, st.source_id, st.store_key, st.files, st.chunks, st.words, st.skipped,
       st.store_topics, st.topics, st.updated_at, st.folded_at,
       EXISTS (SELECT 1 FROM storetopics.pending p
                WHERE p.source_id = st.source_id AND (p.store_key = st.store_key OR p.resync OR p.deletes
                      -- a change whose store key was NULL when logged (e.g. a store key looked up in a parent
                      -- row that an ON DELETE CASCADE already removed) dirties the store that holds the file
                      OR (p.store_key IS NULL AND EXISTS (SELECT 1 FROM storetopics.file_terms f
                                                           WHERE f.source_id = p.source_id
                                                             AND md5(f.file_key)::uuid = md5(p.file_key)::uuid
                                                             AND f.file_key = p.file_key
                                                             AND f.store_key = st.store_key)))) AS dirty,
       st.tool_name
  FROM storetopics.store_state st
  JOIN storetopics.sources s ON s.id = st.source_id
 WHERE pg_has_role(current_user, s.owner, 'USAGE')
    OR EXISTS (SELECT 1 FROM storetopics.grants g
                WHERE (g.source_id IS NULL OR g.source_id = s.id) AND pg_has_role(current_user, g.role, 'USAGE'));
COMMENT ON VIEW storetopics.stores IS
  'One row per store the reading role may see: its summary (store_topics), the structured topics, sizes, freshness.';

CREATE OR REPLACE VIEW storetopics.status WITH (security_barrier) AS
SELECT s.id AS source_id, s.chunks AS source, s.ts_config,
       (SELECT count(*) FROM storetopics.store_state st WHERE st.source_id = s.id) AS stores,
       (SELECT coalesce(sum(st.files), 0) FROM storetopics.store_state st WHERE st.source_id = s.id) AS files,
       (SELECT coalesce(sum(st.chunks), 0) FROM storetopics.store_state st WHERE st.source_id = s.id) AS chunks,
       (SELECT coalesce(sum(st.skipped), 0) FROM storetopics.store_state st WHERE st.source_id = s.id)
         AS skipped_text_rows,
       -- rows whose file key or store key is NULL, or whose store key is longer than max_store_key()
       s.null_key_rows
         + (SELECT coalesce(sum(f.chunks), 0) FROM storetopics.file_terms f
             WHERE f.source_id = s.id AND f.store_key IS NULL) AS skipped_null_key_rows,
       (SELECT coalesce(sum(st.other_dim), 0) FROM storetopics.store_state st WHERE st.source_id = s.id)
         AS other_dimension_chunks,     -- vectors no cluster can take: another dimension than the store's fit
       (SELECT count(*) FROM storetopics.pending p WHERE p.source_id = s.id) AS pending_events,
       (SELECT min(p.logged_at) FROM storetopics.pending p WHERE p.source_id = s.id) AS oldest_pending,
       s.folded_at, s.attached_at,
       -- the last error a key met, and when: the capture could not key a statement's rows (logged, not folded
       -- yet; or folded), or a key expression raised for a row (its rows are read one by one since)
       coalesce(e.error, s.key_error) AS key_error, coalesce(e.logged_at, s.key_error_at) AS key_error_at,
       CASE WHEN s.safe_keys THEN 'row by row' ELSE 'set-based' END AS reads
  FROM storetopics.sources s
  LEFT JOIN LATERAL (SELECT 'the capture trigger could not key a statement''s rows: ' || p.error AS error, p.logged_at
                       FROM storetopics.pending p
                      WHERE p.source_id = s.id AND p.error IS NOT NULL
                      ORDER BY p.logged_at DESC LIMIT 1) e ON true
 WHERE pg_has_role(current_user, s.owner, 'USAGE')
    OR EXISTS (SELECT 1 FROM storetopics.grants g
                WHERE (g.source_id IS NULL OR g.source_id = s.id) AND pg_has_role(current_user, g.role, 'USAGE'));
COMMENT ON VIEW storetopics.status IS
  'One row per attached table the reading role may see: stores, files, chunks, skipped rows, pending events.';

-- idempotent/110-routing.sql
-- ------------------------------------------------------------------------------------------------------------
-- Routing: the catalog a router shows an LLM (one tool per store), and where to search for a query, or nowhere
-- ------------------------------------------------------------------------------------------------------------
-- Who sees what: the rule of the views storetopics.stores and storetopics.status, as metrics() applies it (the
-- sources the caller may act as the owner of, those granted to it with grant_read, every source for a worker role
-- or a superuser).  The functions here are SECURITY DEFINER (a router may read none of the tables they read), so
-- the rule is applied to the role that called in (_caller), not to current_user.  Granted by grant_read.

-- A store's tool name: 'search_' and the store key, lowercased, every character but [a-z0-9_-] made '_', cut so that
-- with `suffix` it is at most 64 characters (the names MCP, OpenAI and Anthropic accept: ^[a-zA-Z0-9_-]{1,64}$).
-- The one place the rule is written: catalog() names the stores with it, and the Python helpers ask it for the
-- name of a store that has no summary yet.  The letters are spelled out, so that only ASCII ones pass, whatever
-- the collation.
CREATE OR REPLACE FUNCTION storetopics.tool_name(store_key text, suffix text DEFAULT '') RETURNS text
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE SET search_path = pg_catalog, pg_temp
RETURN left('search_' || regexp_replace(lower(store_key), '[^abcdefghijklmnopqrstuvwxyz0123456789_-]', '_', 'g'),
            64 - length(suffix)) || suffix;
COMMENT ON FUNCTION storetopics.tool_name(text, text) IS
  'The tool name of a store key (search_<key>, [a-z0-9_-], at most 64 characters with the suffix).';

-- Names the stores of a source that have no tool name yet, once and for good: tool_name(store key) when no store has
-- it, else with '_<source id>', else with '_<source id>_<8 hex digits of md5(store key)>' (keys that differ only in
-- case or punctuation).  First come, first named: a store's name never changes when others come or go, and a
-- newcomer whose name is taken gets the suffix.  Stores are named in the order of their keys (bytewise), so one
-- fold names the same stores the same way whatever the order its rows arrived in.
CREATE OR REPLACE FUNCTION storetopics._name_stores(p_source int) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  r record;
  v_name text;
BEGIN
  FOR r IN SELECT st.store_key FROM storetopics.store_state st
            WHERE st.source_id = p_source AND st.tool_name IS NULL ORDER BY st.store_key COLLATE "C" LOOP
    FOREACH v_name IN ARRAY ARRAY[storetopics.tool_name(r.store_key),
                                  storetopics.tool_name(r.store_key, '_' || p_source),
                                  storetopics.tool_name(r.store_key, '_' || p_source || '_' || left(md5(r.store_key), 8))]
    LOOP
      BEGIN
        UPDATE storetopics.store_state SET tool_name = v_name WHERE source_id = p_source AND store_key = r.store_key;
        EXIT;
      EXCEPTION WHEN unique_violation THEN
        NULL;   -- taken (by an incumbent, or by a fold of another source just now): the next form
      END;
    END LOOP;
  END LOOP;
END $$;

-- The stores the caller may read that have a summary, of one catalog (NULL: of every catalog), with their tool
-- names (storetopics._name_stores).
CREATE OR REPLACE FUNCTION storetopics._readable_stores(p_catalog text)
RETURNS TABLE (catalog text, source_id int, store_key text, tool_name text)
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
WITH me AS MATERIALIZED (
  SELECT storetopics._caller() AS r
), src AS MATERIALIZED (
  -- (_may_act_as and the catalog's name, written out: called per source they cost more than the rest of a route())
  SELECT s.id, coalesce((storetopics.default_settings() || s.settings) ->> 'catalog', 'source:' || s.id) AS catalog
    FROM storetopics.sources s CROSS JOIN me
   WHERE pg_has_role(me.r, s.owner, 'USAGE')
      OR EXISTS (SELECT 1 FROM storetopics.grants g
                  WHERE (g.source_id IS NULL OR g.source_id = s.id) AND pg_has_role(me.r, g.role, 'USAGE'))
)
SELECT src.catalog, st.source_id, st.store_key, st.tool_name
  FROM src JOIN storetopics.store_state st ON st.source_id = src.id
 WHERE st.store_topics IS NOT NULL AND (p_catalog IS NULL OR src.catalog = p_catalog);
END;

-- One row per store the caller may read that has a summary, for a router to offer as a tool: its catalog, source,
-- store key, its tool name (decided when the store first appeared; storetopics._name_stores), the summary (store_topics, ready for a prompt), its cl100k tokens
-- as render counted them (the sum over its space-separated chunks of their counts in storetopics.token_counts, the
-- first chunk counted with a leading space like the others; NULL while some chunk has not been counted with the
-- real tokenizer), when it last changed, and md5 of the text (changes only when the text does: a prompt cache
-- key).
CREATE OR REPLACE FUNCTION storetopics.catalog(p_catalog text DEFAULT NULL)
RETURNS TABLE (catalog text, source regclass, source_id int, store_key text, tool_name text, description text,
               tokens int, updated_at timestamptz, content_hash text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
SELECT r.catalog, s.chunks, r.source_id, r.store_key, r.tool_name, st.store_topics, t.tokens, st.updated_at,
       md5(st.store_topics)
  FROM storetopics._readable_stores(p_catalog) r
  JOIN storetopics.sources s ON s.id = r.source_id
  JOIN storetopics.store_state st ON st.source_id = r.source_id AND st.store_key = r.store_key
  -- the sum over the text's chunks of their counts, as render counted them: a section's last item, which ends in
  -- '.', at the count of the same item ending in ',' (each one token; render priced it so)
  CROSS JOIN LATERAL (SELECT CASE WHEN bool_and(coalesce(tc.tokens, tp.tokens) IS NOT NULL)
                                  THEN sum(coalesce(tc.tokens, tp.tokens))::int END AS tokens
                        FROM regexp_split_to_table(st.store_topics, ' ') AS x(c)
                        LEFT JOIN storetopics.token_counts tc ON tc.chunk = ' ' || x.c
                        LEFT JOIN storetopics.token_counts tp
                               ON x.c LIKE '%.' AND tp.chunk = ' ' || left(x.c, -1) || ','
                       WHERE x.c <> '') t
 ORDER BY r.catalog, r.tool_name;
END;
COMMENT ON FUNCTION storetopics.catalog(text) IS
  'One row per store the caller may read (of one catalog, or all): its tool name (search_<store key>, unique, never '
  'changed once given), the '
  'summary as a tool description, its cl100k tokens when counted, when it changed, and md5 of the text.';

-- ------------------------------------------------------------------------------------------------------------
-- route(): the stores whose clusters hold a query embedding, or none
-- ------------------------------------------------------------------------------------------------------------
-- The arguments route() and route_text() share: a query (not NULL) and k >= 1.
CREATE OR REPLACE FUNCTION storetopics._route_args(p_fn text, p_query_is_null boolean, k int) RETURNS void
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  IF p_query_is_null THEN
    RAISE EXCEPTION 'storetopics: %() needs a query%, not NULL', p_fn,
                    CASE WHEN p_fn = 'route' THEN ' embedding' ELSE '' END USING ERRCODE = 'null_value_not_allowed';
  END IF;
  IF k IS NULL OR k < 1 THEN
    RAISE EXCEPTION 'storetopics: %() returns k >= 1 stores, not %', p_fn, coalesce(k::text, 'NULL')
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
END $$;
-- One pass over the centroids of the caller's stores (those catalog() lists, of the catalog asked for; clusters
-- with chunks, in the query's dimension: others are ignored).  A store's score is how likely the query is under its
-- clusters as a mixture of von Mises-Fisher components, the clusters' shares as weights, one concentration kappa:
--     score = ln( sum_c share_c * exp(kappa * cos(q, centroid_c)) ) / kappa
-- a soft maximum of the cosine similarities (never above the best one; a query near several large clusters of a
-- store scores above one near a single small cluster).  This form and kappa = 20 were chosen on the tuning half of
-- the routing evaluation (lab/evaluation: report.md, "Retrieve or not"), against the best cluster's cosine alone,
-- the cosine with a share prior, kappa 10 and 40, and scores relative to the cluster's radius (1 - d / radius,
-- radius - d, with and without the share): within 0.01 of the best abstention F1 there and a point of the best
-- top-1; the radius-relative scores were 14-17 points worse in top-1 (a radius is the 95th percentile of the member
-- chunks' distances in their files' context, which a query is not).  cluster_id is the cluster that weighs most in the sum
-- (ties: the lower id), distance its cosine distance, within_radius whether the query lies inside its radius; label
-- its label as the summary shows it.
-- search: the score reaches the store's source's route_threshold (settings); false on every row means no store
-- holds the query: abstain.  Rows: the k best stores, best first (ties: source, store key).
CREATE OR REPLACE FUNCTION storetopics.route(query_embedding vector, k int DEFAULT 3, p_catalog text DEFAULT NULL)
RETURNS TABLE (source_id int, store_key text, tool_name text, score float8, cluster_id int, label text,
               distance float8, within_radius boolean, search boolean)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET jit = off AS $$
DECLARE
  vs name := storetopics._vector_schema();
  v_norm float8;
  v_dims int;
  v_ids int[];
  v_keys text[];
  v_names text[];
  v_sources int[];
BEGIN
  PERFORM storetopics._route_args('route', query_embedding IS NULL, k);
  EXECUTE format('SELECT %1$I.vector_norm($1), %1$I.vector_dims($1)', vs) INTO v_norm, v_dims USING query_embedding;
  IF v_norm = 0 OR v_norm = 'NaN'::float8 THEN
    RAISE EXCEPTION 'storetopics: route() cannot route a zero vector (it has no direction)'
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  -- the listed stores, once (passed to the query below as arrays)
  SELECT coalesce(array_agg(r.source_id), '{}'), coalesce(array_agg(r.store_key), '{}'),
         coalesce(array_agg(r.tool_name), '{}'), coalesce(array_agg(DISTINCT r.source_id), '{}')
    INTO v_ids, v_keys, v_names, v_sources
    FROM storetopics._readable_stores(p_catalog) r;
  RETURN QUERY EXECUTE format($q$
    WITH vis AS (
      SELECT r.source_id, r.store_key, r.tool_name FROM unnest($6::int[], $7::text[], $8::text[])
                                                     AS r(source_id, store_key, tool_name)
    ), per_store AS (
      -- The one pass: every cluster of the listed stores' sources (visibility is per source: an int test per row),
      -- its term of the sum computed once (a subquery that is not flattened), NULL in another dimension (tested in
      -- the projection, not the filter: the planner then counts the rows right and hashes the groups).  Centroids
      -- are unit vectors: the cosine distance is 1 + <c, q> / |q|.
      SELECT x.source_id, x.store_key, ln(sum(x.w) / sum(x.chunks) FILTER (WHERE x.w IS NOT NULL)) / 20 AS score
        FROM (SELECT k.source_id, k.store_key, k.chunks::float8 AS chunks,
                     CASE WHEN %1$I.vector_dims(k.centroid) = $4
                          THEN k.chunks * exp(20 * -((k.centroid OPERATOR(%1$I.<#>) $1) / $5)) END AS w
                FROM storetopics.clusters k
               WHERE k.source_id = ANY ($9::int[]) AND k.chunks > 0
              OFFSET 0) x
       GROUP BY x.source_id, x.store_key
      HAVING count(x.w) > 0
    ), top AS (
      SELECT p.source_id, p.store_key, vis.tool_name, p.score
        FROM per_store p JOIN vis ON vis.source_id = p.source_id AND vis.store_key = p.store_key
       ORDER BY p.score DESC, p.source_id, p.store_key LIMIT $2
    )
    SELECT t.source_id, t.store_key, t.tool_name, t.score, b.cluster_id,
           -- the label the summary shows for the cluster (screened; NULL for a cluster newer than the summary)
           (SELECT x ->> 'label' FROM jsonb_array_elements(st.topics -> 'clusters') x
             WHERE x ->> 'id' = b.cluster_id::text LIMIT 1),
           b.d, b.d <= b.radius,
           t.score >= (storetopics._settings(t.source_id) ->> 'route_threshold')::float8
      FROM top t
      -- the cluster that weighs most in the store's sum (ties: the lower id), for the k stores only
      CROSS JOIN LATERAL (
        SELECT y.cluster_id, y.radius, y.d
          FROM (SELECT k.cluster_id, k.chunks, k.radius::float8 AS radius,
                       1 + (k.centroid OPERATOR(%1$I.<#>) $1) / $5 AS d
                  FROM storetopics.clusters k
                 WHERE k.source_id = t.source_id AND k.store_key = t.store_key AND k.chunks > 0
                   AND %1$I.vector_dims(k.centroid) = $4
                OFFSET 0) y
         ORDER BY ln(y.chunks) - 20 * y.d DESC, y.cluster_id LIMIT 1) b
      JOIN storetopics.store_state st ON st.source_id = t.source_id AND st.store_key = t.store_key
     ORDER BY t.score DESC, t.source_id, t.store_key$q$, vs)
    USING query_embedding, k, p_catalog, v_dims, v_norm, v_ids, v_keys, v_names, v_sources;
END $$;
COMMENT ON FUNCTION storetopics.route(vector, int, text) IS
  'Where to search for a query embedding: the k stores (of those the caller may read) whose clusters hold it best, '
  'with the cluster, its distance and label; search = false on every row: no store holds it (route_threshold).';

-- ------------------------------------------------------------------------------------------------------------
-- route_text(): the same for a query text, from the stores' term counts (stores without embeddings)
-- ------------------------------------------------------------------------------------------------------------
-- The query's lexemes (to_tsvector with each source's ts_config, as fold counts a chunk) against the counts fold
-- keeps (store_terms, store_state.words), over the stores catalog() lists.  A store's score is the mean, over the
-- query's lexemes, of the log ratio of the lexeme's probability in the store, mixed half and half with the
-- background, to its probability in the background (every listed store together, so nothing of the stores the
-- caller may not read enters the score; a lexeme is its text, whichever configuration made it):
--     score = sum_t n_t ln( (tf_st / words_s / 2 + p_t / 2) / p_t ) / sum_t n_t
-- the query likelihood's log ratio per query word (Jelinek-Mercer smoothing, lambda 1/2): above 0 when the store
-- holds the query's words more than the others do, ln(1/2) for each it lacks; a lexeme no listed store holds counts
-- in the denominator only (a query of words no store has, or of no words, scores 0 everywhere).  This smoothing and
-- lambda were chosen on the tuning half of the routing evaluation's queries (a one-off comparison, not part of
-- `make eval`), against Dirichlet smoothing (mu 100 to 10,000) and lambda 0.8 and 0.95: all within two points in
-- top-1; this one had the best abstention F1 carried to the other half, and does not depend on the stores' sizes.  A store alone in the list is its own background: it scores 0 whatever the query (a
-- ratio needs something to be told apart from; route() has no such limit).  One index probe per listed store and
-- query lexeme (the words a store has no row for score ln(1/2) each: only the rows it has are read).  label: the query's word that
-- weighs most for the store, as people write it (NULL when none weighs for it); cluster_id, distance and
-- within_radius are NULL.  search: the score reaches the source's route_text_threshold.
CREATE OR REPLACE FUNCTION storetopics.route_text(query text, k int DEFAULT 3, p_catalog text DEFAULT NULL)
RETURNS TABLE (source_id int, store_key text, tool_name text, score float8, cluster_id int, label text,
               distance float8, within_radius boolean, search boolean)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET jit = off AS $$
BEGIN
  PERFORM storetopics._route_args('route_text', query IS NULL, k);
  RETURN QUERY
  WITH vis AS MATERIALIZED (
    SELECT r.source_id, r.store_key, r.tool_name, s.ts_config, greatest(st.words, 1)::float8 AS words
      FROM storetopics._readable_stores(p_catalog) r
      JOIN storetopics.sources s ON s.id = r.source_id
      JOIN storetopics.store_state st ON st.source_id = r.source_id AND st.store_key = r.store_key
  ), ql AS MATERIALIZED (
    -- the query's lexemes per text search configuration, with their counts and ids (NULL: a lexeme no store of
    -- any source has ever held); tsvector_or_null: NULL for a text fold would not count either
    SELECT c.cfg, l.lexeme, coalesce(cardinality(l.positions), 1)::float8 AS n, x.id AS term_id
      FROM (SELECT DISTINCT v.ts_config AS cfg FROM vis v) c
     CROSS JOIN LATERAL unnest(storetopics.tsvector_or_null(c.cfg, query)) AS l
      LEFT JOIN storetopics.lexemes x ON x.lexeme = l.lexeme
  ), qn AS MATERIALIZED (
    SELECT ql.cfg, sum(ql.n) AS n, array_agg(ql.term_id) FILTER (WHERE ql.term_id IS NOT NULL) AS ids
      FROM ql GROUP BY ql.cfg
  ), hits AS MATERIALIZED (
    -- per listed store, the query's lexemes it holds: one index probe per store and lexeme
    SELECT v.source_id, v.store_key, v.ts_config AS cfg, v.words, t.term_id, t.total::float8 AS tf
      FROM vis v
      JOIN qn ON qn.cfg = v.ts_config
      JOIN storetopics.store_terms t
        ON t.source_id = v.source_id AND t.store_key = v.store_key AND t.term_id = ANY (qn.ids)
  ), bg AS MATERIALIZED (
    -- the background: the lexeme's share of all the listed stores' words
    SELECT h.term_id, sum(h.tf) / (SELECT sum(v.words) FROM vis v) AS p
      FROM hits h GROUP BY h.term_id
  ), base AS (
    -- what a store that holds none of the lexemes some listed store holds scores: ln(1/2) for each
    SELECT ql.cfg, ln(0.5) * sum(ql.n) AS base
      FROM bg b JOIN ql ON ql.term_id = b.term_id GROUP BY ql.cfg
  ), gain AS (
    -- and what each lexeme a store holds adds to that
    SELECT h.source_id, h.store_key,
           sum(ql.n * (ln(0.5 * h.tf / (h.words * b.p) + 0.5) - ln(0.5))) AS gain,
           (array_agg(ql.lexeme ORDER BY ql.n * ln(0.5 * h.tf / (h.words * b.p) + 0.5) DESC, ql.lexeme)
              FILTER (WHERE h.tf / h.words > b.p))[1] AS best
      FROM hits h
      JOIN bg b ON b.term_id = h.term_id
      JOIN ql ON ql.cfg = h.cfg AND ql.term_id = h.term_id
     GROUP BY h.source_id, h.store_key
  ), per_store AS (
    -- every listed store, with its gain if it has one (a union, grouped: a join of the two estimates badly)
    SELECT u.source_id, u.store_key, max(u.tool_name) AS tool_name,
           (coalesce(max(base.base), 0) + sum(u.gain)) / greatest(coalesce(max(qn.n), 0), 1) AS score,
           max(u.best) AS best
      FROM (SELECT v.source_id, v.store_key, v.tool_name, v.ts_config, 0::float8 AS gain, NULL::text AS best
              FROM vis v
            UNION ALL
            SELECT g.source_id, g.store_key, NULL, NULL, g.gain, g.best FROM gain g) u
      LEFT JOIN qn ON qn.cfg = u.ts_config
      LEFT JOIN base ON base.cfg = u.ts_config
     GROUP BY u.source_id, u.store_key
  )
  SELECT p.source_id, p.store_key, p.tool_name, p.score, NULL::int,
         storetopics._show(s.ts_config, p.best),
         NULL::float8, NULL::boolean,
         p.score >= (storetopics._settings(p.source_id) ->> 'route_text_threshold')::float8
    FROM per_store p JOIN storetopics.sources s ON s.id = p.source_id
   ORDER BY p.score DESC, p.source_id, p.store_key
   LIMIT k;
END $$;
COMMENT ON FUNCTION storetopics.route_text(text, int, text) IS
  'Where to search for a query text, from the stores'' term counts (stores without embeddings): the k stores (of '
  'those the caller may read) whose words the query''s are most, with its weightiest word; search = false on '
  'every row: no store holds it (route_text_threshold).';

-- ------------------------------------------------------------------------------------------------------------
-- Who may route
-- ------------------------------------------------------------------------------------------------------------
-- catalog(), route() and route_text() show each caller only the stores it may read (_readable_stores), so they are
-- granted to every role that may read some: readers (grant_read), attachers (grant_attach) and the owners of
-- attached tables.  A role granted none of these may not call them.
CREATE OR REPLACE FUNCTION storetopics._grant_routing(p_role text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  EXECUTE format('GRANT EXECUTE ON FUNCTION storetopics.catalog(text), storetopics.route(%I.vector, int, text), '
                 'storetopics.route_text(text, int, text) TO %s', storetopics._vector_schema(), p_role);
END $$;

-- idempotent/120-search.sql
-- ------------------------------------------------------------------------------------------------------------
-- Search: a store's best chunks for a query (what an MCP server's search tool calls)
-- ------------------------------------------------------------------------------------------------------------
-- The chunks are read by the source's generated reader (op 'search'), as the table's owner: the attacher's store,
-- file and content expressions never run as the caller nor as the extension's owner.  So this function checks, for
-- the role that called in (_caller: a SECURITY DEFINER boundary does not change it), what reading the table
-- itself would need: SELECT on the chunk table (grant_read shows a role the summaries; the contents are for whoever
-- may SELECT the table), no row-level security that the owner's read would bypass, and the store visible to it as
-- storetopics.stores would show it (an invisible store and a missing one give the same error).

-- Whether the role that called in may search a source's chunks: NULL when it may, else why not.
CREATE OR REPLACE FUNCTION storetopics._search_refusal(src storetopics.sources) RETURNS text
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_caller regrole := storetopics._caller();
  v_rel pg_class;
BEGIN
  SELECT * INTO v_rel FROM pg_class c WHERE c.oid = src.chunks;
  IF NOT FOUND THEN
    RETURN format('source %s: its table is gone', src.id);
  END IF;
  IF NOT has_table_privilege(v_caller, src.chunks, 'SELECT') THEN
    RETURN format('%s may not read %s (search returns its rows: it needs SELECT on the table)', v_caller,
                  src.chunks);
  END IF;
  -- the reader runs as the owner, whom the policies do not bind (unless FORCE ROW LEVEL SECURITY)
  IF v_rel.relrowsecurity AND NOT storetopics._may_act_as(src.owner)
     AND NOT (SELECT r.rolbypassrls OR r.rolsuper FROM pg_roles r WHERE r.oid = v_caller) THEN
    RETURN format('%s has row-level security: search reads it as its owner and would not apply the policies to %s',
                  src.chunks, v_caller);
  END IF;
  RETURN NULL;
END $$;

-- The k best chunks of one store for a query: full-text (websearch_to_tsquery with the source's text search
-- configuration, ts_rank) always; with p_embedding, also the nearest chunks by cosine distance (when the source has
-- an embedding column; rows of another dimension are left out), fused by reciprocal rank.  content is cut at 1,000
-- characters; chunk names the row (its primary key, else its ctid); rank orders the rows (ts_rank, or the fused
-- score with an embedding); text_rank is ts_rank (NULL: found by vector only), distance the cosine distance (NULL:
-- found by text only).
CREATE OR REPLACE FUNCTION storetopics.search(p_source int, p_store text, p_query text, p_k int DEFAULT 5,
                                              p_embedding vector DEFAULT NULL)
RETURNS TABLE (file_key text, chunk text, content text, rank float8, text_rank float8, distance float8)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  src storetopics.sources;
  v_caller regrole := storetopics._caller();
  v_refusal text;
  v_reader text;
BEGIN
  IF p_query IS NULL OR btrim(p_query) = '' THEN
    RAISE EXCEPTION 'storetopics: the search query is empty' USING ERRCODE = 'invalid_parameter_value',
      HINT = 'Give words to look for, e.g. ''kitchen tiles'' or ''"exact phrase" -excluded''.';
  END IF;
  IF char_length(p_query) > 10000 THEN
    RAISE EXCEPTION 'storetopics: the search query is longer than 10,000 characters'
      USING ERRCODE = 'program_limit_exceeded';
  END IF;
  IF p_k IS NULL OR p_k < 1 OR p_k > 50 THEN
    RAISE EXCEPTION 'storetopics: k must be between 1 and 50, not %', coalesce(p_k::text, 'NULL')
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  SELECT * INTO src FROM storetopics.sources s WHERE s.id = p_source;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'storetopics: no source %', coalesce(p_source::text, 'NULL') USING ERRCODE = 'undefined_object',
      HINT = 'storetopics.stores lists the sources and stores you may search.';
  END IF;
  v_refusal := storetopics._search_refusal(src);
  IF v_refusal IS NOT NULL THEN
    RAISE EXCEPTION 'storetopics: %', v_refusal USING ERRCODE = 'insufficient_privilege',
      HINT = format('The table''s owner may GRANT SELECT ON %s TO %s.', src.chunks, v_caller);
  END IF;
  -- the store, as storetopics.stores shows it to the caller (the view tests current_user; here that is the
  -- extension's owner, so the same test is made for the caller)
  IF NOT EXISTS (SELECT 1 FROM storetopics.store_state st
                  WHERE st.source_id = src.id AND st.store_key = p_store)
     OR NOT (pg_has_role(v_caller, src.owner, 'USAGE')
             OR EXISTS (SELECT 1 FROM storetopics.grants g
                         WHERE (g.source_id IS NULL OR g.source_id = src.id) AND pg_has_role(v_caller, g.role, 'USAGE')))
  THEN
    RAISE EXCEPTION 'storetopics: source % (%) has no store %', src.id, src.chunks, coalesce(quote_literal(p_store), 'NULL')
      USING ERRCODE = 'undefined_object', HINT = 'storetopics.stores lists the stores you may search.';
  END IF;
  v_reader := storetopics._reader(src.id);   -- made again from the current templates after an upgrade
  RETURN QUERY EXECUTE format('SELECT * FROM %s(''search'', NULL, $1, $2) AS r(file_key text, chunk text, '
                              'content text, rank float8, text_rank float8, distance float8)', v_reader)
    USING p_store, jsonb_build_object('query', p_query, 'k', p_k, 'embedding', p_embedding::text);
END $$;
COMMENT ON FUNCTION storetopics.search(int, text, text, int, vector) IS
  'The k (1-50) best chunks of a store for a query: full-text (websearch syntax, ts_rank), fused with the nearest '
  'chunks by cosine distance when an embedding is given.  The caller needs SELECT on the chunk table and a store it '
  'may see; the attacher''s expressions run as the table''s owner.';

-- idempotent/900-privileges.sql
-- ------------------------------------------------------------------------------------------------------------
-- Privileges and dumps
-- ------------------------------------------------------------------------------------------------------------
REVOKE ALL ON ALL TABLES IN SCHEMA storetopics FROM PUBLIC;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA storetopics FROM PUBLIC;
-- pure helpers: the generated readers use them as the tables' owners
GRANT EXECUTE ON FUNCTION storetopics.usable_text(text), storetopics.showable_term(text),
  storetopics._human_count(bigint), storetopics.tsvector_or_null(regconfig, text), storetopics.max_store_key(),
  storetopics.tool_name(text, text)
  TO PUBLIC;
-- search() returns the chunks themselves, so it is executable by PUBLIC only because it checks every caller itself
-- (SELECT on the chunk table, no row-level security it would bypass, a store the caller may see) before the
-- source's reader runs; a role still needs USAGE on the schema, which owners, readers and workers have.
GRANT EXECUTE ON FUNCTION storetopics.search(int, text, text, int, vector) TO PUBLIC;

-- The roles that hold rights get what this version gives them (an upgrade's new functions included): workers and
-- readers from storetopics.grants, attachers are the roles that may run attach(), and each attached table's owner
-- what its generated functions do as that owner.
DO $$
DECLARE
  r record;
BEGIN
  FOR r IN SELECT DISTINCT pg_get_userbyid(g.role) AS name FROM storetopics.grants g WHERE g.kind = 'worker' LOOP
    PERFORM storetopics.grant_worker(r.name);
  END LOOP;
  FOR r IN SELECT DISTINCT pg_get_userbyid(a.grantee) AS name
             FROM pg_proc p, aclexplode(p.proacl) a
            WHERE p.oid = 'storetopics.attach(regclass, text, text, text, text, regconfig, jsonb, regclass, text, '
                          'regclass, text, text)'::regprocedure
              AND a.grantee <> 0 AND a.grantee <> p.proowner
              AND a.grantee NOT IN (SELECT g.role FROM storetopics.grants g WHERE g.kind = 'worker') LOOP
    PERFORM storetopics.grant_attach(r.name);
  END LOOP;
  FOR r IN SELECT DISTINCT g.role FROM storetopics.grants g WHERE g.kind = 'read'
           UNION SELECT DISTINCT s.owner FROM storetopics.sources s LOOP
    EXECUTE format('GRANT USAGE ON SCHEMA storetopics TO %s', r.role);
  END LOOP;
  FOR r IN SELECT DISTINCT g.role FROM storetopics.grants g WHERE g.kind = 'read' LOOP
    EXECUTE format('GRANT SELECT ON storetopics.stores, storetopics.status TO %s', r.role);
    EXECUTE format('GRANT EXECUTE ON FUNCTION storetopics.metrics() TO %s', r.role);
    PERFORM storetopics._grant_routing(r.role::text);
  END LOOP;
  FOR r IN SELECT DISTINCT s.owner FROM storetopics.sources s LOOP
    EXECUTE format('GRANT INSERT (source_id, store_key, file_key, resync, deletes, error), SELECT (source_id) '
                   'ON storetopics.pending TO %s', r.owner);
    EXECUTE format('GRANT SELECT ON storetopics.file_means TO %s', r.owner);
    PERFORM storetopics._grant_routing(r.owner::text);
  END LOOP;
END $$;

-- Stores folded before tool names were kept get theirs (sources in attach order).
SELECT storetopics._name_stores(s.id) FROM storetopics.sources s
 WHERE EXISTS (SELECT 1 FROM storetopics.store_state st WHERE st.source_id = s.id AND st.tool_name IS NULL)
 ORDER BY s.id;

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
    ALTER EVENT TRIGGER storetopics_forget_dropped_tables ENABLE;
    DROP EVENT TRIGGER IF EXISTS storetopics_cover_partitions;   -- (an earlier build of 0.2; _follow_ddl does it)
    DROP FUNCTION IF EXISTS storetopics._cover_partitions();
    DROP EVENT TRIGGER IF EXISTS storetopics_follow_ddl;         -- made again: its tags may have changed
    CREATE EVENT TRIGGER storetopics_follow_ddl ON ddl_command_end
      WHEN TAG IN ('CREATE TABLE', 'ALTER TABLE', 'ALTER FUNCTION', 'ALTER PROCEDURE', 'ALTER TYPE', 'ALTER DOMAIN',
                   'ALTER SCHEMA', 'ALTER VIEW', 'ALTER MATERIALIZED VIEW', 'ALTER FOREIGN TABLE', 'ALTER OPERATOR',
                   'ALTER AGGREGATE', 'ALTER COLLATION', 'ALTER TEXT SEARCH CONFIGURATION')
      EXECUTE FUNCTION storetopics._follow_ddl();
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
    PERFORM pg_catalog.pg_extension_config_dump('storetopics.grants', '');
  END IF;
END $$;

UPDATE storetopics.meta SET value = '0.2' WHERE key = 'version';
INSERT INTO storetopics.meta VALUES ('build', '973541090') ON CONFLICT (key) DO UPDATE SET value = excluded.value;
