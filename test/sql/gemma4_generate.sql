-- Generation: greedy by default and deterministic, sampling reproducible
-- with a seed, stop strings, system messages, streams, chat, tokenizer.

-- greedy (temperature 0) is the default
SELECT gemma_generate('Hello world', max_tokens => 16) AS greedy;
SELECT gemma_generate('Hello world', max_tokens => 16) =
       gemma_generate('Hello world', max_tokens => 16, temperature => 0) AS default_is_greedy;

-- a system message changes the prompt
SELECT gemma_generate('Write a poem', max_tokens => 12, system => 'You are a poet.') AS with_system;
SELECT gemma_generate('Write a poem', max_tokens => 12, system => 'You are a poet.') <>
       gemma_generate('Write a poem', max_tokens => 12) AS system_matters;

-- raw completion (no chat format)
SELECT gemma_complete('The capital of France is', max_tokens => 12) AS completion;

-- stop strings end the answer before the stop string
SELECT gemma_generate('Hello world', max_tokens => 16, stop => ARRAY['delivery']) AS stopped;
SELECT strpos(gemma_generate('Hello world', max_tokens => 16), 'delivery') > 0 AS stop_string_occurs;

-- sampling: the caller's temperature wins; a seed makes it reproducible
SELECT gemma_generate('Hello world', max_tokens => 16, temperature => 0.9, seed => 7) AS sampled;
SELECT gemma_generate('Hello world', max_tokens => 16, temperature => 0.9, top_p => 0.9, top_k => 40, seed => 7) =
       gemma_generate('Hello world', max_tokens => 16, temperature => 0.9, top_p => 0.9, top_k => 40, seed => 7)
       AS seeded_is_reproducible;
SELECT gemma_generate('Hello world', max_tokens => 16, temperature => 1.5, seed => 1) <>
       gemma_generate('Hello world', max_tokens => 16, temperature => 1.5, seed => 2) AS seeds_differ;
SELECT length(gemma_generate('Hello world', max_tokens => 8, temperature => 1.0)) > 0 AS unseeded_runs;

-- gemma4.default_max_tokens applies when max_tokens is NULL
SET gemma4.default_max_tokens = 4;
SELECT gemma_generate('Hello world') = gemma_generate('Hello world', max_tokens => 4) AS default_max_tokens;
RESET gemma4.default_max_tokens;
-- 0 (to the window) under gemma4.max_tokens_limit: to the window or the
-- limit, whichever comes first, however long the prompt
SET gemma4.default_max_tokens = 0;
SET gemma4.max_tokens_limit = 100;
SELECT (r->'usage'->>'prompt_tokens')::int > 4000 AS long_prompt,
       (r->'usage'->>'prompt_tokens')::int + (r->'usage'->>'completion_tokens')::int <= 4096 AS within_the_window
FROM (SELECT gemma_chat(jsonb_build_array(jsonb_build_object('role', 'user', 'content', repeat('a ', 4060)))) r) x;
SELECT (gemma_chat('[{"role": "user", "content": "Hello world"}]') -> 'usage' ->> 'completion_tokens')::int
       BETWEEN 1 AND 100 AS within_the_limit;
RESET gemma4.max_tokens_limit;
RESET gemma4.default_max_tokens;

-- the stream: one row per decoded piece, concatenating to the whole answer
SELECT gemma_generate_stream('Hello world', max_tokens => 8) AS piece;
SELECT string_agg(piece, '') = gemma_generate('Hello world', max_tokens => 16) AS stream_equals_whole
FROM gemma_generate_stream('Hello world', max_tokens => 16) AS piece;
SELECT count(*) BETWEEN 1 AND 16 AS one_row_per_piece
FROM (SELECT gemma_generate_stream('Hello world', max_tokens => 16)) s;

-- chat: content, finish_reason and usage
SELECT gemma_chat('[{"role": "user", "content": "Hello world"}]', '{"max_tokens": 16}');
SELECT gemma_chat('[{"role": "user", "content": "Hello world"}]', '{"max_tokens": 16}')->>'content' =
       gemma_generate('Hello world', max_tokens => 16) AS chat_equals_generate;
SELECT gemma_chat('[{"role": "system", "content": "You are a poet."},
                    {"role": "user", "content": "Write a poem"}]', '{"max_tokens": 12}')->>'content' =
       gemma_generate('Write a poem', max_tokens => 12, system => 'You are a poet.') AS chat_system_equals_generate;
SELECT gemma_chat('[{"role": "user", "content": "Hi"},
                    {"role": "assistant", "content": "Hello! How can I help?"},
                    {"role": "user", "content": "Tell me a story"}]',
                  '{"max_tokens": 12, "temperature": 0}');
SELECT (r->'usage'->>'total_tokens')::int =
       (r->'usage'->>'prompt_tokens')::int + (r->'usage'->>'completion_tokens')::int AS usage_adds_up,
       r->>'finish_reason' AS finish_reason
FROM gemma_chat('[{"role": "user", "content": "Hello world"}]', '{"max_tokens": 5}') r;
-- thinking on: the answer carries a reasoning field
SELECT r ? 'reasoning' AS has_reasoning, jsonb_typeof(r->'reasoning') AS reasoning_type
FROM gemma_chat('[{"role": "user", "content": "Hello world"}]', '{"max_tokens": 8, "thinking": true}') r;
SELECT r ? 'reasoning' AS has_reasoning
FROM gemma_chat('[{"role": "user", "content": "Hello world"}]', '{"max_tokens": 8}') r;
-- options: sampling, stop strings, JSON null means "not given"
SELECT gemma_chat('[{"role": "user", "content": "Hello world"}]',
                  '{"max_tokens": 16, "temperature": 0.9, "seed": 7, "top_p": 1, "top_k": 0, "min_p": 0,
                    "repetition_penalty": 1, "presence_penalty": 0, "frequency_penalty": 0}')->>'content' =
       gemma_generate('Hello world', max_tokens => 16, temperature => 0.9, seed => 7) AS options_match_arguments;
SELECT gemma_chat('[{"role": "user", "content": "Hello world"}]', '{"max_tokens": 16, "stop": "delivery"}')->>'content' =
       gemma_generate('Hello world', max_tokens => 16, stop => ARRAY['delivery']) AS stop_option;
SELECT gemma_chat('[{"role": "user", "content": "Hello world"}]', '{"max_tokens": 4, "temperature": null}')->>'content' =
       gemma_generate('Hello world', max_tokens => 4) AS null_option;
SET gemma4.default_max_tokens = 4;
SELECT gemma_chat('[{"role": "user", "content": "Hello world"}]', NULL)->>'content' =
       gemma_generate('Hello world') AS null_options;
RESET gemma4.default_max_tokens;

-- the functions are parallel safe: a parallel worker submits like a backend
SET force_parallel_mode = on;
SET parallel_setup_cost = 0;
SET parallel_tuple_cost = 0;
EXPLAIN (COSTS OFF) SELECT gemma_generate('Hello world', max_tokens => 16);
SELECT gemma_generate('Hello world', max_tokens => 16) AS from_a_parallel_worker;
RESET force_parallel_mode;
RESET parallel_setup_cost;
RESET parallel_tuple_cost;

-- tokenizer (no BOS is added) and its round trip
SELECT gemma_tokenize('Hello world');
SELECT gemma_detokenize(gemma_tokenize('Hello world'));
SELECT gemma_detokenize(gemma_tokenize('naïve café, 東京 😀')) = 'naïve café, 東京 😀' AS round_trip;
SELECT gemma_tokenize('') AS empty_tokens, gemma_detokenize('{}') AS empty_text;
SELECT gemma_tokenize(NULL) IS NULL AS tokenize_strict, gemma_detokenize(NULL) IS NULL AS detokenize_strict;
SELECT (gemma_chat('[{"role": "user", "content": "Hello world"}]', '{"max_tokens": 1}')->'usage'->>'prompt_tokens')::int >
       cardinality(gemma_tokenize('Hello world')) AS chat_template_adds_tokens;

-- the views saw all of it
SELECT g4_wait_idle();
SELECT requests > 0 AS has_requests, finished > 0 AS has_finished, tokens_in > 0 AS has_tokens_in,
       tokens_out > 0 AS has_tokens_out, steps > 0 AS has_steps, mean_batch_size >= 1 AS mean_batch,
       max_batch_size >= 1 AS max_batch, requests_active
FROM gemma_stats;

-- batches: the answers of one call per prompt, in order, NULL for a NULL prompt
SELECT b = ARRAY[gemma_complete('The capital of France is', max_tokens => 8), NULL,
                 gemma_complete('Hello world', max_tokens => 8)] AS same_answers
  FROM gemma_complete_batch(ARRAY['The capital of France is', NULL, 'Hello world'], max_tokens => 8) AS b;
SELECT b[2] = gemma_generate('Hello world', max_tokens => 6, system => 'Be brief.') AS same_chat_answer,
       cardinality(b) AS answers
  FROM gemma_generate_batch(ARRAY['Tell me a story', 'Hello world'], max_tokens => 6, system => 'Be brief.') AS b;
SELECT gemma_complete_batch('{}'::text[]) AS no_prompts, gemma_complete_batch(NULL) AS null_prompts;
-- a table job: the requests of one batch share forward passes
CREATE TEMP TABLE docs (id int PRIMARY KEY, body text, topic text);
INSERT INTO docs SELECT i, 'Document number ' || i FROM generate_series(1, 6) i;
UPDATE docs d SET topic = b.answer
  FROM (SELECT unnest(array_agg(id ORDER BY id)) AS id,
               unnest(gemma_complete_batch(array_agg(body ORDER BY id), max_tokens => 4)) AS answer
          FROM docs) b
 WHERE d.id = b.id;
SELECT count(*) FILTER (WHERE topic = gemma_complete(body, max_tokens => 4)) AS same_as_alone FROM docs;
