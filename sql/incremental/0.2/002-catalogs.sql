-- storetopics 0.2: catalogs.  A router chooses among the stores of a catalog (by default the stores of one source;
-- settings.catalog groups several sources into one), so a summary's terms are ranked by how much they tell its
-- store apart from the others.  The catalog-wide background is kept as exact sums by fold, like the stores' own
-- statistics, so rendering one store costs the same in a catalog of 10 stores or of 10,000.

-- Per catalog and term: its count in all the catalog's stores, and in how many stores it occurs.
CREATE TABLE storetopics.catalog_terms (
  catalog text NOT NULL,
  term_id int NOT NULL,                      -- storetopics.lexemes
  total   bigint NOT NULL,
  stores  int NOT NULL,
  PRIMARY KEY (catalog, term_id)
);

-- The background of the stores attached so far (0.1 kept no catalogs): every source is its own catalog.
INSERT INTO storetopics.catalog_terms (catalog, term_id, total, stores)
SELECT 'source:' || t.source_id, t.term_id, sum(t.total), count(*)
  FROM storetopics.store_terms t
 GROUP BY 1, 2;

-- Files holding the term, summed over the catalog's stores: what the contrast is computed from (a term in most files
-- of one store and few of the others tells that store apart).
ALTER TABLE storetopics.catalog_terms ADD COLUMN files bigint NOT NULL DEFAULT 0;
UPDATE storetopics.catalog_terms c SET files = x.files
  FROM (SELECT 'source:' || t.source_id AS catalog, t.term_id, sum(t.files) AS files
          FROM storetopics.store_terms t GROUP BY 1, 2) x
 WHERE c.catalog = x.catalog AND c.term_id = x.term_id;
ALTER TABLE storetopics.catalog_terms ALTER COLUMN files DROP DEFAULT;

-- How many cl100k tokens a piece of a summary costs (a space-separated chunk with its leading space): counted by
-- the real tokenizer (tiktoken, offline) in the worker or the CLI before they render; render adds them up, and takes
-- a chunk it finds no count for at one token per byte, which no tokenizer exceeds.  cl100k never merges across a
-- space, so the sum over a text's chunks is the text's count.
CREATE TABLE storetopics.token_counts (
  chunk  text PRIMARY KEY,
  tokens int NOT NULL
);

-- Offline labels are phrases mined from the cluster's own text (storetopics._mine_phrases); the store keeps a digest
-- of what its clusters' phrases were mined from (mined again when it changes).
ALTER TABLE storetopics.clusters ADD COLUMN phrase text;
ALTER TABLE storetopics.store_state ADD COLUMN cluster_phrases_from text;
-- A keyword-only store's topics: phrases mined from its files, and a digest of what they were mined from.
ALTER TABLE storetopics.store_state ADD COLUMN phrases text[], ADD COLUMN phrases_from text;
-- The chunks of a store's last candidate summary that have no token count yet (render(..., count_first) returns
-- NULL while there are any: the worker counts them and renders again, one write and one NOTIFY).
ALTER TABLE storetopics.store_state ADD COLUMN uncounted text[];
-- render() and work_render() take count_first now.
DROP FUNCTION IF EXISTS storetopics.render(int, text);
DROP FUNCTION IF EXISTS storetopics.work_render(text, int, text);
-- labels_due() tells the labeller what the other clusters and stores are about now.
DROP FUNCTION IF EXISTS storetopics.labels_due(int, text);
