-- ------------------------------------------------------------------------------------------------------------
-- Search: a store's best chunks for a query (what an MCP server's search tool calls)
-- ------------------------------------------------------------------------------------------------------------
-- The chunks are read by the source's generated reader (op 'search'), as the table's owner: the attacher's store,
-- file and content expressions never run as the caller nor as the extension's owner.  So this function checks, for
-- the role that called in (_caller: a SECURITY DEFINER boundary does not change it), what reading the table
-- itself would need: SELECT on the chunk table (grant_read shows a role the summaries; the contents are for whoever
-- may SELECT the table), no row-level security that the owner's read would bypass, and the store visible to it as
-- storetopics.stores would show it (an invisible store and a missing one give the same error).

-- The reader's query for search (storetopics._reader_body puts it in read_<id>): search (store, args.query, args.k,
-- args.embedding), (file_key, chunk, content, rank, text_rank, distance): the store's k best chunks for a query
-- (storetopics.search checks the caller first).  Full-text always: websearch_to_tsquery(ts_config, query) matched
-- against the row's tsvector, ranked by ts_rank; the content is cut at 1,000 characters.  With an embedding (a
-- pgvector text, `[...]`) and an embedding column, also the k nearest chunks by cosine distance (rows of another
-- dimension left out), and the two lists fused by reciprocal rank (1/(60 + rank in each list)); rank is then that
-- score, else ts_rank.  A text whose tsvector would pass 1 MB fails the whole query, which then runs again
-- tokenising row by row (tsvector_or_null: such texts are left out).  Written so that an application's GIN index on
-- to_tsvector('<ts_config>', <content column>) can serve the match.
CREATE OR REPLACE FUNCTION storetopics._search_reads(src storetopics.sources) RETURNS text
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  -- a hit's columns, in either list
  cols text := format($q$(%1$s)::pg_catalog.text AS file_key, %2$s AS chunk,
               pg_catalog.left((%3$s)::pg_catalog.text, 1000) AS content$q$,
                      src.file_sql, storetopics._chunk_ref_sql(src.chunks), src.content_sql);
  searched text := format(E'%s AS c\n         WHERE %s', src.chunks, storetopics._read_by_store(src));
  -- the CTE v of the nearest chunks (none without an embedding)
  nearest text := 'SELECT NULL::pg_catalog.text AS file_key, NULL::pg_catalog.text AS chunk, '
                  'NULL::pg_catalog.text AS content, NULL::pg_catalog.float8 AS d, NULL::pg_catalog.int8 AS n WHERE false';
BEGIN
  IF src.embedding IS NOT NULL THEN
    nearest := format($q$
      SELECT x.*, pg_catalog.row_number() OVER (ORDER BY x.d, x.chunk) AS n FROM (
        SELECT %1$s,
               (%2$s OPERATOR(%3$I.<=>) ($3 OPERATOR(pg_catalog.->>) 'embedding')::%3$I.vector)::pg_catalog.float8 AS d
          FROM %4$s AS c
         WHERE $3 OPERATOR(pg_catalog.->>) 'embedding' IS NOT NULL AND %5$s AND %2$s IS NOT NULL
           AND %3$I.vector_dims(%2$s)
               OPERATOR(pg_catalog.=) %3$I.vector_dims(($3 OPERATOR(pg_catalog.->>) 'embedding')::%3$I.vector)
         ORDER BY %2$s OPERATOR(%3$I.<=>) ($3 OPERATOR(pg_catalog.->>) 'embedding')::%3$I.vector
         LIMIT ($3 OPERATOR(pg_catalog.->>) 'k')::pg_catalog.int4) x$q$,
      cols, storetopics._embedding_sql(src), storetopics._vector_schema(), src.chunks, storetopics._read_by_store(src));
  END IF;
  RETURN format($a$  WHEN 'search' THEN
    -- The fused list is sorted before its first row comes out, so a query that fails has returned no row yet.
    BEGIN
      RETURN QUERY EXECUTE %1$L USING files, store, args;
    EXCEPTION WHEN program_limit_exceeded THEN
      RETURN QUERY EXECUTE %2$L USING files, store, args;
    END;
$a$,
    storetopics._search_sql(format('pg_catalog.to_tsvector(%L::pg_catalog.regconfig, %s)', src.ts_config,
                                   src.content_sql), nearest, cols, src.ts_config, searched),
    storetopics._search_sql(format('storetopics._tsvector_or_null(%L::pg_catalog.regconfig, %s)', src.ts_config,
                                   src.content_sql), nearest, cols, src.ts_config, searched));
END $$;

-- The search query, from the row's tsvector (tsv), the CTE of the nearest chunks, a hit's columns, the text search
-- configuration and the rows searched (the table as c and the store's filter).
CREATE OR REPLACE FUNCTION storetopics._search_sql(tsv text, nearest text, cols text, cfg regconfig,
                                                   searched text)
RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
RETURN format($q$
    WITH t AS (
      SELECT x.*, pg_catalog.row_number() OVER (ORDER BY x.r DESC, x.chunk) AS n FROM (
        SELECT %3$s,
               pg_catalog.ts_rank(%1$s, pg_catalog.websearch_to_tsquery(%4$L::pg_catalog.regconfig,
                                                                         $3 OPERATOR(pg_catalog.->>) 'query'))::pg_catalog.float8 AS r
          FROM %5$s
           AND %1$s OPERATOR(pg_catalog.@@) pg_catalog.websearch_to_tsquery(%4$L::pg_catalog.regconfig,
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
     LIMIT ($3 OPERATOR(pg_catalog.->>) 'k')::pg_catalog.int4$q$, tsv, nearest, cols, cfg, searched);

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
-- configuration, ts_rank) always; with query_embedding, also the nearest chunks by cosine distance (when the source has
-- an embedding column; rows of another dimension are left out), fused by reciprocal rank.  content is cut at 1,000
-- characters; chunk names the row (its primary key, else its ctid); rank orders the rows (ts_rank, or the fused
-- score with an embedding); text_rank is ts_rank (NULL: found by vector only), distance the cosine distance (NULL:
-- found by text only).
CREATE OR REPLACE FUNCTION storetopics.search(chunks regclass, store_key text, query text, k int DEFAULT 5,
                                              query_embedding vector DEFAULT NULL)
RETURNS TABLE (file_key text, chunk text, content text, rank float8, text_rank float8, distance float8)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  src storetopics.sources;
  v_caller regrole := storetopics._caller();
  v_refusal text;
  v_reader text;
BEGIN
  IF search.query IS NULL OR btrim(search.query) = '' THEN
    RAISE EXCEPTION 'storetopics: the search query is empty' USING ERRCODE = 'invalid_parameter_value',
      HINT = 'Give words to look for, e.g. ''kitchen tiles'' or ''"exact phrase" -excluded''.';
  END IF;
  IF char_length(search.query) > 10000 THEN
    RAISE EXCEPTION 'storetopics: the search query is longer than 10,000 characters'
      USING ERRCODE = 'program_limit_exceeded';
  END IF;
  IF search.k IS NULL OR search.k < 1 OR search.k > 50 THEN
    RAISE EXCEPTION 'storetopics: k must be between 1 and 50, not %', coalesce(search.k::text, 'NULL')
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  SELECT * INTO src FROM storetopics.sources s WHERE s.chunks = search.chunks;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'storetopics: % is not attached', coalesce(search.chunks::text, 'NULL') USING ERRCODE = 'undefined_object',
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
                  WHERE st.source_id = src.id AND st.store_key = search.store_key)
     OR NOT (pg_has_role(v_caller, src.owner, 'USAGE')
             OR EXISTS (SELECT 1 FROM storetopics.grants g
                         WHERE (g.source_id IS NULL OR g.source_id = src.id) AND pg_has_role(v_caller, g.role, 'USAGE')))
  THEN
    RAISE EXCEPTION 'storetopics: % has no store %', src.chunks, coalesce(quote_literal(search.store_key), 'NULL')
      USING ERRCODE = 'undefined_object', HINT = 'storetopics.stores lists the stores you may search.';
  END IF;
  v_reader := storetopics._reader(src.id);   -- made again from the current templates after an upgrade
  RETURN QUERY EXECUTE format('SELECT * FROM %s(''search'', NULL, $1, $2) AS r(file_key text, chunk text, '
                              'content text, rank float8, text_rank float8, distance float8)', v_reader)
    USING search.store_key, jsonb_build_object('query', search.query, 'k', search.k, 'embedding', search.query_embedding::text);
END $$;
COMMENT ON FUNCTION storetopics.search(regclass, text, text, int, vector) IS
  'The k (1-50) best chunks of a store for a query: full-text (websearch syntax, ts_rank), fused with the nearest '
  'chunks by cosine distance when an embedding is given.  The caller needs SELECT on the chunk table and a store it '
  'may see; the attacher''s expressions run as the table''s owner.';
