/*
 * media_prompt.h — placing a request's media in its prompt (media_prompt.c).
 */
#ifndef G4_MEDIA_PROMPT_H
#define G4_MEDIA_PROMPT_H

#include "chat.h"
#include "media.h"

/* A request whose prompt text / messages have every media item in place;
 * it points into the original request and into the strings it owns. */
typedef struct
{
	g4_request	req;
	g4_message *msgs;
	char	  **strings;
	int			n_strings;
} g4_media_prompt;

/* Place the preprocessed items in[0..n_in) (in prompt order) in req's
 * prompt; p->req is then tokenised as usual. */
int			g4_media_place(const g4_tokenizer *tok, const g4_chat_ids *ids, const g4_request *req,
						   const g4_media_input *in, int n_in, g4_media_prompt *p, g4_err *err);
void		g4_media_prompt_free(g4_media_prompt *p);

/* In the tokenised prompt, match each run of soft tokens with the next item
 * of its kind: the positions taking soft-token rows (ascending; each item's
 * first row is set in its row_offset) and, when there is an image, each
 * position's bidirectional block id (-1 outside images). */
int			g4_media_locate(const g4_chat_ids *ids, const int32_t *tok, int n, g4_media_input *in,
							int n_in, int32_t **embed_pos, int *n_embeds, int32_t **mm_block, g4_err *err);

#endif
