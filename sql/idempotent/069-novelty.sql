-- ------------------------------------------------------------------------------------------------------------
-- File novelty: the outlier files of a store, exact, in time proportional to what changed
-- ------------------------------------------------------------------------------------------------------------
-- A file's novelty is the mean IDF of its counted words: ln(N) - sum(n ln df) / sum(n), N the store's files, df
-- the files holding a term.  keywords() shows the terms of up to 3 files whose novelty has a robust z-score (median,
-- MAD over all the store's files) of at least 3.5, or 2.5 when the clustering also finds the file apart, or 1.0 when
-- it finds the file far apart (storetopics._file_far).
--
-- Computed from scratch, that reads every (file, term) pair of the store at every render.  Here it is kept: each
-- file's sum(n ln df) as it was (storetopics.file_novelty), the document frequencies then (novelty_state.dfs), and
-- the files of the rare terms (novelty_postings).  After some file events, a kept file's sum has moved (a) exactly
-- by its rare terms whose df moved (their postings say which files hold them, with what counts), and (b) through its
-- other terms by at most the largest move of their ln df per counted word, and by at most its sensitivity (the sum
-- of count / df over them, kept) times the largest (df gained or lost) x df then / the smaller df of any of them,
-- summed over bands of df (a common term gains a file with nearly every upload, but moves its ln by little).  So
-- each file's novelty is known within bounds; the median, the MAD and each file's test are decided from the bounds
-- where they suffice, and from the files computed again exactly where they do not (order statistics: only the files
-- whose bounds straddle them).  The median and the MAD themselves need be known only as closely as the files that
-- may rank among the first three need: first from a few probes, then from the files near them, last exactly.  The
-- kept files are numbered by their novelty then, so that the files near each order statistic are found by their
-- numbers and the others counted, not read.  Files folded since, and those their rare terms moved by more than an
-- eighth of the other terms' bound, are computed again; the others stay numbered, moved by that exactly.  The
-- result is what a computation from scratch gives, bit for bit: sums are integers (each ln df rounded to 1e-9
-- first), so they do not depend on which files are summed together or in what order, and every step the bounds
-- decide is one whose outcome they prove (tests/test_novelty.py).  The kept state is computed again when many
-- files changed or the bounds leave a tenth of the files to compute exactly, and forgotten when the clusters'
-- assignment changes (what is apart), when the source is recounted, or when anything about it does not add up.

-- ln(df) in units of 1e-9, rounded: integer sums are exact in any order.  (SQL-standard bodies without SET or
-- STRICT: the planner inlines them, they run per row.)
CREATE OR REPLACE FUNCTION storetopics._ln9(df bigint) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN round(ln(greatest(df, 1)::float8) * 1e9)::bigint;

-- The bands of the terms in more than `rare` files, by the files holding them when the novelty was kept: a term in
-- f files is in band width_bucket(f, bands) + 1, of 5.  A file's sum moves through each band's terms by at most its
-- sensitivity to that band times the band's largest relative move, so a common term's many new files no longer
-- multiply the sensitivity to all terms (1M realistic chunks: the files a render after an upload made exact, figures
-- in bench/README.md).  Five, as _novelty_slack() sums them.
CREATE OR REPLACE FUNCTION storetopics._novelty_bands() RETURNS int[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN '{201,1001,5001,25001}'::int[];

-- How far the sensitivities s (per band) let a sum move, given each band's largest relative move r: their dot
-- product, the five bands written out (the planner inlines the expression, a sum over unnest() it would not).
CREATE OR REPLACE FUNCTION storetopics._novelty_slack(s float8[], r float8[]) RETURNS float8
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN s[1] * r[1] + s[2] * r[2] + s[3] * r[3] + s[4] * r[4] + s[5] * r[5];

-- A file's novelty from its sums (ln_n: ln of the store's files), rounded: equal sums tie exactly.  Monotone in
-- total, so bounds on the sum are bounds on the novelty.
CREATE OR REPLACE FUNCTION storetopics._novelty(ln_n float8, total bigint, words bigint) RETURNS float8
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN round((ln_n - total::float8 / 1e9 / words)::numeric, 9)::float8;

-- Whether a store's kept novelty is worn, after `calls` calls since the first after the keep.  A call's wear is what
-- it took beyond that first; this_ms the last call's, last_ms the one's before; wear_ms the sum over the calls of the
-- smaller of each one's and its predecessor's (so that one slow call counts for nothing).  Worn once the wear of a
-- call (the smaller of the last two) times the calls reaches the keep's cost plus all the wear: keeping again then
-- lowers the average cost of a call over the keep's cycle, if the wear grows back from nothing after a keep (renew
-- when the marginal cost reaches the average); or once the wear reaches the keep's cost (rent or buy): one upload
-- that moved much (a new theme's files after a fit) makes every later call as slow, and the first rule, for which
-- that wear would come back after a keep, would never keep again (bench/README.md).  A keep cheaper than a quarter
-- second is left to the other rules (the changed files, the files to make exact): there the wear is mostly the noise
-- of timing calls of a few ms, and a keep in a render costs it little.  NULL costs (a state kept before they were
-- measured): not worn.
CREATE OR REPLACE FUNCTION storetopics._novelty_worn(calls int, wear_ms float8, this_ms float8, last_ms float8,
                                                     keep_ms float8) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN coalesce(keep_ms >= 250 AND (calls * least(this_ms, last_ms) >= keep_ms + wear_ms OR wear_ms >= keep_ms),
                false);

-- For a value x known to lie in [lo, hi]: a lower (upper: false) or upper bound of x itself (about_lo NULL), or of
-- its distance to a value known to lie in [about_lo, about_hi].  Exact in, exact out: both bounds are then x, or
-- |x - about|.
CREATE OR REPLACE FUNCTION storetopics._novelty_bound(lo float8, hi float8, about_lo float8, about_hi float8,
                                                      upper boolean)
RETURNS float8
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE WHEN about_lo IS NULL THEN CASE WHEN upper THEN hi ELSE lo END
            WHEN upper THEN greatest(hi - about_lo, about_hi - lo)
            WHEN lo > about_hi THEN lo - about_hi WHEN hi < about_lo THEN about_lo - hi ELSE 0 END;

-- Whether a novelty passes the outlier test (robust z-score against the store's median and MAD).  Monotone in x.
-- The two signals vouch for each other: the farther the clustering finds the file from every cluster, the less its
-- words need to stand out.  A short page of another manual may use common words and lie far from every cluster; a
-- store's own file seldom lies that far (figures in bench/README.md).
CREATE OR REPLACE FUNCTION storetopics._novel(x float8, apart boolean, far boolean, med float8, mad float8)
RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN (x - med) / (1.4826 * mad + 1e-9) >= CASE WHEN far THEN 1.0 WHEN apart THEN 2.5 ELSE 3.5 END;

-- The document frequency of each term of a store, by term id: an array that the sums below index, 0 for a term the
-- store does not hold.  (The terms touched since, looked up one by one, are storetopics._novelty_moves'.)
DO $$ BEGIN   -- (0.2 before: also of some files' terms, and the sums' fallback to them)
  IF to_regprocedure('storetopics._store_dfs(int, text, text[])') IS NOT NULL THEN
    DROP FUNCTION storetopics._store_dfs(int, text, text[]);
  END IF;
  IF EXISTS (SELECT 1 FROM pg_proc p
              WHERE p.oid = to_regprocedure('storetopics._novelty_sums(int, text, text[], int[])')
                AND p.pronargdefaults > 0) THEN
    DROP FUNCTION storetopics._novelty_sums(int, text, text[], int[]);
  END IF;
END $$;
CREATE OR REPLACE FUNCTION storetopics._store_dfs(p_source int, p_store text) RETURNS int[]
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_dfs int[];
  r record;
BEGIN
  -- (filled in place, from the highest id down: an expanded array, each assignment in constant time)
  FOR r IN SELECT t.term_id, t.files FROM storetopics.store_terms t
            WHERE t.source_id = p_source AND t.store_key = p_store
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

-- Whether the clustering finds a file far apart: every one of its chunks lies at least 1.5 times its nearest
-- cluster's radius from its centroid (distance_ratio in file_clusters; NULL: not measured, not far).
CREATE OR REPLACE FUNCTION storetopics._file_far(distance_ratio real) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN coalesce(distance_ratio >= 1.5, false);

-- The sums of some files of a store at the current document frequencies (p_dfs: those of their terms, by term id),
-- and whether each is apart (far apart).  (The files joined to their keys, each found by its key's digest: a filter
-- `file_key = ANY (p_files)` compares every row with the whole array, and the files a render makes exact can be a
-- fifth of a large store's, bench/README.md.)
CREATE OR REPLACE FUNCTION storetopics._novelty_sums(p_source int, p_store text, p_files text[], p_dfs int[])
RETURNS TABLE (file_key text, total bigint, words bigint, apart boolean, far boolean)
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp SET jit = off AS $$
BEGIN
  IF cardinality(p_files) = 0 THEN
    RETURN;
  END IF;
  RETURN QUERY
  SELECT f.file_key,
         coalesce((SELECT sum(u.c::bigint * storetopics._ln9(p_dfs[u.t]))
                     FROM (SELECT unnest(f.term_ids) AS t, unnest(f.counts) AS c) u), 0)::bigint,
         f.words, coalesce(storetopics._file_apart(c.cluster_chunks, c.cluster_outliers), false),
         storetopics._file_far(c.distance_ratio)
    FROM (SELECT DISTINCT x FROM unnest(p_files) x) k(file_key)
    JOIN storetopics.file_terms f ON md5(f.file_key)::uuid = md5(k.file_key)::uuid AND f.file_key = k.file_key
    LEFT JOIN LATERAL (SELECT c.cluster_chunks, c.cluster_outliers, c.distance_ratio FROM storetopics.file_clusters c
                        WHERE c.source_id = f.source_id AND md5(c.file_key)::uuid = md5(f.file_key)::uuid
                          AND c.file_key = f.file_key AND c.store_key = f.store_key OFFSET 0) c
           ON true   -- (as in _keep_novelty)
   WHERE f.source_id = p_source AND f.store_key = p_store;
END $$;

-- How far the sums of some files of a store moved through their terms whose ln(files) moved (p_moves, by term id,
-- in units of 1e-9): a kept file's sum (storetopics.file_novelty) plus this is its sum now.  Exact: integers.  (The
-- files found as in _novelty_sums.)
CREATE OR REPLACE FUNCTION storetopics._novelty_moved(p_source int, p_store text, p_files text[], p_moves bigint[])
RETURNS TABLE (file_key text, moved bigint)
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
  SELECT f.file_key,
         coalesce((SELECT sum(u.c::bigint * p_moves[u.t])
                     FROM (SELECT unnest(f.term_ids) AS t, unnest(f.counts) AS c) u), 0)::bigint
    FROM (SELECT DISTINCT x FROM unnest(p_files) x) k(file_key)
    JOIN storetopics.file_terms f ON md5(f.file_key)::uuid = md5(k.file_key)::uuid AND f.file_key = k.file_key
   WHERE f.source_id = p_source AND f.store_key = p_store;
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
-- sensitivity to the terms in more than `rare` files (per band), and the postings of the others.  One pass over the
-- store's (file, term) pairs: each term's ln, 1 / files and band looked up by position in arrays indexed by term id,
-- once per pair (OFFSET 0: the sums below would each look them up again; 53 -> 38 s at 1M realistic chunks)
-- (hashing the pairs and grouping them by file again costs about twice as much), each file's rare terms packed with
-- their counts into one array (an aggregate per pair less).  (A file's arrays are unnested in the select list, in
-- step, which streams its pairs; unnest(a, b) in FROM copies them into a tuplestore first.)
CREATE OR REPLACE FUNCTION storetopics._keep_novelty(p_source int, p_store text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp SET jit = off SET work_mem = '256MB' AS $$
DECLARE
  v_t0 timestamptz := clock_timestamp();   -- (what the keep cost: novelty_state.keep_ms)
  v_rare int := 50;
  v_bands int[] := storetopics._novelty_bands();
  v_dfs int[] := storetopics._store_dfs(p_source, p_store);
  v_ln9 bigint[];
  v_inv float8[];    -- 1 / files, 0 for a rare term
  v_band int[];      -- the band of each term, 0 for a rare term
BEGIN
  SELECT array_agg(storetopics._ln9(x.d) ORDER BY x.i), array_agg(CASE WHEN x.d > v_rare THEN 1 / x.d::float8 ELSE 0 END
                                                              ORDER BY x.i),
         array_agg(CASE WHEN x.d > v_rare THEN width_bucket(x.d, v_bands) + 1 ELSE 0 END ORDER BY x.i)
    INTO v_ln9, v_inv, v_band
    FROM unnest(v_dfs) WITH ORDINALITY AS x(d, i);
  PERFORM storetopics._forget_novelty(p_source, p_store);
  IF to_regclass('pg_temp.storetopics_keep') IS NOT NULL THEN DROP TABLE pg_temp.storetopics_keep; END IF;
  -- (numbered by novelty, lowest first, as _kept_mid() computes it: the files with counted words first)
  CREATE TEMP TABLE storetopics_keep ON COMMIT DROP AS
  SELECT (row_number() OVER (ORDER BY CASE WHEN f.words > 0
                                           THEN coalesce(s.total, 0)::bigint::float8 / 1e9 / f.words END
                                      DESC NULLS LAST, f.file_key))::int AS n,
         f.file_key, coalesce(s.total, 0)::bigint AS total, f.words,
         coalesce(storetopics._file_apart(c.cluster_chunks, c.cluster_outliers), false) AS apart,
         storetopics._file_far(c.distance_ratio) AS far, s.sensitivity, s.rare
    FROM storetopics.file_terms f
    -- (probed per file by its key, OFFSET 0, the store's key not a constant there: a join planned on stale
    -- statistics of file_clusters, right after a fit, read all the store's rows for each file: 30-60 s a store of
    -- 6,700 files at 1M chunks)
    LEFT JOIN LATERAL (SELECT c.cluster_chunks, c.cluster_outliers, c.distance_ratio FROM storetopics.file_clusters c
                        WHERE c.source_id = f.source_id AND md5(c.file_key)::uuid = md5(f.file_key)::uuid
                          AND c.file_key = f.file_key AND c.store_key = f.store_key OFFSET 0) c ON true
   CROSS JOIN LATERAL (SELECT sum(u.c::bigint * u.ln9) AS total,
                              ARRAY[coalesce(sum(u.c * u.inv) FILTER (WHERE u.b = 1), 0),
                                    coalesce(sum(u.c * u.inv) FILTER (WHERE u.b = 2), 0),
                                    coalesce(sum(u.c * u.inv) FILTER (WHERE u.b = 3), 0),
                                    coalesce(sum(u.c * u.inv) FILTER (WHERE u.b = 4), 0),
                                    coalesce(sum(u.c * u.inv) FILTER (WHERE u.b = 5), 0)] AS sensitivity,
                              array_agg(u.t::bigint << 32 | u.c) FILTER (WHERE u.b = 0) AS rare
                         FROM (SELECT x.t, x.c, v_ln9[x.t] AS ln9, v_inv[x.t] AS inv, v_band[x.t] AS b
                                 FROM (SELECT unnest(f.term_ids) AS t, unnest(f.counts) AS c) x OFFSET 0) u) s
   WHERE f.source_id = p_source AND f.store_key = p_store;
  INSERT INTO storetopics.file_novelty (source_id, store_key, file_key, n, total, words, apart, far, sensitivity)
  SELECT p_source, p_store, k.file_key, k.n, k.total, k.words, k.apart, k.far, k.sensitivity
    FROM pg_temp.storetopics_keep k;
  -- (unnested in the select list, which streams the pairs)
  INSERT INTO storetopics.novelty_postings (source_id, store_key, term_id, file_ns, counts)
  SELECT p_source, p_store, (u.x >> 32)::int, array_agg(u.n), array_agg((u.x & 4294967295)::int)
    FROM (SELECT k.n, unnest(k.rare) AS x FROM pg_temp.storetopics_keep k) u
   GROUP BY u.x >> 32;
  INSERT INTO storetopics.novelty_state (source_id, store_key, rare, bands, dfs, numbered, ranked, words, per_word,
                                         keep_ms)
  SELECT p_source, p_store, v_rare, v_bands, v_dfs, count(*), count(*) FILTER (WHERE k.words > 0),
         coalesce(array_agg(k.words::int ORDER BY k.n), '{}'),
         ARRAY[coalesce(max(k.sensitivity[1] / k.words) FILTER (WHERE k.words > 0), 0),
               coalesce(max(k.sensitivity[2] / k.words) FILTER (WHERE k.words > 0), 0),
               coalesce(max(k.sensitivity[3] / k.words) FILTER (WHERE k.words > 0), 0),
               coalesce(max(k.sensitivity[4] / k.words) FILTER (WHERE k.words > 0), 0),
               coalesce(max(k.sensitivity[5] / k.words) FILTER (WHERE k.words > 0), 0)],
         1000 * extract(epoch FROM clock_timestamp() - v_t0)
    FROM pg_temp.storetopics_keep k;
  DROP TABLE pg_temp.storetopics_keep;
  PERFORM storetopics._keep_heads(p_source, p_store);
  PERFORM storetopics._keep_contrast(p_source, p_store);
END $$;

-- Keep the heads of a store's rankings by total count and by files in its novelty_state (storetopics._kept_head):
-- the terms of the p_n first of each (ties by id) with their counts, and each one's p_n-th count.  With its novelty
-- (the terms touched since are listed from then), or later (they are then a few more than needed).
CREATE OR REPLACE FUNCTION storetopics._keep_heads(p_source int, p_store text, p_n int DEFAULT 400) RETURNS void
LANGUAGE sql SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
  UPDATE storetopics.novelty_state k
     SET by_total_cut = t.cut, by_files_cut = f.cut,
         head_ids = h.ids, head_files = h.files, head_totals = h.totals, head_totals_sq = h.totals_sq
    FROM (SELECT coalesce(array_agg(t.term_id), '{}') AS ids, CASE WHEN count(*) = p_n THEN min(t.total) END AS cut
            FROM (SELECT t.term_id, t.total FROM storetopics.store_terms t
                   WHERE t.source_id = p_source AND t.store_key = p_store
                   ORDER BY t.total DESC, t.term_id LIMIT p_n) t) t,
         (SELECT coalesce(array_agg(t.term_id), '{}') AS ids, CASE WHEN count(*) = p_n THEN min(t.files) END AS cut
            FROM (SELECT t.term_id, t.files FROM storetopics.store_terms t
                   WHERE t.source_id = p_source AND t.store_key = p_store
                   ORDER BY t.files DESC, t.term_id LIMIT p_n) t) f,
         LATERAL (SELECT coalesce(array_agg(s.term_id ORDER BY s.term_id), '{}') AS ids,
                         coalesce(array_agg(s.files ORDER BY s.term_id), '{}') AS files,
                         coalesce(array_agg(s.total ORDER BY s.term_id), '{}') AS totals,
                         coalesce(array_agg(s.total_sq ORDER BY s.term_id), '{}') AS totals_sq
                    FROM storetopics.store_terms s
                   WHERE s.source_id = p_source AND s.store_key = p_store AND s.term_id = ANY (t.ids || f.ids)) h
   WHERE k.source_id = p_source AND k.store_key = p_store;
END;

-- The terms of a store that can rank above a kept cut, by total count (p_by 'total') or by files ('files'): those
-- of the heads kept with its novelty (storetopics._keep_heads: both heads, a few more than one needs) and those
-- fold touched since, with their counts now (the touched terms' as fold listed them, the others' as kept: read
-- from the row, no term looked up), and the cut: every other term of the store has at most that many (NULL: there
-- is no other term).  No row when nothing kept vouches for it (no state, or too many terms touched to list): the
-- caller sorts every term.
CREATE OR REPLACE FUNCTION storetopics._kept_head(p_source int, p_store text, p_by text, OUT ids int[],
                                                  OUT files int[], OUT totals bigint[], OUT totals_sq bigint[],
                                                  OUT cut bigint)
RETURNS SETOF record
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
  SELECT coalesce(array_agg(x.term_id) FILTER (WHERE x.files > 0), '{}'),
         coalesce(array_agg(x.files) FILTER (WHERE x.files > 0), '{}'),
         coalesce(array_agg(x.total) FILTER (WHERE x.files > 0), '{}'),
         coalesce(array_agg(x.total_sq) FILTER (WHERE x.files > 0), '{}'),
         min(CASE p_by WHEN 'total' THEN h.by_total_cut WHEN 'files' THEN h.by_files_cut END)
    FROM storetopics.novelty_state h
   CROSS JOIN LATERAL (SELECT DISTINCT ON (u.term_id) u.*
                         FROM (SELECT t.*, 0::bigint AS i
                                 FROM unnest(h.head_ids, h.head_files, h.head_totals, h.head_totals_sq)
                                      AS t(term_id, files, total, total_sq)
                               UNION ALL
                               SELECT t.*, 1
                                 FROM unnest(h.touched, h.touched_files, h.touched_totals, h.touched_totals_sq)
                                      AS t(term_id, files, total, total_sq)) u
                        ORDER BY u.term_id, u.i DESC) x
   WHERE h.source_id = p_source AND h.store_key = p_store AND h.head_ids IS NOT NULL AND h.touched IS NOT NULL
   GROUP BY h.source_id;
END;

-- How the ln(files) of a store's terms moved since a kept state (p_dfs: the files of each term then, by term id),
-- in units of 1e-9: by term id (0: not moved, or held by no kept file); the terms that were in at most p_rare files
-- and their moves; of the others, the largest move and, per band (p_bands), the largest (files gained or lost) x
-- files then / the smaller of files then and now: a term's ln moved by at most that over its files then; and dfs,
-- the files of each term now for every term it looked up (the others: as then; the sums of the files folded since
-- read it, every term of theirs was touched).
-- p_touched, p_touched_files: the terms fold changed since and their files now (novelty_state.touched and
-- touched_files: read as listed, no term looked up); NULL: every term of the store is compared, a scan of its terms
-- at every render.
DO $$ BEGIN   -- (0.2 before p_touched_files)
  IF to_regprocedure('storetopics._novelty_moves(int, text, int[], int, int[], int[])') IS NOT NULL THEN
    DROP FUNCTION storetopics._novelty_moves(int, text, int[], int, int[], int[]);
  END IF;
END $$;
CREATE OR REPLACE FUNCTION storetopics._novelty_moves(p_source int, p_store text, p_dfs int[], p_rare int,
                                                      p_bands int[], p_touched int[], p_touched_files int[],
                                                      OUT moves bigint[], OUT rare int[], OUT rare_moves bigint[],
                                                      OUT most bigint, OUT ratio float8[], OUT dfs int[])
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_ids int[];
  v_files int[];
  v_moves bigint[];
BEGIN
  -- (aggregated in one statement; then filled in place, from the highest id down, into expanded arrays)
  SELECT array_agg(m.term_id ORDER BY m.term_id DESC), array_agg(m.files ORDER BY m.term_id DESC),
         array_agg(CASE WHEN m.moved THEN m.move ELSE 0 END ORDER BY m.term_id DESC),
         array_agg(m.term_id ORDER BY m.term_id) FILTER (WHERE m.moved AND m.was <= p_rare),
         array_agg(m.move ORDER BY m.term_id) FILTER (WHERE m.moved AND m.was <= p_rare),
         coalesce(max(abs(m.move)) FILTER (WHERE m.moved AND m.was > p_rare), 0),
         ARRAY[coalesce(max(m.rel) FILTER (WHERE m.band = 1), 0), coalesce(max(m.rel) FILTER (WHERE m.band = 2), 0),
               coalesce(max(m.rel) FILTER (WHERE m.band = 3), 0), coalesce(max(m.rel) FILTER (WHERE m.band = 4), 0),
               coalesce(max(m.rel) FILTER (WHERE m.band = 5), 0)]
    INTO v_ids, v_files, v_moves, rare, rare_moves, most, ratio
    FROM (SELECT u.term_id, u.files, u.was, u.moved,
                 storetopics._ln9(u.files) - storetopics._ln9(u.was) AS move,
                 CASE WHEN u.moved AND u.was > p_rare THEN width_bucket(u.was, p_bands) + 1 END AS band,
                 CASE WHEN u.moved AND u.was > p_rare
                      THEN abs(u.files - u.was)::float8 * u.was / least(u.was, u.files) END AS rel
            FROM (SELECT t.term_id, t.files, t.was, t.files <> t.was AND t.was > 0 AS moved
                    FROM (SELECT t.term_id, t.files, coalesce(p_dfs[t.term_id], 0) AS was
                            FROM storetopics.store_terms t
                           WHERE t.source_id = p_source AND t.store_key = p_store AND p_touched IS NULL
                          UNION ALL   -- (the touched terms the store still holds)
                          SELECT t.term_id, t.files, coalesce(p_dfs[t.term_id], 0)
                            FROM unnest(p_touched, p_touched_files) AS t(term_id, files)
                           WHERE p_touched IS NOT NULL AND t.files > 0) t) u) m;
  -- (the terms new since, past the kept array's end, made room for with zeros first: an assignment past the end
  -- pads with NULLs, and an array that ever had one keeps a null bitmap, which each subscript of _novelty_sums and
  -- _outlier_terms then walks from the start; bench/README.md)
  dfs := p_dfs || array_fill(0, ARRAY[greatest(v_ids[1] - coalesce(cardinality(p_dfs), 0), 0)]);
  FOR i IN 1..coalesce(cardinality(v_ids), 0) LOOP
    dfs[v_ids[i]] := v_files[i];
    IF v_moves[i] <> 0 THEN
      IF moves IS NULL THEN
        moves := array_fill(0::bigint, ARRAY[v_ids[i]]);
      END IF;
      moves[v_ids[i]] := v_moves[i];
    END IF;
  END LOOP;
END $$;

-- The kept ranking (storetopics._keep_novelty numbers a store's files by their novelty then, lowest first): a kept
-- file whose rare terms did not move it and that was not folded since has a sum that moved only through its other
-- terms, so its novelty now is its "mid" (ln of the store's files now less its kept sum per word) within a bound w
-- that holds for every such file.  The mids are in the order of the numbers: the k-th of those files (its rank k
-- among them; x: the numbers that are not, sorted) is found by its number, and order statistics of the store by a
-- few index probes, instead of sorting every file.

-- How many values of a sorted array are at most v: width_bucket's binary search (0 for an empty or NULL array).  (No
-- SET search_path: bound when created, and inlined into its callers.)
CREATE OR REPLACE FUNCTION storetopics._count_le(a int[], v bigint) RETURNS int
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN coalesce(width_bucket(least(v, 2147483647)::int, a), 0);

-- The number of the k-th ranked file (x: the numbers left out, sorted): the least n with n - (those of x up to n) = k.
CREATE OR REPLACE FUNCTION storetopics._kept_number(x int[], k bigint) RETURNS bigint
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  n bigint := k;
  n2 bigint;
BEGIN
  LOOP
    n2 := k + storetopics._count_le(x, n);
    EXIT WHEN n2 = n;
    n := n2;
  END LOOP;
  RETURN n;
END $$;

-- The mid of the k-th ranked file (1 <= k <= the ranked files): ln_n less its kept sum per word.
CREATE OR REPLACE FUNCTION storetopics._kept_mid(p_source int, p_store text, x int[], k bigint, ln_n float8)
RETURNS float8
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
  SELECT ln_n - f.total::float8 / 1e9 / f.words FROM storetopics.file_novelty f
   WHERE f.source_id = p_source AND f.store_key = p_store AND f.n = storetopics._kept_number(x, k);
END;

-- How many of the kn ranked files have a mid below y (or at most y: inclusive).
CREATE OR REPLACE FUNCTION storetopics._kept_below(p_source int, p_store text, x int[], kn bigint, ln_n float8,
                                                   y float8, inclusive boolean) RETURNS bigint
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  lo bigint := 0;
  hi bigint := kn;
  m bigint;
  v float8;
BEGIN
  WHILE lo < hi LOOP
    m := (lo + hi + 1) / 2;
    v := storetopics._kept_mid(p_source, p_store, x, m, ln_n);
    IF v < y OR (inclusive AND v = y) THEN lo := m; ELSE hi := m - 1; END IF;
  END LOOP;
  RETURN lo;
END $$;

-- The i-th smallest distance |mid - med| of the kn ranked files (1 <= i <= kn): the i-th of two sorted runs, the
-- p files below med going down and the others going up, found by bisecting how many the first run gives.
CREATE OR REPLACE FUNCTION storetopics._kept_distance(p_source int, p_store text, x int[], kn bigint, ln_n float8,
                                                      med float8, i bigint) RETURNS float8
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  p bigint := storetopics._kept_below(p_source, p_store, x, kn, ln_n, med, false);
  lo bigint := greatest(0, i - (kn - p));
  hi bigint := least(i, p);
  j bigint;
BEGIN
  -- the least j such that one more from the first run (its (j+1)-th) would not be below the second's (i-j)-th
  WHILE lo < hi LOOP
    j := (lo + hi) / 2;
    IF med - storetopics._kept_mid(p_source, p_store, x, p - j, ln_n)
       < storetopics._kept_mid(p_source, p_store, x, p + i - j, ln_n) - med THEN
      lo := j + 1;
    ELSE
      hi := j;
    END IF;
  END LOOP;
  RETURN greatest(CASE WHEN lo > 0 THEN med - storetopics._kept_mid(p_source, p_store, x, p - lo + 1, ln_n) END,
                  CASE WHEN lo < i THEN storetopics._kept_mid(p_source, p_store, x, p + i - lo, ln_n) - med END);
END $$;

-- Bounds on the novelty of a kept file whose sum is now total (its kept sum and what its rare terms moved) give or
-- take its slack: the other terms' moves, at most `most` per word and at most the sum over the bands of the band's
-- ratio x its sensitivity to the band, plus the roundings of each ln to 1e-9, one unit per word.  Bounds on the
-- novelty without its rounding to 1e-9, widened by 1e-9 (rounding moves it by less); exact where nothing moved
-- (most = 0).
CREATE OR REPLACE FUNCTION storetopics._kept_bound(ln_n float8, total bigint, words bigint, sensitivity float8[],
                                                   most bigint, ratio float8[], upper boolean) RETURNS float8
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE WHEN most = 0 THEN storetopics._novelty(ln_n, total, words)
            ELSE ln_n - (total + CASE WHEN upper THEN -1 ELSE 1 END
                                 * least(words * most,
                                         ceil(storetopics._novelty_slack(sensitivity, ratio) * 1e9 * (1 + 1e-9))::bigint
                                         + words)
                        )::float8 / 1e9 / words + CASE WHEN upper THEN 1e-9 ELSE -1e-9 END END;

-- The ranked files of ranks a .. b, with their rank and bounds (shift: what the rare terms moved their sums, by
-- number, or NULL).
CREATE OR REPLACE FUNCTION storetopics._kept_ranked(p_source int, p_store text, x int[], a bigint, b bigint,
                                                    ln_n float8, most bigint, ratio float8[], shift bigint[])
RETURNS TABLE (rk bigint, file_key text, lo float8, hi float8, apart boolean, far boolean, total bigint,
               words bigint)
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  na bigint := storetopics._kept_number(x, a);
  nb bigint := storetopics._kept_number(x, b);
  v_out int[] := ARRAY(SELECT g FROM unnest(x) g WHERE g BETWEEN na AND nb);
BEGIN
  IF a > b THEN
    RETURN;
  END IF;
  RETURN QUERY
    SELECT a - 1 + row_number() OVER (ORDER BY f.n), f.file_key,
           storetopics._kept_bound(ln_n, f.total + coalesce(shift[f.n], 0), f.words, f.sensitivity, most, ratio, false),
           storetopics._kept_bound(ln_n, f.total + coalesce(shift[f.n], 0), f.words, f.sensitivity, most, ratio, true),
           f.apart, f.far, f.total, f.words
      FROM storetopics.file_novelty f
     WHERE f.source_id = p_source AND f.store_key = p_store AND f.n BETWEEN na AND nb AND f.n <> ALL (v_out);
END $$;

DO $$ BEGIN   -- (0.2 before dfs)
  IF EXISTS (SELECT 1 FROM pg_proc p WHERE p.oid = to_regprocedure('storetopics._outlier_files(int, text)')
                                      AND NOT 'dfs' = ANY (p.proargnames)) THEN
    DROP FUNCTION storetopics._outlier_files(int, text);
  END IF;
END $$;

-- The outlier files of a store whose terms keywords() shows, best first: rank, file, novelty; and on the first row,
-- dfs: the files of each term of the store now, by term id (as this function read them: kept, and moved since), for
-- ranking the files' terms (storetopics._outlier_terms) without looking each up again.  Keeps the store's
-- novelty (storetopics._keep_novelty) when what was kept cannot serve.  Exact: the same state gives the same files
-- whether they were found from the kept state or from scratch.
-- The files looked at (their bounds in one temp table, which only this function reads): those folded since and those
-- their rare terms moved much, and of the ranked files only those near what each decision needs (the median, the
-- MAD, the files that may pass): each decision reads the others as a count.  Up to three passes, each only when the
-- one before did not decide: the median and the MAD known within intervals from a few probes of the ranking, then
-- within the bounds of the files near them, then exact.  Each pass makes exact only the files it cannot decide from
-- their bounds.
-- (About 370 lines: what moved since the state was kept, then the passes, each bounding the median and the MAD
-- before it decides the files that pass, if it can; they share one temp table of bounds, which only this function
-- reads.)
CREATE OR REPLACE FUNCTION storetopics._outlier_files(p_source int, p_store text)
RETURNS TABLE (rank int, file_key text, novelty float8, dfs int[])
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp SET enable_mergejoin = off SET jit = off AS $$
DECLARE
  st storetopics.store_state;
  k storetopics.novelty_state;
  v_ln float8;
  v_rows bigint;
  v_new text[];          -- files folded since: computed again
  v_moves bigint[];      -- by term id: how far its ln(files) moved since, in units of 1e-9
  v_dfs int[];           -- by term id: the files holding it now (as kept, those touched since as they are now)
  v_rare int[];          -- the rare terms among them
  v_rare_moves bigint[];
  v_changed int[];       -- the rare terms whose move changed since the last render, and by how much
  v_changed_by bigint[];
  v_file_moves bigint[]; -- by file number: how far the rare terms moved a kept file's sum
  v_ns int[];            -- (the same, for the files they moved only)
  v_words int[];         -- (novelty_state.words)
  v_ns_moves bigint[];
  v_most bigint := 0;    -- the most any other term's ln moved: per counted word, a bound on a kept file's move
  v_ratio float8[];      -- per band, the most (files gained or lost) x files then / the smaller of files then and
                         -- now of its terms: times a file's sensitivity to the band, summed, another bound
  v_moved int[];         -- the kept files the rare terms moved, by number
  v_x int[];             -- numbers out of the ranking: folded since, or moved by their rare terms
  v_kn bigint;           -- the ranked files left: each one's novelty is within v_w of its mid
  v_w float8;
  v_e bigint;            -- the other files (looked at one by one)
  v_m bigint;
  r1 bigint;
  r2 bigint;
  v_l float8;
  v_h float8;
  v_lo bigint;           -- the ranked files looked at for a decision: ranks v_lo .. v_hi except (v_in1, v_in2]
  v_hi bigint;
  v_in1 bigint;
  v_in2 bigint;
  v_below bigint;
  v_lo1 bigint;          -- the median's window and the bounds there, kept for the last pass
  v_hi1 bigint;
  v_l1 float8;
  v_h1 float8;
  v_straddle bigint;     -- the files whose bounds straddle the median's window (the second pass)
  v_worn boolean;        -- ... are many: the state is worn (novelty_state.worn)
  v_rekeep boolean;      -- ... too many to make exact
  v_exact boolean;       -- the median and the MAD made exact (the last pass)
  v_med_lo float8;       -- the median lies in [v_med_lo, v_med_hi], the MAD in [v_mad_lo, v_mad_hi]
  v_med_hi float8;
  v_mad_lo float8;
  v_mad_hi float8;
  v_alo float8;          -- NULL for the median; the median's interval, for the MAD
  v_ahi float8;
  v_mid1 float8;         -- the mids of the (r1 - e)-th and the r2-th ranked files (NULL: no such rank)
  v_mid2 float8;
  v_c float8;            -- the middle of the median's interval, and w widened by half its width
  v_wc float8;
  v_passes int;          -- which decided: 1 the probes, 2 the bounds near the median and the MAD, 3 exact
  v_rank bigint[] := '{0,0,0}';   -- per test (neither, apart, far apart): the first rank that may pass
  v_first bigint[] := '{0,0,0}';  -- ... and its number
  v_s_apart boolean;     -- the third file that passes for sure (apart, and its lower bound)
  v_s_lo float8;
  v_t0 timestamptz := clock_timestamp();   -- what this call cost (after a keep: from then), and whether it kept
  v_kept boolean := false;
BEGIN
  SELECT * INTO st FROM storetopics.store_state s WHERE s.source_id = p_source AND s.store_key = p_store;
  IF NOT FOUND THEN
    RETURN;
  END IF;
  v_ln := ln(greatest(st.files, 1)::float8);
  FOR attempt IN 1..2 LOOP
    v_rows := NULL; v_new := NULL; v_moves := NULL; v_dfs := NULL; v_rare := NULL; v_rare_moves := NULL; v_most := 0;
    v_ratio := '{0,0,0,0,0}';
    v_file_moves := NULL; v_moved := '{}';
    SELECT * INTO k FROM storetopics.novelty_state s WHERE s.source_id = p_source AND s.store_key = p_store;
    IF FOUND AND attempt = 1 THEN
      v_new := ARRAY(SELECT f.file_key FROM storetopics.file_novelty f
                      WHERE f.source_id = p_source AND f.store_key = p_store AND f.n IS NULL);
      v_rows := k.numbered - cardinality(k.gone) + cardinality(v_new);
      SELECT * INTO v_moves, v_rare, v_rare_moves, v_most, v_ratio, v_dfs
        FROM storetopics._novelty_moves(p_source, p_store, k.dfs, k.rare, k.bands, k.touched, k.touched_files);
    END IF;
    -- computed again when nothing is kept, when the kept rows do not add up to the store's files, when many files
    -- changed, when it is worn (below; the worker keeps it between passes first, storetopics._keep_worn), or (a
    -- second attempt) when the bounds leave too many files to compute again: a fifth of them, whose exact sums would
    -- cost a good part of computing all of them
    IF k.source_id IS NULL OR attempt = 2 OR v_rows <> st.files OR cardinality(v_new) > greatest(100, st.files / 50)
       OR k.bands <> storetopics._novelty_bands() OR k.worn THEN
      PERFORM storetopics._keep_novelty(p_source, p_store);
      v_kept := true;
      v_t0 := clock_timestamp();
      SELECT * INTO k FROM storetopics.novelty_state s WHERE s.source_id = p_source AND s.store_key = p_store;
      v_new := NULL; v_moves := NULL; v_dfs := NULL; v_rare := NULL; v_rare_moves := NULL; v_most := 0;
      v_ratio := '{0,0,0,0,0}';
    END IF;
    v_w := CASE WHEN v_most = 0 THEN 0
                ELSE least(v_most::float8,
                           storetopics._novelty_slack(k.per_word, v_ratio) * 1e9 * (1 + 1e-9) + 2)
           END / 1e9 + 2e-9;
    -- what the rare terms moved, by file number: what they had moved at the last render (novelty_state.file_moves,
    -- for the moves in rare_moved_by), and the postings of the terms whose move changed since, each probed by its
    -- key (an array, not a join, so that no estimate of the files, stale after a keep, can make it a loop over them)
    IF v_rare IS NOT NULL THEN
      SELECT array_agg(x.t), array_agg(x.d) INTO v_changed, v_changed_by
        FROM (SELECT coalesce(a.t, b.t) AS t, coalesce(a.m, 0) - coalesce(b.m, 0) AS d
                FROM unnest(v_rare, v_rare_moves) AS a(t, m)
                FULL JOIN unnest(k.rare_moved, k.rare_moved_by) AS b(t, m) ON b.t = a.t) x
       WHERE x.d <> 0;
      SELECT array_agg(x.n), array_agg(x.move) INTO v_ns, v_ns_moves
        FROM (SELECT u.n, sum(u.move)::bigint AS move
                FROM (SELECT f.n, f.move FROM unnest(k.file_moves_ns, k.file_moves) AS f(n, move)
                      UNION ALL
                      SELECT u.n, u.c::bigint * m.d
                        FROM storetopics.novelty_postings p
                        JOIN unnest(v_changed, v_changed_by) AS m(term_id, d) ON m.term_id = p.term_id,
                             unnest(p.file_ns, p.counts) AS u(n, c)
                       WHERE p.source_id = p_source AND p.store_key = p_store AND p.term_id = ANY (v_changed)) u
               GROUP BY u.n) x;
      -- kept for the next render, unless another session holds the row (a fold takes its stores' store_state rows,
      -- which render holds, before novelty_state: it does not; this render does not wait for one that would): the
      -- next render adds the postings from the last pair kept
      IF v_changed IS NOT NULL THEN
        PERFORM FROM storetopics.novelty_state s WHERE s.source_id = p_source AND s.store_key = p_store
          FOR NO KEY UPDATE SKIP LOCKED;
        IF FOUND THEN
          UPDATE storetopics.novelty_state s
             SET rare_moved = v_rare, rare_moved_by = v_rare_moves, file_moves_ns = v_ns, file_moves = v_ns_moves
           WHERE s.source_id = p_source AND s.store_key = p_store;
        END IF;
      END IF;
      v_file_moves := array_fill(0::bigint, ARRAY[greatest(k.numbered, 1)]);
      FOR i IN 1..coalesce(cardinality(v_ns), 0) LOOP
        v_file_moves[v_ns[i]] := v_ns_moves[i];
      END LOOP;
      -- A ranked file they moved by at most w / 8 per counted word stays in the ranking, its bounds moved by that
      -- exactly, its mid within w + w / 8 (most of them: a rare term in one more file moves a long file by little);
      -- the others are taken out and looked at.
      -- (the words by number from a variable: a field of the row, a parameter of a generic plan, was read whole at
      -- each lookup, 1-2 s a render from the sixth on at 100k realistic chunks)
      v_words := k.words;
      v_moved := ARRAY(SELECT x.n FROM unnest(v_ns, v_ns_moves) AS x(n, move)
                        WHERE x.n <= k.ranked AND abs(x.move)::float8 / 1e9 / v_words[x.n] > v_w / 8
                        ORDER BY 1);
      v_w := v_w + v_w / 8 + 1e-12;
    END IF;
    -- out of the ranking: the files folded since (gone) and those the rare terms moved much, which are looked at
    v_x := ARRAY(SELECT g FROM unnest(k.gone) g WHERE g <= k.ranked UNION SELECT i FROM unnest(v_moved) i ORDER BY 1);
    v_kn := k.ranked - cardinality(v_x);
    IF to_regclass('pg_temp.storetopics_nov') IS NOT NULL THEN DROP TABLE pg_temp.storetopics_nov; END IF;
    CREATE TEMP TABLE storetopics_nov (rk bigint UNIQUE, file_key text, lo float8, hi float8, apart boolean,
                                       far boolean, total bigint, words bigint) ON COMMIT DROP;
    -- the kept files the rare terms moved (their bounds with that move), and the files folded since (exact)
    INSERT INTO pg_temp.storetopics_nov
    SELECT NULL, f.file_key,
           storetopics._kept_bound(v_ln, f.total + v_file_moves[f.n], f.words, f.sensitivity, v_most, v_ratio, false),
           storetopics._kept_bound(v_ln, f.total + v_file_moves[f.n], f.words, f.sensitivity, v_most, v_ratio, true),
           f.apart, f.far, f.total, f.words
      FROM storetopics.file_novelty f
     WHERE f.source_id = p_source AND f.store_key = p_store AND f.words > 0
       AND f.n = ANY (ARRAY(SELECT i FROM unnest(v_moved) i EXCEPT SELECT g FROM unnest(k.gone) g));
    IF cardinality(v_new) > 0 THEN
      INSERT INTO pg_temp.storetopics_nov
      SELECT NULL, s.file_key, storetopics._novelty(v_ln, s.total, s.words),
             storetopics._novelty(v_ln, s.total, s.words), s.apart, s.far, s.total, s.words
        FROM storetopics._novelty_sums(p_source, p_store, v_new, v_dfs) s WHERE s.words > 0;
    END IF;
    v_e := (SELECT count(*) FROM pg_temp.storetopics_nov);
    v_m := v_kn + v_e;
    IF v_m = 0 THEN
      DROP TABLE pg_temp.storetopics_nov;
      RETURN;
    END IF;
    -- The median, then the MAD (the median of the distances to it), as percentile_cont takes them: the r1-th and
    -- r2-th smallest values, interpolated.  The r1-th smallest value is at least the r1-th smallest lower bound
    -- (v_l), the r2-th at most the r2-th smallest upper bound (v_h): the files whose bounds reach into [v_l, v_h]
    -- are made exact, those wholly below are counted, and the two values are read off the exact ones between.
    -- Of the ranked files, only those whose mid is within 2 w of [the (r1 - e)-th mid - w, the r2-th mid + w] can
    -- reach into it (adding e files moves an order statistic by at most e ranks); those below are counted.
    r1 := floor(0.5 * (v_m - 1))::bigint + 1;
    r2 := ceil(0.5 * (v_m - 1))::bigint + 1;
    v_mid1 := CASE WHEN r1 - v_e >= 1 THEN storetopics._kept_mid(p_source, p_store, v_x, r1 - v_e, v_ln) END;
    v_mid2 := CASE WHEN r2 <= v_kn THEN storetopics._kept_mid(p_source, p_store, v_x, r2, v_ln) END;
    v_lo := CASE WHEN v_mid1 IS NOT NULL
                 THEN storetopics._kept_below(p_source, p_store, v_x, v_kn, v_ln, v_mid1 - 2 * v_w, false) + 1
                 ELSE 1 END;
    v_hi := CASE WHEN v_mid2 IS NOT NULL
                 THEN storetopics._kept_below(p_source, p_store, v_x, v_kn, v_ln, v_mid2 + 2 * v_w, true)
                 ELSE v_kn END;
    -- Up to three passes, each only when the one before did not decide: first from a few probes of the ranking
    -- alone (the median within [the (r1 - e)-th mid - w, the r2-th mid + w], the MAD likewise from the distances of
    -- the mids to the middle of that, w grown by half its width); then from the bounds of the files near each order
    -- statistic, read into the table (each statistic within the r1-th smallest lower bound and the r2-th smallest
    -- upper bound); last with the files that straddle those made exact, and the median and the MAD with them.
    -- (Uploads piled up since a keep widen the bounds, and with them the files the median and the MAD would make
    -- exact; the first three are seldom near the bar.)
    v_rekeep := false;
    v_worn := false;
    FOR pass IN 1..3 LOOP
      v_passes := pass;
      v_exact := pass = 3;
      IF pass = 1 THEN
        CONTINUE WHEN v_mid1 IS NULL OR v_mid2 IS NULL;
        v_med_lo := v_mid1 - v_w;
        v_med_hi := v_mid2 + v_w;
        v_c := v_med_lo + (v_med_hi - v_med_lo) / 2;
        v_wc := v_w + ((v_med_hi - v_med_lo) / 2 + 1e-12);
        v_mad_lo := greatest(storetopics._kept_distance(p_source, p_store, v_x, v_kn, v_ln, v_c, r1 - v_e) - v_wc,
                             0);
        v_mad_hi := storetopics._kept_distance(p_source, p_store, v_x, v_kn, v_ln, v_c, r2) + v_wc;
      ELSE
        IF pass = 2 THEN
          INSERT INTO pg_temp.storetopics_nov
          SELECT * FROM storetopics._kept_ranked(p_source, p_store, v_x, v_lo, v_hi, v_ln, v_most, v_ratio,
                                                 v_file_moves)
          ON CONFLICT (rk) DO NOTHING;
          v_lo1 := v_lo; v_hi1 := v_hi;
          SELECT (SELECT v.lo FROM pg_temp.storetopics_nov v WHERE v.rk IS NULL OR v.rk BETWEEN v_lo AND v_hi
                   ORDER BY 1 OFFSET r1 - v_lo LIMIT 1),
                 (SELECT v.hi FROM pg_temp.storetopics_nov v WHERE v.rk IS NULL OR v.rk BETWEEN v_lo AND v_hi
                   ORDER BY 1 OFFSET r2 - v_lo LIMIT 1)
            INTO v_l1, v_h1;
          -- (the bounds leave many files to make exact, a tenth of them: made exact here, and the state is worn,
          -- kept again after the render by the pass, else by the next render; twice as many: kept again now, once)
          v_straddle := (SELECT count(*) FROM pg_temp.storetopics_nov v
                          WHERE (v.rk IS NULL OR v.rk BETWEEN v_lo AND v_hi) AND v.lo < v.hi
                            AND v.hi >= v_l1 AND v.lo <= v_h1);
          v_worn := v_straddle > greatest(100, v_m / 10);
          v_rekeep := attempt = 1 AND v_straddle > 2 * greatest(100, v_m / 10);
          EXIT WHEN v_rekeep;
        END IF;
        v_lo := v_lo1; v_hi := v_hi1; v_l := v_l1; v_h := v_h1; v_in1 := v_lo1 - 1; v_in2 := v_lo1 - 1;
        v_alo := NULL; v_ahi := NULL;
        FOR stage IN 1..2 LOOP
          IF stage = 2 THEN
            -- Of the ranked files, only those whose distance to the median is within 2 w of [the (r1 - e)-th distance
            -- of the mids - w, the r2-th + w]: those nearer the median (ranks v_in1 + 1 .. v_in2) are counted below.
            -- A median known within an interval moves each distance by at most half its width: w grows by that, the
            -- distances are to its middle.
            v_alo := v_med_lo; v_ahi := v_med_hi;
            v_c := v_med_lo + (v_med_hi - v_med_lo) / 2;
            v_wc := v_w + ((v_med_hi - v_med_lo) / 2 + 1e-12);
            v_l := CASE WHEN r1 - v_e >= 1
                        THEN storetopics._kept_distance(p_source, p_store, v_x, v_kn, v_ln, v_c, r1 - v_e)
                             - 2 * v_wc END;
            v_h := CASE WHEN r2 <= v_kn
                        THEN storetopics._kept_distance(p_source, p_store, v_x, v_kn, v_ln, v_c, r2) + 2 * v_wc END;
            v_in1 := CASE WHEN v_l > 0 THEN storetopics._kept_below(p_source, p_store, v_x, v_kn, v_ln, v_c - v_l, true)
                          ELSE 0 END;
            v_in2 := CASE WHEN v_l > 0
                          THEN storetopics._kept_below(p_source, p_store, v_x, v_kn, v_ln, v_c + v_l, false)
                          ELSE 0 END;
            v_lo := CASE WHEN v_h IS NULL THEN 1
                         ELSE storetopics._kept_below(p_source, p_store, v_x, v_kn, v_ln, v_c - v_h, false) + 1 END;
            v_hi := CASE WHEN v_h IS NULL THEN v_kn
                         ELSE storetopics._kept_below(p_source, p_store, v_x, v_kn, v_ln, v_c + v_h, true) END;
            INSERT INTO pg_temp.storetopics_nov
            SELECT * FROM storetopics._kept_ranked(p_source, p_store, v_x, v_lo, v_in1, v_ln, v_most, v_ratio,
                                                   v_file_moves)
            UNION ALL
            SELECT * FROM storetopics._kept_ranked(p_source, p_store, v_x, greatest(v_in2 + 1, v_lo), v_hi, v_ln,
                                                   v_most, v_ratio, v_file_moves)
            ON CONFLICT (rk) DO NOTHING;
            v_below := greatest(v_in2 - v_in1, 0);
            SELECT (SELECT storetopics._novelty_bound(v.lo, v.hi, v_alo, v_ahi, false) FROM pg_temp.storetopics_nov v
                     WHERE v.rk IS NULL OR (v.rk BETWEEN v_lo AND v_hi AND v.rk NOT BETWEEN v_in1 + 1 AND v_in2)
                     ORDER BY 1 OFFSET r1 - v_below - 1 LIMIT 1),
                   (SELECT storetopics._novelty_bound(v.lo, v.hi, v_alo, v_ahi, true) FROM pg_temp.storetopics_nov v
                     WHERE v.rk IS NULL OR (v.rk BETWEEN v_lo AND v_hi AND v.rk NOT BETWEEN v_in1 + 1 AND v_in2)
                     ORDER BY 1 OFFSET r2 - v_below - 1 LIMIT 1)
              INTO v_l, v_h;
          ELSE
            v_below := v_lo - 1;
          END IF;
          -- [v_l, v_h]: the r1-th smallest lower bound and the r2-th smallest upper bound, so the statistic lies in it
          -- (percentile_cont interpolates between the r1-th and r2-th values); exact, the files that straddle it
          IF v_exact THEN
            UPDATE pg_temp.storetopics_nov v SET lo = storetopics._novelty(v_ln, v.total + x.moved, v.words),
                                                 hi = storetopics._novelty(v_ln, v.total + x.moved, v.words)
              FROM storetopics._novelty_moved(p_source, p_store, ARRAY(
                     SELECT w.file_key FROM pg_temp.storetopics_nov w
                      WHERE w.lo < w.hi AND storetopics._novelty_bound(w.lo, w.hi, v_alo, v_ahi, true) >= v_l
                        AND storetopics._novelty_bound(w.lo, w.hi, v_alo, v_ahi, false) <= v_h), v_moves) x
             WHERE v.file_key = x.file_key;
            v_below := v_below + (SELECT count(*) FROM pg_temp.storetopics_nov v
                                   WHERE (v.rk IS NULL OR (v.rk BETWEEN v_lo AND v_hi
                                                           AND v.rk NOT BETWEEN v_in1 + 1 AND v_in2))
                                     AND storetopics._novelty_bound(v.lo, v.hi, v_alo, v_ahi, true) < v_l);
            SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY b.x) INTO v_l
              FROM (SELECT storetopics._novelty_bound(v.lo, v.hi, v_alo, v_ahi, false) AS x
                      FROM pg_temp.storetopics_nov v
                     WHERE storetopics._novelty_bound(v.lo, v.hi, v_alo, v_ahi, true) >= v_l
                       AND storetopics._novelty_bound(v.lo, v.hi, v_alo, v_ahi, false) <= v_h
                     ORDER BY 1 OFFSET r1 - v_below - 1 LIMIT r2 - r1 + 1) b;
            v_h := v_l;
          END IF;
          IF stage = 1 THEN
            v_med_lo := v_l; v_med_hi := v_h;
          ELSE
            v_mad_lo := v_l; v_mad_hi := v_h;
          END IF;
        END LOOP;
      END IF;
      RAISE DEBUG 'storetopics: store %, pass %: median in [%, %], MAD in [%, %]', p_store, pass, v_med_lo,
        v_med_hi, v_mad_lo, v_mad_hi;
      -- The files that pass for sure (lower bound, the median and the MAD at their highest) rank below the third
      -- best of them for sure, unless better: of the others, only those that may pass (upper bound, the median and
      -- the MAD at their lowest) and may rank among the first three are made exact.  Decided when every file that
      -- may pass but need not ranks below the third that pass for sure (always, with the median and the MAD
      -- exact).  The files that may pass (a mid within w of the lowest novelty that may pass its test, which is
      -- monotone) are added only as far as they may rank among the first three: those found apart or far apart,
      -- each against its own bar, and the three best ranked files give a first third that passes for sure; the
      -- other ranked files only down to it.
      -- (the bars of the three tests at their lowest, less 2 w: the first rank and number of a ranked file above)
      FOR i IN 1..3 LOOP
        v_rank[i] := storetopics._kept_below(p_source, p_store, v_x, v_kn, v_ln,
                                             v_med_lo + (ARRAY[3.5, 2.5, 1.0])[i] * (1.4826 * v_mad_lo + 1e-9)
                                                        * (1 - 1e-12) - 2 * v_w, false) + 1;
        v_first[i] := CASE WHEN v_rank[i] <= v_kn THEN storetopics._kept_number(v_x, v_rank[i])
                           ELSE k.ranked + 1 END;
      END LOOP;
      -- the files found apart or far apart (by their own index: few), and the three best ranked files
      INSERT INTO pg_temp.storetopics_nov
      SELECT f.n - storetopics._count_le(v_x, f.n), f.file_key,
             storetopics._kept_bound(v_ln, f.total + coalesce(v_file_moves[f.n], 0), f.words, f.sensitivity, v_most,
                                     v_ratio, false),
             storetopics._kept_bound(v_ln, f.total + coalesce(v_file_moves[f.n], 0), f.words, f.sensitivity, v_most,
                                     v_ratio, true),
             f.apart, f.far, f.total, f.words
        FROM storetopics.file_novelty f
       WHERE f.source_id = p_source AND f.store_key = p_store AND (f.apart OR f.far)
         AND f.n BETWEEN least(v_first[2], v_first[3]) AND k.ranked
         AND f.n >= CASE WHEN f.far THEN v_first[3] ELSE v_first[2] END AND f.n <> ALL (v_x)
      ON CONFLICT (rk) DO NOTHING;
      INSERT INTO pg_temp.storetopics_nov
      SELECT * FROM storetopics._kept_ranked(p_source, p_store, v_x, greatest(v_rank[1], v_kn - 2), v_kn, v_ln,
                                             v_most, v_ratio, v_file_moves)
      ON CONFLICT (rk) DO NOTHING;
      SELECT v.apart, v.lo INTO v_s_apart, v_s_lo FROM pg_temp.storetopics_nov v
       WHERE storetopics._novel(v.lo, v.apart, v.far, v_med_hi, v_mad_hi)
       ORDER BY v.apart DESC, v.lo DESC OFFSET 2 LIMIT 1;
      -- the other ranked files that may pass and may rank above the third that pass for sure (none, when that one
      -- was found apart: they were added above)
      IF v_s_lo IS NULL OR NOT v_s_apart THEN
        INSERT INTO pg_temp.storetopics_nov
        SELECT * FROM storetopics._kept_ranked(p_source, p_store, v_x,
                        greatest(v_rank[1], CASE WHEN v_s_lo IS NULL THEN 1
                                                 ELSE storetopics._kept_below(p_source, p_store, v_x, v_kn, v_ln,
                                                                              v_s_lo - 2 * v_w, false) + 1 END),
                        v_kn, v_ln, v_most, v_ratio, v_file_moves)
        ON CONFLICT (rk) DO NOTHING;
        SELECT v.apart, v.lo INTO v_s_apart, v_s_lo FROM pg_temp.storetopics_nov v
         WHERE storetopics._novel(v.lo, v.apart, v.far, v_med_hi, v_mad_hi)
         ORDER BY v.apart DESC, v.lo DESC OFFSET 2 LIMIT 1;
      END IF;
      UPDATE pg_temp.storetopics_nov v SET lo = storetopics._novelty(v_ln, v.total + m.moved, v.words),
                                           hi = storetopics._novelty(v_ln, v.total + m.moved, v.words)
        FROM storetopics._novelty_moved(p_source, p_store, ARRAY(
               SELECT u.file_key FROM pg_temp.storetopics_nov u
                WHERE u.lo < u.hi AND storetopics._novel(u.hi, u.apart, u.far, v_med_lo, v_mad_lo)
                  AND (v_s_lo IS NULL
                       OR NOT ((v_s_apart AND NOT u.apart) OR (v_s_apart = u.apart AND u.hi < v_s_lo)))),
               v_moves) m
       WHERE v.file_key = m.file_key;
      SELECT v.apart, v.lo INTO v_s_apart, v_s_lo FROM pg_temp.storetopics_nov v
       WHERE storetopics._novel(v.lo, v.apart, v.far, v_med_hi, v_mad_hi)
       ORDER BY v.apart DESC, v.lo DESC OFFSET 2 LIMIT 1;
      EXIT WHEN v_exact OR NOT EXISTS (
        SELECT FROM pg_temp.storetopics_nov u
         WHERE storetopics._novel(u.hi, u.apart, u.far, v_med_lo, v_mad_lo)
           AND NOT storetopics._novel(u.lo, u.apart, u.far, v_med_hi, v_mad_hi)
           AND (v_s_lo IS NULL OR NOT ((v_s_apart AND NOT u.apart) OR (v_s_apart = u.apart AND u.hi < v_s_lo))));
    END LOOP;
    EXIT WHEN NOT v_rekeep;
  END LOOP;
  RAISE DEBUG 'storetopics: the outlier files of store %, pass %, % out of the kept ranking, looked at % of its % '
              'files', p_store, v_passes, v_e, (SELECT count(*) FROM pg_temp.storetopics_nov), v_m;
  -- The wear: the uploads piled up since the keep widen the bounds, and more files are looked at, then a second pass
  -- reads the bounds of many (bench/README.md).  What this call took beyond the first call after the keep is its
  -- wear (storetopics._novelty_worn says when the state is worn; so do many files to make exact, above).  Unless
  -- another session holds the row.
  PERFORM FROM storetopics.novelty_state s WHERE s.source_id = p_source AND s.store_key = p_store
    FOR NO KEY UPDATE SKIP LOCKED;
  IF FOUND THEN
    UPDATE storetopics.novelty_state s
       SET first_ms = CASE WHEN x.first THEN x.ms ELSE s.first_ms END,
           wear_ms = CASE WHEN x.first THEN 0 ELSE s.wear_ms + least(x.wear, s.last_wear_ms) END,
           wear_calls = CASE WHEN x.first THEN 0 ELSE s.wear_calls + 1 END,
           last_wear_ms = CASE WHEN x.first THEN 0 ELSE x.wear END,
           worn = v_worn OR NOT x.first AND storetopics._novelty_worn(s.wear_calls + 1,
                                                                         s.wear_ms + least(x.wear, s.last_wear_ms),
                                                                         x.wear, s.last_wear_ms, s.keep_ms)
      FROM (SELECT v_kept OR k.first_ms IS NULL AS first, y.ms, greatest(y.ms - k.first_ms, 0) AS wear
              FROM (SELECT 1000 * extract(epoch FROM clock_timestamp() - v_t0)::float8 AS ms) y) x
     WHERE s.source_id = p_source AND s.store_key = p_store;
  END IF;
  -- (the others rank below those three, exact, whatever their bounds)
  -- (after a keep, what it kept; else what it kept then, moved to now by storetopics._novelty_moves)
  v_dfs := coalesce(v_dfs, k.dfs);
  RETURN QUERY
    SELECT o.r, o.file_key, o.lo, CASE WHEN o.r = 1 THEN v_dfs END
      FROM (SELECT (row_number() OVER (ORDER BY v.apart DESC, v.lo DESC, v.file_key))::int AS r, v.file_key, v.lo
              FROM pg_temp.storetopics_nov v
             WHERE storetopics._novel(v.lo, v.apart, v.far, v_med_hi, v_mad_hi)
             ORDER BY v.apart DESC, v.lo DESC, v.file_key LIMIT 3) o
     ORDER BY 1;
  DROP TABLE pg_temp.storetopics_nov;
END $$;

-- Keep a store's novelty again if it is worn (novelty_state.worn, storetopics._outlier_files): the worker calls it
-- after a pass's render, so that the next render after an upload does not pay for the keep.  The store's row taken
-- as render takes it (a fold of its source waits, as for a render); held by another session: left to it.  Returns
-- whether it kept.
CREATE OR REPLACE FUNCTION storetopics._keep_worn(p_source int, p_store text) RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  PERFORM FROM storetopics.store_state s WHERE s.source_id = p_source AND s.store_key = p_store
    FOR UPDATE SKIP LOCKED;
  IF NOT FOUND OR NOT EXISTS (SELECT FROM storetopics.novelty_state k
                               WHERE k.source_id = p_source AND k.store_key = p_store AND k.worn) THEN
    RETURN false;
  END IF;
  PERFORM storetopics._keep_novelty(p_source, p_store);
  RETURN true;
END $$;

COMMENT ON FUNCTION storetopics._keep_worn(int, text) IS
  'For the worker: keep a store''s file novelty again once the uploads piled up since make renders dearer than a keep.';
