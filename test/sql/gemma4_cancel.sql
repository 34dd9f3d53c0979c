-- Timeouts: statement_timeout and gemma4.request_timeout cancel a running
-- request; its KV blocks return to the pool.

SET statement_timeout = '300ms';
SELECT gemma_generate('Hello world', max_tokens => 3000);
SELECT count(*) FROM (SELECT gemma_generate_stream('Hello world', max_tokens => 3000)) s;
RESET statement_timeout;
SELECT g4_wait_idle();

SET gemma4.request_timeout = '300ms';
SELECT gemma_generate('Hello world', max_tokens => 3000);
SELECT gemma_chat('[{"role": "user", "content": "Hello world"}]', '{"max_tokens": 3000}');
SELECT count(*) FROM (SELECT gemma_generate_stream('Hello world', max_tokens => 3000)) s;
-- short requests are not affected
SELECT gemma_generate('Hello world', max_tokens => 4) IS NOT NULL AS short_request_ok;
RESET gemma4.request_timeout;
SELECT g4_wait_idle();

-- a timeout caught in PL/pgSQL: the subtransaction's request is cancelled too
DO $$
BEGIN
    PERFORM set_config('gemma4.request_timeout', '200', true);
    PERFORM gemma_generate('Hello world', max_tokens => 3000);
EXCEPTION WHEN query_canceled THEN
    RAISE NOTICE 'caught: %', SQLERRM;
END $$;
RESET gemma4.request_timeout;
SELECT g4_wait_idle();
SELECT gemma_generate('Hello world', max_tokens => 4) IS NOT NULL AS still_works;
