-- ------------------------------------------------------------------------------------------------------------
-- Keyword lists and the rendered summary
-- ------------------------------------------------------------------------------------------------------------
-- Whether a word is written in Latin letters (ASCII, Latin-1 and Latin Extended-A/B): _script's first test, and all
-- _noise asks of a word in a store written in Latin letters.  (Bound when created and inlined, as _script.)
CREATE OR REPLACE FUNCTION storetopics._latin(w text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN w COLLATE "C" ~ '^[\x01-\x7f\u00c0-\u024f]*$';

-- The script of a word's letters: what a store's terms are written in, so that a word in another (a translation's,
-- a name's) is not shown as what the store holds.  (No SET search_path and not STRICT: a SQL-standard body is bound
-- when it is created, and so the planner inlines it into _noise, which runs per term tested.)  _noise asks a store
-- written in Latin letters only whether a word is: one regular expression, not seven (see _letters_az for why).
CREATE OR REPLACE FUNCTION storetopics._script(w text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE WHEN w IS NULL THEN NULL
            WHEN storetopics._latin(w) THEN 'latin'
            WHEN w COLLATE "C" ~ '[\u0400-\u04ff]' THEN 'cyrillic'
            WHEN w COLLATE "C" ~ '[\u0370-\u03ff]' THEN 'greek'
            WHEN w COLLATE "C" ~ '[\u0590-\u05ff]' THEN 'hebrew'
            WHEN w COLLATE "C" ~ '[\u0600-\u06ff]' THEN 'arabic'
            WHEN w COLLATE "C" ~ '[\u0900-\u0dff]' THEN 'indic'
            WHEN w COLLATE "C" ~ '[\u3040-\u30ff\u3400-\u9fff\uac00-\ud7af]' THEN 'cjk'
            ELSE 'other' END;

-- Page chrome: a word or phrase said about once in nearly every one (90%) of at least 8 files (of_files: those it
-- was counted in) of a store of long documents (300 counted words a file or more): a site's header or footer.  In
-- long documents what they are about comes back; in short ones (package descriptions, notes, records) a word said
-- once in each may be the theme.  (No SET: the planner inlines it into its callers.)
CREATE OR REPLACE FUNCTION storetopics._page_chrome(files bigint, total bigint, of_files bigint, store_files bigint,
                                                    store_words bigint) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN of_files >= 8 AND files >= 0.9 * of_files AND total <= 1.5 * files AND store_words >= 300 * store_files;

-- Why a term of a store is noise, not news of what the store holds (NULL: it is not), from its counts there (files
-- holding it, its total and sum of squared counts per file) and the store's files:
--   boilerplate  in a store of long documents (300 counted words a file or more), in many of its files the same
--                number of times (navigation, headers and footers a page converter leaves in: "sitemap",
--                "copyright", glued links such as "contentsnext"): at least 8 files of 10 or more, in 30% of them
--                with a count that hardly varies (variance at most a tenth of its square, mean at most 3), or page
--                chrome (storetopics._page_chrome: in 90% of them about once each);
--   navigation   previous/next and the words of page chrome, alone or glued to a word ("nextchapter", "menuprev"),
--                and a language selector's locale codes ("zh-cn", "pt-br": "Available Languages: de | en | zh-cn");
--   date         month and weekday names and their abbreviations (changelogs, release notes: "Fri, 03 Mar"; a
--                store about the sun or SAT solvers loses those words from its lists, its other words stay);
--   fragment     the second half of a word a line break hyphenated ("tions", "ment"), where the text did not join it;
--   script       letters of another script than the store's own (script: of most of its terms).
-- (No SET search_path: a SQL-standard body is bound when it is created, and without SET the planner inlines it
-- where it runs per word: the phrase miner's test of ~20k words, 0.53 -> 0.12 s at 10k realistic chunks.  Word
-- lists and string functions, not regular expressions, and a store in Latin letters asks only whether a word is in
-- them: see storetopics._letters_az.)
CREATE OR REPLACE FUNCTION storetopics._noise(lexeme text, files bigint, total bigint, total_sq bigint,
                                              store_files bigint, store_words bigint, script text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE
  WHEN store_files >= 10
       AND (files >= 8 AND store_words >= 300 * store_files AND files >= 0.3 * store_files
            AND total::float8 / files <= 3
            AND total_sq::float8 / files - (total::float8 / files) ^ 2 <= 0.1 * (total::float8 / files) ^ 2
            OR storetopics._page_chrome(files, total, store_files, store_files, store_words)) THEN 'boilerplate'
  WHEN lexeme COLLATE "C" IN ('prev', 'previous', 'next', 'toc', 'sitemap', 'breadcrumb', 'navbar', 'permalink')
       OR length(lexeme) >= 7 AND storetopics._letters_az(lexeme)
          AND (left(lexeme, 4) COLLATE "C" IN ('prev', 'next') OR strpos(substr(lexeme, 4) COLLATE "C", 'prev') > 0
               OR strpos(substr(lexeme, 4) COLLATE "C", 'next') > 0)
          AND left(lexeme, 7) COLLATE "C" NOT IN ('prevent', 'preview', 'prevail')
          AND left(lexeme, 8) COLLATE "C" <> 'prevalen'
       OR length(lexeme) = 5 AND substr(lexeme, 3, 1) COLLATE "C" = '-' AND storetopics._letters_az(right(lexeme, 2))
          AND left(lexeme, 2) COLLATE "C" IN ('zh', 'pt', 'en', 'es', 'fr', 'de', 'ja', 'ko', 'ru', 'it', 'nl', 'sv',
                                              'pl', 'tr', 'da', 'fi', 'nb', 'nn', 'cs', 'hu', 'ro', 'uk', 'el', 'he',
                                              'ar', 'id', 'vi', 'th') THEN 'navigation'
  WHEN lexeme COLLATE "C" IN ('jan', 'feb', 'mar', 'apr', 'jun', 'jul', 'aug', 'sep', 'sept', 'oct', 'nov', 'dec',
                              'januari', 'februari', 'march', 'april', 'june', 'juli', 'august', 'septemb', 'octob',
                              'novemb', 'decemb', 'mon', 'tue', 'tues', 'wed', 'thu', 'thur', 'thurs', 'fri', 'sat',
                              'sun', 'monday', 'tuesday', 'wednesday', 'thursday', 'friday', 'saturday', 'sunday')
       THEN 'date'
  WHEN lexeme COLLATE "C" IN ('tion', 'ation', 'ment', 'ing', 'anc', 'enc', 'ness', 'iti', 'abl', 'ibl', 'ous')
       THEN 'fragment'
  WHEN CASE WHEN script = 'latin' THEN NOT storetopics._latin(lexeme)
            ELSE storetopics._script(lexeme) <> script END THEN 'script'
END;

-- The script most of a store's terms are written in (of its 200 terms in the most files).
CREATE OR REPLACE FUNCTION storetopics._store_script(p_source int, p_store text) RETURNS text
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  h record;
  v_top int[];
  v_least int;
BEGIN
  -- the 200 first from the head kept with the store's novelty and the terms touched since (storetopics._kept_head),
  -- when no other term can rank among them: the head held every term, or the 200th has more files than its cut
  SELECT * INTO h FROM storetopics._kept_head(p_source, p_store, 'files');
  IF h.ids IS NOT NULL THEN
    SELECT array_agg(u.id), CASE WHEN count(*) = 200 THEN min(u.f) END INTO v_top, v_least
      FROM (SELECT u.id, u.f FROM unnest(h.ids, h.files) AS u(id, f) ORDER BY u.f DESC, u.id LIMIT 200) u;
  END IF;
  IF h.ids IS NULL OR h.cut IS NOT NULL AND NOT coalesce(v_least > h.cut, false) THEN
    v_top := ARRAY(SELECT t.term_id FROM storetopics.store_terms t
                    WHERE t.source_id = p_source AND t.store_key = p_store
                    ORDER BY t.files DESC, t.term_id LIMIT 200);
  END IF;
  RETURN coalesce((SELECT mode() WITHIN GROUP (ORDER BY storetopics._script(x.lexeme))
                     FROM storetopics.lexemes x WHERE x.id = ANY (v_top)), 'latin');
END $$;

-- The head of a ranking of a store's terms, for the bounded sorts of _keywords and _contrast_terms: of the terms
-- given (ids, scores and counts by position: the m best of the store by score), those that score more than `cut`
-- (NULL: every term was given), named, ranked by (score, lexeme), then tested in that order (showable, not noise in
-- the store, not `excluded`) until n pass.  i: a term's position in the arrays given.
CREATE OR REPLACE FUNCTION storetopics._term_head(ids int[], scores float8[], files int[], totals bigint[],
                                                  totals_sq bigint[], cut float8, n int, excluded text[],
                                                  store_files float8, store_words bigint, script text)
RETURNS TABLE (i int, lexeme text, score float8)
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
  SELECT d.i, d.lexeme, d.score
    FROM (SELECT u.i::int AS i, l.lexeme, u.score, u.files, u.total, u.total_sq
            FROM unnest(ids, scores, files, totals, totals_sq) WITH ORDINALITY AS u(term_id, score, files, total,
                                                                                   total_sq, i)
            JOIN storetopics.lexemes l ON l.id = u.term_id
           WHERE cut IS NULL OR u.score > cut
           ORDER BY u.score DESC, l.lexeme OFFSET 0) d   -- (OFFSET 0 keeps the tests above the sort)
   WHERE storetopics._showable_term(d.lexeme)
     AND storetopics._noise(d.lexeme, d.files, d.total, d.total_sq, store_files::bigint, store_words, script) IS NULL
     AND d.lexeme <> ALL (coalesce(excluded, '{}'))
   ORDER BY d.score DESC, d.lexeme
   LIMIT n;
END;

-- The 10 best terms of each of a store's outlier files (p_files, their leads in p_leads) by count x IDF in the store,
-- ties by lexeme, of those a reader may be shown (showable, no noise in the store, in fewer than all its files), with
-- their rank and whether the file's lead (its first 20 words) says them: what _keywords picks an outlier file's words
-- from.  Only the p_k best of a file by score are named and tested (a bounded sort): its other terms score less than
-- each of those, so when 10 pass there, they are its 10 best; a file where fewer pass has its other terms tested too.
-- (A long page has thousands of terms: named and tested all, they took most of a render after an upload.)
-- p_dfs: the files of each term of the store now, by term id (what storetopics._outlier_files read them from), so
-- that a file's terms are ranked without a look-up each; a term it has no count for (NULL, or none: 0) is looked up
-- in store_terms, as every term is when p_dfs is NULL.  Only the terms that are named are looked up for their counts.
DO $$ BEGIN   -- (0.2 before p_dfs)
  IF to_regprocedure('storetopics._outlier_terms(int, text, text[], text[], float8, bigint, text, regconfig, int)')
     IS NOT NULL THEN
    DROP FUNCTION storetopics._outlier_terms(int, text, text[], text[], float8, bigint, text, regconfig, int);
  END IF;
END $$;
CREATE OR REPLACE FUNCTION storetopics._outlier_terms(p_source int, p_store text, p_files text[], p_leads text[],
                                                      p_n float8, p_words bigint, p_script text, p_cfg regconfig,
                                                      p_k int DEFAULT 20, p_dfs int[] DEFAULT NULL)
RETURNS TABLE (file_key text, lexeme text, score float8, files int, total bigint, r bigint, lead boolean)
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
  WITH t AS MATERIALIZED (
    SELECT u.file_key, u.term_id, u.n * ln(p_n / u.files) AS score
      FROM (SELECT u.file_key, u.term_id, u.n,
                   -- (probed per term: joined on statistics that had not seen the store, the store's every term was
                   -- read against the files' terms; see storetopics._novelty_moves)
                   coalesce(nullif(p_dfs[u.term_id], 0),
                            (SELECT s.files FROM storetopics.store_terms s
                              WHERE s.source_id = p_source AND s.store_key = p_store AND s.term_id = u.term_id))
                     AS files
              FROM (SELECT f.file_key, unnest(f.term_ids) AS term_id, unnest(f.counts) AS n
                      FROM storetopics.file_terms f
                     WHERE f.source_id = p_source AND f.store_key = p_store
                       AND md5(f.file_key)::uuid = ANY (ARRAY(SELECT md5(x)::uuid FROM unnest(p_files) x))
                       AND f.file_key = ANY (p_files)) u) u
     WHERE ln(p_n / u.files) > 0
  ), cut AS MATERIALIZED (   -- each file's p_k-th score (NULL: it has no more terms), by a bounded sort
    SELECT f.file_key, (SELECT t.score FROM t WHERE t.file_key = f.file_key ORDER BY t.score DESC
                         OFFSET p_k - 1 LIMIT 1) AS kth
      FROM (SELECT DISTINCT x AS file_key FROM unnest(p_files) x) f
  ), head AS MATERIALIZED (
    SELECT t.file_key, l.lexeme, t.score, s.files, s.total
      FROM (SELECT t.* FROM t JOIN cut c ON c.file_key = t.file_key
             WHERE c.kth IS NULL OR t.score >= c.kth OFFSET 0) t   -- (OFFSET 0: the tests after the cut)
      JOIN storetopics.lexemes l ON l.id = t.term_id
      CROSS JOIN LATERAL (SELECT s.files, s.total, s.total_sq FROM storetopics.store_terms s
                           WHERE s.source_id = p_source AND s.store_key = p_store AND s.term_id = t.term_id
                          OFFSET 0) s
     WHERE storetopics._showable_term(l.lexeme)
       AND storetopics._noise(l.lexeme, s.files, s.total, s.total_sq, p_n::bigint, p_words, p_script) IS NULL
  ), short AS (   -- the files where fewer than 10 passed, and that have more terms
    SELECT c.file_key, c.kth FROM cut c
     WHERE c.kth IS NOT NULL AND (SELECT count(*) FROM head h WHERE h.file_key = c.file_key) < 10
  ), rest AS (   -- their other terms
    SELECT t.file_key, l.lexeme, t.score, s.files, s.total
      FROM (SELECT t.* FROM t JOIN short c ON c.file_key = t.file_key WHERE t.score < c.kth OFFSET 0) t
      JOIN storetopics.lexemes l ON l.id = t.term_id
      CROSS JOIN LATERAL (SELECT s.files, s.total, s.total_sq FROM storetopics.store_terms s
                           WHERE s.source_id = p_source AND s.store_key = p_store AND s.term_id = t.term_id
                          OFFSET 0) s
     WHERE storetopics._showable_term(l.lexeme)
       AND storetopics._noise(l.lexeme, s.files, s.total, s.total_sq, p_n::bigint, p_words, p_script) IS NULL
  )
  SELECT x.file_key, x.lexeme, x.score, x.files, x.total, x.r, coalesce(x.lexeme = ANY (o.lead), false)
    FROM (SELECT x.*, row_number() OVER (PARTITION BY x.file_key ORDER BY x.score DESC, x.lexeme) AS r
            FROM (SELECT * FROM head UNION ALL SELECT * FROM rest) x) x
    -- (each lead's words made once)
    JOIN (SELECT o.file_key, tsvector_to_array(to_tsvector(p_cfg, array_to_string(
                   (regexp_split_to_array(btrim(o.lead), '\s+'))[1:20], ' '))) AS lead
            FROM unnest(p_files, p_leads) AS o(file_key, lead) OFFSET 0) o ON o.file_key = x.file_key
   WHERE x.r <= 10;
END;

DO $$ BEGIN   -- (0.2 before outlier_leads, then before outlier_dfs)
  IF to_regprocedure('storetopics._keywords(int, text, text[], float8[], int, int, text)') IS NOT NULL THEN
    DROP FUNCTION storetopics._keywords(int, text, text[], float8[], int, int, text);
  END IF;
  IF to_regprocedure('storetopics._keywords(int, text, text[], float8[], int, int, text, text[])') IS NOT NULL THEN
    DROP FUNCTION storetopics._keywords(int, text, text[], float8[], int, int, text, text[]);
  END IF;
END $$;

-- Two ranked lists per store, both computed from the exact counts, deterministic (ties broken by term):
--   dominant:    by total count (what the store is mostly about);
--   distinctive: what is dense and rare.  Two sources, in this order:
--     * outlier files: a file's novelty is the mean IDF of its counted words.  Files whose novelty stands out from the
--       store's own distribution (robust z-score >= 3.5) give their top terms by count x IDF.  This is how one football
--       file among 100k renovation files surfaces: ranked per file, not on store-wide sums.  A file the clustering also
--       finds apart (every chunk beyond its nearest cluster's radius) needs only z >= 2.5: two independent signals,
--       each moderately extreme: a file planted from elsewhere usually shows both, a store's own file rarely does
--       (bench/README.md); one it finds far apart (every chunk 1.5 radii out or more) needs z >= 1.0
--       (storetopics._novel).  Up to 3 such files are shown, those both signals find apart first, then the most
--       novel.  A store made of one-off tokens (names) has no outlier file, so its names do not flood the list.
--       A file's title says what it is about: after its best word, the words of its lead (the first 20 words of
--       its first chunk, given in outlier_leads, where a page's title and a package's synopsis are) come first among
--       its 3 when they rank among its 10 best (a word of the title a page never comes back to, or one every file
--       has, does not);
--     * recurring dense terms: (total_sq / total) x IDF, for terms in at least three files whose occurrences come
--       in clusters (total_sq / total >= 2, i.e. one-off mentions are ignored; a name two files share is not a
--       theme).
-- The outlier files are given (storetopics._outlier_files finds them, from what changed); their terms are looked
-- up by id (no merge joins: the planner cannot know how long the arrays are, and would sort the pairs to merge them).
-- (About 130 lines: a bounded sort and its head per list, the outlier files' terms between them.)
CREATE OR REPLACE FUNCTION storetopics._keywords(p_source int, p_store text, outlier_files text[],
                                                 outlier_novelty float8[], n_dominant int DEFAULT 10,
                                                 n_distinctive int DEFAULT 8, p_script text DEFAULT NULL,
                                                 outlier_leads text[] DEFAULT NULL, outlier_dfs int[] DEFAULT NULL)
RETURNS TABLE (kind text, rank int, lexeme text, score float8, files int, total bigint, file_key text)
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp SET enable_mergejoin = off AS $$
#variable_conflict use_column
DECLARE
  v_n float8;        -- the store's files (at least 1)
  v_words bigint;
  v_script text;
  v_cfg regconfig;
  v_m int;           -- how many terms are ranked by their score alone (see below)
  v_kept boolean;    -- the dominant terms' candidates are the kept head's
  v_count bigint;
  v_cut float8;
  v_ids int[];
  v_scores float8[];
  v_files int[];
  v_totals bigint[];
  v_sqs bigint[];
  -- the lists, best first
  v_dom text[];
  v_dom_total bigint[];
  v_dom_files int[];
  v_out text[];
  v_out_score float8[];
  v_out_files int[];
  v_out_total bigint[];
  v_out_file text[];
  v_dense text[];
  v_dense_score float8[];
  v_dense_files int[];
  v_dense_total bigint[];
BEGIN
  SELECT greatest(s.files, 1)::float8, s.words INTO v_n, v_words FROM storetopics.store_state s
   WHERE s.source_id = p_source AND s.store_key = p_store;
  IF NOT FOUND THEN
    RETURN;
  END IF;
  SELECT x.ts_config INTO v_cfg FROM storetopics.sources x WHERE x.id = p_source;
  v_script := coalesce(p_script, storetopics._store_script(p_source, p_store));
  -- A store has tens of thousands of terms and a list shows ten: the m best by score alone are taken (a bounded
  -- sort, no lexeme read), and only they are named, ranked by (score, term) and tested (storetopics._term_head).
  -- Every term that scores more than the m-th is among them, so those are the exact head of the full ranking; when
  -- fewer than the list needs pass the tests there, m grows.
  -- dominant: by total count.  First from the head kept with the store's novelty and the terms touched since
  -- (storetopics._kept_head: every term that can count more than its cut), when there is one; then, if too few of
  -- those pass the tests, from the m best of all.
  v_m := 8 * n_dominant + 40;
  SELECT h.ids, h.totals::float8[], h.totals, h.files, h.totals_sq, h.cut
    INTO v_ids, v_scores, v_totals, v_files, v_sqs, v_cut
    FROM storetopics._kept_head(p_source, p_store, 'total') h;
  v_kept := v_ids IS NOT NULL;
  LOOP
    IF NOT v_kept THEN
      SELECT array_agg(t.term_id), array_agg(t.total::float8), array_agg(t.total), array_agg(t.files),
             array_agg(t.total_sq), count(*), min(t.total)
        INTO v_ids, v_scores, v_totals, v_files, v_sqs, v_count, v_cut
        FROM (SELECT t.term_id, t.total, t.files, t.total_sq FROM storetopics.store_terms t
               WHERE t.source_id = p_source AND t.store_key = p_store ORDER BY t.total DESC LIMIT v_m) t;
      v_cut := CASE WHEN v_count >= v_m THEN v_cut END;   -- (all of them when fewer than m came: nothing is cut)
    END IF;
    SELECT array_agg(h.lexeme ORDER BY h.r), array_agg(v_totals[h.i] ORDER BY h.r), array_agg(v_files[h.i] ORDER BY h.r)
      INTO v_dom, v_dom_total, v_dom_files
      FROM storetopics._term_head(v_ids, v_scores, v_files, v_totals, v_sqs, v_cut, n_dominant, NULL, v_n, v_words,
                                  v_script) WITH ORDINALITY AS h(i, lexeme, score, r);
    EXIT WHEN v_cut IS NULL OR coalesce(cardinality(v_dom), 0) >= n_dominant;
    IF v_kept THEN v_kept := false; ELSE v_m := v_m * 8; END IF;
  END LOOP;
  -- the top 3 terms of each outlier file (storetopics._outlier_files: the files, best first, and their novelty),
  -- its best, then its lead's words among its 10 best, even when they also rank as dominant (in a small store a
  -- needle's words do: they are still what the file is about); a term two outlier files share is kept once, with its
  -- best file
  SELECT array_agg(x.lexeme ORDER BY x.nov DESC, x.score DESC, x.lexeme),
         array_agg(x.score ORDER BY x.nov DESC, x.score DESC, x.lexeme),
         array_agg(x.files ORDER BY x.nov DESC, x.score DESC, x.lexeme),
         array_agg(x.total ORDER BY x.nov DESC, x.score DESC, x.lexeme),
         array_agg(x.file_key ORDER BY x.nov DESC, x.score DESC, x.lexeme)
    INTO v_out, v_out_score, v_out_files, v_out_total, v_out_file
    FROM (SELECT DISTINCT ON (x.lexeme) x.lexeme, x.score, x.files, x.total, x.file_key, x.nov FROM (
          SELECT w.*, o.nov, row_number() OVER (PARTITION BY w.file_key
                                                ORDER BY w.r = 1 DESC, (w.r <= 10 AND w.lead) DESC, w.r) AS pick
            FROM storetopics._outlier_terms(p_source, p_store, outlier_files, outlier_leads, v_n, v_words, v_script,
                                            v_cfg, p_dfs => outlier_dfs) w
            JOIN unnest(outlier_files, outlier_novelty) AS o(file_key, nov) ON o.file_key = w.file_key) x
           WHERE x.pick <= 3
           ORDER BY x.lexeme, x.nov DESC, x.score DESC, x.file_key) x;
  -- recurring dense terms, after the outlier files' terms: (total_sq / total) x IDF
  IF coalesce(cardinality(v_out), 0) < n_distinctive THEN
    v_m := 8 * n_distinctive + 40;
    LOOP
      SELECT array_agg(t.term_id), array_agg(t.score), array_agg(t.total), array_agg(t.files), array_agg(t.total_sq),
             count(*), min(t.score)
        INTO v_ids, v_scores, v_totals, v_files, v_sqs, v_count, v_cut
        FROM (SELECT t.term_id, (t.total_sq::float8 / t.total) * ln(v_n / t.files) AS score, t.total, t.files,
                     t.total_sq
                FROM storetopics.store_terms t
               WHERE t.source_id = p_source AND t.store_key = p_store
                 AND t.files >= 3 AND t.total_sq >= 2 * t.total AND ln(v_n / t.files) > 0
               ORDER BY 2 DESC LIMIT v_m) t;
      v_cut := CASE WHEN v_count >= v_m THEN v_cut END;
      SELECT array_agg(h.lexeme ORDER BY h.r), array_agg(h.score ORDER BY h.r), array_agg(v_files[h.i] ORDER BY h.r),
             array_agg(v_totals[h.i] ORDER BY h.r)
        INTO v_dense, v_dense_score, v_dense_files, v_dense_total
        FROM storetopics._term_head(v_ids, v_scores, v_files, v_totals, v_sqs, v_cut, n_distinctive,
                                    coalesce(v_dom, '{}') || coalesce(v_out, '{}'), v_n, v_words, v_script)
             WITH ORDINALITY AS h(i, lexeme, score, r);
      EXIT WHEN v_cut IS NULL OR coalesce(cardinality(v_dense), 0) >= n_distinctive;
      v_m := v_m * 8;
    END LOOP;
  END IF;
  RETURN QUERY
    SELECT 'dominant', (row_number() OVER (ORDER BY d.total DESC, d.lexeme))::int, d.lexeme, d.total::float8, d.files,
           d.total, NULL::text
      FROM unnest(v_dom, v_dom_total, v_dom_files) AS d(lexeme, total, files)
    UNION ALL
    SELECT 'distinctive', (row_number() OVER (ORDER BY x.pass, x.i))::int, x.lexeme, x.score, x.files, x.total,
           x.file_key
      FROM (SELECT x.*
              FROM (SELECT o.lexeme, o.score, o.files, o.total, o.file_key, 0 AS pass, o.i
                      FROM unnest(v_out, v_out_score, v_out_files, v_out_total, v_out_file)
                           WITH ORDINALITY AS o(lexeme, score, files, total, file_key, i)
                    UNION ALL
                    SELECT d.lexeme, d.score, d.files, d.total, NULL, 1, d.i
                      FROM unnest(v_dense, v_dense_score, v_dense_files, v_dense_total)
                           WITH ORDINALITY AS d(lexeme, score, files, total, i)) x
             ORDER BY x.pass, x.i LIMIT n_distinctive) x;
END $$;

-- The words some texts write for some lexemes (storetopics._learn_words), each with how often they write it and
-- whether mostly as a page converter's residue.  Words are read both whole ("open-source") and split at hyphens
-- ("open", "source"); a word speaks for a lexeme when it gives only that lexeme, or, for a hyphenated word, for its
-- compound lexeme only.  (jit off: the split's row estimates are the set functions' defaults, a thousand a row, and
-- compiling the plan they price cost more than running it.)
CREATE OR REPLACE FUNCTION storetopics._text_words(cfg regconfig, texts text[], lexemes text[])
RETURNS TABLE (lexeme text, word text, n numeric, residue text)
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp SET jit = off
BEGIN ATOMIC
  SELECT m.lexeme, m.word, m.n, m.residue
    FROM (SELECT w.word, w.n, w.residue, l.lexeme
            FROM (SELECT x.word, sum(r.n) FILTER (WHERE r.kind = 'text') AS n,
                         -- a word the texts write mostly as a page converter's residue is learnt as such, and
                         -- never shown (storetopics._show)
                         CASE WHEN 2 * sum(r.n) FILTER (WHERE r.kind = 'glued')
                                   > sum(r.n) FILTER (WHERE r.kind = 'text') THEN 'glued'
                              WHEN 2 * sum(r.n) FILTER (WHERE r.kind = 'link')
                                   > sum(r.n) FILTER (WHERE r.kind = 'text') THEN 'link' END AS residue
                    -- the texts are split once, into runs of letters, quotes and hyphens, counted; each distinct
                    -- run then gives its whole word and its parts between hyphens (quotes and hyphens at either
                    -- end are punctuation, not part of the word)
                    FROM (SELECT 'text' AS kind, r.r, count(*) AS n
                            FROM unnest(texts) t, regexp_split_to_table(lower(t), '[^[:alpha:]''-]+') r
                           WHERE storetopics._usable_text(t) GROUP BY r.r
                          UNION ALL
                          -- the runs inside a link's target, which a page converter left in ("<#std-iscman-named>")
                          SELECT 'link', r.r, count(*)
                            FROM unnest(texts) t,
                                 regexp_matches(t, '<(?:#|[[:alpha:]][[:alnum:]+.-]*:)[[:space:]]*'
                                                   '([^<>[:space:]]+)>', 'g') a,
                                 regexp_split_to_table(lower(a.a[1]), '[^[:alpha:]''-]+') r
                           WHERE storetopics._usable_text(t) GROUP BY r.r
                          UNION ALL
                          -- two words a page converter glued into one run ("Report a bugSee also", "--config
                          -- FILEUse a textual ...": storetopics._glued_re)
                          SELECT 'glued', lower(g.g[1] || g.g[2]), count(*)
                            FROM unnest(texts) t,
                                 regexp_matches(t COLLATE "C", '\m([a-z]{2,}|[A-Z]{2,})([A-Z][a-z]+)\M', 'g') g
                           WHERE storetopics._usable_text(t)
                             AND lower(g.g[1]) || g.g[2] COLLATE "C" ~ storetopics._glued_re()
                           GROUP BY lower(g.g[1] || g.g[2])) r,
                         LATERAL (SELECT btrim(r.r, '''-')
                                  UNION ALL
                                  SELECT btrim(p, '''') FROM string_to_table(r.r, '-') p
                                  UNION ALL
                                  -- and the runs of parts inside a word of three or more: the parser reads
                                  -- "server.max-request-size" as a host and "request-size", whose lexeme no whole
                                  -- word or part gives
                                  SELECT array_to_string(a.a[i:j], '-')
                                    FROM (SELECT string_to_array(btrim(r.r, '''-'), '-') AS a) a,
                                         generate_series(1, cardinality(a.a) - 1) i,
                                         generate_series(i + 1, cardinality(a.a)) j
                                   WHERE strpos(r.r, '-') > 0 AND cardinality(a.a) >= 3
                                     AND (i > 1 OR j < cardinality(a.a))) AS x(word)
                   WHERE length(x.word) BETWEEN 2 AND 40
                   GROUP BY x.word
                  HAVING sum(r.n) FILTER (WHERE r.kind = 'text') > 0) w,
                 LATERAL (SELECT tsvector_to_array(to_tsvector(cfg, w.word)) AS ls) v,
                 LATERAL unnest(v.ls) AS l(lexeme)
           WHERE l.lexeme = ANY (lexemes)
             AND (cardinality(v.ls) = 1 OR (strpos(w.word, '-') > 0 AND strpos(l.lexeme, '-') > 0))) m;
END;

-- The words people wrote for some lexemes of a store, learnt from the texts of files that contain them and
-- remembered in storetopics.term_words for the source's owner (per owner, as catalogs are: another tenant's texts
-- never choose them).  Returns how many lexemes were learnt.
CREATE OR REPLACE FUNCTION storetopics._learn_words(p_source int, p_store text, p_lexemes text[]) RETURNS int
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  src storetopics.sources;
  v_missing text[];
  v_files text[];
  v_texts text[];
  v_n int;
BEGIN
  SELECT * INTO src FROM storetopics.sources WHERE id = p_source;
  -- One learner at a time: concurrent renders would insert the same words in different orders.
  PERFORM pg_advisory_xact_lock(hashtext('storetopics.term_words'));
  v_missing := ARRAY(SELECT DISTINCT l FROM unnest(p_lexemes) l
                      WHERE NOT EXISTS (SELECT 1 FROM storetopics.term_words w
                                         WHERE w.owner = src.owner AND w.ts_config = src.ts_config
                                           AND w.lexeme = l));
  IF cardinality(v_missing) = 0 THEN
    PERFORM storetopics._learn_store_words(src, p_store, p_lexemes);
    RETURN 0;
  END IF;
  -- One file per missing lexeme, the first by key (storetopics._files_holding), then those files' texts.
  v_files := storetopics._files_holding(p_source, p_store,
                                        ARRAY(SELECT x.id FROM storetopics.lexemes x WHERE x.lexeme = ANY (v_missing)),
                                        1, 1);
  EXECUTE format('SELECT array_agg(x.t) FROM %s(''texts'', $1, $2, NULL) AS x(t text)',
                 storetopics._reader(p_source))
    INTO v_texts USING v_files, p_store;
  INSERT INTO storetopics.term_words (owner, ts_config, lexeme, word, residue, source_id, store_key)
  SELECT DISTINCT ON (m.lexeme) src.owner, src.ts_config, m.lexeme, m.word, m.residue, src.id, p_store
    FROM storetopics._text_words(src.ts_config, v_texts, v_missing) m
   ORDER BY m.lexeme, m.n DESC, length(m.word), m.word
  ON CONFLICT DO NOTHING;
  GET DIAGNOSTICS v_n = ROW_COUNT;
  PERFORM storetopics._learn_store_words(src, p_store, p_lexemes);
  RETURN v_n;
END $$;

-- The files of a store that hold some lexemes (by id), the p_from-th to the p_to-th of each by key (_learn_words:
-- the first).  Most lexemes are in one of the store's first 1,000 files by key (and the first files by key that hold
-- such a lexeme are then among them); the others are looked for in the whole store.  Where the lexemes are few, only
-- the files that hold one are unnested (an overlap test per file costs about as much per lexeme as unnesting the
-- file's array costs in all).
CREATE OR REPLACE FUNCTION storetopics._files_holding(p_source int, p_store text, p_ids int[], p_from int, p_to int)
RETURNS text[]
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_found int[];
  v_files text[];
BEGIN
  SELECT coalesce(array_agg(DISTINCT y.term_id), '{}'),
         coalesce(array_agg(DISTINCT y.file_key) FILTER (WHERE y.r BETWEEN p_from AND p_to), '{}')
    INTO v_found, v_files
    FROM (SELECT u.term_id, u.file_key, row_number() OVER (PARTITION BY u.term_id ORDER BY u.file_key) AS r
            FROM (SELECT k.file_key, unnest(a.term_ids) AS term_id
                    FROM (SELECT f.file_key, f.ctid AS tid FROM storetopics.file_terms f
                           WHERE f.source_id = p_source AND f.store_key = p_store
                           ORDER BY f.file_key LIMIT 1000) k,
                         LATERAL (SELECT f.term_ids FROM storetopics.file_terms f
                                   WHERE f.ctid = k.tid AND (cardinality(p_ids) > 16 OR f.term_ids && p_ids)
                                  OFFSET 0) a) u
           WHERE u.term_id IN (SELECT unnest(p_ids))) y;
  p_ids := ARRAY(SELECT unnest(p_ids) EXCEPT SELECT unnest(v_found));
  IF cardinality(p_ids) > 0 THEN
    SELECT v_files || coalesce(array_agg(DISTINCT y.file_key), '{}') INTO v_files
      FROM (SELECT u.file_key, row_number() OVER (PARTITION BY u.term_id ORDER BY u.file_key) AS r
              FROM (SELECT f.file_key, unnest(f.term_ids) AS term_id FROM storetopics.file_terms f
                     WHERE f.source_id = p_source AND f.store_key = p_store
                       AND (cardinality(p_ids) > 16 OR f.term_ids && p_ids)) u
             WHERE u.term_id IN (SELECT unnest(p_ids))) y
     WHERE y.r BETWEEN p_from AND p_to;
  END IF;
  RETURN v_files;
END $$;

-- Whether a store writes its owner's words for some lexemes (storetopics.store_words): each lexeme it has not been
-- checked for, unless the owner learnt it from this store, in the first 2, then (where not found there) up to 20 of
-- its files that hold it (storetopics._files_holding).  The owner's word written there as a word: word NULL.  Else
-- the word those texts write most for it (of the texts that hold the lexeme's start: splitting every text into
-- words costs ~1 us a word, a substring test far less).  One file would not do: the owner's word is often in a
-- store's other files ("files", where the first says "file").  Returns how many lexemes it looked for.
CREATE OR REPLACE FUNCTION storetopics._learn_store_words(src storetopics.sources, p_store text, p_lexemes text[])
RETURNS int
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_check text[];
  v_unwritten text[];
  v_texts text[] := '{}';
  v_read text[];
  v_n int;
BEGIN
  v_check := ARRAY(SELECT DISTINCT l FROM unnest(p_lexemes) l
                    WHERE NOT EXISTS (SELECT 1 FROM storetopics.store_words w
                                       WHERE w.source_id = src.id AND w.store_key = p_store AND w.lexeme = l));
  -- a word learnt from this store's own texts is written here: no look
  WITH own AS (
    INSERT INTO storetopics.store_words (source_id, store_key, lexeme)
    SELECT src.id, p_store, o.lexeme FROM storetopics.term_words o
     WHERE o.owner = src.owner AND o.ts_config = src.ts_config AND o.lexeme = ANY (v_check)
       AND o.source_id = src.id AND o.store_key = p_store
    ON CONFLICT DO NOTHING RETURNING lexeme)
  SELECT ARRAY(SELECT unnest(v_check) EXCEPT SELECT own.lexeme FROM own) INTO v_check;
  IF cardinality(v_check) = 0 THEN
    RETURN 0;
  END IF;
  v_unwritten := v_check;
  FOR r IN 1 .. 2 LOOP
    EXIT WHEN cardinality(v_unwritten) = 0;
    EXECUTE format('SELECT array_agg(lower(x.t)) FROM %s(''texts'', $1, $2, NULL) AS x(t text) '
                   'WHERE storetopics._usable_text(x.t)', storetopics._reader(src.id))
      INTO v_read
      USING storetopics._files_holding(src.id, p_store,
                                       ARRAY(SELECT x.id FROM storetopics.lexemes x WHERE x.lexeme = ANY (v_unwritten)),
                                       CASE r WHEN 1 THEN 1 ELSE 3 END, CASE r WHEN 1 THEN 2 ELSE 20 END), p_store;
    v_texts := v_texts || coalesce(v_read, '{}');
    -- the lexemes whose owner's word (if any) no text read yet writes as a word (a word learnt is letters,
    -- quotes and hyphens; escaped all the same: it was read from a tenant's text)
    v_unwritten := ARRAY(
      SELECT c.l FROM unnest(v_unwritten) c(l)
        LEFT JOIN storetopics.term_words o ON o.owner = src.owner AND o.ts_config = src.ts_config AND o.lexeme = c.l
       WHERE o.word IS NULL
          OR NOT EXISTS (SELECT 1 FROM unnest(v_read) t
                          WHERE strpos(t, o.word) > 0
                            AND t ~ ('(^|[^[:alpha:]])' || regexp_replace(o.word, '([^[:alnum:]])', '\\\1', 'g')
                                     || '($|[^[:alpha:]])')));
  END LOOP;
  INSERT INTO storetopics.store_words (source_id, store_key, lexeme, word, residue)
  SELECT src.id, p_store, c.l, b.word, b.residue
    FROM unnest(v_check) c(l)
    LEFT JOIN (SELECT DISTINCT ON (m.lexeme) m.lexeme, m.word, m.residue
                 FROM storetopics._text_words(
                        src.ts_config,
                        ARRAY(SELECT t FROM unnest(v_texts) t
                               WHERE EXISTS (SELECT 1 FROM unnest(v_unwritten) u
                                              WHERE strpos(t, left(u, greatest(3, length(u) - 2))) > 0)),
                        v_unwritten) m
                ORDER BY m.lexeme, m.n DESC, length(m.word), m.word) b ON b.lexeme = c.l
  ON CONFLICT DO NOTHING;
  GET DIAGNOSTICS v_n = ROW_COUNT;
  RETURN v_n;
END $$;

-- The reader's queries for the words (storetopics._reader_body puts them in read_<id>): texts (files, store), the
-- texts of those files of the store, as they are counted (_learn_words); leads (files, store), the start of each
-- file's first chunk, where a page's title is (_render_terms).
CREATE OR REPLACE FUNCTION storetopics._word_reads(src storetopics.sources) RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
RETURN storetopics._read_arm('texts', format('SELECT (%s)::text FROM %s AS c WHERE %s AND %s',
                                             storetopics._read_text_sql(src), src.chunks,
                                             storetopics._read_by_files(src), storetopics._read_by_store(src)),
                             'files, store')
    -- (the text of the first chunk only made as counted: the sort carries every chunk's row)
    || storetopics._read_arm('leads', format('SELECT x.f, storetopics._dehyphenated(left(x.t, 1000)) FROM ('
                                             'SELECT DISTINCT ON (1) (%s)::text, (%s)::text FROM %s AS c '
                                             'WHERE %s AND %s ORDER BY 1, %s) AS x(f, t)',
                                             src.file_sql, src.content_sql, src.chunks,
                                             storetopics._read_by_files(src), storetopics._read_by_store(src),
                                             storetopics._chunk_order_sql(src.chunks)),
                             'files, store');

-- A lexeme as the texts of its source's owner write it (storetopics._learn_words), or as the store's own texts do
-- where they never write that word (storetopics.store_words), else the lexeme; NULL, shown nowhere, when they write
-- it mostly as a page converter's residue (glued to the next word: "bugsee"; in a link's target: "iscman" of
-- "<#std-iscman-named>").
DO $$ BEGIN   -- (0.2 before store_words)
  IF to_regprocedure('storetopics._show(int, text)') IS NOT NULL THEN
    DROP FUNCTION storetopics._show(int, text);
  END IF;
END $$;
CREATE OR REPLACE FUNCTION storetopics._show(p_source int, p_store text, lexeme text) RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp
RETURN (SELECT CASE WHEN x.word IS NOT NULL THEN CASE WHEN x.residue IS NULL THEN x.word END
                    WHEN w.lexeme IS NULL THEN _show.lexeme WHEN w.residue IS NULL THEN w.word END
          FROM storetopics.sources s LEFT JOIN storetopics.term_words w
               ON w.owner = s.owner AND w.ts_config = s.ts_config AND w.lexeme = _show.lexeme
          LEFT JOIN storetopics.store_words x
               ON x.source_id = s.id AND x.store_key = p_store AND x.lexeme = _show.lexeme
         WHERE s.id = p_source);

CREATE OR REPLACE FUNCTION storetopics._human_count(n bigint) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp
RETURN CASE WHEN n < 10000 THEN n::text
            WHEN n < 1000000 THEN round(n / 1000.0)::text || 'k'
            ELSE round(n / 1000000.0, 1)::text || 'M' END;

-- A list of words as render shows it: without the words at the positions given, those screen_words() drops (unsafe
-- alone, or part of an instruction read in order), and a record of each dropped word and why (the reason of the
-- word alone, else the reason of the whole list), for topics.screened.
CREATE OR REPLACE FUNCTION storetopics._screened_at(words text[], what text, drop_at int[], OUT kept text[],
                                                    OUT dropped jsonb)
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  kept := ARRAY(SELECT w FROM unnest(words) WITH ORDINALITY AS u(w, i) WHERE i <> ALL (drop_at) ORDER BY i);
  dropped := coalesce((SELECT jsonb_agg(jsonb_build_object('in', what, 'text', w, 'reason',
                                                           coalesce(storetopics._screen(w),
                                                                    storetopics._screen(array_to_string(words, ' ')),
                                                                    'instruction')) ORDER BY i)
                         FROM unnest(words) WITH ORDINALITY AS u(w, i) WHERE i = ANY (drop_at)), '[]');
END $$;

-- The same, the positions screened here (a cluster's words have them kept: clusters.keywords_dropped).
CREATE OR REPLACE FUNCTION storetopics._screened(words text[], what text, OUT kept text[], OUT dropped jsonb)
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp
RETURN storetopics._screened_at(words, what, coalesce(storetopics._screen_words(words), '{}'));

-- The label a router is shown for a cluster: the labeller's when it passes the screen, else the offline phrase, else
-- the offline label from the cluster's screened words (NULL when none passes: the cluster is then no topic).
CREATE OR REPLACE FUNCTION storetopics._shown_label(label text, phrase text, words text[], offline boolean)
RETURNS text
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp
RETURN CASE WHEN NOT offline AND label IS NOT NULL AND storetopics._screen(label) IS NULL THEN label
            WHEN phrase IS NOT NULL AND storetopics._screen(phrase) IS NULL THEN phrase
            WHEN storetopics._screen(storetopics._offline_label(words)) IS NULL THEN storetopics._offline_label(words) END;

-- A catalog's size from its sources' counters (kept by fold), not from every store's row.
CREATE OR REPLACE FUNCTION storetopics._catalog_size(p_catalog text, OUT stores numeric, OUT files float8)
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
  SELECT coalesce(sum(s.store_count), 0), coalesce(sum(s.file_count), 0)::float8
    FROM storetopics.sources s WHERE storetopics._catalog(s.id) = p_catalog;
END;

-- A term's contrast (storetopics._contrast_terms): q, its share of the rest of the catalog's files (half a file added
-- to both counts), from its files in the store and in the catalog (NULL: the catalog has no row for it) and the
-- store's and the catalog's files; its score from p (its share of the store's files) and q.  (No SET search_path:
-- bound when created, and inlined where every term of a store is scored.)
CREATE OR REPLACE FUNCTION storetopics._contrast_q(files int, catalog_files bigint, store_files float8,
                                                   all_files float8) RETURNS float8
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN ((coalesce(catalog_files, files) - files)::float8 + 0.5) / (all_files - store_files + 0.5);

CREATE OR REPLACE FUNCTION storetopics._contrast_raw(p float8, q float8, stores numeric) RETURNS float8
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE WHEN stores < 2 THEN p ELSE p * ln(p / q) END;

-- The m best terms of a store by contrast (storetopics._contrast_terms), by their score before rounding, with their
-- rounded scores, and the m-th's (n: how many came).  p_files: the store's files, p_stores and p_all: the catalog's
-- stores and files.
-- How the catalog's rows are read is chosen here, from the counters, not left to the statistics: a new source's
-- first render runs before autovacuum has seen it, and on those statistics the planner took the store's terms and
-- the catalog's for one row each and read the catalog's every term once per term of the store (bench/README.md).
-- A store with under 0.1% of the catalog's files probes the catalog once per term (a sub-select, which nothing can
-- plan otherwise); a larger one reads the catalog's terms once, hashed (a join with nested loops off).
CREATE OR REPLACE FUNCTION storetopics._contrast_scan(p_catalog text, p_source int, p_store text, p_files float8,
                                                      p_stores numeric, p_all float8, p_m int,
                                                      OUT ids int[], OUT scores float8[], OUT files int[],
                                                      OUT totals bigint[], OUT totals_sq bigint[], OUT p float8[],
                                                      OUT q float8[], OUT n bigint, OUT cut float8)
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_probe boolean := p_files < 0.001 * p_all;   -- the catalog probed per term (else joined)
  v_nestloop text := current_setting('enable_nestloop');
BEGIN
  IF NOT v_probe THEN
    PERFORM set_config('enable_nestloop', 'off', true);
  END IF;
  EXECUTE format($q$
    SELECT array_agg(h.term_id), array_agg(round(h.raw::numeric, 9)::float8), array_agg(h.files), array_agg(h.total),
           array_agg(h.total_sq), array_agg(h.p), array_agg(h.q), count(*), round(min(h.raw)::numeric, 9)::float8
      FROM (SELECT s.term_id, s.files, s.total, s.total_sq, s.p, s.q, storetopics._contrast_raw(s.p, s.q, $5) AS raw
              FROM (SELECT t.term_id, t.files, t.total, t.total_sq, t.files / $4 AS p,
                           storetopics._contrast_q(t.files, t.catalog_files, $4, $6) AS q
                      -- (OFFSET 0: each term's files in the catalog read once; q is read three times)
                      FROM (SELECT t.term_id, t.files, t.total, t.total_sq, %s AS catalog_files
                              FROM storetopics.store_terms t %s
                             WHERE t.source_id = $2 AND t.store_key = $3 AND (t.files >= 2 OR $4 < 20) OFFSET 0) t) s
             WHERE $5 < 2 OR s.p > s.q
             ORDER BY 7 DESC LIMIT $7) h$q$,
    CASE WHEN v_probe THEN '(SELECT c.files FROM storetopics.catalog_terms c WHERE c.catalog = $1 AND c.term_id = t.term_id)'
         ELSE 'c.files' END,
    CASE WHEN NOT v_probe THEN 'LEFT JOIN storetopics.catalog_terms c ON c.catalog = $1 AND c.term_id = t.term_id' END)
    INTO ids, scores, files, totals, totals_sq, p, q, n, cut
    USING p_catalog, p_source, p_store, p_files, p_stores, p_all, p_m;
  PERFORM set_config('enable_nestloop', v_nestloop, true);
END $$;

-- Keep the head of a store's ranking by contrast (storetopics._contrast_terms) in its novelty_state: its p_n best
-- terms now, a bound on every other's score (the p_n-th's, rounded up), what the scores are of, and where the
-- catalog's list of touched terms stands, read before the scores are (a fold of another source that commits in
-- between is then listed after it, and its terms are looked at again).
CREATE OR REPLACE FUNCTION storetopics._keep_contrast(p_source int, p_store text, p_n int DEFAULT 400)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_cat text := storetopics._catalog(p_source);
  v_generation bigint;
  v_position int;
  v_files float8;
  v_size record;
  v_scan record;
BEGIN
  INSERT INTO storetopics.catalog_touched (catalog) VALUES (v_cat) ON CONFLICT DO NOTHING;
  SELECT c.generation, cardinality(c.touched) INTO v_generation, v_position
    FROM storetopics.catalog_touched c WHERE c.catalog = v_cat;
  SELECT greatest(st.files, 1)::float8 INTO v_files FROM storetopics.store_state st
   WHERE st.source_id = p_source AND st.store_key = p_store;
  SELECT * INTO v_size FROM storetopics._catalog_size(v_cat);
  SELECT * INTO v_scan FROM storetopics._contrast_scan(v_cat, p_source, p_store, v_files, v_size.stores, v_size.files,
                                                       p_n);
  UPDATE storetopics.novelty_state k
     SET by_contrast = coalesce(v_scan.ids, '{}'),
         by_contrast_cut = CASE WHEN v_scan.n >= p_n THEN v_scan.cut + 1e-9 END,   -- (the cut was rounded)
         -- (the 160th score: twice the 80 terms a render takes, storetopics._render_terms)
         by_contrast_need = (SELECT x FROM unnest(v_scan.scores) x ORDER BY x DESC OFFSET 159 LIMIT 1),
         contrast_basis = ARRAY[v_files, v_size.files, v_size.stores],
         contrast_catalog = v_cat, catalog_generation = v_generation, catalog_position = v_position
   WHERE k.source_id = p_source AND k.store_key = p_store;
END $$;

-- The most a term of a store can score by contrast (storetopics._contrast_raw) with `files` in the store, whatever
-- the rest of the catalog holds: its share q of the rest is at least half a file's (0: it cannot qualify).
CREATE OR REPLACE FUNCTION storetopics._contrast_most(files int, store_files float8, all_files float8, stores numeric)
RETURNS float8
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE WHEN files < 2 THEN 0
            WHEN stores < 2 THEN files / store_files
            WHEN files / store_files <= 0.5 / (all_files - store_files + 0.5) THEN 0
            ELSE files / store_files * ln(files / store_files / (0.5 / (all_files - store_files + 0.5))) END;

-- The bound a kept contrast head vouches for (storetopics._kept_contrast, below, says how it is derived), from what
-- was kept (basis: {N, A, stores} then; cut: the head's last score then, NULL: the head held every term) and the
-- store's and the catalog's sizes now.  (One function: _render_terms also keeps the head again when this has grown
-- past the score its 160th term had, novelty_state.by_contrast_need.)
CREATE OR REPLACE FUNCTION storetopics._contrast_bound(basis float8[], cut float8, p_files float8, p_all float8,
                                                       p_stores numeric) RETURNS float8
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN basis[1] / p_files
       * (coalesce(cut, 0)
          + CASE WHEN p_stores < 2 THEN 0
                 ELSE greatest(ln(basis[1] / p_files) + ln((p_all - p_files + 0.5) / (basis[2] - basis[1] + 0.5)), 0)
            END);

-- The terms of a store that can score more than a bound by contrast now (storetopics._contrast_terms), with their
-- scores now, and the bound, rounded as the scores are: those of the kept head (novelty_state.by_contrast), those
-- whose counts changed in the catalog since the head was kept and fold did not touch in the store, and those fold
-- touched in the store since its novelty was kept whose files now could score more than the bound whatever the rest
-- of the catalog holds (storetopics._contrast_most), each looked up by its key, in one statement.  Every other term
-- has the counts it had when the head was kept; with p = files / N and q = (rest's files + 1/2) / (A - N + 1/2), its
-- score p ln(p / q) moved from s to (N / N') (s + p d), d = ln(N / N') + ln((A' - N' + 1/2) / (A - N + 1/2)), and
-- p <= 1: it is at most (N / N') (cut + max(d, 0)).  No row when nothing kept vouches for it (no head, the catalog's
-- list started again, the store under 20 files, or alone in its catalog then and not now, or the reverse): the
-- caller ranks every term.
CREATE OR REPLACE FUNCTION storetopics._kept_contrast(p_source int, p_store text, p_catalog text, p_files float8,
                                                      p_all float8, p_stores numeric, OUT ids int[],
                                                      OUT scores float8[], OUT files int[], OUT totals bigint[],
                                                      OUT totals_sq bigint[], OUT p float8[], OUT q float8[],
                                                      OUT cut float8)
RETURNS SETOF record
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
  SELECT coalesce(array_agg(x.term_id), '{}'), coalesce(array_agg(round(x.raw::numeric, 9)::float8), '{}'),
         coalesce(array_agg(x.files), '{}'), coalesce(array_agg(x.total), '{}'), coalesce(array_agg(x.total_sq), '{}'),
         coalesce(array_agg(x.p), '{}'), coalesce(array_agg(x.q), '{}'),
         round((min(h.bound) * (1 + 1e-9) + 1e-12)::numeric, 9)::float8
    FROM (SELECT k.source_id, k.store_key, k.by_contrast, k.touched, k.touched_files, k.touched_totals,
                 k.touched_totals_sq, c.touched[k.catalog_position + 1:] AS in_catalog,
                 storetopics._contrast_bound(k.contrast_basis, k.by_contrast_cut, p_files, p_all, p_stores) AS bound
            FROM storetopics.novelty_state k
            JOIN storetopics.catalog_touched c ON c.catalog = k.contrast_catalog
           WHERE k.source_id = p_source AND k.store_key = p_store AND k.touched IS NOT NULL
             AND k.by_contrast IS NOT NULL AND k.contrast_catalog = p_catalog
             AND c.generation = k.catalog_generation AND cardinality(c.touched) >= k.catalog_position
             AND (k.contrast_basis[3] < 2) = (p_stores < 2) AND k.contrast_basis[1] >= 20 AND p_files >= 20) h
    LEFT JOIN LATERAL (
      SELECT s.term_id, s.files, s.total, s.total_sq, s.p, s.q, storetopics._contrast_raw(s.p, s.q, p_stores) AS raw
        FROM (SELECT t.term_id, t.files, t.total, t.total_sq, t.files / p_files AS p,
                     storetopics._contrast_q(t.files, t.catalog_files, p_files, p_all) AS q
                -- (the head and the catalog's changes the store did not list, looked up; the listed, as listed; each
                -- term's files in the catalog looked up once, OFFSET 0: q is read three times)
                FROM (SELECT t.*, (SELECT a.files FROM storetopics.catalog_terms a
                                    WHERE a.catalog = p_catalog AND a.term_id = t.term_id) AS catalog_files
                        FROM (SELECT t.term_id, t.files, t.total, t.total_sq FROM storetopics.store_terms t
                               WHERE t.source_id = h.source_id AND t.store_key = h.store_key
                                 AND t.term_id = ANY (ARRAY(SELECT unnest(h.by_contrast)
                                                            UNION SELECT unnest(h.in_catalog)
                                                            EXCEPT SELECT unnest(h.touched)))
                              UNION ALL
                              SELECT t.* FROM unnest(h.touched, h.touched_files, h.touched_totals, h.touched_totals_sq)
                                              AS t(term_id, files, total, total_sq)
                               WHERE storetopics._contrast_most(t.files, p_files, p_all, p_stores) * (1 + 1e-9) + 1e-9
                                     > h.bound) t
                       WHERE t.files >= 2 OFFSET 0) t) s
       WHERE p_stores < 2 OR s.p > s.q) x ON true
   GROUP BY h.source_id;
END;

-- The terms that tell a store apart from the other stores of its catalog, best first: a term counts by the share of
-- the store's files that hold it, p, against its share of the other stores' files, q (half a file added to both
-- counts: a term every file holds is no news), as p * ln(p / q), its part of the divergence between the store and the
-- rest; only terms more common here than elsewhere, in at least two files of a store of 20 or more (one file's words
-- are the distinctive list's business).  Exact: computed from the sums fold keeps (store_terms, catalog_terms, and
-- the catalog's size from its sources' store_count and file_count), and no other store's row read, whatever the
-- catalog's size (bench/catalog.py measures it).  A store alone in its catalog has nothing to be told apart from: its
-- terms rank by p.
-- After a small change the kept head of the ranking and the terms that changed are ranked instead of every term
-- (storetopics._kept_contrast).
CREATE OR REPLACE FUNCTION storetopics._contrast_terms(p_source int, p_store text, n int DEFAULT 60,
                                                       p_script text DEFAULT NULL)
RETURNS TABLE (lexeme text, score float8, files int, share float8, rest_share float8)
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
  v_cat text := storetopics._catalog(p_source);
  v_files float8;          -- the store's files (at least 1)
  v_words bigint;
  v_stores numeric;        -- the catalog's size from its sources' counters (kept by fold), not from every store's row
  v_all float8;
  v_script text;
  v_m int := 4 * n + 40;   -- how many terms are ranked by their score before rounding (see below)
  -- those m terms, best first, with their rounded scores
  v_ids int[];
  v_scores float8[];
  v_nfiles int[];
  v_total bigint[];
  v_total_sq bigint[];
  v_p float8[];
  v_q float8[];
  v_count bigint;
  v_cut float8;
  -- the head: what is returned
  v_lexemes text[];
  v_out_scores float8[];
  v_out_files int[];
  v_out_p float8[];
  v_out_q float8[];
  v_kept boolean;          -- the candidates are the kept head's
BEGIN
  SELECT greatest(st.files, 1)::float8, st.words INTO v_files, v_words FROM storetopics.store_state st
   WHERE st.source_id = p_source AND st.store_key = p_store;
  IF NOT FOUND THEN
    RETURN;
  END IF;
  SELECT c.stores, c.files INTO v_stores, v_all FROM storetopics._catalog_size(v_cat) c;
  v_script := coalesce(p_script, storetopics._store_script(p_source, p_store));
  -- A store has tens of thousands of terms and shows a few dozen: the m best by their score before rounding are
  -- taken (a bounded sort, no lexeme read), and only they are named, ranked and tested (storetopics._term_head).
  -- Rounding is monotone, so every term whose rounded score beats the m-th's is among them, and those terms are the
  -- exact head of the full ranking (rounded score, then lexeme).  When fewer than n of them pass the tests, m grows.
  -- First from the head kept with the store's novelty and the terms touched since (storetopics._kept_contrast:
  -- every term that can score more than its bound), when there is one.
  SELECT h.ids, h.scores, h.files, h.totals, h.totals_sq, h.p, h.q, h.cut
    INTO v_ids, v_scores, v_nfiles, v_total, v_total_sq, v_p, v_q, v_cut
    FROM storetopics._kept_contrast(p_source, p_store, v_cat, v_files, v_all, v_stores) h;
  v_kept := v_ids IS NOT NULL;
  LOOP
    IF NOT v_kept THEN
      SELECT h.ids, h.scores, h.files, h.totals, h.totals_sq, h.p, h.q, h.n, h.cut
        INTO v_ids, v_scores, v_nfiles, v_total, v_total_sq, v_p, v_q, v_count, v_cut
        FROM storetopics._contrast_scan(v_cat, p_source, p_store, v_files, v_stores, v_all, v_m) h;
      v_cut := CASE WHEN v_count >= v_m THEN v_cut END;   -- (all of them when fewer than m came: nothing is cut)
    END IF;
    SELECT array_agg(h.lexeme ORDER BY h.r), array_agg(h.score ORDER BY h.r), array_agg(v_nfiles[h.i] ORDER BY h.r),
           array_agg(v_p[h.i] ORDER BY h.r), array_agg(v_q[h.i] ORDER BY h.r)
      INTO v_lexemes, v_out_scores, v_out_files, v_out_p, v_out_q
      FROM storetopics._term_head(v_ids, v_scores, v_nfiles, v_total, v_total_sq, v_cut, n, NULL, v_files, v_words,
                                  v_script) WITH ORDINALITY AS h(i, lexeme, score, r);
    EXIT WHEN v_cut IS NULL OR coalesce(cardinality(v_lexemes), 0) >= n;
    IF v_kept THEN v_kept := false; ELSE v_m := v_m * 8; END IF;
  END LOOP;
  RETURN QUERY SELECT * FROM unnest(v_lexemes, v_out_scores, v_out_files, v_out_p, v_out_q);
END $$;

-- The cl100k tokens of each piece of a summary, in order, each as it follows a space: the sum over its space-separated
-- chunks (each with its leading space) of their counts in storetopics.token_counts, or of their bytes where no count
-- is known (an upper bound: every token is at least a byte).  One statement for a whole list: _pack prices ~100.
-- (Each chunk's count probed by its key: joined, the planner took string_to_table for a thousand rows a piece and
-- hashed the whole table, which holds every word any summary has shown, at every call; bench/README.md.)
CREATE OR REPLACE FUNCTION storetopics._tokens(pieces text[]) RETURNS TABLE (i bigint, tokens int)
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
  SELECT u.i, coalesce(sum(coalesce((SELECT tc.tokens FROM storetopics.token_counts tc WHERE tc.chunk = ' ' || x.c),
                                    octet_length(' ' || x.c))), 0)::int
    FROM unnest(pieces) WITH ORDINALITY AS u(piece, i)
    LEFT JOIN LATERAL string_to_table(u.piece, ' ') AS x(c) ON x.c <> ''
   GROUP BY u.i
   ORDER BY u.i;
END;

CREATE OR REPLACE FUNCTION storetopics._tokens(piece text) RETURNS int
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
RETURN (SELECT t.tokens FROM storetopics._tokens(ARRAY[piece]) t);

-- The chunks of a text that storetopics.token_counts has no count for (the worker and the CLI count them with
-- tiktoken and render again).
CREATE OR REPLACE FUNCTION storetopics._uncounted(p_text text) RETURNS text[]
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
RETURN ARRAY(SELECT DISTINCT ' ' || x.c FROM string_to_table(p_text, ' ') AS x(c)
              WHERE x.c <> ''   -- (probed by key, as in _tokens)
                AND (SELECT 1 FROM storetopics.token_counts tc WHERE tc.chunk = ' ' || x.c) IS NULL
              ORDER BY 1);

-- Records token counts the worker or the CLI took with the real tokenizer.
CREATE OR REPLACE FUNCTION storetopics._record_token_counts(p_chunks text[], p_tokens int[]) RETURNS int
LANGUAGE sql SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
  INSERT INTO storetopics.token_counts (chunk, tokens)
  SELECT c, n FROM unnest(p_chunks, p_tokens) AS u(c, n) WHERE n > 0 ORDER BY 1
  ON CONFLICT (chunk) DO NOTHING;
  SELECT cardinality(p_chunks);
END;

-- The summary a router reads, within a budget of cl100k tokens: "Topics: a, b. Terms: c d. Distinctive: e. N
-- files."  The size (a few tokens) is always there; the sections are filled in order of what routes (the topics,
-- then the distinctive needles, then the contrastive terms with what is left), each with the longest head of its
-- list that fits, and written in reading order.  Labels are phrases, so their list needs commas; the terms are single
-- words, and a comma is a token: with spaces the same terms cost about a third less, and the shorter text routes
-- at least as well against lists of its own length (bench/README.md, "Terms").
CREATE OR REPLACE FUNCTION storetopics._pack(p_topics text[], p_terms text[], p_distinct text[], p_files bigint,
                                            p_budget int DEFAULT 200) RETURNS text
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_size text := format('%s files.', storetopics._human_count(p_files));
  v_left int := p_budget - 1 - storetopics._tokens(v_size);   -- the first chunk has no leading space: a token of slack
  v_sec text[] := ARRAY['Topics:', 'Distinctive:', 'Terms:'];
  v_sep text[] := ARRAY[', ', ', ', ' '];
  v_items text[];
  v_head int;
  v_used int;
  v_n int;
  i int;
  v_kept int[] := ARRAY[0, 0, 0];
  v_text text := '';
BEGIN
  FOR i IN 1..3 LOOP
    v_items := CASE i WHEN 1 THEN p_topics[1:8] WHEN 2 THEN p_distinct[1:8] ELSE p_terms END;
    -- an item costs itself with its separator; the section its name, and its closing "." where the separator is a
    -- space (where it is a comma, the last item's "." takes the place of its comma: one token each)
    v_head := storetopics._tokens(v_sec[i]) + CASE WHEN v_sep[i] = ' ' THEN 1 ELSE 0 END;
    SELECT count(*), coalesce(max(c.cum), 0) INTO v_n, v_used
      FROM (SELECT sum(t.tokens) OVER (ORDER BY t.i) AS cum
              FROM storetopics._tokens(ARRAY(SELECT u.x || rtrim(v_sep[i])
                                                    FROM unnest(v_items) WITH ORDINALITY AS u(x, o) ORDER BY u.o)) t) c
     WHERE c.cum + v_head <= v_left;
    IF v_n > 0 THEN
      v_kept[i] := v_n;
      v_left := v_left - v_used - v_head;
    END IF;
  END LOOP;
  FOR i IN SELECT unnest(ARRAY[1, 3, 2]) LOOP
    CONTINUE WHEN v_kept[i] = 0;
    v_items := CASE i WHEN 1 THEN p_topics WHEN 2 THEN p_distinct ELSE p_terms END;
    v_text := v_text || ' ' || v_sec[i] || ' ' || array_to_string(v_items[1:v_kept[i]], v_sep[i]) || '.';
  END LOOP;
  RETURN ltrim(v_text || ' ' || v_size);
END $$;

-- Render one store's summary from its current state.  Writes store_topics/topics only when they change, and then
-- sends NOTIFY storetopics_updated '<source id>:<store key>'.  Returns whether the text changed.  count_first: when
-- some chunks of the candidates have no token count yet (store_state.uncounted), write nothing and return NULL: the
-- worker and the CLI count them with tiktoken and render again, in the same transaction, which packs what the first
-- call computed (pg_temp.storetopics_candidate, dropped at commit: the store's row stays locked in between, so
-- nothing it was computed from can change) instead of computing it again.
CREATE OR REPLACE FUNCTION storetopics._render(p_source int, p_store text, count_first boolean DEFAULT false)
RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  src storetopics.sources;
  st storetopics.store_state;
  -- what is packed (storetopics._render_candidate)
  v_topic_list text[];
  v_terms text[];
  v_dist text[];
  v_topics jsonb;
  v_reused boolean := false;
  v_text text;
  v_chunks text;
  v_uncounted text[];
BEGIN
  SELECT * INTO src FROM storetopics.sources WHERE id = p_source;
  SELECT * INTO st FROM storetopics.store_state WHERE source_id = p_source AND store_key = p_store FOR UPDATE;
  IF NOT FOUND THEN
    RETURN false;
  END IF;
  IF st.files <= 0 THEN
    DELETE FROM storetopics.store_state WHERE source_id = p_source AND store_key = p_store;
    DELETE FROM storetopics.clusters WHERE source_id = p_source AND store_key = p_store;
    DELETE FROM storetopics.store_words WHERE source_id = p_source AND store_key = p_store;
    PERFORM storetopics._forget_novelty(p_source, p_store);
    PERFORM storetopics._mirror(src, p_store, NULL);
    PERFORM pg_notify('storetopics_updated', p_source || ':' || p_store);
    RETURN true;
  END IF;
  IF to_regclass('pg_temp.storetopics_candidate') IS NOT NULL THEN
    SELECT x.topic_list, x.terms, x.distinctive, x.data INTO v_topic_list, v_terms, v_dist, v_topics
      FROM pg_temp.storetopics_candidate x
     WHERE x.source_id = p_source AND x.store_key = p_store AND x.version = st.version;
    v_reused := FOUND;   -- (the table stays until commit: the values read may still point into its TOAST)
  END IF;
  IF NOT v_reused THEN
    SELECT * INTO v_topic_list, v_terms, v_dist, v_topics FROM storetopics._render_candidate(src, st);
  END IF;
  -- every chunk of the candidates: the text with every candidate, and each candidate as _pack costs it (followed
  -- by a comma, which the last one of a list is not in the text; a term also alone).  Those that are ASCII are
  -- counted here, exactly (storetopics._count_tokens); the others, not counted yet, are taken at one token per byte
  -- meanwhile, for the worker or the CLI to count: the same state packs the same way whatever was counted before.
  v_chunks := storetopics._pack(v_topic_list, v_terms, v_dist, st.files, 100000) || ' ' ||
              coalesce(array_to_string(v_topic_list[1:8] || v_dist[1:8] || v_terms, ', '), '') || ', ' ||
              coalesce(array_to_string(v_terms, ' '), '');
  PERFORM storetopics._count_in_database(v_chunks);
  v_text := storetopics._pack(v_topic_list, v_terms, v_dist, st.files);
  v_uncounted := storetopics._uncounted(v_chunks);
  UPDATE storetopics.store_state SET uncounted = v_uncounted WHERE source_id = p_source AND store_key = p_store;
  IF count_first AND cardinality(v_uncounted) > 0 THEN
    IF to_regclass('pg_temp.storetopics_candidate') IS NULL THEN
      CREATE TEMP TABLE storetopics_candidate (source_id int, store_key text, version bigint, topic_list text[],
                                               terms text[], distinctive text[], data jsonb) ON COMMIT DROP;
    END IF;
    DELETE FROM pg_temp.storetopics_candidate x WHERE x.source_id = p_source AND x.store_key = p_store;
    INSERT INTO pg_temp.storetopics_candidate
    VALUES (p_source, p_store, st.version, v_topic_list, v_terms, v_dist, v_topics);
    RETURN NULL;
  END IF;
  UPDATE storetopics.store_state SET rendered_at = now(), rendered_version = st.version
   WHERE source_id = p_source AND store_key = p_store;
  IF st.store_topics IS NOT DISTINCT FROM v_text AND st.topics IS NOT DISTINCT FROM v_topics THEN
    RETURN false;
  END IF;
  UPDATE storetopics.store_state SET store_topics = v_text, topics = v_topics, updated_at = now()
   WHERE source_id = p_source AND store_key = p_store;
  PERFORM storetopics._mirror(src, p_store, v_text);
  PERFORM pg_notify('storetopics_updated', p_source || ':' || p_store);
  RETURN true;
END $$;

-- What render() packs: the topic list, the terms and the distinctive words (screened, each list without what an
-- earlier one says) and the topics jsonb, from the store's current state.
CREATE OR REPLACE FUNCTION storetopics._render_candidate(src storetopics.sources, st storetopics.store_state,
                                              OUT topic_list text[], OUT terms text[], OUT distinctive text[],
                                              OUT data jsonb)
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_kw jsonb;
  v_terms text[];
  v_dist text[];
  v_topics jsonb;
  v_cfg jsonb := storetopics._settings(src.id);
  v_clusters jsonb;
  v_topic_list text[];
  v_explained text[];
  v_said text[];        -- the words of the topics shown
  v_screened jsonb := '[]';   -- what the screen dropped, and why
  v_s record;
  v_topics_from text;   -- what the topic list is made of: clusters, the labeller's store labels, mined phrases
BEGIN
  PERFORM storetopics._refresh_words(src.id, st.store_key);   -- the clusters' words and phrases, from the current counts
  SELECT * INTO v_terms, v_dist, v_kw FROM storetopics._render_terms(src, st.store_key);

  -- Everything rendered is user text a router reads: screened (storetopics._screen), what is dropped is recorded.
  SELECT s.kept, v_screened || s.dropped INTO v_terms, v_screened FROM storetopics._screened(v_terms, 'terms') s;
  SELECT s.kept, v_screened || s.dropped INTO v_dist, v_screened FROM storetopics._screened(v_dist, 'distinctive') s;

  -- Clusters, largest first, with the label a router sees: the labeller's, or the offline one (a phrase).
  SELECT x.clusters, x.explained, v_screened || x.screened INTO v_clusters, v_explained, v_screened
    FROM storetopics._render_clusters(src.id, st.store_key, NOT storetopics._llm_labeller(src.id)) x;
  v_explained := regexp_split_to_array(coalesce(array_to_string(v_explained, ' '), ''), '\s+');
  -- The topic list: clusters that show the same label are one topic to a reader; a keyword-only store's topics are
  -- phrases of its contrastive terms.
  IF jsonb_array_length(v_clusters) > 0 THEN
    v_topics_from := 'clusters';
    v_topic_list := ARRAY(SELECT t.label
                            FROM (SELECT c ->> 'label' AS label, sum((c ->> 'share')::float8) AS share, min(o.i) AS first
                                    FROM jsonb_array_elements(v_clusters) WITH ORDINALITY AS o(c, i) GROUP BY 1) t
                           WHERE t.share >= 0.02 AND t.label IS NOT NULL
                           ORDER BY t.share DESC, t.first LIMIT 8);
  ELSIF src.embedding IS NULL THEN
    -- the LLM labeller's labels for the store (storetopics._record_store_labels), else the phrases mined offline
    v_topics_from := CASE WHEN storetopics._llm_labeller(src.id) AND cardinality(st.store_labels) > 0
                          THEN 'labeller' ELSE 'phrases' END;
    SELECT * INTO v_s FROM storetopics._screened(
      CASE WHEN v_topics_from = 'labeller' THEN st.store_labels
           ELSE storetopics._store_phrases(src.id, st.store_key,
                                           ARRAY(SELECT c ->> 'lexeme' FROM jsonb_array_elements(v_kw -> 'contrast') c)) END,
      'topics');
    v_topic_list := v_s.kept;
    v_screened := v_screened || v_s.dropped;
  END IF;
  v_said := regexp_split_to_array(lower(coalesce(array_to_string(v_topic_list, ' '), '')), '\s+');
  -- Distinctive words no cluster explains: the rare file that KMeans absorbs into a big cluster.  An outlier file's
  -- words are what that file is about: they give way only to a topic shown, not to a cluster's unshown words (a page
  -- on unit conversions planted among gnuplot's pages lost "units" to a cluster's words).
  v_dist := ARRAY(SELECT d FROM unnest(v_dist) WITH ORDINALITY AS u(d, i)
                   WHERE lower(d) <> ALL (coalesce(v_explained, '{}'))
                      OR lower(d) <> ALL (v_said) AND d IN (SELECT x ->> 'term' FROM jsonb_array_elements(v_kw -> 'distinctive') x
                                                             WHERE x ->> 'file' IS NOT NULL) ORDER BY i);
  -- Terms that a topic already says are no news.
  v_terms := ARRAY(SELECT w FROM unnest(v_terms) WITH ORDINALITY AS u(w, i)
                    WHERE lower(w) <> ALL (v_said)
                      AND lower(w) <> ALL (coalesce(ARRAY(SELECT lower(x) FROM unnest(v_dist) x), '{}'))
                    ORDER BY i);
  v_topics := jsonb_build_object('version', 2, 'files', st.files, 'chunks', st.chunks, 'words', st.words,
                                 'skipped', st.skipped, 'clusters', v_clusters, 'topics', to_jsonb(v_topic_list),
                                 'catalog', coalesce(v_cfg ->> 'catalog', 'source:' || src.id),
                                 'fit', CASE WHEN st.fit_at IS NOT NULL THEN jsonb_build_object(
                                   'generation', st.fit_generation, 'at', st.fit_at, 'k', st.fit_k,
                                   'silhouette', round(st.fit_silhouette::numeric, 4),
                                   'single_theme', st.fit_single_theme, 'sample', st.fit_sample, 'dim', st.fit_dim,
                                   'space', st.fit_space, 'other_dimension_chunks', st.other_dim) END,
                                 'labeller', v_cfg ->> 'labeller', 'topics_from', v_topics_from,
                                 'screened', v_screened,
                                 'cost', (SELECT jsonb_build_object('calls', count(*), 'input_tokens',
                                                   coalesce(sum(l.input_tokens), 0), 'output_tokens',
                                                   coalesce(sum(l.output_tokens), 0), 'usd', coalesce(sum(l.cost_usd), 0))
                                            FROM storetopics.label_ledger l
                                           WHERE l.source_id = src.id AND l.store_key = st.store_key)) || v_kw;
  topic_list := v_topic_list;
  terms := v_terms;
  distinctive := v_dist;
  data := v_topics;
END $$;

-- A store's contrastive terms as a reader sees them: in the words people write (learnt first), a word two lexemes
-- show as ("run", "running") once, where it ranks first.  What render shows and what an LLM labeller is given.
CREATE OR REPLACE FUNCTION storetopics._contrast_shown(p_source int, p_store text, n int)
RETURNS TABLE (rank int, lexeme text, word text, score float8, files int)
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_lexemes text[];
  v_scores float8[];
  v_files int[];
BEGIN
  SELECT array_agg(c.lexeme ORDER BY c.score DESC, c.lexeme), array_agg(c.score ORDER BY c.score DESC, c.lexeme),
         array_agg(c.files ORDER BY c.score DESC, c.lexeme)
    INTO v_lexemes, v_scores, v_files
    FROM storetopics._contrast_terms(p_source, p_store, n) c;
  PERFORM storetopics._learn_words(p_source, p_store, coalesce(v_lexemes, '{}'));
  RETURN QUERY
    SELECT (row_number() OVER (ORDER BY x.i))::int, x.lexeme, x.word, x.score, x.files
      FROM (SELECT DISTINCT ON (w.word) w.*
              FROM (SELECT u.lexeme, storetopics._show(p_source, p_store, u.lexeme) AS word, u.score, u.files, u.i
                      FROM unnest(v_lexemes, v_scores, v_files) WITH ORDINALITY AS u(lexeme, score, files, i)) w
             WHERE w.word IS NOT NULL
             ORDER BY w.word, w.i) x
     ORDER BY x.i;
END $$;

-- render()'s term lists: the dominant and distinctive lists of keywords() and the contrastive terms (as
-- _contrast_shown() shows them), as people write them; two lexemes that show as one word ("run", "running") are
-- shown once, where they rank first.  The words of the three lists are learnt together: each learning reads every
-- (file, term) pair of the store once.  terms: the contrastive words, distinctive: the distinctive ones, lists: the
-- three lists as topics shows them ({dominant, distinctive, contrast}).
CREATE OR REPLACE FUNCTION storetopics._render_terms(src storetopics.sources, p_store text, OUT terms text[],
                                          OUT distinctive text[], OUT lists jsonb)
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  -- the lists' rows, column by column (the aggregates of one query read the rows in the same order)
  v_kind text[];
  v_rank int[];
  v_lexeme text[];
  v_score float8[];
  v_files int[];
  v_total bigint[];
  v_file text[];
  v_outliers text[];
  v_novelty float8[];
  v_leads text[];
  v_dfs int[];
  v_script text := storetopics._store_script(src.id, p_store);   -- (of both lists: computed once)
BEGIN
  -- (the store's document frequencies on the first row only: max() takes it as it is)
  SELECT array_agg(o.file_key ORDER BY o.rank), array_agg(o.novelty ORDER BY o.rank), max(o.dfs)
    INTO v_outliers, v_novelty, v_dfs
    FROM storetopics._outlier_files(src.id, p_store) o;
  -- the outlier files' leads, where their titles are (read as the table's owner, by the source's reader)
  IF cardinality(v_outliers) > 0 THEN
    EXECUTE format('SELECT array_agg(x.t ORDER BY o.i) FROM unnest($1) WITH ORDINALITY AS o(f, i) '
                   'LEFT JOIN %s(''leads'', $1, $2, NULL) AS x(f text, t text) ON x.f = o.f',
                   storetopics._reader(src.id))
      INTO v_leads USING v_outliers, p_store;
  END IF;
  -- the contrast head kept with the novelty, kept again when the catalog's list of touched terms started again
  -- since, when the store's catalog changed, or when the bound on the other terms has passed the score the head's
  -- 160th term had (twice the 80 taken here): the other stores' files grew the catalog, which moves every term's
  -- share of the rest (the more, the bigger the store's part of the catalog), and too few of the head's terms would
  -- score above the bound: every render would rank all the store's terms (storetopics._kept_contrast,
  -- bench/README.md)
  IF EXISTS (SELECT 1 FROM storetopics.novelty_state k
               LEFT JOIN storetopics.catalog_touched c ON c.catalog = k.contrast_catalog
              WHERE k.source_id = src.id AND k.store_key = p_store AND k.touched IS NOT NULL
                AND (k.contrast_catalog IS DISTINCT FROM storetopics._catalog(src.id)
                     OR c.generation IS DISTINCT FROM k.catalog_generation
                     OR k.contrast_basis[1] >= 20
                        AND (SELECT storetopics._contrast_bound(k.contrast_basis, k.by_contrast_cut,
                                                               greatest(st.files, 1), z.files, z.stores)
                               FROM storetopics.store_state st, storetopics._catalog_size(k.contrast_catalog) z
                              WHERE st.source_id = src.id AND st.store_key = p_store) > k.by_contrast_need)) THEN
    PERFORM storetopics._keep_contrast(src.id, p_store);
  END IF;
  SELECT array_agg(k.kind), array_agg(k.rank), array_agg(k.lexeme), array_agg(k.score), array_agg(k.files),
         array_agg(k.total), array_agg(k.file_key)
    INTO v_kind, v_rank, v_lexeme, v_score, v_files, v_total, v_file
    FROM (SELECT k.kind, k.rank, k.lexeme, k.score, k.files, k.total, k.file_key
            FROM storetopics._keywords(src.id, p_store, v_outliers, v_novelty, p_script => v_script,
                                       outlier_leads => v_leads, outlier_dfs => v_dfs) k
          UNION ALL
          SELECT 'contrast', (row_number() OVER (ORDER BY c.score DESC, c.lexeme))::int, c.lexeme, c.score, c.files,
                 NULL, NULL
            FROM storetopics._contrast_terms(src.id, p_store, 80, v_script) c) k;
  PERFORM storetopics._learn_words(src.id, p_store, ARRAY(SELECT DISTINCT l FROM unnest(v_lexeme) l));
  SELECT array_agg(k.word ORDER BY k.rank) FILTER (WHERE k.kind = 'contrast'),
         array_agg(k.word ORDER BY k.rank) FILTER (WHERE k.kind = 'distinctive'),
         jsonb_build_object(
           'dominant', coalesce(jsonb_agg(jsonb_build_object('term', k.word, 'lexeme', k.lexeme, 'count', k.total,
                                                             'files', k.files) ORDER BY k.rank)
                               FILTER (WHERE k.kind = 'dominant'), '[]'),
           'distinctive', coalesce(jsonb_agg(jsonb_build_object('term', k.word, 'lexeme', k.lexeme,
                                   'score', round(k.score::numeric, 3), 'files', k.files, 'count', k.total,
                                   'file', k.file_key) ORDER BY k.rank) FILTER (WHERE k.kind = 'distinctive'), '[]'),
           'contrast', coalesce(jsonb_agg(jsonb_build_object('term', k.word, 'lexeme', k.lexeme,
                                'score', round(k.score::numeric, 6), 'files', k.files) ORDER BY k.rank)
                               FILTER (WHERE k.kind = 'contrast'), '[]'))
    INTO terms, distinctive, lists
    FROM (SELECT DISTINCT ON (u.kind, u.word) u.*
            FROM (SELECT x.kind, x.rank, x.lexeme, storetopics._show(src.id, p_store, x.lexeme) AS word, x.score,
                         x.files, x.total, x.file_key
                    FROM unnest(v_kind, v_rank, v_lexeme, v_score, v_files, v_total, v_file)
                         AS x(kind, rank, lexeme, score, files, total, file_key)) u
           WHERE u.word IS NOT NULL
           ORDER BY u.kind, u.word, u.rank) k;
END $$;

-- render()'s clusters, largest first, each with its screened words and the label a router sees (the labeller's if
-- it passes the screen, else the offline phrase, else the offline words) and its share of the store's clustered
-- chunks; explained: each cluster's label and words (what a cluster explains); screened: what the screen dropped.
CREATE OR REPLACE FUNCTION storetopics._render_clusters(p_source int, p_store text, p_offline boolean, OUT clusters jsonb,
                                             OUT explained text[], OUT screened jsonb)
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
BEGIN
  WITH k AS MATERIALIZED (
    SELECT k.cluster_id, k.label, k.labeller, k.phrase, k.chunks, k.files, k.representatives, k.outliers,
           k.outliers_at_fit, s.kept AS keywords, s.dropped, r.reason,
           -- (the label screened once: its verdict says both whether it is shown and why not)
           CASE WHEN NOT p_offline AND k.label IS NOT NULL AND r.reason IS NULL THEN k.label
                ELSE storetopics._shown_label(NULL, k.phrase, s.kept, p_offline) END AS shown,
           k.chunks::float8 / greatest(sum(k.chunks) OVER (), 1) AS share
      FROM storetopics.clusters k
     CROSS JOIN LATERAL storetopics._screened_at(k.keywords, 'cluster words',
                                                 storetopics._words_dropped(k.keywords, k.keywords_screened,
                                                                            k.keywords_dropped)) AS s
     CROSS JOIN LATERAL (SELECT storetopics._screen(k.label) AS reason) r
     WHERE k.source_id = p_source AND k.store_key = p_store AND k.chunks > 0)
  SELECT coalesce(jsonb_agg(jsonb_build_object(
           'id', k.cluster_id, 'label', k.shown, 'labeller', CASE WHEN k.shown = k.label THEN k.labeller ELSE 'offline' END,
           'phrase', k.phrase, 'share', round(k.share::numeric, 4), 'chunks', k.chunks, 'files', k.files,
           'keywords', to_jsonb(k.keywords),
           'representatives', (SELECT coalesce(jsonb_agg(r -> 'id'), '[]') FROM jsonb_array_elements(k.representatives) r),
           'outliers', k.outliers - k.outliers_at_fit) ORDER BY k.chunks DESC, k.cluster_id), '[]'),
         array_agg(lower(coalesce(k.shown, '') || ' ' || array_to_string(k.keywords, ' '))),
         coalesce(jsonb_agg(jsonb_build_object('in', 'label', 'text', k.label, 'reason', k.reason)
                            ORDER BY k.chunks DESC, k.cluster_id) FILTER (WHERE k.reason IS NOT NULL), '[]')
           || coalesce((SELECT jsonb_agg(d ORDER BY k2.chunks DESC, k2.cluster_id, o)
                          FROM k AS k2, jsonb_array_elements(k2.dropped) WITH ORDINALITY AS x(d, o)),
                       '[]')
    INTO clusters, explained, screened
    FROM k;
END $$;

-- What \df+ shows a DBA.
COMMENT ON FUNCTION storetopics._keywords(int, text, text[], float8[], int, int, text, text[], int[]) IS
  'A store''s dominant (by count) and distinctive (outlier files, dense terms) terms, exact, deterministic.';
COMMENT ON FUNCTION storetopics._contrast_terms(int, text, int, text) IS
  'The terms that tell a store apart from the other stores of its catalog, best first (p ln(p/q) over file shares), exact.';
COMMENT ON FUNCTION storetopics._record_token_counts(text[], int[]) IS
  'Record cl100k token counts of summary chunks, counted by the worker or the CLI with tiktoken.';
COMMENT ON FUNCTION storetopics._render(int, text, boolean) IS
  'Render a store''s summary (store_topics, topics) from its state within 200 cl100k tokens; returns whether it changed (NULL with count_first while token counts are missing).';
