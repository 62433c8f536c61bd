-- storetopics 0.2: tenants.  What an attacher writes (key expressions, mirror targets) now runs as the attached
-- table's owner, inside functions generated per source and owned by that owner (idempotent/020-generated.sql);
-- nobody but the extension's owner creates objects in the schema; reads are per tenant.

-- 0.1's event trigger reads columns this script drops (dropping a column fires sql_drop); the idempotent part
-- replaces its function and enables it again.
DO $$
BEGIN
  IF EXISTS (SELECT 1 FROM pg_event_trigger WHERE evtname = 'storetopics_forget_dropped_tables') THEN
    ALTER EVENT TRIGGER storetopics_forget_dropped_tables DISABLE;
  END IF;
END $$;

-- 0.1's internals that trusted current_user inside SECURITY DEFINER, and the capture generator they served.
DROP FUNCTION IF EXISTS storetopics._register_source(regclass, text, text, text, text, text, text, text, regtype, regconfig,
                                           jsonb, regclass, text, regclass, text, text);
DROP FUNCTION IF EXISTS storetopics._unregister_source(int);
DROP FUNCTION IF EXISTS storetopics._create_triggers(storetopics.sources);
DROP FUNCTION IF EXISTS storetopics._capture_sql(storetopics.sources);
DROP FUNCTION IF EXISTS storetopics._mirror_summary(int, text, text);
DROP FUNCTION IF EXISTS storetopics._assign(storetopics.sources, text);
DROP FUNCTION IF EXISTS storetopics._tsvector_or_null(regconfig, text);
DROP FUNCTION IF EXISTS storetopics._add_to_clusters(int, text[]);
DROP FUNCTION IF EXISTS storetopics._chunk_lookup_sql(regclass, text[]);
-- (bodies bound at creation that use the row type of storetopics.sources: they would block its ALTER TABLE)
DROP FUNCTION IF EXISTS storetopics._embedding_sql(storetopics.sources);

-- The owner as a role (oid), not a name: generated functions compare it with the role they run as.
UPDATE storetopics.sources s SET owner = pg_get_userbyid(c.relowner) FROM pg_class c WHERE c.oid = s.chunks;
ALTER TABLE storetopics.sources
  ALTER COLUMN owner TYPE regrole USING coalesce(pg_catalog.to_regrole(quote_ident(owner)), current_user::text::regrole);
-- Generated functions are named after the source id (storetopics._generated): a stored name was a copy.
ALTER TABLE storetopics.sources DROP COLUMN capture_function;

-- Who appended an event.  Application roles never insert here themselves: a source's capture function runs as the
-- table's owner, who may insert every column but this one, so it always says who wrote the row; fold() ignores
-- rows for a source written by a role that may not act as that source's owner (a tenant forging another's events).
ALTER TABLE storetopics.pending ADD COLUMN logged_by regrole;
UPDATE storetopics.pending p SET logged_by = s.owner FROM storetopics.sources s WHERE s.id = p.source_id;
UPDATE storetopics.pending SET logged_by = current_user::text::regrole WHERE logged_by IS NULL;
ALTER TABLE storetopics.pending ALTER COLUMN logged_by SET DEFAULT current_user::text::regrole,
                                ALTER COLUMN logged_by SET NOT NULL;
-- No raw key in an index on the application's path: a 3,000-character store key made its INSERT fail (btree rows
-- are limited to about 2.7 kB).
DROP INDEX storetopics.pending_source_store;
CREATE INDEX pending_source ON storetopics.pending (source_id);

-- File keys may be long (paths, URLs): file_terms is found by a digest of the key, the key itself is kept.
ALTER TABLE storetopics.file_terms DROP CONSTRAINT file_terms_source_id_file_key_store_key_key;
CREATE INDEX file_terms_file ON storetopics.file_terms (source_id, (md5(file_key)::uuid));
CREATE INDEX file_terms_store ON storetopics.file_terms (source_id, store_key);

-- Roles given rights with grant_worker and grant_read (source_id NULL: every source).  Generated functions are
-- granted to the worker roles as they are created; the views show a reader the sources it was granted.
CREATE TABLE storetopics.grants (
  role      regrole NOT NULL,
  kind      text NOT NULL CHECK (kind IN ('worker', 'read')),
  source_id int,
  UNIQUE NULLS NOT DISTINCT (role, kind, source_id)
);
-- 0.1 recorded no grants: a role that may run fold() was given grant_worker.
INSERT INTO storetopics.grants (role, kind)
SELECT DISTINCT a.grantee::regrole, 'worker'
  FROM pg_proc p, aclexplode(p.proacl) a
 WHERE p.oid = to_regprocedure('storetopics.fold(integer, integer)') AND a.privilege_type = 'EXECUTE'
   AND a.grantee <> 0 AND a.grantee <> p.proowner;

-- grant_attach handed out CREATE on the schema: a tenant could plant storetopics.capture_N for the next source or
-- an overload that fold() would call as superuser.  Take it back from everyone but the schema's owner.
DO $$
DECLARE
  r record;
BEGIN
  FOR r IN SELECT a.grantee FROM pg_namespace n, aclexplode(n.nspacl) a
            WHERE n.nspname = 'storetopics' AND a.privilege_type = 'CREATE' AND a.grantee <> n.nspowner LOOP
    EXECUTE format('REVOKE CREATE ON SCHEMA storetopics FROM %s', CASE WHEN r.grantee = 0 THEN 'PUBLIC'
                                                                        ELSE quote_ident(pg_get_userbyid(r.grantee)) END);
  END LOOP;
END $$;

-- The version whose templates made a source's generated functions (NULL: not made yet).  0.1's capture functions
-- are made again from the 0.2 templates at their source's first use (storetopics._reader); until then they run as
-- the table's owner, whoever attached the table.
ALTER TABLE storetopics.sources ADD COLUMN generated text;
-- When the count check (verify) last ran for the source.
ALTER TABLE storetopics.sources ADD COLUMN checked_at timestamptz;
DO $$
DECLARE
  r record;
BEGIN
  FOR r IN SELECT s.id, c.relowner::regrole AS owner FROM storetopics.sources s JOIN pg_class c ON c.oid = s.chunks
            WHERE to_regprocedure(format('storetopics.capture_%s()', s.id)) IS NOT NULL LOOP
    EXECUTE format('ALTER FUNCTION storetopics.capture_%s() OWNER TO %s', r.id, r.owner);
  END LOOP;
END $$;

-- What 0.1 handed out too widely: grant_attach gave tenants SELECT on every source and store, and EXECUTE on the
-- internals.  Everyone but the owner and the worker roles loses every right on storetopics' own tables and
-- functions (the idempotent part gives attachers, readers and table owners back what 0.2 gives them).  Objects a
-- tenant planted in the schema with the CREATE right (any not owned by the schema's owner but the capture functions
-- of attached tables) are dropped.
DO $$
DECLARE
  r record;
  v_workers oid[] := ARRAY(SELECT g.role FROM storetopics.grants g WHERE g.kind = 'worker');
BEGIN
  FOR r IN SELECT c.oid::regclass AS obj, a.grantee::regrole AS grantee
             FROM pg_class c, aclexplode(c.relacl) a
            WHERE c.relnamespace = 'storetopics'::regnamespace AND a.grantee <> 0 AND a.grantee <> c.relowner
              AND a.grantee <> ALL (v_workers)
            GROUP BY 1, 2 LOOP
    EXECUTE format('REVOKE ALL ON %s FROM %s', r.obj, r.grantee);
  END LOOP;
  FOR r IN SELECT p.oid::regprocedure AS fn, a.grantee::regrole AS grantee
             FROM pg_proc p, aclexplode(p.proacl) a
            WHERE p.pronamespace = 'storetopics'::regnamespace AND a.grantee <> 0 AND a.grantee <> p.proowner
              AND a.grantee <> ALL (v_workers) AND p.proname !~ '^capture_[0-9]+$'
              AND p.proname NOT IN ('attach', 'detach', 'detach_source')
            GROUP BY 1, 2 LOOP
    EXECUTE format('REVOKE ALL ON FUNCTION %s FROM %s', r.fn, r.grantee);
  END LOOP;
  FOR r IN SELECT p.oid::regprocedure AS fn, p.prokind FROM pg_proc p, pg_namespace n
            WHERE n.oid = p.pronamespace AND n.nspname = 'storetopics' AND p.proowner <> n.nspowner
              AND NOT EXISTS (SELECT 1 FROM storetopics.sources s WHERE p.proname = format('capture_%s', s.id)) LOOP
    RAISE WARNING 'storetopics: dropping %, which was not created by storetopics', r.fn;
    EXECUTE format('DROP %s %s CASCADE', CASE r.prokind WHEN 'p' THEN 'PROCEDURE' WHEN 'a' THEN 'AGGREGATE'
                                              ELSE 'FUNCTION' END, r.fn);
  END LOOP;
  FOR r IN SELECT c.oid::regclass AS rel, c.relkind FROM pg_class c, pg_namespace n
            WHERE n.oid = c.relnamespace AND n.nspname = 'storetopics' AND c.relowner <> n.nspowner
              AND c.relkind IN ('r', 'v', 'm', 'S', 'f', 'p') LOOP
    RAISE WARNING 'storetopics: dropping %, which was not created by storetopics', r.rel;
    EXECUTE format('DROP %s %s CASCADE', CASE r.relkind WHEN 'v' THEN 'VIEW' WHEN 'm' THEN 'MATERIALIZED VIEW'
                                              WHEN 'S' THEN 'SEQUENCE' WHEN 'f' THEN 'FOREIGN TABLE' ELSE 'TABLE' END,
                   r.rel);
  END LOOP;
END $$;
