/*-------------------------------------------------------------------------
 *
 * supervisor.c
 *	  The gemma4 background worker: a thin supervisor of the engine process.
 *
 * A background worker attached to shared memory that dies by a signal makes
 * the postmaster reset the whole cluster.  So the registered worker never
 * runs the engine: it forks an engine process (engine_proc.c) and talks to
 * it over a socketpair.  When that process dies (kill -9, a segfault, the
 * OOM killer), the supervisor sees end-of-file or SIGCHLD, fails every
 * request in flight with an error, publishes the new state and restarts the
 * engine with a backoff.  Backends and the postmaster are not involved.
 *
 * The main loop waits on its latch (set by backends when they submit or
 * give up a request, by shm_mq when a reader consumed data, by SIGCHLD) and
 * on the engine socket, then:
 *	- reads the engine's frames: text pieces and token ids are relayed into
 *	  the requests' reply queues, finishes and errors end the requests,
 *	  statistics are published in shared memory;
 *	- takes new submissions from the slots and forwards them, and turns
 *	  slots flagged by their backend into CANCEL frames;
 *	- retries replies a full queue could not take.
 *
 * It only ever sends to a reply queue without waiting; what a slow reader
 * cannot take yet is buffered per request, so one reader never stalls the
 * batch.  Nothing here waits on the engine process either: the socket is
 * non-blocking and outgoing frames are buffered too, and a dead or killed
 * process is collected with WNOHANG as the loop goes round: one stuck in
 * the kernel after SIGKILL (uninterruptible device I/O) cannot block the
 * supervisor, which fails its requests after ENGINE_EXIT_WAIT_MS and starts
 * a new engine once the old one is collected.
 *
 * IDENTIFICATION
 *	  src/pg/supervisor.c
 *
 *-------------------------------------------------------------------------
 */
#include "gemma4.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "engine.h"
#include "miscadmin.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/proc.h"
#include "storage/shm_toc.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"
#include "utils/wait_event.h"

/* Restart backoff: doubles while the engine keeps dying young. */
#define RESTART_DELAY_MIN_MS	250
#define RESTART_DELAY_MAX_MS	30000
#define STABLE_UPTIME_MS		60000
/* How long a stopping engine process gets before SIGKILL. */
#define ENGINE_STOP_WAIT_MS		5000
/*
 * How long a killed engine process gets to exit.  It takes milliseconds, a
 * CUDA context's teardown seconds; one stuck in the kernel (uninterruptible
 * device I/O) dies only when that call returns.  Past this its requests
 * fail without its exit status, and the supervisor's own exit stops waiting
 * for it.
 */
#define ENGINE_EXIT_WAIT_MS		5000
/* Socket reads per wakeup, so a chatty engine cannot starve the slots. */
#define READS_PER_WAKEUP		16

/* The supervisor's view of one slot's request. */
typedef struct SupRequest
{
	bool		active;
	bool		in_engine;		/* forwarded, and the engine has not ended it */
	bool		ended;			/* outcome known; release once flushed */
	bool		finished;		/* ended well: OK once every reply is queued */
	uint64		request_id;
	dsm_segment *seg;
	shm_mq_handle *mqh;
	G4ReqHeader *hdr;
	G4Buf		pending;		/* replies not sent yet, one frame each */
} SupRequest;

static SupRequest *requests = NULL;
static int	n_requests = 0;

/* scan_slots' work lists, n_requests entries each */
typedef struct SlotTake
{
	int			slot;
	dsm_handle	handle;
	uint64		request_id;
} SlotTake;
static SlotTake *todo_adopt = NULL;
static int *todo_cancel = NULL;

static G4EngineConfig engine_cfg;
static pid_t engine_pid = 0;
static int	engine_sock = -1;
static G4Buf engine_in;
static G4Buf engine_out;
static bool engine_ready = false;
static bool engine_load_failed = false;
static TimestampTz engine_ready_at = 0;
static char engine_fatal[G4_MSG_LEN];
/* watchdog: when the engine last sent anything, or fell idle */
static TimestampTz engine_progress_at = 0;
/* when the supervisor sent the engine process SIGKILL; 0 if it did not */
static TimestampTz engine_killed_at = 0;
/* the killed process outlived ENGINE_EXIT_WAIT_MS: its socket is closed,
 * its requests failed; it is still collected before a new one starts */
static bool engine_abandoned = false;

static bool waiting_for_reload = false;
static TimestampTz restart_at = 0;
static int	restart_delay_ms = RESTART_DELAY_MIN_MS;
/* the ready model, logged with the first statistics after it */
static G4WireReady ready_model;
static bool ready_unlogged = false;
/* when the job launcher was last started (job.c) */
static TimestampTz jobs_checked_at = 0;

static WaitEventSet *wait_set = NULL;
static int	sock_pos = -1;
static uint32 sock_events = 0;

static void handle_sigchld(SIGNAL_ARGS);
static void supervisor_exit(int code, Datum arg);
static void build_wait_set(void);
static void update_socket_events(void);
static long next_timeout(void);
static void start_engine(void);
static bool prepare_config(void);
static void schedule_restart(const char *why);
static void stop_engine(void);
static bool wait_engine_exit(int timeout_ms);
static void kill_engine(G4WorkerState state, const char *reason);
static void reap_engine(void);
static void abandon_engine(void);
static void engine_exited(int status);
static int	end_engine_requests(const char *how);
static void close_engine_socket(void);
static void read_engine(void);
static bool handle_frame(uint32 type, const char *body, size_t len);
static void write_engine(void);
static void send_cancel(SupRequest *q);
static void scan_slots(void);
static void adopt_request(int i, dsm_handle handle, uint64 request_id);
static SupRequest *find_request(uint64 request_id);
static void reply(SupRequest *q, char kind, const void *data, size_t len);
static void flush_replies(SupRequest *q);
static void end_ok(SupRequest *q, const G4WireFinish *f);
static void end_error(SupRequest *q, int code, const char *msg);
static void cancel_request(SupRequest *q);
static void release_request(SupRequest *q);
static void free_slot(int i, uint64 request_id);
static void publish_stats(const G4WireStats *st, const char *seqs, int n);
static void log_ready(const G4WireReady *r, const G4WireStats *st);
static void fold_engine_stats(void);
static void bump(uint64 *counter);
static void watch_engine(void);

void
gemma4_supervisor_main(Datum arg)
{
	int			i;

	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, SignalHandlerForShutdownRequest);
	pqsignal(SIGCHLD, handle_sigchld);
	BackgroundWorkerUnblockSignals();

	n_requests = g4_shared->n_slots;
	requests = MemoryContextAllocZero(TopMemoryContext, sizeof(SupRequest) * n_requests);
	todo_adopt = MemoryContextAlloc(TopMemoryContext, sizeof(SlotTake) * n_requests);
	todo_cancel = MemoryContextAlloc(TopMemoryContext, sizeof(int) * n_requests);
	before_shmem_exit(supervisor_exit, (Datum) 0);

	/*
	 * Requests left in slots by a previous incarnation are orphans: their
	 * reply queues detached when it exited, and their backends notice the
	 * new generation.  Free the slots.
	 */
	LWLockAcquire(g4_shared->lock, LW_EXCLUSIVE);
	g4_shared->supervisor_pid = MyProcPid;
	g4_shared->supervisor_latch = MyLatch;
	g4_shared->supervisor_generation++;
	g4_shared->engine_pid = 0;
	fold_engine_stats();
	for (i = 0; i < g4_shared->n_slots; i++)
		memset(&g4_shared->slots[i], 0, sizeof(G4Slot));
	LWLockRelease(g4_shared->lock);
	g4_set_state(G4W_STARTING, NULL, NULL);

	build_wait_set();
	start_engine();
	/* table jobs left running resume, and go on resuming (job.c) */
	g4_jobs_start_launcher();
	jobs_checked_at = GetCurrentTimestamp();

	while (!ShutdownRequestPending)
	{
		WaitEvent	events[4];

		(void) WaitEventSetWait(wait_set, next_timeout(), events, lengthof(events),
								PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
		CHECK_FOR_INTERRUPTS();
		if (ShutdownRequestPending)
			break;

		/* a reload retries a model that failed to load */
		if (ConfigReloadPending)
		{
			ConfigReloadPending = false;
			ProcessConfigFile(PGC_SIGHUP);
			if (waiting_for_reload && engine_pid == 0)
			{
				ereport(LOG, (errmsg("gemma4 supervisor retrying to load the model")));
				start_engine();
			}
		}

		if (engine_sock >= 0)
			read_engine();
		if (engine_pid != 0)
			reap_engine();
		scan_slots();
		for (i = 0; i < n_requests; i++)
			if (requests[i].active &&
				(requests[i].ended || g4buf_pending(&requests[i].pending) > 0))
				flush_replies(&requests[i]);
		write_engine();
		watch_engine();
		if (restart_at != 0 && engine_pid == 0 && GetCurrentTimestamp() >= restart_at)
		{
			restart_at = 0;
			start_engine();
		}
		{
			TimestampTz now = GetCurrentTimestamp();

			if (TimestampDifferenceExceeds(jobs_checked_at, now, g4_job_check_interval * 1000))
			{
				g4_jobs_start_launcher();
				jobs_checked_at = now;
			}
		}
		update_socket_events();
	}

	/*
	 * Shutting down: every request gets an answer, then the engine stops.  A
	 * finished request keeps its answer only if the rest of its replies fit
	 * in its queue now; one whose reader is behind fails like one still
	 * running, as a partial answer must not read as a complete one.
	 */
	for (i = 0; i < n_requests; i++)
	{
		SupRequest *q = &requests[i];

		if (q->active && q->ended)
			flush_replies(q);	/* releases it when everything went out */
		if (q->active)
		{
			end_error(q, G4_ERR_PG_SHUTDOWN, "the gemma4 worker is shutting down");
			release_request(q);
		}
	}
	stop_engine();

	/*
	 * Exit status 1 makes the postmaster start the supervisor again after
	 * bgw_restart_time when it was sent SIGTERM on its own; during a server
	 * shutdown nothing is restarted.
	 */
	proc_exit(1);
}

static void
handle_sigchld(SIGNAL_ARGS)
{
	int			save_errno = errno;

	SetLatch(MyLatch);
	errno = save_errno;
}

/*
 * before_shmem_exit callback, also run when the supervisor fails with an
 * error: the engine process must not outlive it (it would also die of
 * PR_SET_PDEATHSIG), and backends must see it is gone.  The wait for it is
 * bounded: one stuck in the kernel must not hold up the supervisor's exit
 * (and the server's shutdown).  Killed already, it ends when that call
 * returns, and init collects it; a new supervisor's engine may meanwhile
 * find less device memory free.
 */
static void
supervisor_exit(int code, Datum arg)
{
	/* an error may have left the lock held */
	LWLockReleaseAll();
	if (engine_pid > 0)
	{
		(void) kill(engine_pid, SIGKILL);
		(void) wait_engine_exit(ENGINE_EXIT_WAIT_MS);
		engine_pid = 0;
	}
	LWLockAcquire(g4_shared->lock, LW_EXCLUSIVE);
	g4_shared->supervisor_pid = 0;
	g4_shared->supervisor_latch = NULL;
	g4_shared->engine_pid = 0;
	fold_engine_stats();
	LWLockRelease(g4_shared->lock);
	g4_set_state(G4W_STOPPED,
				 code == 0 ? "The gemma4 supervisor stopped." : "The gemma4 supervisor exited.",
				 NULL);
}

/* The latch, postmaster death and, when an engine runs, its socket. */
static void
build_wait_set(void)
{
	if (wait_set)
		FreeWaitEventSet(wait_set);
	wait_set = CreateWaitEventSet(TopMemoryContext, 3);
	AddWaitEventToSet(wait_set, WL_LATCH_SET, PGINVALID_SOCKET, MyLatch, NULL);
	AddWaitEventToSet(wait_set, WL_EXIT_ON_PM_DEATH, PGINVALID_SOCKET, NULL, NULL);
	sock_pos = -1;
	sock_events = 0;
	if (engine_sock >= 0)
	{
		sock_events = WL_SOCKET_READABLE;
		sock_pos = AddWaitEventToSet(wait_set, sock_events, engine_sock, NULL, NULL);
	}
}

/* Wait for the socket to be writable only while frames are waiting. */
static void
update_socket_events(void)
{
	uint32		want;

	if (sock_pos < 0)
		return;
	want = WL_SOCKET_READABLE | (g4buf_pending(&engine_out) > 0 ? WL_SOCKET_WRITEABLE : 0);
	if (want != sock_events)
	{
		ModifyWaitEvent(wait_set, sock_pos, want, NULL);
		sock_events = want;
	}
}

/* At most a second, so the loop also reaps a child whose SIGCHLD was missed. */
static long
next_timeout(void)
{
	long		secs;
	int			usecs;

	if (restart_at == 0)
		return 1000;
	TimestampDifference(GetCurrentTimestamp(), restart_at, &secs, &usecs);
	return Min(1000, secs * 1000 + usecs / 1000);
}

/* Fork the engine process, or publish why it cannot be started. */
static void
start_engine(void)
{
	int			sv[2];
	pid_t		pid;

	waiting_for_reload = false;
	if (!prepare_config())
	{
		waiting_for_reload = true;
		return;
	}
	if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0)
	{
		ereport(LOG,
				(errcode_for_socket_access(),
				 errmsg("could not create a socket pair for the gemma4 engine process: %m")));
		schedule_restart("Could not create a socket pair for the engine process");
		return;
	}
	/* what stdio buffered must not be written twice */
	fflush(NULL);
	pid = fork();
	if (pid < 0)
	{
		ereport(LOG,
				(errmsg("could not fork the gemma4 engine process: %m")));
		close(sv[0]);
		close(sv[1]);
		schedule_restart("Could not fork the engine process");
		return;
	}
	if (pid == 0)
	{
		close(sv[0]);
		g4_engine_proc_main(sv[1], &engine_cfg);
	}
	close(sv[1]);
	if (!pg_set_noblock(sv[0]))
		ereport(ERROR,
				(errcode_for_socket_access(),
				 errmsg("could not make the gemma4 engine socket non-blocking: %m")));

	engine_pid = pid;
	engine_sock = sv[0];
	engine_ready = false;
	ready_unlogged = false;
	engine_killed_at = 0;
	engine_abandoned = false;
	engine_load_failed = false;
	engine_fatal[0] = '\0';
	LWLockAcquire(g4_shared->lock, LW_EXCLUSIVE);
	g4_shared->engine_pid = pid;
	LWLockRelease(g4_shared->lock);
	g4_set_state(G4W_LOADING, NULL, NULL);
	ereport(LOG,
			(errmsg("gemma4 engine process started with PID %d, loading \"%s\"",
					(int) pid, engine_cfg.model_path)));
	build_wait_set();
}

/*
 * Everything the engine process needs, copied before fork() so that the
 * child reads plain memory only.  Fails (with the state published) when no
 * model is configured and the default one is not installed.
 */
static bool
prepare_config(void)
{
	G4EngineConfig *c = &engine_cfg;

	memset(c, 0, sizeof(*c));
	snprintf(c->library, sizeof(c->library), "%s/libgemma4engine.so", pkglib_path);
	if (g4_model_dir[0] != '\0')
		strlcpy(c->model_path, g4_model_dir, sizeof(c->model_path));
	else
	{
		char		share[MAXPGPATH];

		get_share_path(my_exec_path, share);
		snprintf(c->model_path, sizeof(c->model_path), "%s/gemma4/default-model.gguf", share);
		if (access(c->model_path, R_OK) != 0)
		{
			char		reason[G4_REASON_LEN];

			snprintf(reason, sizeof(reason),
					 "gemma4.model_dir is not set and no default model is installed at \"%s\".",
					 c->model_path);
			g4_set_state(G4W_FAILED, reason,
						 "Set gemma4.model_dir in postgresql.conf to a model directory or a .gguf file and restart the server, or install the default model at that path and run SELECT pg_reload_conf().");
			ereport(LOG,
					(errmsg("gemma4 has no model to load"),
					 errdetail("%s", reason)));
			return false;
		}
	}
	strlcpy(c->draft_model_path, g4_draft_model_dir, sizeof(c->draft_model_path));
	c->backend = g4_backend;
	c->threads = g4_cpu_threads;
	c->prepare_threads = g4_prepare_threads;
	c->max_model_len = g4_max_model_len;
	c->gpu_memory_utilization = g4_gpu_memory_utilization;
	c->kv_dtype = g4_kv_cache_dtype;
	c->max_num_seqs = g4_max_num_seqs;
	c->max_num_batched_tokens = g4_max_num_batched_tokens;
	c->num_speculative_tokens = g4_num_speculative_tokens;
	c->speculative_max_batch = g4_speculative_max_batch;
	c->max_requests = n_requests;
	c->supervisor_pid = MyProcPid;
	c->enable_prefix_caching = g4_enable_prefix_caching;

	LWLockAcquire(g4_shared->lock, LW_EXCLUSIVE);
	strlcpy(g4_shared->model_path, c->model_path, MAXPGPATH);
	LWLockRelease(g4_shared->lock);
	return true;
}

/*
 * Start the engine again later.  The delay doubles while engines die within
 * STABLE_UPTIME_MS of becoming ready, and starts over after a stable run.
 * why is a sentence without its final period.
 */
static void
schedule_restart(const char *why)
{
	char		reason[G4_REASON_LEN];
	TimestampTz now = GetCurrentTimestamp();

	if (engine_ready_at != 0 && !TimestampDifferenceExceeds(engine_ready_at, now, STABLE_UPTIME_MS))
		restart_delay_ms = Min(restart_delay_ms * 2, RESTART_DELAY_MAX_MS);
	else
		restart_delay_ms = RESTART_DELAY_MIN_MS;
	restart_at = TimestampTzPlusMilliseconds(now, restart_delay_ms);
	snprintf(reason, sizeof(reason), "%s; it restarts in %d ms.", why, restart_delay_ms);
	g4_set_state(G4W_RESTARTING, reason, NULL);
	ereport(LOG,
			(errmsg("gemma4 engine process restarts in %d ms", restart_delay_ms),
			 errdetail("%s", reason)));
}

/*
 * Stop the engine process on shutdown: EOF first, SIGKILL if it lingers
 * (at once if it was killed already).  Like supervisor_exit, this waits a
 * bounded time for a process stuck in the kernel.
 */
static void
stop_engine(void)
{
	if (engine_pid == 0)
		return;
	close_engine_socket();
	if (engine_killed_at != 0 || !wait_engine_exit(ENGINE_STOP_WAIT_MS))
	{
		(void) kill(engine_pid, SIGKILL);
		if (!wait_engine_exit(ENGINE_EXIT_WAIT_MS))
			ereport(LOG,
					(errmsg("gemma4 engine process %d has not exited %d ms after SIGKILL; the supervisor stops without it",
							(int) engine_pid, ENGINE_EXIT_WAIT_MS)));
	}
	engine_pid = 0;
}

/* Poll for the engine process's exit up to timeout_ms; true once collected. */
static bool
wait_engine_exit(int timeout_ms)
{
	int			waited = 0;

	for (;;)
	{
		pid_t		rc = waitpid(engine_pid, NULL, WNOHANG);

		if (rc == engine_pid || (rc < 0 && errno == ECHILD))
			return true;
		if (waited >= timeout_ms)
			return false;
		pg_usleep(10000L);
		waited += 10;
	}
}

/*
 * SIGKILL the engine process: hung (the watchdog), or going away (end of
 * file, a broken or corrupt stream).  It takes no more requests, and the
 * state says so when it was serving; reap_engine collects it once it has
 * exited, nothing waits for it here.
 */
static void
kill_engine(G4WorkerState state, const char *reason)
{
	(void) kill(engine_pid, SIGKILL);
	if (engine_killed_at != 0)
		return;
	engine_killed_at = GetCurrentTimestamp();
	if (engine_ready)
		g4_set_state(state, reason, NULL);
}

/*
 * Collect the engine process if it exited, without waiting: SIGCHLD sets the
 * latch and the loop wakes at least every second.  A killed one that has not
 * exited within ENGINE_EXIT_WAIT_MS is given up on.
 */
static void
reap_engine(void)
{
	int			status;
	pid_t		rc = waitpid(engine_pid, &status, WNOHANG);

	if (rc == engine_pid)
		engine_exited(status);
	else if (rc < 0 && errno != EINTR)
		ereport(ERROR,
				(errmsg("could not wait for the gemma4 engine process: %m")));
	else if (engine_killed_at != 0 && !engine_abandoned &&
			 TimestampDifferenceExceeds(engine_killed_at, GetCurrentTimestamp(), ENGINE_EXIT_WAIT_MS))
		abandon_engine();
}

/*
 * The killed engine process is stuck in the kernel.  Its requests fail now
 * rather than when it exits; it is still collected, and only then does a
 * new one start, so that two never hold the device.
 */
static void
abandon_engine(void)
{
	char		how[128];
	char		reason[G4_REASON_LEN];
	int			failed;

	snprintf(how, sizeof(how), "did not exit within %d ms of SIGKILL", ENGINE_EXIT_WAIT_MS);
	failed = end_engine_requests(how);
	engine_abandoned = true;
	snprintf(reason, sizeof(reason),
			 "The engine process (PID %d) was killed but has not exited%s%s; a new one starts once it has.",
			 (int) engine_pid, engine_fatal[0] ? " after: " : "", engine_fatal);
	g4_set_state(G4W_RESTARTING, reason, NULL);
	ereport(LOG,
			(errmsg("gemma4 engine process %d %s; waiting for it to exit", (int) engine_pid, how),
			 errdetail("%d request%s in flight failed.", failed, failed == 1 ? "" : "s")));
}

/*
 * The engine process is gone: its requests fail (unless that was done when
 * it was given up on), and a new one is scheduled.
 */
static void
engine_exited(int status)
{
	char		how[128];
	char		why[G4_REASON_LEN];
	int			failed = 0;
	bool		was_ready = engine_ready;
	bool		was_abandoned = engine_abandoned;

	if (WIFEXITED(status))
		snprintf(how, sizeof(how), "exited with exit code %d", WEXITSTATUS(status));
	else if (WIFSIGNALED(status))
		snprintf(how, sizeof(how), "was terminated by signal %d: %s",
				 WTERMSIG(status), pg_strsignal(WTERMSIG(status)));
	else
		snprintf(how, sizeof(how), "ended with status %d", status);

	if (!was_abandoned)
		failed = end_engine_requests(how);
	engine_pid = 0;
	engine_killed_at = 0;
	engine_abandoned = false;

	LWLockAcquire(g4_shared->lock, LW_EXCLUSIVE);
	g4_shared->engine_pid = 0;
	if (was_ready && !ShutdownRequestPending)
		g4_shared->engine_restarts++;
	LWLockRelease(g4_shared->lock);

	engine_ready = false;
	if (ShutdownRequestPending)
	{
		/* nothing to restart */
	}
	else if (engine_load_failed)
		waiting_for_reload = true;	/* state already says why */
	else if (!was_ready)
	{
		snprintf(why, sizeof(why), "The engine process %s while loading the model%s%s.", how,
				 engine_fatal[0] ? ": " : "", engine_fatal);
		g4_set_state(G4W_FAILED, why,
					 "See the server log; fix the model or the gemma4 settings and restart the server, or run SELECT pg_reload_conf() to retry.");
		ereport(LOG,
				(errmsg("gemma4 engine process could not load the model"),
				 errdetail("%s", why)));
		waiting_for_reload = true;
	}
	else
	{
		snprintf(why, sizeof(why), "the gemma4 engine process %s%s%s", how,
				 engine_fatal[0] ? " after: " : "", engine_fatal);
		if (was_abandoned)
			ereport(LOG,
					(errmsg("%s", why),
					 errdetail("Its requests in flight failed when it did not exit in time.")));
		else
			ereport(LOG,
					(errmsg("%s", why),
					 errdetail("%d request%s in flight failed.", failed, failed == 1 ? "" : "s")));
		snprintf(why, sizeof(why), "The engine process %s%s%s", how,
				 engine_fatal[0] ? " after: " : "", engine_fatal);
		schedule_restart(why);
	}
}

/*
 * The engine process is gone, or given up on.  What it wrote is still
 * handled (requests that finished just before keep their answers); its
 * socket is closed and every other request in flight fails, the error
 * saying how the process ended.  Returns how many failed.
 */
static int
end_engine_requests(const char *how)
{
	char		why[G4_REASON_LEN];
	int			failed = 0;
	int			i;

	if (engine_sock >= 0)
	{
		/* drain what is there: a process that is gone ends it with EOF */
		for (;;)
		{
			ssize_t		n = g4p_read(engine_sock, &engine_in);
			uint32		type;
			const char *body;
			size_t		len;

			if (n <= 0)
				break;
			while (g4p_next_frame(&engine_in, &type, &body, &len) > 0)
				if (!handle_frame(type, body, len))
					break;
		}
		close_engine_socket();
	}

	/* the error of the requests in flight: a primary message */
	snprintf(why, sizeof(why), "the gemma4 engine process %s%s%s", how,
			 engine_fatal[0] ? " after: " : "", engine_fatal);
	for (i = 0; i < n_requests; i++)
	{
		SupRequest *q = &requests[i];

		if (q->active && !q->ended)
		{
			q->in_engine = false;
			end_error(q, G4_ERR_PG_ENGINE_DIED, why);
			failed++;
		}
	}

	LWLockAcquire(g4_shared->lock, LW_EXCLUSIVE);
	fold_engine_stats();
	LWLockRelease(g4_shared->lock);
	return failed;
}

/* Stop talking to the engine process: it is gone or going. */
static void
close_engine_socket(void)
{
	if (engine_sock < 0)
		return;
	close(engine_sock);
	engine_sock = -1;
	g4buf_free(&engine_in);
	g4buf_free(&engine_out);
	build_wait_set();
}

/* Read and handle what the engine sent; a dead or broken engine is collected. */
static void
read_engine(void)
{
	int			reads;

	for (reads = 0; reads < READS_PER_WAKEUP; reads++)
	{
		ssize_t		n = g4p_read(engine_sock, &engine_in);
		uint32		type;
		const char *body;
		size_t		len;
		int			rc;

		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			return;
		if (n > 0)
			engine_progress_at = GetCurrentTimestamp();
		if (n < 0 && errno == ENOMEM)
			ereport(ERROR,
					(errcode(ERRCODE_OUT_OF_MEMORY),
					 errmsg("out of memory reading from the gemma4 engine process")));
		if (n <= 0)
		{
			/*
			 * End of file (or a broken socket): the process is going away.
			 * Closing the socket stops the wakeups; its requests fail when
			 * reap_engine collects it, the error naming how it ended.
			 */
			if (n < 0)
				ereport(LOG,
						(errmsg("could not read from the gemma4 engine process: %m")));
			kill_engine(G4W_RESTARTING, "The engine process ended; a new one starts once it has been collected.");
			close_engine_socket();
			return;
		}
		while ((rc = g4p_next_frame(&engine_in, &type, &body, &len)) > 0)
		{
			if (!handle_frame(type, body, len))
			{
				rc = -1;
				break;
			}
		}
		if (rc < 0)
		{
			/* a corrupt stream: stop the process, the EOF path follows */
			ereport(LOG,
					(errmsg("gemma4 engine process sent a malformed message; stopping it")));
			kill_engine(G4W_RESTARTING, "The engine process sent a malformed message; a new one starts once it has been collected.");
			return;
		}
	}
}

/* Act on one frame from the engine; false when it is malformed. */
static bool
handle_frame(uint32 type, const char *body, size_t len)
{
	switch ((G4FrameType) type)
	{
		case G4F_READY:
			{
				G4WireReady r;

				if (len != sizeof(r))
					return false;
				memcpy(&r, body, sizeof(r));
				r.architecture[sizeof(r.architecture) - 1] = '\0';
				r.family[sizeof(r.family) - 1] = '\0';
				r.version[sizeof(r.version) - 1] = '\0';
				LWLockAcquire(g4_shared->lock, LW_EXCLUSIVE);
				g4_shared->model = r;
				LWLockRelease(g4_shared->lock);
				engine_ready = true;
				engine_ready_at = GetCurrentTimestamp();
				g4_set_state(G4W_READY, NULL, NULL);
				/* logged with the memory budget of the statistics that
				 * follow at once */
				ready_model = r;
				ready_unlogged = true;
				return true;
			}
		case G4F_LOAD_FAILED:
		case G4F_FATAL:
			{
				G4WireError e;
				char		reason[G4_REASON_LEN];

				if (len != sizeof(e))
					return false;
				memcpy(&e, body, sizeof(e));
				e.msg[sizeof(e.msg) - 1] = '\0';
				if (type == G4F_FATAL)
				{
					strlcpy(engine_fatal, e.msg, sizeof(engine_fatal));
					ereport(LOG, (errmsg("gemma4 engine failed: %s", e.msg)));
					return true;
				}
				engine_load_failed = true;
				snprintf(reason, sizeof(reason), "Loading the model failed: %s.", e.msg);
				g4_set_state(G4W_FAILED, reason,
							 "Check gemma4.model_dir and the other gemma4 settings, then restart the server, or run SELECT pg_reload_conf() to retry loading.");
				ereport(LOG,
						(errmsg("gemma4 engine process could not load the model"),
						 errdetail("%s", reason)));
				return true;
			}
		case G4F_TEXT:
			{
				G4WireText t;
				SupRequest *q;

				if (len < sizeof(t))
					return false;
				memcpy(&t, body, sizeof(t));
				q = find_request(t.request_id);
				if (q)
					reply(q, t.channel == G4_CHANNEL_REASONING ? G4_MQ_REASONING : G4_MQ_CONTENT,
						  body + sizeof(t), len - sizeof(t));
				return true;
			}
		case G4F_IDS:
			{
				uint64		id;
				SupRequest *q;

				if (len < sizeof(id) || (len - sizeof(id)) % sizeof(int32) != 0)
					return false;
				memcpy(&id, body, sizeof(id));
				q = find_request(id);
				if (q)
					reply(q, G4_MQ_IDS, body + sizeof(id), len - sizeof(id));
				return true;
			}
		case G4F_FINISH:
			{
				G4WireFinish f;
				SupRequest *q;

				if (len != sizeof(f))
					return false;
				memcpy(&f, body, sizeof(f));
				q = find_request(f.request_id);
				if (q)
					end_ok(q, &f);
				return true;
			}
		case G4F_ERROR:
			{
				G4WireError e;
				SupRequest *q;

				if (len != sizeof(e))
					return false;
				memcpy(&e, body, sizeof(e));
				e.msg[sizeof(e.msg) - 1] = '\0';
				q = find_request(e.request_id);
				if (q)
				{
					q->in_engine = false;
					end_error(q, e.code, e.msg);
				}
				return true;
			}
		case G4F_STATS:
			{
				G4WireStats st;

				if (len < sizeof(st))
					return false;
				memcpy(&st, body, sizeof(st));
				if (st.n_seqs < 0 || st.n_seqs > n_requests ||
					len != sizeof(st) + (size_t) st.n_seqs * sizeof(G4WireSeq))
					return false;
				/* the views index and print these: an engine that lost
				 * its way must not take a backend down with it */
				if (st.n_groups < 0 || st.n_groups > (int32) lengthof(st.groups) ||
					st.n_memory < 0 || st.n_memory > (int32) lengthof(st.memory))
					return false;
				st.backend[sizeof(st.backend) - 1] = '\0';
				st.device[sizeof(st.device) - 1] = '\0';
				st.kv_dtype[sizeof(st.kv_dtype) - 1] = '\0';
				for (int g = 0; g < st.n_groups; g++)
					st.groups[g].name[sizeof(st.groups[g].name) - 1] = '\0';
				for (int k = 0; k < st.n_memory; k++)
					st.memory[k].what[sizeof(st.memory[k].what) - 1] = '\0';
				publish_stats(&st, body + sizeof(st), st.n_seqs);
				if (ready_unlogged)
				{
					log_ready(&ready_model, &st);
					ready_unlogged = false;
				}
				return true;
			}
		case G4F_HEARTBEAT:
			/* reading it was the progress (read_engine) */
			return len == 0;
		case G4F_SUBMIT:
		case G4F_CANCEL:
			break;
	}
	return false;
}

/*
 * Fold the last engine's counters into the totals the views add them to,
 * and forget its statistics (lock held exclusively): at an engine's death,
 * and when a supervisor stops or starts (one that died left them), so the
 * cumulative figures never go back.
 */
static void
fold_engine_stats(void)
{
	if (g4_shared->have_stats)
	{
		G4WireStats *b = &g4_shared->base;
		G4WireStats *s = &g4_shared->stats;
		int			j;

		b->steps += s->steps;
		b->tokens_prefilled += s->tokens_prefilled;
		b->tokens_generated += s->tokens_generated;
		b->batch_seqs_sum += s->batch_seqs_sum;
		b->batch_seqs_max = Max(b->batch_seqs_max, s->batch_seqs_max);
		b->batch_tokens_max = Max(b->batch_tokens_max, s->batch_tokens_max);
		b->spec_drafted += s->spec_drafted;
		b->spec_accepted += s->spec_accepted;
		b->preemptions += s->preemptions;
		b->prefix_hit_tokens += s->prefix_hit_tokens;
		b->images += s->images;
		b->audio_seconds += s->audio_seconds;
		b->media_decode_seconds += s->media_decode_seconds;
		b->media_embed_seconds += s->media_embed_seconds;
		b->spec_verify_steps += s->spec_verify_steps;
		for (j = 0; j < G4_WIRE_SPEC_POSITIONS; j++)
		{
			b->spec_pos_drafted[j] += s->spec_pos_drafted[j];
			b->spec_pos_accepted[j] += s->spec_pos_accepted[j];
		}
	}
	g4_shared->have_stats = false;
	g4_shared->n_seqs = 0;
}

/* Send what is buffered for the engine; a broken socket stops it. */
static void
write_engine(void)
{
	if (engine_sock < 0 || g4buf_pending(&engine_out) == 0)
		return;
	if (g4p_write(engine_sock, &engine_out) < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
	{
		/* the read side sees the end of file */
		if (errno != EPIPE && errno != ECONNRESET)
			ereport(LOG,
					(errmsg("could not write to the gemma4 engine process: %m")));
		kill_engine(G4W_RESTARTING, "The connection to the engine process broke; a new one starts once it has been collected.");
	}
}

static void
send_cancel(SupRequest *q)
{
	if (engine_sock < 0)
		return;
	if (!g4p_put_frame(&engine_out, G4F_CANCEL, &q->request_id, sizeof(q->request_id), NULL, 0))
		ereport(ERROR,
				(errcode(ERRCODE_OUT_OF_MEMORY),
				 errmsg("out of memory queueing a cancel for the gemma4 engine")));
}

/*
 * Take new submissions and cancellations from the slots.  The actions are
 * decided under one lock acquisition and carried out after releasing it.
 */
static void
scan_slots(void)
{
	int			n_adopt = 0;
	int			n_cancel = 0;
	int			i;

	LWLockAcquire(g4_shared->lock, LW_EXCLUSIVE);
	for (i = 0; i < n_requests; i++)
	{
		G4Slot	   *s = &g4_shared->slots[i];
		SupRequest *q = &requests[i];

		if (s->state == G4_SLOT_SUBMITTED && !q->active)
		{
			s->state = G4_SLOT_RUNNING;
			todo_adopt[n_adopt].slot = i;
			todo_adopt[n_adopt].handle = s->handle;
			todo_adopt[n_adopt].request_id = s->request_id;
			n_adopt++;
		}
		else if (s->state == G4_SLOT_RUNNING && s->cancel && q->active &&
				 q->request_id == s->request_id)
			todo_cancel[n_cancel++] = i;
	}
	LWLockRelease(g4_shared->lock);

	for (i = 0; i < n_cancel; i++)
		cancel_request(&requests[todo_cancel[i]]);
	for (i = 0; i < n_adopt; i++)
		adopt_request(todo_adopt[i].slot, todo_adopt[i].handle, todo_adopt[i].request_id);
}

/* Attach to a newly submitted request and forward it to the engine. */
static void
adopt_request(int i, dsm_handle handle, uint64 request_id)
{
	dsm_segment *seg = dsm_attach(handle);
	shm_toc    *toc;
	G4ReqHeader *hdr = NULL;
	char	   *items = NULL;
	shm_mq	   *mq = NULL;
	SupRequest *q = &requests[i];

	/* the backend may have given up already: then its segment is gone */
	if (seg == NULL)
	{
		free_slot(i, request_id);
		return;
	}
	toc = shm_toc_attach(G4_TOC_MAGIC, dsm_segment_address(seg));
	if (toc)
	{
		hdr = shm_toc_lookup(toc, G4_KEY_HEADER, true);
		items = shm_toc_lookup(toc, G4_KEY_ITEMS, true);
		mq = shm_toc_lookup(toc, G4_KEY_QUEUE, true);
	}
	if (!hdr || !items || !mq || hdr->magic != G4_REQ_MAGIC ||
		hdr->req.request_id != request_id || hdr->slot != i)
	{
		dsm_detach(seg);
		free_slot(i, request_id);
		return;
	}
	shm_mq_set_sender(mq, MyProc);
	q->active = true;
	q->request_id = request_id;
	q->seg = seg;
	q->hdr = hdr;
	q->mqh = shm_mq_attach(mq, seg, NULL);

	if (!engine_ready || engine_killed_at != 0)
	{
		char		msg[G4_MSG_LEN];
		G4WorkerState state;

		LWLockAcquire(g4_shared->lock, LW_SHARED);
		state = g4_shared->state;
		LWLockRelease(g4_shared->lock);
		snprintf(msg, sizeof(msg), "the gemma4 model is not ready (the worker is %s)",
				 g4_state_name(state));
		end_error(q, G4_ERR_PG_NOT_READY, msg);
		return;
	}
	if (!g4p_put_frame(&engine_out, G4F_SUBMIT, &hdr->req, sizeof(G4WireRequest),
					   items, hdr->req.items_len))
	{
		end_error(q, G4_ERR_NOMEM, "out of memory forwarding the request to the gemma4 engine");
		return;
	}
	q->in_engine = true;
	bump(&g4_shared->requests);
}

static SupRequest *
find_request(uint64 request_id)
{
	int			i;

	for (i = 0; i < n_requests; i++)
		if (requests[i].active && !requests[i].ended && requests[i].request_id == request_id)
			return &requests[i];
	return NULL;
}

/*
 * Relay one reply message (kind byte + data) without waiting.  What the
 * queue cannot take is buffered; a message partly written must be retried
 * with the same bytes, so it becomes the head of the buffer.
 */
static void
reply(SupRequest *q, char kind, const void *data, size_t len)
{
	if (g4buf_pending(&q->pending) == 0)
	{
		shm_mq_iovec iov[2];
		shm_mq_result res;

		iov[0].data = &kind;
		iov[0].len = 1;
		iov[1].data = data;
		iov[1].len = len;
		res = shm_mq_sendv(q->mqh, iov, 2, true, true);
		if (res == SHM_MQ_SUCCESS)
			return;
		if (res == SHM_MQ_DETACHED)
		{
			cancel_request(q);
			return;
		}
	}
	if (!g4p_put_frame(&q->pending, (uint32) (unsigned char) kind, data, len, NULL, 0))
	{
		end_error(q, G4_ERR_NOMEM, "out of memory buffering the reply of a gemma4 request");
		return;
	}
}

/*
 * Retry buffered replies; release the request once it has ended and all of
 * them are in its queue.  Only then is a finished request marked OK: the
 * backend takes "detached and OK" for a complete answer, so a supervisor
 * that exits (or fails) with replies still buffered must leave the result
 * pending (the backend reports the worker exited) or an error.
 */
static void
flush_replies(SupRequest *q)
{
	while (g4buf_pending(&q->pending) > 0)
	{
		G4FrameHeader h;
		char		kind;
		shm_mq_iovec iov[2];
		shm_mq_result res;

		memcpy(&h, q->pending.data + q->pending.off, sizeof(h));
		kind = (char) h.type;
		iov[0].data = &kind;
		iov[0].len = 1;
		iov[1].data = q->pending.data + q->pending.off + sizeof(h);
		iov[1].len = h.len;
		res = shm_mq_sendv(q->mqh, iov, 2, true, true);
		if (res == SHM_MQ_WOULD_BLOCK)
			return;
		if (res == SHM_MQ_DETACHED)
		{
			cancel_request(q);
			return;
		}
		g4buf_consume(&q->pending, sizeof(h) + h.len);
	}
	g4buf_shrink(&q->pending);
	if (q->ended)
	{
		if (q->finished)
		{
			/* counted once delivered whole: one the supervisor could not
			 * deliver fails, and counts as an error only */
			LWLockAcquire(g4_shared->lock, LW_EXCLUSIVE);
			g4_shared->finished++;
			LWLockRelease(g4_shared->lock);
			q->hdr->result = G4_RESULT_OK;
			/* the backend reads the result once it sees the queue detached */
			pg_write_barrier();
		}
		release_request(q);
	}
}

/*
 * The engine finished the request: record its counts; the result becomes OK
 * in flush_replies, once every reply is in the queue.
 */
static void
end_ok(SupRequest *q, const G4WireFinish *f)
{
	q->in_engine = false;
	q->ended = true;
	q->finished = true;
	q->hdr->finish_reason = f->reason;
	q->hdr->prompt_tokens = f->prompt_tokens;
	q->hdr->completion_tokens = f->completion_tokens;
	LWLockAcquire(g4_shared->lock, LW_EXCLUSIVE);
	g4_shared->slots[q - requests].finished = true;
	LWLockRelease(g4_shared->lock);
}

/*
 * Fail the request; replies not yet delivered are dropped.  This also
 * overrides the outcome of a finished request whose replies could not all
 * be delivered (the supervisor is stopping).  Like end_ok, this only
 * records the outcome: the main loop releases ended requests after
 * handling everything the engine sent in one go, so the statistics that
 * came with a finish are published before its backend wakes up.
 */
static void
end_error(SupRequest *q, int code, const char *msg)
{
	if (q->in_engine)
	{
		send_cancel(q);
		q->in_engine = false;
	}
	q->hdr->error.request_id = q->request_id;
	q->hdr->error.code = code;
	strlcpy(q->hdr->error.msg, msg, sizeof(q->hdr->error.msg));
	q->hdr->result = G4_RESULT_ERROR;
	q->ended = true;
	q->finished = false;
	g4buf_free(&q->pending);
	bump(&g4_shared->errors);
}

/* The backend stopped listening: cancel the sequence (its KV blocks go). */
static void
cancel_request(SupRequest *q)
{
	if (q->in_engine)
		send_cancel(q);
	if (!q->ended)
		bump(&g4_shared->cancelled);
	release_request(q);
}

/*
 * Detach, then free the slot.  The outcome in the header was written
 * before; detaching the queue is what tells the backend to read it.  A
 * backend that finds its slot freed while its queue is still attached
 * therefore knows the request was lost.
 */
static void
release_request(SupRequest *q)
{
	if (q->mqh)
		shm_mq_detach(q->mqh);
	if (q->seg)
		dsm_detach(q->seg);
	free_slot(q - requests, q->request_id);
	g4buf_free(&q->pending);
	memset(q, 0, sizeof(SupRequest));
}

static void
free_slot(int i, uint64 request_id)
{
	LWLockAcquire(g4_shared->lock, LW_EXCLUSIVE);
	if (g4_shared->slots[i].request_id == request_id)
		memset(&g4_shared->slots[i], 0, sizeof(G4Slot));
	LWLockRelease(g4_shared->lock);
	g4_slot_freed();
}

static void
publish_stats(const G4WireStats *st, const char *seqs, int n)
{
	n = Min(n, g4_shared->n_slots);
	LWLockAcquire(g4_shared->lock, LW_EXCLUSIVE);
	g4_shared->stats = *st;
	g4_shared->have_stats = true;
	memcpy(g4_shared->seqs, seqs, (size_t) n * sizeof(G4WireSeq));
	g4_shared->n_seqs = n;
	LWLockRelease(g4_shared->lock);
}

/* The model's line in the log, with where the device memory went. */
static void
log_ready(const G4WireReady *r, const G4WireStats *st)
{
	ereport(LOG,
			(errmsg("gemma4 model ready: %s (%s, %d layers, %.2f billion parameters, window %d tokens), engine %s",
					r->architecture, r->family, r->n_layers, (double) r->n_params / 1e9, r->max_model_len,
					r->version),
			 errdetail("%s backend on %s: weights %.1f MiB, KV pool %.1f MiB (%s, %lld sequences of the whole window), workspace %.1f MiB.",
					   st->backend, st->device, (double) st->weight_bytes / 1048576.0,
					   (double) st->kv_bytes_total / 1048576.0, st->kv_dtype, (long long) st->fit_full_context,
					   (double) st->workspace_bytes / 1048576.0)));
}

static void
bump(uint64 *counter)
{
	LWLockAcquire(g4_shared->lock, LW_EXCLUSIVE);
	(*counter)++;
	LWLockRelease(g4_shared->lock);
}

/*
 * The watchdog: an engine that has requests and sends nothing for
 * gemma4.engine_stall_timeout is hung (stopped, deadlocked, stuck in a
 * device call).  A working one sends statistics every 0.1 s between steps
 * and heartbeats every 0.1 s from inside a long step (between layers), so a
 * step that takes long is no stall.  On CUDA a step's final wait for the
 * device sends nothing: a device that hangs is caught here.  A hung engine
 * is reported as stalled and killed; once it is collected (or given up on,
 * see reap_engine) its requests fail (58000), and a new one starts.
 */
static void
watch_engine(void)
{
	TimestampTz now = GetCurrentTimestamp();
	bool		busy = false;
	int			i;

	if (!engine_ready || engine_pid == 0 || engine_killed_at != 0)
		return;
	for (i = 0; i < n_requests && !busy; i++)
		busy = requests[i].active && requests[i].in_engine;
	if (!busy || g4_engine_stall_timeout == 0)
	{
		/* idle time is no stall: the clock starts with the work */
		engine_progress_at = now;
		return;
	}
	if (!TimestampDifferenceExceeds(engine_progress_at, now, g4_engine_stall_timeout))
		return;
	snprintf(engine_fatal, sizeof(engine_fatal),
			 "it made no progress for %d ms with requests in flight (gemma4.engine_stall_timeout)",
			 g4_engine_stall_timeout);
	ereport(LOG,
			(errmsg("gemma4 engine process %d is stalled: %s; killing it", (int) engine_pid, engine_fatal)));
	kill_engine(G4W_STALLED, "The engine process made no progress with requests in flight; it is being restarted.");
}
