-- ------------------------------------------------------------------------------------------------------------
-- File novelty: the outlier files of a store, exact, in time proportional to what changed
-- ------------------------------------------------------------------------------------------------------------
-- A file's novelty is the mean IDF of its counted words: ln(N) - sum(n ln df) / sum(n), N the store's files, df
-- the files holding a term.  keywords() shows the terms of up to 3 files whose novelty has a robust z-score (median,
-- MAD over all the store's files) of at least 3.5, or 2.5 when the clustering also finds the file apart.
--
-- Computed from scratch, that reads every (file, term) pair of the store at every render.  Here it is kept: each
-- file's sum(n ln df) as it was (storetopics.file_novelty), the files of the rare terms (novelty_postings).  After
-- some file events, a kept file's sum moves (a) exactly, by the rare terms whose df moved (their postings say which
-- files hold them), and (b) by at most D per counted word for the other terms (df above `rare` then, each df moved
-- by at most k: D = -ln(1 - k / (rare + 1))).  So each file's novelty is known within bounds; the median, the MAD
-- and each file's test are decided from the bounds where they suffice, and from the files computed again exactly
-- where they do not (order statistics: only the files whose bounds straddle them).  The result is what a
-- computation from scratch gives, bit for bit: sums are integers (each ln rounded to 1e-9 first), so they do not
-- depend on which files are summed together or in what order, and every step the bounds decide is one whose
-- outcome they prove (tests/test_novelty.py).  The kept state is computed again when k grows (D > 0.003), when a
-- re-fit changed what is apart, or when anything about it does not add up.

-- ln(df) in units of 1e-9, rounded: integer sums are exact in any order.
CREATE OR REPLACE FUNCTION storetopics._ln9(df bigint) RETURNS bigint
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE SET search_path = pg_catalog, pg_temp
RETURN round(ln(greatest(df, 1)::float8) * 1e9)::bigint;

-- A file's novelty from its sums (ln_n: ln of the store's files), rounded: equal sums tie exactly.  Monotone in
-- total, so bounds on the sum are bounds on the novelty.
CREATE OR REPLACE FUNCTION storetopics._novelty(ln_n float8, total bigint, words bigint) RETURNS float8
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE SET search_path = pg_catalog, pg_temp
RETURN round((ln_n - total::float8 / 1e9 / words)::numeric, 9)::float8;

-- The sums of some counted files of a store (NULL: all of them) at the current document frequencies, and whether
-- the clustering finds each apart.  (The pairs are unnested in the select list, which streams them.)
CREATE OR REPLACE FUNCTION storetopics._novelty_sums(p_source int, p_store text, p_files text[])
RETURNS TABLE (file_key text, total bigint, words bigint, apart boolean)
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp SET enable_mergejoin = off AS $$
BEGIN
  RETURN QUERY
  SELECT u.file_key, sum(u.n::bigint * storetopics._ln9(t.files))::bigint, sum(u.n)::bigint, bool_or(u.apart)
    FROM (SELECT f.file_key, unnest(f.term_ids) AS term_id, unnest(f.counts) AS n,
                 cardinality(f.cluster_chunks) > 0 AND (SELECT sum(o) FROM unnest(f.cluster_outliers) o)
                   = (SELECT sum(c) FROM unnest(f.cluster_chunks) c) AS apart
            FROM storetopics.file_terms f
           WHERE f.source_id = p_source AND f.store_key = p_store AND f.words > 0
             AND (p_files IS NULL OR (md5(f.file_key)::uuid = ANY (ARRAY(SELECT md5(x)::uuid FROM unnest(p_files) x))
                                      AND f.file_key = ANY (p_files)))) u
    JOIN storetopics.store_terms t ON t.source_id = p_source AND t.store_key = p_store AND t.term_id = u.term_id
   GROUP BY u.file_key;
END $$;

-- Forget what render kept of a source's (or one store's) novelty.
CREATE OR REPLACE FUNCTION storetopics._forget_novelty(p_source int, p_store text DEFAULT NULL) RETURNS void
LANGUAGE sql SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
  DELETE FROM storetopics.novelty_state WHERE source_id = p_source AND (p_store IS NULL OR store_key = p_store);
  DELETE FROM storetopics.file_novelty WHERE source_id = p_source AND (p_store IS NULL OR store_key = p_store);
  DELETE FROM storetopics.novelty_postings WHERE source_id = p_source AND (p_store IS NULL OR store_key = p_store);
END;

-- Keep a store's novelty: every file's sums now (p_sums: a temp table of storetopics._novelty_sums for all of them),
-- numbered, and the postings of the terms in at most `rare` files.
CREATE OR REPLACE FUNCTION storetopics._keep_novelty(p_source int, p_store text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp SET enable_mergejoin = off AS $$
DECLARE
  st storetopics.store_state;
  v_rare int;
BEGIN
  SELECT * INTO st FROM storetopics.store_state WHERE source_id = p_source AND store_key = p_store;
  v_rare := greatest(100, st.files / 10)::int;
  PERFORM storetopics._forget_novelty(p_source, p_store);
  INSERT INTO storetopics.file_novelty (source_id, store_key, file_key, n, total, words, apart)
  SELECT p_source, p_store, f.file_key, row_number() OVER (ORDER BY f.file_key), coalesce(s.total, 0),
         coalesce(s.words, 0), coalesce(s.apart, false)
    FROM storetopics.file_terms f LEFT JOIN pg_temp.storetopics_novelty_sums s ON s.file_key = f.file_key
   WHERE f.source_id = p_source AND f.store_key = p_store;
  INSERT INTO storetopics.novelty_postings (source_id, store_key, term_id, files, file_ns, counts)
  SELECT p_source, p_store, u.term_id, min(t.files), array_agg(fn.n ORDER BY fn.n), array_agg(u.n ORDER BY fn.n)
    FROM (SELECT f.file_key, unnest(f.term_ids) AS term_id, unnest(f.counts) AS n FROM storetopics.file_terms f
           WHERE f.source_id = p_source AND f.store_key = p_store AND f.words > 0) u
    JOIN storetopics.store_terms t ON t.source_id = p_source AND t.store_key = p_store AND t.term_id = u.term_id
    JOIN storetopics.file_novelty fn ON fn.source_id = p_source AND fn.store_key = p_store AND fn.file_key = u.file_key
   WHERE t.files <= v_rare
   GROUP BY u.term_id;
  INSERT INTO storetopics.novelty_state (source_id, store_key, fit_generation, files, rare)
  VALUES (p_source, p_store, st.fit_generation, st.files, v_rare);
END $$;

-- Make the rows of pg_temp.storetopics_nov that match a condition exact (computed again from their pairs).
CREATE OR REPLACE FUNCTION storetopics._novelty_exact(p_source int, p_store text, p_ln float8, p_where text)
RETURNS int
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_keys text[];
BEGIN
  EXECUTE format('SELECT array_agg(v.file_key) FROM pg_temp.storetopics_nov v WHERE NOT v.exact AND (%s)', p_where)
    INTO v_keys;
  IF v_keys IS NULL THEN
    RETURN 0;
  END IF;
  UPDATE pg_temp.storetopics_nov v
     SET lo = storetopics._novelty(p_ln, s.total, s.words), hi = storetopics._novelty(p_ln, s.total, s.words),
         exact = true, apart = s.apart
    FROM storetopics._novelty_sums(p_source, p_store, v_keys) s
   WHERE v.file_key = s.file_key;
  RETURN cardinality(v_keys);
END $$;

-- The r1-th and r2-th smallest (1-based) exact values of an expression of the rows of pg_temp.storetopics_nov,
-- given each row's bounds on it (lo_expr <= value <= hi_expr): the rows whose bounds straddle them are made exact.
CREATE OR REPLACE FUNCTION storetopics._novelty_ranks(p_source int, p_store text, p_ln float8, lo_expr text,
                                                      hi_expr text, r1 bigint, r2 bigint, OUT x1 float8,
                                                      OUT x2 float8)
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_l float8;
  v_h float8;
  v_below bigint;
BEGIN
  EXECUTE format('SELECT (SELECT %1$s FROM pg_temp.storetopics_nov v ORDER BY 1 OFFSET $1 - 1 LIMIT 1), '
                 '(SELECT %2$s FROM pg_temp.storetopics_nov v ORDER BY 1 OFFSET $2 - 1 LIMIT 1)', lo_expr, hi_expr)
    INTO v_l, v_h USING r1, r2;
  PERFORM storetopics._novelty_exact(p_source, p_store, p_ln,
                                     format('%s >= %L::float8 AND %s <= %L::float8', hi_expr, v_l, lo_expr, v_h));
  EXECUTE format('SELECT count(*) FROM pg_temp.storetopics_nov v WHERE %s < %L::float8', hi_expr, v_l) INTO v_below;
  EXECUTE format('SELECT (SELECT %1$s FROM pg_temp.storetopics_nov v WHERE %2$s >= %3$L::float8 AND %1$s <= %4$L::float8 '
                 '        ORDER BY 1 OFFSET $1 - 1 LIMIT 1), '
                 '       (SELECT %1$s FROM pg_temp.storetopics_nov v WHERE %2$s >= %3$L::float8 AND %1$s <= %4$L::float8 '
                 '        ORDER BY 1 OFFSET $2 - 1 LIMIT 1)', lo_expr, hi_expr, v_l, v_h)
    INTO x1, x2 USING r1 - v_below, r2 - v_below;
END $$;

-- The outlier files of a store whose terms keywords() shows, best first: rank, file, novelty.  Keeps the store's
-- novelty (storetopics._keep_novelty) when what was kept cannot serve.  Exact: the same state gives the same files
-- whether they were found from the kept state or from scratch.
CREATE OR REPLACE FUNCTION storetopics._outlier_files(p_source int, p_store text)
RETURNS TABLE (rank int, file_key text, novelty float8)
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp SET enable_mergejoin = off SET jit = off AS $$
DECLARE
  st storetopics.store_state;
  k storetopics.novelty_state;
  v_ln float8;
  v_rows bigint;
  v_changed bigint;
  v_events bigint;
  v_d float8 := 0;     -- the bound on how far a kept file's sum moved per counted word, in ln units
  v_m bigint;          -- counted files
  v_pos float8;
  v_x1 float8;
  v_x2 float8;
  v_med float8;
  v_mad float8;
  v_dev_lo text;
  v_dev_hi text;
  v_z text := '(%s - %L::float8) / (1.4826 * %L::float8 + 1e-9) >= CASE WHEN v.apart THEN 2.5 ELSE 3.5 END';
BEGIN
  SELECT * INTO st FROM storetopics.store_state s WHERE s.source_id = p_source AND s.store_key = p_store;
  IF NOT FOUND THEN
    RETURN;
  END IF;
  v_ln := ln(greatest(st.files, 1)::float8);
  SELECT * INTO k FROM storetopics.novelty_state s WHERE s.source_id = p_source AND s.store_key = p_store;
  IF FOUND THEN
    SELECT count(*), count(*) FILTER (WHERE f.n IS NULL) INTO v_rows, v_changed
      FROM storetopics.file_novelty f WHERE f.source_id = p_source AND f.store_key = p_store;
    v_events := v_changed + (k.files - (v_rows - v_changed));   -- files folded since, a changed one twice
    IF v_events < k.rare THEN
      v_d := -ln(1 - v_events::float8 / (k.rare + 1));
    END IF;
  END IF;
  IF to_regclass('pg_temp.storetopics_nov') IS NOT NULL THEN DROP TABLE pg_temp.storetopics_nov; END IF;
  CREATE TEMP TABLE storetopics_nov (file_key text, lo float8, hi float8, exact boolean, apart boolean);
  IF k.source_id IS NULL OR k.fit_generation <> st.fit_generation OR v_rows <> st.files OR v_events >= k.rare
     OR v_d > 0.003 OR v_changed > greatest(100, st.files / 100) THEN
    -- from scratch, and kept for the next renders
    IF to_regclass('pg_temp.storetopics_novelty_sums') IS NOT NULL THEN
      DROP TABLE pg_temp.storetopics_novelty_sums;
    END IF;
    CREATE TEMP TABLE storetopics_novelty_sums AS SELECT * FROM storetopics._novelty_sums(p_source, p_store, NULL);
    PERFORM storetopics._keep_novelty(p_source, p_store);
    INSERT INTO pg_temp.storetopics_nov
    SELECT s.file_key, storetopics._novelty(v_ln, s.total, s.words), storetopics._novelty(v_ln, s.total, s.words),
           true, s.apart
      FROM pg_temp.storetopics_novelty_sums s;
    DROP TABLE pg_temp.storetopics_novelty_sums;
  ELSE
    -- kept files: their sums moved exactly by their rare terms, and by at most v_d per word for the others
    INSERT INTO pg_temp.storetopics_nov
    SELECT f.file_key, storetopics._novelty(v_ln, f.total + coalesce(d.delta, 0) + b.slack, f.words),
           storetopics._novelty(v_ln, f.total + coalesce(d.delta, 0) - b.slack, f.words), v_d = 0, f.apart
      FROM storetopics.file_novelty f
      LEFT JOIN (SELECT u.fn, sum(u.c::bigint * (storetopics._ln9(m.now) - storetopics._ln9(m.files)))::bigint AS delta
                   FROM (SELECT p.file_ns, p.counts, p.files, coalesce(t.files, 0) AS now
                           FROM storetopics.novelty_postings p
                           LEFT JOIN storetopics.store_terms t
                                  ON t.source_id = p.source_id AND t.store_key = p.store_key AND t.term_id = p.term_id
                          WHERE p.source_id = p_source AND p.store_key = p_store
                            AND p.files IS DISTINCT FROM t.files) m,
                        unnest(m.file_ns, m.counts) AS u(fn, c)
                  GROUP BY u.fn) d ON d.fn = f.n,
           LATERAL (SELECT CASE WHEN v_d = 0 THEN 0 ELSE ceil(f.words * (v_d * 1e9 + 1))::bigint + 1 END AS slack) b
     WHERE f.source_id = p_source AND f.store_key = p_store AND f.n IS NOT NULL AND f.words > 0;
    -- files folded since: exact
    INSERT INTO pg_temp.storetopics_nov
    SELECT s.file_key, storetopics._novelty(v_ln, s.total, s.words), storetopics._novelty(v_ln, s.total, s.words),
           true, s.apart
      FROM storetopics._novelty_sums(p_source, p_store,
                                     ARRAY(SELECT f.file_key FROM storetopics.file_novelty f
                                            WHERE f.source_id = p_source AND f.store_key = p_store AND f.n IS NULL)) s;
  END IF;
  -- the median and the MAD as percentile_cont computes them: its two middle values, interpolated by itself
  v_m := (SELECT count(*) FROM pg_temp.storetopics_nov);
  IF v_m = 0 THEN
    DROP TABLE pg_temp.storetopics_nov;
    RETURN;
  END IF;
  v_pos := 0.5 * (v_m - 1);
  SELECT * INTO v_x1, v_x2 FROM storetopics._novelty_ranks(p_source, p_store, v_ln, 'v.lo', 'v.hi',
                                                            floor(v_pos)::bigint + 1, ceil(v_pos)::bigint + 1);
  v_med := (SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY x) FROM unnest(ARRAY[v_x1, v_x2]) x);
  v_dev_lo := format('CASE WHEN v.lo > %1$L::float8 THEN v.lo - %1$L::float8 WHEN v.hi < %1$L::float8 '
                     'THEN %1$L::float8 - v.hi ELSE 0 END', v_med);
  v_dev_hi := format('greatest(abs(v.lo - %1$L::float8), abs(v.hi - %1$L::float8))', v_med);
  SELECT * INTO v_x1, v_x2 FROM storetopics._novelty_ranks(p_source, p_store, v_ln, v_dev_lo, v_dev_hi,
                                                            floor(v_pos)::bigint + 1, ceil(v_pos)::bigint + 1);
  v_mad := (SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY x) FROM unnest(ARRAY[v_x1, v_x2]) x);
  -- the files that may pass the test and rank among the first 3: made exact, then tested
  EXECUTE format(
    'WITH sure AS (SELECT v.apart, v.lo FROM pg_temp.storetopics_nov v WHERE %1$s '
    '              ORDER BY v.apart DESC, v.lo DESC LIMIT 1 OFFSET 2) '
    'DELETE FROM pg_temp.storetopics_nov v WHERE NOT (%2$s) '
    '   OR EXISTS (SELECT 1 FROM sure s WHERE (s.apart AND NOT v.apart) OR (s.apart = v.apart AND v.hi < s.lo))',
    format(v_z, 'v.lo', v_med, v_mad), format(v_z, 'v.hi', v_med, v_mad));
  PERFORM storetopics._novelty_exact(p_source, p_store, v_ln, 'true');
  RETURN QUERY
    SELECT (row_number() OVER (ORDER BY o.apart DESC, o.lo DESC, o.file_key))::int, o.file_key, o.lo
      FROM (SELECT v.* FROM pg_temp.storetopics_nov v
             WHERE (v.lo - v_med) / (1.4826 * v_mad + 1e-9) >= CASE WHEN v.apart THEN 2.5 ELSE 3.5 END
             ORDER BY v.apart DESC, v.lo DESC, v.file_key LIMIT 3) o
     ORDER BY 1;
  DROP TABLE pg_temp.storetopics_nov;
END $$;
