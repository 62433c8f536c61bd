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
CREATE OR REPLACE FUNCTION storetopics._max_store_key() RETURNS int
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
-- the one piece assembled at run time (assign's cluster slots) is built from integers.  Each concern writes its own
-- queries, beside the code that reads them (each returns its ops' arms of the reader's CASE):
--   storetopics._fold_reads (040-fold.sql)
--     keys                        (store_key, file_key) of every row: a resync's list of files
--     file_counts                 (file_key, chunks): the count check
--     null_files                  (n): rows whose file key is NULL
--     terms, terms_slow (files)   (store_key, file_key, term, n, rows): fold's recount; the slow path tokenises row by
--                                 row, skipping texts whose tsvector would pass 1 MB
--   storetopics._cluster_reads (060-clusters.sql)
--     means (files | store)       (store_key, file_key, dims, m): each file's mean direction
--     assign (files | store, args.clusters)   the chunks per nearest cluster, see storetopics._assign
--     sample (store, args)        (ref, file_key, e): a fit's sample, see storetopics._fit_input
--     chunks (files = refs)       (ref, file_key, text): representatives
--   storetopics._phrase_reads (065-phrases.sql)
--     sample_texts (files, store) (file_key, t): what phrases are mined from
--   storetopics._word_reads (070-summary.sql)
--     texts (files, store)        (t): the texts surface words are learnt from
--     leads (files, store)        (file_key, t): the start of each file's first chunk (storetopics._chunk_order_sql)
--   storetopics._search_reads (120-search.sql)
--     search (store, args.query, args.k, args.embedding)   (file_key, chunk, content, rank, text_rank, distance)
-- (PL/pgSQL: the concerns' functions come in later files.)
CREATE OR REPLACE FUNCTION storetopics._reader_body(src storetopics.sources) RETURNS text
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  RETURN format($f$
DECLARE
  v_slots int;
BEGIN
  %1$s
  CASE op
%2$s  ELSE
    RAISE EXCEPTION 'storetopics: unknown read %%', op;
  END CASE;
END$f$,
    storetopics._owner_check_sql(src, format(
      'RAISE EXCEPTION %L USING ERRCODE = %L, HINT = %L;',
      format('storetopics: source %s: %s no longer runs as the owner of %s (it was altered)', src.id,
             storetopics._generated(src.id, 'read'), src.chunks),
      'insufficient_privilege', format('Detach %s and attach it again.', src.chunks))),
    storetopics._fold_reads(src) || storetopics._word_reads(src) || storetopics._phrase_reads(src) ||
    storetopics._cluster_reads(src) || storetopics._search_reads(src));
END $$;

-- One arm of the reader's CASE: op runs its query, with the arguments it binds (a list such as 'files, store').
CREATE OR REPLACE FUNCTION storetopics._read_arm(op text, query text, binds text DEFAULT NULL) RETURNS text
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp
RETURN format(E'  WHEN %L THEN RETURN QUERY EXECUTE %L%s;\n', op, query, ' USING ' || binds);

-- The reads' filters of the rows: by the files of the call ($1), by its store ($2).
CREATE OR REPLACE FUNCTION storetopics._read_by_files(src storetopics.sources) RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
RETURN format('%s = ANY ($1::%s[])', src.file_sql, src.file_type);

CREATE OR REPLACE FUNCTION storetopics._read_by_store(src storetopics.sources) RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
RETURN format('(%s)::text = $2', src.store_sql);

-- The text as it is counted (storetopics._dehyphenated).
CREATE OR REPLACE FUNCTION storetopics._read_text_sql(src storetopics.sources) RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
RETURN format('storetopics._dehyphenated(%s)', src.content_sql);

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
    EXECUTE format('CREATE OR REPLACE FUNCTION %s(%s) RETURNS %s LANGUAGE plpgsql %s AS %L',
                   storetopics._generated(src.id, g.kind), g.params, g.returns,
                   -- its security and its search_path
                   format('%s %s', CASE WHEN g.definer THEN 'SECURITY DEFINER' ELSE '' END,
                          CASE WHEN g.kind = 'capture' AND storetopics._capture_bound(src) THEN ''
                               ELSE 'SET search_path = pg_catalog, pg_temp' END), g.body);
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
COMMENT ON FUNCTION storetopics._max_store_key() IS
  'The longest store key kept, in characters (500); rows with a longer one are counted as skipped.';
