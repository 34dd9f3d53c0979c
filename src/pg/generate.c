/*-------------------------------------------------------------------------
 *
 * generate.c
 *	  The generation functions: gemma_generate, gemma_complete,
 *	  gemma_generate_stream and gemma_chat.
 *
 * Arguments are validated here, before anything is queued: what can be
 * checked without the tokenizer fails at once with a precise SQLSTATE.
 * What needs the model (prompt length in tokens, chat format) is checked
 * by the engine, whose error codes map to SQLSTATEs in queue.c.
 *
 * Decoding is greedy unless the caller passes a temperature.  Text travels
 * as UTF-8 between the backend and the engine and is converted from and to
 * the database encoding here.
 *
 * gemma_generate_stream is a value-per-call set-returning function: each
 * call waits for the next piece, so rows reach a client reading through a
 * cursor (DECLARE/FETCH) as they are decoded.  In the SELECT list it
 * streams; in FROM, the executor materialises the whole set first.
 *
 * IDENTIFICATION
 *	  src/pg/generate.c
 *
 *-------------------------------------------------------------------------
 */
#include "gemma4.h"

#include <errno.h>
#include <float.h>
#include <limits.h>
#include <math.h>

#include "catalog/pg_proc.h"
#include "catalog/pg_type.h"
#include "engine.h"
#include "fmgr.h"
#include "funcapi.h"
#include "lib/stringinfo.h"
#include "mb/pg_wchar.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/json.h"
#include "utils/jsonb.h"
#include "utils/numeric.h"
#include "utils/syscache.h"

PG_FUNCTION_INFO_V1(gemma_generate);
PG_FUNCTION_INFO_V1(gemma_complete);
PG_FUNCTION_INFO_V1(gemma_generate_stream);
PG_FUNCTION_INFO_V1(gemma_complete_stream);
PG_FUNCTION_INFO_V1(gemma_complete_batch);
PG_FUNCTION_INFO_V1(gemma_generate_batch);
PG_FUNCTION_INFO_V1(gemma_chat);

/* A request being built: what is asked, and its payload items. */
typedef struct G4Build
{
	G4WireRequest req;
	bool		has_max_tokens;
	int			n_stop;
	int64		prompt_bytes;	/* UTF-8 bytes of the prompt or messages */
	StringInfoData items;
} G4Build;

/* Positions of the arguments gemma_generate and gemma_complete share. */
typedef struct G4ArgPos
{
	int			max_tokens;
	int			temperature;
	int			top_p;
	int			top_k;
	int			seed;
	int			stop;
} G4ArgPos;

/*
 * gemma_generate(prompt, images, audio, max_tokens, temperature, top_p, top_k, seed, stop, system, ...);
 * the trailing per-call options (max_soft_tokens, speculative,
 * allow_control_tokens) are found by name (named_arg).
 */
static const G4ArgPos generate_args = {3, 4, 5, 6, 7, 8};

/* gemma_complete(prompt, max_tokens, temperature, top_p, top_k, seed, stop, ...) */
static const G4ArgPos complete_args = {1, 2, 3, 4, 5, 6};

/* the batch functions: prompts[], then gemma_complete's arguments
 * (gemma_generate_batch: then system, images[], audio[], ...) */
static const G4ArgPos batch_args = {1, 2, 3, 4, 5, 6};

static void build_init(G4Build *b, G4RequestKind kind);
static void set_max_soft_tokens(G4Build *b, int64 v);
static void add_media_array(G4Build *b, ArrayType *arr, int32 tag, const char *what);
static void build_finish(G4Build *b, int window);
static void add_item(G4Build *b, int32 tag, const char *data, Size len);
static void add_text_item(G4Build *b, int32 tag, const char *str);
static void set_max_tokens(G4Build *b, int64 v);
static void set_temperature(G4Build *b, double v);
static void set_top_p(G4Build *b, double v);
static void set_top_k(G4Build *b, int64 v);
static void set_seed(G4Build *b, int64 v);
static void add_stop(G4Build *b, const char *s);
static void args_from_call(G4Build *b, FunctionCallInfo fcinfo, const G4ArgPos *pos);
static char *prompt_arg(FunctionCallInfo fcinfo);
static void build_generate(G4Build *b, FunctionCallInfo fcinfo, int *window);
static void build_complete(G4Build *b, FunctionCallInfo fcinfo);
static void parse_messages(G4Build *b, Jsonb *messages);
static void parse_options(G4Build *b, Jsonb *options);
static text *collect_text(G4Request *r);
static const char *finish_reason_name(int reason);

/* Defaults: greedy decoding, no penalties, max_tokens from the GUC. */
static void
build_init(G4Build *b, G4RequestKind kind)
{
	memset(b, 0, sizeof(*b));
	b->req.kind = kind;
	b->req.temperature = 0.0f;
	b->req.top_p = 1.0f;
	b->req.min_p = 0.0f;
	b->req.repetition_penalty = 1.0f;
	b->req.presence_penalty = 0.0f;
	b->req.frequency_penalty = 0.0f;
	b->req.max_soft_tokens = g4_max_soft_tokens;
	b->req.max_image_pixels = g4_max_image_pixels;
	b->req.max_audio_seconds = g4_max_audio_seconds;
	b->req.disable_speculative = g4_speculative ? 0 : 1;
	initStringInfo(&b->items);
}

/* ---- media ---- */

static void
set_max_soft_tokens(G4Build *b, int64 v)
{
	if (v != 70 && v != 140 && v != 280 && v != 560 && v != 1120)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("max_soft_tokens must be 70, 140, 280, 560 or 1120"),
				 errhint("Pass NULL to use gemma4.max_soft_tokens.")));
	b->req.max_soft_tokens = (int32) v;
}

/* One media file as a payload item; an empty one is the engine's to refuse
 * (it names the element), a NULL one is refused here. */
static void
add_media(G4Build *b, bytea *data, int32 tag)
{
	add_item(b, tag, VARDATA_ANY(data), VARSIZE_ANY_EXHDR(data));
}

/* A bytea[] of media files, in order. */
static void
add_media_array(G4Build *b, ArrayType *arr, int32 tag, const char *what)
{
	Datum	   *elems;
	bool	   *nulls;
	int			n;
	int			i;

	if (ARR_NDIM(arr) > 1)
		ereport(ERROR,
				(errcode(ERRCODE_ARRAY_SUBSCRIPT_ERROR),
				 errmsg("%s must be a one-dimensional array", what)));
	deconstruct_array(arr, BYTEAOID, -1, false, TYPALIGN_INT, &elems, &nulls, &n);
	for (i = 0; i < n; i++)
	{
		if (nulls[i])
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("%s[%d] is null", what, i + 1),
					 errhint("Leave the element out, or pass NULL for the whole array.")));
		add_media(b, DatumGetByteaPP(elems[i]), tag);
	}
}

/* Check the prompt size and max_tokens against the loaded model's window. */
static void
build_finish(G4Build *b, int window)
{
	g4_check_prompt_bytes(b->prompt_bytes, g4_prompt_bytes_limit(window), "the prompt");
	if (g4_max_tokens_limit > 0)
	{
		int			asked = b->has_max_tokens ? b->req.max_tokens : g4_default_max_tokens;

		if (asked > g4_max_tokens_limit)
			ereport(ERROR,
					(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
					 errmsg("max_tokens (%d) exceeds gemma4.max_tokens_limit (%d)", asked, g4_max_tokens_limit),
					 errhint(b->has_max_tokens ? "Pass a smaller max_tokens." :
							 "Pass max_tokens, or lower gemma4.default_max_tokens.")));
		/* "up to the window" is up to the window or the limit, whichever
		 * comes first: only the engine knows the prompt's length */
		if (asked == 0)
		{
			b->req.max_tokens = 0;
			b->req.max_tokens_cap = g4_max_tokens_limit;
			b->has_max_tokens = true;
		}
	}
	if (!b->has_max_tokens)
	{
		if (g4_default_max_tokens >= window)
			ereport(ERROR,
					(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
					 errmsg("gemma4.default_max_tokens (%d) exceeds the context window", g4_default_max_tokens),
					 errdetail("The context window is %d tokens, and the prompt takes at least one.", window),
					 errhint("Pass max_tokens, or lower gemma4.default_max_tokens.")));
		b->req.max_tokens = g4_default_max_tokens;
	}
	else if (b->req.max_tokens >= window)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("max_tokens (%d) exceeds the context window", b->req.max_tokens),
				 errdetail("The context window is %d tokens, and the prompt takes at least one.", window),
				 errhint("Lower max_tokens, or raise gemma4.max_model_len.")));
}

static void
add_item(G4Build *b, int32 tag, const char *data, Size len)
{
	Size		size;

	if (len > MaxAllocSize)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("gemma4 request is too large")));
	size = g4p_item_size(len);
	enlargeStringInfo(&b->items, (int) size);
	g4p_item_put(b->items.data + b->items.len, tag, data, (uint32) len);
	b->items.len += (int) size;
	b->items.data[b->items.len] = '\0';
}

/* A string in the database encoding, stored as UTF-8. */
static void
add_text_item(G4Build *b, int32 tag, const char *str)
{
	char	   *utf8 = pg_server_to_any(str, strlen(str), PG_UTF8);
	Size		len = strlen(utf8);

	if (tag != G4_ITEM_STOP)
		b->prompt_bytes += (int64) len;
	add_item(b, tag, utf8, len);
}

static void
set_max_tokens(G4Build *b, int64 v)
{
	if (v <= 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("max_tokens must be greater than zero"),
				 errhint("Pass NULL to use gemma4.default_max_tokens.")));
	b->req.max_tokens = (int32) Min(v, (int64) INT_MAX);
	b->has_max_tokens = true;
}

static void
set_temperature(G4Build *b, double v)
{
	if (isnan(v) || v < 0.0 || v > FLT_MAX)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("temperature must be a finite number greater than or equal to zero"),
				 errdetail("Zero means greedy decoding.")));
	b->req.temperature = (float) v;
}

static void
set_top_p(G4Build *b, double v)
{
	/* the engine works in single precision: what rounds to 0 is 0 */
	if (!(v > 0.0 && v <= 1.0 && (float) v > 0.0f))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("top_p must be greater than 0 and at most 1"),
				 errdetail("1 means no nucleus filtering.")));
	b->req.top_p = (float) v;
}

static void
set_top_k(G4Build *b, int64 v)
{
	if (v < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("top_k must be greater than or equal to zero"),
				 errdetail("Zero means no limit.")));
	b->req.top_k = (int32) Min(v, (int64) INT_MAX);
}

/* Any bigint: its bits become the engine's 64-bit seed. */
static void
set_seed(G4Build *b, int64 v)
{
	b->req.seed = (uint64) v;
	b->req.has_seed = 1;
}

/* Too many stop strings: refused before any is converted. */
static void
check_stop_count(int n)
{
	if (n > G4_MAX_STOP_STRINGS)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("too many stop strings: %d, the limit is %d", n, G4_MAX_STOP_STRINGS)));
}

static void
add_stop(G4Build *b, const char *s)
{
	size_t		len = strlen(s);

	if (s[0] == '\0')
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("stop strings must not be empty")));
	check_stop_count(++b->n_stop);
	/* checked before and after conversion: no encoding expands a huge string */
	if (len <= G4_MAX_STOP_BYTES)
	{
		char	   *utf8 = pg_server_to_any(s, len, PG_UTF8);

		len = strlen(utf8);
		if (len <= G4_MAX_STOP_BYTES)
		{
			add_item(b, G4_ITEM_STOP, utf8, len);
			return;
		}
	}
	ereport(ERROR,
			(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
			 errmsg("a stop string is too long: %zu bytes, the limit is %d", len, G4_MAX_STOP_BYTES)));
}

/* A text[] argument that must be one-dimensional: its elements. */
static void
vector_arg(ArrayType *arr, const char *what, Datum **elems, bool **nulls, int *n)
{
	if (ARR_NDIM(arr) > 1)
		ereport(ERROR,
				(errcode(ERRCODE_ARRAY_SUBSCRIPT_ERROR),
				 errmsg("%s must be a one-dimensional array", what)));
	deconstruct_array(arr, TEXTOID, -1, false, TYPALIGN_INT, elems, nulls, n);
}

/* ---- per-call options found by name ---- */

/*
 * Position of the called function's argument named `name`, or -1.  The
 * trailing per-call options (speculative and its siblings) are found by
 * name, so the order in which they follow the shared arguments is free.
 */
static int
named_arg(FunctionCallInfo fcinfo, const char *name)
{
	HeapTuple	tp = SearchSysCache1(PROCOID, ObjectIdGetDatum(fcinfo->flinfo->fn_oid));
	Oid		   *types;
	char	  **names;
	char	   *modes;
	int			n;
	int			i;
	int			pos = -1;

	if (!HeapTupleIsValid(tp))
		elog(ERROR, "cache lookup failed for function %u", fcinfo->flinfo->fn_oid);
	n = get_func_arg_info(tp, &types, &names, &modes);
	for (i = 0; names && i < n; i++)
		if (names[i] && strcmp(names[i], name) == 0)
			pos = i;
	ReleaseSysCache(tp);
	return pos < PG_NARGS() ? pos : -1;
}

/* speculative => true/false overrides gemma4.speculative for this call. */
static void
speculative_from_call(G4Build *b, FunctionCallInfo fcinfo)
{
	int			pos = named_arg(fcinfo, "speculative");

	if (pos >= 0 && !PG_ARGISNULL(pos))
		b->req.disable_speculative = PG_GETARG_BOOL(pos) ? 0 : 1;
}

/* max_soft_tokens => N overrides gemma4.max_soft_tokens for this call. */
static void
max_soft_tokens_from_call(G4Build *b, FunctionCallInfo fcinfo)
{
	int			pos = named_arg(fcinfo, "max_soft_tokens");

	if (pos >= 0 && !PG_ARGISNULL(pos))
		set_max_soft_tokens(b, PG_GETARG_INT32(pos));
}

/* The sampling arguments gemma_generate and gemma_complete share. */
static void
args_from_call(G4Build *b, FunctionCallInfo fcinfo, const G4ArgPos *pos)
{
	int			ac;

	if (!PG_ARGISNULL(pos->max_tokens))
		set_max_tokens(b, PG_GETARG_INT32(pos->max_tokens));
	if (!PG_ARGISNULL(pos->temperature))
		set_temperature(b, PG_GETARG_FLOAT8(pos->temperature));
	if (!PG_ARGISNULL(pos->top_p))
		set_top_p(b, PG_GETARG_FLOAT8(pos->top_p));
	if (!PG_ARGISNULL(pos->top_k))
		set_top_k(b, PG_GETARG_INT32(pos->top_k));
	if (!PG_ARGISNULL(pos->seed))
		set_seed(b, PG_GETARG_INT64(pos->seed));
	speculative_from_call(b, fcinfo);
	if (!PG_ARGISNULL(pos->stop))
	{
		Datum	   *elems;
		bool	   *nulls;
		int			n;
		int			i;

		vector_arg(PG_GETARG_ARRAYTYPE_P(pos->stop), "stop", &elems, &nulls, &n);
		check_stop_count(n);
		for (i = 0; i < n; i++)
		{
			if (nulls[i])
				ereport(ERROR,
						(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
						 errmsg("stop strings must not be null")));
			add_stop(b, TextDatumGetCString(elems[i]));
		}
	}
	ac = named_arg(fcinfo, "allow_control_tokens");
	if (ac >= 0 && !PG_ARGISNULL(ac))
		b->req.allow_control_tokens = PG_GETARG_BOOL(ac) ? 1 : 0;
}

/* The prompt argument: not null, not empty. */
static char *
prompt_arg(FunctionCallInfo fcinfo)
{
	char	   *prompt;

	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("prompt must not be null")));
	prompt = text_to_cstring(PG_GETARG_TEXT_PP(0));
	if (prompt[0] == '\0')
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("prompt must not be empty")));
	return prompt;
}

/*
 * gemma_generate and gemma_generate_stream: a single-turn chat, with an
 * optional system message before the user's prompt.
 */
static void
build_generate(G4Build *b, FunctionCallInfo fcinfo, int *window)
{
	char	   *prompt;

	g4_require_shared();
	prompt = prompt_arg(fcinfo);

	build_init(b, G4_KIND_CHAT);
	/* images, then audio: the prompt's placeholders take them in that
	 * order; without placeholders they go before the prompt's text */
	if (!PG_ARGISNULL(1))
		add_media_array(b, PG_GETARG_ARRAYTYPE_P(1), G4_ITEM_IMAGE, "images");
	if (!PG_ARGISNULL(2))
		add_media_array(b, PG_GETARG_ARRAYTYPE_P(2), G4_ITEM_AUDIO, "audio");
	max_soft_tokens_from_call(b, fcinfo);
	if (!PG_ARGISNULL(9))
	{
		char	   *system = text_to_cstring(PG_GETARG_TEXT_PP(9));

		if (system[0] == '\0')
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("system must not be empty"),
					 errhint("Pass NULL for no system message.")));
		add_text_item(b, G4_ITEM_SYSTEM, system);
	}
	add_text_item(b, G4_ITEM_USER, prompt);
	args_from_call(b, fcinfo, &generate_args);
	*window = g4_require_ready();
	build_finish(b, *window);
}

/* A raw completion request from gemma_complete's arguments. */
static void
build_complete(G4Build *b, FunctionCallInfo fcinfo)
{
	char	   *prompt;

	g4_require_shared();
	prompt = prompt_arg(fcinfo);
	build_init(b, G4_KIND_TEXT);
	add_text_item(b, G4_ITEM_PROMPT, prompt);
	args_from_call(b, fcinfo, &complete_args);
	build_finish(b, g4_require_ready());
}

/* Run a request to its end and return the content it produced. */
static text *
collect_text(G4Request *r)
{
	StringInfoData out;
	char		kind;
	const char *data;
	Size		len;
	char	   *s;
	Size		slen;

	initStringInfo(&out);
	while (g4_request_next(r, &kind, &data, &len))
		if (kind == G4_MQ_CONTENT)
			appendBinaryStringInfo(&out, data, (int) len);
	g4_request_finish(r);
	s = g4_text_to_server(out.data, out.len, &slen);
	return cstring_to_text_with_len(s, (int) slen);
}

Datum
gemma_generate(PG_FUNCTION_ARGS)
{
	G4Build		b;
	int			window;

	build_generate(&b, fcinfo, &window);
	PG_RETURN_TEXT_P(collect_text(g4_request_start(&b.req, b.items.data, b.items.len)));
}

Datum
gemma_complete(PG_FUNCTION_ARGS)
{
	G4Build		b;

	build_complete(&b, fcinfo);
	PG_RETURN_TEXT_P(collect_text(g4_request_start(&b.req, b.items.data, b.items.len)));
}

/*
 * One row per decoded piece.  The request lives in the multi-call memory
 * context: when the set is not read to its end (LIMIT, a closed cursor, an
 * error), deleting that context detaches the request, which cancels it.
 */
static Datum
stream_rows(FunctionCallInfo fcinfo, bool raw_completion)
{
	FuncCallContext *funcctx;
	G4Request  *r;
	char		kind;
	const char *data;
	Size		len;

	if (SRF_IS_FIRSTCALL())
	{
		MemoryContext old;
		G4Build		b;
		int			window;

		funcctx = SRF_FIRSTCALL_INIT();
		old = MemoryContextSwitchTo(funcctx->multi_call_memory_ctx);
		if (raw_completion)
			build_complete(&b, fcinfo);
		else
			build_generate(&b, fcinfo, &window);
		funcctx->user_fctx = g4_request_start(&b.req, b.items.data, b.items.len);
		MemoryContextSwitchTo(old);
	}
	funcctx = SRF_PERCALL_SETUP();
	r = (G4Request *) funcctx->user_fctx;

	while (g4_request_next(r, &kind, &data, &len))
	{
		if (kind == G4_MQ_CONTENT && len > 0)
		{
			Size		slen;
			char	   *s = g4_text_to_server(data, len, &slen);

			if (slen > 0)
				SRF_RETURN_NEXT(funcctx, PointerGetDatum(cstring_to_text_with_len(s, (int) slen)));
		}
	}
	g4_request_finish(r);
	SRF_RETURN_DONE(funcctx);
}

Datum
gemma_generate_stream(PG_FUNCTION_ARGS)
{
	return stream_rows(fcinfo, false);
}

Datum
gemma_complete_stream(PG_FUNCTION_ARGS)
{
	return stream_rows(fcinfo, true);
}

/* A batch's media array aligned with its n prompts, or NULL. */
static void
media_arg(FunctionCallInfo fcinfo, int argno, int n, Oid type, Datum **elems, bool **nulls, const char *what)
{
	ArrayType  *arr;
	int			m;

	if (argno < 0 || PG_ARGISNULL(argno))
		return;
	arr = PG_GETARG_ARRAYTYPE_P(argno);
	if (ARR_NDIM(arr) > 1)
		ereport(ERROR,
				(errcode(ERRCODE_ARRAY_SUBSCRIPT_ERROR),
				 errmsg("%s must be a one-dimensional array", what)));
	deconstruct_array(arr, type, -1, false, TYPALIGN_INT, elems, nulls, &m);
	if (m != n)
		ereport(ERROR,
				(errcode(ERRCODE_ARRAY_SUBSCRIPT_ERROR),
				 errmsg("%s has %d elements but prompts has %d", what, m, n),
				 errhint("Pass one element per prompt, NULL where a prompt has none.")));
}

/* Collect a batch's oldest entry not collected yet (NULL for a NULL prompt). */
static void
batch_collect(G4Request **reqs, Datum *out, bool *out_null, int *next, int *in_flight)
{
	if (reqs[*next])
	{
		out[*next] = PointerGetDatum(collect_text(reqs[*next]));
		(*in_flight)--;
	}
	else
		out_null[*next] = true;
	(*next)++;
}

/*
 * Batches: one call, many prompts, all in flight together so the engine runs
 * them in the same forward passes (a table job: SELECT or UPDATE over
 * array_agg of its rows).  Requests are started in order, at most half of
 * gemma4.max_requests at a time so other sessions keep slots, and collected
 * in order.  A NULL prompt gives a NULL answer.
 *
 * The batch's own requests count against its role's
 * gemma4.max_requests_per_role, and they free their slots only as they are
 * collected: while it has requests in flight, a batch never waits for a
 * slot (that could be waiting for itself).  When no slot can be taken at
 * once (its role's limit reached, by the batch or by other sessions of the
 * role, or every slot taken) it collects its oldest request first; only
 * with none in flight does it wait in the queue like any request.
 */
static Datum
batch_rows(FunctionCallInfo fcinfo, bool chat)
{
	Datum	   *elems;
	bool	   *nulls;
	int			n;
	Datum	   *out;
	bool	   *out_null;
	G4Request **reqs;
	char	   *system = NULL;
	Datum	   *images = NULL,
			   *audio = NULL;
	bool	   *image_nulls = NULL,
			   *audio_nulls = NULL;
	int			window;
	int			limit = Max(1, g4_max_requests / 2);
	int			in_flight = 0;
	int			next = 0;
	int			i;
	int			dims[1];
	int			lbs[1] = {1};

	g4_require_shared();
	if (PG_ARGISNULL(0))
		PG_RETURN_NULL();
	vector_arg(PG_GETARG_ARRAYTYPE_P(0), "prompts", &elems, &nulls, &n);
	if (chat && !PG_ARGISNULL(7))
	{
		system = text_to_cstring(PG_GETARG_TEXT_PP(7));
		if (system[0] == '\0')
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("system must not be empty"),
					 errhint("Pass NULL for no system message.")));
	}
	for (i = 0; i < n; i++)
		if (!nulls[i] && VARSIZE_ANY_EXHDR(DatumGetPointer(elems[i])) == 0)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("prompt %d of the batch is empty", i + 1)));
	if (chat)
	{
		/* one image and one audio clip per prompt (NULL: none), aligned */
		media_arg(fcinfo, named_arg(fcinfo, "images"), n, BYTEAOID, &images, &image_nulls, "images");
		media_arg(fcinfo, named_arg(fcinfo, "audio"), n, BYTEAOID, &audio, &audio_nulls, "audio");
	}
	window = g4_require_ready();
	out = palloc0(sizeof(Datum) * Max(n, 1));
	out_null = palloc0(sizeof(bool) * Max(n, 1));
	reqs = palloc0(sizeof(G4Request *) * Max(n, 1));
	for (i = 0; i <= n; i++)
	{
		/* collect in order whenever the window of requests is full */
		while (next < i && (in_flight >= limit || i == n))
			batch_collect(reqs, out, out_null, &next, &in_flight);
		if (i == n)
			break;
		if (!nulls[i])
		{
			G4Build		b;

			build_init(&b, chat ? G4_KIND_CHAT : G4_KIND_TEXT);
			if (system)
				add_text_item(&b, G4_ITEM_SYSTEM, system);
			if (images && !image_nulls[i])
				add_media(&b, DatumGetByteaPP(images[i]), G4_ITEM_IMAGE);
			if (audio && !audio_nulls[i])
				add_media(&b, DatumGetByteaPP(audio[i]), G4_ITEM_AUDIO);
			max_soft_tokens_from_call(&b, fcinfo);
			add_text_item(&b, chat ? G4_ITEM_USER : G4_ITEM_PROMPT, TextDatumGetCString(elems[i]));
			args_from_call(&b, fcinfo, &batch_args);
			build_finish(&b, window);
			while (in_flight > 0 &&
				   (reqs[i] = g4_request_try_start(&b.req, b.items.data, b.items.len)) == NULL)
			{
				int			before = in_flight;

				while (in_flight == before)
					batch_collect(reqs, out, out_null, &next, &in_flight);
			}
			if (reqs[i] == NULL)
				reqs[i] = g4_request_start(&b.req, b.items.data, b.items.len);
			in_flight++;
		}
	}
	dims[0] = n;
	PG_RETURN_ARRAYTYPE_P(construct_md_array(out, out_null, n > 0 ? 1 : 0, dims, lbs, TEXTOID, -1, false,
											 TYPALIGN_INT));
}

Datum
gemma_complete_batch(PG_FUNCTION_ARGS)
{
	return batch_rows(fcinfo, false);
}

Datum
gemma_generate_batch(PG_FUNCTION_ARGS)
{
	return batch_rows(fcinfo, true);
}

/* The string value of a JSON string, in the database encoding. */
static char *
json_string(const JsonbValue *v)
{
	return pnstrdup(v->val.string.val, v->val.string.len);
}

/* A JSON number that must be an integer within [min, max]. */
static int64
json_integer(const JsonbValue *v, const char *key, int64 min, int64 max)
{
	char	   *s;
	char	   *end;
	long long	n;
	bool		overflow;

	if (v->type != jbvNumeric)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("option \"%s\" must be an integer", key)));
	s = numeric_normalize(v->val.numeric);
	errno = 0;
	n = strtoll(s, &end, 10);
	overflow = (errno == ERANGE);
	if (*end != '\0')
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("option \"%s\" must be an integer", key),
				 errdetail("The value is %s.", s)));
	if (overflow || n < min || n > max)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("option \"%s\" is out of range", key),
				 overflow ? errdetail("The value %s does not fit in a bigint.", s) :
				 n > max ? errdetail("The largest allowed value is %lld.", (long long) max) :
				 errdetail("The smallest allowed value is %lld.", (long long) min)));
	return n;
}

static double
json_number(const JsonbValue *v, const char *key)
{
	if (v->type != jbvNumeric)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("option \"%s\" must be a number", key)));
	return DatumGetFloat8(DirectFunctionCall1(numeric_float8, NumericGetDatum(v->val.numeric)));
}

/* A number option that must lie in [min, max]. */
static float
json_ranged(const JsonbValue *v, const char *key, double min, double max)
{
	double		d = json_number(v, key);

	if (!(d >= min && d <= max))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("option \"%s\" must be between %g and %g", key, min, max)));
	return (float) d;
}

/*
 * A content array: text parts {"type": "text", "text": "..."} and media
 * parts {"type": "image" | "audio", "data": "<base64 of the file>"}, sent
 * after the message item as PART items.  Media parts are numbered by kind
 * over the whole conversation, as the engine names them in its errors.
 */
static void
add_content_parts(G4Build *b, JsonbContainer *parts, int idx)
{
	JsonbIterator *it = JsonbIteratorInit(parts);
	JsonbValue	v;
	JsonbIteratorToken tok;
	int			k = 0;

	while ((tok = JsonbIteratorNext(&it, &v, true)) != WJB_DONE)
	{
		JsonbIterator *pit;
		JsonbValue	pk;
		JsonbValue	pv;
		char	   *type = NULL;
		char	   *text = NULL;
		char	   *data = NULL;
		int			data_len = 0;

		if (tok != WJB_ELEM)
			continue;
		k++;
		if (v.type != jbvBinary || !JsonContainerIsObject(v.val.binary.data))
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("content part %d of message %d must be a JSON object", k, idx)));
		pit = JsonbIteratorInit(v.val.binary.data);
		while ((tok = JsonbIteratorNext(&pit, &pk, true)) != WJB_DONE)
		{
			char	   *key;

			if (tok != WJB_KEY)
				continue;
			key = json_string(&pk);
			tok = JsonbIteratorNext(&pit, &pv, true);
			if (pv.type != jbvString)
				ereport(ERROR,
						(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
						 errmsg("\"%s\" of content part %d of message %d must be a string", key, k, idx)));
			if (strcmp(key, "type") == 0)
				type = json_string(&pv);
			else if (strcmp(key, "text") == 0)
				text = json_string(&pv);
			else if (strcmp(key, "data") == 0)
			{
				data = pv.val.string.val;
				data_len = pv.val.string.len;
			}
			else
				ereport(ERROR,
						(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
						 errmsg("content part %d of message %d has an unrecognized key \"%s\"", k, idx, key),
						 errhint("A part is {\"type\": \"text\", \"text\": ...} or {\"type\": \"image\" or \"audio\", \"data\": base64}.")));
		}
		if (type && strcmp(type, "text") == 0 && text)
			add_text_item(b, G4_ITEM_PART_TEXT, text);
		else if (type && (strcmp(type, "image") == 0 || strcmp(type, "audio") == 0) && data)
		{
			bytea	   *raw = DatumGetByteaPP(DirectFunctionCall2(binary_decode,
																  PointerGetDatum(cstring_to_text_with_len(data, data_len)),
																  PointerGetDatum(cstring_to_text("base64"))));

			add_media(b, raw, strcmp(type, "image") == 0 ? G4_ITEM_PART_IMAGE : G4_ITEM_PART_AUDIO);
		}
		else
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("content part %d of message %d is not a text, image or audio part", k, idx),
					 errhint("A part is {\"type\": \"text\", \"text\": ...} or {\"type\": \"image\" or \"audio\", \"data\": base64}.")));
	}
}

/*
 * messages: a non-empty array of {"role": ..., "content": ...} objects,
 * roles system (first message only), user, assistant (or model); content
 * is a string or an array of content parts (add_content_parts).
 */
static void
parse_messages(G4Build *b, Jsonb *messages)
{
	JsonbIterator *it;
	JsonbValue	v;
	JsonbIteratorToken tok;
	int			idx = 0;

	if (JB_ROOT_IS_SCALAR(messages) || !JB_ROOT_IS_ARRAY(messages))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("messages must be a JSON array"),
				 errhint("Pass an array of objects such as [{\"role\": \"user\", \"content\": \"Hello\"}].")));
	if (JB_ROOT_COUNT(messages) == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("messages must not be empty")));

	it = JsonbIteratorInit(&messages->root);
	while ((tok = JsonbIteratorNext(&it, &v, true)) != WJB_DONE)
	{
		JsonbIterator *mit;
		JsonbValue	k;
		JsonbValue	mv;
		JsonbIteratorToken mtok;
		char	   *role = NULL;
		char	   *content = NULL;
		JsonbContainer *parts = NULL;
		int32		tag;

		if (tok != WJB_ELEM)
			continue;
		idx++;
		if (v.type != jbvBinary || !JsonContainerIsObject(v.val.binary.data))
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("message %d must be a JSON object", idx),
					 errhint("A message is an object with the keys role and content.")));

		mit = JsonbIteratorInit(v.val.binary.data);
		while ((mtok = JsonbIteratorNext(&mit, &k, true)) != WJB_DONE)
		{
			char	   *key;

			if (mtok != WJB_KEY)
				continue;
			key = json_string(&k);
			mtok = JsonbIteratorNext(&mit, &mv, true);
			Assert(mtok == WJB_VALUE);
			if (strcmp(key, "role") == 0)
			{
				if (mv.type != jbvString)
					ereport(ERROR,
							(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
							 errmsg("role of message %d must be a string", idx)));
				role = json_string(&mv);
			}
			else if (strcmp(key, "content") == 0)
			{
				if (mv.type == jbvBinary && JsonContainerIsArray(mv.val.binary.data))
				{
					parts = mv.val.binary.data;
					content = "";
				}
				else if (mv.type != jbvString)
					ereport(ERROR,
							(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
							 errmsg("content of message %d must be a string or an array of content parts", idx)));
				else
					content = json_string(&mv);
			}
			else
				ereport(ERROR,
						(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
						 errmsg("message %d has an unrecognized key \"%s\"", idx, key),
						 errhint("A message is an object with the keys role and content.")));
		}
		if (role == NULL)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("message %d has no role", idx),
					 errhint("Add \"role\": \"user\", \"assistant\" or \"system\".")));
		if (content == NULL)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("message %d has no content", idx)));
		if (strcmp(role, "system") == 0)
		{
			if (idx > 1)
				ereport(ERROR,
						(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
						 errmsg("a system message may only come first (message %d)", idx)));
			tag = G4_ITEM_SYSTEM;
		}
		else if (strcmp(role, "user") == 0)
			tag = G4_ITEM_USER;
		else if (strcmp(role, "assistant") == 0 || strcmp(role, "model") == 0)
			tag = G4_ITEM_MODEL;
		else
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("message %d has an unknown role \"%s\"", idx, role),
					 errhint("Use \"system\", \"user\" or \"assistant\".")));
		add_text_item(b, tag, content);
		if (parts)
		{
			if (tag == G4_ITEM_SYSTEM)
				ereport(ERROR,
						(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
						 errmsg("the system message must be a string")));
			add_content_parts(b, parts, idx);
		}
	}
}

/* gemma_chat's options object. */
static void
parse_options(G4Build *b, Jsonb *options)
{
	JsonbIterator *it;
	JsonbValue	k;
	JsonbValue	v;
	JsonbIteratorToken tok;

	if (JB_ROOT_IS_SCALAR(options) || !JB_ROOT_IS_OBJECT(options))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("options must be a JSON object")));

	it = JsonbIteratorInit(&options->root);
	while ((tok = JsonbIteratorNext(&it, &k, true)) != WJB_DONE)
	{
		char	   *key;

		if (tok != WJB_KEY)
			continue;
		key = json_string(&k);
		tok = JsonbIteratorNext(&it, &v, true);
		Assert(tok == WJB_VALUE);

		/* a JSON null means "not given" */
		if (v.type == jbvNull)
			continue;

		if (strcmp(key, "max_tokens") == 0)
			set_max_tokens(b, json_integer(&v, key, PG_INT64_MIN, INT_MAX));
		else if (strcmp(key, "temperature") == 0)
			set_temperature(b, json_number(&v, key));
		else if (strcmp(key, "top_p") == 0)
			set_top_p(b, json_number(&v, key));
		else if (strcmp(key, "top_k") == 0)
			set_top_k(b, json_integer(&v, key, PG_INT64_MIN, INT_MAX));
		else if (strcmp(key, "seed") == 0)
			set_seed(b, json_integer(&v, key, PG_INT64_MIN, PG_INT64_MAX));
		else if (strcmp(key, "max_soft_tokens") == 0)
			set_max_soft_tokens(b, json_integer(&v, key, PG_INT64_MIN, PG_INT64_MAX));
		else if (strcmp(key, "min_p") == 0)
			b->req.min_p = json_ranged(&v, key, 0.0, 1.0);
		else if (strcmp(key, "repetition_penalty") == 0)
		{
			double		d = json_number(&v, key);

			if (!(d > 0.0 && d <= FLT_MAX && (float) d > 0.0f))
				ereport(ERROR,
						(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
						 errmsg("option \"repetition_penalty\" must be greater than zero"),
						 errdetail("1 means no penalty.")));
			b->req.repetition_penalty = (float) d;
		}
		else if (strcmp(key, "presence_penalty") == 0)
			b->req.presence_penalty = json_ranged(&v, key, -2.0, 2.0);
		else if (strcmp(key, "frequency_penalty") == 0)
			b->req.frequency_penalty = json_ranged(&v, key, -2.0, 2.0);
		else if (strcmp(key, "speculative") == 0)
		{
			if (v.type != jbvBool)
				ereport(ERROR,
						(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
						 errmsg("option \"speculative\" must be a boolean")));
			b->req.disable_speculative = v.val.boolean ? 0 : 1;
		}
		else if (strcmp(key, "thinking") == 0)
		{
			if (v.type != jbvBool)
				ereport(ERROR,
						(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
						 errmsg("option \"thinking\" must be a boolean")));
			b->req.thinking = v.val.boolean ? 1 : 0;
		}
		else if (strcmp(key, "allow_control_tokens") == 0)
		{
			if (v.type != jbvBool)
				ereport(ERROR,
						(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
						 errmsg("option \"allow_control_tokens\" must be a boolean")));
			b->req.allow_control_tokens = v.val.boolean ? 1 : 0;
		}
		else if (strcmp(key, "stop") == 0)
		{
			if (v.type == jbvString)
				add_stop(b, json_string(&v));
			else if (v.type == jbvBinary && JsonContainerIsArray(v.val.binary.data))
			{
				JsonbIterator *sit = JsonbIteratorInit(v.val.binary.data);
				JsonbValue	sv;

				while ((tok = JsonbIteratorNext(&sit, &sv, true)) != WJB_DONE)
				{
					if (tok != WJB_ELEM)
						continue;
					if (sv.type != jbvString)
						ereport(ERROR,
								(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
								 errmsg("option \"stop\" must be a string or an array of strings")));
					add_stop(b, json_string(&sv));
				}
			}
			else
				ereport(ERROR,
						(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
						 errmsg("option \"stop\" must be a string or an array of strings")));
		}
		else
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("unrecognized gemma_chat option \"%s\"", key),
					 errhint("Valid options are max_tokens, temperature, top_p, top_k, min_p, seed, stop, thinking, repetition_penalty, presence_penalty, frequency_penalty, max_soft_tokens, speculative and allow_control_tokens.")));
	}
}

static const char *
finish_reason_name(int reason)
{
	switch (reason)
	{
		case G4_FINISH_STOP:
			return "stop";
		case G4_FINISH_LENGTH:
			return "length";
		case G4_FINISH_CANCELLED:
			return "cancelled";
	}
	return "unknown";
}

/*
 * gemma_chat(messages jsonb, options jsonb DEFAULT '{}') returns
 * {"content", "reasoning" (when thinking is on), "finish_reason", "usage"}.
 */
Datum
gemma_chat(PG_FUNCTION_ARGS)
{
	G4Build		b;
	G4Request  *r;
	StringInfoData content;
	StringInfoData reasoning;
	StringInfoData json;
	char		kind;
	const char *data;
	Size		len;
	Size		slen;
	int			prompt_tokens;
	int			completion_tokens;
	int			finish_reason;

	g4_require_shared();
	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("messages must not be null")));
	build_init(&b, G4_KIND_CHAT);
	parse_messages(&b, PG_GETARG_JSONB_P(0));
	if (!PG_ARGISNULL(1))
		parse_options(&b, PG_GETARG_JSONB_P(1));
	build_finish(&b, g4_require_ready());

	r = g4_request_start(&b.req, b.items.data, b.items.len);
	initStringInfo(&content);
	initStringInfo(&reasoning);
	while (g4_request_next(r, &kind, &data, &len))
	{
		if (kind == G4_MQ_CONTENT)
			appendBinaryStringInfo(&content, data, (int) len);
		else if (kind == G4_MQ_REASONING)
			appendBinaryStringInfo(&reasoning, data, (int) len);
	}
	prompt_tokens = r->hdr->prompt_tokens;
	completion_tokens = r->hdr->completion_tokens;
	finish_reason = r->hdr->finish_reason;
	g4_request_finish(r);

	initStringInfo(&json);
	appendStringInfoString(&json, "{\"content\": ");
	escape_json(&json, g4_text_to_server(content.data, content.len, &slen));
	if (b.req.thinking)
	{
		appendStringInfoString(&json, ", \"reasoning\": ");
		escape_json(&json, g4_text_to_server(reasoning.data, reasoning.len, &slen));
	}
	appendStringInfo(&json, ", \"finish_reason\": \"%s\", \"usage\": {\"prompt_tokens\": %d, \"completion_tokens\": %d, \"total_tokens\": %d}}",
					 finish_reason_name(finish_reason), prompt_tokens, completion_tokens,
					 prompt_tokens + completion_tokens);
	PG_RETURN_DATUM(DirectFunctionCall1(jsonb_in, CStringGetDatum(json.data)));
}

/* ---- table jobs --------------------------------------------------------- */

/*
 * A table job's request for one row: the row's prompt as a chat message
 * after the job's system message, or as a raw completion (completion, no
 * system message), with the job's options (gemma_chat's keys), checked as
 * gemma_chat checks them.
 */
void
g4_build_job_request(G4WireRequest *req, StringInfo items, bool completion, const char *system,
					 const char *prompt, ArrayType *images, ArrayType *audio, Jsonb *options,
					 int window)
{
	G4Build		b;

	build_init(&b, completion ? G4_KIND_TEXT : G4_KIND_CHAT);
	/* in gemma_generate's order */
	if (images)
		add_media_array(&b, images, G4_ITEM_IMAGE, "images");
	if (audio)
		add_media_array(&b, audio, G4_ITEM_AUDIO, "audio");
	if (system)
		add_text_item(&b, G4_ITEM_SYSTEM, system);
	add_text_item(&b, completion ? G4_ITEM_PROMPT : G4_ITEM_USER, prompt);
	if (options)
		parse_options(&b, options);
	build_finish(&b, window);
	*req = b.req;
	*items = b.items;
}

/* An answer's UTF-8 bytes as text in the database encoding. */
text *
g4_answer_text(const char *utf8, Size len)
{
	Size		slen;
	char	   *s = g4_text_to_server(utf8, len, &slen);

	return cstring_to_text_with_len(s, (int) slen);
}
