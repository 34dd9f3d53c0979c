/* sql/gemma4--0.1.sql */

-- complain if script is sourced in psql, rather than via CREATE EXTENSION
\echo Use "CREATE EXTENSION gemma4" to load this file. \quit

/*
 * Generation functions.
 *
 * VOLATILE: sampling may be random, and each call consumes the engine's
 * capacity; a generation must never be folded into a plan or cached.
 * PARALLEL SAFE: a parallel worker is a full backend with its own latch and
 * shared memory access, so it submits requests like any session; a query
 * that runs in parallel (CREATE TABLE ... AS SELECT gemma_generate(...))
 * then keeps one request per worker in flight, and the engine batches them.
 * Not STRICT: a NULL prompt is an error, not a NULL answer.
 * COST: high, so the planner evaluates cheap conditions first.
 */
CREATE FUNCTION gemma_generate(prompt text,
							   images bytea[] DEFAULT NULL,
							   audio bytea[] DEFAULT NULL,
							   max_tokens int DEFAULT NULL,
							   temperature float8 DEFAULT NULL,
							   top_p float8 DEFAULT NULL,
							   top_k int DEFAULT NULL,
							   seed bigint DEFAULT NULL,
							   stop text[] DEFAULT NULL,
							   system text DEFAULT NULL,
							   -- media
							   max_soft_tokens int DEFAULT NULL,
							   -- NULL follows gemma4.speculative
							   speculative boolean DEFAULT NULL,
							   -- special-token text in the prompt is plain text unless true
							   allow_control_tokens boolean DEFAULT false)
RETURNS text
AS 'MODULE_PATHNAME', 'gemma_generate'
LANGUAGE C VOLATILE PARALLEL SAFE COST 10000;

COMMENT ON FUNCTION gemma_generate(text, bytea[], bytea[], int, float8, float8, int, bigint, text[], text, int, boolean, boolean) IS
'single-turn chat: the answer to prompt (after an optional system message); greedy unless temperature is given; images and audio are file bytes (PNG, JPEG, WebP, GIF; WAV, FLAC, MP3, Ogg Vorbis) that take the prompt''s <|image|> / <|audio|> placeholders in turn, or go before its text';

CREATE FUNCTION gemma_complete(prompt text,
							   max_tokens int DEFAULT NULL,
							   temperature float8 DEFAULT NULL,
							   top_p float8 DEFAULT NULL,
							   top_k int DEFAULT NULL,
							   seed bigint DEFAULT NULL,
							   stop text[] DEFAULT NULL,
							   -- NULL follows gemma4.speculative
							   speculative boolean DEFAULT NULL,
							   -- special-token text in the prompt is plain text unless true
							   allow_control_tokens boolean DEFAULT false)
RETURNS text
AS 'MODULE_PATHNAME', 'gemma_complete'
LANGUAGE C VOLATILE PARALLEL SAFE COST 10000;

COMMENT ON FUNCTION gemma_complete(text, int, float8, float8, int, bigint, text[], boolean, boolean) IS
'raw completion: the text that follows prompt, no chat format applied; special-token text in prompt is plain text unless allow_control_tokens';

/*
 * One row per decoded piece, as it is decoded.  Rows stream when the call
 * is in the SELECT list and the client reads through a cursor
 * (DECLARE c CURSOR FOR SELECT gemma_generate_stream(...); FETCH ...);
 * a call in FROM is materialised before the first row is returned.
 * Stopping early (LIMIT, CLOSE, an error) cancels the generation.
 */
CREATE FUNCTION gemma_generate_stream(prompt text,
									  images bytea[] DEFAULT NULL,
									  audio bytea[] DEFAULT NULL,
									  max_tokens int DEFAULT NULL,
									  temperature float8 DEFAULT NULL,
									  top_p float8 DEFAULT NULL,
									  top_k int DEFAULT NULL,
									  seed bigint DEFAULT NULL,
									  stop text[] DEFAULT NULL,
									  system text DEFAULT NULL,
									  -- media
									  max_soft_tokens int DEFAULT NULL,
									  -- NULL follows gemma4.speculative
									  speculative boolean DEFAULT NULL,
									  -- special-token text in the prompt is plain text unless true
									  allow_control_tokens boolean DEFAULT false)
RETURNS SETOF text
AS 'MODULE_PATHNAME', 'gemma_generate_stream'
LANGUAGE C VOLATILE PARALLEL SAFE COST 10000 ROWS 100;

COMMENT ON FUNCTION gemma_generate_stream(text, bytea[], bytea[], int, float8, float8, int, bigint, text[], text, int, boolean, boolean) IS
'gemma_generate, one row per decoded piece';

CREATE FUNCTION gemma_complete_stream(prompt text,
									  max_tokens int DEFAULT NULL,
									  temperature float8 DEFAULT NULL,
									  top_p float8 DEFAULT NULL,
									  top_k int DEFAULT NULL,
									  seed bigint DEFAULT NULL,
									  stop text[] DEFAULT NULL,
									  -- NULL follows gemma4.speculative
									  speculative boolean DEFAULT NULL,
									  -- special-token text in the prompt is plain text unless true
									  allow_control_tokens boolean DEFAULT false)
RETURNS SETOF text
AS 'MODULE_PATHNAME', 'gemma_complete_stream'
LANGUAGE C VOLATILE PARALLEL SAFE COST 10000 ROWS 100;

COMMENT ON FUNCTION gemma_complete_stream(text, int, float8, float8, int, bigint, text[], boolean, boolean) IS
'gemma_complete, one row per decoded piece';

/*
 * Batches: many prompts in one call, generated together (the requests share
 * the engine's forward passes), answers in the same order; a NULL prompt
 * gives a NULL answer.  For table jobs:
 *   UPDATE docs d SET summary = b.answer
 *     FROM (SELECT unnest(array_agg(id)) AS id,
 *                  unnest(gemma_generate_batch(array_agg('Summarise: ' || body))) AS answer
 *             FROM docs) b
 *    WHERE d.id = b.id;
 */
CREATE FUNCTION gemma_complete_batch(prompts text[],
									 max_tokens int DEFAULT NULL,
									 temperature float8 DEFAULT NULL,
									 top_p float8 DEFAULT NULL,
									 top_k int DEFAULT NULL,
									 seed bigint DEFAULT NULL,
									 stop text[] DEFAULT NULL,
									 -- NULL follows gemma4.speculative
									 speculative boolean DEFAULT NULL,
									 -- special-token text in the prompt is plain text unless true
									 allow_control_tokens boolean DEFAULT false)
RETURNS text[]
AS 'MODULE_PATHNAME', 'gemma_complete_batch'
LANGUAGE C VOLATILE PARALLEL SAFE COST 100000;

COMMENT ON FUNCTION gemma_complete_batch(text[], int, float8, float8, int, bigint, text[], boolean, boolean) IS
'gemma_complete over many prompts at once, generated together';

CREATE FUNCTION gemma_generate_batch(prompts text[],
									 max_tokens int DEFAULT NULL,
									 temperature float8 DEFAULT NULL,
									 top_p float8 DEFAULT NULL,
									 top_k int DEFAULT NULL,
									 seed bigint DEFAULT NULL,
									 stop text[] DEFAULT NULL,
									 system text DEFAULT NULL,
									 -- media: one element per prompt, NULL for none
									 images bytea[] DEFAULT NULL,
									 audio bytea[] DEFAULT NULL,
									 max_soft_tokens int DEFAULT NULL,
									 -- NULL follows gemma4.speculative
									 speculative boolean DEFAULT NULL,
									 -- special-token text in the prompt is plain text unless true
									 allow_control_tokens boolean DEFAULT false)
RETURNS text[]
AS 'MODULE_PATHNAME', 'gemma_generate_batch'
LANGUAGE C VOLATILE PARALLEL SAFE COST 100000;

COMMENT ON FUNCTION gemma_generate_batch(text[], int, float8, float8, int, bigint, text[], text, bytea[], bytea[], int, boolean, boolean) IS
'gemma_generate over many prompts at once, generated together; images[i] and audio[i] (NULL: none) go with prompts[i]';

CREATE FUNCTION gemma_chat(messages jsonb, options jsonb DEFAULT '{}')
RETURNS jsonb
AS 'MODULE_PATHNAME', 'gemma_chat'
LANGUAGE C VOLATILE PARALLEL SAFE COST 10000;

COMMENT ON FUNCTION gemma_chat(jsonb, jsonb) IS
'chat over [{"role", "content"}] messages (content: a string, or parts {"type": "text", "text"} / {"type": "image" | "audio", "data": base64}); returns {content, reasoning, finish_reason, usage}';

-- STRICT: a NULL text has no tokens, a NULL array no text.
CREATE FUNCTION gemma_tokenize(text)
RETURNS int[]
AS 'MODULE_PATHNAME', 'gemma_tokenize'
LANGUAGE C VOLATILE STRICT PARALLEL SAFE COST 100;

CREATE FUNCTION gemma_detokenize(int[])
RETURNS text
AS 'MODULE_PATHNAME', 'gemma_detokenize'
LANGUAGE C VOLATILE STRICT PARALLEL SAFE COST 100;

CREATE FUNCTION gemma_wait_ready(timeout_ms int DEFAULT 60000)
RETURNS boolean
AS 'MODULE_PATHNAME', 'gemma_wait_ready'
LANGUAGE C VOLATILE STRICT PARALLEL SAFE;

COMMENT ON FUNCTION gemma_wait_ready(int) IS
'wait until the model is ready: true when ready, false when loading failed or timeout_ms passed';

/* Admin views, for pg_monitor. */

CREATE FUNCTION gemma_stats(
	OUT worker_state text,
	OUT state_reason text,
	OUT state_since timestamptz,
	OUT worker_pid int,
	OUT engine_pid int,
	OUT engine_restarts bigint,
	OUT uptime interval,
	OUT model_path text,
	OUT model_alias text,
	OUT architecture text,
	OUT backend text,
	OUT device text,
	OUT kv_cache_dtype text,
	OUT max_model_len int,
	OUT max_num_seqs int,
	OUT weight_bytes bigint,
	OUT kv_bytes bigint,
	OUT workspace_bytes bigint,
	OUT requests bigint,
	OUT finished bigint,
	OUT errors bigint,
	OUT cancelled bigint,
	OUT preemptions bigint,
	OUT requests_active int,
	OUT tokens_in bigint,
	OUT tokens_out bigint,
	OUT steps bigint,
	OUT mean_batch_size float8,
	OUT max_batch_size bigint,
	OUT max_batch_tokens bigint,
	OUT spec_acceptance float8,
	-- prefix caching: prompt tokens found computed in the cache (not prefilled)
	OUT tokens_in_cached bigint,
	-- media
	OUT images bigint,
	OUT audio_seconds float8,
	OUT media_decode_seconds float8,
	OUT media_embed_seconds float8,
	-- mtp: speculative decoding
	OUT spec_tokens int,
	OUT spec_drafted bigint,
	OUT spec_accepted bigint,
	OUT spec_mean_accepted_length float8,
	OUT spec_position_acceptance float8[],
	OUT speculative_max_batch int)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'gemma_stats'
LANGUAGE C VOLATILE STRICT PARALLEL RESTRICTED ROWS 1;

CREATE VIEW gemma_stats AS SELECT * FROM gemma_stats();

CREATE FUNCTION gemma_kv_pool(
	OUT device text,
	OUT kv_cache_dtype text,
	OUT kv_group text,
	OUT layers int,
	OUT block_tokens int,
	OUT blocks_total bigint,
	OUT blocks_used bigint,
	OUT blocks_free bigint,
	OUT bytes bigint,
	OUT bytes_used bigint,
	OUT sequences_live int,
	OUT full_window_fits bigint,
	-- prefix caching (since the engine started): blocks findable by content,
	-- blocks asked of the cache at admissions, blocks it supplied, their ratio
	OUT blocks_cached bigint,
	OUT prefix_lookups bigint,
	OUT prefix_hits bigint,
	OUT prefix_hit_rate float8)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'gemma_kv_pool'
LANGUAGE C VOLATILE STRICT PARALLEL RESTRICTED ROWS 2;

CREATE VIEW gemma_kv_pool AS SELECT * FROM gemma_kv_pool();

-- where the device's memory went (host memory on the CPU backend): one row
-- per use, the engine's and its backend's buffers
CREATE FUNCTION gemma_memory(
	OUT device text,
	OUT use text,
	OUT bytes bigint)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'gemma_memory'
LANGUAGE C VOLATILE STRICT PARALLEL RESTRICTED ROWS 16;

CREATE VIEW gemma_memory AS SELECT * FROM gemma_memory();

CREATE FUNCTION gemma_requests(
	OUT pid int,
	OUT request_id bigint,
	OUT kind text,
	OUT state text,
	OUT prompt_tokens int,
	OUT generated_tokens int,
	OUT kv_blocks int,
	OUT submitted_at timestamptz,
	OUT time_to_first_token interval,
	OUT tokens_per_second float8,
	-- media
	OUT media_tokens int)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'gemma_requests'
LANGUAGE C VOLATILE STRICT PARALLEL RESTRICTED;

CREATE VIEW gemma_requests AS SELECT * FROM gemma_requests();

REVOKE ALL ON FUNCTION gemma_stats() FROM PUBLIC;
REVOKE ALL ON FUNCTION gemma_kv_pool() FROM PUBLIC;
REVOKE ALL ON FUNCTION gemma_memory() FROM PUBLIC;
REVOKE ALL ON FUNCTION gemma_requests() FROM PUBLIC;
REVOKE ALL ON gemma_stats FROM PUBLIC;
REVOKE ALL ON gemma_kv_pool FROM PUBLIC;
REVOKE ALL ON gemma_memory FROM PUBLIC;
REVOKE ALL ON gemma_requests FROM PUBLIC;
GRANT EXECUTE ON FUNCTION gemma_stats() TO pg_monitor;
GRANT EXECUTE ON FUNCTION gemma_kv_pool() TO pg_monitor;
GRANT EXECUTE ON FUNCTION gemma_memory() TO pg_monitor;
GRANT EXECUTE ON FUNCTION gemma_requests() TO pg_monitor;
GRANT SELECT ON gemma_stats TO pg_monitor;
GRANT SELECT ON gemma_kv_pool TO pg_monitor;
GRANT SELECT ON gemma_memory TO pg_monitor;
GRANT SELECT ON gemma_requests TO pg_monitor;

/* The role whose members may use the model (see "Who may use the model"
 * below); made before the job tables, whose grants name it. */
DO $$
BEGIN
	IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'gemma_user') THEN
		CREATE ROLE gemma_user NOLOGIN;
	END IF;
END $$;
COMMENT ON ROLE gemma_user IS 'may call the gemma4 generation and tokenizer functions';

/* ---- table jobs ----------------------------------------------------------
 *
 * A job fills a target column of a table from a prompt expression over the
 * table's columns, in the background (src/pg/job.c, src/pg/job_worker.c).
 * Its state lives in these tables: the job row (definition, state, counters),
 * the queue of row keys still to answer and the rows that failed.  Every
 * table has row-level security: a role sees and changes only the jobs of the
 * roles it is a member of (superusers see all), and a job's workers run as
 * the role that created it, so that role's privileges and policies apply to
 * what they read and write.
 */
CREATE TABLE gemma_job (
	id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	-- regrole and regclass, not oid: pg_dump writes them as names, so a
	-- restored job names its own role and table (pg_upgrade keeps both)
	owner regrole NOT NULL,
	relid regclass NOT NULL,
	key_column name NOT NULL,
	target_column name NOT NULL,
	prompt text NOT NULL,
	images text,								-- expressions of type bytea or bytea[]
	audio text,
	condition text,
	system text,
	options jsonb NOT NULL DEFAULT '{}',
	completion boolean NOT NULL DEFAULT false,
	follow boolean NOT NULL DEFAULT false,
	search_path text NOT NULL DEFAULT '',		-- the creator's, for the expressions
	workers int NOT NULL DEFAULT 1 CHECK (workers BETWEEN 1 AND 8),
	state text NOT NULL DEFAULT 'running'
		CHECK (state IN ('running', 'paused', 'cancelled', 'done', 'failed')),
	started_at timestamptz NOT NULL DEFAULT now(),
	finished_at timestamptz,
	rows_done bigint NOT NULL DEFAULT 0,
	rows_failed bigint NOT NULL DEFAULT 0,
	tokens_in bigint NOT NULL DEFAULT 0,
	tokens_out bigint NOT NULL DEFAULT 0,
	last_error text
);

/* Row keys (as text) still to answer; claimed_by is the worker number. */
CREATE TABLE gemma_job_queue (
	job_id bigint NOT NULL REFERENCES gemma_job ON DELETE CASCADE,
	key text NOT NULL,
	claimed_by int,
	attempts int NOT NULL DEFAULT 0,
	retry_at timestamptz NOT NULL DEFAULT '-infinity',
	PRIMARY KEY (job_id, key)
);

CREATE TABLE gemma_job_errors (
	job_id bigint NOT NULL REFERENCES gemma_job ON DELETE CASCADE,
	row_key text NOT NULL,
	sqlstate text NOT NULL,
	message text NOT NULL,
	attempts int NOT NULL,
	failed_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX ON gemma_job_errors (job_id);

ALTER TABLE gemma_job ENABLE ROW LEVEL SECURITY;
ALTER TABLE gemma_job_queue ENABLE ROW LEVEL SECURITY;
ALTER TABLE gemma_job_errors ENABLE ROW LEVEL SECURITY;
CREATE POLICY gemma_job_members ON gemma_job
	USING (pg_has_role(owner, 'MEMBER')) WITH CHECK (pg_has_role(owner, 'MEMBER'));
-- the subquery sees only the jobs gemma_job's policy lets the caller see
CREATE POLICY gemma_job_queue_members ON gemma_job_queue
	USING (job_id IN (SELECT id FROM gemma_job));
CREATE POLICY gemma_job_errors_members ON gemma_job_errors
	USING (job_id IN (SELECT id FROM gemma_job));
-- creating a job is using the model: members of gemma_user only
GRANT SELECT, DELETE ON gemma_job TO PUBLIC;
GRANT INSERT ON gemma_job TO gemma_user;
GRANT UPDATE (state, finished_at, rows_done, rows_failed, tokens_in, tokens_out, last_error)
	ON gemma_job TO PUBLIC;
GRANT SELECT, INSERT, UPDATE, DELETE ON gemma_job_queue TO PUBLIC;
GRANT SELECT, INSERT, DELETE ON gemma_job_errors TO PUBLIC;
-- the jobs are data: pg_dump keeps them, and the ids' sequence, so that a
-- restored database goes on numbering after its jobs
SELECT pg_catalog.pg_extension_config_dump('gemma_job', '');
SELECT pg_catalog.pg_extension_config_dump('gemma_job_id_seq', '');
-- pg_dump by a database owner who is no superuser reads it
GRANT SELECT ON SEQUENCE gemma_job_id_seq TO PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('gemma_job_queue', '');
SELECT pg_catalog.pg_extension_config_dump('gemma_job_errors', '');

CREATE FUNCTION gemma_job_check_options(options jsonb, system text)
RETURNS void
AS 'MODULE_PATHNAME', 'gemma_job_check_options'
LANGUAGE C VOLATILE;

/* Start the job's workers when the calling transaction commits. */
CREATE FUNCTION gemma_job_launch(job bigint)
RETURNS void
AS 'MODULE_PATHNAME', 'gemma_job_launch'
LANGUAGE C VOLATILE STRICT;

/*
 * The "keep up to date" trigger: queues the key of each row inserted, or
 * updated in another column than the target.  It evaluates no expression of
 * the job (that would run the job's SQL as whoever changes the table); the
 * job's worker, running as the job's owner, reads the row.  SECURITY DEFINER
 * so that any role that may change the table may queue the row; it queues
 * only for a job defined on the very table that fired it.
 */
CREATE FUNCTION gemma_job_enqueue()
RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
	k text;
BEGIN
	-- as the extension's owner: nothing the table's owner defined may run
	-- here.  relid compared as oid with pg_catalog's = (an exact-match
	-- =(regclass, oid) elsewhere on the path would be chosen first); the
	-- key as text by its type's output function (pg_catalog.format: base
	-- types' I/O functions are a superuser's), never a cast, which the
	-- owner of a composite or enum key type may define
	-- an update by this job's own worker (its answer, and whatever the
	-- table's triggers and generated columns derive from it: updated_at)
	-- queues nothing, or the job would answer its rows for ever.  A session
	-- naming itself so only keeps its own changes from being answered again.
	IF TG_OP = 'UPDATE' AND pg_catalog.current_setting('application_name') = 'gemma4 job ' || TG_ARGV[0] THEN
		RETURN NULL;
	END IF;
	IF NOT EXISTS (SELECT FROM gemma_job j WHERE j.id = TG_ARGV[0]::bigint
				   AND j.relid::pg_catalog.oid = TG_RELID AND j.key_column = TG_ARGV[1]
				   AND j.state NOT IN ('cancelled', 'done')) THEN
		RETURN NULL;
	END IF;
	EXECUTE pg_catalog.format('SELECT pg_catalog.format(''%%s'', ($1).%I)', TG_ARGV[1]) USING NEW INTO k;
	IF k IS NULL THEN
		RETURN NULL;
	END IF;
	INSERT INTO gemma_job_queue (job_id, key) VALUES (TG_ARGV[0]::bigint, k)
		ON CONFLICT DO NOTHING;
	RETURN NULL;
END
$$;
REVOKE ALL ON FUNCTION gemma_job_enqueue() FROM PUBLIC;
-- CREATE TRIGGER (follow => true) needs EXECUTE on it; firing does not
GRANT EXECUTE ON FUNCTION gemma_job_enqueue() TO gemma_user;

/*
 * No SET search_path: the job's expressions are checked, and later run by its
 * workers, with the caller's search_path (stored with the job); the
 * extension's own objects are named with its schema.
 */
CREATE FUNCTION gemma_job_create(relation regclass,
								 target name,
								 prompt text,
								 condition text DEFAULT NULL,
								 system text DEFAULT NULL,
								 options jsonb DEFAULT '{}',
								 key name DEFAULT NULL,
								 follow boolean DEFAULT false,
								 workers int DEFAULT 1,
								 completion boolean DEFAULT false,
								 images text DEFAULT NULL,
								 audio text DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
	job bigint;
	keys name[];
	media record;
	media_type regtype;
	rel text := relation::text;
	ext text := (SELECT quote_ident(n.nspname) FROM pg_catalog.pg_extension e
				 JOIN pg_catalog.pg_namespace n ON n.oid = e.extnamespace WHERE e.extname = 'gemma4');
BEGIN
	IF relation IS NULL OR target IS NULL OR prompt IS NULL THEN
		RAISE EXCEPTION 'relation, target and prompt must not be null'
			USING ERRCODE = 'null_value_not_allowed';
	END IF;
	IF NOT (SELECT rolcanlogin FROM pg_catalog.pg_roles WHERE rolname = current_user) THEN
		RAISE EXCEPTION 'role "%" cannot log in, so no job can run as it', current_user
			USING ERRCODE = 'insufficient_privilege',
				  HINT = 'A job runs as the role that creates it: create it as a role with LOGIN.';
	END IF;
	IF workers IS NULL OR workers NOT BETWEEN 1 AND 8 THEN
		RAISE EXCEPTION 'workers must be between 1 and 8'
			USING ERRCODE = 'invalid_parameter_value';
	END IF;
	IF key IS NULL THEN
		SELECT pg_catalog.array_agg(a.attname) INTO keys
		  FROM pg_catalog.pg_index i JOIN pg_catalog.pg_attribute a
			ON a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey)
		 WHERE i.indrelid = relation AND i.indisprimary;
		IF keys IS NULL OR pg_catalog.cardinality(keys) <> 1 THEN
			RAISE EXCEPTION 'table % has no single-column primary key', rel
				USING ERRCODE = 'invalid_parameter_value',
					  HINT = 'Pass key => the name of a unique, not null column.';
		END IF;
		key := keys[1];
	END IF;
	IF completion AND system IS NOT NULL THEN
		RAISE EXCEPTION 'a completion job has no system message'
			USING ERRCODE = 'invalid_parameter_value',
				  HINT = 'Put the instruction into the prompt, or pass completion => false.';
	END IF;
	IF key = target THEN
		RAISE EXCEPTION 'the key column cannot be the target column'
			USING ERRCODE = 'invalid_parameter_value';
	END IF;
	IF completion AND (images IS NOT NULL OR audio IS NOT NULL) THEN
		RAISE EXCEPTION 'a completion job takes no images or audio'
			USING ERRCODE = 'invalid_parameter_value',
				  HINT = 'Pass completion => false: media go into the chat turn, like gemma_generate''s.';
	END IF;
	EXECUTE format('SELECT %s.gemma_job_check_options($1, $2)', ext) USING options, system;
	-- as the caller, whom the job will run as: the columns exist, the
	-- expressions parse, and the caller may read and update what they use
	EXECUTE format('SELECT %I::text, (%s)::text FROM %s WHERE (%s) AND false',
				   key, prompt, rel, coalesce(condition, 'true'));
	EXECUTE format('UPDATE %s SET %I = NULL::text WHERE false', rel, target);
	-- media: the type of each expression, read through an outer join that
	-- gives one row (of NULLs) whatever the table holds
	FOR media IN SELECT * FROM (VALUES ('images', images), ('audio', audio)) v(what, expr)
				  WHERE expr IS NOT NULL LOOP
		EXECUTE format('SELECT pg_catalog.pg_typeof(m) FROM (SELECT (%s) AS m FROM %s WHERE false) s '
					   'RIGHT JOIN (VALUES (1)) one ON true', media.expr, rel)
		   INTO media_type;
		IF media_type NOT IN ('bytea'::regtype, 'bytea[]'::regtype) THEN
			RAISE EXCEPTION '% must be of type bytea or bytea[], not %', media.what, media_type
				USING ERRCODE = 'datatype_mismatch',
					  HINT = 'Name a bytea or bytea[] column, or an expression of one of these types.';
		END IF;
	END LOOP;

	EXECUTE format('INSERT INTO %s.gemma_job (owner, relid, key_column, target_column, prompt, condition, '
				   'system, options, completion, follow, workers, search_path, images, audio) '
				   'VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14) RETURNING id', ext)
	   INTO job
	  USING current_user::regrole, relation, key, target, prompt, condition, system,
			coalesce(options, '{}'), coalesce(completion, false), coalesce(follow, false), workers,
			pg_catalog.current_setting('search_path'), images, audio;
	-- the triggers before the queue's fill: CREATE TRIGGER waits for the
	-- writers in flight on the table and holds off new ones until this
	-- commits, so the fill sees every row a trigger did not queue
	IF follow THEN
		EXECUTE format('CREATE TRIGGER %I AFTER INSERT ON %s FOR EACH ROW EXECUTE FUNCTION %s.gemma_job_enqueue(%L, %L)',
					   'gemma_job_' || job || '_insert', rel, ext, job, key);
		-- the job's own answers change only the target: they queue nothing
		EXECUTE format('CREATE TRIGGER %I AFTER UPDATE ON %s FOR EACH ROW '
					   'WHEN ((to_jsonb(OLD) - %L) IS DISTINCT FROM (to_jsonb(NEW) - %L)) '
					   'EXECUTE FUNCTION %s.gemma_job_enqueue(%L, %L)',
					   'gemma_job_' || job || '_update', rel, target, target, ext, job, key);
	END IF;
	-- keys as text the way the trigger and the workers write them
	EXECUTE format('INSERT INTO %s.gemma_job_queue (job_id, key) SELECT $1, pg_catalog.format(''%%s'', %I) '
				   'FROM %s WHERE %s', ext, key, rel, coalesce(condition, 'true')) USING job;
	EXECUTE format('SELECT %s.gemma_job_launch($1)', ext) USING job;
	RETURN job;
END
$$;

COMMENT ON FUNCTION gemma_job_create(regclass, name, text, text, text, jsonb, name, boolean, int, boolean, text, text) IS
'start a background job that sets target to the answer to prompt (an expression over the table''s columns, with images and audio from the row when given) for the rows matching condition';

/* The job as the caller may see it; raises an error when it may not. */
CREATE FUNCTION gemma_job_get(job bigint)
RETURNS gemma_job
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
	j gemma_job;
BEGIN
	SELECT * INTO j FROM gemma_job WHERE id = job FOR UPDATE;
	IF NOT FOUND THEN
		RAISE EXCEPTION 'gemma job % does not exist', job
			USING ERRCODE = 'undefined_object',
				  HINT = 'SELECT * FROM gemma_jobs lists the jobs you may see.';
	END IF;
	RETURN j;
END
$$;

CREATE FUNCTION gemma_job_pause(job bigint)
RETURNS void
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
	j gemma_job := gemma_job_get(job);
BEGIN
	IF j.state <> 'running' THEN
		RAISE EXCEPTION 'gemma job % is %, not running', job, j.state
			USING ERRCODE = 'object_not_in_prerequisite_state';
	END IF;
	UPDATE gemma_job SET state = 'paused' WHERE id = job;
END
$$;

CREATE FUNCTION gemma_job_resume(job bigint)
RETURNS void
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
	j gemma_job := gemma_job_get(job);
BEGIN
	-- a running job: start workers that are missing (one that runs already
	-- holds its number's lock, and the new one exits)
	IF j.state NOT IN ('paused', 'failed', 'running') THEN
		RAISE EXCEPTION 'gemma job % is %, not paused or failed', job, j.state
			USING ERRCODE = 'object_not_in_prerequisite_state';
	END IF;
	UPDATE gemma_job SET state = 'running', finished_at = NULL WHERE id = job;
	PERFORM gemma_job_launch(job);
END
$$;

CREATE FUNCTION gemma_job_cancel(job bigint)
RETURNS void
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
	j gemma_job := gemma_job_get(job);
BEGIN
	IF j.state IN ('cancelled', 'done') THEN
		RAISE EXCEPTION 'gemma job % is already %', job, j.state
			USING ERRCODE = 'object_not_in_prerequisite_state';
	END IF;
	UPDATE gemma_job SET state = 'cancelled', finished_at = now() WHERE id = job;
	DELETE FROM gemma_job_queue WHERE job_id = job;
	-- only the table's owner may drop triggers; left behind, they queue
	-- nothing for a cancelled job, and the next check of the jobs drops them
	-- (gemma_job_tidy)
	IF j.follow THEN
		BEGIN
			EXECUTE format('DROP TRIGGER IF EXISTS %I ON %s', 'gemma_job_' || job || '_insert', j.relid::regclass);
			EXECUTE format('DROP TRIGGER IF EXISTS %I ON %s', 'gemma_job_' || job || '_update', j.relid::regclass);
		EXCEPTION WHEN insufficient_privilege THEN
			NULL;
		END;
	END IF;
END
$$;

/*
 * What the job starter (src/pg/job.c), a superuser, tidies in its database
 * at each check of the jobs, before it starts their missing workers:
 *  - a job goes with its table: left behind, it would keep the dropped
 *    table's OID, which pg_dump writes as a number and a restore could bind
 *    to another table (an event trigger on the drop would wait for the
 *    job's row, which a worker writing answers holds while it waits for the
 *    dropped table);
 *  - keys a follow job's trigger queued in a transaction that was open while
 *    the job was cancelled (the cancel could not see them);
 *  - a running job whose owner was dropped or cannot log in fails: its
 *    workers could not even connect;
 *  - the triggers of cancelled follow jobs that the canceller could not drop
 *    (a role with TRIGGER on a table it does not own creates them, and only
 *    the owner may drop them); a table busy for longer than lock_timeout
 *    keeps them until a later check, and meanwhile they queue nothing.
 */
CREATE FUNCTION gemma_job_tidy()
RETURNS void
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
	t record;
	timeout text := current_setting('lock_timeout');
BEGIN
	DELETE FROM gemma_job j
	 WHERE NOT EXISTS (SELECT FROM pg_catalog.pg_class c WHERE c.oid = j.relid::pg_catalog.oid);
	DELETE FROM gemma_job_queue q USING gemma_job j WHERE q.job_id = j.id AND j.state = 'cancelled';
	UPDATE gemma_job SET state = 'failed', finished_at = now(),
		   last_error = 'the role that created the job no longer exists'
	 WHERE state = 'running' AND NOT EXISTS (SELECT FROM pg_catalog.pg_roles r WHERE r.oid = owner);
	UPDATE gemma_job SET state = 'failed', finished_at = now(),
		   last_error = 'the role that created the job, ' || owner || ', cannot log in'
	 WHERE state = 'running'
	   AND EXISTS (SELECT FROM pg_catalog.pg_roles r WHERE r.oid = owner AND NOT r.rolcanlogin);
	PERFORM set_config('lock_timeout', '100ms', true);
	FOR t IN SELECT g.tgname, g.tgrelid::pg_catalog.regclass AS rel
			   FROM pg_catalog.pg_trigger g JOIN gemma_job j ON g.tgrelid = j.relid::pg_catalog.oid
			  WHERE j.state = 'cancelled' AND j.follow
				AND g.tgname IN ('gemma_job_' || j.id || '_insert', 'gemma_job_' || j.id || '_update')
	LOOP
		BEGIN
			EXECUTE format('DROP TRIGGER IF EXISTS %I ON %s', t.tgname, t.rel);
		EXCEPTION WHEN lock_not_available THEN
			NULL;
		END;
	END LOOP;
	PERFORM set_config('lock_timeout', timeout, true);
END
$$;
REVOKE ALL ON FUNCTION gemma_job_tidy() FROM PUBLIC;

/*
 * Progress, like pg_stat_progress_*: one snapshot, so at every read
 * rows_total = rows_done + rows_failed + rows_pending.  A "keep up to date"
 * job counts each answer it writes, so a row answered again after a change
 * counts again.  tokens_per_second and the ETA are over the time since the
 * job started.
 */
CREATE VIEW gemma_jobs WITH (security_invoker = true) AS
SELECT j.id AS job,
	   j.owner::regrole AS owner,
	   j.relid::regclass AS relation,
	   j.target_column AS target,
	   j.state,
	   j.follow,
	   j.rows_done + j.rows_failed + q.pending AS rows_total,
	   j.rows_done,
	   j.rows_failed,
	   q.pending AS rows_pending,
	   q.in_progress AS rows_in_progress,
	   j.tokens_in,
	   j.tokens_out,
	   round((j.tokens_out / greatest(t.seconds, 0.001))::numeric, 1) AS tokens_per_second,
	   j.started_at,
	   j.finished_at,
	   CASE WHEN j.state = 'running' AND j.rows_done > 0
			THEN now() + make_interval(secs => t.seconds * q.pending / j.rows_done) END AS eta,
	   j.last_error,
	   j.workers,
	   -- fewer than workers while one is missing, until the next check
	   -- (gemma4.job_check_interval) starts it again
	   coalesce(w.running, 0) AS workers_running
  FROM gemma_job j
 CROSS JOIN LATERAL (SELECT count(*) AS pending, count(claimed_by) AS in_progress
					   FROM gemma_job_queue WHERE job_id = j.id) q
 -- pg_stat_activity read once, not once a job
  LEFT JOIN (SELECT a.application_name, count(*) AS running FROM pg_catalog.pg_stat_activity a
			  WHERE a.datname = pg_catalog.current_database() AND a.backend_type = 'gemma4 job worker'
			  GROUP BY a.application_name) w ON w.application_name = 'gemma4 job ' || j.id
 CROSS JOIN LATERAL (SELECT extract(epoch FROM coalesce(j.finished_at, now()) - j.started_at)::float8
							AS seconds) t;
GRANT SELECT ON gemma_jobs TO PUBLIC;

/*
 * Who may use the model (safety).
 *
 * The engine is shared by every database of the cluster: nothing that loads
 * it is executable by PUBLIC.  Members of the role gemma_user may call the
 * generation and tokenizer functions:
 *   GRANT gemma_user TO app_role;
 * The role is cluster-wide and made above, with the job tables, when it
 * does not exist yet (it outlives DROP EXTENSION, like any role).  Creating
 * a table job is using the model too: INSERT on gemma_job and the job
 * functions are the members' only, and a job's workers refuse a job whose
 * owner is no longer a member.  Limits per role:
 * gemma4.max_requests_per_role, gemma4.max_tokens_limit,
 * gemma4.max_prompt_bytes (see the README, "Security").
 */

DO $$
DECLARE
	f regprocedure;
BEGIN
	-- this extension's functions, whatever their signatures
	FOR f IN SELECT p.oid::regprocedure FROM pg_proc p
			 JOIN pg_depend d ON d.classid = 'pg_proc'::regclass AND d.objid = p.oid AND d.deptype = 'e'
			 JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'gemma4'
			 WHERE p.proname IN ('gemma_generate', 'gemma_complete', 'gemma_generate_stream',
								 'gemma_complete_stream', 'gemma_generate_batch', 'gemma_complete_batch',
								 'gemma_chat', 'gemma_tokenize', 'gemma_detokenize', 'gemma_wait_ready',
								 'gemma_job_create', 'gemma_job_check_options', 'gemma_job_launch')
	LOOP
		EXECUTE format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', f);
		EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO gemma_user', f);
	END LOOP;
END $$;
