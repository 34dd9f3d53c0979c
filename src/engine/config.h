/*
 * config.h — the decoder's hyper-parameters, read from a checkpoint.
 *
 * One configuration structure covers the Gemma 4 text decoders (unified
 * 12B, plain text configs) and Gemma 3: every difference between them is a
 * field here, never a fork of the forward pass.
 */
#ifndef G4_CONFIG_H
#define G4_CONFIG_H

#include <stdint.h>

#include "engine.h"

#define G4_MAX_LAYERS 256
#define G4_MAX_EOS 8
#define G4_MAX_SUPPRESS 16

typedef enum
{
	G4_FAMILY_GEMMA4 = 0,
	G4_FAMILY_GEMMA3 = 1
} g4_family;

typedef enum
{
	G4_ROPE_DEFAULT = 0,
	G4_ROPE_PROPORTIONAL = 1,	/* Gemma 4 full layers: partial rotation, exponent over full hd */
	G4_ROPE_LINEAR = 2			/* frequencies divided by factor */
} g4_rope_kind;

/* Geometry of one attention type (index G4_KVG_SLIDING / G4_KVG_FULL). */
typedef struct
{
	int			head_dim;
	int			n_kv_heads;
	int			k_eq_v;			/* no v_proj: V derives from the k projection */
	int			rope_kind;
	double		rope_theta;
	double		partial_rotary_factor;
	double		rope_factor;
} g4_attn_type;

typedef struct
{
	int			family;			/* g4_family */
	char		architecture[128];
	char		model_type[64];

	int			vocab_size;
	int			hidden_size;
	int			intermediate_size;
	int			n_layers;
	int			n_heads;
	int			layer_full[G4_MAX_LAYERS];	/* 1 = full attention, 0 = sliding */
	g4_attn_type attn[2];		/* [0] sliding, [1] full */
	int			sliding_window;
	double		rms_eps;
	int			max_position;

	/* numerics that differ between families */
	float		attn_scale;		/* multiplies q·k */
	int			v_norm;			/* RMS-normalise V without weight */
	int			norm_plus_one;	/* checkpoint norm weights are stored as w-1 */
	int			has_layer_scalar;
	double		final_softcap;	/* 0 = none */
	int			embed_scale_bf16;	/* round sqrt(hidden) to bf16 before use */
	int			bidirectional_vision;	/* image blocks attend bidirectionally */

	/* tokens */
	int			bos_id;
	int			pad_id;
	int			eos_ids[G4_MAX_EOS];
	int			n_eos;
	int			suppress_ids[G4_MAX_SUPPRESS];
	int			n_suppress;
	int			image_token_id, boi_id, eoi_id;
	int			audio_token_id, boa_id, eoa_id;
	int			video_token_id;

	/* generation_config.json defaults (informational; the product is greedy
	 * unless the caller asks otherwise) */
	double		gen_temperature;
	int			gen_top_k;
	double		gen_top_p;

	/* quantisation (compressed-tensors) */
	int			quantized;		/* pack-quantized int4 linears present */
	int			group_size;

	/* MTP assistant (gemma4_unified_assistant): its layers have queries
	 * only and read the target's K/V; input [target embedding, target
	 * hidden] of 2 * backbone_hidden, output projected back to it */
	int			assistant;
	int			backbone_hidden;
} g4_model_config;

/* Geometry of layer i. */
static inline const g4_attn_type *
g4_layer_attn(const g4_model_config *c, int layer)
{
	return &c->attn[c->layer_full[layer] ? 1 : 0];
}

/* Parse a Hugging Face model directory's config.json (+ generation_config.json
 * when present). */
int			g4_config_load_hf(const char *dir, g4_model_config *c, g4_err *err);

/* The same for an MTP assistant's directory (gemma4[_unified]_assistant). */
int			g4_config_load_assistant_hf(const char *dir, g4_model_config *c, g4_err *err);

struct g4_gguf;
/* Read the decoder configuration from GGUF metadata. */
int			g4_config_load_gguf(const struct g4_gguf *g, g4_model_config *c, g4_err *err);

/* Check internal consistency (dimensions, layer pattern, group sizes). */
int			g4_config_validate(const g4_model_config *c, g4_err *err);

/* Inverse RoPE frequencies of an attention type: out[head_dim/2]. */
void		g4_config_inv_freq(const g4_attn_type *a, float *out);
int			g4_config_rope_pairs(const g4_attn_type *a);

#endif
