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
  'paused', false,
  'replica_capture', false,      -- capture triggers ENABLE ALWAYS: also rows written in session_replication_role
                                 -- replica (logical replication's apply, pg_restore); see README
  'verify_every', 3600);         -- seconds between the worker's count checks of a source (verify()); 0: never

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
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
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
    IF k = 'labeller' AND v #>> '{}' NOT IN ('offline', 'anthropic') THEN
      RAISE EXCEPTION 'storetopics: unknown labeller %', v USING ERRCODE = 'invalid_parameter_value',
        HINT = 'offline or anthropic';
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
