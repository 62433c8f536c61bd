-- storetopics 0.2: storetopics._analyze_if_stale compares the statistics' estimate of a store's (or a source's) rows
-- with its files, not the rows one statement wrote with the table's size (sql/idempotent/040-fold.sql).
DROP FUNCTION IF EXISTS storetopics._analyze_if_stale(bigint);
