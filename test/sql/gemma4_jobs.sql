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
       tokens_in > 0 AS tokens_in, tokens_out > 0 AS tokens_out, last_error
FROM gemma_jobs;
SELECT id, summary IS NOT DISTINCT FROM
           CASE WHEN id = 4 THEN 'kept' ELSE gemma_generate('In one word: ' || body, max_tokens => 5) END AS ok
FROM job_docs ORDER BY id;
-- a done job cannot be paused or cancelled
SELECT * FROM g4_try(format('SELECT gemma_job_pause(%s)', :job));
SELECT * FROM g4_try(format('SELECT gemma_job_cancel(%s)', :job));
SELECT count(*) FROM gemma_job_errors;
DROP FUNCTION g4_wait_job(bigint);
DROP TABLE job_docs, job_nokey;
DROP ROLE g4_job_nologin;
