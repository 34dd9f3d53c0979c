/*
 * engine.h — the public API of the Gemma 4 engine (libgemma4engine).
 *
 * One engine instance owns a model, its tokenizer, a paged KV pool and a
 * scheduler.  The caller submits requests, then repeatedly calls g4_step(),
 * which runs one batched forward pass over every live sequence and reports
 * what happened through a callback (text pieces, finishes, errors).
 *
 * The API is single-threaded from the caller's point of view: every function
 * taking a g4_engine must be called from the same thread.  The engine may use
 * worker threads internally (CPU backend), but callbacks always run on the
 * caller's thread, inside g4_step() or g4_cancel().
 *
 * Nothing here depends on PostgreSQL or CUDA.
 */
#ifndef G4_ENGINE_H
#define G4_ENGINE_H

#include <stddef.h>
#include <stdint.h>
#ifdef __cplusplus
extern "C++" {				/* included from within extern "C" blocks */
#include <atomic>
}
#else
#include <stdatomic.h>
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---- errors ---------------------------------------------------------- */

typedef enum
{
	G4_OK = 0,
	G4_ERR_INVALID = -1,		/* bad argument or input: caller's to fix */
	G4_ERR_TOO_LONG = -2,		/* exceeds the context window / can never fit */
	G4_ERR_NOMEM = -3,			/* host or device memory exhausted */
	G4_ERR_IO = -4,				/* file missing, unreadable or truncated */
	G4_ERR_FORMAT = -5,			/* malformed file, missing tensor, bad shape */
	G4_ERR_UNSUPPORTED = -6,	/* dtype / architecture / feature not supported */
	G4_ERR_BACKEND = -7,		/* compute device failure */
	G4_ERR_CANCELLED = -8,
	G4_ERR_INTERNAL = -9,
	G4_ERR_BUSY = -10,			/* no capacity now (retry later) */
	G4_ERR_NUMERIC = -11		/* the model produced a non-finite value (a NaN
								 * logit): its weights or the computation are
								 * broken, not the request */
} g4_status;

typedef struct
{
	int			code;			/* a g4_status */
	char		msg[1024];
} g4_err;

const char *g4_status_name(int code);

/* ---- progress of a long call ------------------------------------------ */

/*
 * One step can take long and still be working: a large prefill chunk of a
 * big model on the CPU backend takes minutes, as may embedding a large
 * image or audio clip at submission.  An embedder that watches for hangs
 * hears of such a call through g4_options.progress: it is called inside
 * g4_step, g4_score and the submission of a request with media, on the
 * caller's thread (between layers of the forward pass, between media items
 * and audio chunks), once the call has run G4_PROGRESS_INTERVAL seconds and
 * then at most every G4_PROGRESS_INTERVAL.  Shorter calls never report.  It
 * must not call back into the engine.
 *
 * On the CUDA backend the forward pass only queues the device's work and
 * waits for it at the end of the step: reports then say the host is still
 * queueing, and the final wait sends none, so a device that hangs stays
 * silent (and a watchdog still sees it).
 */
typedef void (*g4_progress_fn) (void *ctx);

#define G4_PROGRESS_INTERVAL 0.1	/* seconds */

/* ---- options --------------------------------------------------------- */

typedef enum
{
	G4_BACKEND_AUTO = 0,
	G4_BACKEND_CPU = 1,
	G4_BACKEND_CUDA = 2
} g4_backend_kind;

typedef enum
{
	G4_KV_F32 = 0,				/* reference: exact, 4 bytes per element */
	G4_KV_BF16 = 1,
	G4_KV_TURBOQUANT_K8V4 = 2
} g4_kv_dtype;

typedef enum
{
	G4_MASK_A = 0,				/* transformers' default: image blocks OR'd on every layer */
	G4_MASK_B = 1				/* static path: full layers causal, window bounds blocks */
} g4_mask_variant;

typedef struct
{
	const char *model_path;		/* directory (safetensors) or a .gguf file */
	const char *draft_model_path;	/* MTP assistant, may be NULL */
	int			backend;		/* g4_backend_kind */
	int			threads;		/* CPU threads; 0 = all cores */
	int			max_model_len;	/* 0 = the model's max_position_embeddings */
	double		gpu_memory_utilization; /* fraction of device memory to use */
	size_t		kv_pool_bytes;	/* CPU backend: KV pool size; 0 = default */
	int			kv_dtype;		/* g4_kv_dtype */
	int			max_num_seqs;
	int			max_num_batched_tokens;
	int			num_speculative_tokens;
	int			mask_variant;	/* g4_mask_variant */
	int			verbose;		/* log loading progress to stderr */
	g4_progress_fn progress;	/* progress of long calls (see above), may be NULL */
	void	   *progress_ctx;
	/* prefix caching */
	int			enable_prefix_caching;	/* share the KV blocks of common prompt prefixes (default 1) */
	/* mtp: speculative decoding with draft_model_path */
	int			spec_max_batch; /* no drafting while more sequences decode
								 * (G4_SPEC_MAX_BATCH_DEFAULT) */
	int			bench_force_accept; /* benchmarks only: -1 (default) verifies;
									 * a >= 0 accepts exactly min(a, drafts)
									 * drafts whatever the target says, so
									 * the output is no longer the model's */
} g4_options;

/* Most tokens drafted per step (num_speculative_tokens is capped here). */
#define G4_SPEC_MAX_TOKENS 16
/* Decoding sequences above which drafting stops paying: the verify step's
 * k + 1 rows per sequence turn a bandwidth-bound decode into a
 * compute-bound one.  The engine's one stopping rule (and the default of
 * gemma4.speculative_max_batch), from `test/gpu/run-gpu.sh crossover` on
 * the 12B shape (test/bench/RESULTS.md, run 32): at the published ~1.4
 * accepted drafts per step (between a = 1 and a = 2) drafting gains 1.1-1.6x
 * at batch 1 and breaks even at 16 (0.82x / 1.22x), then loses. */
#define G4_SPEC_MAX_BATCH_DEFAULT 16

/* Fill with the defaults (the seed deployment's tunables). */
void		g4_options_default(g4_options *o);

/* ---- requests -------------------------------------------------------- */

typedef struct
{
	float		temperature;	/* 0 = greedy */
	int			top_k;			/* 0 = off */
	float		top_p;			/* 1 = off; must be in (0, 1] */
	float		min_p;			/* 0 = off */
	float		repetition_penalty; /* 1 = off */
	float		presence_penalty;
	float		frequency_penalty;
	uint64_t	seed;
	int			has_seed;		/* 0: seed drawn from the engine */
} g4_sampling;

void		g4_sampling_default(g4_sampling *s);

typedef enum
{
	G4_ROLE_SYSTEM = 0,
	G4_ROLE_USER = 1,
	G4_ROLE_MODEL = 2
} g4_role;

typedef enum
{
	G4_PART_TEXT = 0,
	G4_PART_IMAGE = 1,			/* rendered as the image placeholder */
	G4_PART_AUDIO = 2
} g4_part_kind;

/* One item of a multimodal message.  For media, n_soft_tokens is the number
 * of soft tokens the item expands to (known once the media is embedded). */
typedef struct
{
	int			kind;			/* g4_part_kind */
	const char *text;			/* G4_PART_TEXT, UTF-8 */
	int			n_soft_tokens;	/* G4_PART_IMAGE / G4_PART_AUDIO */
} g4_content_part;

typedef struct
{
	int			role;			/* g4_role */
	const char *content;		/* UTF-8; used when parts is NULL */
	const g4_content_part *parts;	/* optional list of content items */
	int			n_parts;
} g4_message;

typedef enum
{
	G4_INPUT_TEXT = 0,			/* raw completion: prompt text, BOS prepended */
	G4_INPUT_CHAT = 1,			/* chat messages, model's chat format applied */
	G4_INPUT_TOKENS = 2			/* token ids used verbatim */
} g4_input_kind;

/* ---- media (images and audio as raw file bytes) ---- */
typedef enum
{
	G4_MEDIA_IMAGE = 0,			/* PNG, JPEG, WebP, GIF (first frame) */
	G4_MEDIA_AUDIO = 1			/* WAV, FLAC, MP3, Ogg Vorbis */
} g4_media_kind;

typedef struct
{
	int			kind;			/* g4_media_kind */
	const uint8_t *data;		/* the file's bytes */
	size_t		len;
} g4_media;

typedef struct
{
	int			input_kind;		/* g4_input_kind */
	const char *prompt;			/* G4_INPUT_TEXT */
	const g4_message *messages; /* G4_INPUT_CHAT */
	int			n_messages;
	int			enable_thinking;	/* G4_INPUT_CHAT */
	const int32_t *tokens;		/* G4_INPUT_TOKENS */
	int			n_tokens;

	int			max_tokens;		/* 0 = up to the window */
	int			max_tokens_cap; /* with max_tokens 0: at most this many (0 = none) */
	g4_sampling sampling;
	const char *const *stop;	/* stop strings, may be NULL */
	int			n_stop;
	uint64_t	user_tag;		/* opaque, echoed in stats */

	/* media: each <|image|> / <|audio|> in the prompt text (or image/audio
	 * part of a message) takes the next item of its kind; with no placeholder at all
	 * the items go before the text of the last user message (chat) or right
	 * after BOS (raw text).  Each expands to begin + N soft tokens + end. */
	const g4_media *media;		/* in prompt order, may be NULL */
	int			n_media;
	int			max_soft_tokens;	/* per image: 70/140/280/560/1120; 0 = engine default (280) */
	int64_t		max_image_pixels;	/* decode limits; 0 = engine defaults */
	double		max_audio_seconds;
	/* speculative decoding */
	int			disable_speculative;	/* 1: no drafting for this request (0, the zero value, allows it) */
	/* untrusted text */
	int			allow_control_tokens;	/* 0 (default): special-token text inside prompt / message
										 * content is tokenised as plain text; 1: parsed as control tokens */
} g4_request;

/* ---- events ---------------------------------------------------------- */

typedef enum
{
	G4_EV_TEXT = 0,				/* a decoded piece of text */
	G4_EV_FINISH = 1,			/* the sequence ended; no more events for it */
	G4_EV_ERROR = 2				/* the sequence failed; no more events for it */
} g4_event_kind;

typedef enum
{
	G4_FINISH_STOP = 0,			/* EOS token or stop string */
	G4_FINISH_LENGTH = 1,		/* max_tokens or the window reached */
	G4_FINISH_CANCELLED = 2
} g4_finish_reason;

typedef enum
{
	G4_CHANNEL_CONTENT = 0,
	G4_CHANNEL_REASONING = 1	/* text inside the model's thought channel */
} g4_channel;

typedef struct
{
	int			kind;			/* g4_event_kind */
	uint64_t	seq_id;
	/* G4_EV_TEXT */
	const char *text;			/* valid only during the callback */
	size_t		text_len;
	int			channel;		/* g4_channel */
	/* G4_EV_FINISH */
	int			finish_reason;
	int			prompt_tokens;
	int			completion_tokens;
	/* G4_EV_ERROR */
	int			error_code;
	const char *error_msg;
} g4_event;

typedef void (*g4_event_fn) (void *ctx, const g4_event *ev);

/* ---- statistics ------------------------------------------------------ */

typedef struct
{
	const char *name;			/* "sliding" or "full" */
	int			layers;
	int			block_tokens;	/* tokens per block */
	int64_t		blocks_total;
	int64_t		blocks_used;
	size_t		block_bytes;	/* bytes of one block over all layers of the group */
	/* prefix caching */
	int64_t		blocks_cached;	/* blocks findable by content, in use or free */
	uint64_t	prefix_lookups; /* blocks asked of the cache at admissions */
	uint64_t	prefix_hits;	/* blocks it supplied */
} g4_kv_group_stats;

typedef struct
{
	const char *backend;		/* "cpu" or "cuda" */
	const char *device;			/* human-readable device name */
	const char *kv_dtype;
	int			n_groups;
	g4_kv_group_stats groups[2];
	size_t		kv_bytes_total;
	size_t		weight_bytes;	/* model weights resident on the device (the
								 * draft model's included) */
	size_t		workspace_bytes;	/* activations (the draft model's included),
									 * and what the backend holds
									 * for itself (scratch, dequantised weight
									 * copies, library workspaces) */
	size_t		device_bytes_total; /* device memory size (0 on CPU) */
	int			live_seqs;
	int			waiting_seqs;
	int			max_num_seqs;
	int			max_model_len;
	int64_t		fit_full_context;	/* more sequences of max_model_len that fit now */
	/* cumulative */
	uint64_t	steps;
	uint64_t	tokens_prefilled;
	uint64_t	tokens_generated;
	uint64_t	requests_finished;
	uint64_t	requests_failed;
	uint64_t	batch_tokens_max;
	uint64_t	batch_seqs_max;
	uint64_t	batch_seqs_sum; /* over steps: mean batch = sum / steps */
	uint64_t	spec_drafted;
	uint64_t	spec_accepted;
	uint64_t	preemptions;	/* sequences evicted to free KV blocks (recomputed later) */
	/* prefix caching */
	uint64_t	prefix_query_tokens;	/* prompt tokens of admitted sequences */
	uint64_t	prefix_hit_tokens;	/* of those, found computed in the cache (not prefilled) */
	/* media */
	uint64_t	images;			/* images decoded and embedded */
	double		audio_seconds;	/* audio decoded and embedded */
	double		media_decode_seconds;	/* decoding and preprocessing */
	double		media_embed_seconds;	/* embedder forward passes */
	/* mtp: speculative decoding (spec_drafted / spec_accepted above count
	 * every draft position) */
	int			spec_k;			/* num_speculative_tokens in force (0: off) */
	int			spec_max_batch; /* drafting stops above this many decoding sequences */
	uint64_t	spec_verify_steps;	/* sequence-steps that verified drafts */
	uint64_t	spec_pos_drafted[G4_SPEC_MAX_TOKENS];	/* per draft position */
	uint64_t	spec_pos_accepted[G4_SPEC_MAX_TOKENS];
	uint64_t	spec_draft_steps;	/* assistant forward passes (one per draft position, whole batch) */
	uint64_t	spec_draft_tokens;	/* rows they computed */
	double		spec_draft_seconds; /* wall time spent drafting */
} g4_stats;

typedef enum
{
	G4_SEQ_WAITING = 0,			/* queued, not yet admitted */
	G4_SEQ_PREFILL = 1,
	G4_SEQ_DECODE = 2
} g4_seq_state;

typedef struct
{
	uint64_t	seq_id;
	uint64_t	user_tag;
	int			state;			/* g4_seq_state */
	int			prompt_tokens;
	int			prefilled_tokens;
	int			generated_tokens;
	int			kv_blocks;
	double		submitted_at;	/* g4_now() clock */
	double		first_token_at; /* 0 until the first token */
	double		last_token_at;
	/* media */
	int			media_tokens;	/* image and audio soft tokens in the prompt */
} g4_seq_info;

/* ---- the engine ------------------------------------------------------ */

typedef struct g4_engine g4_engine;

int			g4_open(const g4_options *opts, g4_engine **out, g4_err *err);
void		g4_close(g4_engine *e);

/* Model facts (valid for the engine's life). */
typedef struct
{
	const char *architecture;	/* e.g. "Gemma4UnifiedForConditionalGeneration" */
	const char *family;			/* "gemma4" or "gemma3" */
	int			vocab_size;
	int			n_layers;
	int			hidden_size;
	int			max_model_len;
	int64_t		n_params;
} g4_model_info;

void		g4_model_info_get(const g4_engine *e, g4_model_info *info);

/* Tokenizer access.  ids/text are malloc'd; free with free(). */
int			g4_tokenize(g4_engine *e, const char *text, size_t len, int add_bos,
						int32_t **ids, int *n_ids, g4_err *err);
int			g4_detokenize(g4_engine *e, const int32_t *ids, int n_ids,
						  char **text, size_t *len, g4_err *err);

/* Queue a request.  Validates it fully (bad sampling values, prompt longer
 * than the window, a request that can never fit the KV pool) and fails with
 * a precise message rather than queueing something that cannot run.
 * = g4_prepare (no cancel) + g4_submit_prepared. */
int			g4_submit(g4_engine *e, const g4_request *req, uint64_t *seq_id,
					  g4_err *err);

/* ---- off-loop request preparation (safety) ----
 * Everything submission does that needs no scheduler or device:
 * tokenisation, chat formatting, validation.  Thread-safe: may run on any
 * thread, concurrently with g4_step and other g4_prepare calls.  When cancel
 * is not NULL it is polled; a non-zero value stops the work with
 * G4_ERR_CANCELLED.  The request's strings need not outlive the call. */
typedef struct g4_prepared g4_prepared;
/* A request's cancel flag: set by one thread, polled by the one preparing
 * (C++ sees the header through the CUDA backend's includes). */
#ifdef __cplusplus
typedef std::atomic_int g4_cancel_flag;
#else
typedef atomic_int g4_cancel_flag;
#endif
int			g4_prepare(g4_engine *e, const g4_request *req, const g4_cancel_flag *cancel,
					   g4_prepared **out, g4_err *err);
/* Queue a prepared request (engine thread only); takes ownership of p in
 * every case. */
int			g4_submit_prepared(g4_engine *e, g4_prepared *p, uint64_t *seq_id, g4_err *err);
void		g4_prepared_free(g4_prepared *p);

/* Cancel a sequence: its KV blocks are freed before this returns and a
 * G4_EV_FINISH with G4_FINISH_CANCELLED is delivered.  Unknown ids are
 * ignored. */
void		g4_cancel(g4_engine *e, uint64_t seq_id, g4_event_fn fn, void *ctx);

/* Run one scheduler step.  Returns the number of sequences still live
 * (running or waiting) or a negative g4_status on an engine-wide failure;
 * in that case every live sequence has received a G4_EV_ERROR.
 * G4_ERR_BACKEND (also when the backend is still failed after another
 * failure) means the engine cannot go on: close it and open a new one.
 * A sequence whose logits row holds a NaN gets a G4_EV_ERROR with
 * G4_ERR_NUMERIC (its KV blocks released) and the others go on. */
int			g4_step(g4_engine *e, g4_event_fn fn, void *ctx, g4_err *err);

/* True when g4_step has work to do. */
int			g4_has_work(const g4_engine *e);

void		g4_stats_get(const g4_engine *e, g4_stats *st);

/* One use of the device's memory (host memory on the CPU backend). */
typedef struct
{
	const char *what;			/* static text */
	size_t		bytes;
} g4_memory_use;

#define G4_MEMORY_USES_MAX 24

/* Where the memory went: every buffer the engine and its backend hold, by
 * use (weights, the KV pool's blocks and tables, activations, the
 * backend's own buffers); uses of 0 bytes left out.  Returns how many,
 * at most max. */
int			g4_memory_get(const g4_engine *e, g4_memory_use *out, int max);

/* Per-sequence snapshot; returns how many were written (at most max). */
int			g4_seqs_get(const g4_engine *e, g4_seq_info *out, int max);

/* ---- scoring (teacher forcing) ---------------------------------------- */

/* Receives the logits (after the final soft-cap) computed at position pos:
 * the model's prediction of the token at pos + 1.  The row is valid only
 * during the call. */
typedef void (*g4_logits_fn) (void *ctx, int pos, const float *logits, int vocab);

/*
 * Run the model over ids[0..n) as one fresh sequence, exactly as a request
 * with that prompt would be prefilled (same chunking limits, masks and KV
 * dtype), and hand fn the logits of every position p >= first_logit, in
 * order.  Needs an idle engine (no live request: G4_ERR_BUSY otherwise); the
 * sequence's KV blocks are released before it returns.  A row holding a NaN
 * is never handed out: the call fails there with G4_ERR_NUMERIC, naming the
 * position.  For perplexity, KL divergence between KV dtypes and retrieval
 * checks.
 */
int			g4_score(g4_engine *e, const int32_t *ids, int n, int first_logit, g4_logits_fn fn, void *ctx,
					 g4_err *err);

/* Library version string. */
const char *g4_version(void);

#ifdef __cplusplus
}
#endif

#endif
