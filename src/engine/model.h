/*
 * model.h — a loaded decoder: configuration, weights on the backend, and the
 * forward pass of one scheduler step.
 */
#ifndef G4_MODEL_H
#define G4_MODEL_H

#include "backend.h"
#include "config.h"

typedef struct
{
	g4_weight  *qkv;			/* [q; k; v] fused along the output (no v when k_eq_v) */
	g4_weight  *o;
	g4_weight  *gate_up;		/* [gate; up] */
	g4_weight  *down;
	float	   *attn_norm;		/* device f32 [hidden]; all norms already include +1 where the checkpoint stores w-1 */
	float	   *post_attn_norm;
	float	   *pre_ffn_norm;
	float	   *post_ffn_norm;
	float	   *q_norm;			/* device f32 [head_dim] */
	float	   *k_norm;
	float		layer_scalar;
	int			q_dim;			/* n_heads * head_dim */
	int			kv_dim;			/* n_kv_heads * head_dim */
	g4_kv_layer kv;				/* this layer's view of the KV pool */
} g4_layer;

/* The vision embedder (model.vision_embedder.* / model.embed_vision.*):
 * 6912 raw patch values -> LN -> Dense(+bias) -> LN -> + 2-D position table
 * -> LN -> RMSNorm (no weight) -> Linear to the hidden size. */
typedef struct
{
	int			dim;			/* mm_embed_dim */
	int			n_pos;			/* positions per axis of the table */
	float	   *ln1_w,
			   *ln1_b;			/* device f32 [6912] */
	g4_weight  *dense;			/* [dim][6912] */
	float	   *dense_b;		/* device f32 [dim] */
	float	   *ln2_w,
			   *ln2_b,
			   *pos_norm_w,
			   *pos_norm_b;		/* device f32 [dim] */
	float	   *pos_table;		/* device f32 [n_pos][2][dim] */
	g4_weight  *proj;			/* [hidden][dim] */
} g4_vision_embedder;

typedef struct g4_model
{
	g4_model_config cfg;
	g4_backend *be;
	g4_weight  *embed;			/* [vocab][hidden], also the tied LM head */
	float	   *final_norm;
	float	   *inv_freq[2];	/* device, [head_dim/2] per attention type */
	float		embed_scale;
	g4_layer   *layers;
	g4_vision_embedder *vision; /* NULL when the checkpoint has no vision embedder */
	g4_weight  *audio_proj;		/* [hidden][640]; NULL without an audio embedder */
	size_t		weight_bytes;	/* device bytes of all weights */
	int64_t		n_params;
	/* MTP assistant only (cfg.assistant): layers' qkv hold q alone */
	g4_weight  *pre_proj;		/* [hidden][2 * backbone_hidden] */
	g4_weight  *post_proj;		/* [backbone_hidden][hidden] */
	/* target only: positions before the sliding window an assistant still
	 * reads (the KV pool keeps them) */
	int			sliding_keep_extra;
	/* target only: the engine's progress reports, ticked between layers and
	 * media items (NULL for the assistant: its passes are a few rows) */
	struct g4_progress *progress;
	/* checkpoint sources kept open: CPU weights point into their mappings */
	struct g4_safetensors *st;
	struct g4_gguf *gguf;
} g4_model;

/* Load a model directory (safetensors) or .gguf file onto a backend. */
int			g4_model_load(const char *path, g4_backend *be, g4_model **out, int verbose,
						  g4_err *err);
/* Load an MTP assistant directory (bf16 or int4) onto a backend. */
int			g4_model_load_assistant(const char *dir, g4_backend *be, g4_model **out, g4_err *err);
void		g4_model_free(g4_model *m);

/* Activation buffers for steps of up to max_tokens rows and max_logits
 * logit rows. */
typedef struct
{
	int			max_tokens;
	int			max_logits;
	int			mlp_rows;		/* rows per MLP slice (bounds the gate/up buffer) */
	float	   *x;				/* [T][H] residual stream */
	float	   *h;				/* [T][H] */
	float	   *qkv;			/* [T][q+k+v] */
	float	   *attn;			/* [T][q_dim] */
	float	   *gu;				/* [mlp_rows][2F] */
	float	   *act;			/* [mlp_rows][F] */
	float	   *lx;				/* [max_logits][H] */
	float	   *logits;			/* [max_logits][V] */
	size_t		bytes;
	int			no_graphs;		/* issue every step's operations, never replay */
} g4_workspace;

int			g4_workspace_init(g4_model *m, int max_tokens, int max_logits, g4_workspace *ws,
							  g4_err *err);
void		g4_workspace_free(g4_model *m, g4_workspace *ws);
/* Bytes g4_workspace_init would allocate. */
size_t		g4_workspace_bytes(const g4_model_config *c, int max_tokens, int max_logits);
int			g4_mlp_slice_rows(const g4_workspace *ws, int n_tokens);

/* Embedding rows supplied instead of token lookups (image/audio soft
 * tokens): rows[i] goes to step row row_index[i]. Host memory. */
typedef struct
{
	int			n;
	const int32_t *row_index;
	const float *rows;			/* [n][hidden] */
} g4_embed_rows;

/* Soft-token rows of one preprocessed media item (media_embed.c):
 * rows [in->n_tokens][hidden], host memory.  Engine thread only. */
struct g4_media_input;
int			g4_model_embed_media(g4_model *m, const struct g4_media_input *in, float *rows, g4_err *err);

/* The head runs of a layer's fused q/k/v row for head_norm_rope: q with
 * its norm and RoPE; on k_eq_v layers the raw key (stored as V) normalised
 * without weight; else k with its norm and RoPE, and v normalised without
 * weight where the model has v_norm.  The k and v runs are marked as the
 * rows kv_store writes.  Returns the run count. */
int			g4_layer_head_runs(const g4_model_config *c, const g4_layer *ly, g4_head_run runs[G4_HEAD_RUNS_MAX]);

/* Run one step (metadata already described by meta) and leave the logits of
 * meta->logit_rows in ws->logits (device). */
int			g4_model_forward(g4_model *m, g4_workspace *ws, const g4_step_meta *meta,
							 const g4_embed_rows *extra, g4_err *err);

/* After g4_model_forward, the logits of further rows of the same step: meta
 * describes the step again with other logit_rows (at most ws->max_logits);
 * they are left in ws->logits (device).  Scoring every position of a long
 * prompt this way needs no logits buffer as tall as the step. */
int			g4_model_logits(g4_model *m, g4_workspace *ws, const g4_step_meta *meta, g4_err *err);

#endif
