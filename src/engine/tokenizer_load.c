/*
 * tokenizer_load.c — building a tokenizer from a Hugging Face tokenizer.json
 * (+ tokenizer_config.json) or from the tokenizer.ggml.* metadata of a GGUF
 * file.
 *
 * tokenizer.json: the BPE model (vocab, merges, byte_fallback, fuse_unk,
 * ignore_merges, unk_token), added_tokens with their flags, and the
 * pipeline pieces Gemma tokenizers use: normalizer Replace/Prepend (or a
 * Sequence of them), pre_tokenizer Split on a literal string, decoder
 * Replace/ByteFallback/Fuse/Strip, post_processor TemplateProcessing (a
 * leading special token means "add BOS").  Anything else is refused with
 * G4_ERR_UNSUPPORTED naming the field, rather than tokenised differently.
 *
 * GGUF "llama" vocabularies (SentencePiece BPE: pieces, scores, types) are
 * turned into the same structure the Hugging Face converter produces:
 * user-defined and control pieces become added tokens, and the merges are
 * every split of a normal piece into two pieces, ranked by the piece's
 * score (highest first) and, for one piece, by the length of the left part
 * (longest first); whitespace-run user-defined pieces get their merges
 * ahead of all others.  On Gemma 3 this reproduces tokenizer.json's merge
 * list exactly.
 */
#define G4_TOKENIZER_INTERNAL
#include "tokenizer.h"

#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "json.h"

#define SPM_SPACE "\xE2\x96\x81"	/* U+2581, SentencePiece's space */

/* ---- tokenizer.json --------------------------------------------------- */

/* Text of a token given as "text" or {"content": "text"}. */
static const char *
token_name(const g4j *v)
{
	if (g4j_is(v, G4J_STRING))
		return g4j_str(v);
	return g4j_get_str(v, "content");
}

static int
json_is_null(const g4j *v)
{
	return !v || g4j_is(v, G4J_NULL);
}

/* The literal pattern of a Replace/Split: {"String": "x"} only. */
static const g4j *
string_pattern(const g4j *node)
{
	const g4j  *pat = g4j_get(node, "pattern");
	const g4j  *s = g4j_get(pat, "String");

	return g4j_is(s, G4J_STRING) ? s : NULL;
}

static int
load_normalizer(g4_tokenizer *t, const g4j *node, const char *path, g4_err *err)
{
	const char *type;

	if (json_is_null(node))
		return G4_OK;
	type = g4j_get_str(node, "type");
	if (!type)
		return g4_fail(err, G4_ERR_FORMAT, "%s: normalizer has no type", path);
	if (strcmp(type, "Sequence") == 0)
	{
		const g4j  *list = g4j_get(node, "normalizers");
		size_t		i;
		int			rc;

		for (i = 0; i < g4j_len(list); i++)
			if ((rc = load_normalizer(t, g4j_at(list, i), path, err)) != G4_OK)
				return rc;
		return G4_OK;
	}
	if (strcmp(type, "Replace") == 0)
	{
		const g4j  *from = string_pattern(node);
		const g4j  *to = g4j_get(node, "content");

		if (!from || !g4j_is(to, G4J_STRING))
			return g4_fail(err, G4_ERR_UNSUPPORTED,
						   "%s: normalizer Replace must have a literal \"String\" pattern and a content", path);
		if (from->n == 0)
			return g4_fail(err, G4_ERR_UNSUPPORTED, "%s: normalizer Replace with an empty pattern", path);
		return g4_tokb_add_replace(&t->norm, &t->n_norm, from->u.str, from->n,
								   to->u.str, to->n, err);
	}
	if (strcmp(type, "Prepend") == 0)
	{
		const g4j  *pre = g4j_get(node, "prepend");

		if (!g4j_is(pre, G4J_STRING))
			return g4_fail(err, G4_ERR_FORMAT, "%s: normalizer Prepend has no prepend string", path);
		return g4_tokb_add_replace(&t->norm, &t->n_norm, "", 0, pre->u.str, pre->n, err);
	}
	return g4_fail(err, G4_ERR_UNSUPPORTED, "%s: normalizer type \"%s\" is not supported", path, type);
}

static int
load_pre_tokenizer(g4_tokenizer *t, const g4j *node, const char *path, g4_err *err)
{
	const char *type,
			   *behavior;
	const g4j  *pat;

	if (json_is_null(node))
		return G4_OK;
	type = g4j_get_str(node, "type");
	if (type && strcmp(type, "Sequence") == 0 && g4j_len(g4j_get(node, "pretokenizers")) == 1)
		return load_pre_tokenizer(t, g4j_at(g4j_get(node, "pretokenizers"), 0), path, err);
	if (!type || strcmp(type, "Split") != 0)
		return g4_fail(err, G4_ERR_UNSUPPORTED, "%s: pre_tokenizer type \"%s\" is not supported",
					   path, type ? type : "(none)");
	pat = string_pattern(node);
	if (!pat || pat->n == 0)
		return g4_fail(err, G4_ERR_UNSUPPORTED,
					   "%s: pre_tokenizer Split must have a non-empty literal \"String\" pattern", path);
	if (g4j_get_bool(node, "invert", 0))
		return g4_fail(err, G4_ERR_UNSUPPORTED, "%s: pre_tokenizer Split with invert is not supported", path);
	behavior = g4j_get_str(node, "behavior");
	if (!behavior)
		return g4_fail(err, G4_ERR_FORMAT, "%s: pre_tokenizer Split has no behavior", path);
	if (strcmp(behavior, "Removed") == 0)
		t->split_behavior = G4_SPLIT_REMOVED;
	else if (strcmp(behavior, "Isolated") == 0)
		t->split_behavior = G4_SPLIT_ISOLATED;
	else if (strcmp(behavior, "MergedWithPrevious") == 0)
		t->split_behavior = G4_SPLIT_MERGED_PREV;
	else if (strcmp(behavior, "MergedWithNext") == 0)
		t->split_behavior = G4_SPLIT_MERGED_NEXT;
	else if (strcmp(behavior, "Contiguous") == 0)
		t->split_behavior = G4_SPLIT_CONTIGUOUS;
	else
		return g4_fail(err, G4_ERR_UNSUPPORTED, "%s: pre_tokenizer Split behavior \"%s\" is not supported",
					   path, behavior);
	t->split_pattern = g4_strndup(pat->u.str, pat->n);
	if (!t->split_pattern)
		return g4_fail(err, G4_ERR_NOMEM, "out of memory loading %s", path);
	t->split_pattern_len = pat->n;
	return G4_OK;
}

/*
 * Decoders: Replace steps and ByteFallback act on each token, Fuse joins
 * them, a Strip after Fuse removes leading characters of the whole text.
 * That covers the Gemma and Llama chains; other orders are refused.
 */
static int
load_decoder_step(g4_tokenizer *t, const g4j *node, int *fused, const char *path, g4_err *err)
{
	const char *type = g4j_get_str(node, "type");

	if (!type)
		return g4_fail(err, G4_ERR_FORMAT, "%s: decoder has no type", path);
	if (strcmp(type, "Replace") == 0)
	{
		const g4j  *from = string_pattern(node);
		const g4j  *to = g4j_get(node, "content");

		if (!from || from->n == 0 || !g4j_is(to, G4J_STRING) || *fused)
			return g4_fail(err, G4_ERR_UNSUPPORTED,
						   "%s: decoder Replace must come before Fuse and have a literal \"String\" pattern",
						   path);
		return g4_tokb_add_replace(&t->dec, &t->n_dec, from->u.str, from->n, to->u.str, to->n, err);
	}
	if (strcmp(type, "ByteFallback") == 0)
	{
		if (*fused)
			return g4_fail(err, G4_ERR_UNSUPPORTED, "%s: decoder ByteFallback after Fuse", path);
		t->dec_byte_fallback = 1;
		return G4_OK;
	}
	if (strcmp(type, "Fuse") == 0)
	{
		*fused = 1;
		return G4_OK;
	}
	if (strcmp(type, "Strip") == 0)
	{
		const char *content = g4j_get_str(node, "content");
		int64_t		start = g4j_get_int(node, "start", 0);
		int64_t		stop = g4j_get_int(node, "stop", 0);

		if (!*fused || stop != 0 || !content || start < 0 || start > 1000)
			return g4_fail(err, G4_ERR_UNSUPPORTED,
						   "%s: decoder Strip is supported only after Fuse, with stop = 0", path);
		/* the content is one character */
		t->dec_strip_char = (unsigned char) content[0];
		if ((unsigned char) content[0] >= 0x80)
			return g4_fail(err, G4_ERR_UNSUPPORTED, "%s: decoder Strip of a non-ASCII character", path);
		t->dec_strip_start = (int) start;
		return G4_OK;
	}
	return g4_fail(err, G4_ERR_UNSUPPORTED, "%s: decoder type \"%s\" is not supported", path, type);
}

static int
load_decoder(g4_tokenizer *t, const g4j *node, const char *path, g4_err *err)
{
	const char *type;
	int			fused = 0;
	int			rc;

	if (json_is_null(node))
		return G4_OK;
	type = g4j_get_str(node, "type");
	if (type && strcmp(type, "Sequence") == 0)
	{
		const g4j  *list = g4j_get(node, "decoders");
		size_t		i;

		for (i = 0; i < g4j_len(list); i++)
			if ((rc = load_decoder_step(t, g4j_at(list, i), &fused, path, err)) != G4_OK)
				return rc;
		return G4_OK;
	}
	return load_decoder_step(t, node, &fused, path, err);
}

/* TemplateProcessing: does "single" start with a special token, and which. */
static int
load_post_processor(g4_tokenizer *t, const g4j *node, int *has_post, int *bos_from_post,
					const char *path, g4_err *err)
{
	const char *type;
	const g4j  *first,
			   *special;
	const char *name;

	*has_post = 0;
	*bos_from_post = -1;
	if (json_is_null(node))
		return G4_OK;
	type = g4j_get_str(node, "type");
	if (!type || strcmp(type, "TemplateProcessing") != 0)
		return G4_OK;			/* no BOS rule we can read: the config decides */
	*has_post = 1;
	t->add_bos = 0;
	first = g4j_at(g4j_get(node, "single"), 0);
	special = g4j_get(first, "SpecialToken");
	if (!special)
		return G4_OK;
	name = g4j_get_str(special, "id");
	if (!name)
		return g4_fail(err, G4_ERR_FORMAT, "%s: post_processor special token without an id", path);
	{
		const g4j  *def = g4j_get(g4j_get(node, "special_tokens"), name);
		const g4j  *ids = g4j_get(def, "ids");

		if (g4j_len(ids) != 1)
			return g4_fail(err, G4_ERR_UNSUPPORTED,
						   "%s: post_processor special token \"%s\" must map to exactly one id", path, name);
		int64_t		id = g4j_int(g4j_at(ids, 0), -1);

		if (id < 0 || id > INT32_MAX)
			return g4_fail(err, G4_ERR_FORMAT, "%s: post_processor special token \"%s\" has the id %lld", path, name,
						   (long long) id);
		*bos_from_post = (int) id;
	}
	t->add_bos = 1;
	return G4_OK;
}

static int
load_model(g4_tokenizer *t, const g4j *model, const char *path, g4_err *err)
{
	const g4j  *vocab = g4j_get(model, "vocab");
	const g4j  *merges = g4j_get(model, "merges");
	const g4j  *v;
	const char *s;
	size_t		i;
	int			rc;
	g4_buf		cat = {0};

	for (i = 0; i < vocab->n; i++)
	{
		const g4j  *key = &vocab->u.items[2 * i];
		int64_t		id = g4j_int(&vocab->u.items[2 * i + 1], -1);

		if ((rc = g4_tokb_set_piece(t, (int) id, key->u.str, key->n, 1, err)) != G4_OK)
			return g4_fail_ctx(err, "%s: model.vocab", path);
	}
	if ((rc = g4_tokb_index_vocab(t, err)) != G4_OK)
		return rc;

	for (i = 0; i < g4j_len(merges); i++)
	{
		const g4j  *m = g4j_at(merges, i);
		const char *a,
				   *b;
		size_t		al,
					bl;
		int			left,
					right,
					merged;

		if (g4j_is(m, G4J_ARRAY) && m->n == 2 && g4j_is(&m->u.items[0], G4J_STRING) &&
			g4j_is(&m->u.items[1], G4J_STRING))
		{
			a = m->u.items[0].u.str;
			al = m->u.items[0].n;
			b = m->u.items[1].u.str;
			bl = m->u.items[1].n;
		}
		else if (g4j_is(m, G4J_STRING) && (s = memchr(m->u.str, ' ', m->n)) != NULL)
		{
			a = m->u.str;
			al = (size_t) (s - a);
			b = s + 1;
			bl = m->n - al - 1;
		}
		else
		{
			g4_buf_free(&cat);
			return g4_fail(err, G4_ERR_FORMAT, "%s: model.merges[%zu] is not a pair of pieces", path, i);
		}
		left = g4_tokb_lookup(t, a, al);
		right = g4_tokb_lookup(t, b, bl);
		cat.len = 0;
		if (g4_buf_append(&cat, a, al) != 0 || g4_buf_append(&cat, b, bl) != 0)
		{
			g4_buf_free(&cat);
			return g4_fail(err, G4_ERR_NOMEM, "out of memory loading %s", path);
		}
		merged = g4_tokb_lookup(t, cat.data, cat.len);
		if (left < 0 || right < 0 || merged < 0)
		{
			g4_fail(err, G4_ERR_FORMAT, "%s: model.merges[%zu] (\"%.*s\" \"%.*s\") uses a piece missing from model.vocab",
					path, i, (int) G4_MIN(al, 64), a, (int) G4_MIN(bl, 64), b);
			g4_buf_free(&cat);
			return G4_ERR_FORMAT;
		}
		if ((rc = g4_tokb_add_merge(t, left, right, merged, (int) i, err)) != G4_OK)
		{
			g4_buf_free(&cat);
			return rc;
		}
	}
	g4_buf_free(&cat);

	t->byte_fallback = g4j_get_bool(model, "byte_fallback", 0);
	t->fuse_unk = g4j_get_bool(model, "fuse_unk", 0);
	t->ignore_merges = g4j_get_bool(model, "ignore_merges", 0);
	v = g4j_get(model, "unk_token");
	if (g4j_is(v, G4J_STRING))
		t->unk_id = g4_tokb_lookup(t, v->u.str, v->n);
	v = g4j_get(model, "dropout");
	if (!json_is_null(v) && g4j_num(v, 0) != 0)
		return g4_fail(err, G4_ERR_UNSUPPORTED, "%s: model.dropout is not supported", path);
	s = g4j_get_str(model, "continuing_subword_prefix");
	if (s && s[0])
		return g4_fail(err, G4_ERR_UNSUPPORTED, "%s: model.continuing_subword_prefix is not supported", path);
	s = g4j_get_str(model, "end_of_word_suffix");
	if (s && s[0])
		return g4_fail(err, G4_ERR_UNSUPPORTED, "%s: model.end_of_word_suffix is not supported", path);
	return G4_OK;
}

static int
tok_from_json(const g4j *root, const g4j *config, const char *path, const char *config_path,
			  g4_tokenizer **out, g4_err *err)
{
	const g4j  *model = g4j_get(root, "model");
	const g4j  *vocab = g4j_get(model, "vocab");
	const g4j  *added = g4j_get(root, "added_tokens");
	const char *type = g4j_get_str(model, "type");
	g4_tokenizer *t;
	int64_t		max_id = -1,
				max_added = -1;
	size_t		i;
	int			rc,
				has_post,
				bos_post;
	const char *name;

	if (!g4j_is(model, G4J_OBJECT))
		return g4_fail(err, G4_ERR_FORMAT, "%s: no \"model\" object", path);
	if (type && strcmp(type, "BPE") != 0)
		return g4_fail(err, G4_ERR_UNSUPPORTED, "%s: model.type \"%s\" is not supported (BPE only)", path, type);
	if (!g4j_is(vocab, G4J_OBJECT) || !g4j_is(g4j_get(model, "merges"), G4J_ARRAY))
		return g4_fail(err, G4_ERR_FORMAT, "%s: model.vocab must be an object and model.merges an array", path);
	for (i = 0; i < vocab->n; i++)
	{
		const g4j  *id = &vocab->u.items[2 * i + 1];

		if (!g4j_is(id, G4J_NUMBER) || !id->is_integer || id->integer < 0 || id->integer >= (1 << 30))
			return g4_fail(err, G4_ERR_FORMAT, "%s: model.vocab[\"%.64s\"] is not a valid id", path,
						   vocab->u.items[2 * i].u.str);
		max_id = G4_MAX(max_id, id->integer);
	}
	for (i = 0; i < g4j_len(added); i++)
	{
		const g4j  *a = g4j_at(added, i);
		int64_t		id = g4j_get_int(a, "id", -1);

		if (id < 0 || id >= (1 << 30) || !g4j_is(g4j_get(a, "content"), G4J_STRING))
			return g4_fail(err, G4_ERR_FORMAT, "%s: added_tokens[%zu] has no valid id or content", path, i);
		max_id = G4_MAX(max_id, id);
	}
	if (max_id < 0)
		return g4_fail(err, G4_ERR_FORMAT, "%s: the vocabulary is empty", path);

	t = g4_tokb_new((int) max_id + 1, err);
	if (!t)
		return err ? err->code : G4_ERR_NOMEM;
	if ((rc = load_model(t, model, path, err)) != G4_OK)
		goto fail;
	for (i = 0; i < g4j_len(added); i++)
	{
		const g4j  *a = g4j_at(added, i);
		const g4j  *c = g4j_get(a, "content");
		int			id = g4_tokb_lookup(t, c->u.str, c->n);
		int			k;

		/*
		 * The reference numbers added tokens itself: one whose text is in
		 * the model vocabulary (or added before) takes that id, a new one
		 * the next id after the vocabulary and the added tokens so far.  A
		 * file whose ids say otherwise is refused rather than read with
		 * different ids.
		 */
		for (k = t->n_added; id < 0 && k-- > 0;)
			if (t->added[k].len == c->n && memcmp(t->arena + t->added[k].off, c->u.str, c->n) == 0)
				id = t->added[k].id;
		if (id < 0)
		{
			int64_t		expected = max_added < 0 ? (int64_t) vocab->n :
				max_added >= (int64_t) vocab->n ? max_added + 1 : (int64_t) vocab->n;

			id = (int) g4j_get_int(a, "id", -1);
			if (id != expected)
			{
				rc = g4_fail(err, G4_ERR_FORMAT,
							 "%s: added_tokens[%zu] \"%.64s\" has id %d, but the Hugging Face tokenizer would number it %lld",
							 path, i, c->u.str, id, (long long) expected);
				goto fail;
			}
		}
		max_added = G4_MAX(max_added, id);
		rc = g4_tokb_add_added(t, id, c->u.str, c->n,
							   g4j_get_bool(a, "special", 0), g4j_get_bool(a, "lstrip", 0),
							   g4j_get_bool(a, "rstrip", 0), g4j_get_bool(a, "single_word", 0),
							   g4j_get_bool(a, "normalized", !g4j_get_bool(a, "special", 0)), err);
		if (rc != G4_OK)
			goto fail;
	}
	if ((rc = load_normalizer(t, g4j_get(root, "normalizer"), path, err)) != G4_OK ||
		(rc = load_pre_tokenizer(t, g4j_get(root, "pre_tokenizer"), path, err)) != G4_OK ||
		(rc = load_decoder(t, g4j_get(root, "decoder"), path, err)) != G4_OK ||
		(rc = load_post_processor(t, g4j_get(root, "post_processor"), &has_post, &bos_post, path, err)) != G4_OK)
		goto fail;
	if ((rc = g4_tokb_finish(t, err)) != G4_OK)
		goto fail;
	if (bos_post >= t->n_vocab)
	{
		rc = g4_fail(err, G4_ERR_FORMAT, "%s: the post-processor's BOS id %d is outside the vocabulary (%d ids)",
					 path, bos_post, t->n_vocab);
		goto fail;
	}

	/*
	 * Special token ids: the config's names first, then the post-processor's
	 * BOS, then the conventional Gemma names.  Whether BOS is added by
	 * default follows the post-processor (transformers 5 does the same and
	 * ignores add_bos_token when tokenizer.json has one); without one, the
	 * config's add_bos_token.
	 */
	name = token_name(g4j_get(config, "bos_token"));
	t->bos_id = name ? g4_tok_id(t, name) : bos_post >= 0 ? bos_post : g4_tok_id(t, "<bos>");
	if (name && t->bos_id < 0)
	{
		rc = g4_fail(err, G4_ERR_FORMAT, "%s: bos_token \"%s\" is not in the vocabulary", config_path, name);
		goto fail;
	}
	name = token_name(g4j_get(config, "eos_token"));
	t->eos_id = g4_tok_id(t, name ? name : "<eos>");
	if (name && t->eos_id < 0)
	{
		rc = g4_fail(err, G4_ERR_FORMAT, "%s: eos_token \"%s\" is not in the vocabulary", config_path, name);
		goto fail;
	}
	name = token_name(g4j_get(config, "pad_token"));
	t->pad_id = g4_tok_id(t, name ? name : "<pad>");
	if (!has_post)
		t->add_bos = g4j_get_bool(config, "add_bos_token", 0);
	if (t->add_bos && t->bos_id < 0)
	{
		rc = g4_fail(err, G4_ERR_FORMAT, "%s: BOS is to be added but no BOS token is known", path);
		goto fail;
	}
	*out = t;
	return G4_OK;

fail:
	g4_tok_free(t);
	return rc;
}

int
g4_tok_load_json(const char *tokenizer_json, const char *tokenizer_config,
				 g4_tokenizer **out, g4_err *err)
{
	char	   *text = NULL,
			   *ctext = NULL;
	size_t		len = 0,
				clen = 0;
	g4j_doc    *doc = NULL,
			   *cdoc = NULL;
	int			rc;

	*out = NULL;
	if ((rc = g4_read_file(tokenizer_json, &text, &len, err)) != G4_OK)
		return rc;
	doc = g4j_parse(text, len, err);
	free(text);
	if (!doc)
		return g4_fail_ctx(err, "parsing %s", tokenizer_json);
	if (tokenizer_config)
	{
		if ((rc = g4_read_file(tokenizer_config, &ctext, &clen, err)) != G4_OK)
		{
			g4j_free(doc);
			return rc;
		}
		cdoc = g4j_parse(ctext, clen, err);
		free(ctext);
		if (!cdoc)
		{
			g4j_free(doc);
			return g4_fail_ctx(err, "parsing %s", tokenizer_config);
		}
	}
	rc = tok_from_json(g4j_root(doc), cdoc ? g4j_root(cdoc) : NULL, tokenizer_json,
					   tokenizer_config ? tokenizer_config : "tokenizer_config.json", out, err);
	g4j_free(doc);
	g4j_free(cdoc);
	return rc;
}

/* ---- GGUF ------------------------------------------------------------- */

enum
{
	GGUF_TOK_NORMAL = 1,
	GGUF_TOK_UNKNOWN = 2,
	GGUF_TOK_CONTROL = 3,
	GGUF_TOK_USER_DEFINED = 4,
	GGUF_TOK_UNUSED = 5,
	GGUF_TOK_BYTE = 6
};

typedef struct
{
	int32_t		id;
	int32_t		nchars;			/* ordering keys */
	int32_t		left_chars;
	float		score;
	int32_t		left;
	int32_t		right;
} spm_merge;

static int
cmp_ws_merge(const void *pa, const void *pb)
{
	const spm_merge *a = pa,
			   *b = pb;

	if (a->nchars != b->nchars)
		return a->nchars > b->nchars ? -1 : 1;
	if (a->left_chars != b->left_chars)
		return a->left_chars > b->left_chars ? -1 : 1;
	return a->id < b->id ? -1 : a->id > b->id;
}

static int
cmp_score_merge(const void *pa, const void *pb)
{
	const spm_merge *a = pa,
			   *b = pb;

	if (a->score != b->score)
		return a->score > b->score ? -1 : 1;
	if (a->id != b->id)
		return a->id < b->id ? -1 : 1;
	if (a->left_chars != b->left_chars)
		return a->left_chars > b->left_chars ? -1 : 1;
	return 0;
}

static int
utf8_char_count(const char *s, size_t n)
{
	int			c = 0;
	size_t		i;

	for (i = 0; i < n; i++)
		if (((unsigned char) s[i] & 0xC0) != 0x80)
			c++;
	return c;
}

/* True if the piece is one whitespace character (U+2581, \n, \t) repeated. */
static int
is_ws_run(const char *s, size_t n)
{
	size_t		step,
				i;

	if (n == 0)
		return 0;
	step = (s[0] == '\n' || s[0] == '\t') ? 1 :
		(n >= 3 && memcmp(s, SPM_SPACE, 3) == 0) ? 3 : 0;
	if (step == 0 || n % step != 0)
		return 0;
	for (i = step; i < n; i += step)
		if (memcmp(s + i, s, step) != 0)
			return 0;
	return 1;
}

/* Add every split of piece id into two vocabulary pieces to list. */
static int
add_splits(g4_tokenizer *t, int id, float score, spm_merge **list, size_t *n, size_t *cap,
		   g4_err *err)
{
	const char *s = t->arena + t->piece_off[id];
	size_t		len = t->piece_len[id];
	int			nchars = utf8_char_count(s, len);
	int			left_chars = 0;
	size_t		i;

	for (i = 1; i < len; i++)
	{
		int			l,
					r;

		if (((unsigned char) s[i - 1] & 0xC0) != 0x80)
			left_chars++;
		if (((unsigned char) s[i] & 0xC0) == 0x80)
			continue;			/* not a character boundary */
		l = g4_tokb_lookup(t, s, i);
		r = g4_tokb_lookup(t, s + i, len - i);
		if (l < 0 || r < 0)
			continue;
		if (*n == *cap)
		{
			size_t		c = *cap ? *cap * 2 : 1 << 16;
			spm_merge  *p = g4_realloc(*list, sizeof(*p) * c);

			if (!p)
				return g4_fail(err, G4_ERR_NOMEM, "out of memory deriving merges from a GGUF vocabulary");
			*list = p;
			*cap = c;
		}
		(*list)[*n].id = id;
		(*list)[*n].nchars = nchars;
		(*list)[*n].left_chars = left_chars;
		(*list)[*n].score = score;
		(*list)[*n].left = l;
		(*list)[*n].right = r;
		(*n)++;
	}
	return G4_OK;
}

/* A boolean or integer metadata value, or dflt when absent. */
static int
gguf_flag(const g4_gguf *g, const char *key, int dflt)
{
	const g4_gguf_kv *kv = g4_gguf_get(g, key);

	if (!kv)
		return dflt;
	if (kv->type == G4_GGUF_BOOL)
		return kv->v.u != 0;
	return g4_gguf_get_int(g, key, dflt) != 0;
}

static const g4_gguf_kv *
gguf_array(const g4_gguf *g, const char *key, int elem_type, uint64_t n, int required,
		   g4_err *err, int *rc)
{
	const g4_gguf_kv *kv = g4_gguf_get(g, key);

	*rc = G4_OK;
	if (!kv)
	{
		if (required)
			*rc = g4_fail(err, G4_ERR_FORMAT, "GGUF: %s is missing", key);
		return NULL;
	}
	if (kv->type != G4_GGUF_ARRAY || kv->arr_type != elem_type || (n && kv->arr_len != n))
	{
		*rc = g4_fail(err, G4_ERR_FORMAT, "GGUF: %s must be an array of type %d with %llu elements",
					  key, elem_type, (unsigned long long) n);
		return NULL;
	}
	return kv;
}

int
g4_tok_load_gguf(const g4_gguf *g, g4_tokenizer **out, g4_err *err)
{
	const char *model = g4_gguf_get_str(g, "tokenizer.ggml.model");
	const g4_gguf_kv *tokens,
			   *scores_kv,
			   *types_kv;
	g4_tokenizer *t = NULL;
	spm_merge  *list = NULL;
	size_t		n_list = 0,
				cap_list = 0,
				k;
	uint64_t	n;
	int			rc,
				id,
				rank = 0,
				add_space_prefix;
	g4_buf		piece = {0};

	*out = NULL;
	if (!model)
		return g4_fail(err, G4_ERR_FORMAT, "GGUF: tokenizer.ggml.model is missing");
	if (strcmp(model, "llama") != 0)
		return g4_fail(err, G4_ERR_UNSUPPORTED,
					   "GGUF: tokenizer.ggml.model \"%s\" is not supported (only \"llama\" SentencePiece vocabularies)",
					   model);
	tokens = gguf_array(g, "tokenizer.ggml.tokens", G4_GGUF_STRING, 0, 1, err, &rc);
	if (!tokens)
		return rc;
	n = tokens->arr_len;
	if (n == 0 || n >= (1u << 30))
		return g4_fail(err, G4_ERR_FORMAT, "GGUF: tokenizer.ggml.tokens has %llu entries",
					   (unsigned long long) n);
	scores_kv = gguf_array(g, "tokenizer.ggml.scores", G4_GGUF_F32, n, 1, err, &rc);
	if (!scores_kv)
		return rc;
	types_kv = gguf_array(g, "tokenizer.ggml.token_type", G4_GGUF_I32, n, 0, err, &rc);
	if (rc != G4_OK)
		return rc;

	t = g4_tokb_new((int) n, err);
	if (!t)
		return err ? err->code : G4_ERR_NOMEM;

	/*
	 * Pieces.  The GGUF converter writes user-defined pieces with real spaces
	 * (so that they match raw text); the SentencePiece form, which
	 * tokenizer.json also uses, has U+2581, and raw spaces reach them through
	 * normalisation and the whitespace merges below.
	 */
	for (id = 0; id < (int) n; id++)
	{
		const char *s = tokens->arr_strs[id];
		size_t		len = tokens->arr_str_lens[id];
		int32_t		type = GGUF_TOK_NORMAL;
		size_t		i;

		if (types_kv)
			memcpy(&type, (const char *) types_kv->arr_data + 4 * (size_t) id, 4);
		piece.len = 0;
		for (i = 0; i < len; i++)
		{
			if (type == GGUF_TOK_USER_DEFINED && s[i] == ' ')
				rc = g4_buf_append(&piece, SPM_SPACE, 3);
			else
				rc = g4_buf_append(&piece, s + i, 1);
			if (rc != 0)
			{
				rc = g4_fail(err, G4_ERR_NOMEM, "out of memory loading the GGUF vocabulary");
				goto fail;
			}
		}
		if ((rc = g4_tokb_set_piece(t, id, piece.data ? piece.data : "", piece.len, 1, err)) != G4_OK)
			goto fail;
		if ((type == GGUF_TOK_CONTROL || type == GGUF_TOK_UNKNOWN || type == GGUF_TOK_USER_DEFINED) &&
			piece.len > 0)
		{
			rc = g4_tokb_add_added(t, id, piece.data, piece.len, type != GGUF_TOK_USER_DEFINED,
								   0, 0, 0, 0, err);
			if (rc != G4_OK)
				goto fail;
		}
	}
	if ((rc = g4_tokb_index_vocab(t, err)) != G4_OK)
		goto fail;

	/* whitespace-run merges first, longest piece first */
	for (id = 0; id < (int) n; id++)
	{
		int32_t		type = GGUF_TOK_NORMAL;

		if (types_kv)
			memcpy(&type, (const char *) types_kv->arr_data + 4 * (size_t) id, 4);
		if (type == GGUF_TOK_USER_DEFINED && is_ws_run(t->arena + t->piece_off[id], t->piece_len[id]) &&
			(rc = add_splits(t, id, 0, &list, &n_list, &cap_list, err)) != G4_OK)
			goto fail;
	}
	if (n_list > 0)				/* qsort needs a valid array even for none */
		qsort(list, n_list, sizeof(*list), cmp_ws_merge);
	for (k = 0; k < n_list; k++)
		if ((rc = g4_tokb_add_merge(t, list[k].left, list[k].right, list[k].id, rank++, err)) != G4_OK)
			goto fail;

	/* then the normal pieces by score, each split longest-left first */
	n_list = 0;
	for (id = 0; id < (int) n; id++)
	{
		int32_t		type = GGUF_TOK_NORMAL;
		float		score;

		if (types_kv)
			memcpy(&type, (const char *) types_kv->arr_data + 4 * (size_t) id, 4);
		if (type != GGUF_TOK_NORMAL)
			continue;
		memcpy(&score, (const char *) scores_kv->arr_data + 4 * (size_t) id, 4);
		if ((rc = add_splits(t, id, score, &list, &n_list, &cap_list, err)) != G4_OK)
			goto fail;
	}
	if (n_list > 0)				/* qsort needs a valid array even for none */
		qsort(list, n_list, sizeof(*list), cmp_score_merge);
	for (k = 0; k < n_list; k++)
		if ((rc = g4_tokb_add_merge(t, list[k].left, list[k].right, list[k].id, rank++, err)) != G4_OK)
			goto fail;
	free(list);
	list = NULL;

	/* SentencePiece: spaces become U+2581, optionally with a leading one */
	add_space_prefix = gguf_flag(g, "tokenizer.ggml.add_space_prefix", 1);
	if (add_space_prefix &&
		(rc = g4_tokb_add_replace(&t->norm, &t->n_norm, "", 0, SPM_SPACE, 3, err)) != G4_OK)
		goto fail;
	if ((rc = g4_tokb_add_replace(&t->norm, &t->n_norm, " ", 1, SPM_SPACE, 3, err)) != G4_OK ||
		(rc = g4_tokb_add_replace(&t->dec, &t->n_dec, SPM_SPACE, 3, " ", 1, err)) != G4_OK)
		goto fail;
	t->dec_byte_fallback = 1;
	if (add_space_prefix)
	{
		t->dec_strip_char = ' ';
		t->dec_strip_start = 1;
	}
	t->byte_fallback = 1;
	t->fuse_unk = 1;
	t->unk_id = (int) g4_gguf_get_int(g, "tokenizer.ggml.unknown_token_id", -1);
	t->bos_id = (int) g4_gguf_get_int(g, "tokenizer.ggml.bos_token_id", -1);
	t->eos_id = (int) g4_gguf_get_int(g, "tokenizer.ggml.eos_token_id", -1);
	t->pad_id = (int) g4_gguf_get_int(g, "tokenizer.ggml.padding_token_id", -1);
	t->add_bos = gguf_flag(g, "tokenizer.ggml.add_bos_token", 1);
	if (t->unk_id >= (int) n || t->bos_id >= (int) n || t->eos_id >= (int) n || t->pad_id >= (int) n)
	{
		rc = g4_fail(err, G4_ERR_FORMAT, "GGUF: a tokenizer.ggml.*_token_id is outside the vocabulary");
		goto fail;
	}
	if (t->add_bos && t->bos_id < 0)
		t->add_bos = 0;
	if ((rc = g4_tokb_finish(t, err)) != G4_OK)
		goto fail;
	g4_buf_free(&piece);
	*out = t;
	return G4_OK;

fail:
	free(list);
	g4_buf_free(&piece);
	g4_tok_free(t);
	return rc;
}
