/*-------------------------------------------------------------------------
 *
 * tokenize.c
 *	  gemma_tokenize(text) and gemma_detokenize(int[]): the loaded model's
 *	  tokenizer, reached through the same request path as generation.
 *
 * gemma_tokenize adds no BOS token, so gemma_detokenize(gemma_tokenize(t))
 * gives back t.  Both are STRICT: NULL in, NULL out.
 *
 * IDENTIFICATION
 *	  src/pg/tokenize.c
 *
 *-------------------------------------------------------------------------
 */
#include "gemma4.h"

#include "catalog/pg_type.h"
#include "fmgr.h"
#include "lib/stringinfo.h"
#include "mb/pg_wchar.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/memutils.h"

PG_FUNCTION_INFO_V1(gemma_tokenize);
PG_FUNCTION_INFO_V1(gemma_detokenize);

/* A request with one payload item. */
static G4Request *
start_one_item(G4RequestKind kind, int32 tag, const char *data, Size len)
{
	G4WireRequest req;
	char	   *items;

	if (len > MaxAllocSize)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("gemma4 request is too large")));
	memset(&req, 0, sizeof(req));
	req.kind = kind;
	items = palloc(g4p_item_size(len));
	g4p_item_put(items, tag, data, (uint32) len);
	return g4_request_start(&req, items, g4p_item_size(len));
}

Datum
gemma_tokenize(PG_FUNCTION_ARGS)
{
	char	   *str = text_to_cstring(PG_GETARG_TEXT_PP(0));
	char	   *utf8;
	G4Request  *r;
	StringInfoData ids;
	char		kind;
	const char *data;
	Size		len;
	int			n;
	Datum	   *elems;
	int			i;
	int64		limit = g4_prompt_bytes_limit(g4_require_ready());

	utf8 = pg_server_to_any(str, strlen(str), PG_UTF8);
	g4_check_prompt_bytes((int64) strlen(utf8), limit, "the text to tokenize");
	r = start_one_item(G4_KIND_TOKENIZE, G4_ITEM_PROMPT, utf8, strlen(utf8));
	initStringInfo(&ids);
	while (g4_request_next(r, &kind, &data, &len))
		if (kind == G4_MQ_IDS)
			appendBinaryStringInfo(&ids, data, (int) len);
	g4_request_finish(r);

	n = ids.len / (int) sizeof(int32);
	elems = palloc(sizeof(Datum) * Max(n, 1));
	for (i = 0; i < n; i++)
	{
		int32		id;

		memcpy(&id, ids.data + i * sizeof(int32), sizeof(int32));
		elems[i] = Int32GetDatum(id);
	}
	PG_RETURN_ARRAYTYPE_P(construct_array(elems, n, INT4OID, sizeof(int32), true, TYPALIGN_INT));
}

Datum
gemma_detokenize(PG_FUNCTION_ARGS)
{
	ArrayType  *arr = PG_GETARG_ARRAYTYPE_P(0);
	Datum	   *elems;
	bool	   *nulls;
	int			n;
	int32	   *ids;
	G4Request  *r;
	StringInfoData out;
	char		kind;
	const char *data;
	Size		len;
	char	   *s;
	int			i;
	int64		limit = g4_prompt_bytes_limit(g4_require_ready());

	if (ARR_NDIM(arr) > 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("token ids must be a one-dimensional array")));
	/* before deconstructing: the ids travel as four bytes each */
	g4_check_prompt_bytes((int64) ArrayGetNItems(ARR_NDIM(arr), ARR_DIMS(arr)) * (int64) sizeof(int32),
						  limit, "the token id array");
	deconstruct_array(arr, INT4OID, sizeof(int32), true, TYPALIGN_INT, &elems, &nulls, &n);
	ids = palloc(sizeof(int32) * Max(n, 1));
	for (i = 0; i < n; i++)
	{
		if (nulls[i])
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("token ids must not be null")));
		ids[i] = DatumGetInt32(elems[i]);
	}

	r = start_one_item(G4_KIND_DETOKENIZE, G4_ITEM_IDS, (const char *) ids, (Size) n * sizeof(int32));
	initStringInfo(&out);
	while (g4_request_next(r, &kind, &data, &len))
		if (kind == G4_MQ_CONTENT)
			appendBinaryStringInfo(&out, data, (int) len);
	g4_request_finish(r);

	s = g4_text_to_server(out.data, out.len, &len);
	PG_RETURN_TEXT_P(cstring_to_text_with_len(s, (int) len));
}
