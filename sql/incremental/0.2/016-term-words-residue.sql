-- storetopics 0.2: a stem whose word its texts write mostly as residue of a page converter is never shown
-- (storetopics._learn_words, storetopics._show): glued to the next word ("Report a bugSee also": 'glued'), or in a
-- link's target ("<#std-iscman-named>": 'link').  NULL: a word people wrote.
ALTER TABLE storetopics.term_words ADD COLUMN residue text CHECK (residue IN ('glued', 'link'));
