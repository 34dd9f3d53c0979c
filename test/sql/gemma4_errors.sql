-- Bad input: every case fails at once with a fitting SQLSTATE and a message
-- that says what to fix.  g4_try() (gemma4_setup) returns the error fields.

-- the prompt
SELECT * FROM g4_try($$SELECT gemma_generate(NULL)$$);
SELECT * FROM g4_try($$SELECT gemma_generate('')$$);
SELECT * FROM g4_try($$SELECT gemma_complete(NULL)$$);
SELECT * FROM g4_try($$SELECT gemma_complete('')$$);
SELECT * FROM g4_try($$SELECT gemma_generate_stream(NULL)$$);
-- longer than the window (gemma4.max_model_len = 4096 here)
SELECT * FROM g4_try($$SELECT gemma_generate(repeat('hello ', 5000), max_tokens => 4)$$);
SELECT * FROM g4_try($$SELECT gemma_complete(repeat('hello ', 5000), max_tokens => 4)$$);
-- prompt and max_tokens together exceed the window
SELECT * FROM g4_try($$SELECT gemma_generate('Hello world', max_tokens => 4090)$$);

-- media is not supported yet
SELECT * FROM g4_try($$SELECT gemma_generate('Describe', images => ARRAY['\x89504e47'::bytea])$$);
SELECT * FROM g4_try($$SELECT gemma_generate('Describe', audio => ARRAY['\x52494646'::bytea])$$);

-- sampling arguments
SELECT * FROM g4_try($$SELECT gemma_generate('x', max_tokens => 0)$$);
SELECT * FROM g4_try($$SELECT gemma_generate('x', max_tokens => -5)$$);
SELECT * FROM g4_try($$SELECT gemma_generate('x', max_tokens => 4096)$$);
SELECT * FROM g4_try($$SELECT gemma_generate('x', temperature => -0.1)$$);
SELECT * FROM g4_try($$SELECT gemma_generate('x', temperature => 'NaN')$$);
SELECT * FROM g4_try($$SELECT gemma_generate('x', temperature => 'Infinity')$$);
SELECT * FROM g4_try($$SELECT gemma_generate('x', top_p => 0)$$);
SELECT * FROM g4_try($$SELECT gemma_generate('x', top_p => 1.5)$$);
SELECT * FROM g4_try($$SELECT gemma_generate('x', top_k => -1)$$);
SELECT * FROM g4_try($$SELECT gemma_generate('x', stop => ARRAY[''])$$);
SELECT * FROM g4_try($$SELECT gemma_generate('x', stop => ARRAY['a', NULL])$$);
SELECT * FROM g4_try($$SELECT gemma_generate('x', system => '')$$);
SELECT * FROM g4_try($$SELECT gemma_complete('x', max_tokens => 0)$$);
SELECT * FROM g4_try($$SELECT gemma_generate_stream('x', top_p => 2)$$);
SET gemma4.default_max_tokens = 5000;
SELECT * FROM g4_try($$SELECT gemma_generate('x')$$);
RESET gemma4.default_max_tokens;

-- chat messages
SELECT * FROM g4_try($$SELECT gemma_chat(NULL)$$);
SELECT * FROM g4_try($$SELECT gemma_chat('{"role": "user", "content": "x"}')$$);
SELECT * FROM g4_try($$SELECT gemma_chat('"hello"')$$);
SELECT * FROM g4_try($$SELECT gemma_chat('[]')$$);
SELECT * FROM g4_try($$SELECT gemma_chat('[1]')$$);
SELECT * FROM g4_try($$SELECT gemma_chat('[{"content": "x"}]')$$);
SELECT * FROM g4_try($$SELECT gemma_chat('[{"role": "user"}]')$$);
SELECT * FROM g4_try($$SELECT gemma_chat('[{"role": "robot", "content": "x"}]')$$);
SELECT * FROM g4_try($$SELECT gemma_chat('[{"role": 1, "content": "x"}]')$$);
SELECT * FROM g4_try($$SELECT gemma_chat('[{"role": "user", "content": 5}]')$$);
SELECT * FROM g4_try($$SELECT gemma_chat('[{"role": "user", "content": null}]')$$);
SELECT * FROM g4_try($$SELECT gemma_chat('[{"role": "user", "content": "x", "name": "bob"}]')$$);
SELECT * FROM g4_try($$SELECT gemma_chat('[{"role": "user", "content": "x"}, {"role": "system", "content": "y"}]')$$);
SELECT * FROM g4_try($$SELECT gemma_chat(jsonb_build_array(jsonb_build_object('role', 'user', 'content', repeat('hello ', 5000))), '{"max_tokens": 4}')$$);

-- chat options
SELECT * FROM g4_try($$SELECT gemma_chat('[{"role": "user", "content": "x"}]', '{"temprature": 0.5}')$$);
SELECT * FROM g4_try($$SELECT gemma_chat('[{"role": "user", "content": "x"}]', '[]')$$);
SELECT * FROM g4_try($$SELECT gemma_chat('[{"role": "user", "content": "x"}]', '{"max_tokens": "ten"}')$$);
SELECT * FROM g4_try($$SELECT gemma_chat('[{"role": "user", "content": "x"}]', '{"max_tokens": 1.5}')$$);
SELECT * FROM g4_try($$SELECT gemma_chat('[{"role": "user", "content": "x"}]', '{"max_tokens": 0}')$$);
SELECT * FROM g4_try($$SELECT gemma_chat('[{"role": "user", "content": "x"}]', '{"max_tokens": 99999999999}')$$);
SELECT * FROM g4_try($$SELECT gemma_chat('[{"role": "user", "content": "x"}]', '{"temperature": -1}')$$);
SELECT * FROM g4_try($$SELECT gemma_chat('[{"role": "user", "content": "x"}]', '{"temperature": "hot"}')$$);
SELECT * FROM g4_try($$SELECT gemma_chat('[{"role": "user", "content": "x"}]', '{"top_p": 2}')$$);
SELECT * FROM g4_try($$SELECT gemma_chat('[{"role": "user", "content": "x"}]', '{"top_k": -3}')$$);
SELECT * FROM g4_try($$SELECT gemma_chat('[{"role": "user", "content": "x"}]', '{"min_p": 2}')$$);
SELECT * FROM g4_try($$SELECT gemma_chat('[{"role": "user", "content": "x"}]', '{"repetition_penalty": 0}')$$);
SELECT * FROM g4_try($$SELECT gemma_chat('[{"role": "user", "content": "x"}]', '{"presence_penalty": 3}')$$);
SELECT * FROM g4_try($$SELECT gemma_chat('[{"role": "user", "content": "x"}]', '{"seed": 1e30}')$$);
SELECT * FROM g4_try($$SELECT gemma_chat('[{"role": "user", "content": "x"}]', '{"thinking": "yes"}')$$);
SELECT * FROM g4_try($$SELECT gemma_chat('[{"role": "user", "content": "x"}]', '{"stop": [""]}')$$);
SELECT * FROM g4_try($$SELECT gemma_chat('[{"role": "user", "content": "x"}]', '{"stop": 5}')$$);
SELECT * FROM g4_try($$SELECT gemma_chat('[{"role": "user", "content": "x"}]', '{"stop": ["a", 1]}')$$);

-- tokenizer
SELECT * FROM g4_try($$SELECT gemma_detokenize('{1,NULL}')$$);
SELECT * FROM g4_try($$SELECT gemma_detokenize('{{1,2},{3,4}}')$$);
SELECT * FROM g4_try($$SELECT gemma_detokenize('{99999999}')$$);
SELECT * FROM g4_try($$SELECT gemma_detokenize('{-1}')$$);

-- gemma_wait_ready
SELECT * FROM g4_try($$SELECT gemma_wait_ready(-1)$$);

-- a session that made all these mistakes still works, and nothing is left behind
SELECT gemma_generate('Hello world', max_tokens => 4) = gemma_generate('Hello world', max_tokens => 4) AS still_works;
SELECT g4_wait_idle();

-- batches
SELECT * FROM g4_try($$SELECT gemma_complete_batch(ARRAY['x', ''])$$);
SELECT * FROM g4_try($$SELECT gemma_complete_batch(ARRAY[['x'], ['y']])$$);
SELECT * FROM g4_try($$SELECT gemma_generate_batch(ARRAY['x'], system => '')$$);
SELECT * FROM g4_try($$SELECT gemma_complete_batch(ARRAY['x'], max_tokens => 0)$$);
