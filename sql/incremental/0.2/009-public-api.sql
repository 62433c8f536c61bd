-- storetopics 0.2: one public API.  What a DBA, an application or a router calls keeps a plain name; the worker's
-- protocol and the helpers become internal (`_`-prefixed; workers run them, tenants are not granted them).  The
-- idempotent part makes them under their new names; 0.1's go here.

-- Bodies bound at creation call these two (0.1's work_status() and keywords()): renamed, so that what depends on
-- them follows; the idempotent part then replaces them and their callers.
DO $$
BEGIN
  IF to_regprocedure('storetopics.failing_after()') IS NOT NULL THEN
    ALTER FUNCTION storetopics.failing_after() RENAME TO _failing_after;
  END IF;
  IF to_regprocedure('storetopics.showable_term(text)') IS NOT NULL THEN
    ALTER FUNCTION storetopics.showable_term(text) RENAME TO _showable_term;
  END IF;
END $$;

DROP FUNCTION IF EXISTS storetopics.apply_fit(int, text, jsonb);
DROP FUNCTION IF EXISTS storetopics.claim(text, float8, int);
DROP FUNCTION IF EXISTS storetopics.cluster(int, text);
DROP FUNCTION IF EXISTS storetopics.detach_source(int);   -- detach_dropped() forgets a dropped table's source
DROP FUNCTION IF EXISTS storetopics.fit_due(int, text);
DROP FUNCTION IF EXISTS storetopics.fold(int, int);
DROP FUNCTION IF EXISTS storetopics.keywords(int, text, int, int);
DROP FUNCTION IF EXISTS storetopics.label_ok(text);
DROP FUNCTION IF EXISTS storetopics.lease_held(text, int, text);
DROP FUNCTION IF EXISTS storetopics.next_due();
DROP FUNCTION IF EXISTS storetopics.offline_label(text[]);
DROP FUNCTION IF EXISTS storetopics.record_label(int, text, int, text, text, text, text, int, int, text);
DROP FUNCTION IF EXISTS storetopics.refresh_words(int, text);
DROP FUNCTION IF EXISTS storetopics.render_due(storetopics.store_state);
DROP FUNCTION IF EXISTS storetopics.sources_to_fold();
DROP FUNCTION IF EXISTS storetopics.usable_text(text);
DROP FUNCTION IF EXISTS storetopics.work_done(text, int, text, bigint, boolean, text, int);
DROP FUNCTION IF EXISTS storetopics.worker_heartbeat(text, text, int, float8, int, text);
DROP FUNCTION IF EXISTS storetopics.worker_stop(text);
