/*
 * chat.h — chat prompt formats, implemented in C (the published Jinja
 * templates are not executed) and checked against transformers'
 * apply_chat_template on a golden set of conversations.
 *
 * Gemma 4:  <bos>[<|turn>system\n[<|think|>]SYSTEM<turn|>\n]
 *           (<|turn>user|model\nCONTENT<turn|>\n)*  <|turn>model\n
 *           [<|channel>thought\n<channel|>  when thinking is off]
 * Gemma 3:  <bos>(<start_of_turn>user|model\nCONTENT<end_of_turn>\n)*
 *           <start_of_turn>model\n   (system text prefixed to the first
 *           user turn, followed by a blank line)
 * Image/audio parts render as placeholders and expand to
 * begin + n_soft_tokens × soft token + end.
 */
#ifndef G4_CHAT_H
#define G4_CHAT_H

#include <stdint.h>

#include "engine.h"
#include "tokenizer.h"
#include "util.h"

typedef enum
{
	G4_CHAT_GEMMA4 = 0,
	G4_CHAT_GEMMA3 = 1
} g4_chat_format;

/* Token ids a chat format needs, resolved from the tokenizer by name. */
typedef struct
{
	int			format;			/* g4_chat_format */
	int			bos;
	int			image_begin, image_soft, image_end;	/* -1 if absent */
	int			audio_begin, audio_soft, audio_end;
} g4_chat_ids;

int			g4_chat_init(const g4_tokenizer *tok, int format, g4_chat_ids *ids, g4_err *err);

/* Render messages to token ids (appended to *out, realloc'd).  Without
 * allow_control_tokens, special-token text inside message content is
 * encoded as plain text.  cancel, when not NULL, is polled while encoding. */
/* allow_control_tokens of g4_chat_encode: control tokens only outside
 * message content; everywhere; or outside content and in the media
 * expansions (begin + soft tokens + end) that media placement wrote into it. */
enum
{
	G4_TEXT_DATA = 0,
	G4_TEXT_CONTROL = 1,
	G4_TEXT_DATA_BUT_MEDIA = 2
};

/* Remove from the sorted, disjoint spans every whole media expansion (a
 * begin token's text, one or more soft tokens', an end token's), so those
 * stay control tokens; a begin or end token's text on its own stays data.
 * Linear in the spans' length.  *v is realloc'd; returns 0 or -1 (out of
 * memory). */
int			g4_chat_spans_except_media(const g4_tokenizer *tok, const g4_chat_ids *ids, const char *text,
									   g4_tok_span **v, int *n, int *cap);

int			g4_chat_encode(const g4_tokenizer *tok, const g4_chat_ids *ids,
						   const g4_message *msgs, int n_msgs, int enable_thinking,
						   int add_generation_prompt, int allow_control_tokens,
						   const g4_cancel_flag *cancel,
						   int32_t **out, int *n, int *cap, g4_err *err);

/* Append a media item (kind: g4_media_kind) as the processor expands its
 * placeholder: begin + n x soft token + end, as text.  Returns 0 or -1 (out
 * of memory). */
int			g4_chat_expand_media(const g4_tokenizer *tok, const g4_chat_ids *ids, int kind, int n,
								 g4_buf *out);

#endif
