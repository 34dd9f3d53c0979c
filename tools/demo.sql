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

\echo '== a table job: fills documents.summary in the background, resumable, with progress'
ALTER TABLE documents ADD COLUMN summary text;
SELECT gemma_job_create('documents', 'summary', $$'Summarize in one sentence: ' || body$$,
                        condition => 'summary IS NULL',
                        options => '{"max_tokens": 24, "stop": ["\n"]}') AS job \gset
SELECT gemma_job_pause(:job);
SELECT job, relation, target, state, rows_total, rows_done, rows_pending FROM gemma_jobs WHERE job = :job;
SELECT gemma_job_resume(:job);
-- watch it (in psql: SELECT * FROM gemma_jobs \watch 1); here, wait for the end
DO $$
BEGIN
  WHILE (SELECT state FROM gemma_jobs ORDER BY job DESC LIMIT 1) = 'running' LOOP
    PERFORM pg_sleep(0.2);
  END LOOP;
END $$;
SELECT job, state, rows_total, rows_done, rows_failed, rows_pending, tokens_in, tokens_out,
       tokens_per_second, finished_at - started_at AS took, last_error
  FROM gemma_jobs WHERE job = :job;
SELECT id, left(summary, 70) AS summary FROM documents ORDER BY id;
-- keep the column up to date: rows inserted or changed later are answered too
SELECT gemma_job_create('documents', 'summary', $$'Summarize in one sentence: ' || body$$,
                        options => '{"max_tokens": 24, "stop": ["\n"]}', follow => true) AS follow_job \gset
SELECT gemma_job_cancel(:follow_job);

\echo '== the admin views'
SELECT kv_group, kv_cache_dtype, layers, blocks_total, blocks_used, pg_size_pretty(bytes) AS size,
       sequences_live, full_window_fits FROM gemma_kv_pool;
SELECT requests, finished, errors, tokens_in, tokens_out, steps,
       round(mean_batch_size::numeric, 2) AS mean_batch, max_batch_size FROM gemma_stats;
SELECT use, pg_size_pretty(bytes) AS size FROM gemma_memory;
