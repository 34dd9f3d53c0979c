/*-------------------------------------------------------------------------
 *
 * engine_proc.c
 *	  The engine process: forked by the supervisor, it loads
 *	  libgemma4engine with dlopen() and runs it.
 *
 * Whatever happens in here (a segfault, abort, the OOM killer, a CUDA
 * fault) ends this process only.  To keep it that way, after fork() this
 * code:
 *	- never calls PostgreSQL functions and never touches shared memory: it
 *	  reads the G4EngineConfig prepared before the fork and uses libc, the
 *	  engine and the frame helpers of protocol.c (libc only);
 *	- never runs the parent's exit callbacks: those would detach shared
 *	  memory and release the supervisor's PGPROC.  An on_exit() handler,
 *	  registered first thing, turns any exit() into _exit();
 *	- restores default signal handling, and asks the kernel for SIGKILL
 *	  when the supervisor dies (PR_SET_PDEATHSIG);
 *	- closes every inherited descriptor but its socket, and unmaps every
 *	  writable shared mapping (PostgreSQL's shared memory);
 *
 * Loop: read every frame the supervisor sent (submissions, cancels), then
 * run one engine step over all live sequences, so requests arriving
 * together share forward passes; events become frames.  Statistics go out
 * at most every STATS_INTERVAL, and at once when the engine falls idle so
 * the views show an empty pool.  A step that runs longer (a large prefill
 * chunk on the CPU) sends heartbeats from inside, on the engine's progress
 * reports, so the supervisor's watchdog tells it from a hung one.
 *
 * Submissions are prepared off the loop: a few preparation threads
 * tokenise and format each request (g4_prepare; gemma_tokenize and
 * gemma_detokenize too), so a huge prompt never holds up the steps of the
 * others; the loop queues what they finished (g4_submit_prepared) and sends
 * every frame itself.  A cancel reaching a request still in preparation
 * stops its tokenisation.
 *
 * IDENTIFICATION
 *	  src/pg/engine_proc.c
 *
 *-------------------------------------------------------------------------
 */
#include "gemma4.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#include "engine.h"

/*
 * port.h maps these to libpgport's versions; the engine process uses libc's
 * own.
 */
#undef snprintf
#undef vsnprintf

#define STATS_INTERVAL 0.1		/* seconds */
#define REPLY_CHUNK		((size_t) 1 << 20)	/* largest piece of a tokenizer reply */

/* Exit statuses, as the supervisor logs them. */
#define EXIT_SETUP		1		/* could not set the process up, or load the model */
#define EXIT_FATAL		3		/* the engine reported a device or internal fault */
#define EXIT_NOMEM		4		/* no memory for a message to the supervisor */
#define EXIT_SOCKET		5		/* the socket failed: the supervisor is gone */
#define EXIT_PROTOCOL	6		/* a malformed message from the supervisor */

/* The engine API, resolved with dlsym(). */
typedef struct EngineApi
{
	void		(*options_default) (g4_options *o);
	void		(*sampling_default) (g4_sampling *s);
	int			(*open) (const g4_options *opts, g4_engine **out, g4_err *err);
	void		(*close) (g4_engine *e);
	void		(*model_info_get) (const g4_engine *e, g4_model_info *info);
	int			(*tokenize) (g4_engine *e, const char *text, size_t len, int add_bos,
							 int32_t **ids, int *n_ids, g4_err *err);
	int			(*detokenize) (g4_engine *e, const int32_t *ids, int n_ids,
							   char **text, size_t *len, g4_err *err);
	int			(*prepare) (g4_engine *e, const g4_request *req, const g4_cancel_flag *cancel,
							g4_prepared **out, g4_err *err);
	int			(*submit_prepared) (g4_engine *e, g4_prepared *p, uint64_t *seq_id, g4_err *err);
	void		(*prepared_free) (g4_prepared *p);
	void		(*cancel) (g4_engine *e, uint64_t seq_id, g4_event_fn fn, void *ctx);
	int			(*step) (g4_engine *e, g4_event_fn fn, void *ctx, g4_err *err);
	int			(*has_work) (const g4_engine *e);
	void		(*stats_get) (const g4_engine *e, g4_stats *st);
	int			(*memory_get) (const g4_engine *e, g4_memory_use *out, int max);
	int			(*seqs_get) (const g4_engine *e, g4_seq_info *out, int max);
	const char *(*version) (void);
} EngineApi;

/* A live sequence: engine id and request id. */
typedef struct SeqMap
{
	uint64		seq_id;
	uint64		request_id;
} SeqMap;

/*
 * One submission being prepared.  Its payload is a copy of the frame's;
 * the request's pointers point into it.  The preparation thread fills the
 * result; only the serving loop turns it into frames.
 */
typedef struct PrepJob
{
	struct PrepJob *next;		/* in the to-do or the done list */
	struct PrepJob *next_live;	/* in the list of every job not yet handed back */
	uint64		request_id;
	int32		kind;
	char	   *payload;
	g4_request	req;
	g4_message *msgs;
	const char **stops;
	g4_media   *media;			/* raw file bytes, in prompt order */
	int			n_media;
	g4_content_part *parts;		/* message parts (text and media) */
	int			n_parts;
	const char *prompt;
	uint32		prompt_len;
	int32_t    *ids;
	int			n_ids;
	g4_cancel_flag cancel;		/* set by the loop, polled by the tokenizer */
	/* result */
	int			rc;
	g4_err		err;
	g4_prepared *prepared;		/* G4_KIND_CHAT, G4_KIND_TEXT */
	int32_t    *tok;			/* G4_KIND_TOKENIZE */
	int			n_tok;
	char	   *text;			/* G4_KIND_DETOKENIZE */
	size_t		text_len;
} PrepJob;

/* The preparation threads' queues; lock protects the lists and cancel flags. */
typedef struct PrepPool
{
	pthread_mutex_t lock;
	pthread_cond_t work;
	PrepJob    *todo;
	PrepJob    *todo_tail;
	PrepJob    *done;
	PrepJob    *live;
	int			wake_fd;		/* eventfd: a job is done */
} PrepPool;

typedef struct EngineProc
{
	int			sock;
	PrepPool	pool;
	G4Buf		in;
	G4Buf		out;
	EngineApi	api;
	g4_engine  *e;
	SeqMap	   *map;
	int			n_map;
	int			cap_map;
	g4_seq_info *infos;
	G4WireSeq  *wire_seqs;
	int			max_infos;
	bool		stats_dirty;
	double		stats_at;
} EngineProc;

static void exit_guard(int status, void *arg);
static void reset_signals(void);
static int	isolate_descriptors(int sock);
static int	drop_shared_mappings(void);
static void fail_and_exit(EngineProc *ep, uint32 type, int code, const char *msg) pg_attribute_noreturn();
static void out_of_memory(EngineProc *ep) pg_attribute_noreturn();
static void load_engine(EngineProc *ep, const G4EngineConfig *cfg);
static void serve(EngineProc *ep) pg_attribute_noreturn();
static bool read_frames(EngineProc *ep, int timeout_ms);
static void handle_submit(EngineProc *ep, const char *body, size_t len);
static void start_preparation(EngineProc *ep, int n_threads);
static void *prepare_jobs(void *arg);
static void queue_prepared(EngineProc *ep);
static bool map_add(EngineProc *ep, uint64 seq_id, uint64 request_id);
static void job_free(EngineProc *ep, PrepJob *j);
static void handle_cancel(EngineProc *ep, const char *body, size_t len);
static void on_event(void *ctx, const g4_event *ev);
static void send_error(EngineProc *ep, uint64 request_id, const g4_err *err);
static bool send_reply(EngineProc *ep, uint32 type, uint64 request_id, const void *data, size_t len,
					   size_t unit);
static void send_finish(EngineProc *ep, uint64 request_id, int prompt_tokens, int completion_tokens);
static void send_stats(EngineProc *ep);
static void send_heartbeat(void *ctx);
static void flush_out(EngineProc *ep);
static void copy_str(char *dst, size_t size, const char *src);
static double now_seconds(void);

void
g4_engine_proc_main(int sock, const G4EngineConfig *cfg)
{
	EngineProc	ep;

	/* first of all, so no exit path can run the parent's callbacks */
	if (on_exit(exit_guard, NULL) != 0)
		_exit(EXIT_SETUP);
	reset_signals();
	if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != cfg->supervisor_pid)
		_exit(EXIT_SETUP);
	(void) prctl(PR_SET_NAME, "gemma4 engine");
	sock = isolate_descriptors(sock);
	if (sock < 0 || fcntl(sock, F_SETFL, O_NONBLOCK) != 0 || drop_shared_mappings() != 0)
		_exit(EXIT_SETUP);

	/*
	 * One large request must not keep this process large: blocks from 1 MB
	 * up are mapped and unmapped on their own, and free memory at the top
	 * of a heap (the preparation threads have their own) goes back beyond
	 * 4 MB.  Fixed values also stop glibc from raising both thresholds
	 * after each large free, which is what kept such memory before.
	 */
	(void) mallopt(M_MMAP_THRESHOLD, 1 << 20);
	(void) mallopt(M_TRIM_THRESHOLD, 4 << 20);

	memset(&ep, 0, sizeof(ep));
	ep.sock = sock;
	load_engine(&ep, cfg);
	serve(&ep);
}

/* on_exit() handler: leave without running the handlers the parent set. */
static void
exit_guard(int status, void *arg)
{
	_exit(status);
}

/*
 * Default handling for every signal, nothing blocked.  SIGINT, SIGHUP,
 * SIGUSR1/2 are ignored: the postmaster may signal the supervisor's process
 * group (we are in it) and only SIGTERM, SIGQUIT and SIGKILL should end us.
 */
static void
reset_signals(void)
{
	sigset_t	none;
	int			sig;

	for (sig = 1; sig < NSIG; sig++)
	{
		if (sig == SIGKILL || sig == SIGSTOP)
			continue;
		(void) signal(sig, SIG_DFL);
	}
	(void) signal(SIGINT, SIG_IGN);
	(void) signal(SIGHUP, SIG_IGN);
	(void) signal(SIGUSR1, SIG_IGN);
	(void) signal(SIGUSR2, SIG_IGN);
	(void) signal(SIGPIPE, SIG_IGN);
	sigemptyset(&none);
	(void) sigprocmask(SIG_SETMASK, &none, NULL);
}

/*
 * Keep stdin/stdout/stderr and the socket (moved to descriptor 3); close
 * the rest: the postmaster's pipes, the supervisor's epoll set and latch
 * pipe, sockets of other processes.  Returns the socket or -1.
 */
static int
isolate_descriptors(int sock)
{
	long		maxfd = sysconf(_SC_OPEN_MAX);
	int			fd;

	if (sock != 3)
	{
		if (dup2(sock, 3) < 0)
			return -1;
		close(sock);
		sock = 3;
	}
	if (close_range(4, ~0U, 0) != 0)
	{
		/* kernels before 5.9 lack close_range */
		if (maxfd < 0)
			maxfd = 1024;
		for (fd = 4; fd < maxfd; fd++)
			(void) close(fd);
	}
	return sock;
}

/*
 * Unmap every writable shared mapping inherited from the supervisor:
 * PostgreSQL's main segment (shared_buffers among it) and the dynamic
 * segments it had attached.  Nothing here touches them, and the media
 * decoders read hostile input: a stray write must end this process, never
 * reach the cluster's memory.  Read-only shared mappings (nscd's caches)
 * stay.  Without /proc nothing is dropped; returns -1 if a munmap fails.
 */
static int
drop_shared_mappings(void)
{
	for (;;)
	{
		FILE	   *f = fopen("/proc/self/maps", "r");
		char		line[1024];
		unsigned long lo[64],
					hi[64];
		int			n = 0,
					i,
					line_start = 1;

		if (!f)
			return 0;
		while (n < 64 && fgets(line, sizeof(line), f))
		{
			unsigned long a,
						b;
			char		perms[8];
			int			starts = line_start;

			/* a line longer than the buffer arrives in pieces: only the
			 * first piece describes a mapping */
			line_start = strchr(line, '\n') != NULL;
			if (starts && sscanf(line, "%lx-%lx %7s", &a, &b, perms) == 3 && strlen(perms) == 4 &&
				perms[1] == 'w' && perms[3] == 's')
			{
				lo[n] = a;
				hi[n] = b;
				n++;
			}
		}
		fclose(f);
		if (n == 0)
			return 0;
		for (i = 0; i < n; i++)
			if (munmap((void *) lo[i], hi[i] - lo[i]) != 0)
				return -1;
	}
}

/* Report a fatal condition to the supervisor and exit. */
static void
fail_and_exit(EngineProc *ep, uint32 type, int code, const char *msg)
{
	G4WireError e;

	memset(&e, 0, sizeof(e));
	e.code = code;
	copy_str(e.msg, sizeof(e.msg), msg);
	if (g4p_put_frame(&ep->out, type, &e, sizeof(e), NULL, 0))
		flush_out(ep);
	_exit(type == G4F_LOAD_FAILED ? EXIT_SETUP : EXIT_FATAL);
}

/*
 * No memory for a frame: the supervisor cannot be told about the events
 * at hand any more, so this process ends and every request fails cleanly.
 */
static void
out_of_memory(EngineProc *ep)
{
	_exit(EXIT_NOMEM);
}

/* dlopen the engine, resolve its API and open the model. */
static void
load_engine(EngineProc *ep, const G4EngineConfig *cfg)
{
	void	   *lib;
	g4_options	o;
	g4_err		err;
	g4_model_info mi;
	G4WireReady ready;
	char		msg[G4_MSG_LEN];

	lib = dlopen(cfg->library, RTLD_NOW | RTLD_LOCAL);
	if (lib == NULL)
	{
		snprintf(msg, sizeof(msg), "could not load the engine library: %s", dlerror());
		fail_and_exit(ep, G4F_LOAD_FAILED, G4_ERR_IO, msg);
	}
#define RESOLVE(field, name) \
	do { \
		*(void **) &ep->api.field = dlsym(lib, name); \
		if (ep->api.field == NULL) \
		{ \
			snprintf(msg, sizeof(msg), "the engine library \"%s\" lacks %s", cfg->library, name); \
			fail_and_exit(ep, G4F_LOAD_FAILED, G4_ERR_FORMAT, msg); \
		} \
	} while (0)
	RESOLVE(options_default, "g4_options_default");
	RESOLVE(sampling_default, "g4_sampling_default");
	RESOLVE(open, "g4_open");
	RESOLVE(close, "g4_close");
	RESOLVE(model_info_get, "g4_model_info_get");
	RESOLVE(tokenize, "g4_tokenize");
	RESOLVE(detokenize, "g4_detokenize");
	RESOLVE(prepare, "g4_prepare");
	RESOLVE(submit_prepared, "g4_submit_prepared");
	RESOLVE(prepared_free, "g4_prepared_free");
	RESOLVE(cancel, "g4_cancel");
	RESOLVE(step, "g4_step");
	RESOLVE(has_work, "g4_has_work");
	RESOLVE(stats_get, "g4_stats_get");
	RESOLVE(memory_get, "g4_memory_get");
	RESOLVE(seqs_get, "g4_seqs_get");
	RESOLVE(version, "g4_version");
#undef RESOLVE

	ep->max_infos = cfg->max_requests;
	ep->infos = calloc((size_t) ep->max_infos, sizeof(g4_seq_info));
	ep->wire_seqs = calloc((size_t) ep->max_infos, sizeof(G4WireSeq));
	if (ep->infos == NULL || ep->wire_seqs == NULL)
		fail_and_exit(ep, G4F_LOAD_FAILED, G4_ERR_NOMEM, "out of memory");

	ep->api.options_default(&o);
	o.model_path = cfg->model_path;
	o.draft_model_path = cfg->draft_model_path[0] ? cfg->draft_model_path : NULL;
	o.backend = cfg->backend;
	o.threads = cfg->threads;
	o.max_model_len = cfg->max_model_len;
	o.gpu_memory_utilization = cfg->gpu_memory_utilization;
	o.kv_dtype = cfg->kv_dtype;
	o.max_num_seqs = cfg->max_num_seqs;
	o.max_num_batched_tokens = cfg->max_num_batched_tokens;
	o.num_speculative_tokens = cfg->num_speculative_tokens;
	o.enable_prefix_caching = cfg->enable_prefix_caching;
	o.spec_max_batch = cfg->speculative_max_batch;
	o.progress = send_heartbeat;
	o.progress_ctx = ep;
	memset(&err, 0, sizeof(err));
	if (ep->api.open(&o, &ep->e, &err) != G4_OK)
		fail_and_exit(ep, G4F_LOAD_FAILED, err.code, err.msg);

	ep->api.model_info_get(ep->e, &mi);
	memset(&ready, 0, sizeof(ready));
	copy_str(ready.architecture, sizeof(ready.architecture), mi.architecture);
	copy_str(ready.family, sizeof(ready.family), mi.family);
	copy_str(ready.version, sizeof(ready.version), ep->api.version());
	ready.n_layers = mi.n_layers;
	ready.max_model_len = mi.max_model_len;
	ready.n_params = mi.n_params;
	start_preparation(ep, cfg->prepare_threads);
	if (!g4p_put_frame(&ep->out, G4F_READY, &ready, sizeof(ready), NULL, 0))
		out_of_memory(ep);
	send_stats(ep);
	flush_out(ep);
}

/* The preparation threads and the eventfd that wakes the loop. */
static void
start_preparation(EngineProc *ep, int n_threads)
{
	PrepPool   *pool = &ep->pool;
	pthread_t	th;
	int			i;

	/* decoding a large image takes tens of ms: enough threads that
	 * preparation keeps up with the steps, a few cores left to the rest */
	if (n_threads <= 0)
	{
		long		cores = sysconf(_SC_NPROCESSORS_ONLN);

		n_threads = (int) Min(Max(cores / 2, 2), 16);
	}

	pool->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (pool->wake_fd < 0 || pthread_mutex_init(&pool->lock, NULL) != 0 ||
		pthread_cond_init(&pool->work, NULL) != 0)
		fail_and_exit(ep, G4F_LOAD_FAILED, G4_ERR_NOMEM, "could not set up the preparation threads");
	for (i = 0; i < n_threads; i++)
	{
		if (pthread_create(&th, NULL, prepare_jobs, ep) != 0)
			fail_and_exit(ep, G4F_LOAD_FAILED, G4_ERR_NOMEM, "could not start a preparation thread");
		pthread_detach(th);
	}
}

/* A preparation thread: tokenise and format jobs until the process ends. */
static void *
prepare_jobs(void *arg)
{
	EngineProc *ep = arg;
	PrepPool   *pool = &ep->pool;

	for (;;)
	{
		PrepJob    *j;

		pthread_mutex_lock(&pool->lock);
		while (pool->todo == NULL)
			pthread_cond_wait(&pool->work, &pool->lock);
		j = pool->todo;
		pool->todo = j->next;
		if (pool->todo == NULL)
			pool->todo_tail = NULL;
		pthread_mutex_unlock(&pool->lock);

		memset(&j->err, 0, sizeof(j->err));
		switch (j->kind)
		{
			case G4_KIND_CHAT:
			case G4_KIND_TEXT:
				j->rc = ep->api.prepare(ep->e, &j->req, &j->cancel, &j->prepared, &j->err);
				break;
			case G4_KIND_TOKENIZE:
				j->rc = ep->api.tokenize(ep->e, j->prompt ? j->prompt : "", j->prompt_len, 0,
										 &j->tok, &j->n_tok, &j->err);
				break;
			case G4_KIND_DETOKENIZE:
				j->rc = ep->api.detokenize(ep->e, j->ids, j->n_ids, &j->text, &j->text_len, &j->err);
				break;
		}

		pthread_mutex_lock(&pool->lock);
		j->next = pool->done;
		pool->done = j;
		pthread_mutex_unlock(&pool->lock);
		/* fails only if the counter would overflow: the loop could not be woken */
		if (eventfd_write(pool->wake_fd, 1) != 0)
			_exit(EXIT_FATAL);
	}
	return NULL;
}

/*
 * Serving loop: hand what the threads finished to the engine, or answer
 * it.  Jobs cancelled meanwhile are dropped: the supervisor has let go of
 * their requests.
 */
static void
queue_prepared(EngineProc *ep)
{
	PrepPool   *pool = &ep->pool;
	PrepJob    *done;
	eventfd_t	n;

	if (eventfd_read(pool->wake_fd, &n) != 0)
		return;					/* nothing finished since the last call */
	pthread_mutex_lock(&pool->lock);
	done = pool->done;
	pool->done = NULL;
	pthread_mutex_unlock(&pool->lock);

	/* the list is newest first: queue in the order they were finished */
	{
		PrepJob    *oldest = NULL;

		while (done)
		{
			PrepJob    *j = done;

			done = j->next;
			j->next = oldest;
			oldest = j;
		}
		done = oldest;
	}
	while (done)
	{
		PrepJob    *j = done;
		uint64_t	seq_id;

		done = j->next;
		if (j->cancel)
		{
			job_free(ep, j);
			continue;
		}
		if (j->rc != G4_OK)
			send_error(ep, j->request_id, &j->err);
		else if (j->kind == G4_KIND_CHAT || j->kind == G4_KIND_TEXT)
		{
			g4_prepared *p = j->prepared;

			j->prepared = NULL;	/* submit_prepared takes it in any case */
			if (ep->api.submit_prepared(ep->e, p, &seq_id, &j->err) != G4_OK)
				send_error(ep, j->request_id, &j->err);
			else if (!map_add(ep, seq_id, j->request_id))
				out_of_memory(ep);
		}
		else if (j->kind == G4_KIND_TOKENIZE)
		{
			if (send_reply(ep, G4F_IDS, j->request_id, j->tok, (size_t) j->n_tok * sizeof(int32_t),
						   sizeof(int32_t)))
				send_finish(ep, j->request_id, j->n_tok, 0);
		}
		else if (send_reply(ep, G4F_TEXT, j->request_id, j->text, j->text_len, 1))
			send_finish(ep, j->request_id, j->n_ids, 0);
		ep->stats_dirty = true;
		job_free(ep, j);
	}
}

/* Forget a job the threads handed back (serving loop). */
static void
job_free(EngineProc *ep, PrepJob *j)
{
	PrepJob   **pp;

	pthread_mutex_lock(&ep->pool.lock);
	for (pp = &ep->pool.live; *pp; pp = &(*pp)->next_live)
	{
		if (*pp == j)
		{
			*pp = j->next_live;
			break;
		}
	}
	pthread_mutex_unlock(&ep->pool.lock);
	if (j->prepared)
		ep->api.prepared_free(j->prepared);
	free(j->tok);
	free(j->text);
	free(j->ids);
	free(j->msgs);
	free(j->stops);
	free(j->media);
	free(j->parts);
	free(j->payload);
	free(j);
}


/* The serving loop; returns never. */
static void
serve(EngineProc *ep)
{
	for (;;)
	{
		bool		busy = ep->api.has_work(ep->e) != 0;

		/* only this thread adds and removes jobs: no lock needed to look */
		bool		preparing = ep->pool.live != NULL;

		/*
		 * idle: sleep until the supervisor writes; busy: just drain;
		 * preparing: statistics keep going out, the supervisor's watchdog
		 * sees the process is alive while a long prompt is tokenised
		 */
		if (preparing)
			ep->stats_dirty = true;
		if (!read_frames(ep, busy ? 0 : preparing ? (int) (STATS_INTERVAL * 1000) : -1))
		{
			/* the supervisor closed the socket: stop */
			ep->api.close(ep->e);
			_exit(0);
		}
		queue_prepared(ep);
		if (ep->api.has_work(ep->e))
		{
			g4_err		err;
			int			rc;

			memset(&err, 0, sizeof(err));
			rc = ep->api.step(ep->e, on_event, ep, &err);
			ep->stats_dirty = true;

			/*
			 * An engine-wide failure has already failed every live request.
			 * A device or internal fault may leave the engine unusable:
			 * end the process and let the supervisor start a fresh one.
			 */
			if (rc < 0 && (rc == G4_ERR_BACKEND || rc == G4_ERR_INTERNAL))
				fail_and_exit(ep, G4F_FATAL, rc, err.msg);
		}
		/*
		 * Idle is judged now, not by what was live at the top: a job the
		 * threads finished during this pass may have been the last one,
		 * and the next pass sleeps without a timeout.
		 */
		if (ep->stats_dirty &&
			((!ep->api.has_work(ep->e) && ep->pool.live == NULL) ||
			 now_seconds() - ep->stats_at >= STATS_INTERVAL))
			send_stats(ep);
		flush_out(ep);
	}
}

/*
 * Wait up to timeout_ms (-1: forever) for frames, then handle all that
 * arrived.  False at end of file.
 */
static bool
read_frames(EngineProc *ep, int timeout_ms)
{
	struct pollfd pfd[2];

	/* the socket, and the preparation threads' wake-up */
	pfd[0].fd = ep->sock;
	pfd[0].events = POLLIN;
	pfd[0].revents = 0;
	pfd[1].fd = ep->pool.wake_fd;
	pfd[1].events = POLLIN;
	pfd[1].revents = 0;
	if (poll(pfd, 2, timeout_ms) < 0 && errno != EINTR)
		_exit(EXIT_SOCKET);
	for (;;)
	{
		ssize_t		n = g4p_read(ep->sock, &ep->in);
		uint32		type;
		const char *body;
		size_t		len;
		int			rc;

		if (n == 0)
			return false;
		if (n < 0)
		{
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				return true;
			if (errno == ENOMEM)
				out_of_memory(ep);
			_exit(EXIT_SOCKET);
		}
		while ((rc = g4p_next_frame(&ep->in, &type, &body, &len)) > 0)
		{
			if (type == G4F_SUBMIT)
				handle_submit(ep, body, len);
			else if (type == G4F_CANCEL)
				handle_cancel(ep, body, len);
			else
				_exit(EXIT_PROTOCOL);
		}
		if (rc < 0)
			_exit(EXIT_PROTOCOL);
	}
}

static bool
map_add(EngineProc *ep, uint64 seq_id, uint64 request_id)
{
	if (ep->n_map == ep->cap_map)
	{
		int			cap = ep->cap_map ? ep->cap_map * 2 : 64;
		SeqMap	   *p = realloc(ep->map, (size_t) cap * sizeof(SeqMap));

		if (p == NULL)
			return false;
		ep->map = p;
		ep->cap_map = cap;
	}
	ep->map[ep->n_map].seq_id = seq_id;
	ep->map[ep->n_map].request_id = request_id;
	ep->n_map++;
	return true;
}

static int
map_find_seq(EngineProc *ep, uint64 seq_id)
{
	int			i;

	for (i = 0; i < ep->n_map; i++)
		if (ep->map[i].seq_id == seq_id)
			return i;
	return -1;
}

static void
map_remove(EngineProc *ep, int i)
{
	ep->map[i] = ep->map[ep->n_map - 1];
	ep->n_map--;
}

/*
 * A request from the supervisor: copied into a job for the preparation
 * threads (the frame's bytes are only valid until the next read).
 */
static void
handle_submit(EngineProc *ep, const char *body, size_t len)
{
	G4WireRequest wr;
	PrepJob    *j;
	const char *pos;
	const char *end;
	int32		tag;
	const char *data;
	uint32		dlen;
	int			n_items = 0;
	int			n_msgs = 0;
	int			n_stops = 0;

	if (len < sizeof(wr))
		_exit(EXIT_PROTOCOL);
	memcpy(&wr, body, sizeof(wr));
	if (len - sizeof(wr) != wr.items_len)
		_exit(EXIT_PROTOCOL);
	if (wr.kind < G4_KIND_CHAT || wr.kind > G4_KIND_DETOKENIZE)
	{
		g4_err		bad;

		bad.code = G4_ERR_INVALID;
		snprintf(bad.msg, sizeof(bad.msg), "unknown request kind %d", wr.kind);
		send_error(ep, wr.request_id, &bad);
		return;
	}

	j = calloc(1, sizeof(PrepJob));
	if (j == NULL || (j->payload = malloc(wr.items_len + 1)) == NULL)
		out_of_memory(ep);
	memcpy(j->payload, body + sizeof(wr), wr.items_len);
	j->request_id = wr.request_id;
	j->kind = wr.kind;

	/* count, then collect the items (pointers into the copy) */
	end = j->payload + wr.items_len;
	pos = j->payload;
	while (pos < end)
	{
		if (!g4p_item_next(&pos, end, &tag, &data, &dlen))
			_exit(EXIT_PROTOCOL);
		n_items++;
	}
	j->msgs = calloc((size_t) n_items + 1, sizeof(g4_message));
	j->stops = calloc((size_t) n_items + 1, sizeof(char *));
	j->media = calloc((size_t) n_items + 1, sizeof(g4_media));
	j->parts = calloc((size_t) n_items + 1, sizeof(g4_content_part));
	if (j->msgs == NULL || j->stops == NULL || j->media == NULL || j->parts == NULL)
		out_of_memory(ep);
	pos = j->payload;
	while (pos < end && g4p_item_next(&pos, end, &tag, &data, &dlen))
	{
		switch (tag)
		{
			case G4_ITEM_SYSTEM:
			case G4_ITEM_USER:
			case G4_ITEM_MODEL:
				j->msgs[n_msgs].role = tag;
				j->msgs[n_msgs].content = data;
				n_msgs++;
				break;
			case G4_ITEM_PROMPT:
				j->prompt = data;
				j->prompt_len = dlen;
				break;
			case G4_ITEM_STOP:
				j->stops[n_stops++] = data;
				break;
			case G4_ITEM_IMAGE:
			case G4_ITEM_AUDIO:
				j->media[j->n_media].kind = tag == G4_ITEM_IMAGE ? G4_MEDIA_IMAGE : G4_MEDIA_AUDIO;
				j->media[j->n_media].data = (const uint8_t *) data;
				j->media[j->n_media].len = dlen;
				j->n_media++;
				break;
			case G4_ITEM_PART_TEXT:
			case G4_ITEM_PART_IMAGE:
			case G4_ITEM_PART_AUDIO:
				/* parts of a message follow it, so they are contiguous */
				if (n_msgs == 0)
					_exit(EXIT_PROTOCOL);
				if (j->msgs[n_msgs - 1].parts == NULL)
					j->msgs[n_msgs - 1].parts = &j->parts[j->n_parts];
				j->msgs[n_msgs - 1].n_parts++;
				if (tag == G4_ITEM_PART_TEXT)
				{
					j->parts[j->n_parts].kind = G4_PART_TEXT;
					j->parts[j->n_parts].text = data;
				}
				else
				{
					j->parts[j->n_parts].kind = tag == G4_ITEM_PART_IMAGE ? G4_PART_IMAGE : G4_PART_AUDIO;
					j->media[j->n_media].kind = tag == G4_ITEM_PART_IMAGE ? G4_MEDIA_IMAGE : G4_MEDIA_AUDIO;
					j->media[j->n_media].data = (const uint8_t *) data;
					j->media[j->n_media].len = dlen;
					j->n_media++;
				}
				j->n_parts++;
				break;
			case G4_ITEM_IDS:
				/* the bytes may be unaligned: copy them */
				free(j->ids);
				j->n_ids = (int) (dlen / sizeof(int32_t));
				j->ids = malloc((size_t) j->n_ids * sizeof(int32_t) + 1);
				if (j->ids == NULL)
					out_of_memory(ep);
				memcpy(j->ids, data, (size_t) j->n_ids * sizeof(int32_t));
				break;
			default:
				_exit(EXIT_PROTOCOL);
		}
	}

	if (wr.kind == G4_KIND_CHAT || wr.kind == G4_KIND_TEXT)
	{
		g4_request *req = &j->req;

		ep->api.sampling_default(&req->sampling);
		req->input_kind = wr.kind == G4_KIND_CHAT ? G4_INPUT_CHAT : G4_INPUT_TEXT;
		req->prompt = j->prompt;
		req->messages = j->msgs;
		req->n_messages = n_msgs;
		req->enable_thinking = wr.thinking;
		req->max_tokens = wr.max_tokens;
		req->max_tokens_cap = wr.max_tokens_cap;
		req->sampling.temperature = wr.temperature;
		req->sampling.top_p = wr.top_p;
		req->sampling.top_k = wr.top_k;
		req->sampling.min_p = wr.min_p;
		req->sampling.repetition_penalty = wr.repetition_penalty;
		req->sampling.presence_penalty = wr.presence_penalty;
		req->sampling.frequency_penalty = wr.frequency_penalty;
		req->sampling.seed = wr.seed;
		req->sampling.has_seed = wr.has_seed;
		req->stop = n_stops > 0 ? j->stops : NULL;
		req->n_stop = n_stops;
		req->user_tag = wr.request_id;
		req->allow_control_tokens = wr.allow_control_tokens;
		req->media = j->n_media > 0 ? j->media : NULL;
		req->n_media = j->n_media;
		req->max_soft_tokens = wr.max_soft_tokens;
		req->max_image_pixels = wr.max_image_pixels;
		req->max_audio_seconds = wr.max_audio_seconds;
		req->disable_speculative = wr.disable_speculative;
	}

	/* in arrival order to the threads */
	pthread_mutex_lock(&ep->pool.lock);
	j->next_live = ep->pool.live;
	ep->pool.live = j;
	if (ep->pool.todo_tail)
		ep->pool.todo_tail->next = j;
	else
		ep->pool.todo = j;
	ep->pool.todo_tail = j;
	pthread_cond_signal(&ep->pool.work);
	pthread_mutex_unlock(&ep->pool.lock);
}

/* Cancel a request's sequence; its KV blocks are free when this returns. */
static void
handle_cancel(EngineProc *ep, const char *body, size_t len)
{
	uint64		request_id;
	PrepJob    *j;
	int			i;

	if (len != sizeof(request_id))
		_exit(EXIT_PROTOCOL);
	memcpy(&request_id, body, sizeof(request_id));

	/* still being prepared: stop its tokenisation, drop it when it is back */
	pthread_mutex_lock(&ep->pool.lock);
	for (j = ep->pool.live; j; j = j->next_live)
		if (j->request_id == request_id)
			j->cancel = 1;
	pthread_mutex_unlock(&ep->pool.lock);

	for (i = 0; i < ep->n_map; i++)
	{
		if (ep->map[i].request_id == request_id)
		{
			/* on_event sees the cancelled finish and drops the mapping */
			ep->api.cancel(ep->e, ep->map[i].seq_id, on_event, ep);
			ep->stats_dirty = true;
			return;
		}
	}
}

/* Engine callback: one event of one sequence, turned into a frame. */
static void
on_event(void *ctx, const g4_event *ev)
{
	EngineProc *ep = ctx;
	int			i = map_find_seq(ep, ev->seq_id);
	uint64		request_id;

	if (i < 0)
		return;
	request_id = ep->map[i].request_id;
	switch (ev->kind)
	{
		case G4_EV_TEXT:
			{
				G4WireText t;

				t.request_id = request_id;
				t.channel = ev->channel;
				if (!g4p_put_frame(&ep->out, G4F_TEXT, &t, sizeof(t), ev->text, ev->text_len))
					out_of_memory(ep);
				break;
			}
		case G4_EV_FINISH:
			{
				G4WireFinish f;

				f.request_id = request_id;
				f.reason = ev->finish_reason;
				f.prompt_tokens = ev->prompt_tokens;
				f.completion_tokens = ev->completion_tokens;
				if (!g4p_put_frame(&ep->out, G4F_FINISH, &f, sizeof(f), NULL, 0))
					out_of_memory(ep);
				map_remove(ep, i);
				break;
			}
		case G4_EV_ERROR:
			{
				g4_err		err;

				err.code = ev->error_code;
				copy_str(err.msg, sizeof(err.msg), ev->error_msg ? ev->error_msg : "the engine failed this request");
				send_error(ep, request_id, &err);
				map_remove(ep, i);
				break;
			}
	}
}

static void
send_error(EngineProc *ep, uint64 request_id, const g4_err *err)
{
	G4WireError e;

	memset(&e, 0, sizeof(e));
	e.request_id = request_id;
	e.code = err->code;
	copy_str(e.msg, sizeof(e.msg), err->msg);
	if (!g4p_put_frame(&ep->out, G4F_ERROR, &e, sizeof(e), NULL, 0))
		out_of_memory(ep);
}

/*
 * A tokenizer reply (G4F_IDS or G4F_TEXT content) in frames of at most
 * REPLY_CHUNK bytes, cut at multiples of unit: no frame approaches the frame
 * limit, and the supervisor relays the pieces one by one.  A reply larger
 * than G4_MAX_REPLY is an error of this request only.  False when the
 * request was failed instead.
 */
static bool
send_reply(EngineProc *ep, uint32 type, uint64 request_id, const void *data, size_t len,
		   size_t unit)
{
	const size_t chunk = REPLY_CHUNK - REPLY_CHUNK % unit;
	size_t		off = 0;

	if (len > G4_MAX_REPLY)
	{
		g4_err		err;

		err.code = G4_ERR_TOO_LONG;
		snprintf(err.msg, sizeof(err.msg),
				 "the reply would take %zu bytes, more than the limit of %zu bytes; pass a shorter input",
				 len, (size_t) G4_MAX_REPLY);
		send_error(ep, request_id, &err);
		return false;
	}
	do
	{
		size_t		n = len - off < chunk ? len - off : chunk;
		bool		ok;

		if (type == G4F_TEXT)
		{
			G4WireText t;

			t.request_id = request_id;
			t.channel = G4_CHANNEL_CONTENT;
			ok = g4p_put_frame(&ep->out, type, &t, sizeof(t), (const char *) data + off, n);
		}
		else
			ok = g4p_put_frame(&ep->out, type, &request_id, sizeof(request_id), (const char *) data + off, n);
		if (!ok)
			out_of_memory(ep);
		off += n;
		/* hand each piece over now: the buffer stays one chunk large */
		flush_out(ep);
	} while (off < len);
	return true;
}

static void
send_finish(EngineProc *ep, uint64 request_id, int prompt_tokens, int completion_tokens)
{
	G4WireFinish f;

	f.request_id = request_id;
	f.reason = G4_FINISH_STOP;
	f.prompt_tokens = prompt_tokens;
	f.completion_tokens = completion_tokens;
	if (!g4p_put_frame(&ep->out, G4F_FINISH, &f, sizeof(f), NULL, 0))
		out_of_memory(ep);
}

/* Engine and per-sequence statistics, with durations computed here. */
static void
send_stats(EngineProc *ep)
{
	g4_stats	st;
	G4WireStats w;
	int			n;
	int			i;

	ep->api.stats_get(ep->e, &st);
	n = ep->api.seqs_get(ep->e, ep->infos, ep->max_infos);
	memset(&w, 0, sizeof(w));
	copy_str(w.backend, sizeof(w.backend), st.backend);
	copy_str(w.device, sizeof(w.device), st.device);
	copy_str(w.kv_dtype, sizeof(w.kv_dtype), st.kv_dtype);
	w.n_groups = st.n_groups < 2 ? st.n_groups : 2;
	for (i = 0; i < w.n_groups; i++)
	{
		copy_str(w.groups[i].name, sizeof(w.groups[i].name), st.groups[i].name);
		w.groups[i].layers = st.groups[i].layers;
		w.groups[i].block_tokens = st.groups[i].block_tokens;
		w.groups[i].blocks_total = st.groups[i].blocks_total;
		w.groups[i].blocks_used = st.groups[i].blocks_used;
		w.groups[i].block_bytes = st.groups[i].block_bytes;
		w.groups[i].blocks_cached = st.groups[i].blocks_cached;
		w.groups[i].prefix_lookups = st.groups[i].prefix_lookups;
		w.groups[i].prefix_hits = st.groups[i].prefix_hits;
	}
	w.kv_bytes_total = st.kv_bytes_total;
	w.weight_bytes = st.weight_bytes;
	w.workspace_bytes = st.workspace_bytes;
	w.live_seqs = st.live_seqs;
	w.max_num_seqs = st.max_num_seqs;
	w.fit_full_context = st.fit_full_context;
	w.steps = st.steps;
	w.tokens_prefilled = st.tokens_prefilled;
	w.tokens_generated = st.tokens_generated;
	w.batch_tokens_max = st.batch_tokens_max;
	w.batch_seqs_max = st.batch_seqs_max;
	w.batch_seqs_sum = st.batch_seqs_sum;
	w.spec_drafted = st.spec_drafted;
	w.spec_accepted = st.spec_accepted;
	w.preemptions = st.preemptions;
	w.prefix_hit_tokens = st.prefix_hit_tokens;
	w.images = st.images;
	w.audio_seconds = st.audio_seconds;
	w.media_decode_seconds = st.media_decode_seconds;
	w.media_embed_seconds = st.media_embed_seconds;
	w.spec_k = st.spec_k;
	w.spec_max_batch = st.spec_max_batch;
	w.spec_verify_steps = st.spec_verify_steps;
	StaticAssertStmt(G4_WIRE_SPEC_POSITIONS == G4_SPEC_MAX_TOKENS, "draft positions differ");
	memcpy(w.spec_pos_drafted, st.spec_pos_drafted, sizeof(w.spec_pos_drafted));
	memcpy(w.spec_pos_accepted, st.spec_pos_accepted, sizeof(w.spec_pos_accepted));
	{
		g4_memory_use uses[G4_WIRE_MEMORY_USES];

		StaticAssertStmt(G4_WIRE_MEMORY_USES == G4_MEMORY_USES_MAX, "memory uses differ");
		w.n_memory = ep->api.memory_get(ep->e, uses, G4_WIRE_MEMORY_USES);
		for (i = 0; i < w.n_memory; i++)
		{
			copy_str(w.memory[i].what, sizeof(w.memory[i].what), uses[i].what);
			w.memory[i].bytes = uses[i].bytes;
		}
	}
	w.n_seqs = n;
	for (i = 0; i < n; i++)
	{
		const g4_seq_info *s = &ep->infos[i];
		G4WireSeq  *o = &ep->wire_seqs[i];

		o->request_id = s->user_tag;
		o->state = s->state;
		o->prompt_tokens = s->prompt_tokens;
		o->generated_tokens = s->generated_tokens;
		o->media_tokens = s->media_tokens;
		o->kv_blocks = s->kv_blocks;
		o->ttft = s->first_token_at > 0 ? s->first_token_at - s->submitted_at : -1.0;
		o->tokens_per_second = (s->generated_tokens > 1 && s->last_token_at > s->first_token_at) ?
			(s->generated_tokens - 1) / (s->last_token_at - s->first_token_at) : -1.0;
	}
	if (!g4p_put_frame(&ep->out, G4F_STATS, &w, sizeof(w), ep->wire_seqs, (size_t) n * sizeof(G4WireSeq)))
		out_of_memory(ep);
	ep->stats_dirty = false;
	ep->stats_at = now_seconds();
}

/*
 * The engine's progress report from inside a long step (this thread):
 * anything written counts as progress for the supervisor's watchdog.  Never
 * waits: a socket that takes nothing now means the supervisor is behind,
 * not this process, and the buffered bytes go with the step's next flush.
 * While frames are buffered they are what goes out, so at most one
 * heartbeat waits in the buffer.
 */
static void
send_heartbeat(void *ctx)
{
	EngineProc *ep = ctx;

	if (g4buf_pending(&ep->out) == 0 && !g4p_put_frame(&ep->out, G4F_HEARTBEAT, NULL, 0, NULL, 0))
		return;					/* no memory for 8 bytes: the next report tries again */
	if (g4p_write(ep->sock, &ep->out) < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
		_exit(EXIT_SOCKET);		/* the supervisor is gone */
}

/* Write everything buffered, waiting for the socket as needed. */
static void
flush_out(EngineProc *ep)
{
	while (g4buf_pending(&ep->out) > 0)
	{
		struct pollfd pfd;

		if (g4p_write(ep->sock, &ep->out) >= 0)
			continue;
		if (errno != EAGAIN && errno != EWOULDBLOCK)
			_exit(EXIT_SOCKET);			/* the supervisor is gone */
		pfd.fd = ep->sock;
		pfd.events = POLLOUT;
		pfd.revents = 0;
		if (poll(&pfd, 1, -1) < 0 && errno != EINTR)
			_exit(EXIT_SOCKET);
	}
}

static void
copy_str(char *dst, size_t size, const char *src)
{
	size_t		n = src ? strnlen(src, size - 1) : 0;

	if (n > 0)
		memcpy(dst, src, n);
	dst[n] = '\0';
}

static double
now_seconds(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double) ts.tv_sec + (double) ts.tv_nsec * 1e-9;
}
