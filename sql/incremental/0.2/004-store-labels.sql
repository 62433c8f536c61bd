-- storetopics 0.2: a keyword-only store's labels from the LLM labeller.  Such a store has no clusters to label:
-- one call per store turns its contrastive terms and the phrases mined from its files into 3-8 labels.  What the
-- clusters keep per cluster (the labels, the words they were made from for the keyword gate, the retry state of a
-- failed call) it keeps per store.
ALTER TABLE storetopics.store_state
  ADD COLUMN store_labels text[],                        -- the labels that passed the checks; NULL: none
  ADD COLUMN store_label_words text[],                   -- the contrastive terms (lexemes) they were made from
  ADD COLUMN store_label_needed boolean,
  ADD COLUMN store_label_failures int,
  ADD COLUMN store_label_retry_at timestamptz,
  ADD COLUMN store_label_error text;
-- (defaults set apart from ADD COLUMN: a column added with a default is refused while functions take the table's
-- row type, as storetopics.render_due does)
ALTER TABLE storetopics.store_state ALTER COLUMN store_label_needed SET DEFAULT false,
                                    ALTER COLUMN store_label_failures SET DEFAULT 0;
UPDATE storetopics.store_state SET store_label_needed = false, store_label_failures = 0;
ALTER TABLE storetopics.store_state ALTER COLUMN store_label_needed SET NOT NULL,
                                    ALTER COLUMN store_label_failures SET NOT NULL;
