-- storetopics 0.2: what render keeps of a store's file novelty between renders (storetopics._outlier_files), so that
-- a render after a small change reads the files that changed, not every (file, term) pair of the store.  Derived
-- state: dropped and computed again whenever it cannot vouch for the exact result (not dumped by pg_dump).
-- Unlogged: writing it costs no WAL, and after a crash the three tables are empty together, and computed again.
CREATE UNLOGGED TABLE storetopics.novelty_state (
  source_id int NOT NULL,
  store_key text NOT NULL,
  rare      int NOT NULL,           -- terms in at most this many files then have their postings kept
  dfs       int[] NOT NULL,         -- the files holding each term then, by term id (0, or past the end: none)
  numbered  int NOT NULL,           -- the files numbered then (1 .. numbered) ...
  ranked    int NOT NULL,           -- ... of which 1 .. ranked have counted words, numbered by novelty then, lowest first
  bands     int[] NOT NULL,         -- the other terms' bands by their files then (storetopics._novelty_bands())
  per_word  float8[] NOT NULL,      -- per band, the largest sensitivity per counted word of those files
  gone      int[] NOT NULL DEFAULT '{}',   -- the numbers of the files folded since (changed, moved or deleted)
  words     int[] NOT NULL,         -- the counted words of each numbered file then, by number
  -- the terms whose counts fold changed since, each once (NULL: too many to list; every term is compared), and in
  -- step their counts in the store now (files 0: it holds the term no more): read with them, not looked up
  touched   int[] DEFAULT '{}',
  touched_files     int[] DEFAULT '{}',
  touched_totals    bigint[] DEFAULT '{}',
  touched_totals_sq bigint[] DEFAULT '{}',
  -- what the rare terms' moves came to at the last render (storetopics._outlier_files): the rare terms that had
  -- moved and by how much, and per file they hold (by number) the sum of count x move: the next render adds the
  -- postings of the terms whose move changed since
  rare_moved    int[],
  rare_moved_by bigint[],
  file_moves_ns int[],
  file_moves    bigint[],
  -- the heads of two rankings of the store's terms then, ties by id: the terms of the 400 first by total count and
  -- of the 400 first by files, by id, with their counts then, and each ranking's 400th count (NULL: the store had no
  -- more terms).  A term neither in the heads nor touched since still has at most that count, so the heads and the
  -- touched terms hold every term that can rank above it (storetopics._kept_head: the dominant terms and the
  -- store's script after a small change, without a sort of every term of the store)
  head_ids       int[],
  head_files     int[],
  head_totals    bigint[],
  head_totals_sq bigint[],
  by_total_cut  bigint,
  by_files_cut  int,
  -- the head of the ranking by contrast then (storetopics._keep_contrast): the 400 best terms, a bound on every
  -- other's score then (NULL: no other term qualified), what those scores were of ({the store's files, the
  -- catalog's files, its stores}), and how far the catalog's list of touched terms went then (its catalog,
  -- generation and length, storetopics.catalog_touched)
  by_contrast       int[],
  by_contrast_cut   float8,
  contrast_basis    float8[],
  contrast_catalog  text,
  catalog_generation bigint,
  catalog_position  int,
  PRIMARY KEY (source_id, store_key)
);
-- One row per file of a store that has a novelty_state: its sums as they were then (n NULL: the file was folded
-- since, its row is a placeholder that fold writes, and each render computes the file again).
CREATE UNLOGGED TABLE storetopics.file_novelty (
  source_id int NOT NULL,
  store_key text NOT NULL,
  file_key  text NOT NULL,
  n         int,                    -- the file's number (in the postings, and its rank by novelty then)
  total     bigint,                 -- sum over its counted terms of count x ln(files holding it), in units of 1e-9
  words     bigint,                 -- its counted terms
  apart     boolean,                -- every chunk of it lies beyond its nearest cluster's radius
  far       boolean,                -- ... far beyond (storetopics._file_far)
  -- per band of its terms in more than `rare` files, the sum of count / files: a term's ln(files) moves by at most
  -- (how many files it gained or lost) / files, so these bound how far the file's sum moves through those terms
  sensitivity float8[]
);
CREATE INDEX file_novelty_store ON storetopics.file_novelty (source_id, store_key, n);
CREATE INDEX file_novelty_file ON storetopics.file_novelty (source_id, (md5(file_key)::uuid));
-- (the few files of a store found apart: their bar is lower, they are looked at by number, apart from the others)
CREATE INDEX file_novelty_apart ON storetopics.file_novelty (source_id, store_key, n) WHERE apart OR far;
-- The files (by number) and counts of each rare term, as they were: a term whose document frequency moved since
-- moves the novelty of exactly these files.
CREATE UNLOGGED TABLE storetopics.novelty_postings (
  source_id int NOT NULL,
  store_key text NOT NULL,
  term_id   int NOT NULL,
  file_ns   int[] NOT NULL,
  counts    int[] NOT NULL,
  PRIMARY KEY (source_id, store_key, term_id)
);
-- keywords() is given the outlier files (storetopics._outlier_files) instead of computing them: the idempotent part
-- makes it anew.
DO $$
BEGIN
  IF to_regprocedure('storetopics._keywords(int, text, int, int)') IS NOT NULL THEN
    DROP FUNCTION storetopics._keywords(int, text, int, int);
  END IF;
END $$;

-- Per catalog, the terms whose counts in it changed (storetopics._catalog_apply), in order, with repeats: a store's
-- kept contrast head (novelty_state.by_contrast) needs only the terms listed after its position.  Past 100k terms
-- the list starts again, empty, under the next generation, and every head kept before it is computed again.
-- Unlogged, as novelty_state: after a crash both are empty.
CREATE UNLOGGED TABLE storetopics.catalog_touched (
  catalog    text PRIMARY KEY,
  generation bigint NOT NULL DEFAULT 1,
  touched    int[] NOT NULL DEFAULT '{}'
);
