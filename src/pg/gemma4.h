/*-------------------------------------------------------------------------
 *
 * gemma4.h
 *	  Shared declarations of the gemma4 PostgreSQL extension.
 *
 * Three kinds of process cooperate:
 *
 *	- backends run the SQL functions: they validate arguments, put each
 *	  request in its own DSM segment (header, prompt items, reply shm_mq)
 *	  and publish its handle in a slot of the fixed slot array that lives in
 *	  the main shared memory (queue.c);
 *	- the supervisor is the registered background worker (supervisor.c).
 *	  It never runs the engine: it forwards requests to the engine process,
 *	  relays events into the reply queues without ever blocking, publishes
 *	  the worker state and statistics, and restarts the engine process when
 *	  it dies;
 *	- the engine process (engine_proc.c) is forked by the supervisor.  It
 *	  dlopen()s libgemma4engine and runs it; after fork() it touches neither
 *	  shared memory nor PostgreSQL functions, and talks to the supervisor
 *	  over a socketpair with the length-prefixed frames of protocol.c.
 *
 * The wire structures below are shared by the supervisor and its forked
 * child, i.e. by one binary image, so they travel as raw structs.
 *
 * IDENTIFICATION
 *	  src/pg/gemma4.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef GEMMA4_H
#define GEMMA4_H

#include "postgres.h"

#include "datatype/timestamp.h"
#include "lib/stringinfo.h"
#include "port/atomics.h"
#include "storage/condition_variable.h"
#include "storage/dsm.h"
#include "storage/latch.h"
#include "storage/lwlock.h"
#include "storage/shm_mq.h"
#include "utils/array.h"
#include "utils/jsonb.h"

/* ---- GUCs (module.c) ---------------------------------------------------- */

extern char *g4_model_dir;
extern char *g4_draft_model_dir;
extern char *g4_model_alias;
extern int	g4_max_model_len;
extern double g4_gpu_memory_utilization;
extern int	g4_kv_cache_dtype;
extern int	g4_max_num_seqs;
extern int	g4_max_num_batched_tokens;
extern int	g4_num_speculative_tokens;
extern bool g4_speculative;		/* gemma4.speculative: sessions' default */
extern int	g4_speculative_max_batch;
extern int	g4_backend;
extern int	g4_cpu_threads;
extern int	g4_prepare_threads;
extern int	g4_max_requests;
extern int	g4_default_max_tokens;
extern int	g4_request_timeout;
/* prefix caching */
extern bool g4_enable_prefix_caching;
/* media */
extern int	g4_max_soft_tokens;
extern int	g4_max_image_pixels;
extern double g4_max_audio_seconds;

/* ---- input limits: what one call may ask of the shared engine ----------- */

extern int	g4_max_prompt_bytes;	/* gemma4.max_prompt_bytes, 0 = from the window */

/* Bytes of prompt text per token of the window when max_prompt_bytes is 0. */
#define G4_PROMPT_BYTES_PER_TOKEN	16
/* Stop strings of one request, and bytes (UTF-8) of each. */
#define G4_MAX_STOP_STRINGS		16
#define G4_MAX_STOP_BYTES		1024
/* Largest tokenizer reply (ids or text) the engine process sends. */
#define G4_MAX_REPLY			((size_t) 256 << 20)

extern int	g4_max_requests_per_role;	/* 0 = half of gemma4.max_requests */
extern int	g4_max_tokens_limit;	/* 0 = no limit but the window */
extern int	g4_max_queued_requests;
extern int	g4_queue_timeout;	/* ms a request may wait for a slot */
extern int	g4_engine_stall_timeout;	/* ms without engine progress, 0 = no watchdog */
extern int	g4_job_check_interval;	/* s between checks of the running jobs' workers */

/* gemma4.untranslatable_characters */
typedef enum
{
	G4_UNTRANSLATABLE_ERROR,	/* 22P05, PostgreSQL's conversion error */
	G4_UNTRANSLATABLE_REPLACE	/* '?' in its place */
} G4Untranslatable;
extern int	g4_untranslatable_characters;

/* encoding.c: the engine's UTF-8 as text in the database encoding */
extern char *g4_text_to_server(const char *utf8, Size len, Size *out_len);

extern int64 g4_prompt_bytes_limit(int window);
extern void g4_slot_freed(void);
extern void g4_check_prompt_bytes(int64 bytes, int64 limit, const char *what);

/* ---- request kinds and wire structures ---------------------------------- */

typedef enum G4RequestKind
{
	G4_KIND_CHAT = 0,			/* chat messages (gemma_generate, gemma_chat) */
	G4_KIND_TEXT = 1,			/* raw completion (gemma_complete) */
	G4_KIND_TOKENIZE = 2,
	G4_KIND_DETOKENIZE = 3
} G4RequestKind;

/* Item tags of a request's payload: a sequence of (tag, length, bytes, NUL). */
#define G4_ITEM_SYSTEM		0	/* chat roles, equal to the engine's g4_role */
#define G4_ITEM_USER		1
#define G4_ITEM_MODEL		2
#define G4_ITEM_PROMPT		16	/* raw prompt, or text to tokenize */
#define G4_ITEM_STOP		17	/* one stop string */
#define G4_ITEM_IDS			18	/* int32 token ids to detokenize */
/* media: raw file bytes, in prompt order.  A PART item is a content part of
 * the last message item (sent with empty content); a media part carries its
 * bytes and is also the next media item. */
#define G4_ITEM_IMAGE		19
#define G4_ITEM_AUDIO		20
#define G4_ITEM_PART_TEXT	21
#define G4_ITEM_PART_IMAGE	22
#define G4_ITEM_PART_AUDIO	23

/* What a request asks for; lives in the DSM header and in SUBMIT frames. */
typedef struct G4WireRequest
{
	uint64		request_id;
	int32		kind;			/* G4RequestKind */
	int32		max_tokens;		/* 0 = up to the window */
	int32		max_tokens_cap; /* with max_tokens 0: at most this many (0 = none) */
	float		temperature;
	float		top_p;
	float		min_p;
	float		repetition_penalty;
	float		presence_penalty;
	float		frequency_penalty;
	int32		top_k;
	int32		has_seed;
	uint64		seed;
	int32		thinking;
	uint32		items_len;		/* bytes of payload items that follow */
	/* media */
	int32		max_soft_tokens;
	int64		max_image_pixels;
	double		max_audio_seconds;
	/* mtp */
	int32		disable_speculative;	/* 1: no drafting for this request */
	/* special-token text in the content is parsed as control tokens */
	int32		allow_control_tokens;
} G4WireRequest;

#define G4_MSG_LEN 1024

typedef struct G4WireError
{
	uint64		request_id;
	int32		code;			/* engine g4_status, or a G4_ERR_PG_* below */
	char		msg[G4_MSG_LEN];
} G4WireError;

/* Errors that do not come from the engine itself. */
#define G4_ERR_PG_NOT_READY		(-100)	/* engine not ready */
#define G4_ERR_PG_ENGINE_DIED	(-101)	/* engine process died */
#define G4_ERR_PG_SHUTDOWN		(-102)	/* supervisor is stopping */
#define G4_ERR_PG_TIMEOUT		(-103)	/* gemma4.request_timeout passed */

typedef struct G4WireText
{
	uint64		request_id;
	int32		channel;		/* g4_channel */
} G4WireText;

typedef struct G4WireFinish
{
	uint64		request_id;
	int32		reason;			/* g4_finish_reason */
	int32		prompt_tokens;
	int32		completion_tokens;
} G4WireFinish;

typedef struct G4WireReady
{
	char		architecture[96];
	char		family[16];
	char		version[32];
	int32		n_layers;
	int32		max_model_len;
	int64		n_params;
} G4WireReady;

typedef struct G4WireKvGroup
{
	char		name[16];
	int32		layers;
	int32		block_tokens;
	int64		blocks_total;
	int64		blocks_used;
	uint64		block_bytes;
	/* prefix caching */
	int64		blocks_cached;
	uint64		prefix_lookups;
	uint64		prefix_hits;
} G4WireKvGroup;

/* Draft positions counted per position: the engine's G4_SPEC_MAX_TOKENS
 * (engine_proc.c checks that they agree). */
#define G4_WIRE_SPEC_POSITIONS 16

/* Uses of the device's memory (g4_memory_get): the engine's
 * G4_MEMORY_USES_MAX (engine_proc.c checks that they agree). */
#define G4_WIRE_MEMORY_USES 24

typedef struct G4WireMemoryUse
{
	char		what[48];
	uint64		bytes;
} G4WireMemoryUse;

/* Engine statistics (g4_stats_get) with the strings copied in. */
typedef struct G4WireStats
{
	char		backend[16];
	char		device[128];
	char		kv_dtype[24];
	int32		n_groups;
	G4WireKvGroup groups[2];
	uint64		kv_bytes_total;
	uint64		weight_bytes;
	uint64		workspace_bytes;
	int32		live_seqs;
	int32		max_num_seqs;
	int64		fit_full_context;
	uint64		steps;
	uint64		tokens_prefilled;
	uint64		tokens_generated;
	uint64		batch_tokens_max;
	uint64		batch_seqs_max;
	uint64		batch_seqs_sum;
	uint64		spec_drafted;
	uint64		spec_accepted;
	uint64		preemptions;
	/* prefix caching */
	uint64		prefix_hit_tokens;	/* prompt tokens found computed, not prefilled */
	/* media */
	uint64		images;
	double		audio_seconds;
	double		media_decode_seconds;
	double		media_embed_seconds;
	int32		n_seqs;			/* G4WireSeq entries following in the frame */
	/* mtp: speculative decoding (see g4_stats) */
	int32		spec_k;
	int32		spec_max_batch;
	uint64		spec_verify_steps;
	uint64		spec_pos_drafted[G4_WIRE_SPEC_POSITIONS];
	uint64		spec_pos_accepted[G4_WIRE_SPEC_POSITIONS];
	/* where the memory went */
	int32		n_memory;
	G4WireMemoryUse memory[G4_WIRE_MEMORY_USES];
} G4WireStats;

/* One live sequence (g4_seqs_get), durations already computed. */
typedef struct G4WireSeq
{
	uint64		request_id;
	int32		state;			/* g4_seq_state */
	int32		prompt_tokens;
	int32		generated_tokens;
	int32		kv_blocks;
	double		ttft;			/* seconds to first token, < 0 if none yet */
	double		tokens_per_second;	/* decode rate, < 0 if unknown */
	int32		media_tokens;	/* image and audio soft tokens of the prompt */
} G4WireSeq;

/* Frame types.  S: supervisor to engine process, E: the other way. */
typedef enum G4FrameType
{
	G4F_SUBMIT = 1,				/* S: G4WireRequest + items */
	G4F_CANCEL,					/* S: uint64 request id */
	G4F_READY,					/* E: G4WireReady, model loaded */
	G4F_LOAD_FAILED,			/* E: G4WireError, then the process exits */
	G4F_TEXT,					/* E: G4WireText + UTF-8 bytes */
	G4F_IDS,					/* E: uint64 request id + int32 ids */
	G4F_FINISH,					/* E: G4WireFinish */
	G4F_ERROR,					/* E: G4WireError */
	G4F_STATS,					/* E: G4WireStats + G4WireSeq[n_seqs] */
	G4F_FATAL,					/* E: G4WireError, then the process exits */
	G4F_HEARTBEAT				/* E: no body; a long step is still working */
} G4FrameType;

/* A frame on the socket: this header, then len bytes of body. */
typedef struct G4FrameHeader
{
	uint32		len;
	uint32		type;
} G4FrameHeader;

/* Largest frame body accepted (a prompt is at most a 1 GB text). */
#define G4_MAX_FRAME	((uint32) 0x48000000)

/* ---- protocol.c: buffers, frames and payload items (libc only) ---------- */

/* A growable byte buffer, consumed from the front. */
typedef struct G4Buf
{
	char	   *data;
	size_t		off;			/* first unconsumed byte */
	size_t		len;			/* bytes in use, including consumed ones */
	size_t		cap;
} G4Buf;

/* Capacity an empty buffer keeps; a larger one is freed when it empties. */
#define G4_BUF_KEEP		((size_t) 4 << 20)

extern void g4buf_consume(G4Buf *b, size_t n);
extern void g4buf_free(G4Buf *b);
extern void g4buf_shrink(G4Buf *b);
#define g4buf_pending(b) ((b)->len - (b)->off)

extern bool g4p_put_frame(G4Buf *out, uint32 type, const void *head, size_t head_len,
						  const void *tail, size_t tail_len);
extern int	g4p_next_frame(G4Buf *in, uint32 *type, const char **body, size_t *len);
extern ssize_t g4p_read(int fd, G4Buf *in);
extern ssize_t g4p_write(int fd, G4Buf *out);

extern size_t g4p_item_size(size_t len);
extern char *g4p_item_put(char *dst, int32 tag, const void *data, uint32 len);
extern bool g4p_item_next(const char **pos, const char *end, int32 *tag,
						  const char **data, uint32 *len);

/* ---- shared memory (shmem.c) -------------------------------------------- */

typedef enum G4WorkerState
{
	G4W_STARTING = 0,			/* supervisor up, engine not yet forked */
	G4W_LOADING,				/* engine process loading the model */
	G4W_READY,
	G4W_FAILED,					/* the model could not be loaded */
	G4W_RESTARTING,				/* engine died; waiting to restart it */
	G4W_STOPPED,				/* supervisor not running */
	G4W_STALLED					/* safety: no engine progress with work queued; being killed */
} G4WorkerState;

typedef enum G4SlotState
{
	G4_SLOT_FREE = 0,
	G4_SLOT_SUBMITTED,			/* handle published by a backend */
	G4_SLOT_RUNNING				/* the supervisor owns it now */
} G4SlotState;

/* One submission slot.  Protected by G4Shared.lock. */
typedef struct G4Slot
{
	G4SlotState state;
	bool		cancel;			/* the backend gave up on a RUNNING request */
	bool		finished;		/* the engine is done, replies still queued */
	int32		kind;
	int			pid;			/* the backend */
	Oid			role;			/* safety: the role that submitted it */
	uint64		request_id;
	dsm_handle	handle;
	TimestampTz submitted_at;
} G4Slot;

/* A backend waiting for a request slot (safety). */
typedef struct G4Waiter
{
	Oid			role;
	uint64		ticket;			/* arrival order */
} G4Waiter;

/* Most requests that may wait for a slot at once. */
#define G4_MAX_WAITING	256

#define G4_REASON_LEN 1024
#define G4_HINT_LEN 512

typedef struct G4Shared
{
	LWLock	   *lock;			/* protects everything below but the atomic */
	pg_atomic_uint64 next_request_id;

	/* the supervisor and its engine process */
	int			supervisor_pid;
	Latch	   *supervisor_latch;
	uint32		supervisor_generation;
	int			engine_pid;
	G4WorkerState state;
	TimestampTz state_since;
	TimestampTz ready_since;
	char		reason[G4_REASON_LEN];
	char		hint[G4_HINT_LEN];
	char		model_path[MAXPGPATH];
	G4WireReady model;

	/* counters kept by the supervisor over every engine incarnation */
	uint64		requests;
	uint64		finished;
	uint64		errors;
	uint64		cancelled;
	uint64		engine_restarts;
	G4WireStats base;			/* sums of the engine incarnations that died */
	G4WireStats stats;			/* latest snapshot of the current engine */
	bool		have_stats;

	/* live sequences of the latest snapshot */
	int			n_seqs;
	G4WireSeq  *seqs;			/* max_requests entries, after the slots */

	/* safety: requests waiting for a slot (queue.c) */
	ConditionVariable slot_freed;	/* broadcast whenever a slot is freed */
	uint64		next_ticket;
	int			n_waiting;
	G4Waiter	waiting[G4_MAX_WAITING];

	int			n_slots;
	G4Slot		slots[FLEXIBLE_ARRAY_MEMBER];
} G4Shared;

extern G4Shared *g4_shared;

extern void g4_shmem_install_hooks(void);
extern const char *g4_state_name(G4WorkerState state);
extern void g4_require_shared(void);
extern int	g4_require_ready(void);
extern void g4_set_state(G4WorkerState state, const char *reason, const char *hint);

/* ---- the request in its DSM segment (queue.c) --------------------------- */

#define G4_REQ_MAGIC	0x47344451	/* "G4DQ" */
#define G4_TOC_MAGIC	0x47345443
#define G4_KEY_HEADER	1
#define G4_KEY_ITEMS	2
#define G4_KEY_QUEUE	3
#define G4_QUEUE_SIZE	((Size) 65536)

typedef enum G4Result
{
	G4_RESULT_PENDING = 0,
	G4_RESULT_OK,
	G4_RESULT_ERROR
} G4Result;

/* Reply queue message kinds (first byte of each shm_mq message). */
#define G4_MQ_CONTENT	'c'
#define G4_MQ_REASONING 'r'
#define G4_MQ_IDS		'i'

/*
 * The header of a request's segment.  The backend fills req; the supervisor
 * writes the outcome before it detaches from the reply queue, so a backend
 * reads it only after seeing the queue detached.
 */
typedef struct G4ReqHeader
{
	uint32		magic;
	int			slot;
	G4WireRequest req;
	/* outcome */
	int32		result;			/* G4Result */
	int32		finish_reason;
	int32		prompt_tokens;
	int32		completion_tokens;
	G4WireError error;
} G4ReqHeader;

/* Backend side of one request. */
typedef struct G4Request
{
	dsm_segment *seg;			/* NULL once detached */
	shm_mq_handle *mqh;
	G4ReqHeader *hdr;
	int			slot;
	uint64		request_id;
	uint32		supervisor_generation;
	TimestampTz deadline;		/* gemma4.request_timeout, 0 = none */
	int			timeout_ms;
	bool		answered;		/* the supervisor wrote the outcome and let go */
	bool		lost_seen;		/* its slot was seen freed once already */
	G4WireError failure;		/* why it failed (G4_POLL_FAILED) */
	const char *failure_hint;	/* NULL: the hint for failure.code */
} G4Request;

typedef enum G4PollResult
{
	G4_POLL_NOTHING = 0,		/* nothing new yet */
	G4_POLL_MESSAGE,			/* a reply message */
	G4_POLL_DONE,				/* ended well, outcome in hdr */
	G4_POLL_FAILED				/* ended with r->failure */
} G4PollResult;

extern G4Request *g4_request_start(G4WireRequest *req, const char *items, Size items_len);
extern G4Request *g4_request_try_start(G4WireRequest *req, const char *items, Size items_len);
extern int	g4_role_slots_left(void);
extern G4PollResult g4_request_poll(G4Request *r, char *kind, const char **data, Size *len);
extern long g4_request_wait_ms(G4Request *r);
extern void g4_request_raise(G4Request *r) pg_attribute_noreturn();
extern bool g4_request_next(G4Request *r, char *kind, const char **data, Size *len);
extern void g4_request_finish(G4Request *r);
extern int	g4_sqlstate_for(int code);

/* ---- supervisor and engine process -------------------------------------- */

/* What the engine process needs, prepared before fork(). */
typedef struct G4EngineConfig
{
	char		library[MAXPGPATH];
	char		model_path[MAXPGPATH];
	char		draft_model_path[MAXPGPATH];
	int			backend;		/* g4_backend_kind */
	int			threads;
	int			prepare_threads;	/* gemma4.prepare_threads, 0 = from the cores */
	int			max_model_len;
	double		gpu_memory_utilization;
	int			kv_dtype;		/* g4_kv_dtype */
	int			max_num_seqs;
	int			max_num_batched_tokens;
	int			num_speculative_tokens;
	int			speculative_max_batch;	/* mtp: gemma4.speculative_max_batch */
	int			max_requests;
	pid_t		supervisor_pid;
	/* prefix caching */
	bool		enable_prefix_caching;
} G4EngineConfig;

extern PGDLLEXPORT void gemma4_supervisor_main(Datum arg);
extern void g4_engine_proc_main(int sock, const G4EngineConfig *cfg) pg_attribute_noreturn();

/* ---- table jobs (job.c, job_worker.c, generate.c) ---------------------- */

/* A job's request for one row (chat, or raw completion); images and audio
 * are bytea[] (NULL: none). */
extern void g4_build_job_request(G4WireRequest *req, StringInfo items, bool completion,
								 const char *system, const char *prompt, ArrayType *images,
								 ArrayType *audio, Jsonb *options, int window);
/* An answer's UTF-8 bytes as text in the database encoding. */
extern text *g4_answer_text(const char *utf8, Size len);
/* Start the job launcher (the supervisor does, each time it starts). */
extern void g4_jobs_start_launcher(void);

#endif							/* GEMMA4_H */
