-- ------------------------------------------------------------------------------------------------------------
-- Helpers
-- ------------------------------------------------------------------------------------------------------------
-- Text worth tokenising: not NULL, has a letter or digit, no control characters (binary junk), and small enough
-- for a tsvector (1 MB).  Other rows are counted as skipped.
CREATE OR REPLACE FUNCTION storetopics._usable_text(t text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp
RETURN t IS NOT NULL AND octet_length(t) < 1048576 AND t ~ '[[:alnum:]]' AND t !~ '[\x01-\x08\x0e-\x1f]';

-- Text as storetopics reads it: words that a line break hyphenated ("destina-\n      tion", as man pages and PDFs
-- turned into text have them) are joined again, so that neither half is counted as a word of its own.  A byte search
-- first: only a text with a hyphen before a line break is rewritten.  (No SET search_path, so that the planner inlines
-- it into fold's recount: its body is bound when it is created, every name in it schema-qualified.)
CREATE OR REPLACE FUNCTION storetopics._dehyphenated(t text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE WHEN pg_catalog.strpos(t, E'-\n') OPERATOR(pg_catalog.=) 0
                 AND pg_catalog.strpos(t, E'\u2010\n') OPERATOR(pg_catalog.=) 0 THEN t
            ELSE pg_catalog.regexp_replace(t, E'([[:alpha:]])[-\u2010][ \t]*\n[ \t]*([[:lower:]])', E'\\1\\2', 'g') END;

-- A digest of a file's counted words (its term and count arrays), for the digests that say whether what a store's
-- clusters' words and phrases are computed from changed: 64-bit hashes of the two arrays.  (md5 of the arrays as
-- text spent its time formatting integers: 8,000 files 0.21 -> 0.05 s.)  (No SET search_path: inlined, its body
-- bound when it is created.)
CREATE OR REPLACE FUNCTION storetopics._terms_digest(term_ids int[], counts int[]) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN pg_catalog.hash_array_extended(term_ids, 0)::text OPERATOR(pg_catalog.||) ':'
       OPERATOR(pg_catalog.||) pg_catalog.hash_array_extended(counts, 0)::text;

-- A term worth showing to a person: letters (any script), at least 3 of them, maybe inner hyphens or apostrophes.
-- (No SET search_path: a SQL-standard body is bound when it is created, and the planner inlines it where it tests
-- every term of a store: the clusters' words at 100k realistic chunks, 76k terms, 0.31 -> 0.16 s.)
CREATE OR REPLACE FUNCTION storetopics._showable_term(t text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN t ~ '^[[:alpha:]][[:alpha:]''-]*[[:alpha:]]$' AND length(t) >= 3 AND length(t) <= 40;

-- t is made of the letters a-z only (true for ''), and w ends on suffix after one of them: what t ~ '^[a-z]*$' and
-- w ~ ('[a-z]' || suffix || '$') say, without a regular expression.  A backend keeps 32 compiled regular expressions;
-- a render cycle used 35-48, and the screen's, ~20 ms to compile, were compiled again at every render (bench/README.md,
-- "Regular expressions within the backend's cache").  (No SET: the planner inlines them where they test every term.)
CREATE OR REPLACE FUNCTION storetopics._letters_az(t text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN translate(t, 'abcdefghijklmnopqrstuvwxyz', '') = '';

CREATE OR REPLACE FUNCTION storetopics._letter_then(w text, suffix text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN length(w) > length(suffix) AND right(w, length(suffix)) COLLATE "C" = suffix
       AND storetopics._letters_az(substr(w, length(w) - length(suffix), 1));

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

-- A chunk table's single-column primary key: its column and type (NULL when it has none).
CREATE OR REPLACE FUNCTION storetopics._chunk_key(tbl regclass, OUT name name, OUT type regtype)
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
  SELECT a.attname, a.atttypid::regtype
    FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
   WHERE i.indrelid = tbl AND i.indisprimary AND i.indnatts = 1;
END;

-- How to name one chunk: its single-column primary key, else its ctid (good within one fit).
CREATE OR REPLACE FUNCTION storetopics._chunk_ref_sql(tbl regclass) RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
RETURN (SELECT CASE WHEN k.name IS NULL THEN 'c.ctid::text' ELSE format('c.%I::text', k.name) END
          FROM storetopics._chunk_key(tbl) k);

-- The order chunks were written in, as far as the table tells: an integer single-column primary key (serial,
-- identity), else the place in the heap (a UUID or text key says nothing of order).  What a file's first chunk is.
CREATE OR REPLACE FUNCTION storetopics._chunk_order_sql(tbl regclass) RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
RETURN (SELECT CASE WHEN k.type IN ('int2'::regtype, 'int4'::regtype, 'int8'::regtype) THEN format('c.%I', k.name)
                    ELSE 'c.ctid' END
          FROM storetopics._chunk_key(tbl) k);

-- The WHERE condition that finds chunks by the refs _chunk_ref_sql gave, bound as $1 (an index or TID scan).
CREATE OR REPLACE FUNCTION storetopics._chunk_lookup_sql(tbl regclass) RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
RETURN (SELECT CASE WHEN k.name IS NULL THEN 'c.ctid = ANY ($1::tid[])'
                    ELSE format('c.%I = ANY ($1::%s[])', k.name, k.type) END
          FROM storetopics._chunk_key(tbl) k);

-- to_tsvector, or NULL for unusable text or text whose tsvector would pass 1 MB (one subtransaction per call: the
-- slow path of a fold batch that hit such a row; parallel unsafe: workers may not start subtransactions).
CREATE OR REPLACE FUNCTION storetopics._tsvector_or_null(cfg regconfig, t text) RETURNS tsvector
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  IF NOT storetopics._usable_text(t) THEN
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
COMMENT ON FUNCTION storetopics._usable_text(text) IS
  'Whether a text is worth tokenising: not NULL, has a letter or digit, no control characters, under 1 MB. Other rows are counted as skipped.';
COMMENT ON FUNCTION storetopics._showable_term(text) IS
  'Whether a term is worth showing: 3-40 letters, maybe inner hyphens or apostrophes.';
COMMENT ON FUNCTION storetopics._dehyphenated(text) IS
  'The text with words a line break hyphenated joined again (destina-/tion), as storetopics counts it.';
COMMENT ON FUNCTION storetopics._tsvector_or_null(regconfig, text) IS
  'to_tsvector, or NULL for unusable text or a text whose tsvector would pass 1 MB.';
