/*
 * media_embed.c — the embedders' forward pass: one preprocessed image or
 * audio clip to its soft-token rows, on the model's backend (engine thread).
 *
 * Image (Gemma4UnifiedVisionEmbedder + multimodal embedder, spec 3.2):
 *   h = LN1(patch) ; h = h·Wdenseᵀ + b ; h = LN2(h)
 *   h = h + (table[x][0] + table[y][1]) ; h = LN_pos(h)
 *   h = rmsnorm(h) (no weight, eps 1e-6) ; rows = h·Wprojᵀ
 * Audio (spec 3.4): rows = rmsnorm(frame) (no weight, eps 1e-6)·Wprojᵀ.
 * The LayerNorms use PyTorch's default eps 1e-5.  Soft tokens are not
 * scaled by sqrt(hidden).  Audio runs in chunks of bounded size.
 */
#include <stdlib.h>
#include <string.h>

#include "media.h"
#include "model.h"
#include "util.h"

#define LN_EPS 1e-5f
#define MM_RMS_EPS 1e-6f
#define AUDIO_CHUNK 1024		/* frames per pass */

#define TRY(call) do { int _rc = (call); if (_rc != G4_OK) { \
	rc = g4_fail(err, _rc, "%s backend: %s failed", be->ops->name, #call); goto done; } } while (0)

static int
embed_image(g4_model *m, const g4_media_input *in, float *rows, g4_err *err)
{
	g4_backend *be = m->be;
	const g4_vision_embedder *v = m->vision;
	size_t		n = (size_t) in->n_tokens;
	size_t		H = (size_t) m->cfg.hidden_size;
	float	   *x = NULL,
			   *h = NULL,
			   *out = NULL;
	int32_t    *pos = NULL;
	int			rc = G4_OK;
	size_t		t;

	for (t = 0; t < 2 * n; t++)
		if (in->pos[t] >= v->n_pos)
			return g4_fail(err, G4_ERR_INVALID,
						   "the image is %d patches across, more than this model's position table holds (%d)",
						   in->pos[t] + 1, v->n_pos);
	x = be->ops->alloc(be, n * G4_PATCH_DIM * sizeof(float));
	h = be->ops->alloc(be, n * (size_t) v->dim * sizeof(float));
	out = be->ops->alloc(be, n * H * sizeof(float));
	pos = be->ops->alloc(be, n * 2 * sizeof(int32_t));
	if (!x || !h || !out || !pos)
	{
		rc = g4_fail(err, G4_ERR_NOMEM, "device out of memory embedding an image of %zu tokens", n);
		goto done;
	}
	TRY(be->ops->upload(be, x, in->values, n * G4_PATCH_DIM * sizeof(float)));
	TRY(be->ops->upload(be, pos, in->pos, n * 2 * sizeof(int32_t)));
	TRY(be->ops->layernorm(be, x, v->ln1_w, v->ln1_b, (int) n, G4_PATCH_DIM, LN_EPS, x));
	TRY(be->ops->matmul(be, v->dense, x, (int) n, h));
	TRY(be->ops->add_bias(be, h, v->dense_b, (int) n, v->dim));
	TRY(be->ops->layernorm(be, h, v->ln2_w, v->ln2_b, (int) n, v->dim, LN_EPS, h));
	TRY(be->ops->add_pos2d(be, h, v->pos_table, pos, (int) n, v->dim));
	TRY(be->ops->layernorm(be, h, v->pos_norm_w, v->pos_norm_b, (int) n, v->dim, LN_EPS, h));
	TRY(be->ops->rmsnorm(be, h, NULL, (int) n, v->dim, MM_RMS_EPS, h));
	TRY(be->ops->matmul(be, v->proj, h, (int) n, out));
	TRY(be->ops->download(be, rows, out, n * H * sizeof(float)));
	rc = be->ops->sync(be, err);
done:
	if (rc != G4_OK)
		be->ops->sync(be, NULL);
	be->ops->free(be, x);
	be->ops->free(be, h);
	be->ops->free(be, out);
	be->ops->free(be, pos);
	return rc;
}

static int
embed_audio(g4_model *m, const g4_media_input *in, float *rows, g4_err *err)
{
	g4_backend *be = m->be;
	size_t		H = (size_t) m->cfg.hidden_size;
	size_t		chunk = G4_MIN((size_t) in->n_tokens, (size_t) AUDIO_CHUNK);
	float	   *x = be->ops->alloc(be, chunk * G4_AUDIO_FRAME * sizeof(float));
	float	   *out = be->ops->alloc(be, chunk * H * sizeof(float));
	int			rc = G4_OK;
	size_t		t0;

	if (!x || !out)
	{
		rc = g4_fail(err, G4_ERR_NOMEM, "device out of memory embedding audio");
		goto done;
	}
	for (t0 = 0; t0 < (size_t) in->n_tokens; t0 += chunk)
	{
		int			n = (int) G4_MIN(chunk, (size_t) in->n_tokens - t0);

		TRY(be->ops->upload(be, x, in->values + t0 * G4_AUDIO_FRAME, (size_t) n * G4_AUDIO_FRAME * sizeof(float)));
		TRY(be->ops->rmsnorm(be, x, NULL, n, G4_AUDIO_FRAME, MM_RMS_EPS, x));
		TRY(be->ops->matmul(be, m->audio_proj, x, n, out));
		TRY(be->ops->download(be, rows + t0 * H, out, (size_t) n * H * sizeof(float)));
		if ((rc = be->ops->sync(be, err)) != G4_OK)
			goto done;
		g4_progress_tick(m->progress);
	}
done:
	if (rc != G4_OK)
		be->ops->sync(be, NULL);
	be->ops->free(be, x);
	be->ops->free(be, out);
	return rc;
}

int
g4_model_embed_media(g4_model *m, const g4_media_input *in, float *rows, g4_err *err)
{
	if (in->n_tokens <= 0)
		return G4_OK;
	if (in->kind == G4_MEDIA_IMAGE)
	{
		if (!m->vision)
			return g4_fail(err, G4_ERR_UNSUPPORTED, "this model has no vision embedder: images are not supported");
		return embed_image(m, in, rows, err);
	}
	if (!m->audio_proj)
		return g4_fail(err, G4_ERR_UNSUPPORTED, "this model has no audio embedder: audio is not supported");
	return embed_audio(m, in, rows, err);
}
