-- tools/demo.sql — what gemma4 does, on whatever model the server runs.
\pset footer off
CREATE EXTENSION gemma4;
\echo '== waiting for the model to load'
SELECT gemma_wait_ready(600000) AS ready;
SELECT worker_state, architecture, backend, device, kv_cache_dtype, max_model_len FROM gemma_stats;

\echo '== a generation'
SELECT gemma_complete(E'Question: What is the capital of France?\nAnswer:',
                      max_tokens => 8, stop => ARRAY[E'\n']) AS answer;

\echo '== a stream, read through a cursor: each FETCH returns the pieces decoded so far'
BEGIN;
DECLARE story CURSOR FOR
  SELECT gemma_complete_stream('Once upon a time, in a small village by the sea,', max_tokens => 40) AS piece;
FETCH 8 FROM story;
FETCH ALL FROM story;
CLOSE story;
COMMIT;

\echo '== a batch UPDATE over a table of documents (the requests are batched together)'
CREATE TABLE documents (id int PRIMARY KEY, body text NOT NULL, topic text);
INSERT INTO documents VALUES
  (1, 'PostgreSQL stores each table in 8 kB pages and keeps old row versions until VACUUM removes them.'),
  (2, 'The Amazon rainforest produces a large share of the oxygen used by plants and animals in South America.'),
  (3, 'A goalkeeper may handle the ball only inside the penalty area during a football match.'),
  (4, 'Photosynthesis turns light, water and carbon dioxide into sugar and oxygen inside green leaves.');
UPDATE documents d SET topic = trim(b.answer)
  FROM (SELECT unnest(array_agg(id ORDER BY id)) AS id,
               unnest(gemma_complete_batch(array_agg(E'Text: ' || body || E'\nTopic:' ORDER BY id),
                                           max_tokens => 6, stop => ARRAY[E'\n'])) AS answer
          FROM documents) b
 WHERE d.id = b.id;
SELECT id, left(body, 50) AS body, topic FROM documents ORDER BY id;

\echo '== the admin views'
SELECT kv_group, kv_cache_dtype, layers, blocks_total, blocks_used, pg_size_pretty(bytes) AS size,
       sequences_live, full_window_fits FROM gemma_kv_pool;
SELECT requests, finished, errors, tokens_in, tokens_out, steps,
       round(mean_batch_size::numeric, 2) AS mean_batch, max_batch_size FROM gemma_stats;
