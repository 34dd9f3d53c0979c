/*-------------------------------------------------------------------------
 *
 * admin.c
 *	  Functions behind the admin views gemma_stats, gemma_kv_pool,
 *	  gemma_memory and gemma_requests, and gemma_wait_ready().
 *
 * The views read what the supervisor published in shared memory: its own
 * counters (kept across engine restarts), and the statistics the engine
 * process reports after its steps (at most ten times a second, and at once
 * when it falls idle).  Everything is copied under the lock, and tuples
 * are built after releasing it.
 *
 * IDENTIFICATION
 *	  src/pg/admin.c
 *
 *-------------------------------------------------------------------------
 */
#include "gemma4.h"

#include "catalog/pg_type.h"
#include "engine.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"
#include "utils/tuplestore.h"
#include "utils/wait_event.h"

PG_FUNCTION_INFO_V1(gemma_stats);
PG_FUNCTION_INFO_V1(gemma_kv_pool);
PG_FUNCTION_INFO_V1(gemma_memory);
PG_FUNCTION_INFO_V1(gemma_requests);
PG_FUNCTION_INFO_V1(gemma_wait_ready);

#define GEMMA_STATS_COLS	42
#define GEMMA_KV_POOL_COLS	16
#define GEMMA_REQUESTS_COLS 11

/* A consistent copy of what the views show. */
typedef struct G4Snapshot
{
	G4WorkerState state;
	TimestampTz state_since;
	TimestampTz ready_since;
	char		reason[G4_REASON_LEN];
	char		model_path[MAXPGPATH];
	G4WireReady model;
	int			supervisor_pid;
	int			engine_pid;
	uint64		requests;
	uint64		finished;
	uint64		errors;
	uint64		cancelled;
	uint64		engine_restarts;
	G4WireStats base;
	G4WireStats stats;
	bool		have_stats;
	int			slots_in_use;
} G4Snapshot;

static void
take_snapshot(G4Snapshot *s)
{
	int			i;

	g4_require_shared();
	LWLockAcquire(g4_shared->lock, LW_SHARED);
	s->state = g4_shared->state;
	s->state_since = g4_shared->state_since;
	s->ready_since = g4_shared->ready_since;
	memcpy(s->reason, g4_shared->reason, G4_REASON_LEN);
	memcpy(s->model_path, g4_shared->model_path, MAXPGPATH);
	s->model = g4_shared->model;
	s->supervisor_pid = g4_shared->supervisor_pid;
	s->engine_pid = g4_shared->engine_pid;
	s->requests = g4_shared->requests;
	s->finished = g4_shared->finished;
	s->errors = g4_shared->errors;
	s->cancelled = g4_shared->cancelled;
	s->engine_restarts = g4_shared->engine_restarts;
	s->base = g4_shared->base;
	s->stats = g4_shared->stats;
	s->have_stats = g4_shared->have_stats;
	s->slots_in_use = 0;
	for (i = 0; i < g4_shared->n_slots; i++)
		if (g4_shared->slots[i].state != G4_SLOT_FREE)
			s->slots_in_use++;
	LWLockRelease(g4_shared->lock);
	if (!s->have_stats)
		memset(&s->stats, 0, sizeof(s->stats));
}

/* text or NULL when empty */
#define TEXT_OR_NULL(i, str) \
	do { \
		if ((str)[0] != '\0') \
			values[i] = CStringGetTextDatum(str); \
		else \
			nulls[i] = true; \
	} while (0)

Datum
gemma_stats(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	G4Snapshot	s;
	Datum		values[GEMMA_STATS_COLS];
	bool		nulls[GEMMA_STATS_COLS];
	uint64		steps;
	uint64		seqs_sum;
	uint64		drafted;
	uint64		accepted;
	int			i = 0;

	take_snapshot(&s);
	InitMaterializedSRF(fcinfo, 0);
	memset(nulls, 0, sizeof(nulls));

	steps = s.base.steps + s.stats.steps;
	seqs_sum = s.base.batch_seqs_sum + s.stats.batch_seqs_sum;
	drafted = s.base.spec_drafted + s.stats.spec_drafted;
	accepted = s.base.spec_accepted + s.stats.spec_accepted;

	values[i++] = CStringGetTextDatum(g4_state_name(s.state));
	TEXT_OR_NULL(i, s.reason);
	i++;
	values[i++] = TimestampTzGetDatum(s.state_since);
	if (s.supervisor_pid != 0)
		values[i] = Int32GetDatum(s.supervisor_pid);
	else
		nulls[i] = true;
	i++;
	if (s.engine_pid != 0)
		values[i] = Int32GetDatum(s.engine_pid);
	else
		nulls[i] = true;
	i++;
	values[i++] = Int64GetDatum((int64) s.engine_restarts);
	if (s.state == G4W_READY)
		values[i] = IntervalPGetDatum(DatumGetIntervalP(DirectFunctionCall2(timestamp_mi,
																			TimestampTzGetDatum(GetCurrentTimestamp()),
																			TimestampTzGetDatum(s.ready_since))));
	else
		nulls[i] = true;
	i++;
	TEXT_OR_NULL(i, s.model_path);
	i++;
	TEXT_OR_NULL(i, g4_model_alias ? g4_model_alias : "");
	i++;
	TEXT_OR_NULL(i, s.model.architecture);
	i++;
	TEXT_OR_NULL(i, s.stats.backend);
	i++;
	TEXT_OR_NULL(i, s.stats.device);
	i++;
	TEXT_OR_NULL(i, s.stats.kv_dtype);
	i++;
	if (s.model.max_model_len > 0)
		values[i] = Int32GetDatum(s.model.max_model_len);
	else
		nulls[i] = true;
	i++;
	if (s.have_stats)
	{
		values[i++] = Int32GetDatum(s.stats.max_num_seqs);
		values[i++] = Int64GetDatum((int64) s.stats.weight_bytes);
		values[i++] = Int64GetDatum((int64) s.stats.kv_bytes_total);
		values[i++] = Int64GetDatum((int64) s.stats.workspace_bytes);
	}
	else
	{
		nulls[i++] = true;
		nulls[i++] = true;
		nulls[i++] = true;
		nulls[i++] = true;
	}
	values[i++] = Int64GetDatum((int64) s.requests);
	values[i++] = Int64GetDatum((int64) s.finished);
	values[i++] = Int64GetDatum((int64) s.errors);
	values[i++] = Int64GetDatum((int64) s.cancelled);
	values[i++] = Int64GetDatum((int64) (s.base.preemptions + s.stats.preemptions));
	values[i++] = Int32GetDatum(s.slots_in_use);
	values[i++] = Int64GetDatum((int64) (s.base.tokens_prefilled + s.stats.tokens_prefilled));
	values[i++] = Int64GetDatum((int64) (s.base.tokens_generated + s.stats.tokens_generated));
	values[i++] = Int64GetDatum((int64) steps);
	if (steps > 0)
		values[i] = Float8GetDatum((double) seqs_sum / (double) steps);
	else
		nulls[i] = true;
	i++;
	values[i++] = Int64GetDatum((int64) Max(s.base.batch_seqs_max, s.stats.batch_seqs_max));
	values[i++] = Int64GetDatum((int64) Max(s.base.batch_tokens_max, s.stats.batch_tokens_max));
	if (drafted > 0)
		values[i] = Float8GetDatum((double) accepted / (double) drafted);
	else
		nulls[i] = true;
	i++;
	/* prefix caching */
	values[i++] = Int64GetDatum((int64) (s.base.prefix_hit_tokens + s.stats.prefix_hit_tokens));
	/* media */
	values[i++] = Int64GetDatum((int64) (s.base.images + s.stats.images));
	values[i++] = Float8GetDatum(s.base.audio_seconds + s.stats.audio_seconds);
	values[i++] = Float8GetDatum(s.base.media_decode_seconds + s.stats.media_decode_seconds);
	values[i++] = Float8GetDatum(s.base.media_embed_seconds + s.stats.media_embed_seconds);
	/* mtp: speculative decoding */
	{
		uint64		verifies = s.base.spec_verify_steps + s.stats.spec_verify_steps;
		Datum		pos[G4_WIRE_SPEC_POSITIONS];
		int			n_pos = 0;
		int			j;

		if (s.have_stats)
			values[i] = Int32GetDatum(s.stats.spec_k);
		else
			nulls[i] = true;
		i++;
		values[i++] = Int64GetDatum((int64) drafted);
		values[i++] = Int64GetDatum((int64) accepted);
		/* tokens a verify step yields: the accepted drafts plus the
		 * target's own */
		if (verifies > 0)
			values[i] = Float8GetDatum(1.0 + (double) accepted / (double) verifies);
		else
			nulls[i] = true;
		i++;
		for (j = 0; j < G4_WIRE_SPEC_POSITIONS; j++)
		{
			uint64		d = s.base.spec_pos_drafted[j] + s.stats.spec_pos_drafted[j];
			uint64		a = s.base.spec_pos_accepted[j] + s.stats.spec_pos_accepted[j];

			if (d == 0)
				break;
			pos[n_pos++] = Float8GetDatum((double) a / (double) d);
		}
		if (n_pos > 0)
			values[i] = PointerGetDatum(construct_array(pos, n_pos, FLOAT8OID, sizeof(float8), FLOAT8PASSBYVAL,
														TYPALIGN_DOUBLE));
		else
			nulls[i] = true;
		i++;
		if (s.have_stats)
			values[i] = Int32GetDatum(s.stats.spec_max_batch);
		else
			nulls[i] = true;
		i++;
	}
	Assert(i == GEMMA_STATS_COLS);
	tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	return (Datum) 0;
}

/* One row per KV group of the pool; none while no engine reports. */
Datum
gemma_kv_pool(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	G4Snapshot	s;
	int			g;

	take_snapshot(&s);
	InitMaterializedSRF(fcinfo, 0);
	if (!s.have_stats)
		return (Datum) 0;
	for (g = 0; g < s.stats.n_groups; g++)
	{
		const G4WireKvGroup *kg = &s.stats.groups[g];
		Datum		values[GEMMA_KV_POOL_COLS];
		bool		nulls[GEMMA_KV_POOL_COLS];
		int			i = 0;

		memset(nulls, 0, sizeof(nulls));
		values[i++] = CStringGetTextDatum(s.stats.device);
		values[i++] = CStringGetTextDatum(s.stats.kv_dtype);
		values[i++] = CStringGetTextDatum(kg->name);
		values[i++] = Int32GetDatum(kg->layers);
		values[i++] = Int32GetDatum(kg->block_tokens);
		values[i++] = Int64GetDatum(kg->blocks_total);
		values[i++] = Int64GetDatum(kg->blocks_used);
		values[i++] = Int64GetDatum(kg->blocks_total - kg->blocks_used);
		values[i++] = Int64GetDatum((int64) (kg->blocks_total * kg->block_bytes));
		values[i++] = Int64GetDatum((int64) (kg->blocks_used * kg->block_bytes));
		values[i++] = Int32GetDatum(s.stats.live_seqs);
		values[i++] = Int64GetDatum(s.stats.fit_full_context);
		/* prefix caching, since the engine started */
		values[i++] = Int64GetDatum(kg->blocks_cached);
		values[i++] = Int64GetDatum((int64) kg->prefix_lookups);
		values[i++] = Int64GetDatum((int64) kg->prefix_hits);
		if (kg->prefix_lookups > 0)
			values[i] = Float8GetDatum((double) kg->prefix_hits / (double) kg->prefix_lookups);
		else
			nulls[i] = true;
		i++;
		Assert(i == GEMMA_KV_POOL_COLS);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	return (Datum) 0;
}

/* One row per use of the device's memory, as the engine last reported. */
Datum
gemma_memory(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	G4Snapshot	s;

	take_snapshot(&s);
	InitMaterializedSRF(fcinfo, 0);
	if (!s.have_stats)
		return (Datum) 0;
	for (int k = 0; k < s.stats.n_memory; k++)
	{
		Datum		values[3];
		bool		nulls[3] = {false, false, false};

		values[0] = CStringGetTextDatum(s.stats.device);
		values[1] = CStringGetTextDatum(s.stats.memory[k].what);
		values[2] = Int64GetDatum((int64) s.stats.memory[k].bytes);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	return (Datum) 0;
}

static const char *
kind_name(int32 kind)
{
	switch ((G4RequestKind) kind)
	{
		case G4_KIND_CHAT:
			return "chat";
		case G4_KIND_TEXT:
			return "complete";
		case G4_KIND_TOKENIZE:
			return "tokenize";
		case G4_KIND_DETOKENIZE:
			return "detokenize";
	}
	return "unknown";
}

static const char *
seq_state_name(int32 state)
{
	switch (state)
	{
		case G4_SEQ_WAITING:
			return "queued";
		case G4_SEQ_PREFILL:
			return "prefill";
		case G4_SEQ_DECODE:
			return "decode";
	}
	return "unknown";
}

/*
 * One row per request holding a slot.  A request the engine has not
 * admitted yet is "queued"; one the engine finished whose reply a slow
 * reader has not taken yet is "finished".
 */
Datum
gemma_requests(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	G4Slot	   *slots;
	G4WireSeq  *seqs;
	int			n_slots;
	int			n_seqs;
	int			i;

	g4_require_shared();
	InitMaterializedSRF(fcinfo, 0);
	n_slots = g4_shared->n_slots;
	slots = palloc(sizeof(G4Slot) * n_slots);
	seqs = palloc(sizeof(G4WireSeq) * n_slots);
	LWLockAcquire(g4_shared->lock, LW_SHARED);
	memcpy(slots, g4_shared->slots, sizeof(G4Slot) * n_slots);
	n_seqs = g4_shared->n_seqs;
	memcpy(seqs, g4_shared->seqs, sizeof(G4WireSeq) * n_seqs);
	LWLockRelease(g4_shared->lock);

	for (i = 0; i < n_slots; i++)
	{
		const G4Slot *sl = &slots[i];
		const G4WireSeq *sq = NULL;
		Datum		values[GEMMA_REQUESTS_COLS];
		bool		nulls[GEMMA_REQUESTS_COLS];
		int			c = 0;
		int			k;

		if (sl->state == G4_SLOT_FREE)
			continue;
		for (k = 0; k < n_seqs; k++)
			if (seqs[k].request_id == sl->request_id)
				sq = &seqs[k];
		memset(nulls, 0, sizeof(nulls));
		values[c++] = Int32GetDatum(sl->pid);
		values[c++] = Int64GetDatum((int64) sl->request_id);
		values[c++] = CStringGetTextDatum(kind_name(sl->kind));
		values[c++] = CStringGetTextDatum(sq ? seq_state_name(sq->state) :
										  sl->finished ? "finished" : "queued");
		if (sq)
		{
			values[c++] = Int32GetDatum(sq->prompt_tokens);
			values[c++] = Int32GetDatum(sq->generated_tokens);
			values[c++] = Int32GetDatum(sq->kv_blocks);
		}
		else
		{
			nulls[c++] = true;
			nulls[c++] = true;
			nulls[c++] = true;
		}
		values[c++] = TimestampTzGetDatum(sl->submitted_at);
		if (sq && sq->ttft >= 0)
		{
			Interval   *iv = palloc0(sizeof(Interval));

			iv->time = (TimeOffset) (sq->ttft * USECS_PER_SEC);
			values[c] = IntervalPGetDatum(iv);
		}
		else
			nulls[c] = true;
		c++;
		if (sq && sq->tokens_per_second >= 0)
			values[c] = Float8GetDatum(sq->tokens_per_second);
		else
			nulls[c] = true;
		c++;
		/* media */
		if (sq)
			values[c] = Int32GetDatum(sq->media_tokens);
		else
			nulls[c] = true;
		c++;
		Assert(c == GEMMA_REQUESTS_COLS);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	return (Datum) 0;
}

/*
 * gemma_wait_ready(timeout_ms int DEFAULT 60000): true once the model is
 * ready, false when loading failed or the time ran out.  Interruptible.
 */
Datum
gemma_wait_ready(PG_FUNCTION_ARGS)
{
	int32		timeout_ms = PG_GETARG_INT32(0);
	TimestampTz deadline;

	g4_require_shared();
	if (timeout_ms < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("timeout_ms must not be negative")));
	deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), timeout_ms);
	for (;;)
	{
		G4WorkerState state;

		LWLockAcquire(g4_shared->lock, LW_SHARED);
		state = g4_shared->state;
		LWLockRelease(g4_shared->lock);
		if (state == G4W_READY)
			PG_RETURN_BOOL(true);
		if (state == G4W_FAILED || GetCurrentTimestamp() >= deadline)
			PG_RETURN_BOOL(false);
		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 50L, PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
		CHECK_FOR_INTERRUPTS();
	}
}
