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
  -- the terms whose files fold changed since, with repeats (NULL: too many to list; every term is compared)
  touched   int[] DEFAULT '{}',
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
-- (the few far files of a store, looked at whatever their novelty then)
CREATE INDEX file_novelty_far ON storetopics.file_novelty (source_id, store_key) WHERE far;
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
