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
							   allow_control_tokens boolean DEFAULT false)
RETURNS text
AS 'MODULE_PATHNAME', 'gemma_generate'
LANGUAGE C VOLATILE PARALLEL SAFE COST 10000;

COMMENT ON FUNCTION gemma_generate(text, bytea[], bytea[], int, float8, float8, int, bigint, text[], text, boolean) IS
'single-turn chat: the answer to prompt (after an optional system message); greedy unless temperature is given';

CREATE FUNCTION gemma_complete(prompt text,
							   max_tokens int DEFAULT NULL,
							   temperature float8 DEFAULT NULL,
							   top_p float8 DEFAULT NULL,
							   top_k int DEFAULT NULL,
							   seed bigint DEFAULT NULL,
							   stop text[] DEFAULT NULL,
							   allow_control_tokens boolean DEFAULT false)
RETURNS text
AS 'MODULE_PATHNAME', 'gemma_complete'
LANGUAGE C VOLATILE PARALLEL SAFE COST 10000;

COMMENT ON FUNCTION gemma_complete(text, int, float8, float8, int, bigint, text[], boolean) IS
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
									  allow_control_tokens boolean DEFAULT false)
RETURNS SETOF text
AS 'MODULE_PATHNAME', 'gemma_generate_stream'
LANGUAGE C VOLATILE PARALLEL SAFE COST 10000 ROWS 100;

COMMENT ON FUNCTION gemma_generate_stream(text, bytea[], bytea[], int, float8, float8, int, bigint, text[], text, boolean) IS
'gemma_generate, one row per decoded piece';

CREATE FUNCTION gemma_complete_stream(prompt text,
									  max_tokens int DEFAULT NULL,
									  temperature float8 DEFAULT NULL,
									  top_p float8 DEFAULT NULL,
									  top_k int DEFAULT NULL,
									  seed bigint DEFAULT NULL,
									  stop text[] DEFAULT NULL,
									  allow_control_tokens boolean DEFAULT false)
RETURNS SETOF text
AS 'MODULE_PATHNAME', 'gemma_complete_stream'
LANGUAGE C VOLATILE PARALLEL SAFE COST 10000 ROWS 100;

COMMENT ON FUNCTION gemma_complete_stream(text, int, float8, float8, int, bigint, text[], boolean) IS
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
									 allow_control_tokens boolean DEFAULT false)
RETURNS text[]
AS 'MODULE_PATHNAME', 'gemma_complete_batch'
LANGUAGE C VOLATILE PARALLEL SAFE COST 100000;

COMMENT ON FUNCTION gemma_complete_batch(text[], int, float8, float8, int, bigint, text[], boolean) IS
'gemma_complete over many prompts at once, generated together';

CREATE FUNCTION gemma_generate_batch(prompts text[],
									 max_tokens int DEFAULT NULL,
									 temperature float8 DEFAULT NULL,
									 top_p float8 DEFAULT NULL,
									 top_k int DEFAULT NULL,
									 seed bigint DEFAULT NULL,
									 stop text[] DEFAULT NULL,
									 system text DEFAULT NULL,
									 allow_control_tokens boolean DEFAULT false)
RETURNS text[]
AS 'MODULE_PATHNAME', 'gemma_generate_batch'
LANGUAGE C VOLATILE PARALLEL SAFE COST 100000;

COMMENT ON FUNCTION gemma_generate_batch(text[], int, float8, float8, int, bigint, text[], text, boolean) IS
'gemma_generate over many prompts at once, generated together';

CREATE FUNCTION gemma_chat(messages jsonb, options jsonb DEFAULT '{}')
RETURNS jsonb
AS 'MODULE_PATHNAME', 'gemma_chat'
LANGUAGE C VOLATILE PARALLEL SAFE COST 10000;

COMMENT ON FUNCTION gemma_chat(jsonb, jsonb) IS
'chat over [{"role", "content"}] messages; returns {content, reasoning, finish_reason, usage}';

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
	OUT spec_acceptance float8)
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
	OUT full_window_fits bigint)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'gemma_kv_pool'
LANGUAGE C VOLATILE STRICT PARALLEL RESTRICTED ROWS 2;

CREATE VIEW gemma_kv_pool AS SELECT * FROM gemma_kv_pool();

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
	OUT tokens_per_second float8)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'gemma_requests'
LANGUAGE C VOLATILE STRICT PARALLEL RESTRICTED;

CREATE VIEW gemma_requests AS SELECT * FROM gemma_requests();

REVOKE ALL ON FUNCTION gemma_stats() FROM PUBLIC;
REVOKE ALL ON FUNCTION gemma_kv_pool() FROM PUBLIC;
REVOKE ALL ON FUNCTION gemma_requests() FROM PUBLIC;
REVOKE ALL ON gemma_stats FROM PUBLIC;
REVOKE ALL ON gemma_kv_pool FROM PUBLIC;
REVOKE ALL ON gemma_requests FROM PUBLIC;
GRANT EXECUTE ON FUNCTION gemma_stats() TO pg_monitor;
GRANT EXECUTE ON FUNCTION gemma_kv_pool() TO pg_monitor;
GRANT EXECUTE ON FUNCTION gemma_requests() TO pg_monitor;
GRANT SELECT ON gemma_stats TO pg_monitor;
GRANT SELECT ON gemma_kv_pool TO pg_monitor;
GRANT SELECT ON gemma_requests TO pg_monitor;

/*
 * Who may use the model (safety).
 *
 * The engine is shared by every database of the cluster: nothing that loads
 * it is executable by PUBLIC.  Members of the role gemma_user may call the
 * generation and tokenizer functions:
 *   GRANT gemma_user TO app_role;
 * The role is cluster-wide and made here when it does not exist yet (it
 * outlives DROP EXTENSION, like any role).  Limits per role:
 * gemma4.max_requests_per_role, gemma4.max_tokens_limit,
 * gemma4.max_prompt_bytes (see the README, "Security").
 */
DO $$
BEGIN
	IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'gemma_user') THEN
		CREATE ROLE gemma_user NOLOGIN;
	END IF;
END $$;
COMMENT ON ROLE gemma_user IS 'may call the gemma4 generation and tokenizer functions';

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
								 'gemma_chat', 'gemma_tokenize', 'gemma_detokenize', 'gemma_wait_ready')
	LOOP
		EXECUTE format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', f);
		EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO gemma_user', f);
	END LOOP;
END $$;
