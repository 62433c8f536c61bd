-- Run once by the postgres image's entrypoint, when it creates the cluster (an empty data directory), in
-- $POSTGRES_DB as $POSTGRES_USER (psql -v ON_ERROR_STOP=1): a failure here stops the first start.
-- Order matters: storetopics creates its in-database clustering function (storetopics._fit_in_database, which
-- imports plpy/storetopics_clustering.py with Debian's numpy and scikit-learn) only when plpython3u already exists.
-- Later upgrades of the image are applied by `storetopics install --extension` (the compose stack's `install`
-- service), which runs ALTER EXTENSION storetopics UPDATE when the image ships a newer version.
CREATE EXTENSION IF NOT EXISTS vector;
CREATE EXTENSION IF NOT EXISTS plpython3u;
CREATE EXTENSION IF NOT EXISTS storetopics;
