-- ------------------------------------------------------------------------------------------------------------
-- Clusters: assignment of chunks to the current fit, kept by fold(); fits applied by apply_fit()
-- ------------------------------------------------------------------------------------------------------------
-- A chunk is clustered in its file's context: as the unit sum of its own direction and its file's mean direction
-- (files of one chunk: the chunk itself).  Read alone, a chunk such as "This package contains the documentation" or
-- a table of numbers says little about the topic its file is about; in context it goes where its file goes (the
-- clusters agree better with the Debian sections: bench/README.md).  Both the fit (_fit_input) and the assignment
-- below use it, so distances and radii agree.
--
-- Assigns the chunk rows of the files p_files (or of the store p_store) to their store's clusters; returns per
-- (store, file) the chunks per nearest cluster of the store's fit, the outliers among them, the chunks whose
-- vector no cluster can take (another dimension), and how far the file lies from the clusters (the least distance
-- ratio of its chunks, see file_clusters).
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
CREATE OR REPLACE FUNCTION storetopics._assign(src storetopics.sources, p_files text[], p_store text)
RETURNS TABLE (store_key text, file_key text, cluster_ids int[], cluster_chunks int[], cluster_outliers int[],
               other_dim int, distance_ratio real)
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp SET work_mem = '128MB' SET jit = off SET enable_nestloop = on
AS $$
#variable_conflict use_column
DECLARE
  v_reader text := storetopics._generated(src.id, 'read');
  v_clusters jsonb;
  v_saved text[] := ARRAY[current_setting('parallel_setup_cost'), current_setting('parallel_tuple_cost'),
                          current_setting('min_parallel_table_scan_size'), current_setting('enable_sort'),
                          current_setting('enable_hashjoin'), current_setting('enable_material')];
BEGIN
  PERFORM set_config('parallel_setup_cost', '0', true), set_config('parallel_tuple_cost', '0', true),
          set_config('min_parallel_table_scan_size', '0', true), set_config('enable_sort', 'off', true);
  -- each row finds its file's mean through the index (see _assign_sql); a whole store's clusters are init plans
  PERFORM set_config('enable_hashjoin', 'off', true);
  IF p_files IS NULL THEN
    PERFORM set_config('enable_material', 'off', true);
  END IF;
  DELETE FROM storetopics.file_means WHERE source_id = src.id;
  EXECUTE format('INSERT INTO storetopics.file_means (source_id, store_key, file_key, dims, m) '
                 'SELECT $1, r.* FROM %s(''means'', $2, $3, NULL) AS r(store_key text, file_key text, dims int, '
                 'm %I.vector)', v_reader, storetopics._vector_schema())
    USING src.id, p_files, p_store;
  -- the clusters of the stores whose files have a mean, passed to the reader as data (it runs as the table's owner,
  -- who may not read them): no other store's rows can join them, and the centroids go as text, written out and read
  -- back at each call (an empty list when none of those stores has clusters: a file moved to one that has none)
  SELECT jsonb_build_object('clusters', coalesce(jsonb_agg(jsonb_build_object('store_key', k.store_key,
                                                                              'id', k.cluster_id, 'radius', k.radius,
                                                                              'centroid', k.centroid::text)), '[]'))
    INTO v_clusters
    FROM storetopics.clusters k
   WHERE k.source_id = src.id AND (p_store IS NULL OR k.store_key = p_store)
     AND k.store_key IN (SELECT m.store_key FROM storetopics.file_means m WHERE m.source_id = src.id);
  RETURN QUERY EXECUTE format('SELECT * FROM %s(''assign'', $1, $2, $3) '
                 'AS r(store_key text, file_key text, cluster_ids int[], cluster_chunks int[], cluster_outliers int[], '
                 'other_dim int, distance_ratio real)', v_reader)
    USING p_files, p_store, v_clusters;
  DELETE FROM storetopics.file_means WHERE source_id = src.id;
  PERFORM set_config('parallel_setup_cost', v_saved[1], true), set_config('parallel_tuple_cost', v_saved[2], true),
          set_config('min_parallel_table_scan_size', v_saved[3], true), set_config('enable_sort', v_saved[4], true),
          set_config('enable_hashjoin', v_saved[5], true), set_config('enable_material', v_saved[6], true);
END $$;

-- The reader's queries for the clusters (storetopics._reader_body puts them in read_<id>): means (files | store)
-- and assign (files | store, args.clusters), for _assign; sample (store, args), a fit's sample (_fit_input); chunks
-- (files = refs), the representatives' texts (apply_fit).  Without an embedding only chunks has a query.
CREATE OR REPLACE FUNCTION storetopics._cluster_reads(src storetopics.sources) RETURNS text
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  vs name;
  e text;
  ref text := storetopics._chunk_ref_sql(src.chunks);
  by_files text := storetopics._read_by_files(src);
  by_store text := storetopics._read_by_store(src);
  means text := '';
  assign text[] := '{"", "", "", "", "", ""}';
  sample text := '';
BEGIN
  IF src.embedding IS NOT NULL THEN
    vs := storetopics._vector_schema();
    e := storetopics._embedding_sql(src);
    means := format($q$
      SELECT (%1$s)::text, (%2$s)::text, %3$I.vector_dims(%4$s), %3$I.l2_normalize(%3$I.sum(%3$I.l2_normalize(%4$s)))
        FROM %5$s AS c
       WHERE (%1$s) IS NOT NULL AND %4$s IS NOT NULL AND $q$, src.store_sql, src.file_sql, vs, e, src.chunks);
    assign := storetopics._assign_sql(src);
    sample := format($q$
      SELECT %1$s AS ref, (%2$s)::text AS file_key, %3$s AS e
        FROM %4$s AS c $q$, ref, src.file_sql, e, src.chunks);
  END IF;
  RETURN storetopics._read_arm('chunks', format('SELECT %s, (%s)::text, left(%s, 1000) FROM %s AS c WHERE %s', ref,
                                                src.file_sql, src.content_sql, src.chunks,
                                                storetopics._chunk_lookup_sql(src.chunks)), 'files')
    || format($a$  WHEN 'means' THEN
    RETURN QUERY EXECUTE %1$L OPERATOR(pg_catalog.||) CASE WHEN files IS NULL THEN %2$L ELSE %3$L END
                                 OPERATOR(pg_catalog.||) ' GROUP BY 1, 2, 3' USING files, store;
$a$, means, by_store, by_files)
    || format($a$  WHEN 'assign' THEN
    -- one least() argument per cluster slot: the most clusters a store of the call has
    v_slots := (SELECT pg_catalog.max(x.n) FROM (
                  SELECT pg_catalog.count(*) AS n
                    FROM pg_catalog.jsonb_array_elements(args OPERATOR(pg_catalog.->) 'clusters') AS k
                   GROUP BY k OPERATOR(pg_catalog.->>) 'store_key') AS x);
    RETURN QUERY EXECUTE %1$s
      OPERATOR(pg_catalog.||) %2$s
      OPERATOR(pg_catalog.||) %3$s
      USING files, store, args;
$a$,
      -- the head, the clusters (ks) by store or by files, the joins up to least()
      format(E'%L OPERATOR(pg_catalog.||) CASE WHEN files IS NULL THEN %L ELSE %L END\n      OPERATOR(pg_catalog.||) %L',
             assign[1], assign[3], assign[2], assign[4]),
      -- least()'s arguments, one per cluster slot
      format($a$coalesce((SELECT pg_catalog.string_agg(pg_catalog.format(%L, i, i), ', ')
                                          FROM pg_catalog.generate_series(1, v_slots) AS i), 'NULL::float8[]')$a$,
             format('ARRAY[ks.cen[%%s] OPERATOR(%I.<#>) q.q, %%s]', coalesce(vs, 'public'))),
      -- the next piece, the rows' filter, the tail
      format(E'%L OPERATOR(pg_catalog.||) CASE WHEN files IS NULL THEN %L ELSE %L END\n      OPERATOR(pg_catalog.||) %L',
             assign[5], by_store, by_files, assign[6]))
    || format($a$  WHEN 'sample' THEN
    RETURN QUERY EXECUTE %1$L OPERATOR(pg_catalog.||)
      CASE WHEN args OPERATOR(pg_catalog.->>) 'percent' IS NULL THEN ''
           ELSE 'TABLESAMPLE SYSTEM (($3 ->> ''percent'')::float8) REPEATABLE (($3 ->> ''seed'')::int)' END
      OPERATOR(pg_catalog.||) %2$L
      USING files, store, args;
$a$, sample, format($q$
       WHERE %s AND %s IS NOT NULL AND (%s) IS NOT NULL
       ORDER BY hashtext(%s || ':' || ($3 ->> 'seed')), 1
       LIMIT ($3 ->> 'limit')::int$q$, by_store, e, src.file_sql, ref));
END $$;

-- The reader's assignment query (see _assign), in pieces the reader puts together at run time: the head, then the
-- stores' clusters (ks) from one of two sources, the joins up to least(), the least() arguments of the cluster
-- slots, the next piece, the rows' filter (by files or by store), the tail.
--   ks by files (fold: a few files, maybe of several stores): the clusters of each store of the call, materialised
--   and joined to the rows by store.
--   ks by store (apply_fit: every file of one store): the one store's clusters as init plans, evaluated once and
--   passed to the parallel workers.
--   Either way _assign turns hash joins off, so each row finds its file's mean through file_means' index.  Hashed,
--   all the means of a large store would be one shared hash table that every process of the query holds, growing
--   with the store's files; and a fold's batch put each row into it with all its store's centroids, a table that
--   spilled to disk (bench/README.md has the figures).
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
           coalesce(sum(x.n) FILTER (WHERE x.other_dim), 0)::int AS other_dim,
           (min(x.r) FILTER (WHERE x.joined))::real AS distance_ratio
      FROM (SELECT y.store_key, y.file_key, y.joined, y.other_dim, y.cluster_id,
                   count(*)::int AS n, (count(*) FILTER (WHERE y.d > y.radius))::int AS o,
                   -- (a radius of 0: a chunk at any distance is beyond it, as far as can be)
                   min(CASE WHEN y.radius > 0 THEN y.d / y.radius WHEN y.d > 0 THEN 'Infinity' ELSE 0 END) AS r
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
                             ON fm.source_id = %5$s AND fm.store_key = (%1$s)::text AND fm.file_key = (%2$s)::text
                            AND fm.dims = %4$I.vector_dims(%3$s)
                      -- q: the chunk in its file's context (not normalised again) and its length, each computed once
                      -- per row (a function scan's result is not inlined into the expressions that use it)
                      CROSS JOIN LATERAL unnest(ARRAY[CASE WHEN fm.m IS NULL THEN %3$s
                                                           ELSE %4$I.l2_normalize(%3$s) OPERATOR(%4$I.+) fm.m END]) AS q(q)
                      CROSS JOIN LATERAL unnest(ARRAY[%4$I.vector_norm(q.q)]) AS b(qn)
                      -- m = [inner product, slot] of the nearest centroid; NULL for a NULL vector, one of another
                      -- dimension, or a store without clusters
                      CROSS JOIN LATERAL unnest(ARRAY[ROW(CASE WHEN %4$I.vector_dims(q.q) = ks.dims
                                                               THEN least($q$,
                      src.store_sql, src.file_sql, e, vs, src.id),
               format($q$) END)]) AS a(m float8[])
                     WHERE (%1$s) IS NOT NULL AND $q$, src.store_sql),
               $q$) y
             GROUP BY 1, 2, 3, 4, 5) x
     GROUP BY 1, 2$q$];
END $$;

-- (fold()'s step for clusters, which read fold's temp tables, is part of storetopics._fold_apply now)

-- Whether a store's clustering is due, and why: 'no fit' (enough vectors, never fitted), 'outliers' (outliers since
-- the fit pass refit_outliers of the store), 'dimension' (most vectors have another dimension than the fit), or
-- NULL when the current fit still holds.
CREATE OR REPLACE FUNCTION storetopics._fit_due(p_source int, p_store text) RETURNS text
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
-- chunk refs.  Parts keep every message and every allocation small: a client library holds one large bytea
-- several times over while it decodes it; read part by part the sample is held once (bench/README.md).
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

-- apply_fit()'s second half: every file of a store assigned again to the clusters now in place (one pass over its
-- chunks), and the clusters' sizes recounted.  Returns the chunks assigned.
-- (Joins between a store's files and the pass's result are hashed: right after a big fold file_terms has no
-- statistics yet, and the planner's nested loop over both was orders of magnitude slower.)
CREATE OR REPLACE FUNCTION storetopics._reassign_store(src storetopics.sources, p_store text) RETURNS bigint
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp SET work_mem = '128MB' SET enable_nestloop = off SET jit = off
AS $$
BEGIN
  -- what is apart may change for every file: render's kept novelty of the store goes (storetopics._outlier_files)
  PERFORM storetopics._forget_novelty(src.id, p_store);
  -- (a temp table made and dropped here: two statements read it, planned on its statistics)
  CREATE TEMP TABLE storetopics_assign ON COMMIT DROP AS SELECT * FROM storetopics._assign(src, NULL, p_store);
  ANALYZE pg_temp.storetopics_assign;
  -- the store's files as folded get the pass's assignment (files of the store the pass did not see, their rows
  -- changed since, get none: a pending event will recount them)
  DELETE FROM storetopics.file_clusters c WHERE c.source_id = src.id AND c.store_key = p_store;
  INSERT INTO storetopics.file_clusters (source_id, store_key, file_key, chunks, words, cluster_ids, cluster_chunks,
                                         cluster_outliers, other_dim, distance_ratio)
  SELECT src.id, p_store, a.file_key, f.chunks, f.words, a.cluster_ids, a.cluster_chunks, a.cluster_outliers,
         a.other_dim, a.distance_ratio
    FROM pg_temp.storetopics_assign a
    JOIN storetopics.file_terms f
      ON f.source_id = src.id AND md5(f.file_key)::uuid = md5(a.file_key)::uuid AND f.file_key = a.file_key
     AND f.store_key = p_store
   WHERE a.store_key = p_store AND (cardinality(a.cluster_ids) > 0 OR a.other_dim <> 0);
  -- (a store backfilled in two batches kept the statistics of the first, and render's keywords() crawled until
  -- autovacuum came by)
  PERFORM storetopics._analyze_if_stale(src.id, p_store);
  DROP TABLE pg_temp.storetopics_assign;
  UPDATE storetopics.clusters k SET chunks = 0, files = 0, outliers = 0, outliers_at_fit = 0, outliers_seen = 0
   WHERE k.source_id = src.id AND k.store_key = p_store;
  UPDATE storetopics.clusters k
     SET chunks = x.chunks, files = x.files, outliers = x.outliers, outliers_at_fit = x.outliers,
         outliers_seen = x.outliers
    FROM (SELECT u.cluster_id, sum(u.n) AS chunks, count(*) AS files, sum(u.o) AS outliers
            FROM storetopics.file_clusters f,
                 unnest(f.cluster_ids, f.cluster_chunks, f.cluster_outliers) AS u(cluster_id, n, o)
           WHERE f.source_id = src.id AND f.store_key = p_store
           GROUP BY 1) x
   WHERE k.source_id = src.id AND k.store_key = p_store AND k.cluster_id = x.cluster_id;
  RETURN (SELECT coalesce(sum(k.chunks), 0)
            FROM storetopics.clusters k WHERE k.source_id = src.id AND k.store_key = p_store);
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
-- input was read, nothing is written.  Returns a jsonb report.  (About 85 lines: the new clusters' rows are made
-- from the old ones it keeps in temp tables, made and dropped here.)
-- (Joins between a store's files and the pass's result are hashed: right after a big fold file_terms has no
-- statistics yet, and the nested loop the planner would then choose is quadratic in the store's files.)
CREATE OR REPLACE FUNCTION storetopics._apply_fit(p_source int, p_store text, p_fit jsonb) RETURNS jsonb
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

  v_assigned := storetopics._reassign_store(src, p_store);   -- every file of the store, to the clusters now in place

  UPDATE storetopics.store_state
     SET other_dim = (SELECT coalesce(sum(f.other_dim), 0) FROM storetopics.file_clusters f
                       WHERE f.source_id = p_source AND f.store_key = p_store),
         fit_generation = fit_generation + 1, fit_at = now(), fit_k = (p_fit ->> 'k')::int,
         fit_silhouette = (p_fit ->> 'silhouette')::real, fit_single_theme = (p_fit ->> 'single_theme')::boolean,
         fit_sample = (p_fit ->> 'sample')::int, fit_seed = (p_fit ->> 'seed')::int, fit_dim = (p_fit ->> 'dim')::int,
         fit_space = p_fit ->> 'space', fit_seconds = (p_fit ->> 'seconds')::real, fit_chunks = v_assigned,
         version = version + 1
   WHERE source_id = p_source AND store_key = p_store;
  PERFORM storetopics._refresh_words(p_source, p_store);   -- every cluster's words, for the labeller
  RETURN jsonb_build_object('applied', true, 'generation', st.fit_generation + 1, 'k', (p_fit ->> 'k')::int,
                            'kept', v_kept, 'new', coalesce(cardinality(v_new), 0), 'inherited', v_inherited,
                            'removed', v_removed,
                            'assigned_chunks', v_assigned);
END $$;

-- A digest of the build and a list of words: what a verdict of screen_words() kept with a cluster's words is valid
-- for (the same words, screened by the same SQL: clusters.keywords_screened).
CREATE OR REPLACE FUNCTION storetopics._words_screen_key(words text[]) RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
RETURN md5(coalesce(storetopics._build(), '') || ':' || words::text);

-- The positions of words that screen_words() leaves out: those kept with them (dropped) while their digest (key)
-- holds, else screened now.
CREATE OR REPLACE FUNCTION storetopics._words_dropped(words text[], key text, dropped int[]) RETURNS int[]
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
RETURN CASE WHEN key = storetopics._words_screen_key(words) THEN dropped
            ELSE coalesce(storetopics._screen_words(words), '{}') END;

-- Each cluster's distinctive words, c-TF-IDF (BERTopic's class-based TF-IDF) over the keyword state: a cluster's
-- term counts are those of its files, each weighted by the share of the file's chunks in the cluster (at most 400
-- files per cluster, the most committed first, ties by a hash of the key); tf(t, cluster) x log(1 + A / f(t)),
-- A = average words per cluster, f(t) = count of t in all clusters.  A term must occur in two of the cluster's files
-- (one file's names are not the cluster's theme).
-- p_clusters: the clusters to update (NULL: all of the store).  No JIT, as for storetopics._mine_phrases: estimates
-- over unnested arrays are far too high, and buy a compilation that takes longer than the statement.
-- The files are picked from the narrow columns (keys, cluster arrays), and only the picked files' term arrays are
-- read.  The words are a function of those files (their keys, weights and counted words), of the store's clusters
-- and of the words learnt for their lexemes: when a digest of the first (store_state.cluster_words_from) is the one
-- they were last computed from, and every lexeme they were computed from had its word learnt then (learnt words are
-- never forgotten), they are what computing them again would give, and stay.
-- (About 90 lines: the pick, its digest, the scoring and the update share one temp table of the picked files.)
CREATE OR REPLACE FUNCTION storetopics._cluster_keywords(p_source int, p_store text, p_clusters int[] DEFAULT NULL,
                                              n_words int DEFAULT 15) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp SET jit = off AS $$
DECLARE
  v_from text;
BEGIN
  -- the picked files, each cluster's most committed first, with their term arrays (one statement: one snapshot;
  -- the files are ranked in the narrow file_clusters, and the arrays fetched for the picked files only: OFFSET 0
  -- keeps that a lookup per picked file)
  CREATE TEMP TABLE storetopics_pick ON COMMIT DROP AS
  SELECT p.cluster_id, p.file_key, p.w, a.term_ids, a.counts
    FROM (SELECT x.cluster_id, x.file_key, x.w
            FROM (SELECT u.cluster_id, c.file_key, u.n::float8 / greatest(c.chunks, 1) AS w,
                         row_number() OVER (PARTITION BY u.cluster_id
                                            ORDER BY u.n::float8 / greatest(c.chunks, 1) DESC, hashtext(c.file_key),
                                                     c.file_key) AS r
                    FROM storetopics.file_clusters c, unnest(c.cluster_ids, c.cluster_chunks) AS u(cluster_id, n)
                   WHERE c.source_id = p_source AND c.store_key = p_store AND c.words > 0) x
           WHERE x.r <= 400) p,
         LATERAL (SELECT f.term_ids, f.counts FROM storetopics.file_terms f
                   WHERE f.source_id = p_source AND md5(f.file_key)::uuid = md5(p.file_key)::uuid
                     AND f.file_key = p.file_key AND f.store_key = p_store OFFSET 0) a;
  -- what the words are computed from: the build (the computation), n_words, the store's clusters, the picked files
  v_from := md5(storetopics._build() || '|' || n_words || '|' ||
                (SELECT coalesce(string_agg(k.cluster_id::text, ',' ORDER BY k.cluster_id), '')
                   FROM storetopics.clusters k WHERE k.source_id = p_source AND k.store_key = p_store) || '|' ||
                (SELECT coalesce(string_agg(p.cluster_id || ':' || p.file_key || ':' || p.w || ':' ||
                                            storetopics._terms_digest(p.term_ids, p.counts), ','
                                            ORDER BY p.cluster_id, p.file_key), '')
                   FROM pg_temp.storetopics_pick p));
  IF p_clusters IS NULL AND v_from IS NOT DISTINCT FROM
     (SELECT st.cluster_words_from FROM storetopics.store_state st
       WHERE st.source_id = p_source AND st.store_key = p_store) THEN
    DROP TABLE pg_temp.storetopics_pick;
    RETURN;
  END IF;
  CREATE TEMP TABLE storetopics_ct ON COMMIT DROP AS
  WITH ct AS (
    -- (the arrays unnested in the select list, which streams them; unnest(a, b) in FROM copies them first)
    SELECT u.cluster_id, u.term_id, sum(u.n * u.w) AS n, count(*) AS nfiles
      FROM (SELECT p.cluster_id, p.w, unnest(p.term_ids) AS term_id, unnest(p.counts) AS n
              FROM pg_temp.storetopics_pick p) u
     GROUP BY 1, 2
  ), shown AS MATERIALIZED (
    -- the store's terms worth showing, with their text: one hash for the join below (looked up per (cluster,
    -- term) pair, the lexemes cost an index probe and a showable_term call each)
    SELECT t.term_id, x.lexeme
      FROM storetopics.store_terms t JOIN storetopics.lexemes x ON x.id = t.term_id
     WHERE t.source_id = p_source AND t.store_key = p_store AND storetopics._showable_term(x.lexeme)
  ), tot AS (
    SELECT ct.term_id, sum(ct.n) AS total FROM ct GROUP BY 1
  ), sizes AS (
    SELECT ct.cluster_id, sum(ct.n) AS size,
           (SELECT count(*) FROM pg_temp.storetopics_pick p WHERE p.cluster_id = ct.cluster_id) AS files
      FROM ct GROUP BY 1
  ), scored AS (
    -- (a store that is one theme has one cluster: its words are then simply its most frequent ones).  No factor
    -- for the term's rarity in the store: a word every file of the store shares ("perl" in a Perl store) is what
    -- tells this store from others, so labels must keep such words to route (bench/README.md, "Tried and not kept").
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
  DROP TABLE pg_temp.storetopics_pick;
  PERFORM storetopics._learn_words(p_source, p_store, ARRAY(SELECT DISTINCT c.lexeme FROM pg_temp.storetopics_ct c));
  -- (with the screen's verdict on them: screened again only when they changed, storetopics._words_screen_key)
  UPDATE storetopics.clusters k
     SET keywords = coalesce(w.words, '{}'),
         keywords_dropped = storetopics._words_dropped(coalesce(w.words, '{}'), k.keywords_screened,
                                                       k.keywords_dropped),
         keywords_screened = storetopics._words_screen_key(coalesce(w.words, '{}'))
    FROM storetopics.clusters k2
    LEFT JOIN (SELECT z.cluster_id, (array_agg(z.word ORDER BY z.r))[1:n_words] AS words
                 FROM (SELECT DISTINCT ON (c.cluster_id, s.word) c.cluster_id, c.r, s.word
                         FROM pg_temp.storetopics_ct c,
                              LATERAL (SELECT storetopics._show(p_source, p_store, c.lexeme)) s(word)
                        WHERE s.word IS NOT NULL
                        ORDER BY c.cluster_id, s.word, c.r) z
                GROUP BY 1) w ON w.cluster_id = k2.cluster_id
   WHERE k.source_id = p_source AND k.store_key = p_store
     AND k2.source_id = k.source_id AND k2.store_key = k.store_key AND k2.cluster_id = k.cluster_id
     AND (p_clusters IS NULL OR k.cluster_id = ANY (p_clusters));
  -- remembered only for the whole store, and only when every lexeme's word is learnt and checked in the store
  -- (else computing them again learns again, and may then show another word)
  UPDATE storetopics.store_state
     SET cluster_words_from = CASE WHEN p_clusters IS NULL AND NOT EXISTS (
                                     SELECT 1 FROM pg_temp.storetopics_ct c
                                      WHERE NOT EXISTS (SELECT 1 FROM storetopics.sources s, storetopics.term_words w
                                                         WHERE s.id = p_source AND w.owner = s.owner
                                                           AND w.ts_config = s.ts_config AND w.lexeme = c.lexeme)
                                         OR NOT EXISTS (SELECT 1 FROM storetopics.store_words x
                                                         WHERE x.source_id = p_source AND x.store_key = p_store
                                                           AND x.lexeme = c.lexeme))
                                   THEN v_from END
   WHERE source_id = p_source AND store_key = p_store;
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

CREATE OR REPLACE FUNCTION storetopics._refresh_words(p_source int, p_store text) RETURNS int
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  st storetopics.store_state;
  v_due int;
  v_shift float8;
BEGIN
  -- (first, for the worker's pass and render alike, which calls this first: a store new to the statistics)
  PERFORM storetopics._analyze_if_stale(p_source, p_store);
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
-- when it repeats one already taken, or is a part or a compound of one ("octave", "forge", "octave-forge"), or when
-- no noun phrase ends on it ("used", "lets", "available": the words storetopics._clause_fragment refuses at a run's
-- end, so "name zone used" is not shown).  Deterministic, no network.  (IMMUTABLE though _clause_fragment is STABLE:
-- it is so only because array_to_string() is; on text it depends on the words alone.)
CREATE OR REPLACE FUNCTION storetopics._offline_label(words text[]) RETURNS text
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  w text;
  taken text[] := '{}';
  parts text[] := '{}';
BEGIN
  FOREACH w IN ARRAY coalesce(words, '{}') LOOP
    CONTINUE WHEN NOT storetopics._showable_term(w)
                  OR storetopics._clause_fragment(ARRAY['a', w]) IN ('no noun at its end', 'verb at its end');
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
CREATE OR REPLACE FUNCTION storetopics._label_ok(label text) RETURNS boolean
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
CREATE OR REPLACE FUNCTION storetopics._labels_due(p_source int, p_store text)
RETURNS TABLE (cluster_id int, keywords text[], representatives jsonb, share float8, failures int,
               siblings text[], others text[])
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
  SELECT k.cluster_id, k.keywords, k.representatives,
         k.chunks::float8 / greatest((SELECT sum(k2.chunks) FROM storetopics.clusters k2
                                       WHERE k2.source_id = p_source AND k2.store_key = p_store), 1),
         k.label_failures,
         -- what the store's other clusters are about, so a label says what sets this one apart
         ARRAY(SELECT coalesce(k3.label, k3.phrase, storetopics._offline_label(k3.keywords))
                 FROM storetopics.clusters k3
                WHERE k3.source_id = p_source AND k3.store_key = p_store AND k3.cluster_id <> k.cluster_id
                  AND k3.chunks > 0
                ORDER BY k3.chunks DESC, k3.cluster_id LIMIT 8),
         -- and the catalog's other stores
         storetopics._other_stores(p_source, p_store)
    FROM storetopics.clusters k
   WHERE k.source_id = p_source AND k.store_key = p_store AND k.label_needed AND k.chunks > 0
     AND coalesce(k.label_retry_at, '-infinity') <= now()
     AND storetopics._llm_labeller(p_source)
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
CREATE OR REPLACE FUNCTION storetopics._record_label(p_source int, p_store text, p_cluster int, p_outcome text, p_label text,
                                         p_labeller text, p_model text DEFAULT NULL, p_input_tokens int DEFAULT 0,
                                         p_output_tokens int DEFAULT 0, p_detail text DEFAULT NULL) RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_outcome text := p_outcome;
  v_detail text := p_detail;
BEGIN
  IF v_outcome = 'ok' THEN
    v_detail := CASE WHEN NOT storetopics._label_ok(p_label) THEN 'not a 2-5 word label'
                     WHEN storetopics._screen(p_label) IS NOT NULL THEN 'screened: ' || storetopics._screen(p_label)
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
CREATE OR REPLACE FUNCTION storetopics._cluster(p_source int, p_store text) RETURNS jsonb
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
COMMENT ON FUNCTION storetopics._fit_due(int, text) IS
  'Why a store needs a (re-)fit now: no fit, outliers, dimension; NULL while its fit holds.';
COMMENT ON FUNCTION storetopics._apply_fit(int, text, jsonb) IS
  'Write a fit computed from _fit_input (clusters matched to the old ones keep their rows and labels) and assign every chunk of the store; compare-and-set on the fit generation. Returns a report.';
COMMENT ON FUNCTION storetopics._refresh_words(int, text) IS
  'Recompute a store''s cluster words and offline phrases from the current counts and run the keyword gate; returns how many labels became due.';
COMMENT ON FUNCTION storetopics._offline_label(text[]) IS
  'The fallback offline label: a cluster''s first three words that say something new.';
COMMENT ON FUNCTION storetopics._label_ok(text) IS
  'Whether a label has a label''s shape: 3-48 characters, 2-5 words (what it says is screen()''s business).';
COMMENT ON FUNCTION storetopics._labels_due(int, text) IS
  'The clusters whose label is due from the configured LLM labeller, with what it may see: words, representatives, the other clusters and stores.';
COMMENT ON FUNCTION storetopics._record_label(int, text, int, text, text, text, text, int, int, text) IS
  'Record a labelling call in the ledger and, when the label passes label_ok, screen() and the grounding check, store it; errors schedule a retry with backoff.';
COMMENT ON FUNCTION storetopics._cluster(int, text) IS
  'Re-fit one store''s clusters inside the database (needs plpython3u); elsewhere the worker or `storetopics backfill` fits.';
