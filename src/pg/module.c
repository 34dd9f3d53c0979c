/*-------------------------------------------------------------------------
 *
 * module.c
 *	  Module entry point: configuration parameters, shared memory hooks and
 *	  the registration of the supervisor background worker.
 *
 * The parameters that shape the engine (model, window, KV pool, batch
 * limits, backend) mirror the vLLM tunables of the deployment this
 * extension replaces, with the same defaults.  They are PGC_POSTMASTER and
 * exist only when the library is loaded through shared_preload_libraries,
 * because only then is there a worker to use them.  Session defaults
 * (gemma4.default_max_tokens, gemma4.request_timeout) exist in any case.
 *
 * IDENTIFICATION
 *	  src/pg/module.c
 *
 *-------------------------------------------------------------------------
 */
#include "gemma4.h"

#include <limits.h>

#include "engine.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "postmaster/bgworker.h"
#include "utils/guc.h"

PG_MODULE_MAGIC;

char	   *g4_model_dir = NULL;
char	   *g4_draft_model_dir = NULL;
char	   *g4_model_alias = NULL;
int			g4_max_model_len = 262144;
double		g4_gpu_memory_utilization = 0.95;
int			g4_kv_cache_dtype = G4_KV_TURBOQUANT_K8V4;
int			g4_max_num_seqs = 16;
int			g4_max_num_batched_tokens = 16384;
int			g4_num_speculative_tokens = 4;
bool		g4_speculative = true;
int			g4_speculative_max_batch = G4_SPEC_MAX_BATCH_DEFAULT;
int			g4_backend = G4_BACKEND_AUTO;
int			g4_cpu_threads = 0;
int			g4_prepare_threads = 0;
int			g4_max_requests = 64;
int			g4_default_max_tokens = 1024;
int			g4_request_timeout = 0;
/* prefix caching */
bool		g4_enable_prefix_caching = true;
int			g4_max_soft_tokens = 280;
int			g4_max_image_pixels = 89478485;
double		g4_max_audio_seconds = 600.0;
int			g4_max_prompt_bytes = 0;
int			g4_max_requests_per_role = 0;
int			g4_max_tokens_limit = 0;
int			g4_max_queued_requests = 64;
int			g4_queue_timeout = 30000;
int			g4_engine_stall_timeout = 60000;
int			g4_job_check_interval = 60;
int			g4_untranslatable_characters = G4_UNTRANSLATABLE_ERROR;

static const struct config_enum_entry kv_cache_dtype_options[] = {
	{"bf16", G4_KV_BF16, false},
	{"turboquant_k8v4", G4_KV_TURBOQUANT_K8V4, false},
	{"f32", G4_KV_F32, false},
	{NULL, 0, false}
};

static const struct config_enum_entry untranslatable_options[] = {
	{"error", G4_UNTRANSLATABLE_ERROR, false},
	{"replace", G4_UNTRANSLATABLE_REPLACE, false},
	{NULL, 0, false}
};

static const struct config_enum_entry backend_options[] = {
	{"auto", G4_BACKEND_AUTO, false},
	{"cuda", G4_BACKEND_CUDA, false},
	{"cpu", G4_BACKEND_CPU, false},
	{NULL, 0, false}
};

void		_PG_init(void);

static void define_session_gucs(void);
static bool check_soft_tokens(int *newval, void **extra, GucSource source);
static bool check_stall_timeout(int *newval, void **extra, GucSource source);
static void define_server_gucs(void);
static void register_supervisor(void);

void
_PG_init(void)
{
	define_session_gucs();

	/*
	 * Loaded on demand by a backend (no preload): the SQL functions report
	 * that the worker is missing, there is nothing else to set up.
	 */
	if (!process_shared_preload_libraries_in_progress)
	{
		MarkGUCPrefixReserved("gemma4");
		return;
	}

	define_server_gucs();
	MarkGUCPrefixReserved("gemma4");

	g4_shmem_install_hooks();

	/* pg_upgrade starts the server with preloaded libraries: run nothing */
	if (!IsBinaryUpgrade)
		register_supervisor();
}

static void
define_session_gucs(void)
{
	DefineCustomIntVariable("gemma4.default_max_tokens",
							"Tokens to generate when a call passes no max_tokens.",
							"0 means up to the end of the context window.",
							&g4_default_max_tokens,
							1024, 0, INT_MAX,
							PGC_USERSET, 0,
							NULL, NULL, NULL);

	DefineCustomEnumVariable("gemma4.untranslatable_characters",
							 "What becomes of a generated character the database encoding cannot hold.",
							 "error fails the call (22P05); replace writes '?' in its place.",
							 &g4_untranslatable_characters,
							 G4_UNTRANSLATABLE_ERROR, untranslatable_options,
							 PGC_USERSET, 0,
							 NULL, NULL, NULL);

	/* superuser-set (or ALTER ROLE ... SET by a superuser): a cap users cannot lift */
	DefineCustomIntVariable("gemma4.max_prompt_bytes",
							"Largest prompt one call may send, in bytes of UTF-8 text.",
							"Counts every message of a chat, the text of gemma_tokenize and four bytes per id of gemma_detokenize. "
							"0 means 16 bytes per token of the model's context window.",
							&g4_max_prompt_bytes,
							0, 0, INT_MAX,
							PGC_SUSET, GUC_UNIT_BYTE,
							NULL, NULL, NULL);

	/* per role: ALTER ROLE ... SET by a superuser */
	DefineCustomIntVariable("gemma4.max_requests_per_role",
							"Requests one role may have in flight at once.",
							"0 means half of gemma4.max_requests.",
							&g4_max_requests_per_role,
							0, 0, INT_MAX,
							PGC_SUSET, 0,
							NULL, NULL, NULL);

	DefineCustomIntVariable("gemma4.max_tokens_limit",
							"Largest max_tokens a call may ask for.",
							"0 means no limit but the context window.",
							&g4_max_tokens_limit,
							0, 0, INT_MAX,
							PGC_SUSET, 0,
							NULL, NULL, NULL);

	DefineCustomIntVariable("gemma4.max_queued_requests",
							"Requests that may wait for a free request slot at once.",
							"Beyond it a request fails at once.",
							&g4_max_queued_requests,
							64, 0, G4_MAX_WAITING,
							PGC_SIGHUP, 0,
							NULL, NULL, NULL);

	DefineCustomIntVariable("gemma4.queue_timeout",
							"Longest time a request waits for a free request slot.",
							"0 means it fails at once when no slot is free.",
							&g4_queue_timeout,
							30000, 0, INT_MAX,
							PGC_USERSET, GUC_UNIT_MS,
							NULL, NULL, NULL);

	DefineCustomIntVariable("gemma4.request_timeout",
							"Longest time a gemma4 request may run.",
							"The request is cancelled and its KV blocks freed when it runs longer. 0 disables the limit.",
							&g4_request_timeout,
							0, 0, INT_MAX,
							PGC_USERSET, GUC_UNIT_MS,
							NULL, NULL, NULL);

	/* media */
	DefineCustomIntVariable("gemma4.max_soft_tokens",
							"Soft tokens per image when a call passes no max_soft_tokens.",
							"One of 70, 140, 280, 560 or 1120; images are resized to fill this budget.",
							&g4_max_soft_tokens,
							280, 70, 1120,
							PGC_USERSET, 0,
							check_soft_tokens, NULL, NULL);

	/* superuser-set, as max_prompt_bytes: they protect the shared engine */
	DefineCustomIntVariable("gemma4.max_image_pixels",
							"Largest image (width times height, from its header) a call may pass.",
							"Larger images are refused before they are decoded.",
							&g4_max_image_pixels,
							89478485, 1, INT_MAX,
							PGC_SUSET, 0,
							NULL, NULL, NULL);

	DefineCustomRealVariable("gemma4.max_audio_seconds",
							 "Longest audio clip a call may pass.",
							 "Longer clips are refused (from the header when it gives the length).",
							 &g4_max_audio_seconds,
							 600.0, 0.04, 86400.0,
							 PGC_SUSET, 0,
							 NULL, NULL, NULL);
}

static bool
check_soft_tokens(int *newval, void **extra, GucSource source)
{
	if (*newval == 70 || *newval == 140 || *newval == 280 || *newval == 560 || *newval == 1120)
		return true;
	GUC_check_errdetail("gemma4.max_soft_tokens must be 70, 140, 280, 560 or 1120.");
	return false;
}

/* The watchdog judges a step by its frames, and a step sends none while it
 * runs: below a second it would kill engines doing nothing wrong. */
static bool
check_stall_timeout(int *newval, void **extra, GucSource source)
{
	if (*newval == 0 || *newval >= 1000)
		return true;
	GUC_check_errdetail("gemma4.engine_stall_timeout must be 0 (off) or at least 1 s.");
	return false;
}

/* The prompt limit in bytes for a model with this context window. */
int64
g4_prompt_bytes_limit(int window)
{
	if (g4_max_prompt_bytes > 0)
		return g4_max_prompt_bytes;
	return (int64) G4_PROMPT_BYTES_PER_TOKEN * Max(window, 1);
}

/* Refuse a call's input before anything is queued. */
void
g4_check_prompt_bytes(int64 bytes, int64 limit, const char *what)
{
	if (bytes > limit)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("%s takes %lld bytes, more than the limit of %lld bytes",
						what, (long long) bytes, (long long) limit),
				 errhint("Shorten the input, or ask an administrator to raise gemma4.max_prompt_bytes.")));
}

static void
define_server_gucs(void)
{
	DefineCustomIntVariable("gemma4.engine_stall_timeout",
							"Time the engine may make no progress while requests wait before it is restarted.",
							"The requests in flight fail; 0 disables the watchdog. A long step is no stall: the engine reports progress from inside it.",
							&g4_engine_stall_timeout,
							60000, 0, INT_MAX,
							PGC_SIGHUP, GUC_UNIT_MS,
							check_stall_timeout, NULL, NULL);

	DefineCustomIntVariable("gemma4.job_check_interval",
							"Time between checks that every running table job has its workers.",
							"A missing worker (terminated, or refused a worker slot) is started again; after a server start the check runs at once.",
							&g4_job_check_interval,
							60, 1, INT_MAX / 1000,
							PGC_SIGHUP, GUC_UNIT_S,
							NULL, NULL, NULL);
	DefineCustomStringVariable("gemma4.model_dir",
							   "Model the worker serves: a directory (safetensors) or a .gguf file.",
							   "Empty means the default model installed at SHAREDIR/gemma4/default-model.gguf.",
							   &g4_model_dir,
							   "",
							   PGC_POSTMASTER, GUC_SUPERUSER_ONLY,
							   NULL, NULL, NULL);

	DefineCustomStringVariable("gemma4.draft_model_dir",
							   "Draft (MTP assistant) model for speculative decoding.",
							   "Empty means no speculative decoding.",
							   &g4_draft_model_dir,
							   "",
							   PGC_POSTMASTER, GUC_SUPERUSER_ONLY,
							   NULL, NULL, NULL);

	DefineCustomStringVariable("gemma4.model_alias",
							   "Name under which the model is reported.",
							   NULL,
							   &g4_model_alias,
							   "",
							   PGC_POSTMASTER, 0,
							   NULL, NULL, NULL);

	DefineCustomIntVariable("gemma4.max_model_len",
							"Context window in tokens (prompt and generated text).",
							"Capped at the model's own maximum.",
							&g4_max_model_len,
							262144, 16, 16777216,
							PGC_POSTMASTER, 0,
							NULL, NULL, NULL);

	DefineCustomRealVariable("gemma4.gpu_memory_utilization",
							 "Fraction of the device memory the engine may use.",
							 "What the weights and workspace leave of it becomes the KV pool.",
							 &g4_gpu_memory_utilization,
							 0.95, 0.01, 1.0,
							 PGC_POSTMASTER, 0,
							 NULL, NULL, NULL);

	DefineCustomEnumVariable("gemma4.kv_cache_dtype",
							 "Storage format of the KV cache.",
							 NULL,
							 &g4_kv_cache_dtype,
							 G4_KV_TURBOQUANT_K8V4, kv_cache_dtype_options,
							 PGC_POSTMASTER, 0,
							 NULL, NULL, NULL);

	DefineCustomIntVariable("gemma4.max_num_seqs",
							"Largest number of sequences decoded in one batch.",
							NULL,
							&g4_max_num_seqs,
							16, 1, 4096,
							PGC_POSTMASTER, 0,
							NULL, NULL, NULL);

	DefineCustomIntVariable("gemma4.max_num_batched_tokens",
							"Largest number of tokens processed in one scheduler step (the prefill chunk).",
							NULL,
							&g4_max_num_batched_tokens,
							16384, 1, 1048576,
							PGC_POSTMASTER, 0,
							NULL, NULL, NULL);

	DefineCustomIntVariable("gemma4.num_speculative_tokens",
							"Tokens the draft model proposes per step.",
							"Used only with gemma4.draft_model_dir.",
							&g4_num_speculative_tokens,
							4, 0, G4_SPEC_MAX_TOKENS,
							PGC_POSTMASTER, 0,
							NULL, NULL, NULL);

	DefineCustomBoolVariable("gemma4.speculative",
							 "Whether this session's requests use speculative decoding.",
							 "Only with gemma4.draft_model_dir; a call's speculative argument or option overrides it.",
							 &g4_speculative,
							 true,
							 PGC_USERSET, 0,
							 NULL, NULL, NULL);

	DefineCustomIntVariable("gemma4.speculative_max_batch",
							"Decoding sequences above which no sequence drafts.",
							"Above it the verify step's extra rows cost more than the drafts save.",
							&g4_speculative_max_batch,
							G4_SPEC_MAX_BATCH_DEFAULT, 0, 4096,
							PGC_POSTMASTER, 0,
							NULL, NULL, NULL);

	DefineCustomEnumVariable("gemma4.backend",
							 "Compute backend of the engine.",
							 "auto uses CUDA when a device is found, else the CPU.",
							 &g4_backend,
							 G4_BACKEND_AUTO, backend_options,
							 PGC_POSTMASTER, 0,
							 NULL, NULL, NULL);

	DefineCustomIntVariable("gemma4.cpu_threads",
							"Threads of the CPU backend.",
							"0 means one per core.",
							&g4_cpu_threads,
							0, 0, 1024,
							PGC_POSTMASTER, 0,
							NULL, NULL, NULL);

	DefineCustomIntVariable("gemma4.prepare_threads",
							"Threads that prepare requests beside the engine's steps: tokenising, chat formatting, media decoding.",
							"0 means half the cores, at least 2 and at most 16.",
							&g4_prepare_threads,
							0, 0, 64,
							PGC_POSTMASTER, 0,
							NULL, NULL, NULL);

	DefineCustomIntVariable("gemma4.max_requests",
							"Number of requests that may be in flight at once (shared memory slots).",
							"Requests beyond gemma4.max_num_seqs wait inside the engine.",
							&g4_max_requests,
							64, 1, 8192,
							PGC_POSTMASTER, 0,
							NULL, NULL, NULL);

	/* prefix caching */
	DefineCustomBoolVariable("gemma4.enable_prefix_caching",
							 "Share the KV cache of prompt prefixes common to several requests.",
							 "Requests whose prompts start alike (a shared system message or instruction) "
							 "skip the prefill of the part already computed; gemma_kv_pool shows the hit rate.",
							 &g4_enable_prefix_caching,
							 true,
							 PGC_POSTMASTER, 0,
							 NULL, NULL, NULL);
}

/*
 * One static worker with shared memory but no database connection: it
 * serves every database and also runs on a hot standby.  It exits with
 * status 1 on any failure of its own, which the postmaster answers with a
 * plain restart after bgw_restart_time (never a cluster reset).
 */
static void
register_supervisor(void)
{
	BackgroundWorker worker;

	memset(&worker, 0, sizeof(worker));
	worker.bgw_flags = BGWORKER_SHMEM_ACCESS;
	worker.bgw_start_time = BgWorkerStart_PostmasterStart;
	worker.bgw_restart_time = 1;
	snprintf(worker.bgw_library_name, BGW_MAXLEN, "gemma4");
	snprintf(worker.bgw_function_name, BGW_MAXLEN, "gemma4_supervisor_main");
	snprintf(worker.bgw_name, BGW_MAXLEN, "gemma4 supervisor");
	snprintf(worker.bgw_type, BGW_MAXLEN, "gemma4 supervisor");
	RegisterBackgroundWorker(&worker);
}
