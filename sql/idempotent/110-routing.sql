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
CREATE OR REPLACE FUNCTION storetopics._tool_name(store_key text, suffix text DEFAULT '') RETURNS text
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE SET search_path = pg_catalog, pg_temp
RETURN left('search_' || regexp_replace(lower(store_key), '[^abcdefghijklmnopqrstuvwxyz0123456789_-]', '_', 'g'),
            64 - length(suffix)) || suffix;
COMMENT ON FUNCTION storetopics._tool_name(text, text) IS
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
    FOREACH v_name IN ARRAY ARRAY[storetopics._tool_name(r.store_key),
                                  storetopics._tool_name(r.store_key, '_' || p_source),
                                  storetopics._tool_name(r.store_key, '_' || p_source || '_' || left(md5(r.store_key), 8))]
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
    JOIN pg_catalog.pg_class t ON t.oid = s.chunks   -- (a table dropped where no event trigger saw it: none)
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
CREATE OR REPLACE FUNCTION storetopics.catalog(name text DEFAULT NULL)
RETURNS TABLE (catalog text, source regclass, source_id int, store_key text, tool_name text, description text,
               tokens int, updated_at timestamptz, content_hash text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
SELECT r.catalog, s.chunks, r.source_id, r.store_key, r.tool_name, st.store_topics, t.tokens, st.updated_at,
       md5(st.store_topics)
  FROM storetopics._readable_stores(catalog.name) r
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
-- radius - d, with and without the share; the figures: bench/README.md, "Tried and not kept").  Radius-relative
-- scores route worst: a radius is the 95th percentile of the member chunks' distances in their files' context,
-- which a query is not.  cluster_id is the cluster that weighs most in the sum
-- (ties: the lower id), distance its cosine distance, within_radius whether the query lies inside its radius; label
-- its label as the summary shows it.
-- search: the score reaches the store's source's route_threshold (settings); false on every row means no store
-- holds the query: abstain.  Rows: the k best stores, best first (ties: source, store key).
CREATE OR REPLACE FUNCTION storetopics.route(query_embedding vector, k int DEFAULT 3, catalog text DEFAULT NULL)
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
    FROM storetopics._readable_stores(route.catalog) r;
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
    USING query_embedding, k, route.catalog, v_dims, v_norm, v_ids, v_keys, v_names, v_sources;
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
-- lambda were chosen on the tuning half of the routing evaluation's queries, against Dirichlet smoothing and other
-- lambdas (bench/README.md, "Tried and not kept"): as good at top-1, the best abstention F1 on the other half too,
-- and independent of the stores' sizes.  A store alone in the list is its own background: it scores 0 whatever the query (a
-- ratio needs something to be told apart from; route() has no such limit).  One index probe per listed store and
-- query lexeme (the words a store has no row for score ln(1/2) each: only the rows it has are read).  label: the query's word that
-- weighs most for the store, as people write it (NULL when none weighs for it); cluster_id, distance and
-- within_radius are NULL.  search: the score reaches the source's route_text_threshold.
CREATE OR REPLACE FUNCTION storetopics.route_text(query text, k int DEFAULT 3, catalog text DEFAULT NULL)
RETURNS TABLE (source_id int, store_key text, tool_name text, score float8, cluster_id int, label text,
               distance float8, within_radius boolean, search boolean)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET jit = off AS $$
BEGIN
  PERFORM storetopics._route_args('route_text', query IS NULL, k);
  RETURN QUERY
  WITH vis AS MATERIALIZED (
    SELECT r.source_id, r.store_key, r.tool_name, s.ts_config, greatest(st.words, 1)::float8 AS words
      FROM storetopics._readable_stores(route_text.catalog) r
      JOIN storetopics.sources s ON s.id = r.source_id
      JOIN storetopics.store_state st ON st.source_id = r.source_id AND st.store_key = r.store_key
  ), ql AS MATERIALIZED (
    -- the query's lexemes per text search configuration, with their counts and ids (NULL: a lexeme no store of
    -- any source has ever held); tsvector_or_null: NULL for a text fold would not count either
    SELECT c.cfg, l.lexeme, coalesce(cardinality(l.positions), 1)::float8 AS n, x.id AS term_id
      FROM (SELECT DISTINCT v.ts_config AS cfg FROM vis v) c
     CROSS JOIN LATERAL unnest(storetopics._tsvector_or_null(c.cfg, query)) AS l
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
         coalesce(storetopics._show(p.source_id, p.store_key, p.best), p.best),
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
