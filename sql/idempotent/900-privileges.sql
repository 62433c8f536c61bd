-- ------------------------------------------------------------------------------------------------------------
-- Privileges and dumps
-- ------------------------------------------------------------------------------------------------------------
REVOKE ALL ON ALL TABLES IN SCHEMA storetopics FROM PUBLIC;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA storetopics FROM PUBLIC;
GRANT EXECUTE ON FUNCTION storetopics.usable_text(text), storetopics.showable_term(text),
  storetopics._human_count(bigint) TO PUBLIC;

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
    PERFORM pg_catalog.pg_extension_config_dump('storetopics.store_terms', '');
    PERFORM pg_catalog.pg_extension_config_dump('storetopics.store_state', '');
    PERFORM pg_catalog.pg_extension_config_dump('storetopics.term_words', '');
    PERFORM pg_catalog.pg_extension_config_dump('storetopics.clusters', '');
    PERFORM pg_catalog.pg_extension_config_dump('storetopics.label_ledger', '');
  END IF;
END $$;
