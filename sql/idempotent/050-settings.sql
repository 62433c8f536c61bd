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
