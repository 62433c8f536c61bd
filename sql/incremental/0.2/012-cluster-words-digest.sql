-- storetopics 0.2: what the clusters' words were last computed from (storetopics._cluster_keywords): a digest of
-- the files each cluster's words are counted over and of their counted words.  While it holds, a change of the
-- store elsewhere leaves the words as they are without computing them again.  NULL: compute them again.
ALTER TABLE storetopics.store_state ADD COLUMN cluster_words_from text;
