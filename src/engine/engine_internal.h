/*
 * engine_internal.h — the engine's private structures, shared by engine.c
 * (lifecycle and API), seq.c (one request's life: prompt, sampling state,
 * output text) and schedule.c (batching sequences into steps).
 *
 * Also the few entry points tests use beyond engine.h.
 */
#ifndef G4_ENGINE_INTERNAL_H
#define G4_ENGINE_INTERNAL_H

#include "chat.h"
#include "draft.h"
#include "kvpool.h"
#include "model.h"
#include "prefix_cache.h"
#include "sampler.h"
#include "tokenizer.h"
#include "util.h"

typedef struct g4_seq
{
	uint64_t	id;
	uint64_t	user_tag;
	int			state;			/* g4_seq_state */
	int			slot;			/* row of the block tables while admitted, else -1 */
	uint64_t	admit_order;	/* for preemption: youngest goes first */

	/* tokens: the prompt followed by what was generated */
	int32_t    *tok;
	int			n_tok;
	int			cap_tok;
	int			n_prompt;
	int			n_computed;		/* positions whose K/V are in the pool */
	int			n_generated;
	int			max_tokens;

	/* multimodal prompt positions (NULL when text only) */
	int32_t    *mm_block;		/* [n_prompt] bidirectional block id or -1 */
	int32_t    *embed_pos;		/* prompt positions taking a precomputed row */
	float	   *embed_rows;		/* [n_embeds][hidden] */
	int			n_embeds;
	/* request media, preprocessed, until the embedders turn them into
	 * embed_rows (in the order of embed_pos) */
	struct g4_media_input *media_in;
	int			n_media_in;

	/* sampling */
	g4_sampling samp;
	g4_rng		rng;
	g4_token_hist hist;
	int			has_hist;

	/* output text */
	g4_detok	detok;
	g4_buf		piece;			/* text decoded by the current token */
	g4_buf		held;			/* content text held back: may start a stop string */
	char	  **stop;
	int			n_stop;
	int			channel;		/* g4_channel of the text being produced */
	int			in_channel_header;	/* swallowing the channel name after <|channel> */
	int			matched_stop;	/* a stop string ended the output: nothing more is shown */

	/* prefix caching (prefix_cache.c) */
	uint64_t   *block_hash;		/* content key of each full prompt block; NULL until first looked up */
	int			n_block_hash;
	int			keep_lo,
				keep_hi;		/* sliding blocks to mark kept once computed */

	/* timings (g4_now) */
	double		t_submit;
	double		t_first;
	double		t_last;

	/* speculative decoding (speculative.c): drafts for positions n_tok..,
	 * following the pending token tok[n_tok - 1] */
	int			spec_off;		/* the request disabled drafting */
	int32_t		draft[G4_SPEC_MAX_TOKENS];
	int			n_draft;
	int			spec_row;		/* logits row of this step that chose the pending token, or -1 */
	float		spec_rate;		/* running mean of drafts accepted per verify */
} g4_seq;

struct g4_engine
{
	g4_options	opts;
	g4_backend *be;
	g4_model   *model;
	g4_tokenizer *tok;
	g4_chat_ids chat;
	int			chat_ok;
	g4_kvpool	kv;
	uint64_t	prefix_key[2];	/* secret key of the prefix cache's content hashes */
	g4_workspace ws;
	int			max_model_len;
	int			max_seqs;
	int			max_batched;
	int			max_logits;

	int32_t		eos[G4_MAX_EOS + 4];
	int			n_eos;
	int32_t		channel_open;	/* <|channel> or -1 */
	int32_t		channel_close;	/* <channel|> or -1 */

	/* every live sequence, in arrival order */
	g4_seq	  **seqs;
	int			n_seqs;
	int			cap_seqs;
	uint8_t    *slot_used;
	uint64_t	next_id;
	uint64_t	next_admit;
	g4_rng		seeder;

	/* step buffers (host) */
	int32_t    *st_token,
			   *st_pos,
			   *st_slot,
			   *st_lo[G4_KVG_COUNT],
			   *st_hi[G4_KVG_COUNT];
	int32_t    *st_logit_rows;
	g4_seq	  **st_logit_seq;	/* sequence of each logit row */
	int32_t    *st_ids;			/* ids chosen on the device, per logit row */
	g4_row_sampling *st_samp;	/* their sampling parameters and draws */
	int32_t    *st_embed_index;
	float	   *st_embed_rows;
	int			st_cap_embeds;
	float	   *logits_host;	/* [max_logits][vocab] */
	g4_sampler_scratch scratch;

	/* progress reports of long calls (g4_options.progress); the model
	 * points here */
	g4_progress progress;

	/* statistics */
	g4_stats	stats;
	char		device_name[160];
	char		kv_dtype_name[32];

	/* speculative decoding (speculative.c); draft.m NULL when off */
	g4_draft	draft;
	int			spec_k;			/* num_speculative_tokens, capped */
	double	   *spec_p;			/* host [vocab]: target distribution (sampled verify) */
	g4_seq	  **spec_seq;		/* [max_seqs] the drafting rows' sequences */
	int32_t    *spec_tok,
			   *spec_pos,
			   *spec_slot,
			   *spec_lo[G4_KVG_COUNT],
			   *spec_hi[G4_KVG_COUNT],
			   *spec_rows,		/* [max_seqs] each drafting row's target row in ws.lx */
			   *spec_ids;		/* [G4_SPEC_MAX_TOKENS][max_seqs]: a round's proposals */

	/* test hook: the drafts proposed for a sequence (may rewrite them) */
	void		(*draft_hook) (void *ctx, uint64_t seq_id, int first_pos, int32_t *drafts, int n);
	void	   *draft_hook_ctx;

	/* test hooks: every row of logits before sampling, every sampled id */
	void		(*logits_hook) (void *ctx, uint64_t seq_id, const float *logits, int vocab);
	void		(*token_hook) (void *ctx, uint64_t seq_id, int32_t token);
	void	   *hook_ctx;
};

/* ---- seq.c ---- */
g4_seq	   *g4_seq_new(g4_engine *e, const g4_request *req, g4_err *err);
/* g4_seq_new in two parts: any thread, then the engine thread */
g4_seq	   *g4_seq_prepare(const g4_engine *e, const g4_request *req, const g4_cancel_flag *cancel,
						   g4_err *err);
void		g4_seq_admit(g4_engine *e, g4_seq *s);
void		g4_seq_free(g4_seq *s);
int			g4_seq_append(g4_seq *s, int32_t id);
/* Process a sampled id: a token goes to the token hook, text events and
 * stop checks; G4_SAMPLE_NAN (a NaN row) fails the sequence with
 * G4_ERR_NUMERIC.  Returns 1 when the sequence ended (a G4_EV_FINISH or
 * G4_EV_ERROR was delivered, its KV blocks released). */
int			g4_seq_emit_token(g4_engine *e, g4_seq *s, int32_t id, g4_event_fn fn, void *ctx);
void		g4_seq_finish(g4_engine *e, g4_seq *s, int reason, g4_event_fn fn, void *ctx);
void		g4_seq_fail(g4_engine *e, g4_seq *s, int code, const char *msg, g4_event_fn fn, void *ctx);
/* Every bidirectional block must fit one step (blocks are never split). */
int			g4_seq_check_blocks(const g4_engine *e, const g4_seq *s, g4_err *err);
/* Run the embedders over the sequence's media (engine thread). */
int			g4_seq_embed_media(g4_engine *e, g4_seq *s, g4_err *err);
/* id ends a sequence (the model's and the chat format's stop ids). */
int			g4_is_eos(const g4_engine *e, int32_t id);

/* ---- schedule.c ---- */
typedef struct
{
	g4_seq	   *seq;
	int			start;			/* first position fed this step */
	int			count;			/* tokens fed */
	int			wants_logits;
	int			n_draft;		/* of which drafts to verify (every row gets logits) */
} g4_sched_item;

typedef struct
{
	g4_sched_item *items;
	int			n_items;
	int			cap_items;
	int			n_tokens;
	int			n_logits;
} g4_schedule;

/* Choose this step's work, admitting and preempting as needed, and allocate
 * the KV blocks it writes. */
int			g4_schedule_step(g4_engine *e, g4_schedule *sc, g4_event_fn fn, void *ctx, g4_err *err);
/* The step metadata over the engine's step arrays (st_*), their first
 * n_tokens rows and n_logits logits rows. */
void		g4_step_meta_view(const g4_engine *e, int n_tokens, int n_logits, g4_step_meta *meta);
/* Fill the step metadata arrays for a schedule. */
int			g4_schedule_meta(g4_engine *e, const g4_schedule *sc, g4_step_meta *meta,
							 g4_embed_rows *extra, g4_err *err);
void		g4_schedule_free(g4_schedule *sc);
/* Release a sequence's slot and KV blocks. */
void		g4_release_slot(g4_engine *e, g4_seq *s);
/* Withdraw the slot's blocks from the prefix cache (their content is not
 * to be trusted); g4_release_slot still frees them. */
void		g4_forget_slot(g4_engine *e, g4_seq *s);
/* Free the sliding blocks no query at n_computed or later can see. */
void		g4_seq_trim_window(g4_engine *e, g4_seq *s);

/* ---- engine.c ---- */
/* Device memory the backend holds for its own use, all uses together. */
size_t		g4_backend_held_bytes(g4_backend *be);

/* ---- speculative.c ---- */
/* Load the draft model named by the options (nothing when none) and size
 * the buffers; called by g4_open after the target and before the pool. */
int			g4_spec_open(g4_engine *e, g4_err *err);
void		g4_spec_close(g4_engine *e);
/* The token of position p of s: its tokens, then its drafts. */
static inline int32_t
g4_seq_token_at(const g4_seq *s, int p)
{
	return p < s->n_tok ? s->tok[p] : s->draft[p - s->n_tok];
}
/* Accept or reject a verify item's drafts from its logits rows (row0..),
 * emit the tokens, roll the KV back past the last accepted position. */
void		g4_spec_verify(g4_engine *e, const g4_sched_item *it, int row0, int device_ids, g4_event_fn fn,
						   void *ctx);
/* Propose the next drafts of every decoding sequence that chose a token
 * this step (spec_row >= 0: its row of the step's final-normed hidden
 * states, ws.lx), in one round of draft passes. */
int			g4_spec_draft(g4_engine *e, g4_err *err);

/* ---- test entry points ---- */

/* Submit token ids with precomputed embedding rows at some prompt positions
 * (soft tokens; positions ascending) and the bidirectional block id of each
 * prompt position. */
int			g4_submit_embeds(g4_engine *e, const g4_request *req, int n_embeds,
							 const int32_t *embed_pos, const float *embed_rows,
							 const int32_t *mm_block, uint64_t *seq_id, g4_err *err);

void		g4_set_hooks(g4_engine *e,
						 void (*logits_fn) (void *ctx, uint64_t seq_id, const float *logits, int vocab),
						 void (*token_fn) (void *ctx, uint64_t seq_id, int32_t token),
						 void *ctx);

void		g4_set_draft_hook(g4_engine *e,
							  void (*fn) (void *ctx, uint64_t seq_id, int first_pos, int32_t *drafts, int n),
							  void *ctx);

const g4_model *g4_engine_model(const g4_engine *e);
const g4_tokenizer *g4_engine_tokenizer(const g4_engine *e);

#endif
