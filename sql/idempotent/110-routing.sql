-- ------------------------------------------------------------------------------------------------------------
-- Routing: the catalog a router shows an LLM (one tool per store), and where to search for a query, or nowhere
-- ------------------------------------------------------------------------------------------------------------
-- Who sees what: the rule of the views storetopics.stores and storetopics.status, as metrics() applies it (the
-- sources the caller may act as the owner of, those granted to it with grant_read, every source for a worker role
-- or a superuser).  The functions here are SECURITY DEFINER (a router may read none of the tables they read), so
-- the rule is applied to the role that called in (_caller), not to current_user.  Granted by grant_read.

-- The stores the caller may read that have a summary, of one catalog (NULL: of every catalog), each with its tool
-- name: 'search_' and the store key, lowercased, every character but [a-z0-9_-] made '_', cut to 64 characters
-- (the tool names MCP, OpenAI and Anthropic accept: ^[a-zA-Z0-9_-]{1,64}$).  Two stores whose names would be the
-- same get '_<source id>' appended (cut first, so that it fits); two stores of one source that still collide
-- (keys that differ only in case or punctuation) get '_<source id>_<8 hex digits of md5(store key)>'.  The names are
-- unique within the set this returns and a function of it: the same stores give the same names, whatever the order
-- of rows on disk.
CREATE OR REPLACE FUNCTION storetopics._readable_stores(p_catalog text)
RETURNS TABLE (catalog text, source_id int, store_key text, tool_name text)
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
WITH me AS MATERIALIZED (
  SELECT storetopics._caller() AS r
), src AS MATERIALIZED (
  -- (_may_act_as and _catalog, written out: called per source they cost more than the rest of a route())
  SELECT s.id, coalesce((storetopics.default_settings() || s.settings) ->> 'catalog', 'source:' || s.id) AS catalog
    FROM storetopics.sources s CROSS JOIN me
   WHERE pg_has_role(me.r, s.owner, 'USAGE')
      OR EXISTS (SELECT 1 FROM storetopics.grants g
                  WHERE (g.source_id IS NULL OR g.source_id = s.id) AND pg_has_role(me.r, g.role, 'USAGE'))
), v AS (
  SELECT src.catalog, st.source_id, st.store_key,
         -- (the letters spelled out, so that only ASCII ones pass, whatever the collation)
         left('search_' || regexp_replace(lower(st.store_key), '[^abcdefghijklmnopqrstuvwxyz0123456789_-]', '_', 'g'),
              64) AS base
    FROM src JOIN storetopics.store_state st ON st.source_id = src.id
   WHERE st.store_topics IS NOT NULL AND (p_catalog IS NULL OR src.catalog = p_catalog)
), n AS (
  SELECT v.*, count(*) OVER (PARTITION BY v.base) AS same,
         count(*) OVER (PARTITION BY v.base, v.source_id) AS same_source
    FROM v
), named AS (
  SELECT n.*,
         CASE WHEN n.same = 1 THEN n.base
              WHEN n.same_source = 1 THEN left(n.base, 63 - length(n.source_id::text)) || '_' || n.source_id
              ELSE left(n.base, 54 - length(n.source_id::text)) || '_' || n.source_id || '_' || left(md5(n.store_key), 8)
         END AS name1
    FROM n
)
-- a name made with '_<source id>' can be another store's plain name (keys 'docs' twice and 'docs_2'): those that
-- still collide take the long form
SELECT x.catalog, x.source_id, x.store_key,
       CASE WHEN count(*) OVER (PARTITION BY x.name1) = 1 THEN x.name1
            ELSE left(x.base, 54 - length(x.source_id::text)) || '_' || x.source_id || '_' || left(md5(x.store_key), 8)
       END
  FROM named x;
END;

-- One row per store the caller may read that has a summary, for a router to offer as a tool: its catalog, source,
-- store key, a tool name (see _readable_stores), the summary (store_topics, ready for a prompt), its cl100k tokens
-- as render counted them (the sum over its space-separated chunks, storetopics.token_counts; NULL while some chunk
-- has not been counted with the real tokenizer yet), when it last changed, and md5 of the text (changes only when
-- the text does: a prompt cache key).
CREATE OR REPLACE FUNCTION storetopics.catalog(p_catalog text DEFAULT NULL)
RETURNS TABLE (catalog text, source regclass, source_id int, store_key text, tool_name text, description text,
               tokens int, updated_at timestamptz, content_hash text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
SELECT r.catalog, s.chunks, r.source_id, r.store_key, r.tool_name, st.store_topics,
       CASE WHEN cardinality(storetopics._uncounted(st.store_topics)) = 0 THEN storetopics._tokens(st.store_topics) END,
       st.updated_at, md5(st.store_topics)
  FROM storetopics._readable_stores(p_catalog) r
  JOIN storetopics.sources s ON s.id = r.source_id
  JOIN storetopics.store_state st ON st.source_id = r.source_id AND st.store_key = r.store_key
 ORDER BY r.catalog, r.tool_name;
END;
COMMENT ON FUNCTION storetopics.catalog(text) IS
  'One row per store the caller may read (of one catalog, or all): a unique tool name (search_<store key>), the '
  'summary as a tool description, its cl100k tokens when counted, when it changed, and md5 of the text.';


-- ------------------------------------------------------------------------------------------------------------
-- route(): the stores whose clusters hold a query embedding, or none
-- ------------------------------------------------------------------------------------------------------------
-- One pass over the centroids of the caller's stores (those catalog() lists, of the catalog asked for; clusters
-- with chunks, in the query's dimension: others are ignored).  A store's score is how likely the query is under its
-- clusters as a mixture of von Mises-Fisher components, the clusters' shares as weights, one concentration kappa:
--     score = ln( sum_c share_c * exp(kappa * cos(q, centroid_c)) ) / kappa
-- a soft maximum of the cosine similarities (never above the best one; a query near several large clusters of a
-- store scores above one near a single small cluster).  kappa = 20, and this form, were chosen on the tuning half of
-- the routing evaluation (lab/evaluation, bench/README.md): against the best cluster's cosine alone, the cosine with
-- a share prior, and scores relative to the cluster's radius (1 - d / radius, radius - d, with and without the
-- share), it had the best top-1 and abstention F1 there; every radius-relative score was 10-15 points worse in top-1
-- (a radius is the 95th percentile of the member chunks' distances, and a store's radii differ more than its
-- queries' distances do).  cluster_id is the cluster that weighs most in the sum (ties: the lower id), distance its
-- cosine distance, within_radius whether the query lies inside its radius; label its label as the summary shows it.
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
BEGIN
  IF query_embedding IS NULL THEN
    RAISE EXCEPTION 'storetopics: route() needs a query embedding, not NULL' USING ERRCODE = 'null_value_not_allowed';
  END IF;
  IF k IS NULL OR k < 1 THEN
    RAISE EXCEPTION 'storetopics: route() returns k >= 1 stores, not %', coalesce(k::text, 'NULL')
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  EXECUTE format('SELECT %1$I.vector_norm($1), %1$I.vector_dims($1)', vs) INTO v_norm, v_dims USING query_embedding;
  IF v_norm = 0 OR v_norm = 'NaN'::float8 THEN
    RAISE EXCEPTION 'storetopics: route() cannot route a zero vector (it has no direction)'
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  RETURN QUERY EXECUTE format($q$
    WITH vis AS MATERIALIZED (
      SELECT r.source_id, r.store_key, r.tool_name FROM storetopics._readable_stores($3) r
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
               WHERE k.source_id = ANY (ARRAY(SELECT DISTINCT v.source_id FROM vis v)) AND k.chunks > 0
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
           t.score >= ((storetopics.default_settings() || s.settings) ->> 'route_threshold')::float8
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
      JOIN storetopics.sources s ON s.id = t.source_id
      JOIN storetopics.store_state st ON st.source_id = t.source_id AND st.store_key = t.store_key
     ORDER BY t.score DESC, t.source_id, t.store_key$q$, vs)
    USING query_embedding, k, p_catalog, v_dims, v_norm;
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
-- background, to its probability in the background (every listed store of the same ts_config together, so nothing
-- of the stores the caller may not read enters the score):
--     score = sum_t n_t ln( (tf_st / words_s / 2 + p_t / 2) / p_t ) / sum_t n_t
-- the query likelihood's log ratio per query word (Jelinek-Mercer smoothing, lambda 1/2): above 0 when the store
-- holds the query's words more than the others do, ln(1/2) for each it lacks; a lexeme no listed store holds counts
-- in the denominator only (a query of words no store has, or of no words, scores 0 everywhere).  This smoothing and
-- lambda were chosen on the tuning half of the routing evaluation, against Dirichlet smoothing (mu 100 to 10,000)
-- and lambda 0.8 and 0.95: within a point or two in top-1, the best abstention F1 carried to the other half, and
-- free of the stores' sizes.  One index probe per listed store and query lexeme.  label: the query's word that
-- weighs most for the store, as people write it (NULL when none weighs for it); cluster_id, distance and
-- within_radius are NULL.  search: the score reaches the source's route_text_threshold.
CREATE OR REPLACE FUNCTION storetopics.route_text(query text, k int DEFAULT 3, p_catalog text DEFAULT NULL)
RETURNS TABLE (source_id int, store_key text, tool_name text, score float8, cluster_id int, label text,
               distance float8, within_radius boolean, search boolean)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET jit = off AS $$
BEGIN
  IF query IS NULL THEN
    RAISE EXCEPTION 'storetopics: route_text() needs a query, not NULL' USING ERRCODE = 'null_value_not_allowed';
  END IF;
  IF k IS NULL OR k < 1 THEN
    RAISE EXCEPTION 'storetopics: route_text() returns k >= 1 stores, not %', coalesce(k::text, 'NULL')
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  RETURN QUERY
  WITH vis AS MATERIALIZED (
    SELECT r.source_id, r.store_key, r.tool_name, s.ts_config, greatest(st.words, 1)::float8 AS words
      FROM storetopics._readable_stores(p_catalog) r
      JOIN storetopics.sources s ON s.id = r.source_id
      JOIN storetopics.store_state st ON st.source_id = r.source_id AND st.store_key = r.store_key
  ), ql AS MATERIALIZED (
    -- the query's lexemes per text search configuration, with their counts (tsvector_or_null: NULL for text fold
    -- would not count either)
    SELECT c.cfg, l.lexeme, coalesce(cardinality(l.positions), 1)::float8 AS n
      FROM (SELECT DISTINCT v.ts_config AS cfg FROM vis v) c
     CROSS JOIN LATERAL unnest(storetopics.tsvector_or_null(c.cfg, query)) AS l
  ), qn AS (
    SELECT ql.cfg, sum(ql.n) AS n FROM ql GROUP BY ql.cfg
  ), hits AS MATERIALIZED (
    -- per listed store and known query lexeme: its count there (an index probe per pair)
    SELECT v.source_id, v.store_key, ql.cfg, ql.lexeme, ql.n, t.total::float8 AS tf
      FROM vis v
      JOIN ql ON ql.cfg = v.ts_config
      JOIN storetopics.lexemes x ON x.lexeme = ql.lexeme
      JOIN storetopics.store_terms t ON t.source_id = v.source_id AND t.store_key = v.store_key AND t.term_id = x.id
  ), bg AS (
    SELECT h.cfg, h.lexeme, h.n,
           sum(h.tf) / (SELECT sum(v.words) FROM vis v WHERE v.ts_config = h.cfg) AS p
      FROM hits h GROUP BY h.cfg, h.lexeme, h.n
  ), scored AS (
    -- every listed store, for every lexeme some listed store holds (a store without it: its smoothed share)
    SELECT v.source_id, v.store_key, b.lexeme,
           b.n * ln((0.5 * coalesce(h.tf, 0) / v.words + 0.5 * b.p) / b.p) AS part
      FROM vis v
      JOIN bg b ON b.cfg = v.ts_config
      LEFT JOIN hits h ON h.source_id = v.source_id AND h.store_key = v.store_key AND h.lexeme = b.lexeme
     WHERE b.p > 0
  ), per_store AS (
    -- (a query none of whose words a listed store holds, or of no words at all: 0 for every store)
    SELECT v.source_id, v.store_key, v.tool_name,
           coalesce(sum(s.part), 0) / greatest(min(qn.n), 1) AS score,
           (array_agg(s.lexeme ORDER BY s.part DESC, s.lexeme) FILTER (WHERE s.part > 0))[1] AS best
      FROM vis v
      LEFT JOIN qn ON qn.cfg = v.ts_config
      LEFT JOIN scored s ON s.source_id = v.source_id AND s.store_key = v.store_key
     GROUP BY v.source_id, v.store_key, v.tool_name
  )
  SELECT p.source_id, p.store_key, p.tool_name, p.score, NULL::int,
         storetopics._show(s.ts_config, p.best),
         NULL::float8, NULL::boolean,
         p.score >= ((storetopics.default_settings() || s.settings) ->> 'route_text_threshold')::float8
    FROM per_store p JOIN storetopics.sources s ON s.id = p.source_id
   ORDER BY p.score DESC, p.source_id, p.store_key
   LIMIT k;
END $$;
COMMENT ON FUNCTION storetopics.route_text(text, int, text) IS
  'Where to search for a query text, from the stores'' term counts (stores without embeddings): the k stores (of '
  'those the caller may read) whose words the query''s are most, with its weightiest word; search = false on '
  'every row: no store holds it (route_text_threshold).';
