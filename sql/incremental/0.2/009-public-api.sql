-- storetopics 0.2: one public API.  What a DBA, an application or a router calls keeps a plain name; the worker's
-- protocol and the helpers become internal (`_`-prefixed; workers run them, tenants are not granted them).  0.1's
-- functions are renamed, not dropped: bodies bound at creation (detach() calls detach_source(), work_status()
-- failing_after(), keywords() showable_term()) follow a rename; the idempotent part then replaces them all.
DO $$
DECLARE
  v_fn text;
  r record;
  v_workers oid[] := ARRAY(SELECT g.role FROM storetopics.grants g WHERE g.kind = 'worker');
BEGIN
  FOREACH v_fn IN ARRAY ARRAY[
      'apply_fit(int, text, jsonb)', 'cluster(int, text)', 'detach_source(int)', 'failing_after()',
      'fit_due(int, text)', 'fold(int, int)', 'keywords(int, text, int, int)', 'label_ok(text)',
      'lease_held(text, int, text)', 'next_due()', 'offline_label(text[])',
      'record_label(int, text, int, text, text, text, text, int, int, text)', 'refresh_words(int, text)',
      'render_due(storetopics.store_state)', 'showable_term(text)', 'usable_text(text)',
      'work_done(text, int, text, bigint, boolean, text, int)',
      'worker_heartbeat(text, text, int, float8, int, text)', 'worker_stop(text)'] LOOP
    IF to_regprocedure('storetopics.' || v_fn) IS NOT NULL THEN
      EXECUTE format('ALTER FUNCTION storetopics.%s RENAME TO %I', v_fn, '_' || split_part(v_fn, '(', 1));
    END IF;
  END LOOP;
  -- 0.1's grant_attach gave tenants detach_source(): internal now, run by workers and administrators only
  FOR r IN SELECT p.oid::regprocedure AS fn, a.grantee::regrole AS grantee
             FROM pg_proc p, aclexplode(p.proacl) a
            WHERE p.oid = to_regprocedure('storetopics._detach_source(int)') AND a.grantee <> 0
              AND a.grantee <> p.proowner AND a.grantee <> ALL (v_workers) LOOP
    EXECUTE format('REVOKE ALL ON FUNCTION %s FROM %s', r.fn, r.grantee);
  END LOOP;
END $$;

-- Their arguments changed in 0.2 (p_now): the idempotent part makes them anew.
DROP FUNCTION IF EXISTS storetopics.claim(text, float8, int);
DROP FUNCTION IF EXISTS storetopics.sources_to_fold();
