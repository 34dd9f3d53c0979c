/*-------------------------------------------------------------------------
 *
 * job.c
 *	  Table jobs: the C side of the SQL API, and who starts job workers.
 *
 * The job API itself is SQL (gemma_job_create, _pause, _resume, _cancel and
 * the gemma_jobs view in gemma4--0.1.sql): it runs as the calling role, so
 * the checks that the role may read and update what the job uses are
 * PostgreSQL's own.  This file starts the workers that do the work
 * (job_worker.c):
 *
 *	- gemma_job_launch(job) starts a job's workers when the transaction that
 *	  created or resumed it commits (before that, they could not see it);
 *	- the supervisor, the one process that is always there, starts the job
 *	  launcher when it starts and every gemma4.job_check_interval after.
 *	  The launcher connects to no database; it lists the databases and, one
 *	  after the other, starts a short-lived starter in each, which starts
 *	  the missing workers of the jobs running there.  So the workers come
 *	  back after a server start or a crash restart (nothing remembers them),
 *	  and a worker that went away while its job runs (pg_terminate_backend,
 *	  no free worker slot) is started again.
 *
 * Job workers are never restarted by the postmaster (BGW_NEVER_RESTART): a
 * job whose worker fails with an error is marked failed (gemma_job_resume
 * starts it again), and a worker that cannot connect must not be retried
 * in a loop.  A worker holds a session lock on (job, worker number) while
 * it runs: the starter starts only workers whose lock is free, and a
 * worker started twice exits at once.
 *
 * IDENTIFICATION
 *	  src/pg/job.c
 *
 *-------------------------------------------------------------------------
 */
#include "gemma4.h"
#include "job.h"

#include <limits.h>

#include "access/genam.h"
#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/stratnum.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/pg_authid.h"
#include "catalog/pg_database.h"
#include "catalog/pg_extension.h"
#include "catalog/pg_type.h"
#include "commands/extension.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "nodes/pg_list.h"
#include "postmaster/bgworker.h"
#include "storage/ipc.h"
#include "tcop/tcopprot.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"

PG_FUNCTION_INFO_V1(gemma_job_check_options);
PG_FUNCTION_INFO_V1(gemma_job_launch);

/* A job whose workers start when the current transaction commits. */
typedef struct PendingLaunch
{
	int64		job;
	Oid			owner;
	int			workers;
	SubTransactionId subid;		/* the subtransaction that asked */
} PendingLaunch;

static List *pending_launches = NIL;	/* in TopMemoryContext */
static bool xact_callback_registered = false;

static void launch_at_commit(XactEvent event, void *arg);
static void forget_aborted_launches(SubXactEvent event, SubTransactionId mySubid, SubTransactionId parentSubid,
									void *arg);
static void register_job_workers(int64 job, Oid database, Oid owner, int workers);

char *
g4_job_table(const char *name)
{
	Relation	rel;
	ScanKeyData key;
	SysScanDesc scan;
	HeapTuple	tup;
	Oid			schema = InvalidOid;

	/* PostgreSQL 15 does not export get_extension_schema */
	rel = table_open(ExtensionRelationId, AccessShareLock);
	ScanKeyInit(&key, Anum_pg_extension_extname, BTEqualStrategyNumber, F_NAMEEQ,
				CStringGetDatum("gemma4"));
	scan = systable_beginscan(rel, ExtensionNameIndexId, true, NULL, 1, &key);
	tup = systable_getnext(scan);
	if (HeapTupleIsValid(tup))
		schema = ((Form_pg_extension) GETSTRUCT(tup))->extnamespace;
	systable_endscan(scan);
	table_close(rel, AccessShareLock);
	if (!OidIsValid(schema))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("extension \"gemma4\" is not installed in this database")));
	return quote_qualified_identifier(get_namespace_name(schema), name);
}

/*
 * gemma_job_check_options(options jsonb, system text): the options and
 * system message of a job are those of gemma_chat, checked the same way
 * before the job is created.
 */
Datum
gemma_job_check_options(PG_FUNCTION_ARGS)
{
	G4WireRequest req;
	StringInfoData items;
	char	   *system = NULL;

	if (!PG_ARGISNULL(1))
	{
		system = text_to_cstring(PG_GETARG_TEXT_PP(1));
		if (system[0] == '\0')
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("system must not be empty"),
					 errhint("Pass NULL for no system message.")));
	}
	/* the window is checked against each row's request */
	g4_build_job_request(&req, &items, false, system, "-", NULL, NULL,
						 PG_ARGISNULL(0) ? NULL : PG_GETARG_JSONB_P(0), INT_MAX);
	PG_RETURN_VOID();
}

/* Whether a role exists and may log in (as the job's workers do). */
static bool
owner_can_log_in(Oid owner)
{
	HeapTuple	t = SearchSysCache1(AUTHOID, ObjectIdGetDatum(owner));
	bool		ok;

	if (!HeapTupleIsValid(t))
		return false;
	ok = ((Form_pg_authid) GETSTRUCT(t))->rolcanlogin;
	ReleaseSysCache(t);
	return ok;
}

/*
 * gemma_job_launch(job bigint): start the job's workers when the current
 * transaction commits.  The job is read as the caller (its row-level
 * security applies): a job the caller may not see is not started.  The
 * worker checks again that it runs as the job's owner.
 */
Datum
gemma_job_launch(PG_FUNCTION_ARGS)
{
	int64		job = PG_GETARG_INT64(0);
	Oid			argtypes[1] = {INT8OID};
	Datum		values[1] = {Int64GetDatum(job)};
	PendingLaunch *p;
	bool		isnull;
	Oid			owner;
	int			workers;
	MemoryContext old;

	SPI_connect();
	if (SPI_execute_with_args(psprintf("SELECT owner, workers FROM %s WHERE id = $1 AND state = 'running'",
									   g4_job_table("gemma_job")),
							  1, argtypes, values, NULL, true, 1) != SPI_OK_SELECT)
		elog(ERROR, "could not read gemma job " INT64_FORMAT, job);
	if (SPI_processed == 0)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("gemma job " INT64_FORMAT " does not exist or is not running", job)));
	owner = DatumGetObjectId(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
	workers = DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2, &isnull));
	SPI_finish();

	/* a worker connects as the owner: one that cannot log in would die
	 * before it could mark the job failed, leaving it running with none */
	if (!owner_can_log_in(owner))
	{
		char	   *name = GetUserNameFromId(owner, false);

		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("the owner of gemma job " INT64_FORMAT ", %s, cannot log in, so no worker can run the job",
						job, name),
				 errhint("ALTER ROLE %s LOGIN, then resume the job.", quote_identifier(name))));
	}

	if (!xact_callback_registered)
	{
		RegisterXactCallback(launch_at_commit, NULL);
		RegisterSubXactCallback(forget_aborted_launches, NULL);
		xact_callback_registered = true;
	}
	old = MemoryContextSwitchTo(TopMemoryContext);
	p = palloc(sizeof(PendingLaunch));
	p->job = job;
	p->owner = owner;
	p->workers = workers;
	p->subid = GetCurrentSubTransactionId();
	pending_launches = lappend(pending_launches, p);
	MemoryContextSwitchTo(old);
	PG_RETURN_VOID();
}

/*
 * Start the workers of the jobs of a committed transaction.  A prepared
 * transaction is refused: its commit may come from another session, or
 * none, and nothing would start the workers then.
 */
static void
launch_at_commit(XactEvent event, void *arg)
{
	ListCell   *lc;

	if (event == XACT_EVENT_PRE_PREPARE && pending_launches != NIL)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("cannot PREPARE a transaction that created or resumed a gemma job")));
	if (event != XACT_EVENT_COMMIT && event != XACT_EVENT_ABORT)
		return;
	if (event == XACT_EVENT_COMMIT)
	{
		foreach(lc, pending_launches)
		{
			PendingLaunch *p = lfirst(lc);

			register_job_workers(p->job, MyDatabaseId, p->owner, p->workers);
		}
	}
	list_free_deep(pending_launches);
	pending_launches = NIL;
}

/* A rolled-back subtransaction takes its launches with it; a committed one
 * hands them to its parent. */
static void
forget_aborted_launches(SubXactEvent event, SubTransactionId mySubid, SubTransactionId parentSubid, void *arg)
{
	ListCell   *lc;

	foreach(lc, pending_launches)
	{
		PendingLaunch *p = lfirst(lc);

		if (p->subid != mySubid)
			continue;
		if (event == SUBXACT_EVENT_COMMIT_SUB)
			p->subid = parentSubid;
		else if (event == SUBXACT_EVENT_ABORT_SUB)
		{
			pending_launches = foreach_delete_current(pending_launches, lc);
			pfree(p);
		}
	}
}

/*
 * Register the job's workers.  Never raises an error (it runs at commit):
 * a worker that cannot be registered is reported, and started by the next
 * check of the running jobs (gemma4.job_check_interval).
 */
static void
register_job_workers(int64 job, Oid database, Oid owner, int workers)
{
	int			i;

	for (i = 0; i < workers; i++)
		g4_register_job_worker(job, database, owner, i);
}

void
g4_register_job_worker(int64 job, Oid database, Oid owner, int index)
{
	BackgroundWorker w;
	G4JobWorkerArgs args;

	memset(&w, 0, sizeof(w));
	w.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
	w.bgw_start_time = BgWorkerStart_RecoveryFinished;
	w.bgw_restart_time = BGW_NEVER_RESTART;
	snprintf(w.bgw_library_name, BGW_MAXLEN, "gemma4");
	snprintf(w.bgw_function_name, BGW_MAXLEN, "gemma4_job_worker_main");
	snprintf(w.bgw_name, BGW_MAXLEN, "gemma4 job " INT64_FORMAT " worker %d", job, index);
	snprintf(w.bgw_type, BGW_MAXLEN, "gemma4 job worker");
	w.bgw_main_arg = Int64GetDatum(job);
	args.database = database;
	args.owner = owner;
	args.index = index;
	memcpy(w.bgw_extra, &args, sizeof(args));
	if (!RegisterDynamicBackgroundWorker(&w, NULL))
		ereport(WARNING,
				(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
				 errmsg("could not start worker %d of gemma job " INT64_FORMAT, index, job),
				 errhint("Raise max_worker_processes: the worker is started within gemma4.job_check_interval of a slot being free.")));
}

/* Register a dynamic worker whose main function is in this library. */
static bool
register_helper(const char *function, const char *name, Datum arg, int notify_pid,
				BackgroundWorkerHandle **handle)
{
	BackgroundWorker w;

	memset(&w, 0, sizeof(w));
	w.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
	w.bgw_start_time = BgWorkerStart_RecoveryFinished;
	w.bgw_restart_time = BGW_NEVER_RESTART;
	snprintf(w.bgw_library_name, BGW_MAXLEN, "gemma4");
	snprintf(w.bgw_function_name, BGW_MAXLEN, "%s", function);
	snprintf(w.bgw_name, BGW_MAXLEN, "%s", name);
	snprintf(w.bgw_type, BGW_MAXLEN, "%s", name);
	w.bgw_main_arg = arg;
	w.bgw_notify_pid = notify_pid;
	return RegisterDynamicBackgroundWorker(&w, handle);
}

/*
 * Called by the supervisor when it starts and every gemma4.job_check_interval:
 * start the job launcher, unless the last one is still at work.
 */
void
g4_jobs_start_launcher(void)
{
	static BackgroundWorkerHandle *launcher;
	MemoryContext old;
	pid_t		pid;

	if (launcher != NULL)
	{
		if (GetBackgroundWorkerPid(launcher, &pid) != BGWH_STOPPED)
			return;
		pfree(launcher);
		launcher = NULL;
	}
	old = MemoryContextSwitchTo(TopMemoryContext);
	if (!register_helper("gemma4_job_launcher_main", "gemma4 job launcher", (Datum) 0, 0, &launcher))
	{
		launcher = NULL;
		ereport(WARNING,
				(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
				 errmsg("could not start the gemma4 job launcher: running table jobs with a missing worker wait"),
				 errhint("Raise max_worker_processes.")));
	}
	MemoryContextSwitchTo(old);
}

/*
 * The job launcher: list the databases that accept connections (templates
 * excluded) and run a starter in each, one at a time.
 */
void
gemma4_job_launcher_main(Datum arg)
{
	List	   *databases = NIL;
	ListCell   *lc;
	Relation	rel;
	TableScanDesc scan;
	HeapTuple	tup;

	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();
	/* shared catalogs only, like the logical replication launcher */
	BackgroundWorkerInitializeConnection(NULL, NULL, 0);

	StartTransactionCommand();
	(void) GetTransactionSnapshot();
	rel = table_open(DatabaseRelationId, AccessShareLock);
	scan = table_beginscan_catalog(rel, 0, NULL);
	while ((tup = heap_getnext(scan, ForwardScanDirection)) != NULL)
	{
		Form_pg_database d = (Form_pg_database) GETSTRUCT(tup);

		if (d->datallowconn && !d->datistemplate)
		{
			MemoryContext old = MemoryContextSwitchTo(TopMemoryContext);

			databases = lappend_oid(databases, d->oid);
			MemoryContextSwitchTo(old);
		}
	}
	table_endscan(scan);
	table_close(rel, AccessShareLock);
	CommitTransactionCommand();

	foreach(lc, databases)
	{
		BackgroundWorkerHandle *handle;

		CHECK_FOR_INTERRUPTS();
		if (!register_helper("gemma4_job_starter_main", "gemma4 job starter",
							 ObjectIdGetDatum(lfirst_oid(lc)), MyProcPid, &handle))
		{
			ereport(WARNING,
					(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
					 errmsg("could not start the gemma4 job starter of database %u", lfirst_oid(lc)),
					 errhint("Raise max_worker_processes.")));
			continue;
		}
		(void) WaitForBackgroundWorkerShutdown(handle);
	}
	proc_exit(0);
}

/* Whether worker `index` of a job runs in this database: it holds its lock. */
static bool
job_worker_runs(int64 job, int index)
{
	LOCKTAG		tag;

	g4_job_worker_lock_tag(&tag, job, index);
	if (LockAcquire(&tag, ExclusiveLock, true, true) == LOCKACQUIRE_NOT_AVAIL)
		return true;
	LockRelease(&tag, ExclusiveLock, true);
	return false;
}

/*
 * The starter of one database: if the extension is installed there, tidy
 * the jobs (gemma_job_tidy in the extension's script) and start the missing
 * workers of every running job (one registered but not yet holding its lock
 * is started twice, and the second exits).  It connects as the bootstrap
 * superuser (it reads every job); each worker connects as its job's owner.
 */
void
gemma4_job_starter_main(Datum arg)
{
	Oid			ext;

	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();
	BackgroundWorkerInitializeConnectionByOid(DatumGetObjectId(arg), InvalidOid, 0);

	StartTransactionCommand();
	ext = get_extension_oid("gemma4", true);
	if (OidIsValid(ext))
	{
		uint64		i;

		SPI_connect();
		PushActiveSnapshot(GetTransactionSnapshot());
		if (SPI_execute(psprintf("SELECT %s()", g4_job_table("gemma_job_tidy")), false, 0) != SPI_OK_SELECT)
			elog(ERROR, "could not tidy the gemma jobs");
		if (SPI_execute(psprintf("SELECT id, owner, workers FROM %s WHERE state = 'running' ORDER BY id",
								 g4_job_table("gemma_job")), false, 0) != SPI_OK_SELECT)
			elog(ERROR, "could not list the gemma jobs");
		for (i = 0; i < SPI_processed; i++)
		{
			HeapTuple	t = SPI_tuptable->vals[i];
			TupleDesc	d = SPI_tuptable->tupdesc;
			bool		isnull;
			int64		job = DatumGetInt64(SPI_getbinval(t, d, 1, &isnull));
			Oid			owner = DatumGetObjectId(SPI_getbinval(t, d, 2, &isnull));
			int			workers = DatumGetInt32(SPI_getbinval(t, d, 3, &isnull)),
						w;

			for (w = 0; w < workers; w++)
				if (!job_worker_runs(job, w))
					g4_register_job_worker(job, MyDatabaseId, owner, w);
		}
		PopActiveSnapshot();
		SPI_finish();
	}
	CommitTransactionCommand();
	proc_exit(0);
}
