-- storetopics 0.2: a stem whose word its texts write glued to the next one by a page converter ("Report a bugSee
-- also", "--config fileUse a textual ...") is never shown (storetopics._learn_words, storetopics._show).
ALTER TABLE storetopics.term_words ADD COLUMN glued boolean NOT NULL DEFAULT false;
