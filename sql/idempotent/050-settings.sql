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
                                 -- replica (logical replication's apply, pg_restore); see docs/sql.md
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

-- Whether a source's stores get their labels from an LLM (its labeller is not 'offline'): the one place that decides
-- it.  What asks for, waits on or shows an LLM label asks this (labels_due, store_labels_due, the store labels' gate,
-- stores_due, the worker's dirty tests, render, metrics), and so does the refresh pass outside the database
-- (refresh.labeller).  Offline, a label is derived in SQL from the cluster's words and no call is made.
CREATE OR REPLACE FUNCTION storetopics._llm_labeller(p_source int) RETURNS boolean
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
RETURN coalesce(storetopics._settings(p_source) ->> 'labeller', 'offline') <> 'offline';

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

-- Adds a difference (per term: total, stores, files; arrays in step) to a catalog's background, in term order (folds
-- of two sources of one catalog lock its rows in the same order), and drops terms no store holds.
CREATE OR REPLACE FUNCTION storetopics._catalog_apply(p_catalog text, p_terms int[], p_totals numeric[],
                                                      p_stores int[], p_files bigint[]) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  INSERT INTO storetopics.catalog_terms AS c (catalog, term_id, total, stores, files)
  SELECT p_catalog, d.term_id, d.total, d.stores, d.files
    FROM unnest(p_terms, p_totals, p_stores, p_files) AS d(term_id, total, stores, files)
   WHERE d.total <> 0 OR d.stores <> 0 OR d.files <> 0
   ORDER BY d.term_id
  ON CONFLICT (catalog, term_id) DO UPDATE
     SET total = c.total + excluded.total, stores = c.stores + excluded.stores, files = c.files + excluded.files;
  -- (only a term that some store lost can be left in none)
  DELETE FROM storetopics.catalog_terms c USING unnest(p_terms, p_stores) AS d(term_id, stores)
   WHERE c.catalog = p_catalog AND c.term_id = d.term_id AND d.stores < 0 AND c.stores <= 0;
  -- the terms changed, for the contrast heads render keeps (storetopics._kept_contrast); after the catalog's rows,
  -- as every fold of the catalog locks them
  IF cardinality(p_terms) > 0 THEN
    INSERT INTO storetopics.catalog_touched AS c (catalog, touched) VALUES (p_catalog, p_terms)
    ON CONFLICT (catalog) DO UPDATE
       SET generation = c.generation + CASE WHEN cardinality(c.touched) + cardinality(p_terms) > 100000 THEN 1 ELSE 0 END,
           touched = CASE WHEN cardinality(c.touched) + cardinality(p_terms) > 100000 THEN '{}' ELSE c.touched || p_terms END;
  END IF;
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
    PERFORM storetopics._catalog_apply(v_catalog, array_agg(x.term_id), array_agg(x.total), array_agg(x.stores),
                                       array_agg(x.files))
       FROM (SELECT t.term_id, v_sign * sum(t.total) AS total, (v_sign * count(*))::int AS stores,
                    v_sign * sum(t.files) AS files
               FROM storetopics.store_terms t WHERE t.source_id = p_source GROUP BY 1) x;
  END LOOP;
END $$;

-- What \df+ shows a DBA.
COMMENT ON FUNCTION storetopics.default_settings() IS
  'The defaults of every setting (jsonb); storetopics.settings(table) gives a table''s effective ones.';
