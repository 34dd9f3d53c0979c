/*
 * tokenizer.c — the BPE tokenizer core: vocabulary and merge tables, added
 * token matching, encoding, whole-sequence and streaming decoding.
 *
 * Encoding follows the Hugging Face `tokenizers` pipeline step by step:
 *   1. added tokens with normalized = false are found in the raw text
 *      (leftmost-longest, with their lstrip/rstrip/single_word flags);
 *   2. every other stretch is normalised (Replace / Prepend steps), and
 *      added tokens with normalized = true are found in it;
 *   3. the rest is pre-tokenised (Split on a literal string, if any);
 *   4. each word is BPE-merged: characters, byte fallback for characters
 *      missing from the vocabulary, then merges by rank through a binary
 *      heap over adjacent pairs and a linked list of symbols (O(n log n),
 *      so a whole document can be one word).
 *
 * Decoding applies the decoder chain: Replace on each token, byte-fallback
 * runs (<0xNN> tokens) turned into bytes when the whole run is valid UTF-8
 * and into one U+FFFD per byte otherwise, concatenation, and an optional
 * leading Strip.
 *
 * Nothing here is mutable after g4_tokb_finish: encode and decode allocate
 * their scratch space per call, so one tokenizer serves many threads.
 */
#define G4_TOKENIZER_INTERNAL
#include "tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NO_PIECE UINT32_MAX
#define DEAD_SYMBOL (-1)

/* ---- hashing ---------------------------------------------------------- */

static uint64_t
hash_bytes(const char *s, size_t n)
{
	uint64_t	h = 0xcbf29ce484222325ull;
	size_t		i;

	for (i = 0; i < n; i++)
	{
		h ^= (unsigned char) s[i];
		h *= 0x100000001b3ull;
	}
	return h ^ (h >> 29);
}

static uint64_t
hash_u64(uint64_t x)
{
	x ^= x >> 33;
	x *= 0xff51afd7ed558ccdull;
	x ^= x >> 33;
	x *= 0xc4ceb9fe1a85ec53ull;
	x ^= x >> 33;
	return x;
}

static uint32_t
table_size_for(size_t n)
{
	uint32_t	size = 16;

	while ((size_t) size < n * 2)
		size <<= 1;
	return size;
}

/* ---- UTF-8 ------------------------------------------------------------ */

/* Length of the character starting at s[0] (at most n bytes); malformed
 * input counts as one-byte characters so that it reaches byte fallback. */
static size_t
utf8_len(const unsigned char *s, size_t n)
{
	size_t		len,
				i;

	if (s[0] < 0x80)
		return 1;
	if (s[0] >= 0xC2 && s[0] <= 0xDF)
		len = 2;
	else if (s[0] >= 0xE0 && s[0] <= 0xEF)
		len = 3;
	else if (s[0] >= 0xF0 && s[0] <= 0xF4)
		len = 4;
	else
		return 1;
	if (len > n)
		return 1;
	for (i = 1; i < len; i++)
		if ((s[i] & 0xC0) != 0x80)
			return 1;
	return len;
}

static uint32_t
utf8_decode(const unsigned char *s, size_t len)
{
	switch (len)
	{
		case 2:
			return ((uint32_t) (s[0] & 0x1F) << 6) | (s[1] & 0x3F);
		case 3:
			return ((uint32_t) (s[0] & 0x0F) << 12) | ((uint32_t) (s[1] & 0x3F) << 6) |
				(s[2] & 0x3F);
		case 4:
			return ((uint32_t) (s[0] & 0x07) << 18) | ((uint32_t) (s[1] & 0x3F) << 12) |
				((uint32_t) (s[2] & 0x3F) << 6) | (s[3] & 0x3F);
		default:
			return s[0];
	}
}

static size_t
utf8_encode(uint32_t c, char *out)
{
	if (c < 0x80)
	{
		out[0] = (char) c;
		return 1;
	}
	if (c < 0x800)
	{
		out[0] = (char) (0xC0 | (c >> 6));
		out[1] = (char) (0x80 | (c & 0x3F));
		return 2;
	}
	if (c < 0x10000)
	{
		out[0] = (char) (0xE0 | (c >> 12));
		out[1] = (char) (0x80 | ((c >> 6) & 0x3F));
		out[2] = (char) (0x80 | (c & 0x3F));
		return 3;
	}
	out[0] = (char) (0xF0 | (c >> 18));
	out[1] = (char) (0x80 | ((c >> 12) & 0x3F));
	out[2] = (char) (0x80 | ((c >> 6) & 0x3F));
	out[3] = (char) (0x80 | (c & 0x3F));
	return 4;
}

/* Previous character start before position i (i > 0). */
static size_t
utf8_prev(const unsigned char *s, size_t i)
{
	size_t		j = i - 1;

	while (j > 0 && i - j < 4 && (s[j] & 0xC0) == 0x80)
		j--;
	if (utf8_len(s + j, i - j) != i - j)
		return i - 1;
	return j;
}

/*
 * Strict UTF-8 validation, one byte at a time (the rules of Rust's
 * str::from_utf8, which the Hugging Face byte-fallback decoder uses).
 * State 0: at a character boundary; -1: invalid; otherwise the number of
 * continuation bytes still needed and the range allowed for the next one.
 */
#define UTF8_STATE(need, lo, hi) ((need) | ((lo) << 8) | ((hi) << 16))

static int
utf8_step(int st, unsigned char b)
{
	int			need,
				lo,
				hi;

	if (st < 0)
		return -1;
	if (st == 0)
	{
		if (b < 0x80)
			return 0;
		if (b >= 0xC2 && b <= 0xDF)
			return UTF8_STATE(1, 0x80, 0xBF);
		if (b == 0xE0)
			return UTF8_STATE(2, 0xA0, 0xBF);
		if ((b >= 0xE1 && b <= 0xEC) || b == 0xEE || b == 0xEF)
			return UTF8_STATE(2, 0x80, 0xBF);
		if (b == 0xED)
			return UTF8_STATE(2, 0x80, 0x9F);
		if (b == 0xF0)
			return UTF8_STATE(3, 0x90, 0xBF);
		if (b >= 0xF1 && b <= 0xF3)
			return UTF8_STATE(3, 0x80, 0xBF);
		if (b == 0xF4)
			return UTF8_STATE(3, 0x80, 0x8F);
		return -1;
	}
	need = st & 0xFF;
	lo = (st >> 8) & 0xFF;
	hi = (st >> 16) & 0xFF;
	if (b < lo || b > hi)
		return -1;
	need--;
	return need ? UTF8_STATE(need, 0x80, 0xBF) : 0;
}

/* Unicode White_Space (the \s of the Rust regex crate). */
static int
is_space_cp(uint32_t c)
{
	return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 ||
		c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 ||
		c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

/*
 * \w of the Rust regex crate (alphabetic, marks, digits, connector
 * punctuation).  Exact for ASCII and Latin-1; beyond that every character
 * counts as a word character except white space and the main punctuation
 * and symbol blocks — an approximation that only matters for added tokens
 * with single_word set, which Gemma vocabularies do not use.
 */
static int
is_word_cp(uint32_t c)
{
	if (c < 0x80)
		return (c >= '0' && c <= '9') || (c >= 'A' && c <= 'Z') ||
			(c >= 'a' && c <= 'z') || c == '_';
	if (c < 0x100)
		return c == 0xAA || c == 0xB5 || c == 0xBA || (c >= 0xC0 && c != 0xD7 && c != 0xF7);
	if (is_space_cp(c))
		return 0;
	/* punctuation and symbol blocks: general punctuation, currency,
	 * arrows to miscellaneous symbols (U+2581 included), CJK punctuation,
	 * full-width punctuation, emoji and pictographs */
	if ((c >= 0x2000 && c <= 0x206F) || (c >= 0x20A0 && c <= 0x20CF) ||
		(c >= 0x2190 && c <= 0x2BFF) || (c >= 0x3000 && c <= 0x303F) ||
		(c >= 0xFF01 && c <= 0xFF0F) || (c >= 0xFF1A && c <= 0xFF20) ||
		(c >= 0x1F000 && c <= 0x1FAFF))
		return 0;
	return 1;
}

/* ---- building --------------------------------------------------------- */

g4_tokenizer *
g4_tokb_new(int n_vocab, g4_err *err)
{
	g4_tokenizer *t;
	int			i;

	if (n_vocab <= 0 || n_vocab > (1 << 30))
	{
		g4_fail(err, G4_ERR_FORMAT, "tokenizer vocabulary size %d is out of range", n_vocab);
		return NULL;
	}
	t = g4_calloc(1, sizeof(*t));
	if (!t)
	{
		g4_fail(err, G4_ERR_NOMEM, "out of memory allocating a tokenizer");
		return NULL;
	}
	t->n_vocab = n_vocab;
	t->piece_off = g4_malloc(sizeof(uint32_t) * (size_t) n_vocab);
	t->piece_len = g4_calloc((size_t) n_vocab, sizeof(uint32_t));
	t->in_model = g4_calloc((size_t) n_vocab, 1);
	t->special = g4_calloc((size_t) n_vocab, 1);
	t->byte_of = g4_malloc(sizeof(int16_t) * (size_t) n_vocab);
	t->added_of_id = g4_malloc(sizeof(int32_t) * (size_t) n_vocab);
	if (!t->piece_off || !t->piece_len || !t->in_model || !t->special ||
		!t->byte_of || !t->added_of_id)
	{
		g4_tok_free(t);
		g4_fail(err, G4_ERR_NOMEM, "out of memory allocating a tokenizer of %d ids", n_vocab);
		return NULL;
	}
	for (i = 0; i < n_vocab; i++)
	{
		t->piece_off[i] = NO_PIECE;
		t->byte_of[i] = -1;
		t->added_of_id[i] = -1;
	}
	for (i = 0; i < 128; i++)
		t->ascii_id[i] = -1;
	for (i = 0; i < 256; i++)
	{
		t->byte_id[i] = -1;
		t->raw_trie.root[i] = -1;
		t->norm_trie.root[i] = -1;
	}
	t->unk_id = -1;
	t->bos_id = -1;
	t->eos_id = -1;
	t->pad_id = -1;
	return t;
}

static int
arena_add(g4_tokenizer *t, const char *s, size_t len, uint32_t *off, g4_err *err)
{
	if (t->arena_len + len + 1 > t->arena_cap)
	{
		size_t		cap = t->arena_cap ? t->arena_cap * 2 : 1 << 16;
		char	   *p;

		while (cap < t->arena_len + len + 1)
			cap *= 2;
		if (cap >= NO_PIECE)
			return g4_fail(err, G4_ERR_FORMAT, "tokenizer pieces exceed 4 GiB");
		p = g4_realloc(t->arena, cap);
		if (!p)
			return g4_fail(err, G4_ERR_NOMEM, "out of memory storing tokenizer pieces");
		t->arena = p;
		t->arena_cap = cap;
	}
	memcpy(t->arena + t->arena_len, s, len);
	t->arena[t->arena_len + len] = '\0';
	*off = (uint32_t) t->arena_len;
	t->arena_len += len + 1;
	return G4_OK;
}

int
g4_tokb_set_piece(g4_tokenizer *t, int id, const char *s, size_t len, int in_model,
				  g4_err *err)
{
	uint32_t	off;
	int			rc;

	if (id < 0 || id >= t->n_vocab)
		return g4_fail(err, G4_ERR_FORMAT, "token id %d is outside 0..%d", id, t->n_vocab - 1);
	if (len >= (1u << 24))
		return g4_fail(err, G4_ERR_FORMAT, "token %d is %zu bytes long", id, len);
	if ((rc = arena_add(t, s, len, &off, err)) != G4_OK)
		return rc;
	t->piece_off[id] = off;
	t->piece_len[id] = (uint32_t) len;
	if (in_model)
		t->in_model[id] = 1;
	return G4_OK;
}

int
g4_tokb_add_merge(g4_tokenizer *t, int left, int right, int merged, int rank, g4_err *err)
{
	g4_tok_merge *m;

	if (t->n_merges == t->cap_merges)
	{
		int			cap = t->cap_merges ? t->cap_merges * 2 : 1024;

		m = g4_realloc(t->merge_list, sizeof(*m) * (size_t) cap);
		if (!m)
			return g4_fail(err, G4_ERR_NOMEM, "out of memory storing %d merges", cap);
		t->merge_list = m;
		t->cap_merges = cap;
	}
	m = &t->merge_list[t->n_merges++];
	m->key = ((uint64_t) (uint32_t) left << 32) | (uint32_t) right;
	m->rank = rank;
	m->id = merged;
	return G4_OK;
}

int
g4_tokb_add_added(g4_tokenizer *t, int id, const char *s, size_t len, int special,
				  int lstrip, int rstrip, int single_word, int normalized, g4_err *err)
{
	g4_tok_added *a;
	uint32_t	off;
	int			rc;

	if (id < 0 || id >= t->n_vocab)
		return g4_fail(err, G4_ERR_FORMAT, "added token id %d is outside 0..%d", id,
					   t->n_vocab - 1);
	if (t->n_added == t->cap_added)
	{
		int			cap = t->cap_added ? t->cap_added * 2 : 256;

		a = g4_realloc(t->added, sizeof(*a) * (size_t) cap);
		if (!a)
			return g4_fail(err, G4_ERR_NOMEM, "out of memory storing added tokens");
		t->added = a;
		t->cap_added = cap;
	}
	if ((rc = arena_add(t, s, len, &off, err)) != G4_OK)
		return rc;
	a = &t->added[t->n_added];
	a->id = id;
	a->special = (uint8_t) (special != 0);
	a->lstrip = (uint8_t) (lstrip != 0);
	a->rstrip = (uint8_t) (rstrip != 0);
	a->single_word = (uint8_t) (single_word != 0);
	a->normalized = (uint8_t) (normalized != 0);
	a->off = off;
	a->len = (uint32_t) len;
	/* the added token's text is the id's text (it wins over the model's) */
	t->piece_off[id] = off;
	t->piece_len[id] = (uint32_t) len;
	t->special[id] = a->special;
	t->added_of_id[id] = t->n_added;
	t->n_added++;
	return G4_OK;
}

int
g4_tokb_add_replace(g4_tok_replace **list, int *n, const char *from, size_t from_len,
					const char *to, size_t to_len, g4_err *err)
{
	g4_tok_replace *l = g4_realloc(*list, sizeof(**list) * (size_t) (*n + 1));
	g4_tok_replace *r;

	if (!l)
		return g4_fail(err, G4_ERR_NOMEM, "out of memory storing a Replace step");
	*list = l;
	r = &l[*n];
	r->from = g4_strndup(from ? from : "", from_len);
	r->to = g4_strndup(to ? to : "", to_len);
	r->from_len = from_len;
	r->to_len = to_len;
	(*n)++;
	if (!r->from || !r->to)
		return g4_fail(err, G4_ERR_NOMEM, "out of memory storing a Replace step");
	return G4_OK;
}

int
g4_tokb_lookup(const g4_tokenizer *t, const char *s, size_t len)
{
	uint32_t	i;

	if (!t->vhash)
		return -1;
	i = (uint32_t) hash_bytes(s, len) & t->vhash_mask;
	for (;;)
	{
		int32_t		id = t->vhash[i];

		if (id < 0)
			return -1;
		if (t->piece_len[id] == len && memcmp(t->arena + t->piece_off[id], s, len) == 0)
			return id;
		i = (i + 1) & t->vhash_mask;
	}
}

/* Index the model vocabulary by text (ids marked in_model). */
int
g4_tokb_index_vocab(g4_tokenizer *t, g4_err *err)
{
	size_t		count = 0;
	uint32_t	size;
	int			id;

	for (id = 0; id < t->n_vocab; id++)
		if (t->in_model[id])
			count++;
	size = table_size_for(count);
	free(t->vhash);
	t->vhash = g4_malloc(sizeof(int32_t) * size);
	if (!t->vhash)
		return g4_fail(err, G4_ERR_NOMEM, "out of memory indexing %zu tokens", count);
	memset(t->vhash, 0xff, sizeof(int32_t) * size);
	t->vhash_mask = size - 1;
	for (id = 0; id < t->n_vocab; id++)
	{
		uint32_t	i;
		const char *s;
		uint32_t	len;

		if (!t->in_model[id])
			continue;
		s = t->arena + t->piece_off[id];
		len = t->piece_len[id];
		i = (uint32_t) hash_bytes(s, len) & t->vhash_mask;
		while (t->vhash[i] >= 0)
		{
			int32_t		o = t->vhash[i];

			/* a repeated text keeps its first id, as a vocabulary map would
			 * keep one entry */
			if (t->piece_len[o] == len && memcmp(t->arena + t->piece_off[o], s, len) == 0)
				break;
			i = (i + 1) & t->vhash_mask;
		}
		if (t->vhash[i] < 0)
			t->vhash[i] = id;
	}
	return G4_OK;
}

static const g4_tok_merge *
merge_find(const g4_tokenizer *t, int32_t left, int32_t right)
{
	uint64_t	key = ((uint64_t) (uint32_t) left << 32) | (uint32_t) right;
	uint32_t	i = (uint32_t) hash_u64(key) & t->mhash_mask;

	for (;;)
	{
		const g4_tok_merge *m = &t->mhash[i];

		if (m->key == key)
			return m;
		if (m->key == UINT64_MAX)
			return NULL;
		i = (i + 1) & t->mhash_mask;
	}
}

static int
build_merges(g4_tokenizer *t, g4_err *err)
{
	uint32_t	size = table_size_for((size_t) t->n_merges);
	int			k;

	t->mhash = g4_malloc(sizeof(g4_tok_merge) * size);
	if (!t->mhash)
		return g4_fail(err, G4_ERR_NOMEM, "out of memory indexing %d merges", t->n_merges);
	for (k = 0; k < (int) size; k++)
		t->mhash[k].key = UINT64_MAX;
	t->mhash_mask = size - 1;
	for (k = 0; k < t->n_merges; k++)
	{
		const g4_tok_merge *m = &t->merge_list[k];
		uint32_t	i = (uint32_t) hash_u64(m->key) & t->mhash_mask;

		/* a pair listed twice keeps its last rank, like a map built from
		 * the list in order */
		while (t->mhash[i].key != UINT64_MAX && t->mhash[i].key != m->key)
			i = (i + 1) & t->mhash_mask;
		t->mhash[i] = *m;
	}
	free(t->merge_list);
	t->merge_list = NULL;
	t->cap_merges = 0;
	return G4_OK;
}

static int
trie_add(g4_tok_trie *tr, const unsigned char *s, size_t len, int added, g4_err *err)
{
	int32_t		node = -1;
	size_t		i;

	for (i = 0; i < len; i++)
	{
		int32_t    *link = node < 0 ? &tr->root[s[i]] : &tr->nodes[node].first_child;
		int32_t		c = *link;

		if (node >= 0)
		{
			while (c >= 0 && tr->nodes[c].byte != s[i])
				c = tr->nodes[c].next_sibling;
		}
		if (c < 0)
		{
			if (tr->n_nodes == tr->cap_nodes)
			{
				int			cap = tr->cap_nodes ? tr->cap_nodes * 2 : 1024;
				g4_tok_trie_node *nn = g4_realloc(tr->nodes, sizeof(*nn) * (size_t) cap);

				if (!nn)
					return g4_fail(err, G4_ERR_NOMEM, "out of memory building the added-token trie");
				tr->nodes = nn;
				tr->cap_nodes = cap;
				/* the realloc may have moved the link we hold */
				link = node < 0 ? &tr->root[s[i]] : &tr->nodes[node].first_child;
			}
			c = tr->n_nodes++;
			tr->nodes[c].byte = s[i];
			tr->nodes[c].first_child = -1;
			tr->nodes[c].added = -1;
			if (node < 0)
			{
				tr->nodes[c].next_sibling = -1;
				*link = c;
			}
			else
			{
				tr->nodes[c].next_sibling = *link;
				*link = c;
			}
		}
		node = c;
	}
	if (node >= 0)
		tr->nodes[node].added = added;
	return G4_OK;
}

/* Apply the normalizer to s into out (reset first). */
static int normalize(const g4_tokenizer *t, const char *s, size_t n, g4_buf *out,
					 g4_buf *tmp, g4_err *err);

int
g4_tokb_finish(g4_tokenizer *t, g4_err *err)
{
	int			rc,
				id,
				k;
	g4_buf		nb = {0},
				tmp = {0};

	if ((rc = g4_tokb_index_vocab(t, err)) != G4_OK)
		return rc;
	if ((rc = build_merges(t, err)) != G4_OK)
		return rc;
	for (k = 0; k < 128; k++)
	{
		char		c = (char) k;

		t->ascii_id[k] = g4_tokb_lookup(t, &c, 1);
	}
	for (k = 0; k < 256; k++)
	{
		char		name[8];

		snprintf(name, sizeof(name), "<0x%02X>", k);
		t->byte_id[k] = g4_tokb_lookup(t, name, 6);
	}

	/*
	 * Which ids decode as a raw byte: the decoder's byte-fallback step
	 * recognises any token text of the form <0xHH> (either case), after the
	 * decoder's own Replace steps — which never touch such text in practice,
	 * so the check is made on the stored piece.
	 */
	for (id = 0; id < t->n_vocab; id++)
	{
		const char *p;
		int			hi,
					lo;

		if (t->piece_off[id] == NO_PIECE || t->piece_len[id] != 6)
			continue;
		p = t->arena + t->piece_off[id];
		if (p[0] != '<' || p[1] != '0' || p[2] != 'x' || p[5] != '>')
			continue;
		hi = (p[3] >= '0' && p[3] <= '9') ? p[3] - '0' :
			(p[3] >= 'a' && p[3] <= 'f') ? p[3] - 'a' + 10 :
			(p[3] >= 'A' && p[3] <= 'F') ? p[3] - 'A' + 10 : -1;
		lo = (p[4] >= '0' && p[4] <= '9') ? p[4] - '0' :
			(p[4] >= 'a' && p[4] <= 'f') ? p[4] - 'a' + 10 :
			(p[4] >= 'A' && p[4] <= 'F') ? p[4] - 'A' + 10 : -1;
		/* Rust's from_str_radix also takes "+H" as a one-digit number */
		if (p[3] == '+' && lo >= 0)
			hi = 0;
		if (hi >= 0 && lo >= 0)
			t->byte_of[id] = (int16_t) (hi * 16 + lo);
	}

	/* added-token tries; normalized tokens are matched in normalised form */
	for (k = 0; k < t->n_added; k++)
	{
		const g4_tok_added *a = &t->added[k];
		const char *s = t->arena + a->off;

		if (a->len == 0)
			continue;
		if (!a->normalized)
			rc = trie_add(&t->raw_trie, (const unsigned char *) s, a->len, k, err);
		else
		{
			rc = normalize(t, s, a->len, &nb, &tmp, err);
			if (rc == G4_OK && nb.len > 0)
				rc = trie_add(&t->norm_trie, (const unsigned char *) nb.data, nb.len, k, err);
		}
		if (rc != G4_OK)
		{
			g4_buf_free(&nb);
			g4_buf_free(&tmp);
			return rc;
		}
	}
	g4_buf_free(&nb);
	g4_buf_free(&tmp);
	return G4_OK;
}

void
g4_tok_free(g4_tokenizer *t)
{
	int			i;

	if (!t)
		return;
	free(t->arena);
	free(t->piece_off);
	free(t->piece_len);
	free(t->in_model);
	free(t->special);
	free(t->byte_of);
	free(t->vhash);
	free(t->mhash);
	free(t->merge_list);
	free(t->added);
	free(t->added_of_id);
	free(t->raw_trie.nodes);
	free(t->norm_trie.nodes);
	for (i = 0; i < t->n_norm; i++)
	{
		free(t->norm[i].from);
		free(t->norm[i].to);
	}
	free(t->norm);
	for (i = 0; i < t->n_dec; i++)
	{
		free(t->dec[i].from);
		free(t->dec[i].to);
	}
	free(t->dec);
	free(t->split_pattern);
	free(t);
}

/* ---- accessors -------------------------------------------------------- */

int
g4_tok_vocab_size(const g4_tokenizer *t)
{
	return t->n_vocab;
}

int
g4_tok_bos(const g4_tokenizer *t)
{
	return t->bos_id;
}

int
g4_tok_eos(const g4_tokenizer *t)
{
	return t->eos_id;
}

int
g4_tok_pad(const g4_tokenizer *t)
{
	return t->pad_id;
}

int
g4_tok_add_bos(const g4_tokenizer *t)
{
	return t->add_bos;
}

int
g4_tok_id(const g4_tokenizer *t, const char *token)
{
	size_t		len = strlen(token);
	int			k;

	/* added tokens first, then the model vocabulary (as token_to_id) */
	for (k = t->n_added; k-- > 0;)
	{
		const g4_tok_added *a = &t->added[k];

		if (a->len == len && memcmp(t->arena + a->off, token, len) == 0)
			return a->id;
	}
	return g4_tokb_lookup(t, token, len);
}

const char *
g4_tok_piece(const g4_tokenizer *t, int id, size_t *len)
{
	if (id < 0 || id >= t->n_vocab || t->piece_off[id] == NO_PIECE)
	{
		if (len)
			*len = 0;
		return NULL;
	}
	if (len)
		*len = t->piece_len[id];
	return t->arena + t->piece_off[id];
}

int
g4_tok_is_special(const g4_tokenizer *t, int id)
{
	return id >= 0 && id < t->n_vocab && t->special[id];
}

/* ---- encoding --------------------------------------------------------- */

typedef struct
{
	int32_t		id;
	int32_t		prev;
	int32_t		next;
} bpe_symbol;

typedef struct
{
	int32_t		rank;
	int32_t		pos;
	int32_t		id;
} bpe_cand;

/* Per-call scratch space. */
typedef struct
{
	const g4_tokenizer *t;
	int32_t   **ids;
	int		   *n;
	int		   *cap;
	g4_err	   *err;
	bpe_symbol *sym;
	size_t		sym_cap;
	bpe_cand   *heap;
	size_t		heap_cap;
	size_t		heap_len;
	g4_buf		norm;
	g4_buf		tmp;
	/* spans of the text where special tokens are plain text */
	const char *text;
	const g4_tok_span *plain;
	int			n_plain;
	int			stretch_plain;	/* the stage 1 stretch touches a plain span */
	const g4_cancel_flag *cancel;	/* polled once per word */
} enc_ctx;

static int
emit(enc_ctx *c, int32_t id)
{
	if (*c->n == *c->cap)
	{
		int			cap = *c->cap ? *c->cap * 2 : 64;
		int32_t    *p = g4_realloc(*c->ids, sizeof(int32_t) * (size_t) cap);

		if (!p)
			return g4_fail(c->err, G4_ERR_NOMEM, "out of memory growing a token list to %d ids", cap);
		*c->ids = p;
		*c->cap = cap;
	}
	(*c->ids)[(*c->n)++] = id;
	return G4_OK;
}

static int
cand_less(const bpe_cand *a, const bpe_cand *b)
{
	return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static void
heap_push(enc_ctx *c, int32_t rank, int32_t pos, int32_t id)
{
	bpe_cand   *h = c->heap;
	size_t		i = c->heap_len++;

	h[i].rank = rank;
	h[i].pos = pos;
	h[i].id = id;
	while (i > 0)
	{
		size_t		p = (i - 1) / 2;
		bpe_cand	tmp;

		if (!cand_less(&h[i], &h[p]))
			break;
		tmp = h[i];
		h[i] = h[p];
		h[p] = tmp;
		i = p;
	}
}

static bpe_cand
heap_pop(enc_ctx *c)
{
	bpe_cand   *h = c->heap;
	bpe_cand	top = h[0];
	size_t		n = --c->heap_len;
	size_t		i = 0;

	if (n == 0)
		return top;
	h[0] = h[n];
	for (;;)
	{
		size_t		l = 2 * i + 1,
					r = l + 1,
					m = i;
		bpe_cand	tmp;

		if (l < n && cand_less(&h[l], &h[m]))
			m = l;
		if (r < n && cand_less(&h[r], &h[m]))
			m = r;
		if (m == i)
			break;
		tmp = h[i];
		h[i] = h[m];
		h[m] = tmp;
		i = m;
	}
	return top;
}

static int
push_symbol(enc_ctx *c, size_t *ns, int32_t id)
{
	if (*ns == c->sym_cap)
	{
		size_t		cap = c->sym_cap ? c->sym_cap * 2 : 256;
		bpe_symbol *p = g4_realloc(c->sym, sizeof(*p) * cap);

		if (!p)
			return g4_fail(c->err, G4_ERR_NOMEM, "out of memory tokenizing (%zu symbols)", cap);
		c->sym = p;
		c->sym_cap = cap;
	}
	c->sym[*ns].id = id;
	c->sym[*ns].prev = (int32_t) *ns - 1;
	c->sym[*ns].next = (int32_t) *ns + 1;
	(*ns)++;
	return G4_OK;
}

/* BPE-encode one word (already normalised and pre-tokenised). */
static int
bpe_word(enc_ctx *c, const char *word, size_t n)
{
	const g4_tokenizer *t = c->t;
	const unsigned char *s = (const unsigned char *) word;
	size_t		ns = 0,
				i,
				k;
	int32_t		unk_pending = -1;
	int			rc;

	if (n == 0)
		return G4_OK;
	if (t->ignore_merges)
	{
		int			id = g4_tokb_lookup(t, word, n);

		if (id >= 0)
			return emit(c, id);
	}

	/* characters to symbols */
	for (i = 0; i < n;)
	{
		size_t		len = utf8_len(s + i, n - i);
		int32_t		id = (len == 1 && s[i] < 0x80) ? t->ascii_id[s[i]] :
		g4_tokb_lookup(t, word + i, len);

		if (id >= 0)
		{
			if (unk_pending >= 0)
			{
				if ((rc = push_symbol(c, &ns, unk_pending)) != G4_OK)
					return rc;
				unk_pending = -1;
			}
			if ((rc = push_symbol(c, &ns, id)) != G4_OK)
				return rc;
		}
		else
		{
			int			all_bytes = t->byte_fallback;

			for (k = 0; all_bytes && k < len; k++)
				if (t->byte_id[s[i + k]] < 0)
					all_bytes = 0;
			if (all_bytes)
			{
				/* a pending unknown stays pending across byte pieces, as in
				 * the reference implementation */
				for (k = 0; k < len; k++)
					if ((rc = push_symbol(c, &ns, t->byte_id[s[i + k]])) != G4_OK)
						return rc;
			}
			else if (t->unk_id >= 0)
			{
				if (unk_pending >= 0 && !t->fuse_unk)
				{
					if ((rc = push_symbol(c, &ns, unk_pending)) != G4_OK)
						return rc;
				}
				unk_pending = t->unk_id;
			}
			/* with neither byte pieces nor <unk> the character is dropped */
		}
		i += len;
	}
	if (unk_pending >= 0 && (rc = push_symbol(c, &ns, unk_pending)) != G4_OK)
		return rc;
	if (ns == 0)
		return G4_OK;
	c->sym[ns - 1].next = -1;

	/* candidate pairs */
	if (c->heap_cap < 3 * ns)
	{
		bpe_cand   *h = g4_realloc(c->heap, sizeof(*h) * 3 * ns);

		if (!h)
			return g4_fail(c->err, G4_ERR_NOMEM, "out of memory tokenizing (%zu symbols)", ns);
		c->heap = h;
		c->heap_cap = 3 * ns;
	}
	c->heap_len = 0;
	for (k = 0; k + 1 < ns; k++)
	{
		const g4_tok_merge *m = merge_find(t, c->sym[k].id, c->sym[k + 1].id);

		if (m)
			heap_push(c, m->rank, (int32_t) k, m->id);
	}

	/* lowest rank first, leftmost among equal ranks */
	while (c->heap_len > 0)
	{
		bpe_cand	top = heap_pop(c);
		bpe_symbol *cur = &c->sym[top.pos];
		int32_t		nx,
					nn;
		const g4_tok_merge *m;

		if (cur->id == DEAD_SYMBOL || cur->next < 0)
			continue;
		nx = cur->next;
		/* stale candidate: the pair at this position has changed */
		m = merge_find(t, cur->id, c->sym[nx].id);
		if (!m || m->id != top.id)
			continue;
		cur->id = top.id;
		nn = c->sym[nx].next;
		cur->next = nn;
		c->sym[nx].id = DEAD_SYMBOL;
		if (nn >= 0)
			c->sym[nn].prev = top.pos;
		if (cur->prev >= 0)
		{
			m = merge_find(t, c->sym[cur->prev].id, cur->id);
			if (m)
				heap_push(c, m->rank, cur->prev, m->id);
		}
		if (nn >= 0)
		{
			m = merge_find(t, cur->id, c->sym[nn].id);
			if (m)
				heap_push(c, m->rank, top.pos, m->id);
		}
	}

	for (k = 0; k < ns; k = (size_t) c->sym[k].next)
	{
		if ((rc = emit(c, c->sym[k].id)) != G4_OK)
			return rc;
		if (c->sym[k].next < 0)
			break;
	}
	return G4_OK;
}

/* BPE one word, unless the caller cancelled the encoding. */
static int
bpe_word_or_cancel(enc_ctx *c, const char *word, size_t n)
{
	if (c->cancel && *c->cancel)
		return g4_fail(c->err, G4_ERR_CANCELLED, "tokenisation cancelled");
	return bpe_word(c, word, n);
}

/* Pre-tokenise a normalised stretch and BPE each word. */
static int
pretokenize_and_bpe(enc_ctx *c, const char *s, size_t n)
{
	const g4_tokenizer *t = c->t;
	const char *pat = t->split_pattern;
	size_t		pl = t->split_pattern_len;
	size_t		i = 0,
				start = 0;
	int			rc;

	if (n == 0)
		return G4_OK;
	if (t->split_behavior == G4_SPLIT_NONE || pl == 0)
		return bpe_word_or_cancel(c, s, n);

	/*
	 * Split on every occurrence of the literal pattern.  Pieces are emitted
	 * as they become final; "start" is where the pending piece begins.
	 */
	while (i + pl <= n)
	{
		size_t		me;

		if (memcmp(s + i, pat, pl) != 0)
		{
			i++;
			continue;
		}
		me = i + pl;
		switch (t->split_behavior)
		{
			case G4_SPLIT_REMOVED:
				if ((rc = bpe_word_or_cancel(c, s + start, i - start)) != G4_OK)
					return rc;
				start = me;
				break;
			case G4_SPLIT_ISOLATED:
				if ((rc = bpe_word_or_cancel(c, s + start, i - start)) != G4_OK ||
					(rc = bpe_word_or_cancel(c, s + i, pl)) != G4_OK)
					return rc;
				start = me;
				break;
			case G4_SPLIT_MERGED_PREV:
				if ((rc = bpe_word_or_cancel(c, s + start, me - start)) != G4_OK)
					return rc;
				start = me;
				break;
			case G4_SPLIT_MERGED_NEXT:
				if ((rc = bpe_word_or_cancel(c, s + start, i - start)) != G4_OK)
					return rc;
				start = i;
				break;
			case G4_SPLIT_CONTIGUOUS:
				{
					size_t		e = me;

					while (e + pl <= n && memcmp(s + e, pat, pl) == 0)
						e += pl;
					if ((rc = bpe_word_or_cancel(c, s + start, i - start)) != G4_OK ||
						(rc = bpe_word_or_cancel(c, s + i, e - i)) != G4_OK)
						return rc;
					me = e;
					start = e;
				}
				break;
		}
		i = me;
	}
	return bpe_word_or_cancel(c, s + start, n - start);
}

static int
normalize(const g4_tokenizer *t, const char *s, size_t n, g4_buf *out, g4_buf *tmp,
		  g4_err *err)
{
	int			k;

	out->len = 0;
	if (g4_buf_append(out, s, n) != 0)
		return g4_fail(err, G4_ERR_NOMEM, "out of memory normalising %zu bytes", n);
	for (k = 0; k < t->n_norm; k++)
	{
		const g4_tok_replace *r = &t->norm[k];
		size_t		i;
		g4_buf		swap;

		tmp->len = 0;
		if (r->from_len == 0)
		{
			/* Prepend: only to a non-empty string */
			if (out->len == 0)
				continue;
			if (g4_buf_append(tmp, r->to, r->to_len) != 0 ||
				g4_buf_append(tmp, out->data, out->len) != 0)
				return g4_fail(err, G4_ERR_NOMEM, "out of memory normalising %zu bytes", n);
		}
		else
		{
			for (i = 0; i < out->len;)
			{
				if (i + r->from_len <= out->len &&
					memcmp(out->data + i, r->from, r->from_len) == 0)
				{
					if (g4_buf_append(tmp, r->to, r->to_len) != 0)
						return g4_fail(err, G4_ERR_NOMEM, "out of memory normalising %zu bytes", n);
					i += r->from_len;
				}
				else
				{
					size_t		j = i + 1;

					/* copy up to the next possible match start */
					while (j < out->len && out->data[j] != r->from[0])
						j++;
					if (g4_buf_append(tmp, out->data + i, j - i) != 0)
						return g4_fail(err, G4_ERR_NOMEM, "out of memory normalising %zu bytes", n);
					i = j;
				}
			}
		}
		swap = *out;
		*out = *tmp;
		*tmp = swap;
	}
	return G4_OK;
}

/* Longest added token starting at s[i], or 0. */
static size_t
trie_match(const g4_tok_trie *tr, const unsigned char *s, size_t n, size_t i, int *added)
{
	int32_t		node = tr->root[s[i]];
	size_t		j = i,
				best = 0;

	while (node >= 0)
	{
		j++;
		if (tr->nodes[node].added >= 0)
		{
			best = j - i;
			*added = tr->nodes[node].added;
		}
		if (j >= n)
			break;
		node = tr->nodes[node].first_child;
		while (node >= 0 && tr->nodes[node].byte != s[j])
			node = tr->nodes[node].next_sibling;
	}
	return best;
}

/* The character before position i is a word character. */
static int
word_before(const unsigned char *s, size_t i)
{
	size_t		j;

	if (i == 0)
		return 0;
	j = utf8_prev(s, i);
	return is_word_cp(utf8_decode(s + j, i - j));
}

static int
word_after(const unsigned char *s, size_t n, size_t i)
{
	size_t		len;

	if (i >= n)
		return 0;
	len = utf8_len(s + i, n - i);
	return is_word_cp(utf8_decode(s + i, len));
}

static int encode_stretch(enc_ctx *c, const char *s, size_t n, int normalized_stage);

/* The first plain span ending after text offset pos (spans are sorted and
 * disjoint: a binary search, as a chat of many messages has many), or
 * n_plain. */
static int
first_plain_after(const enc_ctx *c, size_t pos)
{
	int			lo = 0,
				hi = c->n_plain;

	while (lo < hi)
	{
		int			mid = lo + (hi - lo) / 2;

		if (c->plain[mid].off + c->plain[mid].len <= pos)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

/* The plain span containing text offset pos, or NULL. */
static const g4_tok_span *
plain_span_at(const enc_ctx *c, size_t pos)
{
	int			i = first_plain_after(c, pos);

	return i < c->n_plain && c->plain[i].off <= pos ? &c->plain[i] : NULL;
}

/* Does [off, off + n) of the text overlap a plain span? */
static int
touches_plain(const enc_ctx *c, size_t off, size_t n)
{
	int			i = first_plain_after(c, off);

	return i < c->n_plain && c->plain[i].off < off + n;
}

/*
 * May a special token found at str[start..stop) be a control token?  When
 * not, *resume is where the search goes on.  Stage 0 works on the text
 * itself (offsets known); stage 2 on normalised text, where a stretch that
 * touches a plain span has all its special tokens as text.
 */
static int
special_allowed(const enc_ctx *c, const char *str, size_t start, size_t stop, int stage,
				size_t *resume)
{
	size_t		off;
	const g4_tok_span *sp;

	*resume = stop;
	if (c->n_plain == 0)
		return 1;
	if (stage != 0)
		return !c->stretch_plain;
	off = (size_t) (str - c->text);
	if (!touches_plain(c, off + start, stop - start))
		return 1;
	sp = plain_span_at(c, off + start);
	if (sp == NULL)
		*resume = start + 1;	/* begins before the data, runs into it */
	else if (sp->off + sp->len < off + stop)
		*resume = sp->off + sp->len - off;	/* runs past the data's end */
	return 0;
}

/*
 * Find the added tokens of one trie in s; encode the gaps with the next
 * stage.  This follows the reference's find_matches step for step:
 * matching is leftmost-longest and non-overlapping in the text itself; a
 * single_word token that touches a word character is skipped (the search
 * goes on after it); an lstrip token takes the white space before it back
 * to the end of the previous token, an rstrip token the white space after
 * it.  The search resumes at the end of the match proper, so a token found
 * inside white space an rstrip token swallowed is still emitted, and the
 * text after it is encoded from its end — exactly as the reference does.
 */
static int
split_added(enc_ctx *c, const g4_tok_trie *tr, const char *str, size_t n, int stage)
{
	const g4_tokenizer *t = c->t;
	const unsigned char *s = (const unsigned char *) str;
	size_t		i = 0,
				done = 0;
	int			rc;

	while (i < n)
	{
		int			k = -1;
		size_t		len,
					start,
					stop;
		const g4_tok_added *a;

		if (tr->root[s[i]] < 0 || (len = trie_match(tr, s, n, i, &k)) == 0)
		{
			i++;
			continue;
		}
		a = &t->added[k];
		start = i;
		stop = i + len;
		i = stop;
		if (a->special && !special_allowed(c, str, start, stop, stage, &i))
			continue;
		if (a->single_word && (word_before(s, start) || word_after(s, n, stop)))
			continue;
		if (a->lstrip)
		{
			size_t		ns = start;

			while (ns > 0)
			{
				size_t		p = utf8_prev(s, ns);

				if (!is_space_cp(utf8_decode(s + p, ns - p)))
					break;
				ns = p;
			}
			start = G4_MAX(ns, done);
		}
		if (a->rstrip)
		{
			while (stop < n)
			{
				size_t		l = utf8_len(s + stop, n - stop);

				if (!is_space_cp(utf8_decode(s + stop, l)))
					break;
				stop += l;
			}
		}
		if (done < start && (rc = encode_stretch(c, str + done, start - done, stage + 1)) != G4_OK)
			return rc;
		if ((rc = emit(c, a->id)) != G4_OK)
			return rc;
		done = stop;
	}
	if (done < n)
		return encode_stretch(c, str + done, n - done, stage + 1);
	return G4_OK;
}

/*
 * Stage 1: a raw stretch without raw added tokens: normalise it, then look
 * for normalised added tokens (stage 2 gaps go to the pre-tokenizer).
 */
static int
encode_stretch(enc_ctx *c, const char *s, size_t n, int stage)
{
	const g4_tokenizer *t = c->t;
	int			rc;

	if (stage == 1)
	{
		g4_buf		own;

		c->stretch_plain = c->n_plain > 0 && touches_plain(c, (size_t) (s - c->text), n);

		if ((rc = normalize(t, s, n, &c->norm, &c->tmp, c->err)) != G4_OK)
			return rc;
		if (t->norm_trie.n_nodes == 0)
			return pretokenize_and_bpe(c, c->norm.data, c->norm.len);
		/* the normalised text must outlive the nested calls, which reuse
		 * c->norm; take it over */
		own = c->norm;
		memset(&c->norm, 0, sizeof(c->norm));
		rc = split_added(c, &t->norm_trie, own.data ? own.data : "", own.len, 2);
		g4_buf_free(&own);
		return rc;
	}
	return pretokenize_and_bpe(c, s, n);
}

int
g4_tok_encode(const g4_tokenizer *t, const char *text, size_t len, int add_bos,
			  int32_t **ids, int *n, int *cap, g4_err *err)
{
	return g4_tok_encode_plain(t, text, len, add_bos, NULL, 0, NULL, ids, n, cap, err);
}

int
g4_tok_encode_plain(const g4_tokenizer *t, const char *text, size_t len, int add_bos,
					const g4_tok_span *plain, int n_plain, const g4_cancel_flag *cancel,
					int32_t **ids, int *n, int *cap, g4_err *err)
{
	enc_ctx		c;
	int			rc = G4_OK;

	memset(&c, 0, sizeof(c));
	c.cancel = cancel;
	c.text = text;
	c.plain = plain;
	c.n_plain = n_plain;
	c.t = t;
	c.ids = ids;
	c.n = n;
	c.cap = cap;
	c.err = err;
	if (add_bos)
	{
		if (t->bos_id < 0)
			return g4_fail(err, G4_ERR_INVALID, "the tokenizer has no BOS token to add");
		if ((rc = emit(&c, t->bos_id)) != G4_OK)
			return rc;
	}
	if (len > 0)
	{
		if (!text)
			return g4_fail(err, G4_ERR_INVALID, "NULL text with length %zu", len);
		if (t->raw_trie.n_nodes > 0)
			rc = split_added(&c, &t->raw_trie, text, len, 0);
		else
			rc = encode_stretch(&c, text, len, 1);
	}
	free(c.sym);
	free(c.heap);
	g4_buf_free(&c.norm);
	g4_buf_free(&c.tmp);
	return rc;
}

/* ---- decoding --------------------------------------------------------- */

static const char REPLACEMENT[] = "\xEF\xBF\xBD";

/* Append one token's text after the decoder's Replace steps. */
static int
append_piece(const g4_tokenizer *t, int id, g4_buf *out, g4_buf *t1, g4_buf *t2)
{
	const char *p = t->arena + t->piece_off[id];
	size_t		len = t->piece_len[id];
	int			k;

	if (t->n_dec == 0)
		return g4_buf_append(out, p, len);
	for (k = 0; k < t->n_dec; k++)
	{
		const g4_tok_replace *r = &t->dec[k];
		g4_buf	   *dst = (k == t->n_dec - 1) ? out : (k % 2 == 0 ? t1 : t2);
		size_t		i = 0;

		if (dst != out)
			dst->len = 0;
		while (i < len)
		{
			if (r->from_len > 0 && i + r->from_len <= len &&
				memcmp(p + i, r->from, r->from_len) == 0)
			{
				if (g4_buf_append(dst, r->to, r->to_len) != 0)
					return -1;
				i += r->from_len;
			}
			else
			{
				size_t		j = i + 1;

				while (j < len && (r->from_len == 0 || p[j] != r->from[0]))
					j++;
				if (g4_buf_append(dst, p + i, j - i) != 0)
					return -1;
				i = j;
			}
		}
		p = dst->data;
		len = dst->len;
	}
	return 0;
}

/* Emit text through the leading Strip step (strip_left chars remain). */
static int
emit_text(const g4_tokenizer *t, int *strip_left, const char *s, size_t n, g4_buf *out)
{
	if (*strip_left > 0 && n > 0)
	{
		char		enc[4];
		size_t		el = utf8_encode(t->dec_strip_char, enc);

		while (*strip_left > 0 && n >= el && memcmp(s, enc, el) == 0)
		{
			s += el;
			n -= el;
			(*strip_left)--;
		}
		if (n > 0)
			*strip_left = 0;
	}
	if (n == 0)
		return 0;
	return g4_buf_append(out, s, n);
}

static int
emit_replacements(const g4_tokenizer *t, int *strip_left, int count, g4_buf *out)
{
	int			k;

	for (k = 0; k < count; k++)
		if (emit_text(t, strip_left, REPLACEMENT, 3, out) != 0)
			return -1;
	return 0;
}

static int
token_visible(const g4_tokenizer *t, int32_t id, int skip_special)
{
	if (id < 0 || id >= t->n_vocab || t->piece_off[id] == NO_PIECE)
		return 0;				/* unknown ids are dropped, as by the reference */
	return !(skip_special && t->special[id]);
}

int
g4_tok_decode(const g4_tokenizer *t, const int32_t *ids, int n, int skip_special,
			  char **text, size_t *len, g4_err *err)
{
	g4_detok	d;
	g4_buf		out = {0};
	int			i;

	g4_detok_init(&d, t, skip_special);
	for (i = 0; i < n; i++)
		if (g4_detok_push(&d, ids[i], &out) != G4_OK)
			goto nomem;
	if (g4_detok_finish(&d, &out) != G4_OK)
		goto nomem;
	if (g4_buf_append(&out, "", 1) != 0)
		goto nomem;
	*text = out.data ? out.data : g4_strdup("");
	if (!*text)
		goto nomem;
	if (len)
		*len = out.len ? out.len - 1 : 0;
	return G4_OK;

nomem:
	g4_detok_free(&d);
	g4_buf_free(&out);
	return g4_fail(err, G4_ERR_NOMEM, "out of memory decoding %d tokens", n);
}

void
g4_detok_init(g4_detok *d, const g4_tokenizer *t, int skip_special)
{
	memset(d, 0, sizeof(*d));
	d->tok = t;
	d->skip_special = skip_special;
	d->strip_left = t->dec_strip_start;
}

static unsigned char *
run_bytes(g4_detok *d)
{
	return d->spill ? d->spill : d->pending;
}

/* End of a byte run: its bytes if the whole run is valid UTF-8, else one
 * U+FFFD per byte (those of an invalid run are already out). */
static int
flush_run(g4_detok *d, g4_buf *out)
{
	const g4_tokenizer *t = d->tok;
	int			rc = 0;

	if (d->run_state == 0 && d->n_pending > 0)
		rc = emit_text(t, &d->strip_left, (const char *) run_bytes(d), (size_t) d->n_pending, out);
	else if (d->run_state > 0)
		rc = emit_replacements(t, &d->strip_left, d->n_pending, out);
	d->n_pending = 0;
	d->run_state = 0;
	return rc;
}

int
g4_detok_push(g4_detok *d, int32_t id, g4_buf *out)
{
	const g4_tokenizer *t = d->tok;
	g4_buf		t1 = {0},
				t2 = {0},
				piece = {0};
	int			rc;

	d->n_pushed++;
	if (!token_visible(t, id, d->skip_special))
		return G4_OK;
	if (t->dec_byte_fallback && t->byte_of[id] >= 0)
	{
		unsigned char b = (unsigned char) t->byte_of[id];
		int			st = utf8_step(d->run_state, b);

		if (d->run_state < 0)
			return emit_replacements(t, &d->strip_left, 1, out) ? G4_ERR_NOMEM : G4_OK;
		if (st < 0)
		{
			/* the run can no longer be valid: every byte becomes U+FFFD */
			rc = emit_replacements(t, &d->strip_left, d->n_pending + 1, out);
			d->n_pending = 0;
			d->run_state = -1;
			return rc ? G4_ERR_NOMEM : G4_OK;
		}
		if (d->n_pending < (int) sizeof(d->pending) && !d->spill)
			d->pending[d->n_pending] = b;
		else
		{
			if (!d->spill || (size_t) d->n_pending >= d->spill_cap)
			{
				size_t		cap = d->spill_cap ? d->spill_cap * 2 : 64;
				unsigned char *p = realloc(d->spill, cap);

				if (!p)
					return G4_ERR_NOMEM;
				if (!d->spill)
					memcpy(p, d->pending, (size_t) d->n_pending);
				d->spill = p;
				d->spill_cap = cap;
			}
			d->spill[d->n_pending] = b;
		}
		d->n_pending++;
		d->run_state = st;
		return G4_OK;
	}
	if (flush_run(d, out) != 0)
		return G4_ERR_NOMEM;
	if (d->spill)
	{
		free(d->spill);
		d->spill = NULL;
		d->spill_cap = 0;
	}
	if (d->strip_left == 0 && t->n_dec <= 1)
		rc = append_piece(t, id, out, &t1, &t2);
	else
	{
		rc = append_piece(t, id, &piece, &t1, &t2);
		if (rc == 0)
			rc = emit_text(t, &d->strip_left, piece.data ? piece.data : "", piece.len, out);
	}
	g4_buf_free(&t1);
	g4_buf_free(&t2);
	g4_buf_free(&piece);
	return rc ? G4_ERR_NOMEM : G4_OK;
}

int
g4_detok_finish(g4_detok *d, g4_buf *out)
{
	int			rc = flush_run(d, out);

	g4_detok_free(d);
	return rc ? G4_ERR_NOMEM : G4_OK;
}

void
g4_detok_free(g4_detok *d)
{
	free(d->spill);
	d->spill = NULL;
	d->spill_cap = 0;
	d->n_pending = 0;
	d->run_state = 0;
}
