-- ------------------------------------------------------------------------------------------------------------
-- Tokens: a summary's cl100k tokens, counted in the database
-- ------------------------------------------------------------------------------------------------------------
-- A summary is packed into 200 cl100k tokens, so render must know what each piece costs.  tiktoken splits a text
-- with one regular expression (cl100k's pat_str), then encodes each part by byte-pair merges ranked in
-- storetopics.cl100k.  The pieces of a summary are words with their leading space (" editor,", " files.", " 183"),
-- so the split is written out here for ASCII text, exactly as tiktoken's expression treats it; a piece with any
-- other character is not counted here (render takes it at one token per byte, an upper bound, until the worker or
-- the CLI counts it with tiktoken).  tests/test_tokens.py compares every count with tiktoken's.

-- The parts tiktoken's cl100k expression cuts an ASCII text without line breaks into, in order:
--   '(?i:[sdmt]|ll|ve|re)             a contraction
--   [^\r\n\p{L}\p{N}]?+\p{L}++       letters, with the one other character before them (" editor", "-directory")
--   \p{N}{1,3}+                      up to three digits
--    ?[^\s\p{L}\p{N}]++[\r\n]*+      punctuation, with a space before it (" (", "...")
--   \s++$ | \s+(?!\S) | \s           spaces (a run that ends the text; else all but the last; else one)
CREATE OR REPLACE FUNCTION storetopics._pretokens(t text) RETURNS SETOF text
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  i int := 1;
  n int := length(t);
  m text;
BEGIN
  WHILE i <= n LOOP
    m := substring(t FROM i);
    m := coalesce(substring(m COLLATE "C" FROM '^''(?:[sdmtSDMT]|[lL][lL]|[vV][eE]|[rR][eE])'),
                  substring(m COLLATE "C" FROM '^[^A-Za-z0-9]?[A-Za-z]+'),
                  substring(m COLLATE "C" FROM '^[0-9]{1,3}'),
                  substring(m COLLATE "C" FROM '^ ?[^ \t\f\v\r\nA-Za-z0-9]+'),
                  substring(m COLLATE "C" FROM '^[ \t\f\v]+$'),
                  -- a run of spaces followed by more text: all but its last space (which goes with what follows)
                  CASE WHEN m COLLATE "C" ~ '^[ \t\f\v]{2,}' THEN substring(m COLLATE "C" FROM '^[ \t\f\v]+(?=[ \t\f\v])') END,
                  left(m, 1));
    RETURN NEXT m;
    i := i + length(m);
  END LOOP;
END $$;

-- The number of tokens tiktoken's byte-pair encoding gives one part (its bytes): a part that is a token is one; else
-- the adjacent pair whose merge ranks lowest is merged (the leftmost among equals), until no adjacent pair is a token.
CREATE OR REPLACE FUNCTION storetopics._bpe_count(p bytea) RETURNS int
LANGUAGE plpgsql STABLE STRICT PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  parts bytea[];
  best int;
BEGIN
  IF length(p) <= 1 OR EXISTS (SELECT 1 FROM storetopics.cl100k c WHERE c.token = p) THEN
    RETURN least(length(p), 1);
  END IF;
  parts := ARRAY(SELECT substring(p FROM i FOR 1) FROM generate_series(1, length(p)) AS i);
  LOOP
    best := (SELECT x.i FROM generate_series(1, cardinality(parts) - 1) AS x(i)
               JOIN storetopics.cl100k c ON c.token = parts[x.i] || parts[x.i + 1]
              ORDER BY c.rank, x.i LIMIT 1);
    EXIT WHEN best IS NULL;
    parts := parts[1:best - 1] || (parts[best] || parts[best + 1]) || parts[best + 2:];
  END LOOP;
  RETURN cardinality(parts);
END $$;

-- The cl100k tokens of an ASCII text as tiktoken counts them (without special tokens); NULL for a text with any
-- character outside ASCII or a line break (not counted here).
CREATE OR REPLACE FUNCTION storetopics._count_tokens(t text) RETURNS int
LANGUAGE sql STABLE STRICT PARALLEL SAFE SET search_path = pg_catalog, pg_temp
RETURN CASE WHEN t COLLATE "C" ~ '^[\x20-\x7e\t]*$'
            THEN (SELECT coalesce(sum(storetopics._bpe_count(convert_to(x, 'UTF8'))), 0)::int
                    FROM storetopics._pretokens(t) AS x) END;

-- Counts, in the database, the chunks of a text that storetopics.token_counts has no count for and that are ASCII
-- (each with its leading space, as render costs them); the others stay for the worker or the CLI.  Only the chunks
-- not counted yet are counted (materialised first: as a filter beside the test for a count, the count was pushed
-- below it and taken for every chunk of the text, ~300 per render, most of a render's counting time).
CREATE OR REPLACE FUNCTION storetopics._count_in_database(p_text text) RETURNS void
LANGUAGE sql SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
  WITH c AS MATERIALIZED (
    SELECT DISTINCT ' ' || x.c AS chunk FROM string_to_table(p_text, ' ') AS x(c)
     WHERE x.c <> ''   -- (probed by key, as in _tokens)
       AND (SELECT 1 FROM storetopics.token_counts tc WHERE tc.chunk = ' ' || x.c) IS NULL)
  INSERT INTO storetopics.token_counts (chunk, tokens)
  SELECT n.chunk, n.tokens
    FROM (SELECT c.chunk, storetopics._count_tokens(c.chunk) AS tokens FROM c OFFSET 0) n
   WHERE n.tokens IS NOT NULL
   ORDER BY 1
  ON CONFLICT (chunk) DO NOTHING;
END;
