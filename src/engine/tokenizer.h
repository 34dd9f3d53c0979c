/*
 * tokenizer.h — Gemma tokenizers: BPE with merges and byte fallback, loaded
 * from a Hugging Face tokenizer.json or from a GGUF vocabulary, producing
 * exactly the ids of the Hugging Face `tokenizers` library.
 *
 * Encoding: added tokens (special or not) are matched verbatim first, longest
 * match wins, and are never split; the text between them is normalised
 * (' ' -> U+2581) and BPE-merged as one piece; characters missing from the
 * vocabulary become <0xNN> byte tokens.
 *
 * Decoding follows the tokenizer.json decoder (U+2581 -> ' ', byte-fallback
 * tokens reassembled into UTF-8, invalid sequences -> U+FFFD).  The streaming
 * decoder never emits half a UTF-8 character.
 */
#ifndef G4_TOKENIZER_H
#define G4_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "engine.h"
#include "util.h"

typedef struct g4_tokenizer g4_tokenizer;
struct g4_gguf;

/* tokenizer.json (required) and tokenizer_config.json (optional: bos/eos
 * names, add_bos_token). */
int			g4_tok_load_json(const char *tokenizer_json, const char *tokenizer_config,
							 g4_tokenizer **out, g4_err *err);

/* From a GGUF file's tokenizer.ggml.* metadata ("llama" SentencePiece
 * vocabularies with scores, or "gpt2"-style with merges). */
int			g4_tok_load_gguf(const struct g4_gguf *g, g4_tokenizer **out, g4_err *err);

void		g4_tok_free(g4_tokenizer *t);

int			g4_tok_vocab_size(const g4_tokenizer *t);
int			g4_tok_bos(const g4_tokenizer *t);	/* -1 if none */
int			g4_tok_eos(const g4_tokenizer *t);
int			g4_tok_pad(const g4_tokenizer *t);
int			g4_tok_add_bos(const g4_tokenizer *t);	/* the tokenizer's own default */

/* Id of an exact token string (vocabulary or added token), or -1. */
int			g4_tok_id(const g4_tokenizer *t, const char *token);

/* The token's string as stored in the vocabulary (U+2581 for spaces,
 * "<0x0A>" for byte tokens). */
const char *g4_tok_piece(const g4_tokenizer *t, int id, size_t *len);

/* True for added tokens marked special (skipped when decoding with
 * skip_special). */
int			g4_tok_is_special(const g4_tokenizer *t, int id);

/* Encode text, appending ids to *ids (realloc'd; *n and *cap updated).
 * add_bos prepends the BOS id. */
int			g4_tok_encode(const g4_tokenizer *t, const char *text, size_t len, int add_bos,
						  int32_t **ids, int *n, int *cap, g4_err *err);

/* A byte range of the text to encode. */
typedef struct
{
	size_t		off;
	size_t		len;
} g4_tok_span;

/* Encode text in which the spans in plain[] (sorted, disjoint) are data:
 * special added tokens are not matched inside them, their text is encoded
 * like any other (non-special added tokens still are, as in the reference
 * with encode_special_tokens).  A special token starting inside a plain span
 * and ending after it is not matched either; the search resumes at the
 * span's end, so a control token the caller put right after the data is
 * still found.  With plain[] covering the whole text this is exactly the
 * reference's encode_special_tokens = True; with n_plain = 0, g4_tok_encode.
 * When cancel is not NULL it is polled; non-zero stops with G4_ERR_CANCELLED. */
int			g4_tok_encode_plain(const g4_tokenizer *t, const char *text, size_t len, int add_bos,
								const g4_tok_span *plain, int n_plain, const g4_cancel_flag *cancel,
								int32_t **ids, int *n, int *cap, g4_err *err);

/* Decode a whole sequence (malloc'd, NUL-terminated). */
int			g4_tok_decode(const g4_tokenizer *t, const int32_t *ids, int n, int skip_special,
						  char **text, size_t *len, g4_err *err);

/* Streaming decoder: push ids one at a time, get complete UTF-8 text.
 *
 * The decoder turns a run of consecutive byte-fallback tokens into its bytes
 * only when the whole run is valid UTF-8, and otherwise into one U+FFFD per
 * byte of the run (as Hugging Face does).  A run is therefore held back until
 * it ends or becomes invalid; short runs live in pending[], longer ones spill
 * to the heap (spill), which g4_detok_finish or g4_detok_free releases. */
typedef struct
{
	const g4_tokenizer *tok;
	int			skip_special;
	unsigned char pending[8];	/* held bytes of the current byte run */
	int			n_pending;		/* bytes in the run (pending[] or spill) */
	int			n_pushed;
	int			run_state;		/* UTF-8 validity of the run: see tokenizer.c */
	int			strip_left;		/* leading characters still to strip */
	unsigned char *spill;		/* the run when longer than pending[] */
	size_t		spill_cap;
} g4_detok;

void		g4_detok_init(g4_detok *d, const g4_tokenizer *t, int skip_special);
/* Append the text completed by this id to out. */
int			g4_detok_push(g4_detok *d, int32_t id, g4_buf *out);
/* End of stream: flush an incomplete character as U+FFFD; releases spill. */
int			g4_detok_finish(g4_detok *d, g4_buf *out);
/* Release a decoder abandoned without g4_detok_finish (no output). */
void		g4_detok_free(g4_detok *d);

#ifdef G4_TOKENIZER_INTERNAL
/*
 * The representation, shared by tokenizer.c (encode/decode) and
 * tokenizer_load.c (the loaders) only.  A loader fills the vocabulary,
 * merges, added tokens and options with the g4_tokb_* calls, then
 * g4_tokb_finish builds the lookup structures.
 */

/* One added token (matched verbatim before normalisation). */
typedef struct
{
	int32_t		id;
	uint8_t		special;
	uint8_t		lstrip;
	uint8_t		rstrip;
	uint8_t		single_word;
	uint8_t		normalized;		/* matched in the normalised text */
	uint32_t	off;			/* content in the arena */
	uint32_t	len;
} g4_tok_added;

/* A text rewrite (normalizer Replace or Prepend, decoder Replace). */
typedef struct
{
	char	   *from;
	size_t		from_len;
	char	   *to;
	size_t		to_len;
} g4_tok_replace;

enum
{
	G4_SPLIT_NONE = 0,
	G4_SPLIT_REMOVED,
	G4_SPLIT_ISOLATED,
	G4_SPLIT_MERGED_PREV,
	G4_SPLIT_MERGED_NEXT,
	G4_SPLIT_CONTIGUOUS
};

typedef struct
{
	uint64_t	key;			/* left id << 32 | right id */
	int32_t		rank;
	int32_t		id;				/* merged piece */
} g4_tok_merge;

typedef struct
{
	int32_t		first_child;
	int32_t		next_sibling;
	int32_t		added;			/* index into added[] when a token ends here */
	uint8_t		byte;
} g4_tok_trie_node;

typedef struct
{
	g4_tok_trie_node *nodes;
	int			n_nodes;
	int			cap_nodes;
	int32_t		root[256];		/* child of the root per first byte */
} g4_tok_trie;

struct g4_tokenizer
{
	int			n_vocab;		/* ids are 0 .. n_vocab-1 */
	/* piece text of every id (NUL-terminated in arena); off = UINT32_MAX: no
	 * piece with this id */
	char	   *arena;
	size_t		arena_len;
	size_t		arena_cap;
	uint32_t   *piece_off;
	uint32_t   *piece_len;
	uint8_t    *in_model;		/* id belongs to the BPE model vocabulary */
	uint8_t    *special;		/* added token marked special */
	int16_t    *byte_of;		/* decoded byte of a <0xNN> piece, or -1 */

	/* model vocabulary: open-addressing table of ids keyed by piece text */
	int32_t    *vhash;
	uint32_t	vhash_mask;
	int32_t		ascii_id[128];	/* single ASCII character pieces */
	int32_t		byte_id[256];	/* <0xNN> pieces */

	/* merges: open-addressing table keyed by (left, right) */
	g4_tok_merge *mhash;
	uint32_t	mhash_mask;
	int			n_merges;
	int			cap_merges;
	g4_tok_merge *merge_list;	/* filled by loaders, hashed at finish */

	g4_tok_added *added;
	int			n_added;
	int			cap_added;
	int32_t    *added_of_id;	/* index into added[] per id, or -1 */
	g4_tok_trie raw_trie;		/* added tokens with normalized = false */
	g4_tok_trie norm_trie;		/* added tokens with normalized = true */

	/* model options */
	int			unk_id;
	int			byte_fallback;
	int			fuse_unk;
	int			ignore_merges;

	/* normalizer steps in order: Replace, or Prepend when from_len == 0 */
	g4_tok_replace *norm;
	int			n_norm;

	/* pre-tokenizer: Split on a literal string */
	int			split_behavior;
	char	   *split_pattern;
	size_t		split_pattern_len;

	/* decoder: Replace steps on each token, byte fallback, leading strip */
	g4_tok_replace *dec;
	int			n_dec;
	int			dec_byte_fallback;
	int			dec_strip_start;	/* characters of dec_strip_char to drop */
	uint32_t	dec_strip_char;

	int			bos_id;
	int			eos_id;
	int			pad_id;
	int			add_bos;
};

g4_tokenizer *g4_tokb_new(int n_vocab, g4_err *err);
/* Set the text of an id (vocabulary piece or added token). */
int			g4_tokb_set_piece(g4_tokenizer *t, int id, const char *s, size_t len,
							  int in_model, g4_err *err);
int			g4_tokb_add_merge(g4_tokenizer *t, int left, int right, int merged,
							  int rank, g4_err *err);
int			g4_tokb_add_added(g4_tokenizer *t, int id, const char *s, size_t len,
							  int special, int lstrip, int rstrip, int single_word,
							  int normalized, g4_err *err);
int			g4_tokb_add_replace(g4_tok_replace **list, int *n, const char *from,
								size_t from_len, const char *to, size_t to_len,
								g4_err *err);
/* Model-vocabulary id of a piece text, or -1 (valid after finish, and
 * during loading after g4_tokb_index_vocab). */
int			g4_tokb_lookup(const g4_tokenizer *t, const char *s, size_t len);
int			g4_tokb_index_vocab(g4_tokenizer *t, g4_err *err);
int			g4_tokb_finish(g4_tokenizer *t, g4_err *err);
#endif

#endif
