-- storetopics 0.2: what render keeps of a store's file novelty between renders (storetopics._outlier_files), so that
-- a render after a small change reads the files that changed, not every (file, term) pair of the store.  Derived
-- state: dropped and computed again whenever it cannot vouch for the exact result (not dumped by pg_dump).
CREATE TABLE storetopics.novelty_state (
  source_id      int NOT NULL,
  store_key      text NOT NULL,
  fit_generation int NOT NULL,      -- the fit the files' "apart" flags are of
  files          bigint NOT NULL,   -- the store's files when it was computed
  rare           int NOT NULL,      -- terms in at most this many files then have their postings kept
  PRIMARY KEY (source_id, store_key)
);
-- One row per file of a store that has a novelty_state: its sums as they were then (n NULL: the file was folded
-- since, its row is a placeholder that fold writes, and each render computes the file again).
CREATE TABLE storetopics.file_novelty (
  source_id int NOT NULL,
  store_key text NOT NULL,
  file_key  text NOT NULL,
  n         int,                    -- the file's number in the postings
  total     bigint,                 -- sum over its counted terms of count x ln(files holding it), in units of 1e-9
  words     bigint,                 -- its counted terms
  apart     boolean                 -- every chunk of it lies beyond its nearest cluster's radius
);
CREATE INDEX file_novelty_store ON storetopics.file_novelty (source_id, store_key, n);
CREATE INDEX file_novelty_file ON storetopics.file_novelty (source_id, (md5(file_key)::uuid));
-- The files (by number) and counts of each rare term, as they were: a term whose document frequency moved since
-- moves the novelty of exactly these files.
CREATE TABLE storetopics.novelty_postings (
  source_id int NOT NULL,
  store_key text NOT NULL,
  term_id   int NOT NULL,
  files     int NOT NULL,           -- the files holding it then
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
