-- The SQL API end to end: attach, backfill, the summary, exact deletion, detach.
CREATE EXTENSION storetopics CASCADE;
SET client_min_messages = warning;
\set VERBOSITY terse
CREATE TABLE chunks (id serial PRIMARY KEY, store_id text, file_id int, content text, embedding vector(3));
INSERT INTO chunks (store_id, file_id, content)
SELECT 'home', g / 3, 'kitchen renovation with new tiles and cabinets; the bathroom renovation needs plumbing ' || g
  FROM generate_series(1, 60) g;
SELECT storetopics.attach('chunks', store_key => 'store_id', file_key => 'file_id', content => 'content',
                          embedding => 'embedding');
SELECT store, files, chunks FROM storetopics.backfill();
SELECT store_key, files, chunks, dirty, store_topics FROM storetopics.stores;
-- a distinctive file surfaces ...
CREATE TEMP TABLE before AS SELECT store_topics, topics FROM storetopics.stores;
INSERT INTO chunks (store_id, file_id, content)
SELECT 'home', 1000, 'the football club won the league; the goalkeeper and the striker of the football club celebrated'
  FROM generate_series(1, 3);
SELECT dirty FROM storetopics.stores;
SELECT store, files, chunks, changed FROM storetopics.backfill('home');
SELECT store_topics FROM storetopics.stores;
-- ... and deleting it restores the summary exactly
DELETE FROM chunks WHERE file_id = 1000;
SELECT store, changed FROM storetopics.backfill();
SELECT s.store_topics = b.store_topics AS same_text, s.topics = b.topics AS same_topics
  FROM storetopics.stores s, before b;
-- bad input never fails the application's statement
INSERT INTO chunks (store_id, file_id, content) VALUES ('home', 7, NULL), ('home', 7, '   '), (NULL, 8, 'x y z'),
  ('home', NULL, 'no file'), ('home', 9, E'\x01\x02 junk');
SELECT count(*) FROM storetopics.backfill();
SELECT skipped_text_rows, skipped_null_key_rows FROM storetopics.status;
-- errors are clear
SELECT storetopics.attach('chunks', 'store_id', 'file_id');
SELECT storetopics.detach('chunks');
SELECT storetopics.attach('chunks', 'nope', 'file_id');
SELECT storetopics.attach('chunks', 'store_id', 'file_id', embedding => 'content');
SELECT count(*) FROM storetopics.sources;
SELECT tgname FROM pg_trigger WHERE tgrelid = 'chunks'::regclass;
