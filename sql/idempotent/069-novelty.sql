-- ------------------------------------------------------------------------------------------------------------
-- File novelty: the outlier files of a store, exact, in time proportional to what changed
-- ------------------------------------------------------------------------------------------------------------
-- A file's novelty is the mean IDF of its counted words: ln(N) - sum(n ln df) / sum(n), N the store's files, df
-- the files holding a term.  keywords() shows the terms of up to 3 files whose novelty has a robust z-score (median,
-- MAD over all the store's files) of at least 3.5, or 2.5 when the clustering also finds the file apart.
--
-- Computed from scratch, that reads every (file, term) pair of the store at every render.  Here it is kept: each
-- file's sum(n ln df) as it was (storetopics.file_novelty), the document frequencies then (novelty_state.dfs), and
-- the files of the rare terms (novelty_postings).  After some file events, a kept file's sum has moved (a) exactly
-- by its rare terms whose df moved (their postings say which files hold them, with what counts), and (b) through its
-- other terms by at most the largest move of their ln df per counted word, and by at most its sensitivity (the sum
-- of count / df over them, kept) times the largest (df gained or lost) x df then / the smaller df of any of them.  So
-- each file's novelty is known within bounds; the median, the MAD and each file's test are decided from the bounds
-- where they suffice, and from the files computed again exactly where they do not (order statistics: only the files
-- whose bounds straddle them).  Files folded since are computed again.  The result is what a computation from
-- scratch gives, bit for bit: sums are integers (each ln df rounded to 1e-9 first), so they do not depend on which
-- files are summed together or in what order, and every step the bounds decide is one whose outcome they prove
-- (tests/test_novelty.py).  The kept state is computed again when many files changed or the bounds leave a tenth of
-- the files to compute exactly, and forgotten when the clusters' assignment changes (what is apart), when the source
-- is recounted, or when anything about it does not add up.

-- ln(df) in units of 1e-9, rounded: integer sums are exact in any order.  (SQL-standard bodies without SET or
-- STRICT: the planner inlines them, they run per row.)
CREATE OR REPLACE FUNCTION storetopics._ln9(df bigint) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN round(ln(greatest(df, 1)::float8) * 1e9)::bigint;

-- A file's novelty from its sums (ln_n: ln of the store's files), rounded: equal sums tie exactly.  Monotone in
-- total, so bounds on the sum are bounds on the novelty.
CREATE OR REPLACE FUNCTION storetopics._novelty(ln_n float8, total bigint, words bigint) RETURNS float8
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN round((ln_n - total::float8 / 1e9 / words)::numeric, 9)::float8;

-- For a value x known to lie in [lo, hi]: a lower (upper: false) or upper bound of x itself (about NULL), or of
-- its distance to `about`.  Exact (lo = hi) in, exact out: both bounds are then x, or |x - about|.
CREATE OR REPLACE FUNCTION storetopics._novelty_bound(lo float8, hi float8, about float8, upper boolean)
RETURNS float8
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE WHEN about IS NULL THEN CASE WHEN upper THEN hi ELSE lo END
            WHEN upper THEN greatest(hi - about, about - lo)
            WHEN lo > about THEN lo - about WHEN hi < about THEN about - hi ELSE 0 END;

-- Whether a novelty passes the outlier test (robust z-score against the store's median and MAD).  Monotone in x.
CREATE OR REPLACE FUNCTION storetopics._novel(x float8, apart boolean, med float8, mad float8) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN (x - med) / (1.4826 * mad + 1e-9) >= CASE WHEN apart THEN 2.5 ELSE 3.5 END;

-- The document frequency of each term of a store (p_files: only the terms of these files), by term id: an array
-- that the sums below index, 0 for a term the store does not hold.
CREATE OR REPLACE FUNCTION storetopics._store_dfs(p_source int, p_store text, p_files text[]) RETURNS int[]
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_dfs int[];
  r record;
BEGIN
  -- (filled in place, from the highest id down: an expanded array, each assignment in constant time)
  FOR r IN SELECT t.term_id, t.files FROM storetopics.store_terms t
            WHERE t.source_id = p_source AND t.store_key = p_store AND p_files IS NULL
           UNION ALL   -- (the files' terms, each found by the index)
           SELECT t.term_id, t.files
             FROM (SELECT DISTINCT unnest(f.term_ids) AS term_id FROM storetopics.file_terms f
                    WHERE f.source_id = p_source
                      AND md5(f.file_key)::uuid = ANY (ARRAY(SELECT md5(x)::uuid FROM unnest(p_files) x))
                      AND f.file_key = ANY (p_files) AND f.store_key = p_store) x
             JOIN storetopics.store_terms t
               ON t.source_id = p_source AND t.store_key = p_store AND t.term_id = x.term_id
            WHERE p_files IS NOT NULL
           ORDER BY 1 DESC
  LOOP
    IF v_dfs IS NULL THEN
      v_dfs := array_fill(0, ARRAY[r.term_id]);
    END IF;
    v_dfs[r.term_id] := r.files;
  END LOOP;
  RETURN coalesce(v_dfs, '{}');
END $$;

-- Whether the clustering finds a file apart: every one of its chunks lies beyond its nearest cluster's radius.
CREATE OR REPLACE FUNCTION storetopics._file_apart(chunks int[], outliers int[]) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN cardinality(chunks) > 0
       AND (SELECT sum(o) FROM unnest(outliers) o) = (SELECT sum(c) FROM unnest(chunks) c);

-- The sums of some files of a store at the current document frequencies, and whether each is apart.
CREATE OR REPLACE FUNCTION storetopics._novelty_sums(p_source int, p_store text, p_files text[])
RETURNS TABLE (file_key text, total bigint, words bigint, apart boolean)
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp SET jit = off AS $$
DECLARE
  v_dfs int[];
BEGIN
  IF cardinality(p_files) = 0 THEN
    RETURN;
  END IF;
  v_dfs := storetopics._store_dfs(p_source, p_store, p_files);
  RETURN QUERY
  SELECT f.file_key,
         coalesce((SELECT sum(u.c::bigint * storetopics._ln9(v_dfs[u.t]))
                     FROM (SELECT unnest(f.term_ids) AS t, unnest(f.counts) AS c) u), 0)::bigint,
         f.words, storetopics._file_apart(f.cluster_chunks, f.cluster_outliers)
    FROM storetopics.file_terms f
   WHERE f.source_id = p_source AND f.store_key = p_store
     AND md5(f.file_key)::uuid = ANY (ARRAY(SELECT md5(x)::uuid FROM unnest(p_files) x)) AND f.file_key = ANY (p_files);
END $$;

-- How far the sums of some files of a store moved through their terms whose ln(files) moved (p_moves, by term id,
-- in units of 1e-9): a kept file's sum (storetopics.file_novelty) plus this is its sum now.  Exact: integers.
CREATE OR REPLACE FUNCTION storetopics._novelty_moved(p_source int, p_store text, p_files text[], p_moves bigint[])
RETURNS TABLE (file_key text, moved bigint)
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
  SELECT f.file_key,
         coalesce((SELECT sum(u.c::bigint * p_moves[u.t])
                     FROM (SELECT unnest(f.term_ids) AS t, unnest(f.counts) AS c) u), 0)::bigint
    FROM storetopics.file_terms f
   WHERE f.source_id = p_source AND f.store_key = p_store
     AND md5(f.file_key)::uuid = ANY (ARRAY(SELECT md5(x)::uuid FROM unnest(p_files) x)) AND f.file_key = ANY (p_files);
END;

-- Forget what render kept of a source's (or one store's) novelty.
CREATE OR REPLACE FUNCTION storetopics._forget_novelty(p_source int, p_store text DEFAULT NULL) RETURNS void
LANGUAGE sql SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
  DELETE FROM storetopics.novelty_state WHERE source_id = p_source AND (p_store IS NULL OR store_key = p_store);
  DELETE FROM storetopics.file_novelty WHERE source_id = p_source AND (p_store IS NULL OR store_key = p_store);
  DELETE FROM storetopics.novelty_postings WHERE source_id = p_source AND (p_store IS NULL OR store_key = p_store);
END;

-- Keep a store's novelty: every file's sums now, numbered, the document frequencies they are of, each file's
-- sensitivity to the terms in more than `rare` files, and the postings of the others.  One pass over the store's
-- (file, term) pairs: each term's ln and 1 / files looked up by position in arrays indexed by term id (hashing the
-- pairs and grouping them by file again costs about twice as much), each file's rare terms packed with their counts
-- into one array (an aggregate per pair less).  (A file's arrays are unnested in the select list, in step, which
-- streams its pairs; unnest(a, b) in FROM copies them into a tuplestore first.)
CREATE OR REPLACE FUNCTION storetopics._keep_novelty(p_source int, p_store text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp SET jit = off SET work_mem = '256MB' AS $$
DECLARE
  v_rare int := 50;
  v_dfs int[] := storetopics._store_dfs(p_source, p_store, NULL);
  v_ln9 bigint[];
  v_inv float8[];    -- 1 / files, 0 for a rare term
BEGIN
  SELECT array_agg(storetopics._ln9(x.d) ORDER BY x.i), array_agg(CASE WHEN x.d > v_rare THEN 1 / x.d::float8 ELSE 0 END
                                                              ORDER BY x.i)
    INTO v_ln9, v_inv
    FROM unnest(v_dfs) WITH ORDINALITY AS x(d, i);
  PERFORM storetopics._forget_novelty(p_source, p_store);
  IF to_regclass('pg_temp.storetopics_keep') IS NOT NULL THEN DROP TABLE pg_temp.storetopics_keep; END IF;
  CREATE TEMP TABLE storetopics_keep ON COMMIT DROP AS
  SELECT (row_number() OVER ())::int AS n, f.file_key, coalesce(s.total, 0)::bigint AS total, f.words,
         storetopics._file_apart(f.cluster_chunks, f.cluster_outliers) AS apart,
         coalesce(s.sensitivity, 0) AS sensitivity, s.rare
    FROM storetopics.file_terms f,
         LATERAL (SELECT sum(u.c::bigint * v_ln9[u.t]) AS total, sum(u.c * v_inv[u.t]) AS sensitivity,
                         array_agg(u.t::bigint << 32 | u.c) FILTER (WHERE v_inv[u.t] = 0) AS rare
                    FROM (SELECT unnest(f.term_ids) AS t, unnest(f.counts) AS c) u) s
   WHERE f.source_id = p_source AND f.store_key = p_store;
  INSERT INTO storetopics.file_novelty (source_id, store_key, file_key, n, total, words, apart, sensitivity)
  SELECT p_source, p_store, k.file_key, k.n, k.total, k.words, k.apart, k.sensitivity
    FROM pg_temp.storetopics_keep k;
  -- (unnested in the select list, which streams the pairs)
  INSERT INTO storetopics.novelty_postings (source_id, store_key, term_id, file_ns, counts)
  SELECT p_source, p_store, (u.x >> 32)::int, array_agg(u.n), array_agg((u.x & 4294967295)::int)
    FROM (SELECT k.n, unnest(k.rare) AS x FROM pg_temp.storetopics_keep k) u
   GROUP BY u.x >> 32;
  INSERT INTO storetopics.novelty_state (source_id, store_key, rare, dfs) VALUES (p_source, p_store, v_rare, v_dfs);
  DROP TABLE pg_temp.storetopics_keep;
END $$;

-- How the ln(files) of a store's terms moved since a kept state (p_dfs: the files of each term then, by term id),
-- in units of 1e-9: by term id (0: not moved, or held by no kept file); the terms that were in at most p_rare files
-- and their moves; of the others, the largest move and the largest (files gained or lost) x files then / the
-- smaller of files then and now: a term's ln moved by at most that over its files then.
CREATE OR REPLACE FUNCTION storetopics._novelty_moves(p_source int, p_store text, p_dfs int[], p_rare int,
                                                      OUT moves bigint[], OUT rare int[], OUT rare_moves bigint[],
                                                      OUT most bigint, OUT ratio float8)
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  r record;
BEGIN
  most := 0;
  ratio := 0;
  -- (from the highest id down, into an expanded array; a term no kept file held moves none of them)
  FOR r IN SELECT m.term_id, m.was, m.files, storetopics._ln9(m.files) - storetopics._ln9(m.was) AS move
             FROM (SELECT t.term_id, t.files, coalesce(p_dfs[t.term_id], 0) AS was FROM storetopics.store_terms t
                    WHERE t.source_id = p_source AND t.store_key = p_store) m
            WHERE m.files <> m.was AND m.was > 0
            ORDER BY m.term_id DESC
  LOOP
    IF moves IS NULL THEN
      moves := array_fill(0::bigint, ARRAY[r.term_id]);
    END IF;
    moves[r.term_id] := r.move;
    IF r.was <= p_rare THEN
      rare := rare || r.term_id;
      rare_moves := rare_moves || r.move;
    ELSE
      most := greatest(most, abs(r.move));
      ratio := greatest(ratio, abs(r.files - r.was)::float8 * r.was / least(r.was, r.files));
    END IF;
  END LOOP;
END $$;

-- The outlier files of a store whose terms keywords() shows, best first: rank, file, novelty.  Keeps the store's
-- novelty (storetopics._keep_novelty) when what was kept cannot serve.  Exact: the same state gives the same files
-- whether they were found from the kept state or from scratch.
-- (About 150 lines: what moved since the state was kept, the bounds, then three decisions on them, each making
-- exact only the files it cannot decide; the files' bounds live in one temp table, which only this function reads.)
CREATE OR REPLACE FUNCTION storetopics._outlier_files(p_source int, p_store text)
RETURNS TABLE (rank int, file_key text, novelty float8)
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp SET enable_mergejoin = off SET jit = off AS $$
DECLARE
  st storetopics.store_state;
  k storetopics.novelty_state;
  v_ln float8;
  v_rows bigint;
  v_new text[];          -- files folded since: computed again
  v_moves bigint[];      -- by term id: how far its ln(files) moved since, in units of 1e-9
  v_rare int[];          -- the rare terms among them
  v_rare_moves bigint[];
  v_file_moves bigint[]; -- by file number: how far the rare terms moved a kept file's sum
  v_last bigint;         -- the highest number of a kept file
  r record;
  v_most bigint := 0;    -- the most any other term's ln moved: per counted word, a bound on a kept file's move
  v_ratio float8 := 0;   -- the most (files gained or lost) x files then / the smaller of files then and now ...
                         -- ... of any other term: times a file's sensitivity, another bound on its move
  v_m bigint;
  r1 bigint;
  r2 bigint;
  v_l float8;
  v_h float8;
  v_below bigint;
  v_about float8;        -- NULL for the median; the median, for the MAD
  v_med float8;
  v_mad float8;
  v_s_apart boolean;
  v_s_lo float8;
BEGIN
  SELECT * INTO st FROM storetopics.store_state s WHERE s.source_id = p_source AND s.store_key = p_store;
  IF NOT FOUND THEN
    RETURN;
  END IF;
  v_ln := ln(greatest(st.files, 1)::float8);
  FOR attempt IN 1..2 LOOP
    v_rows := NULL; v_new := NULL; v_moves := NULL; v_rare := NULL; v_rare_moves := NULL; v_most := 0; v_ratio := 0;
    v_file_moves := NULL;
    SELECT * INTO k FROM storetopics.novelty_state s WHERE s.source_id = p_source AND s.store_key = p_store;
    IF FOUND AND attempt = 1 THEN
      SELECT count(*), array_agg(f.file_key) FILTER (WHERE f.n IS NULL), max(f.n) INTO v_rows, v_new, v_last
        FROM storetopics.file_novelty f WHERE f.source_id = p_source AND f.store_key = p_store;
      SELECT * INTO v_moves, v_rare, v_rare_moves, v_most, v_ratio
        FROM storetopics._novelty_moves(p_source, p_store, k.dfs, k.rare);
    END IF;
    -- computed again when nothing is kept, when the kept rows do not add up to the store's files, when many files
    -- changed, or (a second attempt) when the bounds leave too many files to compute again: a tenth of them, whose
    -- exact sums would cost a good part of computing all of them
    IF k.source_id IS NULL OR attempt = 2 OR v_rows <> st.files OR cardinality(v_new) > greatest(100, st.files / 50)
    THEN
      PERFORM storetopics._keep_novelty(p_source, p_store);
      v_new := NULL; v_moves := NULL; v_rare := NULL; v_rare_moves := NULL; v_most := 0; v_ratio := 0;
    END IF;
    -- what the rare terms moved, by file number (the postings of those terms only, each probed by its key; an
    -- array, not a join, so that no estimate of the files, stale after a keep, can make it a loop over them)
    IF v_rare IS NOT NULL AND v_last IS NOT NULL THEN
      v_file_moves := array_fill(0::bigint, ARRAY[v_last::int]);   -- (a number beyond it extends it)
      FOR r IN SELECT u.n, sum(u.c::bigint * m.move)::bigint AS move
                 FROM storetopics.novelty_postings p
                 JOIN unnest(v_rare, v_rare_moves) AS m(term_id, move) ON m.term_id = p.term_id,
                      unnest(p.file_ns, p.counts) AS u(n, c)
                WHERE p.source_id = p_source AND p.store_key = p_store AND p.term_id = ANY (v_rare)
                GROUP BY u.n
      LOOP
        v_file_moves[r.n] := r.move;
      END LOOP;
    END IF;
    IF to_regclass('pg_temp.storetopics_nov') IS NOT NULL THEN DROP TABLE pg_temp.storetopics_nov; END IF;
    -- Kept files: their sums moved exactly by their rare terms (the postings), and through the others by at most
    -- v_most per word, and by at most v_ratio x their sensitivity (each term's ln moved by at most v_ratio / its
    -- files then), plus the roundings of each ln to 1e-9, one unit per word.  Bounds on the novelty without its
    -- rounding to 1e-9, widened by 1e-9 (rounding moves it by less); exact (lo = hi) where nothing moved the sum.
    CREATE TEMP TABLE storetopics_nov ON COMMIT DROP AS
    SELECT f.file_key,
           CASE WHEN b.slack = 0 THEN storetopics._novelty(v_ln, f.total + d.move, f.words)
                ELSE v_ln - (f.total + d.move + b.slack)::float8 / 1e9 / f.words - 1e-9 END AS lo,
           CASE WHEN b.slack = 0 THEN storetopics._novelty(v_ln, f.total + d.move, f.words)
                ELSE v_ln - (f.total + d.move - b.slack)::float8 / 1e9 / f.words + 1e-9 END AS hi,
           f.apart, f.total, f.words
      FROM storetopics.file_novelty f,
           LATERAL (SELECT coalesce(v_file_moves[f.n], 0) AS move) d,
           LATERAL (SELECT CASE WHEN v_most = 0 THEN 0
                           ELSE least(f.words * v_most,
                                      ceil(f.sensitivity * v_ratio * 1e9 * (1 + 1e-9))::bigint + f.words) END
                           AS slack) b
     WHERE f.source_id = p_source AND f.store_key = p_store AND f.n IS NOT NULL AND f.words > 0;
    IF v_new IS NOT NULL THEN   -- files folded since: exact
      INSERT INTO pg_temp.storetopics_nov
      SELECT s.file_key, storetopics._novelty(v_ln, s.total, s.words), storetopics._novelty(v_ln, s.total, s.words),
             s.apart, s.total, s.words
        FROM storetopics._novelty_sums(p_source, p_store, v_new) s WHERE s.words > 0;
    END IF;
    v_m := (SELECT count(*) FROM pg_temp.storetopics_nov);
    IF v_m = 0 THEN
      DROP TABLE pg_temp.storetopics_nov;
      RETURN;
    END IF;
    -- The median, then the MAD (the median of the distances to it), as percentile_cont takes them: the r1-th and
    -- r2-th smallest values, interpolated.  The r1-th smallest value is at least the r1-th smallest lower bound
    -- (v_l), the r2-th at most the r2-th smallest upper bound (v_h): the files whose bounds reach into [v_l, v_h]
    -- are made exact, those wholly below are counted, and the two values are read off the exact ones between.
    r1 := floor(0.5 * (v_m - 1))::bigint + 1;
    r2 := ceil(0.5 * (v_m - 1))::bigint + 1;
    SELECT (SELECT v.lo FROM pg_temp.storetopics_nov v ORDER BY 1 OFFSET r1 - 1 LIMIT 1),
           (SELECT v.hi FROM pg_temp.storetopics_nov v ORDER BY 1 OFFSET r2 - 1 LIMIT 1)
      INTO v_l, v_h;
    EXIT WHEN (SELECT count(*) FROM pg_temp.storetopics_nov v WHERE v.lo < v.hi AND v.hi >= v_l AND v.lo <= v_h)
              <= greatest(100, v_m / 10);
  END LOOP;
  FOR stage IN 1..2 LOOP
    IF stage = 2 THEN
      SELECT (SELECT storetopics._novelty_bound(v.lo, v.hi, v_about, false) FROM pg_temp.storetopics_nov v
               ORDER BY 1 OFFSET r1 - 1 LIMIT 1),
             (SELECT storetopics._novelty_bound(v.lo, v.hi, v_about, true) FROM pg_temp.storetopics_nov v
               ORDER BY 1 OFFSET r2 - 1 LIMIT 1)
        INTO v_l, v_h;
    END IF;
    UPDATE pg_temp.storetopics_nov v SET lo = storetopics._novelty(v_ln, v.total + x.moved, v.words),
                                         hi = storetopics._novelty(v_ln, v.total + x.moved, v.words)
      FROM storetopics._novelty_moved(p_source, p_store, ARRAY(
             SELECT w.file_key FROM pg_temp.storetopics_nov w
              WHERE w.lo < w.hi AND storetopics._novelty_bound(w.lo, w.hi, v_about, true) >= v_l
                AND storetopics._novelty_bound(w.lo, w.hi, v_about, false) <= v_h), v_moves) x
     WHERE v.file_key = x.file_key;
    SELECT count(*) INTO v_below FROM pg_temp.storetopics_nov v
     WHERE storetopics._novelty_bound(v.lo, v.hi, v_about, true) < v_l;
    SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY b.x) INTO v_about
      FROM (SELECT storetopics._novelty_bound(v.lo, v.hi, v_about, false) AS x FROM pg_temp.storetopics_nov v
             WHERE storetopics._novelty_bound(v.lo, v.hi, v_about, true) >= v_l
               AND storetopics._novelty_bound(v.lo, v.hi, v_about, false) <= v_h
             ORDER BY 1 OFFSET r1 - v_below - 1 LIMIT r2 - r1 + 1) b;
    IF stage = 1 THEN
      v_med := v_about;
    ELSE
      v_mad := v_about;
    END IF;
  END LOOP;
  -- The files that pass for sure (lower bound) rank below the third best of them for sure, unless better: of the
  -- others, only those that may pass and may rank among the first three are made exact, then tested.
  SELECT v.apart, v.lo INTO v_s_apart, v_s_lo FROM pg_temp.storetopics_nov v
   WHERE storetopics._novel(v.lo, v.apart, v_med, v_mad)
   ORDER BY v.apart DESC, v.lo DESC OFFSET 2 LIMIT 1;
  UPDATE pg_temp.storetopics_nov v SET lo = storetopics._novelty(v_ln, v.total + x.moved, v.words),
                                       hi = storetopics._novelty(v_ln, v.total + x.moved, v.words)
    FROM storetopics._novelty_moved(p_source, p_store, ARRAY(
           SELECT w.file_key FROM pg_temp.storetopics_nov w
            WHERE w.lo < w.hi AND storetopics._novel(w.hi, w.apart, v_med, v_mad)
              AND (v_s_lo IS NULL
                   OR NOT ((v_s_apart AND NOT w.apart) OR (v_s_apart = w.apart AND w.hi < v_s_lo)))),
           v_moves) x
   WHERE v.file_key = x.file_key;
  -- (the others rank below those three, exact, whatever their bounds)
  RETURN QUERY
    SELECT (row_number() OVER (ORDER BY o.apart DESC, o.lo DESC, o.file_key))::int, o.file_key, o.lo
      FROM (SELECT v.* FROM pg_temp.storetopics_nov v WHERE storetopics._novel(v.lo, v.apart, v_med, v_mad)
             ORDER BY v.apart DESC, v.lo DESC, v.file_key LIMIT 3) o
     ORDER BY 1;
  DROP TABLE pg_temp.storetopics_nov;
END $$;
