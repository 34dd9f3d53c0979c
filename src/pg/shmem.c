/*-------------------------------------------------------------------------
 *
 * shmem.c
 *	  The extension's block of main shared memory: worker state, published
 *	  engine statistics and the request slots.
 *
 * Sized from gemma4.max_requests in the PG15 shmem_request_hook, together
 * with one LWLock of the named tranche "gemma4".  Every field but the
 * request id counter is protected by that lock; nobody waits while
 * holding it.
 *
 * IDENTIFICATION
 *	  src/pg/shmem.c
 *
 *-------------------------------------------------------------------------
 */
#include "gemma4.h"

#include "miscadmin.h"
#include "storage/ipc.h"
#include "storage/shmem.h"
#include "utils/timestamp.h"

G4Shared   *g4_shared = NULL;

static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

static Size
g4_shmem_size(void)
{
	Size		size;

	size = add_size(offsetof(G4Shared, slots), mul_size(g4_max_requests, sizeof(G4Slot)));
	size = MAXALIGN(size);
	size = add_size(size, mul_size(g4_max_requests, sizeof(G4WireSeq)));
	return size;
}

static void
g4_shmem_request(void)
{
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();
	RequestAddinShmemSpace(g4_shmem_size());
	RequestNamedLWLockTranche("gemma4", 1);
}

static void
g4_shmem_startup(void)
{
	bool		found;

	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();

	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	g4_shared = ShmemInitStruct("gemma4", g4_shmem_size(), &found);
	if (!found)
	{
		memset(g4_shared, 0, g4_shmem_size());
		g4_shared->lock = &(GetNamedLWLockTranche("gemma4"))->lock;
		pg_atomic_init_u64(&g4_shared->next_request_id, 1);
		g4_shared->state = G4W_STOPPED;
		g4_shared->state_since = GetCurrentTimestamp();
		g4_shared->n_slots = g4_max_requests;
		ConditionVariableInit(&g4_shared->slot_freed);
		g4_shared->seqs = (G4WireSeq *)
			((char *) g4_shared + MAXALIGN(add_size(offsetof(G4Shared, slots),
													mul_size(g4_max_requests, sizeof(G4Slot)))));
		strlcpy(g4_shared->reason, "The gemma4 supervisor has not started yet.", G4_REASON_LEN);
	}
	LWLockRelease(AddinShmemInitLock);
}

void
g4_shmem_install_hooks(void)
{
	prev_shmem_request_hook = shmem_request_hook;
	shmem_request_hook = g4_shmem_request;
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = g4_shmem_startup;
}

const char *
g4_state_name(G4WorkerState state)
{
	switch (state)
	{
		case G4W_STARTING:
			return "starting";
		case G4W_LOADING:
			return "loading";
		case G4W_READY:
			return "ready";
		case G4W_FAILED:
			return "failed";
		case G4W_RESTARTING:
			return "restarting";
		case G4W_STOPPED:
			return "stopped";
		case G4W_STALLED:
			return "stalled";
	}
	return "unknown";
}

/* Publish a new worker state; reason and hint may be NULL. */
void
g4_set_state(G4WorkerState state, const char *reason, const char *hint)
{
	TimestampTz now = GetCurrentTimestamp();

	LWLockAcquire(g4_shared->lock, LW_EXCLUSIVE);
	g4_shared->state = state;
	g4_shared->state_since = now;
	if (state == G4W_READY)
		g4_shared->ready_since = now;
	strlcpy(g4_shared->reason, reason ? reason : "", G4_REASON_LEN);
	strlcpy(g4_shared->hint, hint ? hint : "", G4_HINT_LEN);
	LWLockRelease(g4_shared->lock);
}

/* Raise the error a SQL function gives when the library is not preloaded. */
void
g4_require_shared(void)
{
	if (g4_shared == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("gemma4 must be loaded via shared_preload_libraries"),
				 errhint("Add gemma4 to shared_preload_libraries in postgresql.conf and restart the server.")));
}

/*
 * Fail at once unless the model is ready; returns its context window.
 * The state is copied under the lock and reported after releasing it.
 */
int
g4_require_ready(void)
{
	G4WorkerState state;
	char		reason[G4_REASON_LEN];
	char		hint[G4_HINT_LEN];
	int			window;

	g4_require_shared();
	LWLockAcquire(g4_shared->lock, LW_SHARED);
	state = g4_shared->state;
	window = g4_shared->model.max_model_len;
	strlcpy(reason, g4_shared->reason, sizeof(reason));
	strlcpy(hint, g4_shared->hint, sizeof(hint));
	LWLockRelease(g4_shared->lock);

	switch (state)
	{
		case G4W_READY:
			return window;
		case G4W_FAILED:
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("the gemma4 model could not be loaded"),
					 errdetail("%s", reason),
					 hint[0] ? errhint("%s", hint) : 0));
			break;
		case G4W_RESTARTING:
		case G4W_STALLED:
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("the gemma4 engine is restarting"),
					 errdetail("%s", reason),
					 errhint("Retry when SELECT gemma_wait_ready() returns true.")));
			break;
		case G4W_STOPPED:
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("the gemma4 worker is not running"),
					 errdetail("%s", reason),
					 errhint("The worker restarts automatically; see the server log.")));
			break;
		case G4W_STARTING:
		case G4W_LOADING:
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("the gemma4 model is not ready yet"),
					 errdetail("The gemma4 worker is %s.", g4_state_name(state)),
					 errhint("Retry when SELECT gemma_wait_ready() returns true.")));
			break;
	}
	return 0;					/* not reached */
}
