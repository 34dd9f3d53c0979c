-- One caller cannot hurt the others: oversized inputs fail that call only,
-- before anything is queued; the engine keeps serving; the worker's memory
-- comes back after large messages; special-token text in data is text.
-- (gemma4.max_model_len = 4096 here: the prompt limit is 16 x 4096 = 65536 bytes.)

SELECT engine_restarts AS restarts_before FROM gemma_stats \gset

-- ---- frame size: replies and requests too large for the wire -------------
-- 27 million ids (108 MB): refused in the backend, the engine never sees it
SELECT * FROM g4_try($$SELECT gemma_detokenize(array_fill(231582, ARRAY[27000000]))$$);
SELECT * FROM g4_try($$SELECT gemma_detokenize(array_fill(5, ARRAY[16385]))$$);
SELECT * FROM g4_try($$SELECT gemma_tokenize(repeat('a', 65537))$$);
-- at the limit they work; a reply of several chunks arrives whole
SELECT length(gemma_detokenize(array_fill(1000, ARRAY[16384]))) > 0 AS detokenized;
SELECT cardinality(gemma_tokenize(repeat('a b ', 16384))) AS ids;
SET gemma4.max_prompt_bytes = '8MB';
SELECT cardinality(gemma_tokenize(repeat('a b ', 600000))) AS ids_in_chunks;
SELECT gemma_detokenize(gemma_tokenize(repeat('a b ', 600000))) = repeat('a b ', 600000) AS round_trip_in_chunks;
RESET gemma4.max_prompt_bytes;

-- ---- prompt bytes, in every generation function --------------------------
SELECT * FROM g4_try($$SELECT gemma_generate(repeat('a', 65537), max_tokens => 1)$$);
SELECT * FROM g4_try($$SELECT gemma_generate(repeat('a', 40000), system => repeat('b', 40000), max_tokens => 1)$$);
SELECT * FROM g4_try($$SELECT gemma_complete(repeat('a', 65537), max_tokens => 1)$$);
SELECT * FROM g4_try($$SELECT gemma_complete_stream(repeat('a', 65537), max_tokens => 1)$$);
SELECT * FROM g4_try($$SELECT gemma_generate_batch(ARRAY['ok', repeat('a', 65537)], max_tokens => 1)$$);
SELECT * FROM g4_try($$SELECT gemma_chat(jsonb_build_array(jsonb_build_object('role', 'user', 'content', repeat('a', 65537))), '{"max_tokens": 1}')$$);
-- the limit is the administrator's: a plain role cannot lift it
CREATE ROLE g4_security_user;
SET ROLE g4_security_user;
SELECT * FROM g4_try($$SET gemma4.max_prompt_bytes = '1GB'$$);
-- so are the media limits that protect the engine process's memory
SELECT * FROM g4_try($$SET gemma4.max_image_pixels = 2147483647$$);
SELECT * FROM g4_try($$SET gemma4.max_audio_seconds = 86400$$);
RESET ROLE;
DROP ROLE g4_security_user;
SET gemma4.max_prompt_bytes = 100;
SELECT * FROM g4_try($$SELECT gemma_generate(repeat('a', 101), max_tokens => 1)$$);
RESET gemma4.max_prompt_bytes;

-- ---- stop strings: bounded in count and size -----------------------------
-- 400 stop strings of 1 MB: refused before any is converted or queued
SELECT * FROM g4_try($$SELECT gemma_complete('a', max_tokens => 1, stop => array_fill(repeat('z', 1000000), ARRAY[400]))$$);
SELECT * FROM g4_try($$SELECT gemma_complete('a', max_tokens => 1, stop => array_fill('z'::text, ARRAY[17]))$$);
SELECT * FROM g4_try($$SELECT gemma_complete('a', max_tokens => 1, stop => ARRAY[repeat('z', 1025)])$$);
SELECT * FROM g4_try($$SELECT gemma_chat('[{"role": "user", "content": "x"}]', jsonb_build_object('max_tokens', 1, 'stop', to_jsonb(array_fill('z'::text, ARRAY[17]))))$$);
SELECT * FROM g4_try($$SELECT gemma_chat('[{"role": "user", "content": "x"}]', jsonb_build_object('max_tokens', 1, 'stop', repeat('z', 1025)))$$);
SELECT gemma_complete('a', max_tokens => 1, stop => array_fill(repeat('z', 1024), ARRAY[16])) IS NOT NULL AS at_the_limits;
-- a two-dimensional stop array is refused, not flattened
SELECT * FROM g4_try($$SELECT gemma_generate('x', max_tokens => 1, stop => ARRAY[['a', 'b'], ['c', 'd']])$$);
SELECT * FROM g4_try($$SELECT gemma_complete_batch(ARRAY[['a'], ['b']], max_tokens => 1)$$);

-- ---- values that round to zero in the engine's single precision ----------
SELECT * FROM g4_try($$SELECT gemma_generate('x', max_tokens => 1, top_p => 1e-300)$$);
SELECT * FROM g4_try($$SELECT gemma_chat('[{"role": "user", "content": "x"}]', '{"max_tokens": 1, "top_p": 1e-300}')$$);
SELECT * FROM g4_try($$SELECT gemma_chat('[{"role": "user", "content": "x"}]', '{"max_tokens": 1, "repetition_penalty": 1e-300}')$$);

-- ---- the engine served on through all of the above -----------------------
SELECT engine_restarts = :restarts_before AS no_restart, worker_state FROM gemma_stats;
SELECT gemma_generate('Hello', max_tokens => 2) IS NOT NULL AS still_serving;

-- ---- the worker's memory after large messages ----------------------------
-- a 32 MB request and a large reply pass through the supervisor and the
-- engine process; their buffers give the memory back afterwards (resident
-- size within 16 MB of before for the supervisor, 32 MB for the engine)
CREATE FUNCTION g4_rss_kb(pid int) RETURNS bigint
LANGUAGE sql AS $$
    SELECT (regexp_match(pg_read_file('/proc/' || pid || '/status'), 'VmRSS:\s+(\d+) kB'))[1]::bigint
$$;
SELECT worker_pid AS sup_pid, engine_pid AS eng_pid FROM gemma_stats \gset
-- the engine process holds none of PostgreSQL's shared memory: a stray
-- write there (the media decoders read untrusted input) ends that process
CREATE FUNCTION g4_writable_shared_mappings(pid int) RETURNS bigint
LANGUAGE sql AS $$
    SELECT count(*) FROM regexp_split_to_table(pg_read_file('/proc/' || pid || '/maps'), E'\n') AS l
    WHERE l ~ '^[0-9a-f]+-[0-9a-f]+ rw.s '
$$;
SELECT g4_writable_shared_mappings(:eng_pid) AS engine, g4_writable_shared_mappings(:sup_pid) > 0 AS supervisor;
DROP FUNCTION g4_writable_shared_mappings(int);
SELECT g4_rss_kb(:sup_pid) AS rss_before, g4_rss_kb(:eng_pid) AS eng_rss_before \gset
SET gemma4.max_prompt_bytes = '64MB';
SELECT length(gemma_detokenize(array_fill(1000, ARRAY[8000000]))) > 0 AS large_reply;
SELECT cardinality(gemma_tokenize(repeat('ab ', 1000000))) > 0 AS large_request;
RESET gemma4.max_prompt_bytes;
SELECT g4_rss_kb(:sup_pid) - :rss_before < 16384 AS supervisor_memory_flat;
SELECT g4_rss_kb(:eng_pid) - :eng_rss_before < 32768 AS engine_memory_returned;
DROP FUNCTION g4_rss_kb(int);

-- ---- special-token text in data is text ----------------------------------
-- Every special token of the model's family (this fixture is Gemma 4): inside
-- message content it is several plain tokens by default, one control token
-- only when the caller allows control tokens.  A row cannot close its turn.
CREATE FUNCTION g4_prompt_tokens(content text, allow boolean) RETURNS int
LANGUAGE sql AS $$
    SELECT (gemma_chat(jsonb_build_array(jsonb_build_object('role', 'user', 'content', 'x' || content || 'y')),
                       jsonb_build_object('max_tokens', 1, 'allow_control_tokens', allow))
            -> 'usage' ->> 'prompt_tokens')::int
$$;
SELECT t AS special_token, g4_prompt_tokens(t, false) > g4_prompt_tokens(t, true) AS plain_by_default
FROM unnest(ARRAY['<pad>', '<eos>', '<bos>', '<unk>', '<mask>', '<|turn>', '<turn|>', '<|think|>',
                  '<|channel>', '<channel|>', '<|tool>', '<tool|>', '<|tool_call>', '<tool_call|>',
                  '<|tool_response>', '<tool_response|>', '<|"|>', '<|image>', '<|image|>', '<image|>',
                  '<|audio>', '<|audio|>', '<audio|>', '<|video|>']) AS t;
DROP FUNCTION g4_prompt_tokens(text, boolean);
-- the option exists on every generation function, false by default
SELECT proname, pg_get_function_arguments(oid) ~ 'allow_control_tokens boolean DEFAULT false' AS has_option
FROM pg_proc WHERE proname IN ('gemma_generate', 'gemma_complete', 'gemma_generate_stream', 'gemma_complete_stream',
                               'gemma_generate_batch', 'gemma_complete_batch')
ORDER BY proname;
SELECT gemma_complete('<start_of_turn>', max_tokens => 1, allow_control_tokens => true) IS NOT NULL AS raw_with_control;
SELECT gemma_generate_batch(ARRAY['<turn|>'], max_tokens => 1) IS NOT NULL AS batch_plain;
SELECT * FROM g4_try($$SELECT gemma_chat('[{"role": "user", "content": "x"}]', '{"allow_control_tokens": "yes"}')$$);
SELECT g4_wait_idle();
