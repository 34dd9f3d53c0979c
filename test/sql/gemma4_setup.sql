-- Setup: the extension, the worker state, the configuration parameters,
-- and helpers the other tests use.
CREATE EXTENSION gemma4;

-- wait for the model (the worker loads it at server start)
SELECT gemma_wait_ready(60000);

SELECT worker_state, state_reason, engine_restarts, architecture, backend,
       kv_cache_dtype, max_model_len, max_num_seqs, model_path IS NOT NULL AS has_model,
       requests_active
FROM gemma_stats;

-- every parameter, with its context (the model path depends on the machine)
SELECT name,
       CASE WHEN name = 'gemma4.model_dir' THEN (setting <> '')::text ELSE setting END AS setting,
       unit, context, vartype, boot_val
FROM pg_settings WHERE name LIKE 'gemma4.%' ORDER BY name;

SELECT enumvals FROM pg_settings WHERE name IN ('gemma4.kv_cache_dtype', 'gemma4.backend') ORDER BY name;

-- engine parameters need a restart, session ones are per session
SET gemma4.max_model_len = 100;
SET gemma4.model_dir = '/tmp';
SET gemma4.default_max_tokens = -1;
SET gemma4.request_timeout = -5;
SET gemma4.request_timeout = 'soon';
SET gemma4.no_such_parameter = 1;
-- invalid values are refused, naming the parameter
ALTER SYSTEM SET gemma4.kv_cache_dtype = 'fp8';
ALTER SYSTEM SET gemma4.gpu_memory_utilization = 2;
ALTER SYSTEM SET gemma4.backend = 'tpu';
ALTER SYSTEM SET gemma4.engine_stall_timeout = '100ms';
SET gemma4.request_timeout = '2s';
SHOW gemma4.request_timeout;
RESET gemma4.request_timeout;

-- Run a statement and report its error fields instead of failing.
CREATE FUNCTION g4_try(sql text, OUT code text, OUT message text, OUT detail text, OUT hint text)
LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE sql;
    code := '00000';
    message := 'no error';
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS code = RETURNED_SQLSTATE, message = MESSAGE_TEXT,
                            detail = PG_EXCEPTION_DETAIL, hint = PG_EXCEPTION_HINT;
END $$;

-- Wait (up to 10 s) until no request is in flight and the KV pool is empty:
-- the engine reports its statistics after each step.
CREATE FUNCTION g4_wait_idle() RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    FOR i IN 1..200 LOOP
        IF NOT EXISTS (SELECT FROM gemma_requests)
           AND (SELECT sum(blocks_used) FROM gemma_kv_pool) = 0
           AND (SELECT sequences_live FROM gemma_kv_pool LIMIT 1) = 0 THEN
            RETURN true;
        END IF;
        PERFORM pg_sleep(0.05);
    END LOOP;
    RETURN false;
END $$;

SELECT g4_wait_idle();
