-- storetopics 0.2: the screen's verdict on each cluster's words, kept with them (storetopics._cluster_keywords): the
-- positions screen_words() leaves out, and a digest of the build and the words they are of
-- (storetopics._words_screen_key).  Render uses the positions while the digest holds (the same words, screened by
-- the same build), else screens the words again.
ALTER TABLE storetopics.clusters ADD COLUMN keywords_dropped int[], ADD COLUMN keywords_screened text;
