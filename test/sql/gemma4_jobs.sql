-- Table jobs: the API's checks, and one small job to its end.
-- g4_try() (gemma4_setup) returns the error fields.
CREATE TABLE job_docs (id int PRIMARY KEY, body text, summary text, n int);
INSERT INTO job_docs VALUES (1, 'cats sleep', NULL, 1), (2, 'dogs bark', NULL, 2),
                            (3, 'tea is hot', NULL, 3), (4, 'rain falls', 'kept', 4);
CREATE TABLE job_nokey (body text, summary text);

-- what is missing or wrong is named
SELECT * FROM g4_try($$SELECT gemma_job_create(NULL, 'summary', 'body')$$);
SELECT * FROM g4_try($$SELECT gemma_job_create('job_docs', 'summary', NULL)$$);
SELECT * FROM g4_try($$SELECT gemma_job_create('job_nokey', 'summary', 'body')$$);
SELECT * FROM g4_try($$SELECT gemma_job_create('job_docs', 'id', 'body')$$);
SELECT * FROM g4_try($$SELECT gemma_job_create('job_docs', 'nosuch', 'body')$$);
SELECT * FROM g4_try($$SELECT gemma_job_create('job_docs', 'summary', 'nosuch || body')$$);
SELECT * FROM g4_try($$SELECT gemma_job_create('job_docs', 'summary', 'body', condition => 'n >')$$);
SELECT * FROM g4_try($$SELECT gemma_job_create('job_docs', 'summary', 'body', workers => 0)$$);
SELECT * FROM g4_try($$SELECT gemma_job_create('job_docs', 'summary', 'body', system => '')$$);
SELECT * FROM g4_try($$SELECT gemma_job_create('job_docs', 'summary', 'body', options => '{"top_p": 2}')$$);
SELECT * FROM g4_try($$SELECT gemma_job_create('job_docs', 'summary', 'body', options => '{"images": 1}')$$);
SELECT * FROM g4_try($$SELECT gemma_job_create('job_docs', 'n', 'body')$$);
SELECT * FROM g4_try($$SELECT gemma_job_create('job_docs', 'summary', 'body', system => 'Be brief.', completion => true)$$);
-- a job runs as its creator, who must be able to log in
CREATE ROLE g4_job_nologin IN ROLE gemma_user;
GRANT SELECT, UPDATE ON job_docs TO g4_job_nologin;
SET ROLE g4_job_nologin;
SELECT * FROM g4_try($$SELECT gemma_job_create('job_docs', 'summary', 'body')$$);
RESET ROLE;
-- creating a job is using the model: a role outside gemma_user may neither
-- create one nor write its row and launch it by hand
CREATE ROLE g4_job_outsider LOGIN;
GRANT SELECT, UPDATE ON job_docs TO g4_job_outsider;
SET ROLE g4_job_outsider;
SELECT * FROM g4_try($$SELECT gemma_job_create('job_docs', 'summary', 'body')$$);
SELECT * FROM g4_try($$INSERT INTO gemma_job (owner, relid, key_column, target_column, prompt)
                       VALUES ('g4_job_outsider'::regrole, 'job_docs'::regclass, 'id', 'summary', 'body')$$);
SELECT * FROM g4_try($$SELECT gemma_job_launch(1)$$);
SELECT * FROM g4_try($$SELECT gemma_job_check_options('{}', NULL)$$);
RESET ROLE;
-- jobs that do not exist
SELECT * FROM g4_try($$SELECT gemma_job_pause(999999)$$);
SELECT * FROM g4_try($$SELECT gemma_job_resume(999999)$$);
SELECT * FROM g4_try($$SELECT gemma_job_cancel(999999)$$);
-- nothing was created
SELECT count(*) FROM gemma_job;

-- one job over the rows whose summary is missing, to its end
CREATE FUNCTION g4_wait_job(job bigint) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    s text;
BEGIN
    FOR i IN 1..600 LOOP
        SELECT state INTO s FROM gemma_jobs WHERE gemma_jobs.job = g4_wait_job.job;
        EXIT WHEN s <> 'running';
        PERFORM pg_sleep(0.05);
    END LOOP;
    RETURN s;
END $$;
SELECT gemma_job_create('job_docs', 'summary', $$'In one word: ' || body$$,
                        condition => 'summary IS NULL', options => '{"max_tokens": 5}') AS job \gset
SELECT g4_wait_job(:job);
SELECT job = :job AS same, owner = current_user::regrole AS owner, relation, target, state, follow,
       rows_total, rows_done, rows_failed, rows_pending, rows_in_progress,
       tokens_in > 0 AS tokens_in, tokens_out > 0 AS tokens_out, last_error, workers
FROM gemma_jobs;
SELECT id, summary IS NOT DISTINCT FROM
           CASE WHEN id = 4 THEN 'kept' ELSE gemma_generate('In one word: ' || body, max_tokens => 5) END AS ok
FROM job_docs ORDER BY id;
-- a done job cannot be paused or cancelled
SELECT * FROM g4_try(format('SELECT gemma_job_pause(%s)', :job));
SELECT * FROM g4_try(format('SELECT gemma_job_cancel(%s)', :job));
SELECT count(*) FROM gemma_job_errors;

-- media columns: a bytea column of images, a bytea[] column of audio clips
CREATE TABLE job_photos (id int PRIMARY KEY, photo bytea, clips bytea[], caption text);
INSERT INTO job_photos
SELECT id, pg_read_binary_file(current_setting('regress.media_dir') || '/' || f), NULL, NULL
FROM (VALUES (1, 'rgb_48x48.png'), (2, 'grey_50x50.gif'), (3, 'bad/truncated.png')) v(id, f);
UPDATE job_photos SET clips = ARRAY[pg_read_binary_file(current_setting('regress.media_dir') || '/pcm16_16k_mono.wav')]
WHERE id = 2;
-- no media: the prompt alone; a NULL element: the row fails
INSERT INTO job_photos VALUES (4, NULL, NULL, NULL), (5, NULL, ARRAY[NULL::bytea], NULL);
SELECT * FROM g4_try($$SELECT gemma_job_create('job_photos', 'caption', $p$'Describe it.'$p$, images => 'caption')$$);
SELECT * FROM g4_try($$SELECT gemma_job_create('job_photos', 'caption', $p$'Describe it.'$p$, audio => 'nosuch')$$);
SELECT * FROM g4_try($$SELECT gemma_job_create('job_photos', 'caption', $p$'Describe it.'$p$, images => 'photo', completion => true)$$);
SELECT gemma_job_create('job_photos', 'caption', $$'Describe it.'$$, images => 'photo', audio => 'clips',
                        options => '{"max_tokens": 6, "max_soft_tokens": 70}') AS job \gset
SELECT g4_wait_job(:job);
SELECT rows_total, rows_done, rows_failed, rows_pending FROM gemma_jobs WHERE job = :job;
-- each row holds what gemma_generate gives it, with the same media and budget
SELECT id, caption IS NOT NULL AS answered,
       caption IS NOT DISTINCT FROM
           CASE WHEN id IN (1, 2, 4)
                THEN gemma_generate('Describe it.', CASE WHEN photo IS NOT NULL THEN ARRAY[photo] END, clips,
                                    max_tokens => 6, max_soft_tokens => 70) END AS ok
FROM job_photos ORDER BY id;
-- the images mattered
SELECT count(DISTINCT caption) AS distinct_captions FROM job_photos WHERE id IN (1, 2, 4);
SELECT row_key, sqlstate, message FROM gemma_job_errors WHERE job_id = :job ORDER BY row_key;

-- follow => true by a member that owns its table (CREATE TRIGGER needs
-- EXECUTE on the trigger function)
CREATE ROLE g4_job_member LOGIN IN ROLE gemma_user;
CREATE TABLE job_follow (id int PRIMARY KEY, body text, answer text);
ALTER TABLE job_follow OWNER TO g4_job_member;
SET ROLE g4_job_member;
SELECT gemma_job_create('job_follow', 'answer', 'body', follow => true) AS job \gset
SELECT state, follow FROM gemma_jobs WHERE job = :job;
SELECT gemma_job_cancel(:job);
RESET ROLE;
-- a job whose owner has left gemma_user: its workers refuse to run it
CREATE TABLE job_left (id int PRIMARY KEY, body text, answer text);
INSERT INTO job_left VALUES (1, 'x');
GRANT SELECT, UPDATE ON job_left TO g4_job_member;
SET ROLE g4_job_member;
BEGIN;
SELECT gemma_job_create('job_left', 'answer', 'body') AS job \gset
SELECT gemma_job_pause(:job);
COMMIT;
RESET ROLE;
REVOKE gemma_user FROM g4_job_member;
SELECT gemma_job_resume(:job);
SELECT g4_wait_job(:job);
SELECT last_error, rows_done FROM gemma_jobs WHERE job = :job;
SELECT answer FROM job_left;
-- a transaction that creates a job cannot be prepared: nothing would start
-- its workers at COMMIT PREPARED
BEGIN;
SELECT gemma_job_create('job_follow', 'answer', 'body') IS NOT NULL AS created;
PREPARE TRANSACTION 'g4_job';
SELECT count(*) AS rolled_back FROM gemma_job WHERE relid = 'job_follow'::regclass AND owner = current_user::regrole;

DROP FUNCTION g4_wait_job(bigint);
DROP TABLE job_docs, job_nokey, job_photos, job_follow, job_left;
DELETE FROM gemma_job WHERE owner = 'g4_job_member'::regrole;
DROP ROLE g4_job_nologin, g4_job_outsider, g4_job_member;
