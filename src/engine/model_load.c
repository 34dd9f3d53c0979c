/*
 * model_load.c — from a checkpoint (safetensors directory or GGUF file) to
 * weights on the backend.
 *
 * Tensors are located by name, checked for shape and dtype, and handed to the
 * backend without copying them in host memory first: the CPU backend keeps
 * pointing into the file mapping, the CUDA backend uploads (and may repack).
 * Q/K/V and gate/up are fused along the output dimension at upload.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "media.h"
#include "model.h"
#include "safetensors.h"
#include "util.h"

typedef struct
{
	g4_safetensors *st;
	g4_gguf    *gguf;
	const char *prefix;			/* safetensors: "model.language_model." etc. */
	g4_model   *m;
} loader;

/* ---- safetensors ----------------------------------------------------- */

static int
st_dense_fmt(int dtype)
{
	switch (dtype)
	{
		case G4_DT_F32:
			return G4_W_F32;
		case G4_DT_F16:
			return G4_W_F16;
		case G4_DT_BF16:
			return G4_W_BF16;
	}
	return -1;
}

/* A linear layer [out][in]: dense ".weight" or compressed-tensors int4. */
static int
st_linear(loader *L, const char *base, int64_t out, int64_t in, g4_host_weight *hw, g4_err *err)
{
	char		name[512];
	const g4_st_tensor *t;

	snprintf(name, sizeof(name), "%s%s.weight", L->prefix, base);
	t = g4_st_find(L->st, name);
	if (t)
	{
		int64_t		shape[2] = {out, in};

		if (st_dense_fmt(t->dtype) < 0)
			return g4_fail(err, G4_ERR_UNSUPPORTED, "tensor %s has dtype %s; F32, F16 and BF16 are supported",
						   name, g4_dtype_name(t->dtype));
		if (g4_st_expect(L->st, name, t->dtype, 2, shape, &t, err) != G4_OK)
			return err->code;
		hw->fmt = st_dense_fmt(t->dtype);
		hw->out = out;
		hw->in = in;
		hw->data = t->data;
		hw->scales = NULL;
		return G4_OK;
	}
	snprintf(name, sizeof(name), "%s%s.weight_packed", L->prefix, base);
	t = g4_st_find(L->st, name);
	if (t)
	{
		int64_t		pshape[2] = {out, in / 8};
		int64_t		sshape[2] = {out, in / 32};
		const g4_st_tensor *s;
		const g4_st_tensor *ws;

		if (in % 32 != 0)
			return g4_fail(err, G4_ERR_FORMAT, "%s: int4 group-32 weights need in_features divisible by 32, got %lld",
						   name, (long long) in);
		if (g4_st_expect(L->st, name, G4_DT_I32, 2, pshape, &t, err) != G4_OK)
			return err->code;
		snprintf(name, sizeof(name), "%s%s.weight_scale", L->prefix, base);
		if (g4_st_expect(L->st, name, G4_DT_BF16, 2, sshape, &s, err) != G4_OK)
			return err->code;
		snprintf(name, sizeof(name), "%s%s.weight_zero_point", L->prefix, base);
		if (g4_st_find(L->st, name))
			return g4_fail(err, G4_ERR_UNSUPPORTED, "%s: asymmetric int4 weights are not supported", name);
		snprintf(name, sizeof(name), "%s%s.weight_shape", L->prefix, base);
		ws = g4_st_find(L->st, name);
		if (ws)
		{
			int64_t		o = -1,
						i = -1;

			if (ws->numel == 2 && ws->dtype == G4_DT_I64)
			{
				/* tensor data need not be aligned in the file */
				memcpy(&o, (const char *) ws->data, sizeof(o));
				memcpy(&i, (const char *) ws->data + sizeof(o), sizeof(i));
			}
			else if (ws->numel == 2 && ws->dtype == G4_DT_I32)
			{
				int32_t		v[2];

				memcpy(v, ws->data, sizeof(v));
				o = v[0];
				i = v[1];
			}
			if (o != out || i != in)
				return g4_fail(err, G4_ERR_FORMAT, "%s: expected [%lld, %lld], found [%lld, %lld]", name,
							   (long long) out, (long long) in, (long long) o, (long long) i);
		}
		hw->fmt = G4_W_I4G32;
		hw->out = out;
		hw->in = in;
		hw->data = t->data;
		hw->scales = s->data;
		return G4_OK;
	}
	return g4_fail(err, G4_ERR_FORMAT, "missing tensor %s%s.weight (nor %s%s.weight_packed for int4)",
				   L->prefix, base, L->prefix, base);
}

/* A vector of floats (norm weight, layer scalar) of any float dtype. */
static int
st_vector(loader *L, const char *base, int64_t n, float *out, g4_err *err)
{
	char		name[512];
	const g4_st_tensor *t;
	int64_t		i;

	snprintf(name, sizeof(name), "%s%s", L->prefix, base);
	t = g4_st_find(L->st, name);
	if (!t)
		return g4_fail(err, G4_ERR_FORMAT, "missing tensor %s", name);
	if (t->numel != n)
		return g4_fail(err, G4_ERR_FORMAT, "tensor %s: expected %lld elements, found %lld", name, (long long) n,
					   (long long) t->numel);
	for (i = 0; i < n; i++)
	{
		switch (t->dtype)
		{
			case G4_DT_F32:
				out[i] = ((const float *) t->data)[i];
				break;
			case G4_DT_BF16:
				out[i] = g4_bf16_to_f32(((const uint16_t *) t->data)[i]);
				break;
			case G4_DT_F16:
				out[i] = g4_f16_to_f32(((const uint16_t *) t->data)[i]);
				break;
			default:
				return g4_fail(err, G4_ERR_UNSUPPORTED, "tensor %s has dtype %s; expected a float type", name,
							   g4_dtype_name(t->dtype));
		}
	}
	return G4_OK;
}

/* ---- GGUF ------------------------------------------------------------ */

static int
gguf_linear(loader *L, const char *name, int64_t out, int64_t in, g4_host_weight *hw, g4_err *err)
{
	const g4_gguf_tensor *t = g4_gguf_find(L->gguf, name);
	int			fmt;

	if (!t)
		return g4_fail(err, G4_ERR_FORMAT, "missing tensor %s", name);
	if (t->ndim != 2 || t->ne[0] != in || t->ne[1] != out)
		return g4_fail(err, G4_ERR_FORMAT, "tensor %s: expected [%lld, %lld], found [%lld, %lld] (%d dims)", name,
					   (long long) out, (long long) in, (long long) t->ne[1], (long long) t->ne[0], t->ndim);
	fmt = g4_gguf_wfmt(t->ggml_type);
	if (fmt < 0)
		return g4_fail(err, G4_ERR_UNSUPPORTED, "tensor %s has type %s, which is not supported", name,
					   g4_ggml_type_name(t->ggml_type));
	if (in % g4_wfmt_block(fmt) != 0)
		return g4_fail(err, G4_ERR_FORMAT, "tensor %s: %lld columns is not a multiple of the %s block (%d)", name,
					   (long long) in, g4_wfmt_name(fmt), g4_wfmt_block(fmt));
	hw->fmt = fmt;
	hw->out = out;
	hw->in = in;
	hw->data = t->data;
	hw->scales = NULL;
	return G4_OK;
}

static int
gguf_vector(loader *L, const char *name, int64_t n, float *out, g4_err *err)
{
	const g4_gguf_tensor *t = g4_gguf_find(L->gguf, name);
	int64_t		numel;
	int64_t		i;

	if (!t)
		return g4_fail(err, G4_ERR_FORMAT, "missing tensor %s", name);
	numel = t->ne[0] * (t->ndim > 1 ? t->ne[1] : 1);
	if (numel != n)
		return g4_fail(err, G4_ERR_FORMAT, "tensor %s: expected %lld elements, found %lld", name, (long long) n,
					   (long long) numel);
	for (i = 0; i < n; i++)
	{
		if (t->ggml_type == G4_GGML_F32)
			out[i] = ((const float *) t->data)[i];
		else if (t->ggml_type == G4_GGML_F16)
			out[i] = g4_f16_to_f32(((const uint16_t *) t->data)[i]);
		else if (t->ggml_type == G4_GGML_BF16)
			out[i] = g4_bf16_to_f32(((const uint16_t *) t->data)[i]);
		else
			return g4_fail(err, G4_ERR_UNSUPPORTED, "tensor %s has type %s; a float vector is expected", name,
						   g4_ggml_type_name(t->ggml_type));
	}
	return G4_OK;
}

/* ---- common ---------------------------------------------------------- */

static int
upload_vector(g4_model *m, const float *host, int64_t n, float **dev, g4_err *err)
{
	g4_backend *be = m->be;

	*dev = be->ops->alloc(be, (size_t) n * sizeof(float));
	if (!*dev)
		return g4_fail(err, G4_ERR_NOMEM, "device out of memory for a %lld-element vector", (long long) n);
	m->weight_bytes += (size_t) n * sizeof(float);
	return be->ops->upload(be, *dev, host, (size_t) n * sizeof(float));
}

/* Load a norm weight (adding 1 when the checkpoint stores w - 1). */
static int
load_norm(loader *L, const char *st_name, const char *gguf_name, int64_t n, float **dev, g4_err *err)
{
	float	   *tmp = g4_malloc((size_t) n * sizeof(float));
	int			rc;
	int64_t		i;

	if (!tmp)
		return g4_fail(err, G4_ERR_NOMEM, "out of memory");
	rc = L->st ? st_vector(L, st_name, n, tmp, err) : gguf_vector(L, gguf_name, n, tmp, err);
	if (rc == G4_OK && L->m->cfg.norm_plus_one)
		for (i = 0; i < n; i++)
			tmp[i] += 1.0f;
	if (rc == G4_OK)
		rc = upload_vector(L->m, tmp, n, dev, err);
	free(tmp);
	L->m->n_params += n;
	return rc;
}

static int	load_weights(loader *L, int verbose, g4_err *err);

static int
create_weight(loader *L, const g4_host_weight *parts, int n, g4_weight **out, g4_err *err)
{
	g4_backend *be = L->m->be;
	int			i;

	if (be->ops->weight_create(be, parts, n, out, err) != G4_OK)
		return err->code;
	L->m->weight_bytes += be->ops->weight_bytes(*out);
	for (i = 0; i < n; i++)
		L->m->n_params += parts[i].out * parts[i].in;
	return G4_OK;
}

static int
load_layer(loader *L, int i, g4_err *err)
{
	g4_model   *m = L->m;
	const g4_model_config *c = &m->cfg;
	const g4_attn_type *a = g4_layer_attn(c, i);
	g4_layer   *ly = &m->layers[i];
	int64_t		H = c->hidden_size;
	int64_t		F = c->intermediate_size;
	g4_host_weight qkv[3];
	g4_host_weight gu[2];
	g4_host_weight o,
				down;
	char		n1[256],
				n2[256];
	int			has_v = !a->k_eq_v;

	ly->q_dim = c->n_heads * a->head_dim;
	ly->kv_dim = a->n_kv_heads * a->head_dim;

#define LINEAR(st_suffix, gguf_suffix, out_, in_, hw) \
	do { \
		int _rc; \
		snprintf(n1, sizeof(n1), "layers.%d.%s", i, st_suffix); \
		snprintf(n2, sizeof(n2), "blk.%d.%s.weight", i, gguf_suffix); \
		_rc = L->st ? st_linear(L, n1, out_, in_, hw, err) : gguf_linear(L, n2, out_, in_, hw, err); \
		if (_rc != G4_OK) return _rc; \
	} while (0)
#define NORM(st_suffix, gguf_suffix, n_, dst) \
	do { \
		snprintf(n1, sizeof(n1), "layers.%d.%s", i, st_suffix); \
		snprintf(n2, sizeof(n2), "blk.%d.%s.weight", i, gguf_suffix); \
		if (load_norm(L, n1, n2, n_, dst, err) != G4_OK) return err->code; \
	} while (0)

	LINEAR("self_attn.q_proj", "attn_q", ly->q_dim, H, &qkv[0]);
	if (c->assistant)
		has_v = 0;				/* queries only: K/V are the target's */
	else
		LINEAR("self_attn.k_proj", "attn_k", ly->kv_dim, H, &qkv[1]);
	if (has_v)
		LINEAR("self_attn.v_proj", "attn_v", ly->kv_dim, H, &qkv[2]);
	else if (L->st)
	{
		/* k_eq_v layers have no v_proj; refuse a checkpoint that has one */
		snprintf(n1, sizeof(n1), "%slayers.%d.self_attn.v_proj.weight", L->prefix, i);
		snprintf(n2, sizeof(n2), "%slayers.%d.self_attn.v_proj.weight_packed", L->prefix, i);
		if (g4_st_find(L->st, n1) || g4_st_find(L->st, n2))
			return g4_fail(err, G4_ERR_FORMAT, "layer %d has a v_proj although attention_k_eq_v is set", i);
	}
	LINEAR("self_attn.o_proj", "attn_output", H, ly->q_dim, &o);
	LINEAR("mlp.gate_proj", "ffn_gate", F, H, &gu[0]);
	LINEAR("mlp.up_proj", "ffn_up", F, H, &gu[1]);
	LINEAR("mlp.down_proj", "ffn_down", H, F, &down);

	if (create_weight(L, qkv, c->assistant ? 1 : has_v ? 3 : 2, &ly->qkv, err) != G4_OK ||
		create_weight(L, &o, 1, &ly->o, err) != G4_OK ||
		create_weight(L, gu, 2, &ly->gate_up, err) != G4_OK ||
		create_weight(L, &down, 1, &ly->down, err) != G4_OK)
		return g4_fail_ctx(err, "layer %d", i);

	NORM("input_layernorm.weight", "attn_norm", H, &ly->attn_norm);
	NORM("post_attention_layernorm.weight", "post_attention_norm", H, &ly->post_attn_norm);
	NORM("pre_feedforward_layernorm.weight", "ffn_norm", H, &ly->pre_ffn_norm);
	NORM("post_feedforward_layernorm.weight", "post_ffw_norm", H, &ly->post_ffn_norm);
	NORM("self_attn.q_norm.weight", "attn_q_norm", a->head_dim, &ly->q_norm);
	if (!c->assistant)
		NORM("self_attn.k_norm.weight", "attn_k_norm", a->head_dim, &ly->k_norm);
#undef LINEAR
#undef NORM

	ly->layer_scalar = 1.0f;
	if (c->has_layer_scalar)
	{
		float		s;

		snprintf(n1, sizeof(n1), "layers.%d.layer_scalar", i);
		if (!L->st)
			return g4_fail(err, G4_ERR_UNSUPPORTED, "layer scalars are not read from GGUF files");
		if (st_vector(L, n1, 1, &s, err) != G4_OK)
			return err->code;
		ly->layer_scalar = s;
	}

	ly->kv.group = c->layer_full[i] ? G4_KVG_FULL : G4_KVG_SLIDING;
	ly->kv.n_heads = c->n_heads;
	ly->kv.n_kv_heads = a->n_kv_heads;
	ly->kv.head_dim = a->head_dim;
	ly->kv.k_eq_v = a->k_eq_v;
	ly->kv.scale = c->attn_scale;
	ly->kv.k_norm_w = ly->k_norm;
	ly->kv.inv_freq = m->inv_freq[c->layer_full[i] ? 1 : 0];
	ly->kv.rope_pairs = g4_config_rope_pairs(a);
	return G4_OK;
}

static const char *
find_prefix(const g4_safetensors *st)
{
	static const char *const prefixes[] = {
		"model.language_model.", "model.", "language_model.model.", ""
	};
	size_t		k;

	for (k = 0; k < G4_ARRAY_LEN(prefixes); k++)
	{
		char		name[256];

		snprintf(name, sizeof(name), "%sembed_tokens.weight", prefixes[k]);
		if (g4_st_find(st, name))
			return prefixes[k];
	}
	return NULL;
}

static int
load_embedding(loader *L, g4_err *err)
{
	g4_model   *m = L->m;
	const g4_model_config *c = &m->cfg;
	g4_host_weight hw;
	float		scale = sqrtf((float) c->hidden_size);

	if (L->st)
	{
		if (st_linear(L, "embed_tokens", c->vocab_size, c->hidden_size, &hw, err) != G4_OK)
			return err->code;
		if (hw.fmt == G4_W_I4G32)
			return g4_fail(err, G4_ERR_UNSUPPORTED, "a quantised embedding table is not supported");
		if (g4_st_find(L->st, "lm_head.weight") || g4_st_find(L->st, "lm_head.weight_packed"))
			return g4_fail(err, G4_ERR_UNSUPPORTED, "an untied lm_head is not supported");
		/* transformers casts the scale to the table's dtype before the
		 * multiply: sqrt(3840) = 61.97 becomes 62.0 for a bf16 table */
		if (hw.fmt == G4_W_BF16)
			scale = g4_round_bf16(scale);
		else if (hw.fmt == G4_W_F16)
			scale = g4_f16_to_f32(g4_f32_to_f16(scale));
	}
	else
	{
		if (gguf_linear(L, "token_embd.weight", c->vocab_size, c->hidden_size, &hw, err) != G4_OK)
			return err->code;
		if (g4_gguf_find(L->gguf, "output.weight"))
			return g4_fail(err, G4_ERR_UNSUPPORTED, "an untied output head is not supported");
	}
	m->embed_scale = scale;
	return create_weight(L, &hw, 1, &m->embed, err);
}

/* A float tensor of the checkpoint by full name, uploaded as f32. */
static int
st_upload_exact(loader *L, const char *name, int64_t n, float **dev, g4_err *err)
{
	const char *saved = L->prefix;
	float	   *tmp = g4_malloc((size_t) n * sizeof(float));
	int			rc;

	if (!tmp)
		return g4_fail(err, G4_ERR_NOMEM, "out of memory");
	L->prefix = "";
	rc = st_vector(L, name, n, tmp, err);
	L->prefix = saved;
	if (rc == G4_OK)
		rc = upload_vector(L->m, tmp, n, dev, err);
	free(tmp);
	L->m->n_params += n;
	return rc;
}

/* A dense linear by full name. */
static int
st_linear_exact(loader *L, const char *base, int64_t out, int64_t in, g4_weight **w, g4_err *err)
{
	const char *saved = L->prefix;
	g4_host_weight hw;
	int			rc;

	L->prefix = "";
	rc = st_linear(L, base, out, in, &hw, err);
	L->prefix = saved;
	if (rc == G4_OK)
		rc = create_weight(L, &hw, 1, w, err);
	return rc;
}

/*
 * The multimodal embedders, under their on-disk names (spec 6.1): present
 * in a Gemma 4 unified checkpoint, absent elsewhere (then media input is
 * refused).  Their LayerNorms store plain weights (no +1).  Shapes are
 * read from the tensors: mm_embed_dim and the position table size from
 * model.vision_embedder.pos_embedding [n_pos][2][dim].
 */
static int
load_media_embedders(loader *L, g4_err *err)
{
	g4_model   *m = L->m;
	int64_t		H = m->cfg.hidden_size;
	const g4_st_tensor *pe;
	g4_vision_embedder *v;
	int			rc = G4_OK;

	if (!L->st)
		return G4_OK;
	if (g4_st_find(L->st, "model.embed_audio.embedding_projection.weight"))
	{
		rc = st_linear_exact(L, "model.embed_audio.embedding_projection", H, G4_AUDIO_FRAME, &m->audio_proj, err);
		if (rc != G4_OK)
			return rc;
	}
	pe = g4_st_find(L->st, "model.vision_embedder.pos_embedding");
	if (!pe)
		return G4_OK;
	if (pe->ndim != 3 || pe->shape[1] != 2 || pe->shape[0] <= 0 || pe->shape[2] <= 0)
		return g4_fail(err, G4_ERR_FORMAT, "model.vision_embedder.pos_embedding: expected [positions, 2, dim]");
	v = m->vision = g4_calloc(1, sizeof(g4_vision_embedder));
	if (!v)
		return g4_fail(err, G4_ERR_NOMEM, "out of memory");
	v->n_pos = (int) pe->shape[0];
	v->dim = (int) pe->shape[2];
#define VEC(name, n, dst) if (rc == G4_OK) rc = st_upload_exact(L, name, n, &(dst), err)
	VEC("model.vision_embedder.patch_ln1.weight", G4_PATCH_DIM, v->ln1_w);
	VEC("model.vision_embedder.patch_ln1.bias", G4_PATCH_DIM, v->ln1_b);
	VEC("model.vision_embedder.patch_dense.bias", v->dim, v->dense_b);
	VEC("model.vision_embedder.patch_ln2.weight", v->dim, v->ln2_w);
	VEC("model.vision_embedder.patch_ln2.bias", v->dim, v->ln2_b);
	VEC("model.vision_embedder.pos_norm.weight", v->dim, v->pos_norm_w);
	VEC("model.vision_embedder.pos_norm.bias", v->dim, v->pos_norm_b);
	VEC("model.vision_embedder.pos_embedding", (int64_t) v->n_pos * 2 * v->dim, v->pos_table);
#undef VEC
	if (rc == G4_OK)
		rc = st_linear_exact(L, "model.vision_embedder.patch_dense", v->dim, G4_PATCH_DIM, &v->dense, err);
	if (rc == G4_OK)
		rc = st_linear_exact(L, "model.embed_vision.embedding_projection", H, v->dim, &v->proj, err);
	return rc;
}

static void
free_media_embedders(g4_model *m)
{
	g4_backend *be = m->be;
	g4_vision_embedder *v = m->vision;

	if (m->audio_proj)
		be->ops->weight_destroy(be, m->audio_proj);
	if (v)
	{
		float	   *vs[] = {v->ln1_w, v->ln1_b, v->dense_b, v->ln2_w, v->ln2_b, v->pos_norm_w, v->pos_norm_b,
		v->pos_table};
		size_t		k;

		for (k = 0; k < G4_ARRAY_LEN(vs); k++)
			if (vs[k])
				be->ops->free(be, vs[k]);
		if (v->dense)
			be->ops->weight_destroy(be, v->dense);
		if (v->proj)
			be->ops->weight_destroy(be, v->proj);
		free(v);
	}
}

/* An empty model on a backend, and its loader; NULL when out of memory. */
static g4_model *
model_new(g4_backend *be, loader *L)
{
	g4_model   *m = g4_calloc(1, sizeof(g4_model));

	memset(L, 0, sizeof(*L));
	if (m)
	{
		m->be = be;
		L->m = m;
	}
	return m;
}

int
g4_model_load(const char *path, g4_backend *be, g4_model **out, int verbose, g4_err *err)
{
	g4_model   *m;
	loader		L;
	int			rc;
	size_t		plen = strlen(path);

	*out = NULL;
	if (!(m = model_new(be, &L)))
		return g4_fail(err, G4_ERR_NOMEM, "out of memory");

	if (plen > 5 && strcmp(path + plen - 5, ".gguf") == 0)
	{
		rc = g4_gguf_open(path, &m->gguf, err);
		if (rc == G4_OK)
			rc = g4_config_load_gguf(m->gguf, &m->cfg, err);
		L.gguf = m->gguf;
	}
	else if (g4_is_dir(path))
	{
		rc = g4_config_load_hf(path, &m->cfg, err);
		if (rc == G4_OK)
			rc = g4_st_open(path, &m->st, err);
		L.st = m->st;
		if (rc == G4_OK && !(L.prefix = find_prefix(m->st)))
			rc = g4_fail(err, G4_ERR_FORMAT, "%s: missing tensor model.language_model.embed_tokens.weight "
						 "(no embedding table under any known prefix)", path);
	}
	else if (g4_is_file(path))
		rc = g4_fail(err, G4_ERR_UNSUPPORTED,
					 "%s: a model is a directory with config.json and safetensors, or a .gguf file", path);
	else
		rc = g4_fail(err, G4_ERR_IO, "%s: no such model directory or file", path);
	if (rc != G4_OK)
	{
		g4_model_free(m);
		return rc;
	}

	rc = load_weights(&L, verbose, err);
	if (rc != G4_OK)
	{
		g4_model_free(m);
		return rc;
	}
	*out = m;
	return G4_OK;
}

/* RoPE tables, embedding, final norm and layers of an opened checkpoint. */
static int
load_weights(loader *L, int verbose, g4_err *err)
{
	g4_model   *m = L->m;
	int			rc = G4_OK;
	int			i;
	int			t;

	for (t = 0; t < 2 && rc == G4_OK; t++)
	{
		const g4_attn_type *a = &m->cfg.attn[t];
		float	   *f = g4_malloc((size_t) (a->head_dim / 2) * sizeof(float));

		if (!f)
			rc = g4_fail(err, G4_ERR_NOMEM, "out of memory");
		else
		{
			g4_config_inv_freq(a, f);
			rc = upload_vector(m, f, a->head_dim / 2, &m->inv_freq[t], err);
			free(f);
		}
	}
	if (rc == G4_OK)
		rc = load_embedding(L, err);
	if (rc == G4_OK)
		rc = load_norm(L, "norm.weight", "output_norm.weight", m->cfg.hidden_size, &m->final_norm, err);
	if (rc == G4_OK)
		rc = load_media_embedders(L, err);
	if (rc == G4_OK)
	{
		m->layers = g4_calloc((size_t) m->cfg.n_layers, sizeof(g4_layer));
		if (!m->layers)
			rc = g4_fail(err, G4_ERR_NOMEM, "out of memory");
	}
	for (i = 0; rc == G4_OK && i < m->cfg.n_layers; i++)
	{
		rc = load_layer(L, i, err);
		if (verbose && rc == G4_OK)
			fprintf(stderr, "\rloading layer %d/%d", i + 1, m->cfg.n_layers);
	}
	if (verbose)
		fprintf(stderr, "\n");
	if (rc == G4_OK)
	{
		/* number the layers within their KV group */
		int			idx[2] = {0, 0};

		for (i = 0; i < m->cfg.n_layers; i++)
			m->layers[i].kv.index = idx[m->layers[i].kv.group]++;
	}
	return rc;
}

int
g4_model_load_assistant(const char *dir, g4_backend *be, g4_model **out, g4_err *err)
{
	g4_model   *m;
	loader		L;
	int			rc;

	*out = NULL;
	if (!(m = model_new(be, &L)))
		return g4_fail(err, G4_ERR_NOMEM, "out of memory");
	if (!g4_is_dir(dir))
		rc = g4_fail(err, G4_ERR_IO, "%s: no such draft model directory", dir);
	else
		rc = g4_config_load_assistant_hf(dir, &m->cfg, err);
	if (rc == G4_OK)
		rc = g4_st_open(dir, &m->st, err);
	if (rc == G4_OK)
	{
		int64_t		H = m->cfg.hidden_size;
		int64_t		B = m->cfg.backbone_hidden;
		g4_host_weight pre,
					post;

		/* the projections sit at the top level, the decoder under "model." */
		L.st = m->st;
		L.prefix = "";
		rc = st_linear(&L, "pre_projection", H, 2 * B, &pre, err);
		if (rc == G4_OK)
			rc = st_linear(&L, "post_projection", B, H, &post, err);
		if (rc == G4_OK)
			rc = create_weight(&L, &pre, 1, &m->pre_proj, err);
		if (rc == G4_OK)
			rc = create_weight(&L, &post, 1, &m->post_proj, err);
		L.prefix = "model.";
	}
	if (rc == G4_OK)
		rc = load_weights(&L, 0, err);
	if (rc != G4_OK)
	{
		g4_fail_ctx(err, "draft model %s", dir);
		g4_model_free(m);
		return rc;
	}
	*out = m;
	return G4_OK;
}

void
g4_model_free(g4_model *m)
{
	g4_backend *be;
	int			i;

	if (!m)
		return;
	be = m->be;
	if (m->layers)
	{
		for (i = 0; i < m->cfg.n_layers; i++)
		{
			g4_layer   *ly = &m->layers[i];
			g4_weight  *ws[] = {ly->qkv, ly->o, ly->gate_up, ly->down};
			float	   *vs[] = {ly->attn_norm, ly->post_attn_norm, ly->pre_ffn_norm, ly->post_ffn_norm,
			ly->q_norm, ly->k_norm};
			size_t		k;

			for (k = 0; k < G4_ARRAY_LEN(ws); k++)
				if (ws[k])
					be->ops->weight_destroy(be, ws[k]);
			for (k = 0; k < G4_ARRAY_LEN(vs); k++)
				if (vs[k])
					be->ops->free(be, vs[k]);
		}
		free(m->layers);
	}
	if (m->embed)
		be->ops->weight_destroy(be, m->embed);
	free_media_embedders(m);
	if (m->pre_proj)
		be->ops->weight_destroy(be, m->pre_proj);
	if (m->post_proj)
		be->ops->weight_destroy(be, m->post_proj);
	if (m->final_norm)
		be->ops->free(be, m->final_norm);
	for (i = 0; i < 2; i++)
		if (m->inv_freq[i])
			be->ops->free(be, m->inv_freq[i]);
	if (m->st)
		g4_st_close(m->st);
	if (m->gguf)
		g4_gguf_close(m->gguf);
	free(m);
}
