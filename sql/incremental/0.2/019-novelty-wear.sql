-- storetopics 0.2: what keeping a store's novelty cost and what the calls of storetopics._outlier_files since have
-- paid for the uploads piled up since (the bounds widen: more files to look at).  keep_ms: the keep's own time;
-- first_ms: what the first call after it took; wear_ms: over the wear_calls calls since, the sum of what each took
-- beyond that, each no more than its predecessor (storetopics._novelty_worn); last_wear_ms: the last call's part;
-- worn: it is time to keep the novelty again (by the worker between passes, storetopics._keep_worn, else by the
-- next render).
ALTER TABLE storetopics.novelty_state ADD COLUMN keep_ms float8,
                                      ADD COLUMN first_ms float8,
                                      ADD COLUMN wear_ms float8 NOT NULL DEFAULT 0,
                                      ADD COLUMN wear_calls int NOT NULL DEFAULT 0,
                                      ADD COLUMN last_wear_ms float8 NOT NULL DEFAULT 0,
                                      ADD COLUMN worn boolean NOT NULL DEFAULT false;
