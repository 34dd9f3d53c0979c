/*
 * config.c — decoder configuration from a Hugging Face config.json (Gemma 4
 * unified / text, Gemma 3) or from GGUF metadata.
 */
#include "config.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "json.h"
#include "util.h"

/* An integer field as int; one outside int's range reads as -1, which the
 * checks below refuse (a plain cast would wrap it into range). */
static int
cfg_value_int(const g4j *v, int64_t dflt)
{
	int64_t		x = g4j_int(v, dflt);

	return x < INT_MIN || x > INT_MAX ? -1 : (int) x;
}

static int
cfg_int(const g4j *obj, const char *key, int64_t dflt)
{
	return cfg_value_int(g4j_get(obj, key), dflt);
}

static void
set_defaults(g4_model_config *c)
{
	memset(c, 0, sizeof(*c));
	c->rms_eps = 1e-6;
	c->bos_id = 2;
	c->pad_id = 0;
	c->eos_ids[0] = 1;
	c->n_eos = 1;
	c->image_token_id = c->boi_id = c->eoi_id = -1;
	c->audio_token_id = c->boa_id = c->eoa_id = -1;
	c->video_token_id = -1;
	c->attn_scale = 1.0f;
	c->gen_temperature = 1.0;
	c->gen_top_p = 1.0;
	c->attn[0].rope_theta = c->attn[1].rope_theta = 10000.0;
	c->attn[0].partial_rotary_factor = c->attn[1].partial_rotary_factor = 1.0;
	c->attn[0].rope_factor = c->attn[1].rope_factor = 1.0;
}

/* Read an int field that may be a number or a list of numbers. */
static int
read_ids(const g4j *v, int *out, int max)
{
	int			n = 0;

	if (g4j_is(v, G4J_NUMBER))
	{
		out[0] = cfg_value_int(v, -1);
		return 1;
	}
	if (g4j_is(v, G4J_ARRAY))
	{
		size_t		i;

		for (i = 0; i < g4j_len(v) && n < max; i++)
			out[n++] = cfg_value_int(g4j_at(v, i), -1);
	}
	return n;
}

static int
parse_rope(const g4j *rp, g4_attn_type *a, const char *what, g4_err *err)
{
	const char *type;

	if (!rp)
		return G4_OK;
	type = g4j_get_str(rp, "rope_type");
	if (!type)
		type = g4j_get_str(rp, "type");
	if (g4j_get(rp, "rope_theta"))
		a->rope_theta = g4j_get_num(rp, "rope_theta", a->rope_theta);
	a->partial_rotary_factor = g4j_get_num(rp, "partial_rotary_factor", 1.0);
	a->rope_factor = g4j_get_num(rp, "factor", 1.0);
	if (!type || strcmp(type, "default") == 0)
		a->rope_kind = a->rope_factor != 1.0 ? G4_ROPE_LINEAR : G4_ROPE_DEFAULT;
	else if (strcmp(type, "proportional") == 0)
		a->rope_kind = G4_ROPE_PROPORTIONAL;
	else if (strcmp(type, "linear") == 0)
		a->rope_kind = G4_ROPE_LINEAR;
	else
		return g4_fail(err, G4_ERR_UNSUPPORTED, "config.json: rope_type \"%s\" of %s layers is not supported",
					   type, what);
	if (a->partial_rotary_factor != 1.0 && a->rope_kind != G4_ROPE_PROPORTIONAL)
		return g4_fail(err, G4_ERR_UNSUPPORTED,
					   "config.json: partial_rotary_factor %g with rope_type \"%s\" is not supported",
					   a->partial_rotary_factor, type);
	return G4_OK;
}

static int
parse_layer_types(const g4j *text, g4_model_config *c, int default_pattern, g4_err *err)
{
	const g4j  *lt = g4j_get(text, "layer_types");
	int			i;

	if (lt)
	{
		if (!g4j_is(lt, G4J_ARRAY) || (int) g4j_len(lt) != c->n_layers)
			return g4_fail(err, G4_ERR_FORMAT,
						   "config.json: layer_types must list %d entries, found %zu",
						   c->n_layers, g4j_len(lt));
		for (i = 0; i < c->n_layers; i++)
		{
			const char *s = g4j_str(g4j_at(lt, (size_t) i));

			if (s && strcmp(s, "full_attention") == 0)
				c->layer_full[i] = 1;
			else if (s && strcmp(s, "sliding_attention") == 0)
				c->layer_full[i] = 0;
			else
				return g4_fail(err, G4_ERR_UNSUPPORTED,
							   "config.json: layer_types[%d] = \"%s\" is not supported", i, s ? s : "?");
		}
	}
	else
	{
		int			pattern = cfg_int(text, "sliding_window_pattern", default_pattern);

		if (pattern <= 0)
			pattern = default_pattern;
		for (i = 0; i < c->n_layers; i++)
			c->layer_full[i] = ((i + 1) % pattern) == 0;
	}
	return G4_OK;
}

/* The text config's defaults where the two families differ. */
typedef struct
{
	int			vocab_size;
	int			n_layers;
	int			sliding_window;
	int			max_position;
} text_defaults;

/* What a Gemma 3 and a Gemma 4 text config share: sizes, window, norm
 * epsilon, context, the layers and their attention kinds. */
static int
parse_text_common(const g4j *text, g4_model_config *c, const text_defaults *d, g4_err *err)
{
	c->vocab_size = cfg_int(text, "vocab_size", d->vocab_size);
	c->hidden_size = cfg_int(text, "hidden_size", 2304);
	c->intermediate_size = cfg_int(text, "intermediate_size", 9216);
	c->n_layers = cfg_int(text, "num_hidden_layers", d->n_layers);
	c->n_heads = cfg_int(text, "num_attention_heads", 8);
	c->sliding_window = cfg_int(text, "sliding_window", d->sliding_window);
	c->rms_eps = g4j_get_num(text, "rms_norm_eps", 1e-6);
	c->max_position = cfg_int(text, "max_position_embeddings", d->max_position);
	if (c->n_layers <= 0 || c->n_layers > G4_MAX_LAYERS)
		return g4_fail(err, G4_ERR_FORMAT, "config.json: num_hidden_layers = %d is out of range (1..%d)",
					   c->n_layers, G4_MAX_LAYERS);
	{
		/* an assistant's layers all read the target's K/V (0 means all) */
		int64_t		shared = g4j_get_int(text, "num_kv_shared_layers", 0);

		if (c->assistant && shared != 0 && shared != c->n_layers)
			return g4_fail(err, G4_ERR_UNSUPPORTED,
						   "config.json: an assistant with %lld of %d layers KV-shared is not supported (all must be)",
						   (long long) shared, c->n_layers);
	}
	return parse_layer_types(text, c, 6, err);
}

static int
parse_gemma4_text(const g4j *text, g4_model_config *c, g4_err *err)
{
	const g4j  *rp;
	const g4j  *plc;

	c->family = G4_FAMILY_GEMMA4;
	if (g4j_get_int(text, "hidden_size_per_layer_input", 0) > 0)
		return g4_fail(err, G4_ERR_UNSUPPORTED,
					   "config.json: per-layer embeddings (hidden_size_per_layer_input) are not supported");
	if (g4j_get_bool(text, "enable_moe_block", 0))
		return g4_fail(err, G4_ERR_UNSUPPORTED, "config.json: mixture-of-experts layers are not supported");
	if (!c->assistant && g4j_get_int(text, "num_kv_shared_layers", 0) > 0)
		return g4_fail(err, G4_ERR_UNSUPPORTED, "config.json: KV-shared layers are not supported in a target model");
	{
		const char *use_bidi = g4j_get_str(text, "use_bidirectional_attention");

		if (use_bidi && strcmp(use_bidi, "all") == 0)
			return g4_fail(err, G4_ERR_UNSUPPORTED,
						   "config.json: use_bidirectional_attention \"all\" (an encoder) is not supported");
		c->bidirectional_vision = !g4j_get(text, "use_bidirectional_attention") ||
			(use_bidi && strcmp(use_bidi, "vision") == 0);
	}

	{
		const text_defaults d = {262144, 30, 1024, 262144};

		if (parse_text_common(text, c, &d, err) != G4_OK)
			return err->code;
	}
	/* the last layer is always full attention (transformers forces it) */
	c->layer_full[c->n_layers - 1] = 1;

	c->attn[0].head_dim = cfg_int(text, "head_dim", 256);
	c->attn[0].n_kv_heads = cfg_int(text, "num_key_value_heads", 4);
	c->attn[0].k_eq_v = 0;
	c->attn[1].head_dim = cfg_int(text, "global_head_dim", 512);
	c->attn[1].n_kv_heads = c->attn[0].n_kv_heads;
	c->attn[1].k_eq_v = g4j_get_bool(text, "attention_k_eq_v", 0);
	if (c->attn[1].k_eq_v && g4j_is(g4j_get(text, "num_global_key_value_heads"), G4J_NUMBER))
		c->attn[1].n_kv_heads = cfg_int(text, "num_global_key_value_heads", 1);

	/* serialised per-layer overrides win over the global_* keys */
	plc = g4j_get(text, "per_layer_config");
	if (g4j_is(plc, G4J_OBJECT) && g4j_len(plc) > 0)
	{
		size_t		k;

		for (k = 0; k < g4j_len(plc); k++)
		{
			const char *key = g4j_str(g4j_key_at(plc, k));
			const g4j  *ov = g4j_value_at(plc, k);
			char	   *end;
			long		li = key ? strtol(key, &end, 10) : -1;
			g4_attn_type *a;

			if (!key || *end != '\0')
			{
				if (key && (strcmp(key, "full_attention") == 0 || strcmp(key, "sliding_attention") == 0))
					li = -2;
				else
					return g4_fail(err, G4_ERR_FORMAT, "config.json: per_layer_config key \"%s\" is not a layer index",
								   key ? key : "?");
			}
			if (li >= c->n_layers)
				return g4_fail(err, G4_ERR_FORMAT, "config.json: per_layer_config names layer %ld of %d", li,
							   c->n_layers);
			if (li == -2)
				a = &c->attn[strcmp(key, "full_attention") == 0 ? 1 : 0];
			else
				a = &c->attn[c->layer_full[li] ? 1 : 0];
			if (g4j_get(ov, "head_dim"))
				a->head_dim = cfg_int(ov, "head_dim", a->head_dim);
			if (g4j_get(ov, "num_key_value_heads"))
				a->n_kv_heads = cfg_int(ov, "num_key_value_heads", a->n_kv_heads);
		}
	}

	c->attn[0].rope_theta = 10000.0;
	c->attn[1].rope_theta = 1000000.0;
	c->attn[1].rope_kind = G4_ROPE_PROPORTIONAL;
	c->attn[1].partial_rotary_factor = 0.25;
	rp = g4j_get(text, "rope_parameters");
	if (rp)
	{
		if (parse_rope(g4j_get(rp, "sliding_attention"), &c->attn[0], "sliding", err) != G4_OK ||
			parse_rope(g4j_get(rp, "full_attention"), &c->attn[1], "full", err) != G4_OK)
			return err->code;
	}

	{
		const g4j  *sc = g4j_get(text, "final_logit_softcapping");

		c->final_softcap = g4j_is(sc, G4J_NUMBER) ? g4j_num(sc, 0) : 0.0;
	}
	c->attn_scale = 1.0f;
	c->v_norm = 1;
	c->norm_plus_one = 0;
	c->has_layer_scalar = 1;
	if (g4j_get(text, "bos_token_id"))
		c->bos_id = cfg_int(text, "bos_token_id", 2);
	if (g4j_get(text, "pad_token_id"))
		c->pad_id = cfg_int(text, "pad_token_id", 0);
	if (g4j_get(text, "eos_token_id"))
		c->n_eos = read_ids(g4j_get(text, "eos_token_id"), c->eos_ids, G4_MAX_EOS);
	{
		const char *act = g4j_get_str(text, "hidden_activation");

		if (act && strcmp(act, "gelu_pytorch_tanh") != 0)
			return g4_fail(err, G4_ERR_UNSUPPORTED, "config.json: hidden_activation \"%s\" is not supported", act);
	}
	if (!g4j_get_bool(text, "tie_word_embeddings", 1))
		return g4_fail(err, G4_ERR_UNSUPPORTED, "config.json: untied word embeddings are not supported");
	return G4_OK;
}

static int
parse_gemma3_text(const g4j *text, g4_model_config *c, g4_err *err)
{
	const g4j  *rs;
	const g4j  *rp;

	c->family = G4_FAMILY_GEMMA3;
	{
		const text_defaults d = {262208, 26, 4096, 131072};

		if (parse_text_common(text, c, &d, err) != G4_OK)
			return err->code;
	}
	c->attn[0].head_dim = c->attn[1].head_dim = cfg_int(text, "head_dim", 256);
	c->attn[0].n_kv_heads = c->attn[1].n_kv_heads = cfg_int(text, "num_key_value_heads", 4);
	c->attn[0].rope_theta = g4j_get_num(text, "rope_local_base_freq", 10000.0);
	c->attn[1].rope_theta = g4j_get_num(text, "rope_theta", 1000000.0);
	rs = g4j_get(text, "rope_scaling");
	if (g4j_is(rs, G4J_OBJECT) && parse_rope(rs, &c->attn[1], "full", err) != G4_OK)
		return err->code;
	rp = g4j_get(text, "rope_parameters");
	if (rp)
	{
		if (parse_rope(g4j_get(rp, "sliding_attention"), &c->attn[0], "sliding", err) != G4_OK ||
			parse_rope(g4j_get(rp, "full_attention"), &c->attn[1], "full", err) != G4_OK)
			return err->code;
	}
	c->attn_scale = (float) (1.0 / sqrt(g4j_get_num(text, "query_pre_attn_scalar", 256.0)));
	{
		const g4j  *sc = g4j_get(text, "final_logit_softcapping");

		c->final_softcap = g4j_is(sc, G4J_NUMBER) ? g4j_num(sc, 0) : 0.0;
		if (g4j_is(g4j_get(text, "attn_logit_softcapping"), G4J_NUMBER))
			return g4_fail(err, G4_ERR_UNSUPPORTED, "config.json: attn_logit_softcapping is not supported");
	}
	c->v_norm = 0;
	c->norm_plus_one = 1;
	c->has_layer_scalar = 0;
	c->bidirectional_vision = 0;
	if (g4j_get(text, "bos_token_id"))
		c->bos_id = cfg_int(text, "bos_token_id", 2);
	if (g4j_get(text, "pad_token_id"))
		c->pad_id = cfg_int(text, "pad_token_id", 0);
	if (g4j_get(text, "eos_token_id"))
		c->n_eos = read_ids(g4j_get(text, "eos_token_id"), c->eos_ids, G4_MAX_EOS);
	return G4_OK;
}

static int
parse_quantization(const g4j *root, g4_model_config *c, g4_err *err)
{
	const g4j  *q = g4j_get(root, "quantization_config");
	const g4j  *groups;
	size_t		i;

	if (!q)
		return G4_OK;
	{
		const char *method = g4j_get_str(q, "quant_method");

		if (!method || strcmp(method, "compressed-tensors") != 0)
			return g4_fail(err, G4_ERR_UNSUPPORTED, "config.json: quantization method \"%s\" is not supported",
						   method ? method : "?");
	}
	groups = g4j_get(q, "config_groups");
	for (i = 0; i < g4j_len(groups); i++)
	{
		const g4j  *grp = g4j_value_at(groups, i);
		const g4j  *w = g4j_get(grp, "weights");
		const char *fmt = g4j_get_str(grp, "format");
		const char *type;
		const char *strategy;

		if (!fmt)
			fmt = g4j_get_str(q, "format");
		if (fmt && strcmp(fmt, "pack-quantized") != 0)
			return g4_fail(err, G4_ERR_UNSUPPORTED,
						   "config.json: compressed-tensors format \"%s\" is not supported (pack-quantized is)", fmt);
		if (!w)
			continue;
		type = g4j_get_str(w, "type");
		strategy = g4j_get_str(w, "strategy");
		if (g4j_get_int(w, "num_bits", 0) != 4 || !type || strcmp(type, "int") != 0 ||
			!g4j_get_bool(w, "symmetric", 0) || !strategy || strcmp(strategy, "group") != 0)
			return g4_fail(err, G4_ERR_UNSUPPORTED,
						   "config.json: only symmetric int4 group quantisation is supported (found %d-bit %s %s%s)",
						   cfg_int(w, "num_bits", 0), type ? type : "?", strategy ? strategy : "?",
						   g4j_get_bool(w, "symmetric", 0) ? "" : " asymmetric");
		if (g4j_is(g4j_get(w, "actorder"), G4J_STRING))
			return g4_fail(err, G4_ERR_UNSUPPORTED, "config.json: activation-ordered (actorder) weights are not supported");
		c->group_size = cfg_int(w, "group_size", 0);
		if (c->group_size != 32)
			return g4_fail(err, G4_ERR_UNSUPPORTED, "config.json: int4 group size %d is not supported (32 is)",
						   c->group_size);
		if (g4j_get(grp, "input_activations") && !g4j_is(g4j_get(grp, "input_activations"), G4J_NULL))
			return g4_fail(err, G4_ERR_UNSUPPORTED, "config.json: quantised activations are not supported (w4a16 is)");
		c->quantized = 1;
	}
	return G4_OK;
}

/* The parsed JSON of a file, errors prefixed with its path; NULL after
 * recording why. */
static g4j_doc *
load_json(const char *path, g4_err *err)
{
	char	   *text = NULL;
	size_t		len;
	g4j_doc    *doc;

	if (g4_read_file(path, &text, &len, err) != G4_OK)
		return NULL;
	doc = g4j_parse(text, len, err);
	free(text);
	if (!doc)
		g4_fail_ctx(err, "%s", path);
	return doc;
}

static int
load_generation_config(const char *dir, g4_model_config *c, g4_err *err)
{
	char	   *path = g4_path_join(dir, "generation_config.json");
	g4j_doc    *doc;
	const g4j  *r;

	if (!path)
		return g4_fail(err, G4_ERR_NOMEM, "out of memory");
	if (!g4_is_file(path))
	{
		free(path);
		return G4_OK;
	}
	doc = load_json(path, err);
	free(path);
	if (!doc)
		return err->code;
	r = g4j_root(doc);
	if (g4j_get(r, "eos_token_id"))
		c->n_eos = read_ids(g4j_get(r, "eos_token_id"), c->eos_ids, G4_MAX_EOS);
	if (g4j_get(r, "bos_token_id"))
		c->bos_id = cfg_int(r, "bos_token_id", c->bos_id);
	if (g4j_get(r, "suppress_tokens"))
		c->n_suppress = read_ids(g4j_get(r, "suppress_tokens"), c->suppress_ids, G4_MAX_SUPPRESS);
	c->gen_temperature = g4j_get_num(r, "temperature", c->gen_temperature);
	c->gen_top_k = cfg_int(r, "top_k", c->gen_top_k);
	c->gen_top_p = g4j_get_num(r, "top_p", c->gen_top_p);
	g4j_free(doc);
	return G4_OK;
}

static int load_hf(const char *dir, g4_model_config *c, int assistant, g4_err *err);

int
g4_config_load_hf(const char *dir, g4_model_config *c, g4_err *err)
{
	return load_hf(dir, c, 0, err);
}

int
g4_config_load_assistant_hf(const char *dir, g4_model_config *c, g4_err *err)
{
	return load_hf(dir, c, 1, err);
}

static int
load_hf(const char *dir, g4_model_config *c, int assistant, g4_err *err)
{
	char	   *path = g4_path_join(dir, "config.json");
	g4j_doc    *doc;
	const g4j  *root;
	const g4j  *text_cfg;
	const char *mt;
	const char *arch;
	int			rc;

	set_defaults(c);
	if (!path)
		return g4_fail(err, G4_ERR_NOMEM, "out of memory");
	if (!g4_is_file(path))
	{
		rc = g4_fail(err, G4_ERR_IO, "%s: no config.json (is this a model directory?)", dir);
		free(path);
		return rc;
	}
	doc = load_json(path, err);
	free(path);
	if (!doc)
		return err->code;
	root = g4j_root(doc);
	mt = g4j_get_str(root, "model_type");
	arch = g4j_str(g4j_at(g4j_get(root, "architectures"), 0));
	snprintf(c->model_type, sizeof(c->model_type), "%s", mt ? mt : "");
	snprintf(c->architecture, sizeof(c->architecture), "%s", arch ? arch : (mt ? mt : "?"));
	text_cfg = g4j_get(root, "text_config");
	if (!text_cfg)
		text_cfg = root;

	c->assistant = assistant;
	if (!mt)
		rc = g4_fail(err, G4_ERR_FORMAT, "config.json: no model_type");
	else if (assistant != (strstr(mt, "assistant") != NULL))
		rc = g4_fail(err, G4_ERR_UNSUPPORTED, assistant ?
					 "config.json: model_type \"%s\" is not an MTP assistant (gemma4_unified_assistant)" :
					 "config.json: model_type \"%s\" is a draft (assistant) model; give it as the draft model", mt);
	else if (assistant)
	{
		const char *tmt = g4j_get_str(text_cfg, "model_type");

		if (text_cfg == root || (tmt && strncmp(tmt, "gemma4", 6) != 0))
			rc = g4_fail(err, G4_ERR_UNSUPPORTED, "config.json: the assistant needs a Gemma 4 text_config");
		else if (g4j_get_bool(root, "use_ordered_embeddings", 0))
			rc = g4_fail(err, G4_ERR_UNSUPPORTED,
						 "config.json: assistants with ordered (centroid-masked) embeddings are not supported");
		else
		{
			c->backbone_hidden = cfg_int(root, "backbone_hidden_size", 3840);
			rc = parse_gemma4_text(text_cfg, c, err);
		}
	}
	else if (strcmp(mt, "gemma4_unified") == 0 || strcmp(mt, "gemma4") == 0 ||
			 strcmp(mt, "gemma4_unified_text") == 0 || strcmp(mt, "gemma4_text") == 0)
		rc = parse_gemma4_text(text_cfg, c, err);
	else if (strcmp(mt, "gemma3") == 0 || strcmp(mt, "gemma3_text") == 0)
		rc = parse_gemma3_text(text_cfg, c, err);
	else
		rc = g4_fail(err, G4_ERR_UNSUPPORTED,
					 "config.json: unknown architecture (model_type \"%s\"); Gemma 4 and Gemma 3 decoders are supported",
					 mt);
	if (rc == G4_OK)
		rc = parse_quantization(root, c, err);
	if (rc == G4_OK && text_cfg != root && !assistant)
	{
		/* multimodal ids and the stop list live at the top of composite configs */
		c->image_token_id = cfg_int(root, "image_token_id", 258880);
		c->boi_id = cfg_int(root, "boi_token_id", 255999);
		c->eoi_id = cfg_int(root, "eoi_token_id", 258882);
		c->audio_token_id = cfg_int(root, "audio_token_id", 258881);
		c->boa_id = cfg_int(root, "boa_token_id", 256000);
		c->eoa_id = cfg_int(root, "eoa_token_index", g4j_get_int(root, "eoa_token_id", 258883));
		c->video_token_id = cfg_int(root, "video_token_id", 258884);
		if (g4j_get(root, "eos_token_id"))
			c->n_eos = read_ids(g4j_get(root, "eos_token_id"), c->eos_ids, G4_MAX_EOS);
	}
	g4j_free(doc);
	if (rc == G4_OK)
		rc = load_generation_config(dir, c, err);
	if (rc == G4_OK)
		rc = g4_config_validate(c, err);
	return rc;
}

int
g4_config_load_gguf(const g4_gguf *g, g4_model_config *c, g4_err *err)
{
	const char *arch = g4_gguf_get_str(g, "general.architecture");
	char		key[160];
	int			i;
	int			key_len;

#define ARCH_KEY(suffix) (snprintf(key, sizeof(key), "%s.%s", arch, suffix), key)

	set_defaults(c);
	if (!arch)
		return g4_fail(err, G4_ERR_FORMAT, "GGUF: no general.architecture");
	snprintf(c->architecture, sizeof(c->architecture), "%s", arch);
	snprintf(c->model_type, sizeof(c->model_type), "%s", arch);
	if (strcmp(arch, "gemma3") != 0)
		return g4_fail(err, G4_ERR_UNSUPPORTED,
					   "GGUF: architecture \"%s\" is not supported (gemma3 is; Gemma 4 loads from safetensors)", arch);
	c->family = G4_FAMILY_GEMMA3;
	c->hidden_size = (int) g4_gguf_get_int(g, ARCH_KEY("embedding_length"), 0);
	c->intermediate_size = (int) g4_gguf_get_int(g, ARCH_KEY("feed_forward_length"), 0);
	c->n_layers = (int) g4_gguf_get_int(g, ARCH_KEY("block_count"), 0);
	c->n_heads = (int) g4_gguf_get_int(g, ARCH_KEY("attention.head_count"), 0);
	c->max_position = (int) g4_gguf_get_int(g, ARCH_KEY("context_length"), 0);
	c->rms_eps = g4_gguf_get_float(g, ARCH_KEY("attention.layer_norm_rms_epsilon"), 1e-6);
	c->sliding_window = (int) g4_gguf_get_int(g, ARCH_KEY("attention.sliding_window"), 0);
	key_len = (int) g4_gguf_get_int(g, ARCH_KEY("attention.key_length"), 0);
	if (key_len == 0 && c->n_heads > 0)
		key_len = c->hidden_size / c->n_heads;
	if ((int) g4_gguf_get_int(g, ARCH_KEY("attention.value_length"), key_len) != key_len)
		return g4_fail(err, G4_ERR_UNSUPPORTED, "GGUF: key and value head widths differ");
	c->attn[0].head_dim = c->attn[1].head_dim = key_len;
	c->attn[0].n_kv_heads = c->attn[1].n_kv_heads =
		(int) g4_gguf_get_int(g, ARCH_KEY("attention.head_count_kv"), c->n_heads);
	if (c->n_layers <= 0 || c->n_layers > G4_MAX_LAYERS)
		return g4_fail(err, G4_ERR_FORMAT, "GGUF: %s.block_count = %d is out of range", arch, c->n_layers);
	/* Gemma 3: every sixth layer is global, local layers use base 10000 */
	for (i = 0; i < c->n_layers; i++)
		c->layer_full[i] = (i % 6) == 5;
	c->attn[0].rope_theta = 10000.0;
	c->attn[1].rope_theta = g4_gguf_get_float(g, ARCH_KEY("rope.freq_base"), 1000000.0);
	{
		const char *st = g4_gguf_get_str(g, ARCH_KEY("rope.scaling.type"));
		double		f = g4_gguf_get_float(g, ARCH_KEY("rope.scaling.factor"), 1.0);

		if (st && strcmp(st, "linear") == 0 && f != 1.0)
		{
			c->attn[1].rope_kind = G4_ROPE_LINEAR;
			c->attn[1].rope_factor = f;
		}
		else if (st && strcmp(st, "none") != 0 && strcmp(st, "linear") != 0)
			return g4_fail(err, G4_ERR_UNSUPPORTED, "GGUF: rope scaling \"%s\" is not supported", st);
	}
	c->attn_scale = (float) (1.0 / sqrt((double) key_len));
	c->v_norm = 0;
	c->norm_plus_one = 0;		/* GGUF converters store norms as (1 + w) already */
	c->has_layer_scalar = 0;
	c->final_softcap = g4_gguf_get_float(g, ARCH_KEY("final_logit_softcapping"), 0.0);
	c->bos_id = (int) g4_gguf_get_int(g, "tokenizer.ggml.bos_token_id", 2);
	c->pad_id = (int) g4_gguf_get_int(g, "tokenizer.ggml.padding_token_id", 0);
	c->eos_ids[0] = (int) g4_gguf_get_int(g, "tokenizer.ggml.eos_token_id", 1);
	c->n_eos = 1;
	{
		const g4_gguf_kv *toks = g4_gguf_get(g, "tokenizer.ggml.tokens");

		c->vocab_size = toks ? (int) toks->arr_len : 0;
	}
#undef ARCH_KEY
	return g4_config_validate(c, err);
}

/* Largest width (hidden, intermediate, heads x head_dim) and window accepted. */
#define G4_CONFIG_DIM_MAX		(1 << 20)
#define G4_CONFIG_WINDOW_MAX	(1 << 26)

int
g4_config_validate(const g4_model_config *c, g4_err *err)
{
	int			t;

	if (c->hidden_size <= 0 || c->intermediate_size <= 0 || c->n_heads <= 0 || c->vocab_size <= 0)
		return g4_fail(err, G4_ERR_FORMAT,
					   "model config: hidden_size %d, intermediate_size %d, heads %d, vocab %d must be positive",
					   c->hidden_size, c->intermediate_size, c->n_heads, c->vocab_size);
	for (t = 0; t < 2; t++)
	{
		const g4_attn_type *a = &c->attn[t];

		if (a->head_dim <= 0 || (a->head_dim % 2) != 0 || a->n_kv_heads <= 0 || c->n_heads % a->n_kv_heads != 0)
			return g4_fail(err, G4_ERR_FORMAT,
						   "model config: %s layers have head_dim %d and %d KV heads for %d query heads",
						   t ? "full" : "sliding", a->head_dim, a->n_kv_heads, c->n_heads);
	}
	/* bounds far beyond any real model, so the size arithmetic elsewhere
	 * (n_heads * head_dim, window block counts) cannot overflow an int */
	if (c->hidden_size > G4_CONFIG_DIM_MAX || c->intermediate_size > G4_CONFIG_DIM_MAX ||
		c->n_heads > G4_CONFIG_DIM_MAX / G4_MAX(c->attn[0].head_dim, c->attn[1].head_dim) ||
		c->sliding_window > G4_CONFIG_WINDOW_MAX || c->max_position > G4_CONFIG_WINDOW_MAX)
		return g4_fail(err, G4_ERR_FORMAT,
					   "model config: hidden_size %d, intermediate_size %d, %d heads of %d/%d, sliding_window %d, "
					   "max_position_embeddings %d exceed the supported sizes",
					   c->hidden_size, c->intermediate_size, c->n_heads, c->attn[0].head_dim, c->attn[1].head_dim,
					   c->sliding_window, c->max_position);
	if (c->sliding_window <= 0)
	{
		for (t = 0; t < c->n_layers; t++)
			if (!c->layer_full[t])
				return g4_fail(err, G4_ERR_FORMAT, "model config: sliding layers need a positive sliding_window");
	}
	if (c->max_position <= 0)
		return g4_fail(err, G4_ERR_FORMAT, "model config: max_position_embeddings must be positive");
	return G4_OK;
}

/* The pairs of a head that RoPE rotates: the first ones, all but where
 * proportional RoPE keeps only a fraction. */
int
g4_config_rope_pairs(const g4_attn_type *a)
{
	if (a->rope_kind == G4_ROPE_PROPORTIONAL)
		return (int) (a->partial_rotary_factor * (double) a->head_dim / 2.0);
	return a->head_dim / 2;
}

void
g4_config_inv_freq(const g4_attn_type *a, float *out)
{
	int			half = a->head_dim / 2;
	int			rotated = g4_config_rope_pairs(a);
	int			j;

	/* Same arithmetic as transformers: the exponent 2j/d in float32, then
	 * base^e and its reciprocal.  Proportional RoPE keeps the full head
	 * width in the exponent and zeroes the frequencies past the rotated
	 * fraction (those dimensions pass through unchanged). */
	for (j = 0; j < half; j++)
	{
		if (j < rotated)
		{
			float		e = (float) (2 * j) / (float) a->head_dim;
			float		p = (float) pow(a->rope_theta, (double) e);

			out[j] = 1.0f / p;
		}
		else
			out[j] = 0.0f;
		if (a->rope_factor != 1.0)
			out[j] = out[j] / (float) a->rope_factor;
	}
}
