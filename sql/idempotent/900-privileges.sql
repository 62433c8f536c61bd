-- ------------------------------------------------------------------------------------------------------------
-- Privileges and dumps
-- ------------------------------------------------------------------------------------------------------------
REVOKE ALL ON ALL TABLES IN SCHEMA storetopics FROM PUBLIC;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA storetopics FROM PUBLIC;
-- pure helpers: the generated readers use them as the tables' owners
GRANT EXECUTE ON FUNCTION storetopics._usable_text(text), storetopics._dehyphenated(text), storetopics._showable_term(text),
  storetopics._human_count(bigint), storetopics._tsvector_or_null(regconfig, text), storetopics._max_store_key(),
  storetopics._tool_name(text, text)
  TO PUBLIC;
-- search() returns the chunks themselves, so it is executable by PUBLIC only because it checks every caller itself
-- (SELECT on the chunk table, no row-level security it would bypass, a store the caller may see) before the
-- source's reader runs; a role still needs USAGE on the schema, which owners, readers and workers have.
GRANT EXECUTE ON FUNCTION storetopics.search(regclass, text, text, int, vector) TO PUBLIC;

-- The roles that hold rights get what this version gives them (an upgrade's new functions included): workers and
-- readers from storetopics.grants, attachers are the roles that may run attach(), and each attached table's owner
-- what its generated functions do as that owner.
DO $$
DECLARE
  r record;
BEGIN
  FOR r IN SELECT DISTINCT pg_get_userbyid(g.role) AS name FROM storetopics.grants g WHERE g.kind = 'worker' LOOP
    PERFORM storetopics.grant_worker(r.name);
  END LOOP;
  FOR r IN SELECT DISTINCT pg_get_userbyid(a.grantee) AS name
             FROM pg_proc p, aclexplode(p.proacl) a
            WHERE p.oid = 'storetopics.attach(regclass, text, text, text, text, regconfig, jsonb, regclass, text, '
                          'regclass, text, text)'::regprocedure
              AND a.grantee <> 0 AND a.grantee <> p.proowner
              AND a.grantee NOT IN (SELECT g.role FROM storetopics.grants g WHERE g.kind = 'worker') LOOP
    PERFORM storetopics.grant_attach(r.name);
  END LOOP;
  FOR r IN SELECT DISTINCT g.role FROM storetopics.grants g WHERE g.kind = 'read'
           UNION SELECT DISTINCT s.owner FROM storetopics.sources s LOOP
    EXECUTE format('GRANT USAGE ON SCHEMA storetopics TO %s', r.role);
  END LOOP;
  FOR r IN SELECT DISTINCT g.role FROM storetopics.grants g WHERE g.kind = 'read' LOOP
    EXECUTE format('GRANT SELECT ON storetopics.stores, storetopics.status TO %s', r.role);
    EXECUTE format('GRANT EXECUTE ON FUNCTION storetopics.metrics() TO %s', r.role);
    PERFORM storetopics._grant_routing(r.role::text);
  END LOOP;
  FOR r IN SELECT DISTINCT s.owner FROM storetopics.sources s LOOP
    EXECUTE format('GRANT INSERT (source_id, store_key, file_key, resync, deletes, error), SELECT (source_id) '
                   'ON storetopics.pending TO %s', r.owner);
    EXECUTE format('GRANT SELECT ON storetopics.file_means TO %s', r.owner);
    PERFORM storetopics._grant_routing(r.owner::text);
  END LOOP;
END $$;

-- Stores folded before tool names were kept get theirs (sources in attach order).
SELECT storetopics._name_stores(s.id) FROM storetopics.sources s
 WHERE EXISTS (SELECT 1 FROM storetopics.store_state st WHERE st.source_id = s.id AND st.tool_name IS NULL)
 ORDER BY s.id;

DO $$
DECLARE
  v_dir text;
BEGIN
  IF (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) THEN
    v_dir := (SELECT setting FROM pg_catalog.pg_config WHERE name = 'SHAREDIR') || '/extension';
    IF NOT EXISTS (SELECT 1 FROM pg_event_trigger WHERE evtname = 'storetopics_forget_dropped_tables') THEN
      CREATE EVENT TRIGGER storetopics_forget_dropped_tables ON sql_drop
        EXECUTE FUNCTION storetopics._forget_dropped_tables();
    END IF;
    ALTER EVENT TRIGGER storetopics_forget_dropped_tables ENABLE;
    DROP EVENT TRIGGER IF EXISTS storetopics_cover_partitions;   -- (where a pre-release 0.2 made it; _follow_ddl covers partitions)
    DROP FUNCTION IF EXISTS storetopics._cover_partitions();
    DROP EVENT TRIGGER IF EXISTS storetopics_follow_ddl;         -- made again: its tags may have changed
    CREATE EVENT TRIGGER storetopics_follow_ddl ON ddl_command_end
      WHEN TAG IN ('CREATE TABLE', 'ALTER TABLE', 'ALTER FUNCTION', 'ALTER PROCEDURE', 'ALTER TYPE', 'ALTER DOMAIN',
                   'ALTER SCHEMA', 'ALTER VIEW', 'ALTER MATERIALIZED VIEW', 'ALTER FOREIGN TABLE', 'ALTER OPERATOR',
                   'ALTER AGGREGATE', 'ALTER COLLATION', 'ALTER TEXT SEARCH CONFIGURATION')
      EXECUTE FUNCTION storetopics._follow_ddl();
  END IF;
  -- Clustering inside the database, where plpython3u is installed: the module plpy/storetopics_clustering.py,
  -- installed by `make install` beside this script, does the work (the worker imports the same file).
  IF v_dir IS NOT NULL AND EXISTS (SELECT 1 FROM pg_language WHERE lanname = 'plpython3u') THEN
    EXECUTE format($f$
      CREATE OR REPLACE FUNCTION storetopics._fit_in_database(p_source int, p_store text) RETURNS jsonb
      LANGUAGE plpython3u SET search_path = pg_catalog, pg_temp AS $py$
import sys
if %L not in sys.path:
    sys.path.insert(0, %L)
import storetopics_clustering
return storetopics_clustering.fit_store(storetopics_clustering.PlpyDatabase(plpy), p_source, p_store)
$py$
$f$, v_dir, v_dir);
    REVOKE ALL ON FUNCTION storetopics._fit_in_database(int, text) FROM PUBLIC;
  END IF;
  IF EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'storetopics') THEN
    PERFORM pg_catalog.pg_extension_config_dump('storetopics.sources', '');
    PERFORM pg_catalog.pg_extension_config_dump('storetopics.pending', '');
    PERFORM pg_catalog.pg_extension_config_dump('storetopics.lexemes', '');
    PERFORM pg_catalog.pg_extension_config_dump('storetopics.file_terms', '');
    PERFORM pg_catalog.pg_extension_config_dump('storetopics.file_clusters', '');
    PERFORM pg_catalog.pg_extension_config_dump('storetopics.store_terms', '');
    PERFORM pg_catalog.pg_extension_config_dump('storetopics.store_state', '');
    PERFORM pg_catalog.pg_extension_config_dump('storetopics.term_words', '');
    PERFORM pg_catalog.pg_extension_config_dump('storetopics.store_words', '');
    PERFORM pg_catalog.pg_extension_config_dump('storetopics.clusters', '');
    PERFORM pg_catalog.pg_extension_config_dump('storetopics.label_ledger', '');
    PERFORM pg_catalog.pg_extension_config_dump('storetopics.grants', '');
  END IF;
END $$;
