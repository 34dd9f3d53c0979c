-- Media: images and audio stored in a table, through every function that
-- takes them; every kind of bad input with its error.  The files are
-- test/fixtures/media (regress.media_dir is set by the test runner).
CREATE TABLE media (name text PRIMARY KEY, kind text, data bytea);
INSERT INTO media
SELECT f, CASE WHEN f LIKE '%.wav' OR f LIKE '%.mp3' THEN 'audio' ELSE 'image' END,
       pg_read_binary_file(current_setting('regress.media_dir') || '/' || f)
FROM unnest(ARRAY['photo_640x480.jpg', 'rgb_300x200.png', 'lossy_120x90.webp', 'grey_50x50.gif',
                  'pcm16_16k_mono.wav', 'mp3_44k_mono.mp3']) AS f;
INSERT INTO media
SELECT 'bad/' || f, 'bad', pg_read_binary_file(current_setting('regress.media_dir') || '/bad/' || f)
FROM unnest(ARRAY['truncated.png', 'bomb_60000x60000.png', 'truncated.jpg', 'bitmap.bmp',
                  'corrupt.flac', 'no_samples.wav']) AS f;

-- one image, greedy: deterministic
SELECT gemma_generate('What is in this picture?', ARRAY[data], max_tokens => 12) AS one_image
FROM media WHERE name = 'photo_640x480.jpg';
SELECT gemma_generate('What is in this picture?', ARRAY[data], max_tokens => 12) =
       gemma_generate('What is in this picture?', ARRAY[data], max_tokens => 12) AS repeatable,
       gemma_generate('What is in this picture?', ARRAY[data], max_tokens => 12) <>
       gemma_generate('What is in this picture?', max_tokens => 12) AS image_matters
FROM media WHERE name = 'photo_640x480.jpg';

-- every image format, and audio, from the table
SELECT name, length(gemma_generate('Describe it.', ARRAY[data], max_tokens => 6)) > 0 AS answered
FROM media WHERE kind = 'image' ORDER BY name;
SELECT name, length(gemma_generate('Transcribe.', audio => ARRAY[data], max_tokens => 6)) > 0 AS answered
FROM media WHERE kind = 'audio' ORDER BY name;

-- two images and an audio clip, placed by placeholders
SELECT length(gemma_generate('First <|image|>, then <|audio|>, last <|image|>.',
                             (SELECT array_agg(data ORDER BY name) FROM media WHERE name IN ('rgb_300x200.png', 'grey_50x50.gif')),
                             (SELECT array_agg(data) FROM media WHERE name = 'pcm16_16k_mono.wav'),
                             max_tokens => 6)) > 0 AS placed;

-- the soft-token budget changes the prompt
SELECT gemma_generate('Describe.', ARRAY[data], max_tokens => 8, max_soft_tokens => 70) <>
       gemma_generate('Describe.', ARRAY[data], max_tokens => 8, max_soft_tokens => 280) AS budget_matters
FROM media WHERE name = 'photo_640x480.jpg';
SET gemma4.max_soft_tokens = 70;
SELECT gemma_generate('Describe.', ARRAY[data], max_tokens => 8) =
       gemma_generate('Describe.', ARRAY[data], max_tokens => 8, max_soft_tokens => 70) AS guc_applies
FROM media WHERE name = 'photo_640x480.jpg';
RESET gemma4.max_soft_tokens;

-- streaming
SELECT count(*) > 0 AS streamed
FROM media, gemma_generate_stream('Describe.', ARRAY[data], max_tokens => 6) WHERE name = 'rgb_300x200.png';

-- gemma_chat content parts (base64)
SELECT (gemma_chat(jsonb_build_array(jsonb_build_object('role', 'user', 'content', jsonb_build_array(
            jsonb_build_object('type', 'image', 'data', encode(data, 'base64')),
            jsonb_build_object('type', 'text', 'text', 'What is this?')))),
        '{"max_tokens": 6, "max_soft_tokens": 140}')->'usage'->>'prompt_tokens')::int > 140 AS chat_image
FROM media WHERE name = 'photo_640x480.jpg';
SELECT (gemma_chat(jsonb_build_array(jsonb_build_object('role', 'user', 'content', jsonb_build_array(
            jsonb_build_object('type', 'audio', 'data', encode(data, 'base64')),
            jsonb_build_object('type', 'text', 'text', 'Transcribe.')))),
        '{"max_tokens": 6}')->'usage'->>'prompt_tokens')::int AS chat_audio_prompt_tokens
FROM media WHERE name = 'pcm16_16k_mono.wav';

-- a batch over a table: one image per prompt, NULL for none
SELECT array_length(gemma_generate_batch(array_agg('Describe ' || name ORDER BY name),
                                         images => array_agg(CASE WHEN kind = 'image' THEN data END ORDER BY name),
                                         max_tokens => 4), 1) AS batch_answers
FROM media WHERE kind IN ('image', 'audio');
SELECT g4_try($$SELECT gemma_generate_batch(ARRAY['a', 'b'], images => ARRAY[NULL::bytea])$$);

-- statistics count the media
SELECT images > 0 AS images_counted, audio_seconds > 0 AS audio_counted,
       media_decode_seconds > 0 AS decode_timed, media_embed_seconds > 0 AS embed_timed
FROM gemma_stats;

-- bad input: each a clear error naming the element
SELECT name, (g4_try(format(CASE WHEN name ~ '\.(wav|flac)$' THEN 'SELECT gemma_generate(%L, audio => ARRAY[%L::bytea])'
                                ELSE 'SELECT gemma_generate(%L, ARRAY[%L::bytea])' END, 'x', data))).*
FROM media WHERE kind = 'bad' ORDER BY name;
SELECT (g4_try(format('SELECT gemma_generate(%L, audio => ARRAY[%L::bytea, %L::bytea])', 'x',
                      (SELECT data FROM media WHERE name = 'pcm16_16k_mono.wav'),
                      (SELECT data FROM media WHERE name = 'bad/corrupt.flac')))).*;
SELECT (g4_try($$SELECT gemma_generate('x', ARRAY['\x'::bytea])$$)).*;
SELECT (g4_try($$SELECT gemma_generate('x', ARRAY[NULL::bytea])$$)).*;
SELECT (g4_try($$SELECT gemma_generate('x', audio => ARRAY['\x00'::bytea, NULL])$$)).*;
SELECT (g4_try($$SELECT gemma_generate('x', ARRAY['\x0102'::bytea], max_soft_tokens => 100)$$)).*;
SELECT (g4_try($$SELECT gemma_generate('<|image|> <|image|>', ARRAY[(SELECT data FROM media WHERE name = 'rgb_300x200.png')])$$)).*;
SET gemma4.max_image_pixels = 1000;
SELECT (g4_try($$SELECT gemma_generate('x', ARRAY[(SELECT data FROM media WHERE name = 'rgb_300x200.png')])$$)).*;
RESET gemma4.max_image_pixels;
SET gemma4.max_audio_seconds = 0.1;
SELECT (g4_try($$SELECT gemma_generate('x', audio => ARRAY[(SELECT data FROM media WHERE name = 'pcm16_16k_mono.wav')])$$)).*;
RESET gemma4.max_audio_seconds;
SET gemma4.max_soft_tokens = 100;
SELECT (g4_try($$SELECT gemma_chat('[{"role": "user", "content": [{"type": "image", "data": "!!"}]}]')$$)).*;
SELECT (g4_try($$SELECT gemma_chat('[{"role": "user", "content": [{"type": "video", "data": "AAAA"}]}]')$$)).*;
-- the engine is still there
SELECT g4_wait_idle();
SELECT worker_state, engine_restarts FROM gemma_stats;
DROP TABLE media;
