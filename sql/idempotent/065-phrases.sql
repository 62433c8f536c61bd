-- ------------------------------------------------------------------------------------------------------------
-- Phrases: offline topic labels people wrote, mined from the store's own text
-- ------------------------------------------------------------------------------------------------------------
-- A label such as "removed support new" (three stems in c-TF-IDF order) tells a reader little; "text editor" or
-- "genome assembly" does.  The offline label of a cluster is therefore a short phrase (2-3 words) that occurs in its
-- files: written by someone, shown as written.  The same miner gives a keyword-only store its topics.

-- Two words a page converter glued ("NotesUsing", "Report a bugSee also", "--config fileUse a textual ..."): a word,
-- then one that starts a line, a heading or a link.  A name written in camel case ("ImageMagick", "digiKam",
-- "setTimeout") is not one of those.  (Under COLLATE "C"; no SET search_path: a constant, inlined where it is read.)
CREATE OR REPLACE FUNCTION storetopics._glued_re() RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN '[a-z]{2}(Use|Using|Print|See|The|Report|Next|Prev|Previous|Chapter|Home|Table|Contents|Download|Search|'
       'Help|Show|Set|Get|Add|This|That|If|For|When|Note|Notes|Example|Default|Specify|Enable|Disable|Display|Read|'
       'Write|Run|Return|Back|Up|Top|Index)(\M|[A-Z])';

-- Why a run of words is a piece of a sentence, not the name of a topic (NULL: it may name one): a run that holds
-- a verb of being or a modal ("value is specified", "tics may"), a verb with its object ("Specifies the widget",
-- "loads this function": a determiner second), a passive ("permitted by law", "generated using makeinfo"), two
-- verbs joined ("clicking and holding"), or that ends where a noun phrase does not ("cover the new", "available
-- locally via", "elements like") or on a verb that reports ("lighttpd provides", "package contains"); a run with such a
-- verb inside ("Sass makes CSS"), one that starts with an adverb ("currently running Perl", "automatically
-- installed") or a preposition ("Upon catalog zone"), and a clause cut short ("used when sending", "useful to
-- adjust", "writing to standard").
-- (No SET search_path, not STRICT, no sub-select, and STABLE as array_to_string() is: a SQL-standard body is bound
-- when it is created, and so the planner inlines it where the miner tests its runs; NULL gives NULL either way.
-- The words have no space in them: lowered as one string and split again, they are each word lowered.)
CREATE OR REPLACE FUNCTION storetopics._clause_fragment(words text[]) RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE
RETURN CASE
  WHEN lower(array_to_string(words, ' ')) IN ('table of contents', 'available languages', 'see also', 'see chapter',
       'next topic', 'previous topic', 'quick search', 'contact us', 'report a bug', 'back to top', 'skip to content',
       'edit this page', 'keep in mind', 'this page', 'main page', 'home page') THEN 'page chrome'
  WHEN string_to_array(lower(array_to_string(words, ' ')), ' ') && ARRAY['http', 'https', 'www', 'ftp'] THEN 'address'
  WHEN array_to_string(words, ' ') COLLATE "C" ~ storetopics._glued_re() THEN 'glued'
  WHEN string_to_array(lower(array_to_string(words, ' ')), ' ') && ARRAY['is', 'are', 'was', 'were', 'be', 'been',
       'being', 'am', 'has', 'have', 'had', 'does', 'did', 'can', 'could', 'will', 'would', 'shall', 'should', 'may',
       'might', 'must'] THEN 'verb'
  WHEN cardinality(words) >= 3 AND lower(words[2]) IN ('the', 'a', 'an', 'this', 'that', 'these', 'those', 'its',
       'their', 'his', 'her', 'our', 'your', 'my', 'any', 'each', 'every', 'some', 'all', 'no') THEN 'verb and object'
  WHEN storetopics._letter_then(lower(words[1]), 'ed') AND lower(words[2]) IN ('by', 'using', 'with', 'from', 'for',
       'to', 'in', 'on', 'as', 'into', 'via', 'at') THEN 'passive'
  WHEN cardinality(words) >= 3 AND lower(words[2]) IN ('when', 'whenever', 'if', 'unless', 'while', 'where',
       'because', 'although', 'before', 'after', 'until', 'once', 'whether', 'like', 'unlike')
       OR (storetopics._letter_then(lower(words[1]), 'ed') OR storetopics._letter_then(lower(words[1]), 'ing')
           OR storetopics._letter_then(lower(words[1]), 'ful') OR storetopics._letter_then(lower(words[1]), 'ble'))
          AND lower(words[2]) = 'to' THEN 'clause'
  WHEN lower(words[1]) IN ('currently', 'automatically', 'usually', 'typically', 'sometimes', 'often', 'always',
       'never', 'simply', 'easily', 'directly', 'generally', 'normally', 'actually', 'really', 'mostly', 'mainly',
       'also', 'already', 'then', 'thus', 'therefore', 'however', 'obviously', 'clearly', 'especially',
       'particularly', 'possibly', 'probably', 'essentially', 'basically', 'commonly', 'frequently', 'rarely',
       'previously', 'merely', 'fairly', 'quite', 'rather') THEN 'adverb at its start'
  WHEN lower(words[1]) IN ('upon', 'of', 'from', 'into', 'onto', 'via', 'by', 'at', 'within', 'without', 'during',
       'whose', 'which', 'whom') THEN 'preposition at its start'
  WHEN cardinality(words) = 3 AND lower(words[2]) IN ('and', 'or') AND words[1] = lower(words[1])
       AND (right(words[1], 3) = 'ing' OR right(words[1], 2) = 'ed' OR right(words[3], 3) = 'ing'
            OR right(words[3], 2) = 'ed' OR words[3] = lower(words[3])) THEN 'verbs joined'
  WHEN lower(words[cardinality(words)]) IN ('new', 'old', 'same', 'other', 'such', 'own', 'many', 'much', 'more',
       'most', 'few', 'several', 'various', 'certain', 'given', 'following', 'above', 'below', 'soon', 'also', 'only',
       'just', 'even', 'well', 'very', 'too', 'via', 'available', 'possible', 'able', 'used', 'returned',
       'specified', 'listed', 'provided', 'required', 'needed', 'called', 'named', 'defined', 'shown', 'found',
       'done', 'made', 'see', 'etc', 'except', 'including', 'unless', 'whether', 'instead', 'therefore', 'thus',
       'however', 'like', 'unlike', 'installed', 'enabled', 'disabled', 'configured', 'loaded', 'compiled',
       'selected', 'supported', 'placed', 'particularly', 'automatically', 'usually', 'typically', 'currently',
       'directly', 'simply', 'easily', 'generally', 'normally', 'actually', 'really', 'mostly', 'mainly', 'entirely',
       'fully', 'quickly', 'correctly', 'properly', 'respectively', 'explicitly', 'manually', 'locally',
       'globally') THEN 'no noun at its end'
  WHEN lower(words[cardinality(words)]) IN ('provides', 'contains', 'knows', 'allows', 'supports', 'uses',
       'requires', 'includes', 'returns', 'specifies', 'describes', 'explains', 'shows', 'lets', 'makes', 'takes',
       'gives', 'means', 'needs', 'loads', 'evaluates', 'generates', 'creates', 'defines', 'sets', 'gets', 'runs',
       'reads', 'writes', 'prints', 'displays', 'enables', 'disables', 'causes', 'determines', 'indicates',
       'controls', 'selects', 'changes', 'applies', 'becomes', 'remains', 'follows', 'works', 'handles', 'accepts',
       'expects', 'produces', 'performs', 'tells', 'says', 'states', 'receives', 'sends', 'means', 'tries',
       'checks', 'looks', 'finds', 'keeps', 'adds', 'removes', 'stops', 'starts', 'waits') THEN 'verb at its end'
  WHEN string_to_array(lower(array_to_string(words[2:cardinality(words) - 1], ' ')), ' ') && ARRAY['provides',
       'contains', 'allows', 'supports', 'requires', 'includes', 'returns', 'specifies', 'describes', 'explains',
       'shows', 'lets', 'makes', 'takes', 'gives', 'loads', 'evaluates', 'generates', 'creates', 'defines', 'gets',
       'enables', 'disables', 'causes', 'determines', 'indicates', 'becomes', 'remains', 'works', 'handles',
       'accepts', 'expects', 'produces', 'performs', 'tells', 'says', 'receives', 'sends', 'tries', 'finds', 'keeps',
       'adds', 'removes', 'waits', 'knows', 'uses'] THEN 'verb inside'
  WHEN lower(words[1]) IN ('means', 'provides', 'contains', 'allows', 'requires', 'includes', 'returns', 'specifies',
       'describes', 'explains', 'shows', 'lets', 'makes', 'takes', 'gives', 'loads', 'evaluates', 'generates',
       'creates', 'defines', 'sets', 'gets', 'causes', 'determines', 'indicates', 'controls', 'selects', 'changes',
       'applies', 'enables', 'disables', 'tells', 'says', 'receives', 'sends') THEN 'verb at its start'
END;

-- The reader's query for _mine_phrases (storetopics._reader_body puts it in read_<id>): sample_texts (files, store),
-- (file_key, t), 3 chunks of each file (chosen by content, not by row: the same texts give the same phrases however
-- they were written), 1,500 characters each.
CREATE OR REPLACE FUNCTION storetopics._phrase_reads(src storetopics.sources) RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
RETURN storetopics._read_arm('sample_texts', format($q$
      SELECT x.f, x.t FROM (SELECT (%1$s)::text AS f, left((storetopics._dehyphenated(%2$s))::text, 1500) AS t,
                                   row_number() OVER (PARTITION BY (%1$s)::text
                                                      ORDER BY pg_catalog.md5((%2$s)::text), %3$s) AS r
                              FROM %4$s) x
       WHERE x.r <= 3$q$, src.file_sql, src.content_sql, storetopics._chunk_ref_sql(src.chunks),
  format('%s AS c WHERE %s AND %s', src.chunks, storetopics._read_by_files(src), storetopics._read_by_store(src))),
  'files, store');

-- Mines phrases for groups of files.  Input: p_files, [{grp, file_key}], the files of each group (a cluster, or a
-- whole store), and p_words, [{grp, lexeme, weight}], the words a group's phrases should be made of.  Returns
-- (grp, phrase, one_file, hits, score, rank); hits: how many of its words weigh 0.5 or more for the group (a
-- cluster's three first words).
-- A phrase is a run of 2-3 different words within a clause (never across punctuation), letters only, its first and
-- last word no stopword, at least one of its words (as a lexeme) weighted for the group; it must occur in two of the group's
-- files (one file's names are no topic).  Score: files it occurs in x (1 + weight of its words) x how rare it is in
-- the other groups (log(1 + groups / groups holding it)).  Shown in its most common spelling.  After those rank the
-- runs that occur in a single file, then single weighted words ("debootstrap", "Docker"), which a keyword-only
-- store's topics take rather than none.
-- No JIT: planned over temp tables and unnested arrays, these statements are estimated at orders of magnitude more
-- rows than they have, which buys them an LLVM compilation that takes longer than they run (bench/README.md).  No
-- merge joins either: on those estimates the planner sorts every run by collation to merge it with the words.
-- (About 110 lines: its input, the clauses, their words and runs are temp tables made and dropped here, which several
-- of its statements read.)
CREATE OR REPLACE FUNCTION storetopics._mine_phrases(p_source int, p_store text, p_files jsonb, p_words jsonb)
RETURNS TABLE (grp int, phrase text, one_file boolean, hits bigint, score numeric, rank bigint)
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp SET jit = off SET enable_mergejoin = off AS $$
#variable_conflict use_column
DECLARE
  v_cfg regconfig := (SELECT s.ts_config FROM storetopics.sources s WHERE s.id = p_source);
  v_groups int;
  v_files bigint := (SELECT st.files FROM storetopics.store_state st
                      WHERE st.source_id = p_source AND st.store_key = p_store);
  v_words bigint := (SELECT st.words FROM storetopics.store_state st
                      WHERE st.source_id = p_source AND st.store_key = p_store);
  v_script text := storetopics._store_script(p_source, p_store);
  v_noise text[];
BEGIN
  -- (its input as temp tables too: joined to 10^5 n-grams, they are planned on their real sizes)
  CREATE TEMP TABLE storetopics_mine_files ON COMMIT DROP AS
  SELECT f.grp, f.file_key FROM jsonb_to_recordset(p_files) AS f(grp int, file_key text);
  CREATE TEMP TABLE storetopics_mine_words ON COMMIT DROP AS
  SELECT w.grp, w.lexeme, w.weight FROM jsonb_to_recordset(p_words) AS w(grp int, lexeme text, weight numeric);
  v_groups := (SELECT count(DISTINCT g.grp) FROM pg_temp.storetopics_mine_files g);
  EXECUTE format('CREATE TEMP TABLE storetopics_mine_texts ON COMMIT DROP AS SELECT * FROM %s(''sample_texts'', $1, '
                 '$2, NULL) AS r(file_key text, t text)', storetopics._reader(p_source))
    USING ARRAY(SELECT DISTINCT g.file_key FROM pg_temp.storetopics_mine_files g), p_store;
  -- the clauses (never across punctuation), each the array of its words
  CREATE TEMP TABLE storetopics_mine_clauses ON COMMIT DROP AS
  SELECT row_number() OVER () AS cid, x.file_key, a.a
    FROM pg_temp.storetopics_mine_texts x,
         regexp_split_to_table(x.t, '[.,;:!?()\[\]{}"<>|/\\=*#`~_\t\r\n]+|\s-+\s') AS cl(clause),
         regexp_split_to_array(btrim(cl.clause), '\s+') AS a(a);
  -- each distinct word once (not once per occurrence): its shape, its lower case
  CREATE TEMP TABLE storetopics_mine_raw ON COMMIT DROP AS
  SELECT x.w, x.w ~ '^[[:alpha:]][[:alpha:]''-]*[[:alpha:]]$' AND length(x.w) <= 30 AS ok, lower(x.w) AS lw
    FROM (SELECT DISTINCT unnest(c.a) AS w FROM pg_temp.storetopics_mine_clauses c) x;
  -- each distinct word of that shape (lower case) and its lexeme (none: a stopword)
  CREATE TEMP TABLE storetopics_mine_lex ON COMMIT DROP AS
  SELECT w.word, (tsvector_to_array(to_tsvector(v_cfg, w.word)))[1] AS lexeme
    FROM (SELECT DISTINCT r.lw AS word FROM pg_temp.storetopics_mine_raw r WHERE r.ok) w;
  -- the words of the groups' lexemes: a run none of whose words is one of them is weighted in no group, so it is
  -- no phrase, and leaves no group's count of any other run (the spread) changed: those runs are left out first
  -- (at 10k realistic chunks 43k of the 107k distinct runs are kept for the grouping below: the 4 stores' phrases
  -- mined again 6.5 -> 5.7 s)
  CREATE TEMP TABLE storetopics_mine_weighted ON COMMIT DROP AS
  SELECT DISTINCT l.word FROM pg_temp.storetopics_mine_lex l
    JOIN pg_temp.storetopics_mine_words mw ON mw.lexeme = l.lexeme WHERE mw.weight > 0;
  -- per clause, for each of its words: its shape, its lower case, whether it has a lexeme, whether it is weighted
  -- (one join per distinct word, then arrays: a run's tests below are array look-ups; the words sorted once by
  -- clause and position and aggregated in that order: an ORDER BY in each aggregate sorted every clause four times.
  -- A subquery with ORDER BY is not flattened, an aggregate reads its rows as they come, and temp tables are never
  -- read in parallel, so each array is in the words' order; the phrases mined both ways were compared, the same.)
  CREATE TEMP TABLE storetopics_mine_flags ON COMMIT DROP AS
  SELECT u.cid, array_agg(u.ok) AS ok, array_agg(u.lw) AS lw, array_agg(u.lex) AS lex, array_agg(u.wt) AS wt
    FROM (SELECT u.cid, r.ok, r.lw, l.lexeme IS NOT NULL AS lex, x.word IS NOT NULL AS wt
            FROM (SELECT c.cid, w.w, w.o
                    FROM pg_temp.storetopics_mine_clauses c, unnest(c.a) WITH ORDINALITY AS w(w, o)) u
            JOIN pg_temp.storetopics_mine_raw r ON r.w = u.w
            LEFT JOIN pg_temp.storetopics_mine_lex l ON r.ok AND l.word = r.lw
            LEFT JOIN pg_temp.storetopics_mine_weighted x ON r.ok AND x.word = r.lw
           ORDER BY u.cid, u.o) u
   GROUP BY u.cid;
  -- every run of 1-3 words of a clause that may be a phrase, one row per occurrence: words of the shape, no word
  -- twice, its first and last word no stopword, one of its words weighted (no window over the words: their sort
  -- costs more than the rest)
  CREATE TEMP TABLE storetopics_mine_grams ON COMMIT DROP AS
  SELECT c.file_key, v.len, c.a[i:i + v.len - 1] AS words
    FROM pg_temp.storetopics_mine_clauses c JOIN pg_temp.storetopics_mine_flags f ON f.cid = c.cid,
         generate_series(1, cardinality(c.a)) AS i, (VALUES (1), (2), (3)) AS v(len)
   WHERE i + v.len - 1 <= cardinality(c.a)
     AND f.ok[i] AND (v.len < 2 OR f.ok[i + 1]) AND (v.len < 3 OR f.ok[i + 2])
     AND (v.len < 2 OR f.lw[i] <> f.lw[i + 1])
     AND (v.len < 3 OR (f.lw[i] <> f.lw[i + 2] AND f.lw[i + 1] <> f.lw[i + 2]))
     AND f.lex[i] AND f.lex[i + v.len - 1]
     AND (f.wt[i] OR (v.len >= 2 AND f.wt[i + 1]) OR (v.len = 3 AND f.wt[i + 2]));
  -- the words that are noise in this store (storetopics._noise: page chrome, dates, fragments): no phrase holds one
  v_noise := ARRAY(
    SELECT l.word FROM pg_temp.storetopics_mine_lex l
      JOIN storetopics.lexemes x ON x.lexeme = l.lexeme
      -- (probed per word, OFFSET 0: see storetopics._novelty_moves)
      CROSS JOIN LATERAL (SELECT t.files, t.total, t.total_sq FROM storetopics.store_terms t
                           WHERE t.source_id = p_source AND t.store_key = p_store AND t.term_id = x.id OFFSET 0) t
     WHERE storetopics._noise(l.lexeme, t.files, t.total, t.total_sq, v_files, v_words, v_script) IS NOT NULL);
  -- set-based throughout (joins, not per-row look-ups): a store's sample holds 10^5 n-grams
  RETURN QUERY
  WITH per AS (
    SELECT f.grp, lower(array_to_string(g.words, ' ')) AS key, array_to_string(g.words, ' ') AS surface, g.file_key,
           g.words
      FROM pg_temp.storetopics_mine_grams g
      JOIN pg_temp.storetopics_mine_files f ON f.file_key = g.file_key
  ), scored AS (
    -- shown in its most common spelling (mode(): ties go to the first in order)
    SELECT p.grp, p.key, count(DISTINCT p.file_key) AS files, count(*) AS occurrences,
           mode() WITHIN GROUP (ORDER BY p.surface) AS phrase, min(p.words) AS words
      FROM per p GROUP BY 1, 2
  ), weighted AS (
    SELECT u.grp, u.key, sum(mw.weight) AS weight, count(*) FILTER (WHERE mw.weight >= 0.5) AS hits
      FROM (SELECT s.grp, s.key, lower(unnest(s.words)) AS w FROM scored s) u
      JOIN pg_temp.storetopics_mine_lex l ON l.word = u.w
      JOIN pg_temp.storetopics_mine_words mw ON mw.grp = u.grp AND mw.lexeme = l.lexeme
     GROUP BY 1, 2
  ), spread AS (
    SELECT s.key, count(*) AS groups FROM scored s GROUP BY 1
  ), sizes AS (
    SELECT f.grp, count(*) AS files FROM pg_temp.storetopics_mine_files f GROUP BY 1
  )
  -- the tests of a phrase's words (noise, a piece of a sentence) on the weighted phrases only (OFFSET 0 keeps them
  -- above the joins): a key they drop is dropped whole, so the spread of the others is the same.  Nor is page chrome
  -- a topic (storetopics._page_chrome: "Mailing Lists" in a site's header), though its words are the store's own
  SELECT y.grp, y.phrase, y.one_file, y.hits, round(y.score::numeric, 9),
         row_number() OVER (PARTITION BY y.grp ORDER BY cardinality(y.words) = 1, y.one_file, y.score DESC, y.phrase)
    FROM (SELECT s.grp, s.key, s.phrase, s.words, s.files < least(2, z.files) AS one_file, w.hits,
                 s.files * (1 + w.weight) * ln(1 + v_groups::float8 / sp.groups) AS score,
                 storetopics._page_chrome(s.files, s.occurrences, z.files, v_files, v_words) AS chrome
            FROM scored s JOIN weighted w USING (grp, key) JOIN spread sp USING (key) JOIN sizes z USING (grp)
           WHERE w.weight > 0 OFFSET 0) y
   WHERE NOT string_to_array(y.key, ' ') && v_noise AND storetopics._clause_fragment(y.words) IS NULL
     AND NOT y.chrome;
  DROP TABLE pg_temp.storetopics_mine_files, pg_temp.storetopics_mine_words, pg_temp.storetopics_mine_texts,
             pg_temp.storetopics_mine_clauses, pg_temp.storetopics_mine_raw, pg_temp.storetopics_mine_lex,
             pg_temp.storetopics_mine_weighted, pg_temp.storetopics_mine_flags, pg_temp.storetopics_mine_grams;
END $$;

-- The clusters' offline labels, mined for all of a store's clusters together (a phrase's rarity is counted across
-- them) from each cluster's 20 most committed files, and only when what they would be mined from changed: the
-- clusters' words or those files' counted words (store_state.cluster_phrases_from, a digest).  So a phrase is a
-- function of the store's state, not of the path that led there.  No JIT: the estimate of the per-file lookups is
-- far too high (as over unnested arrays, storetopics._cluster_keywords), and buys a compilation longer than them.
CREATE OR REPLACE FUNCTION storetopics._cluster_phrases(p_source int, p_store text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp SET jit = off AS $$
DECLARE
  v_cfg regconfig := (SELECT s.ts_config FROM storetopics.sources s WHERE s.id = p_source);
  v_words jsonb;   -- [{grp, lexeme, weight}]: the clusters' words, best first
  v_files jsonb;   -- [{grp, file_key}]: each cluster's 20 most committed files
  v_from text;
BEGIN
  SELECT coalesce(jsonb_agg(jsonb_build_object('grp', w.grp, 'lexeme', w.lexeme, 'weight', w.weight)
                            ORDER BY w.grp, w.lexeme), '[]'),
         coalesce(string_agg(w.grp || ':' || w.lexeme || ':' || w.weight, ',' ORDER BY w.grp, w.lexeme), '')
    INTO v_words, v_from
    FROM (SELECT k.cluster_id AS grp, l.lexeme, max(1.0 / (1 + u.i / 3.0)) AS weight
            FROM storetopics.clusters k, unnest(k.keywords[1:15]) WITH ORDINALITY AS u(w, i),
                 LATERAL unnest(tsvector_to_array(to_tsvector(v_cfg, u.w))) AS l(lexeme)
           WHERE k.source_id = p_source AND k.store_key = p_store AND k.chunks > 0
           GROUP BY 1, 2) w;
  SELECT coalesce(jsonb_agg(jsonb_build_object('grp', x.grp, 'file_key', x.file_key) ORDER BY x.grp, x.file_key), '[]'),
         md5(v_from || '|' ||
             coalesce(string_agg(x.grp || ':' || x.file_key || ':' || x.digest, ',' ORDER BY x.grp, x.file_key), ''))
    INTO v_files, v_from
    FROM (SELECT k.grp, k.file_key, d.digest
            FROM (SELECT u.cluster_id AS grp, c.file_key,
                         row_number() OVER (PARTITION BY u.cluster_id ORDER BY u.n::float8 / greatest(c.chunks, 1) DESC,
                                                                               hashtext(c.file_key), c.file_key) AS r
                    FROM storetopics.file_clusters c, unnest(c.cluster_ids, c.cluster_chunks) AS u(cluster_id, n)
                   WHERE c.source_id = p_source AND c.store_key = p_store
                     AND u.cluster_id IN (SELECT (w ->> 'grp')::int FROM jsonb_array_elements(v_words) w)) k,
                 -- the counted words' digest of the kept files only (in this statement's snapshot; OFFSET 0 keeps
                 -- it a lookup per kept file)
                 LATERAL (SELECT storetopics._terms_digest(f.term_ids, f.counts) AS digest
                            FROM storetopics.file_terms f
                           WHERE f.source_id = p_source AND md5(f.file_key)::uuid = md5(k.file_key)::uuid
                             AND f.file_key = k.file_key AND f.store_key = p_store OFFSET 0) d
           WHERE k.r <= 20) x;
  IF v_from IS NOT DISTINCT FROM (SELECT st.cluster_phrases_from FROM storetopics.store_state st
                                   WHERE st.source_id = p_source AND st.store_key = p_store) THEN
    RETURN;
  END IF;
  -- a run of words two of its files share, else one file's run that holds two of the cluster's three first words:
  -- where there is neither, those three words say more to a router than a single word or one file's other phrases
  -- (measured: bench/README.md, "Offline labels")
  WITH best AS MATERIALIZED (
    SELECT DISTINCT ON (m.grp) m.grp, m.phrase
      FROM storetopics._mine_phrases(p_source, p_store, v_files, v_words) m
     WHERE strpos(m.phrase, ' ') > 0 AND (NOT m.one_file OR m.hits >= 2)
     ORDER BY m.grp, m.rank)
  UPDATE storetopics.clusters k
     SET phrase = (SELECT b.phrase FROM best b WHERE b.grp = k.cluster_id)
   WHERE k.source_id = p_source AND k.store_key = p_store;
  UPDATE storetopics.store_state SET cluster_phrases_from = v_from WHERE source_id = p_source AND store_key = p_store;
END $$;

-- A keyword-only store's topics (it has no clusters): up to 8 phrases made of its contrastive terms, from the 40
-- files that hold most of them; mined again when those terms or those files' counted words change
-- (store_state.phrases_from, a digest).  Returns the phrases.
CREATE OR REPLACE FUNCTION storetopics._store_phrases(p_source int, p_store text, p_terms text[]) RETURNS text[]
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  st storetopics.store_state;
  v_files jsonb;   -- [{grp: 0, file_key}]
  v_phrases text[];
  v_from text;
  -- the terms' ids (looked up once: joined per pair of a file and a term, each pair probed the lexemes by id)
  v_ids int[] := ARRAY(SELECT x.id FROM storetopics.lexemes x WHERE x.lexeme = ANY (p_terms[1:30]));
BEGIN
  SELECT * INTO st FROM storetopics.store_state WHERE source_id = p_source AND store_key = p_store;
  SELECT coalesce(jsonb_agg(jsonb_build_object('grp', 0, 'file_key', x.file_key) ORDER BY x.file_key), '[]'),
         md5(array_to_string(p_terms[1:30], ' ') || '|' ||
             coalesce(string_agg(x.file_key || ':' || d.digest, ',' ORDER BY x.file_key), ''))
    INTO v_files, v_from
    FROM (SELECT f.file_key, count(*) AS hits
            FROM storetopics.file_terms f, unnest(f.term_ids) AS u(term_id)
           WHERE f.source_id = p_source AND f.store_key = p_store AND u.term_id = ANY (v_ids)
           GROUP BY 1 ORDER BY 2 DESC, hashtext(f.file_key), 1 LIMIT 40) x,
         -- the counted words' digest of those 40 files only, looked up per file (grouped on with the files, it was
         -- computed for every pair of a file and a term it holds; OFFSET 0 keeps it a lookup)
         LATERAL (SELECT storetopics._terms_digest(f.term_ids, f.counts) AS digest
                    FROM storetopics.file_terms f
                   WHERE f.source_id = p_source AND md5(f.file_key)::uuid = md5(x.file_key)::uuid
                     AND f.file_key = x.file_key AND f.store_key = p_store OFFSET 0) d;
  IF st.phrases_from IS NOT DISTINCT FROM v_from THEN
    RETURN st.phrases;
  END IF;
  -- distinct phrases that share no word with a better one; phrases of a single file and single words (they rank
  -- after the others) only to make up three topics: beyond that the terms list says them
  -- (a temp table made and dropped here: the pick below reads it once per phrase it takes)
  CREATE TEMP TABLE storetopics_mined ON COMMIT DROP AS
  SELECT * FROM storetopics._mine_phrases(
    p_source, p_store, v_files,
    (SELECT coalesce(jsonb_agg(jsonb_build_object('grp', 0, 'lexeme', u.lexeme, 'weight', 1.0 / (1 + u.i / 5.0))
                               ORDER BY u.i), '[]')
       FROM unnest(p_terms[1:30]) WITH ORDINALITY AS u(lexeme, i)));
  v_phrases := ARRAY(
    WITH RECURSIVE pick AS (
      SELECT 1 AS n, m.rank, ARRAY[m.phrase] AS phrases, regexp_split_to_array(lower(m.phrase), ' ') AS used
        FROM pg_temp.storetopics_mined m WHERE m.rank = 1
      UNION ALL
      SELECT p.n + 1, m.rank, p.phrases || m.phrase, p.used || regexp_split_to_array(lower(m.phrase), ' ')
        FROM pick p, LATERAL (SELECT * FROM pg_temp.storetopics_mined m
                               WHERE m.rank > p.rank AND NOT regexp_split_to_array(lower(m.phrase), ' ') && p.used
                                 AND ((strpos(m.phrase, ' ') > 0 AND NOT m.one_file) OR p.n < 3)
                               ORDER BY m.rank LIMIT 1) m
       WHERE p.n < 8)
    SELECT unnest(phrases) FROM (SELECT phrases FROM pick ORDER BY n DESC LIMIT 1) x);
  DROP TABLE pg_temp.storetopics_mined;
  UPDATE storetopics.store_state SET phrases = v_phrases, phrases_from = v_from
   WHERE source_id = p_source AND store_key = p_store;
  RETURN v_phrases;
END $$;
