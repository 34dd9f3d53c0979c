/*-------------------------------------------------------------------------
 *
 * queue.c
 *	  Backend side of a request: its DSM segment, its submission slot, the
 *	  interruptible wait for replies, and cancellation.
 *
 * A request lives in its own DSM segment laid out with shm_toc: the header
 * (what is asked, and later the outcome), the payload items, and a reply
 * shm_mq of which the backend is the receiver.  The backend publishes the
 * segment's handle in a free slot of the shared slot array and sets the
 * supervisor's latch.
 *
 * Cancellation: whatever ends the request early (an error, a query cancel,
 * statement_timeout, gemma4.request_timeout, a closed cursor, LIMIT on a
 * stream, the backend exiting) detaches the segment, either through the
 * resource owner or through a reset callback on the memory context that
 * holds the request.  The on_dsm_detach callback then tells the supervisor
 * through the slot, which cancels the sequence in the engine and so frees
 * its KV blocks before the next scheduler step.
 *
 * IDENTIFICATION
 *	  src/pg/queue.c
 *
 *-------------------------------------------------------------------------
 */
#include "gemma4.h"

#include "engine.h"
#include "miscadmin.h"
#include "storage/ipc.h"
#include "storage/proc.h"
#include "storage/shm_toc.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"
#include "utils/wait_event.h"

/* Backends re-check the supervisor this often while waiting (ms). */
#define G4_LIVENESS_CHECK_MS 1000

static int	g4_claim_slot(Oid role, bool wait);
static int	role_cap(void);
static int	slots_held(Oid role);
static int	slot_for(Oid role, uint64 ticket);
static G4Request *request_start(G4WireRequest *wreq, const char *items, Size items_len, bool wait);
static void g4_request_detached(dsm_segment *seg, Datum arg);
static void g4_request_context_reset(void *arg);
static void g4_slot_give_up(int slot, uint64 request_id, bool answered);
static G4PollResult request_failed(G4Request *r, int code, const char *msg, const char *hint);
static void g4_raise_request_error(const G4WireError *e, const char *hint) pg_attribute_noreturn();

/*
 * Create the request's segment, publish it in a slot and wake the
 * supervisor.  The G4Request lives in CurrentMemoryContext; resetting that
 * context detaches the segment (and so cancels the request) if it is still
 * attached.  Raises an error when the model is not ready, or when no slot
 * came free within gemma4.queue_timeout (g4_claim_slot).
 */
G4Request *
g4_request_start(G4WireRequest *wreq, const char *items, Size items_len)
{
	return request_start(wreq, items, items_len, true);
}

/*
 * g4_request_start for a caller that has requests of its own in flight (a
 * batch, a table job's worker): returns NULL, without waiting, when no slot
 * can be taken at once (this role holds its gemma4.max_requests_per_role,
 * every slot is taken, or the free ones go to requests already waiting).
 * Such a caller must not wait in the queue: the slot it waits for may be
 * one only its own requests, not read meanwhile, would free.  It reads (or
 * finishes) one of them and tries again, or waits only once it has none.
 */
G4Request *
g4_request_try_start(G4WireRequest *wreq, const char *items, Size items_len)
{
	bool		ready;
	bool		free_now;

	/* a cheap look first: no segment made and destroyed for nothing */
	LWLockAcquire(g4_shared->lock, LW_SHARED);
	ready = g4_shared->state == G4W_READY;
	free_now = ready && slot_for(GetUserId(), 0) >= 0;
	LWLockRelease(g4_shared->lock);
	if (ready && !free_now)
		return NULL;
	return request_start(wreq, items, items_len, false);
}

/*
 * How many more requests this role may start now as far as
 * gemma4.max_requests_per_role goes (0 or more).  Only a hint for sizing
 * a window of requests: other sessions of the role take and free slots at
 * any time, so g4_request_try_start may still refuse.
 */
int
g4_role_slots_left(void)
{
	int			left;

	LWLockAcquire(g4_shared->lock, LW_SHARED);
	left = role_cap() - slots_held(GetUserId());
	LWLockRelease(g4_shared->lock);
	return Max(left, 0);
}

static G4Request *
request_start(G4WireRequest *wreq, const char *items, Size items_len, bool wait)
{
	shm_toc_estimator est;
	Size		segsize;
	dsm_segment *seg;
	shm_toc    *toc;
	G4ReqHeader *hdr;
	char	   *payload;
	shm_mq	   *mq;
	G4Request  *r;
	MemoryContextCallback *cb;
	Latch	   *latch;
	int			slot;

	g4_require_ready();

	shm_toc_initialize_estimator(&est);
	shm_toc_estimate_chunk(&est, sizeof(G4ReqHeader));
	shm_toc_estimate_chunk(&est, Max(items_len, 1));
	shm_toc_estimate_chunk(&est, G4_QUEUE_SIZE);
	shm_toc_estimate_keys(&est, 3);
	segsize = shm_toc_estimate(&est);

	r = palloc0(sizeof(G4Request));
	r->slot = -1;
	cb = palloc0(sizeof(MemoryContextCallback));

	seg = dsm_create(segsize, 0);
	r->seg = seg;
	on_dsm_detach(seg, g4_request_detached, PointerGetDatum(r));
	cb->func = g4_request_context_reset;
	cb->arg = r;
	MemoryContextRegisterResetCallback(CurrentMemoryContext, cb);

	toc = shm_toc_create(G4_TOC_MAGIC, dsm_segment_address(seg), segsize);
	hdr = shm_toc_allocate(toc, sizeof(G4ReqHeader));
	memset(hdr, 0, sizeof(G4ReqHeader));
	hdr->magic = G4_REQ_MAGIC;
	hdr->req = *wreq;
	hdr->req.items_len = (uint32) items_len;
	shm_toc_insert(toc, G4_KEY_HEADER, hdr);
	payload = shm_toc_allocate(toc, Max(items_len, 1));
	if (items_len > 0)
		memcpy(payload, items, items_len);
	shm_toc_insert(toc, G4_KEY_ITEMS, payload);
	mq = shm_mq_create(shm_toc_allocate(toc, G4_QUEUE_SIZE), G4_QUEUE_SIZE);
	shm_toc_insert(toc, G4_KEY_QUEUE, mq);
	shm_mq_set_receiver(mq, MyProc);
	r->mqh = shm_mq_attach(mq, seg, NULL);
	r->hdr = hdr;

	/* claim a slot, waiting in the queue for one if needed; returns locked */
	slot = g4_claim_slot(GetUserId(), wait);
	if (slot < 0)
	{
		/* none at once, and the caller does not wait: nothing was published */
		dsm_detach(seg);
		return NULL;
	}
	r->request_id = pg_atomic_fetch_add_u64(&g4_shared->next_request_id, 1);
	hdr->slot = slot;
	hdr->req.request_id = r->request_id;
	g4_shared->slots[slot].state = G4_SLOT_SUBMITTED;
	g4_shared->slots[slot].cancel = false;
	g4_shared->slots[slot].kind = wreq->kind;
	g4_shared->slots[slot].pid = MyProcPid;
	g4_shared->slots[slot].role = GetUserId();
	g4_shared->slots[slot].request_id = r->request_id;
	g4_shared->slots[slot].handle = dsm_segment_handle(seg);
	g4_shared->slots[slot].submitted_at = GetCurrentTimestamp();
	r->slot = slot;
	r->supervisor_generation = g4_shared->supervisor_generation;
	latch = g4_shared->supervisor_latch;
	LWLockRelease(g4_shared->lock);

	if (latch)
		SetLatch(latch);

	if (g4_request_timeout > 0)
	{
		r->timeout_ms = g4_request_timeout;
		r->deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), g4_request_timeout);
	}
	return r;
}

/* ---- waiting for a slot (safety) ----------------------------------------
 *
 * A role holds at most gemma4.max_requests_per_role slots.  A request that
 * finds no slot it may take waits, for up to gemma4.queue_timeout, in a
 * queue of at most gemma4.max_queued_requests entries.  When slots are
 * scarce they go to the waiting role that holds the fewest, in arrival
 * order within a role, so a role submitting many requests cannot keep the
 * others out: each gets its share of the batch.
 */

/* The per-role limit in effect. */
static int
role_cap(void)
{
	if (g4_max_requests_per_role > 0)
		return Min(g4_max_requests_per_role, g4_shared->n_slots);
	return Max(1, g4_shared->n_slots / 2);
}

/* Slots held by role (lock held). */
static int
slots_held(Oid role)
{
	int			n = 0;
	int			i;

	for (i = 0; i < g4_shared->n_slots; i++)
		if (g4_shared->slots[i].state != G4_SLOT_FREE && g4_shared->slots[i].role == role)
			n++;
	return n;
}

/*
 * A free slot this request may take now, or -1 (lock held exclusively).
 * ticket 0 is a newcomer: it comes after every waiter.
 */
static int
slot_for(Oid role, uint64 ticket)
{
	int			held = slots_held(role);
	int			free_slot = -1;
	int			i;

	if (held >= role_cap())
		return -1;
	for (i = 0; i < g4_shared->n_slots && free_slot < 0; i++)
		if (g4_shared->slots[i].state == G4_SLOT_FREE)
			free_slot = i;
	if (free_slot < 0)
		return -1;
	/* a waiter of a role holding fewer slots, or as many and earlier, goes first */
	for (i = 0; i < g4_shared->n_waiting; i++)
	{
		const G4Waiter *w = &g4_shared->waiting[i];
		int			other;

		if (w->ticket == ticket)
			continue;
		other = w->role == role ? held : slots_held(w->role);
		if (other >= role_cap())
			continue;			/* it cannot take a slot anyway */
		if (other < held || (other == held && (ticket == 0 || w->ticket < ticket)))
			return -1;
	}
	return free_slot;
}

/* Drop a waiter's entry (lock held exclusively). */
static void
remove_waiter(uint64 ticket)
{
	int			i;

	for (i = 0; i < g4_shared->n_waiting; i++)
	{
		if (g4_shared->waiting[i].ticket == ticket)
		{
			g4_shared->waiting[i] = g4_shared->waiting[--g4_shared->n_waiting];
			return;
		}
	}
}

/* PG_ENSURE_ERROR_CLEANUP callback: a waiter gave up (error, cancel, exit). */
static void
leave_queue(int code, Datum arg)
{
	LWLockAcquire(g4_shared->lock, LW_EXCLUSIVE);
	remove_waiter(DatumGetUInt64(arg));
	LWLockRelease(g4_shared->lock);
	/* the slot this waiter was let through for may suit another */
	ConditionVariableBroadcast(&g4_shared->slot_freed);
}

/* Tell waiting backends a slot was freed. */
void
g4_slot_freed(void)
{
	if (g4_shared->n_waiting > 0)
		ConditionVariableBroadcast(&g4_shared->slot_freed);
}

/* Raise the error of a request that could not get a slot. */
static void
no_slot(const char *why, int held)
{
	ereport(ERROR,
			(errcode(ERRCODE_INSUFFICIENT_RESOURCES),
			 errmsg("too many concurrent gemma4 requests: %s", why),
			 errdetail("This role holds %d of %d request slots (gemma4.max_requests_per_role is %d).",
					   held, g4_shared->n_slots, role_cap()),
			 errhint("Retry later; an administrator can raise gemma4.max_requests, "
					 "gemma4.max_requests_per_role or gemma4.max_queued_requests.")));
}

/* Free slots (lock held). */
static int
slots_free(void)
{
	int			n = 0;
	int			i;

	for (i = 0; i < g4_shared->n_slots; i++)
		if (g4_shared->slots[i].state == G4_SLOT_FREE)
			n++;
	return n;
}

/*
 * Claim a slot for role, waiting in the queue if needed.  Returns with the
 * lock held exclusively; raises an error when the model is not ready, the
 * queue is full or the wait timed out.  With wait false, returns -1 (the
 * lock released) instead of waiting or raising for want of a slot.
 */
static int
g4_claim_slot(Oid role, bool wait)
{
	TimestampTz deadline;
	uint64		ticket;
	int			slot;
	int			held;

	LWLockAcquire(g4_shared->lock, LW_EXCLUSIVE);
	if (g4_shared->state == G4W_READY && (slot = slot_for(role, 0)) >= 0)
		return slot;
	held = slots_held(role);
	if (!wait && g4_shared->state == G4W_READY)
	{
		LWLockRelease(g4_shared->lock);
		return -1;
	}
	if (g4_shared->state != G4W_READY || g4_shared->n_waiting >= Min(g4_max_queued_requests, G4_MAX_WAITING) ||
		g4_queue_timeout == 0)
	{
		bool		ready = g4_shared->state == G4W_READY;
		bool		queue_full = g4_queue_timeout > 0;
		int			n_free = slots_free();

		LWLockRelease(g4_shared->lock);
		if (!ready)
			g4_require_ready();
		if (queue_full)
			no_slot("the queue of waiting requests is full", held);
		if (held >= role_cap())
			no_slot(psprintf("this role already holds its limit of %d requests "
							 "(gemma4.max_requests_per_role)", role_cap()), held);
		no_slot(n_free == 0 ? "no slot is free" : "the free slots go to requests already waiting", held);
	}
	ticket = ++g4_shared->next_ticket;
	g4_shared->waiting[g4_shared->n_waiting].role = role;
	g4_shared->waiting[g4_shared->n_waiting].ticket = ticket;
	g4_shared->n_waiting++;
	LWLockRelease(g4_shared->lock);

	deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), g4_queue_timeout);
	slot = -1;
	PG_ENSURE_ERROR_CLEANUP(leave_queue, UInt64GetDatum(ticket));
	{
		ConditionVariablePrepareToSleep(&g4_shared->slot_freed);
		for (;;)
		{
			long		secs;
			int			usecs;
			bool		ready;

			LWLockAcquire(g4_shared->lock, LW_EXCLUSIVE);
			ready = g4_shared->state == G4W_READY;
			if (ready && (slot = slot_for(role, ticket)) >= 0)
				break;			/* keep the lock */
			held = slots_held(role);
			LWLockRelease(g4_shared->lock);
			if (!ready)
				g4_require_ready();
			if (GetCurrentTimestamp() >= deadline)
			{
				if (held >= role_cap())
					no_slot(psprintf("this role still held its limit of %d requests "
									 "(gemma4.max_requests_per_role) after gemma4.queue_timeout (%d ms)",
									 role_cap(), g4_queue_timeout), held);
				no_slot(psprintf("no slot became free within gemma4.queue_timeout (%d ms)", g4_queue_timeout),
						held);
			}
			TimestampDifference(GetCurrentTimestamp(), deadline, &secs, &usecs);
			/* wake at least every second: the worker state is not signalled */
			(void) ConditionVariableTimedSleep(&g4_shared->slot_freed,
											   Min(1000, secs * 1000 + usecs / 1000 + 1),
											   PG_WAIT_EXTENSION);
		}
	}
	PG_END_ENSURE_ERROR_CLEANUP(leave_queue, UInt64GetDatum(ticket));
	ConditionVariableCancelSleep();
	remove_waiter(ticket);		/* the lock is still held */
	return slot;
}

/*
 * Look at a request once, without waiting: the next reply message (its kind
 * and bytes, valid until the next call), the end of the request (the outcome
 * is in r->hdr), or nothing yet.  A failure (the request's own error, a
 * timeout, a supervisor that went away) is returned as G4_POLL_FAILED with
 * r->failure filled in; g4_request_raise turns it into an ERROR.  This is
 * the whole of the backend's side of a request, so one process can keep many
 * requests in flight (a table job's worker) and wait for any of them.
 */
G4PollResult
g4_request_poll(G4Request *r, char *kind, const char **data, Size *len)
{
	for (;;)
	{
		shm_mq_result res;
		Size		nbytes;
		void	   *p;
		uint32		generation;
		bool		lost;

		if (r->seg == NULL)
			elog(ERROR, "gemma4 request %llu is no longer attached",
				 (unsigned long long) r->request_id);

		res = shm_mq_receive(r->mqh, &nbytes, &p, true);
		if (res == SHM_MQ_SUCCESS)
		{
			if (nbytes < 1)
				elog(ERROR, "gemma4 reply message is empty");
			*kind = ((const char *) p)[0];
			*data = (const char *) p + 1;
			*len = nbytes - 1;
			return G4_POLL_MESSAGE;
		}
		if (res == SHM_MQ_DETACHED)
		{
			/*
			 * The outcome was written before the supervisor detached, and
			 * OK only once every reply was in the queue; still pending
			 * means it exited without answering.
			 */
			pg_read_barrier();
			r->answered = r->hdr->result == G4_RESULT_OK || r->hdr->result == G4_RESULT_ERROR;
			if (r->hdr->result == G4_RESULT_OK)
				return G4_POLL_DONE;
			if (r->hdr->result == G4_RESULT_ERROR)
				return request_failed(r, r->hdr->error.code, r->hdr->error.msg, NULL);
			return request_failed(r, G4_ERR_PG_ENGINE_DIED,
								  "the gemma4 worker exited while this request was running",
								  "The worker restarts automatically; see the server log.");
		}

		/*
		 * Nothing yet: is the supervisor that took the request still there,
		 * and does the request still hold its slot?  The supervisor detaches
		 * from the queue before it frees a slot, so a freed slot with the
		 * queue still attached after that (checked by receiving once more)
		 * means the request was dropped without an answer.
		 */
		LWLockAcquire(g4_shared->lock, LW_SHARED);
		generation = g4_shared->supervisor_generation;
		lost = g4_shared->slots[r->slot].request_id != r->request_id;
		LWLockRelease(g4_shared->lock);
		if (generation != r->supervisor_generation)
			return request_failed(r, G4_ERR_PG_ENGINE_DIED,
								  "the gemma4 worker restarted while this request was running",
								  "Retry when SELECT gemma_wait_ready() returns true.");
		if (lost && r->lost_seen)
			return request_failed(r, G4_ERR_INTERNAL,
								  "the gemma4 worker dropped this request without an answer",
								  "See the server log.");
		if (lost)
		{
			/* receive once more: data or the outcome may have arrived */
			r->lost_seen = true;
			continue;
		}
		if (r->deadline != 0 && GetCurrentTimestamp() >= r->deadline)
		{
			char		msg[64];

			snprintf(msg, sizeof(msg), "gemma4 request timed out after %d ms", r->timeout_ms);
			return request_failed(r, G4_ERR_PG_TIMEOUT, msg,
								  "Raise gemma4.request_timeout, or lower max_tokens.");
		}
		return G4_POLL_NOTHING;
	}
}

/*
 * How long a process waiting on this request may sleep on its latch before
 * polling it again: until the next liveness check or its deadline.
 */
long
g4_request_wait_ms(G4Request *r)
{
	long		wait_ms = G4_LIVENESS_CHECK_MS;

	if (r->deadline != 0)
	{
		long		secs;
		int			usecs;

		TimestampDifference(GetCurrentTimestamp(), r->deadline, &secs, &usecs);
		wait_ms = Min(wait_ms, secs * 1000 + usecs / 1000 + 1);
	}
	return wait_ms;
}

/*
 * Wait for the next reply message.  Returns true with its kind and bytes
 * (valid until the next call); returns false once the request has ended
 * well, with the outcome in r->hdr.  Raises the request's error, and
 * errors for a timeout or a supervisor that went away.  Interruptible.
 */
bool
g4_request_next(G4Request *r, char *kind, const char **data, Size *len)
{
	for (;;)
	{
		CHECK_FOR_INTERRUPTS();
		switch (g4_request_poll(r, kind, data, len))
		{
			case G4_POLL_MESSAGE:
				return true;
			case G4_POLL_DONE:
				return false;
			case G4_POLL_FAILED:
				g4_request_raise(r);
			case G4_POLL_NOTHING:
				break;
		}
		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 g4_request_wait_ms(r), PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
	}
}

/* Record why a request failed; see g4_request_poll. */
static G4PollResult
request_failed(G4Request *r, int code, const char *msg, const char *hint)
{
	r->failure.request_id = r->request_id;
	r->failure.code = code;
	strlcpy(r->failure.msg, msg, sizeof(r->failure.msg));
	r->failure_hint = hint;
	return G4_POLL_FAILED;
}

/* Raise the failure g4_request_poll reported. */
void
g4_request_raise(G4Request *r)
{
	g4_raise_request_error(&r->failure, r->failure_hint);
}

/* Detach from a request that has ended (the outcome was read already). */
void
g4_request_finish(G4Request *r)
{
	if (r->seg != NULL)
		dsm_detach(r->seg);
}

/*
 * on_dsm_detach callback: the backend no longer listens.  If the request
 * still holds its slot, give it up (cancelling it when running).
 */
static void
g4_request_detached(dsm_segment *seg, Datum arg)
{
	G4Request  *r = (G4Request *) DatumGetPointer(arg);

	r->seg = NULL;
	r->mqh = NULL;
	r->hdr = NULL;
	if (r->slot >= 0)
	{
		g4_slot_give_up(r->slot, r->request_id, r->answered);
		r->slot = -1;
	}
}

/* Memory context reset callback: detach if not done yet. */
static void
g4_request_context_reset(void *arg)
{
	G4Request  *r = (G4Request *) arg;

	if (r->seg != NULL)
		dsm_detach(r->seg);
}

/*
 * A slot the supervisor has not taken yet, or whose request it has answered
 * (it let go of the request before it frees the slot), is freed here, so a
 * session that submits again at once finds its slot free; a running one is
 * flagged for cancellation (the supervisor frees it).  A slot already freed
 * or reused for another request is left alone: the supervisor's own free
 * checks the request id as well.
 */
static void
g4_slot_give_up(int slot, uint64 request_id, bool answered)
{
	G4Slot	   *s = &g4_shared->slots[slot];
	Latch	   *latch = NULL;
	bool		freed = false;

	LWLockAcquire(g4_shared->lock, LW_EXCLUSIVE);
	if (s->request_id == request_id)
	{
		if (s->state == G4_SLOT_SUBMITTED || answered)
		{
			memset(s, 0, sizeof(G4Slot));
			freed = true;
		}
		else if (s->state == G4_SLOT_RUNNING)
		{
			s->cancel = true;
			latch = g4_shared->supervisor_latch;
		}
	}
	LWLockRelease(g4_shared->lock);
	if (latch)
		SetLatch(latch);
	if (freed)
		g4_slot_freed();
}

/* The SQLSTATE for an engine (or supervisor) error code. */
int
g4_sqlstate_for(int code)
{
	switch (code)
	{
		case G4_ERR_INVALID:
			return ERRCODE_INVALID_PARAMETER_VALUE;
		case G4_ERR_TOO_LONG:
			return ERRCODE_PROGRAM_LIMIT_EXCEEDED;
		case G4_ERR_NOMEM:
			return ERRCODE_OUT_OF_MEMORY;
		case G4_ERR_IO:
			return ERRCODE_IO_ERROR;
		case G4_ERR_FORMAT:
			return ERRCODE_DATA_CORRUPTED;
		case G4_ERR_UNSUPPORTED:
			return ERRCODE_FEATURE_NOT_SUPPORTED;
		case G4_ERR_BACKEND:
			return ERRCODE_SYSTEM_ERROR;
		case G4_ERR_CANCELLED:
			return ERRCODE_QUERY_CANCELED;
		case G4_ERR_BUSY:
			return ERRCODE_INSUFFICIENT_RESOURCES;
		case G4_ERR_PG_NOT_READY:
			return ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE;
		case G4_ERR_PG_ENGINE_DIED:
			return ERRCODE_SYSTEM_ERROR;
		case G4_ERR_PG_SHUTDOWN:
			/* not 57P01: the session goes on, and poolers drop a
			 * connection that reports admin_shutdown */
			return ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE;
		case G4_ERR_PG_TIMEOUT:
			return ERRCODE_QUERY_CANCELED;
		case G4_ERR_NUMERIC:
			/* a NaN from the model: the model's or the engine's fault, not
			 * bad input (class 22 would send the user to fix the data) */
			return ERRCODE_INTERNAL_ERROR;
	}
	return ERRCODE_INTERNAL_ERROR;
}

/*
 * Raise a request's error with its SQLSTATE, a detail where the code needs
 * one and a hint on what to do (the given one, else the one for its code).
 */
static void
g4_raise_request_error(const G4WireError *e, const char *given_hint)
{
	const char *detail = NULL;
	const char *hint = NULL;

	switch (e->code)
	{
		case G4_ERR_TOO_LONG:
			hint = "Shorten the prompt or lower max_tokens; prompt and generated tokens share the gemma4.max_model_len window.";
			break;
		case G4_ERR_NOMEM:
		case G4_ERR_BUSY:
			hint = "Retry when fewer requests are running.";
			break;
		case G4_ERR_PG_NOT_READY:
		case G4_ERR_PG_ENGINE_DIED:
		case G4_ERR_PG_SHUTDOWN:
			hint = "The engine restarts automatically; retry when SELECT gemma_wait_ready() returns true.";
			break;
		case G4_ERR_BACKEND:
		case G4_ERR_INTERNAL:
			hint = "See the server log.";
			break;
		case G4_ERR_NUMERIC:
			detail = "The model's forward pass produced a NaN: the model's weights or the engine are at fault, "
				"not the request's input.";
			hint = "Check the model files in gemma4.model_dir and report the problem with this request; "
				"unless the fault was passing, a retry gives the same error.";
			break;
	}
	if (given_hint)
		hint = given_hint;
	ereport(ERROR,
			(errcode(g4_sqlstate_for(e->code)),
			 errmsg("%s", e->msg),
			 detail ? errdetail("%s", detail) : 0,
			 hint ? errhint("%s", hint) : 0));
}
