-- Streams: rows reach a cursor as they are decoded; stopping early (CLOSE,
-- LIMIT, the end of the transaction) cancels the generation and frees its
-- KV blocks.

BEGIN;
DECLARE c CURSOR FOR SELECT gemma_generate_stream('Hello world', max_tokens => 2000);
FETCH 3 FROM c;
-- the request is alive while the cursor is open
SELECT count(*) AS live_requests FROM gemma_requests WHERE pid = pg_backend_pid();
FETCH 2 FROM c;
CLOSE c;
-- closing the cursor cancelled it
SELECT g4_wait_idle();
COMMIT;

-- the rows a cursor returns are the pieces of the full answer
BEGIN;
DECLARE c2 CURSOR FOR SELECT gemma_generate_stream('Hello world', max_tokens => 16);
FETCH 3 FROM c2;
FETCH ALL FROM c2;
COMMIT;

-- LIMIT stops the stream
SELECT gemma_generate_stream('Hello world', max_tokens => 2000) LIMIT 3;
SELECT g4_wait_idle();

-- an open cursor at the end of the transaction
BEGIN;
DECLARE c3 CURSOR FOR SELECT gemma_generate_stream('Hello world', max_tokens => 2000);
FETCH 1 FROM c3;
ROLLBACK;
SELECT g4_wait_idle();

-- an error while a stream is open (the stream's cursor is aborted with it)
BEGIN;
DECLARE c4 CURSOR FOR SELECT gemma_generate_stream('Hello world', max_tokens => 2000);
FETCH 1 FROM c4;
SELECT 1 / 0;
ROLLBACK;
SELECT g4_wait_idle();

-- a stream inside a subtransaction that fails
BEGIN;
SAVEPOINT s;
DECLARE c5 CURSOR FOR SELECT gemma_generate_stream('Hello world', max_tokens => 2000);
FETCH 1 FROM c5;
ROLLBACK TO SAVEPOINT s;
-- cancelled while the outer transaction goes on
SELECT g4_wait_idle();
COMMIT;

-- all of them were counted as cancelled
SELECT cancelled >= 5 AS cancelled_counted, requests_active FROM gemma_stats;

-- a raw completion, streamed piece by piece, adds up to gemma_complete's text
SELECT string_agg(p, '' ORDER BY n) = gemma_complete('The capital of France is', max_tokens => 12) AS same_text,
       count(*) > 1 AS several_pieces
  FROM gemma_complete_stream('The capital of France is', max_tokens => 12) WITH ORDINALITY AS t(p, n);
