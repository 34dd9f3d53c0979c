/*-------------------------------------------------------------------------
 *
 * job_worker.c
 *	  The worker of a table job: claims rows from the job's queue, keeps
 *	  many requests in flight, and writes each answer in a small
 *	  transaction.
 *
 * A job worker is a dynamic background worker connected to the job's
 * database as the job's owner, so the owner's privileges and row-level
 * security apply to every row it reads and writes.  It appears in
 * pg_stat_activity with backend_type "gemma4 job worker" and
 * application_name "gemma4 job <id>", and its requests in gemma_requests
 * under its pid.
 *
 * The queue (gemma_job_queue) holds the keys of the rows still to answer.
 * A worker claims a chunk (FOR UPDATE SKIP LOCKED, marking the rows with
 * its worker number) and commits the claim, evaluates the prompt of each
 * row (and its images and audio, when the job has them), and submits the
 * requests through the asynchronous side of queue.c,
 * keeping up to max_in_flight of them running so the engine has a full
 * batch (no more than its role may still start under
 * gemma4.max_requests_per_role: while some of its requests run it never
 * waits for a slot, see submit_rows).  Whenever answers arrive it writes
 * them, in one transaction per wakeup and a subtransaction per row:
 *
 *	- the queue entry is deleted and the target set only where the row's
 *	  prompt and media still are the ones that were answered (and the row
 *	  still matches the condition): an answer to a prompt or media that
 *	  changed meanwhile is dropped and the row queued again;
 *	- a row that fails (bad input such as a corrupt image, too long for the
 *	  window, a write that violates a constraint) goes to gemma_job_errors
 *	  with its SQLSTATE and the job goes on; a transient failure (the engine restarting, no free
 *	  request slot) puts the row back with a delay, at most
 *	  JOB_MAX_ATTEMPTS times.
 *
 * Nothing is lost or done twice: an answer and the deletion of its queue
 * entry commit together.  A worker that dies leaves its claims behind; the
 * next worker with its number (there is one at a time: it holds a session
 * lock on (job, number)) releases them when it starts.
 *
 * IDENTIFICATION
 *	  src/pg/job_worker.c
 *
 *-------------------------------------------------------------------------
 */
#include "gemma4.h"
#include "job.h"

#include "access/xact.h"
#include "catalog/pg_type.h"
#include "engine.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "storage/ipc.h"
#include "storage/lmgr.h"
#include "storage/lock.h"
#include "tcop/tcopprot.h"
#include "utils/guc.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"
#include "utils/wait_event.h"

/* A row's transient failures before it is recorded as failed. */
#define JOB_MAX_ATTEMPTS	5
/* How often the job's state is read (pause, cancel) and an idle queue polled. */
#define JOB_CHECK_MS		1000
/* The lock tag's last field: advisory locks taken from SQL use 1 and 2. */
#define JOB_LOCK_FIELD4		71
/* A job's media expressions: images, then audio (gemma_generate's order). */
#define JOB_MEDIA			2

/* One claimed row and its request. */
typedef struct JobRow
{
	bool		used;
	char	   *key;
	char	   *prompt;
	/* the row's media as read (detoasted copies); written only where the
	 * row still has these */
	Datum		media[JOB_MEDIA];
	bool		media_null[JOB_MEDIA];
	int			attempts;		/* transient failures so far */
	MemoryContext cxt;			/* holds the request; deleting it cancels it */
	G4Request  *request;		/* NULL until submitted */
	StringInfoData answer;		/* UTF-8 content received so far */
	G4WireRequest req;			/* built while claiming, sent after commit */
	StringInfoData items;
	/* the outcome, once finished */
	bool		finished;
	bool		ok;
	int			prompt_tokens;
	int			completion_tokens;
	bool		transient;
	char		sqlstate[6];
	char	   *message;
} JobRow;

typedef struct Job
{
	int64		id;
	int			index;			/* this worker's number */
	bool		completion;
	char	   *system;
	Jsonb	   *options;
	Oid			media_type[JOB_MEDIA];	/* bytea or bytea[] */
	int			max_in_flight;
	JobRow	   *rows;
	int			in_flight;		/* rows used */
	MemoryContext cxt;			/* lives as long as the worker */
	SPIPlanPtr	claim;
	SPIPlanPtr	fetch;
	SPIPlanPtr	take;
	SPIPlanPtr	write;
	SPIPlanPtr	exists;
	SPIPlanPtr	lock;
	SPIPlanPtr	present;
	SPIPlanPtr	requeue;
	SPIPlanPtr	release;
	SPIPlanPtr	error;
	SPIPlanPtr	counters;
	SPIPlanPtr	reset;
	SPIPlanPtr	state;
	SPIPlanPtr	hold;
	SPIPlanPtr	finish;
} Job;

static void begin_tx(void);
static void commit_tx(void);
static SPIPlanPtr plan(const char *sql, int nargs, Oid *argtypes);
static bool take_worker_lock(int64 job, int index);
static void hand_over(Job *job, Oid database, Oid owner);
static bool load_job(Job *job, Oid owner);
static void run_job(Job *job);
static bool job_running(Job *job);
static bool engine_ready(int *window);
static int	claim_places(Job *job);
static void claim_rows(Job *job, int window, int places);
static void build_row(Job *job, JobRow *row, HeapTuple tuple, TupleDesc desc, int window);
static ArrayType *media_array(Datum value, Oid type);
static void submit_rows(Job *job);
static bool submit_row(JobRow *row, bool others_running);
static bool row_waits(const JobRow *row);
static void poll_rows(Job *job);
static void write_outcomes(Job *job);
static bool write_row(Job *job, JobRow *row, int64 *counts);
static bool write_outcome(Job *job, JobRow *row, int64 *counts);
static void fail_row(JobRow *row, const char *sqlstate, const char *message, bool transient);
static void free_row(Job *job, JobRow *row);
static void release_all(Job *job);
static bool transient_sqlstate(const char *sqlstate);
static Datum text_datum(const char *s);

void
gemma4_job_worker_main(Datum arg)
{
	G4JobWorkerArgs args;
	Job			job;
	MemoryContext cxt;

	memcpy(&args, MyBgworkerEntry->bgw_extra, sizeof(args));
	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();
	BackgroundWorkerInitializeConnectionByOid(args.database, args.owner, 0);

	cxt = AllocSetContextCreate(TopMemoryContext, "gemma4 job", ALLOCSET_DEFAULT_SIZES);
	MemoryContextSwitchTo(cxt);
	memset(&job, 0, sizeof(job));
	job.id = DatumGetInt64(arg);
	job.index = args.index;
	job.cxt = cxt;
	/* the setting, not only the activity entry: the job's enqueue trigger
	 * tells the worker's own writes by it */
	SetConfigOption("application_name", psprintf("gemma4 job " INT64_FORMAT, job.id), PGC_USERSET, PGC_S_SESSION);

	if (!take_worker_lock(job.id, job.index))
		proc_exit(0);

	PG_TRY();
	{
		if (load_job(&job, args.owner))
			run_job(&job);
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		/* the job fails with the error; gemma_job_resume starts it again */
		HOLD_INTERRUPTS();
		MemoryContextSwitchTo(cxt);
		edata = CopyErrorData();
		EmitErrorReport();
		AbortOutOfAnyTransaction();
		FlushErrorState();
		RESUME_INTERRUPTS();
		begin_tx();
		{
			Oid			types[2] = {INT8OID, TEXTOID};
			Datum		v[2] = {Int64GetDatum(job.id), text_datum(edata->message)};

			SPI_execute_with_args(psprintf("UPDATE %s SET state = 'failed', finished_at = now(), "
										   "last_error = $2 WHERE id = $1 AND state = 'running'",
										   g4_job_table("gemma_job")),
								  2, types, v, NULL, false, 0);
		}
		commit_tx();
	}
	PG_END_TRY();
	hand_over(&job, args.database, args.owner);
	proc_exit(0);
}

/*
 * Leaving: a gemma_job_resume that committed while this worker was on its
 * way out (it had read the job paused, or had seen a pause) started a
 * worker of this number, which found the lock taken and gave up.  So the
 * lock is let go first, then the job read afresh: still running (and
 * still this owner's), it gets a new worker of this number.  That one, or
 * any other that takes the lock first, runs it; the rest give up.
 */
static void
hand_over(Job *job, Oid database, Oid owner)
{
	LOCKTAG		tag;
	Oid			types[2] = {INT8OID, OIDOID};
	Datum		v[2] = {Int64GetDatum(job->id), ObjectIdGetDatum(owner)};
	bool		running;

	g4_job_worker_lock_tag(&tag, job->id, job->index);
	LockRelease(&tag, ExclusiveLock, true);
	begin_tx();
	if (SPI_execute_with_args(psprintf("SELECT FROM %s WHERE id = $1 AND state = 'running' AND owner = $2",
									   g4_job_table("gemma_job")),
							  2, types, v, NULL, true, 1) != SPI_OK_SELECT)
		elog(ERROR, "could not read gemma job " INT64_FORMAT, job->id);
	running = SPI_processed > 0;
	commit_tx();
	if (running)
		g4_register_job_worker(job->id, database, owner, job->index);
}

static void
begin_tx(void)
{
	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	SPI_connect();
	PushActiveSnapshot(GetTransactionSnapshot());
	pgstat_report_activity(STATE_RUNNING, "gemma4 table job");
}

static void
commit_tx(void)
{
	PopActiveSnapshot();
	SPI_finish();
	CommitTransactionCommand();
	pgstat_report_activity(STATE_IDLE, NULL);
}

/* A plan kept for the life of the worker. */
static SPIPlanPtr
plan(const char *sql, int nargs, Oid *argtypes)
{
	SPIPlanPtr	p = SPI_prepare(sql, nargs, argtypes);

	if (p == NULL)
		elog(ERROR, "could not prepare \"%s\": %s", sql, SPI_result_code_string(SPI_result));
	SPI_keepplan(p);
	return p;
}

/*
 * One worker per (job, number): a session lock held until the worker
 * exits.  A second worker started for the same number (the starter after a
 * crash while one was being started) gives up.
 */
static bool
take_worker_lock(int64 job, int index)
{
	LOCKTAG		tag;
	LockAcquireResult res;

	StartTransactionCommand();
	g4_job_worker_lock_tag(&tag, job, index);
	res = LockAcquire(&tag, ExclusiveLock, true, true);
	CommitTransactionCommand();
	return res != LOCKACQUIRE_NOT_AVAIL;
}

void
g4_job_worker_lock_tag(LOCKTAG *tag, int64 job, int index)
{
	SET_LOCKTAG_ADVISORY(*tag, MyDatabaseId, (uint32) (job >> 32), (uint32) job, JOB_LOCK_FIELD4 + index);
}

/*
 * Read the job, check it runs as its owner and is running, prepare the
 * statements and release the claims a previous worker with this number
 * left behind.  False when there is nothing to do.
 */
static bool
load_job(Job *job, Oid owner)
{
	Oid			a_job[1] = {INT8OID};
	Datum		v[2];
	HeapTuple	t;
	TupleDesc	d;
	bool		isnull;
	bool		runnable;
	char	   *jt;
	char	   *qt;
	char	   *et;
	char	   *rel;
	char	   *key;
	char	   *keytype;
	char	   *target;
	char	   *prompt;
	char	   *cond;
	char	   *media[JOB_MEDIA];
	Oid			relid;
	int			workers;
	MemoryContext old;

	begin_tx();
	jt = g4_job_table("gemma_job");
	qt = g4_job_table("gemma_job_queue");
	et = g4_job_table("gemma_job_errors");
	v[0] = Int64GetDatum(job->id);
	if (SPI_execute_with_args(psprintf("SELECT owner, relid, key_column, target_column, prompt, "
									   "coalesce(condition, 'true'), system, options, workers, "
									   "state = 'running', completion, search_path, "
									   "coalesce(images, 'NULL::bytea'), coalesce(audio, 'NULL::bytea') "
									   "FROM %s WHERE id = $1", jt),
							  1, a_job, v, NULL, true, 1) != SPI_OK_SELECT)
		elog(ERROR, "could not read gemma job " INT64_FORMAT, job->id);
	if (SPI_processed == 0)
	{
		commit_tx();
		return false;
	}
	t = SPI_tuptable->vals[0];
	d = SPI_tuptable->tupdesc;
	runnable = DatumGetBool(SPI_getbinval(t, d, 10, &isnull));
	if (DatumGetObjectId(SPI_getbinval(t, d, 1, &isnull)) != owner || GetUserId() != owner || !runnable)
	{
		commit_tx();
		return false;
	}
	/* the owner may still use the model: a member of gemma_user (it may
	 * have left the role since, or the row may predate its grants) */
	{
		Oid			users = get_role_oid("gemma_user", true);

		if (!superuser_arg(owner) && !(OidIsValid(users) && has_privs_of_role(owner, users)))
		{
			char	   *name = GetUserNameFromId(owner, false);

			ereport(ERROR,
					(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
					 errmsg("the owner of gemma job " INT64_FORMAT ", %s, may not use the model", job->id, name),
					 errhint("GRANT gemma_user TO %s, then resume the job.", quote_identifier(name))));
		}
	}

	old = MemoryContextSwitchTo(job->cxt);
	relid = DatumGetObjectId(SPI_getbinval(t, d, 2, &isnull));
	key = SPI_getvalue(t, d, 3);
	target = SPI_getvalue(t, d, 4);
	prompt = SPI_getvalue(t, d, 5);
	cond = SPI_getvalue(t, d, 6);
	job->system = SPI_getvalue(t, d, 7);
	job->options = DatumGetJsonbPCopy(SPI_getbinval(t, d, 8, &isnull));
	workers = DatumGetInt32(SPI_getbinval(t, d, 9, &isnull));
	job->completion = DatumGetBool(SPI_getbinval(t, d, 11, &isnull));
	/* no media: a NULL, compared with the NULL sent (always equal) */
	media[0] = SPI_getvalue(t, d, 13);
	media[1] = SPI_getvalue(t, d, 14);
	MemoryContextSwitchTo(old);

	/* the expressions mean what they meant to the job's creator */
	{
		Oid			a_path[1] = {TEXTOID};
		Datum		path[1] = {SPI_getbinval(t, d, 12, &isnull)};

		if (SPI_execute_with_args("SELECT pg_catalog.set_config('search_path', $1, false)",
								  1, a_path, path, NULL, false, 0) != SPI_OK_SELECT)
			elog(ERROR, "could not set the search_path of gemma job " INT64_FORMAT, job->id);
	}

	if (get_rel_name(relid) == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_TABLE),
				 errmsg("the table of gemma job " INT64_FORMAT " no longer exists", job->id)));
	rel = quote_qualified_identifier(get_namespace_name(get_rel_namespace(relid)), get_rel_name(relid));
	if (get_attnum(relid, key) == InvalidAttrNumber)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_COLUMN),
				 errmsg("the key column \"%s\" of gemma job " INT64_FORMAT " no longer exists", key, job->id)));
	keytype = format_type_be(get_atttype(relid, get_attnum(relid, key)));
	key = (char *) quote_identifier(key);
	target = (char *) quote_identifier(target);

	/*
	 * Enough requests in flight to fill the engine's batch with some to
	 * spare (a finished sequence is replaced at the next step), shared by
	 * the job's workers, and leaving half the request slots to sessions.
	 */
	job->max_in_flight = Max(1, Min(g4_max_num_seqs + g4_max_num_seqs / 2, g4_max_requests / 2) / workers);
	job->rows = MemoryContextAllocZero(job->cxt, sizeof(JobRow) * job->max_in_flight);

	{
		Oid			a_claim[3] = {INT8OID, INT4OID, INT4OID};
		Oid			a_keys[1] = {TEXTARRAYOID};
		Oid			a_take[3] = {INT8OID, TEXTOID, INT4OID};
		Oid			a_write[3 + JOB_MEDIA] = {TEXTOID, TEXTOID, TEXTOID};
		Oid			a_key[1] = {TEXTOID};
		Oid			a_requeue[2] = {INT8OID, TEXTOID};
		Oid			a_release[5] = {INT8OID, TEXTOID, INT4OID, INT4OID, FLOAT8OID};
		Oid			a_error[5] = {INT8OID, TEXTOID, TEXTOID, TEXTOID, INT4OID};
		Oid			a_counters[6] = {INT8OID, INT8OID, INT8OID, INT8OID, INT8OID, TEXTOID};
		Oid			a_reset[2] = {INT8OID, INT4OID};

		/* ARRAY(): an init plan, run once (a join could rescan the LIMIT) */
		job->claim = plan(psprintf("UPDATE %s SET claimed_by = $2 WHERE job_id = $1 AND claimed_by IS NULL "
								   "AND key = ANY (ARRAY(SELECT key FROM %s WHERE job_id = $1 "
								   "AND claimed_by IS NULL AND retry_at <= now() "
								   "LIMIT $3 FOR UPDATE SKIP LOCKED)) RETURNING key, attempts",
								   qt, qt), 3, a_claim);
		/* keys as text by their type's output function, as the queue
		 * holds them (gemma_job_create, the enqueue trigger) */
		job->fetch = plan(psprintf("SELECT pg_catalog.format('%%s', %s), (%s)::text, (%s), (%s) FROM %s "
								   "WHERE %s = ANY ($1::%s[]) AND (%s)",
								   key, prompt, media[0], media[1], rel, key, keytype, cond), 1, a_keys);
		/* the media's types, from a fetch of no rows (checked when the job
		 * was created, but a column's type may have changed since) */
		v[0] = PointerGetDatum(construct_empty_array(TEXTOID));
		if (SPI_execute_plan(job->fetch, v, NULL, true, 0) != SPI_OK_SELECT)
			elog(ERROR, "could not read the rows of gemma job " INT64_FORMAT, job->id);
		for (int m = 0; m < JOB_MEDIA; m++)
		{
			job->media_type[m] = SPI_gettypeid(SPI_tuptable->tupdesc, 3 + m);
			if (job->media_type[m] != BYTEAOID && job->media_type[m] != BYTEAARRAYOID)
				ereport(ERROR,
						(errcode(ERRCODE_DATATYPE_MISMATCH),
						 errmsg("the %s expression of gemma job " INT64_FORMAT " is of type %s, not bytea or bytea[]",
								m == 0 ? "images" : "audio", job->id, format_type_be(job->media_type[m]))));
			a_write[3 + m] = job->media_type[m];
		}
		job->take = plan(psprintf("DELETE FROM %s WHERE job_id = $1 AND key = $2 AND claimed_by = $3",
								  qt), 3, a_take);
		job->write = plan(psprintf("UPDATE %s SET %s = $2 WHERE %s = $1::%s AND (%s)::text = $3 "
								   "AND (%s) IS NOT DISTINCT FROM $4 AND (%s) IS NOT DISTINCT FROM $5 AND (%s)",
								   rel, target, key, keytype, prompt, media[0], media[1], cond),
						  3 + JOB_MEDIA, a_write);
		job->exists = plan(psprintf("SELECT FROM %s WHERE %s = $1::%s AND (%s)",
									rel, key, keytype, cond), 1, a_key);
		job->lock = plan(psprintf("SELECT FROM %s WHERE %s = $1::%s FOR UPDATE SKIP LOCKED",
								  rel, key, keytype), 1, a_key);
		job->present = plan(psprintf("SELECT FROM %s WHERE %s = $1::%s", rel, key, keytype), 1, a_key);
		job->requeue = plan(psprintf("INSERT INTO %s (job_id, key) VALUES ($1, $2) ON CONFLICT DO NOTHING",
									 qt), 2, a_requeue);
		job->release = plan(psprintf("UPDATE %s SET claimed_by = NULL, attempts = $4, "
									 "retry_at = now() + make_interval(secs => $5) "
									 "WHERE job_id = $1 AND key = $2 AND claimed_by = $3", qt),
							5, a_release);
		job->error = plan(psprintf("INSERT INTO %s (job_id, row_key, sqlstate, message, attempts) "
								   "VALUES ($1, $2, $3, $4, $5)", et), 5, a_error);
		job->counters = plan(psprintf("UPDATE %s SET rows_done = rows_done + $2, "
									  "rows_failed = rows_failed + $3, tokens_in = tokens_in + $4, "
									  "tokens_out = tokens_out + $5, last_error = coalesce($6, last_error) "
									  "WHERE id = $1", jt), 6, a_counters);
		job->reset = plan(psprintf("UPDATE %s SET claimed_by = NULL WHERE job_id = $1 AND claimed_by = $2",
								   qt), 2, a_reset);
		job->state = plan(psprintf("SELECT state FROM %s WHERE id = $1", jt), 1, a_job);
		job->hold = plan(psprintf("SELECT FROM %s WHERE id = $1 FOR NO KEY UPDATE", jt), 1, a_job);
		job->finish = plan(psprintf("UPDATE %s SET state = 'done', finished_at = now() "
									"WHERE id = $1 AND state = 'running' AND NOT follow "
									"AND NOT EXISTS (SELECT FROM %s WHERE job_id = $1)", jt, qt),
						   1, a_job);
	}

	v[0] = Int64GetDatum(job->id);
	v[1] = Int32GetDatum(job->index);
	SPI_execute_plan(job->reset, v, NULL, false, 0);
	commit_tx();
	return true;
}

/* The main loop: until the job is done, paused, cancelled or failed. */
static void
run_job(Job *job)
{
	TimestampTz next_check = 0;
	TimestampTz next_claim = 0;

	for (;;)
	{
		TimestampTz now;
		int			window;
		int			places;
		long		wait_ms = JOB_CHECK_MS;
		int			i;

		CHECK_FOR_INTERRUPTS();
		now = GetCurrentTimestamp();
		if (now >= next_check)
		{
			if (!job_running(job))
			{
				release_all(job);
				return;
			}
			next_check = TimestampTzPlusMilliseconds(now, JOB_CHECK_MS);
		}

		/* claim when a quarter of the requests are free, or none run */
		if (now >= next_claim && engine_ready(&window) &&
			(job->in_flight == 0 || job->max_in_flight - job->in_flight >= Max(1, job->max_in_flight / 4)) &&
			(places = claim_places(job)) > 0)
		{
			int			before = job->in_flight;

			claim_rows(job, window, places);
			submit_rows(job);
			if (job->in_flight == before)
			{
				/* the queue had nothing for us: done, or look again later */
				if (job->in_flight == 0)
				{
					Datum		v[1] = {Int64GetDatum(job->id)};
					bool		done;

					begin_tx();
					SPI_execute_plan(job->finish, v, NULL, false, 0);
					done = SPI_processed > 0;
					commit_tx();
					if (done)
						return;
				}
				next_claim = TimestampTzPlusMilliseconds(now, JOB_CHECK_MS);
			}
		}

		poll_rows(job);
		/* rows that found no slot: the requests just finished freed some */
		submit_rows(job);
		write_outcomes(job);

		for (i = 0; i < job->max_in_flight; i++)
			if (job->rows[i].used && job->rows[i].request)
				wait_ms = Min(wait_ms, g4_request_wait_ms(job->rows[i].request));
		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 wait_ms, PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
	}
}

static bool
job_running(Job *job)
{
	Datum		v[1] = {Int64GetDatum(job->id)};
	bool		running = false;	/* also when the job was deleted */

	begin_tx();
	SPI_execute_plan(job->state, v, NULL, true, 1);
	if (SPI_processed > 0)
	{
		char	   *state = SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1);

		running = strcmp(state, "running") == 0;
		pfree(state);
	}
	commit_tx();
	return running;
}

/* Is the model ready (so a claim is not spent on a restarting engine)? */
static bool
engine_ready(int *window)
{
	bool		ready;

	LWLockAcquire(g4_shared->lock, LW_SHARED);
	ready = g4_shared->state == G4W_READY;
	*window = g4_shared->model.max_model_len;
	LWLockRelease(g4_shared->lock);
	return ready;
}

/*
 * How many rows to claim now: the free request places, but no more than the
 * worker's role may still start under gemma4.max_requests_per_role (its
 * running requests count against it, as do other sessions' of the role),
 * less the rows already claimed that wait for a slot.  One when nothing is
 * in flight: its request waits in the queue like any other.
 */
static int
claim_places(Job *job)
{
	int			places = job->max_in_flight - job->in_flight;
	int			waiting = 0;
	int			i;

	if (job->in_flight == 0)
		return Max(1, Min(places, g4_role_slots_left()));
	for (i = 0; i < job->max_in_flight; i++)
		waiting += row_waits(&job->rows[i]);
	return Min(places, g4_role_slots_left() - waiting);
}

/* A row claimed, built, and not started yet (it waits for a slot). */
static bool
row_waits(const JobRow *row)
{
	return row->used && !row->finished && !row->request && row->prompt != NULL;
}

/*
 * Claim up to places rows and build their requests, in one
 * transaction: the claim commits before any request starts, so a worker
 * that dies leaves claims its successor releases, never half a claim.
 * Rows gone from the table, or no longer matching the condition, leave the
 * queue.
 */
static void
claim_rows(Job *job, int window, int places)
{
	Datum		v[3];
	uint64		n;
	uint64		i;
	Datum	   *keys;
	SPITupleTable *claimed;
	int			free_places = Min(places, job->max_in_flight - job->in_flight);

	begin_tx();
	v[0] = Int64GetDatum(job->id);
	v[1] = Int32GetDatum(job->index);
	v[2] = Int32GetDatum(free_places);
	if (SPI_execute_plan(job->claim, v, NULL, false, 0) != SPI_OK_UPDATE_RETURNING)
		elog(ERROR, "could not claim rows of gemma job " INT64_FORMAT, job->id);
	n = SPI_processed;
	if (n == 0)
	{
		commit_tx();
		return;
	}
	claimed = SPI_tuptable;
	keys = palloc(sizeof(Datum) * n);
	for (i = 0; i < n; i++)
	{
		JobRow	   *row = NULL;
		bool		isnull;
		int			j;

		for (j = 0; j < job->max_in_flight && row == NULL; j++)
			if (!job->rows[j].used)
				row = &job->rows[j];
		if (row == NULL)
			elog(ERROR, "gemma job " INT64_FORMAT " claimed more rows than it has places for", job->id);
		memset(row, 0, sizeof(JobRow));
		row->used = true;
		row->cxt = AllocSetContextCreate(job->cxt, "gemma4 job row", ALLOCSET_SMALL_SIZES);
		row->key = MemoryContextStrdup(row->cxt, SPI_getvalue(claimed->vals[i], claimed->tupdesc, 1));
		row->attempts = DatumGetInt32(SPI_getbinval(claimed->vals[i], claimed->tupdesc, 2, &isnull));
		job->in_flight++;
		keys[i] = text_datum(row->key);
	}

	/* the prompts, evaluated as the job's owner */
	v[0] = PointerGetDatum(construct_array(keys, (int) n, TEXTOID, -1, false, TYPALIGN_INT));
	if (SPI_execute_plan(job->fetch, v, NULL, true, 0) != SPI_OK_SELECT)
		elog(ERROR, "could not read the rows of gemma job " INT64_FORMAT, job->id);
	for (i = 0; i < SPI_processed; i++)
	{
		char	   *key = SPI_getvalue(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 1);
		int			j;

		for (j = 0; j < job->max_in_flight; j++)
		{
			JobRow	   *row = &job->rows[j];

			if (!row->used || row->finished || row->prompt || row->request || strcmp(row->key, key) != 0)
				continue;
			build_row(job, row, SPI_tuptable->vals[i], SPI_tuptable->tupdesc, window);
			break;
		}
	}

	/* claimed rows that the query did not return left the table or the condition */
	for (i = 0; i < (uint64) job->max_in_flight; i++)
	{
		JobRow	   *row = &job->rows[i];

		if (row->used && !row->finished && row->prompt == NULL && row->request == NULL)
		{
			Datum		t[3] = {Int64GetDatum(job->id), text_datum(row->key), Int32GetDatum(job->index)};

			SPI_execute_plan(job->take, t, NULL, false, 0);
			free_row(job, row);
		}
	}
	commit_tx();
}

/*
 * Build a claimed row's request from what the fetch read: its prompt, and
 * its images and audio.  A row whose request cannot be built (its prompt
 * too long, a NULL element in its media array) fails alone.  Building is
 * computation on values already read (detoasted here, before the error
 * handler): it takes no lock and touches no buffer, so its error is caught
 * without a subtransaction.
 */
static void
build_row(Job *job, JobRow *row, HeapTuple tuple, TupleDesc desc, int window)
{
	MemoryContext old = MemoryContextSwitchTo(row->cxt);
	char	   *prompt = SPI_getvalue(tuple, desc, 2);
	ArrayType  *arrays[JOB_MEDIA] = {NULL, NULL};

	if (prompt == NULL || prompt[0] == '\0')
	{
		fail_row(row, "22004", "the prompt of this row is null or empty", false);
		MemoryContextSwitchTo(old);
		return;
	}
	row->prompt = prompt;
	for (int m = 0; m < JOB_MEDIA; m++)
	{
		Datum		value = SPI_getbinval(tuple, desc, 3 + m, &row->media_null[m]);

		if (row->media_null[m])
			continue;
		row->media[m] = PointerGetDatum(PG_DETOAST_DATUM_COPY(value));
		arrays[m] = media_array(row->media[m], job->media_type[m]);
	}
	PG_TRY();
	{
		g4_build_job_request(&row->req, &row->items, job->completion, job->system, prompt,
							 arrays[0], arrays[1], job->options, window);
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		MemoryContextSwitchTo(row->cxt);
		edata = CopyErrorData();
		FlushErrorState();
		row->prompt = NULL;		/* not built: nothing to submit */
		fail_row(row, unpack_sql_state(edata->sqlerrcode), edata->message, false);
	}
	PG_END_TRY();
	/* the request holds its own copy; a bytea[] made of one bytea is a third */
	for (int m = 0; m < JOB_MEDIA; m++)
		if (arrays[m] && job->media_type[m] == BYTEAOID)
			pfree(arrays[m]);
	MemoryContextSwitchTo(old);
}

/* A row's media value (bytea or bytea[]) as the bytea[] a request takes. */
static ArrayType *
media_array(Datum value, Oid type)
{
	if (type == BYTEAOID)
		return construct_array(&value, 1, BYTEAOID, -1, false, TYPALIGN_INT);
	return DatumGetArrayTypeP(value);
}

/*
 * Start the requests of the rows claimed and not started yet (outside any
 * transaction).  While some of its requests run, the worker does not wait
 * for a slot: those requests free theirs only once polled, which this loop
 * does, and other sessions' may not free any within gemma4.queue_timeout.
 * A row that finds no slot at once waits, claimed, for a later round; so
 * do the rows after it, and after a row that failed to start, so that at
 * most one waits in the queue per round.
 */
static void
submit_rows(Job *job)
{
	int			running = 0;
	int			i;

	for (i = 0; i < job->max_in_flight; i++)
		if (job->rows[i].used && !job->rows[i].finished && job->rows[i].request)
			running++;
	for (i = 0; i < job->max_in_flight; i++)
	{
		JobRow	   *row = &job->rows[i];

		if (row_waits(row))
		{
			if (!submit_row(row, running > 0))
				break;
			running++;
		}
	}
}

/*
 * Start one row's request; false when it did not start.  With requests of
 * the worker running, a row that finds no slot at once is left to wait;
 * with none, its request waits in the queue, and no slot within
 * gemma4.queue_timeout, or the engine going away, is a transient failure
 * of the row.
 */
static bool
submit_row(JobRow *row, bool others_running)
{
	MemoryContext old = MemoryContextSwitchTo(row->cxt);

	if (row->answer.data == NULL)
		initStringInfo(&row->answer);
	PG_TRY();
	{
		if (others_running)
			row->request = g4_request_try_start(&row->req, row->items.data, row->items.len);
		else
			row->request = g4_request_start(&row->req, row->items.data, row->items.len);
		if (row->request)
		{
			/* the request's segment has the items now (media can be large) */
			pfree(row->items.data);
			row->items.data = NULL;
		}
	}
	PG_CATCH();
	{
		ErrorData  *edata;
		char	   *state;

		MemoryContextSwitchTo(row->cxt);
		edata = CopyErrorData();
		/* a cancel is the job's, not the row's: the job fails with it */
		if (edata->sqlerrcode == ERRCODE_QUERY_CANCELED)
			PG_RE_THROW();
		FlushErrorState();
		state = pstrdup(unpack_sql_state(edata->sqlerrcode));
		fail_row(row, state, edata->message, transient_sqlstate(state));
	}
	PG_END_TRY();
	MemoryContextSwitchTo(old);
	return row->request != NULL;
}

/* Read what arrived for every request; note the ones that ended. */
static void
poll_rows(Job *job)
{
	int			i;

	for (i = 0; i < job->max_in_flight; i++)
	{
		JobRow	   *row = &job->rows[i];
		bool		more = true;

		if (!row->used || row->finished || row->request == NULL)
			continue;
		while (more)
		{
			char		kind;
			const char *data;
			Size		len;

			switch (g4_request_poll(row->request, &kind, &data, &len))
			{
				case G4_POLL_MESSAGE:
					if (kind == G4_MQ_CONTENT)
						appendBinaryStringInfo(&row->answer, data, (int) len);
					break;
				case G4_POLL_DONE:
					row->finished = true;
					row->ok = true;
					row->prompt_tokens = row->request->hdr->prompt_tokens;
					row->completion_tokens = row->request->hdr->completion_tokens;
					g4_request_finish(row->request);
					more = false;
					break;
				case G4_POLL_FAILED:
					{
						G4WireError *e = &row->request->failure;
						int			code = e->code;

						/* transient: what a retry may cure; not a NaN from
						 * the model (G4_ERR_NUMERIC), which the same prompt
						 * gives again */
						fail_row(row, unpack_sql_state(g4_sqlstate_for(code)), e->msg,
								 code == G4_ERR_PG_ENGINE_DIED || code == G4_ERR_PG_NOT_READY ||
								 code == G4_ERR_PG_SHUTDOWN || code == G4_ERR_BUSY ||
								 code == G4_ERR_NOMEM);
						g4_request_finish(row->request);
						more = false;
					}
					break;
				case G4_POLL_NOTHING:
					more = false;
					break;
			}
		}
	}
}

/* Record a row's failure as its outcome. */
static void
fail_row(JobRow *row, const char *sqlstate, const char *message, bool transient)
{
	row->finished = true;
	row->ok = false;
	row->transient = transient;
	strlcpy(row->sqlstate, sqlstate, sizeof(row->sqlstate));
	row->message = MemoryContextStrdup(row->cxt, message ? message : "unknown error");
}

/* Write every finished row's outcome, in one transaction. */
static void
write_outcomes(Job *job)
{
	int64		counts[4] = {0, 0, 0, 0};	/* done, failed, tokens in, out */
	char	   *last_error = NULL;
	bool		any = false;
	int			i;

	for (i = 0; i < job->max_in_flight; i++)
		any |= job->rows[i].used && job->rows[i].finished;
	if (!any)
		return;

	begin_tx();

	/*
	 * The job's row first, as gemma_job_cancel takes it before it deletes
	 * the queue: locked after the queue entries (by the counters' update at
	 * the end), the two deadlock.  A cancel that commits first leaves no
	 * entry to take, so nothing is written for the cancelled job.
	 */
	{
		Datum		v[1] = {Int64GetDatum(job->id)};

		if (SPI_execute_plan(job->hold, v, NULL, false, 1) != SPI_OK_SELECT)
			elog(ERROR, "could not lock gemma job " INT64_FORMAT, job->id);
	}
	for (i = 0; i < job->max_in_flight; i++)
	{
		JobRow	   *row = &job->rows[i];

		if (!row->used || !row->finished)
			continue;
		if (!write_row(job, row, counts))
			continue;			/* its row is locked: next time */
		if (!row->ok && !row->transient)
			last_error = psprintf("row %s: %s", row->key, row->message);
		free_row(job, row);
	}
	{
		Datum		v[6] = {Int64GetDatum(job->id), Int64GetDatum(counts[0]), Int64GetDatum(counts[1]),
		Int64GetDatum(counts[2]), Int64GetDatum(counts[3]), (Datum) 0};
		char		nulls[6] = {' ', ' ', ' ', ' ', ' ', last_error ? ' ' : 'n'};

		if (last_error)
			v[5] = text_datum(last_error);
		SPI_execute_plan(job->counters, v, nulls, false, 0);
	}
	commit_tx();
}

/*
 * Write one row's outcome in a subtransaction: a row whose write fails (a
 * constraint, a policy) fails alone, recorded in the errors table.  False
 * when the row is locked by another transaction and must wait.
 */
static bool
write_row(Job *job, JobRow *row, int64 *counts)
{
	MemoryContext old = CurrentMemoryContext;
	ResourceOwner owner = CurrentResourceOwner;
	volatile bool written = true;

	BeginInternalSubTransaction(NULL);
	MemoryContextSwitchTo(old);
	PG_TRY();
	{
		written = write_outcome(job, row, counts);
		ReleaseCurrentSubTransaction();
		MemoryContextSwitchTo(old);
		CurrentResourceOwner = owner;
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		MemoryContextSwitchTo(old);
		edata = CopyErrorData();
		FlushErrorState();
		RollbackAndReleaseCurrentSubTransaction();
		MemoryContextSwitchTo(old);
		CurrentResourceOwner = owner;
		fail_row(row, unpack_sql_state(edata->sqlerrcode), edata->message, false);
		written = write_outcome(job, row, counts);
	}
	PG_END_TRY();
	return written;
}

/*
 * One row's outcome: the answer where the row's prompt is still the one
 * answered, a retry for a transient failure, an error row otherwise.
 *
 * The worker never waits for a lock on a row of the table: it writes many
 * rows per transaction, and a statement of another session that changes
 * several rows (and queues them through the job's trigger, waiting for this
 * transaction's queue entries) would otherwise deadlock with it.  A row
 * locked by another transaction is left for the next write (false).
 */
static bool
write_outcome(Job *job, JobRow *row, int64 *counts)
{
	Datum		k[3] = {Int64GetDatum(job->id), text_datum(row->key), Int32GetDatum(job->index)};

	/* only a request that ran counts as an attempt (not one refused a slot) */
	int			attempts = row->request ? row->attempts + 1 : row->attempts;

	if (!row->ok && row->transient && attempts < JOB_MAX_ATTEMPTS)
	{
		Datum		v[5] = {k[0], k[1], k[2], Int32GetDatum(attempts),
		Float8GetDatum((double) Max(attempts, 1))};

		SPI_execute_plan(job->release, v, NULL, false, 0);
		return true;
	}

	if (row->ok)
	{
		SPI_execute_plan(job->lock, &k[1], NULL, false, 1);
		if (SPI_processed == 0)
		{
			SPI_execute_plan(job->present, &k[1], NULL, true, 1);
			if (SPI_processed > 0)
				return false;
		}
	}

	/* not ours any more (the job was cancelled): nothing to write */
	SPI_execute_plan(job->take, k, NULL, false, 0);
	if (SPI_processed == 0)
		return true;

	if (row->ok)
	{
		text	   *answer = g4_answer_text(row->answer.data, row->answer.len);
		Datum		w[3 + JOB_MEDIA] = {k[1], PointerGetDatum(answer), text_datum(row->prompt),
		row->media[0], row->media[1]};
		char		nulls[3 + JOB_MEDIA] = {' ', ' ', ' ', row->media_null[0] ? 'n' : ' ',
		row->media_null[1] ? 'n' : ' '};

		SPI_execute_plan(job->write, w, nulls, false, 0);
		if (SPI_processed > 0)
		{
			counts[0]++;
			counts[2] += row->prompt_tokens;
			counts[3] += row->completion_tokens;
			return true;
		}
		/* the prompt changed while it was answered: queue the row again */
		SPI_execute_plan(job->exists, &k[1], NULL, true, 1);
		if (SPI_processed > 0)
			SPI_execute_plan(job->requeue, k, NULL, false, 0);
		return true;
	}

	{
		Datum		e[5] = {k[0], k[1], text_datum(row->sqlstate), text_datum(row->message),
		Int32GetDatum(attempts)};

		SPI_execute_plan(job->error, e, NULL, false, 0);
		counts[1]++;
	}
	return true;
}

/* Forget a row; deleting its context cancels a request still running. */
static void
free_row(Job *job, JobRow *row)
{
	MemoryContextDelete(row->cxt);
	memset(row, 0, sizeof(JobRow));
	job->in_flight--;
}

/* Paused or cancelled: stop every request and give the claims back. */
static void
release_all(Job *job)
{
	Datum		v[2] = {Int64GetDatum(job->id), Int32GetDatum(job->index)};
	int			i;

	for (i = 0; i < job->max_in_flight; i++)
		if (job->rows[i].used)
			free_row(job, &job->rows[i]);
	begin_tx();
	SPI_execute_plan(job->reset, v, NULL, false, 0);
	commit_tx();
}

/* Failures that go away by themselves: retried. */
static bool
transient_sqlstate(const char *sqlstate)
{
	return strcmp(sqlstate, "55000") == 0 ||	/* the engine is not ready, or stopping */
		strcmp(sqlstate, "58000") == 0 ||	/* the engine died */
		strcmp(sqlstate, "53000") == 0;	/* every request slot is taken */
}

static Datum
text_datum(const char *s)
{
	return PointerGetDatum(cstring_to_text(s));
}
