-- storetopics 0.2: the word a summary shows for a stem is learnt from its owner's texts.  The table was one per text
-- search configuration, filled by whichever store needed a stem first: one tenant's texts chose the words of
-- another's summary ("universe" in a summary of university pages; tests/test_security.py).  Per owner, as catalogs
-- are.  What was learnt is forgotten: each owner's stores learn their words again at their next render.  (_show,
-- whose body reads the old key, first.)
DROP FUNCTION IF EXISTS storetopics._show(regconfig, text);
DELETE FROM storetopics.term_words;
ALTER TABLE storetopics.term_words DROP CONSTRAINT IF EXISTS term_words_pkey;
ALTER TABLE storetopics.term_words ADD COLUMN owner regrole NOT NULL;
ALTER TABLE storetopics.term_words ADD PRIMARY KEY (owner, ts_config, lexeme);
