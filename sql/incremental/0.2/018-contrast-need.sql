-- storetopics 0.2: the score the kept contrast head's 160th term had when it was kept (NULL: it held fewer), twice the
-- 80 terms a render takes.  The other stores' files move the bound the head vouches for (storetopics._kept_contrast);
-- once it passes this score, too few of the head's terms may score above it, and the render keeps the head again
-- (storetopics._render_terms) instead of ranking every term of the store at each render until its novelty is kept.
ALTER TABLE storetopics.novelty_state ADD COLUMN by_contrast_need float8;
