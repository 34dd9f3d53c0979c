/*-------------------------------------------------------------------------
 *
 * encoding.c
 *	  The engine's UTF-8 output as text in the database encoding.
 *
 * Every answer, stream row and detokenized string passes here.  text cannot
 * hold NUL characters, so they are dropped.  A character the database
 * encoding cannot hold fails the call with 22P05 (PostgreSQL's own
 * conversion error), unless gemma4.untranslatable_characters is 'replace':
 * then each such character becomes '?', which every server encoding holds,
 * and the rest of the answer is kept.
 *
 * IDENTIFICATION
 *	  src/pg/encoding.c
 *
 *-------------------------------------------------------------------------
 */
#include "gemma4.h"

#include "catalog/namespace.h"
#include "lib/stringinfo.h"
#include "mb/pg_wchar.h"
#include "utils/memutils.h"

/*
 * The UTF-8 string s[0..len) (valid, without NULs) in the database
 * encoding, each character it cannot hold replaced by '?'.  The conversion
 * runs in pieces: up to the first character it cannot convert, then past
 * it.
 */
static char *
convert_replacing(const char *s, Size len, Size *out_len)
{
	int			db = GetDatabaseEncoding();
	Oid			proc = FindDefaultConversionProc(PG_UTF8, db);
	StringInfoData out;
	unsigned char *buf;
	Size		off = 0;

	if (!OidIsValid(proc))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_FUNCTION),
				 errmsg("default conversion function for encoding \"%s\" to \"%s\" does not exist",
						pg_encoding_to_char(PG_UTF8), pg_encoding_to_char(db))));
	if (len > (MaxAllocSize - 1) / MAX_CONVERSION_GROWTH)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("gemma4 answer of %zu bytes is too long to convert to encoding \"%s\"",
						len, pg_encoding_to_char(db))));
	buf = palloc(len * MAX_CONVERSION_GROWTH + 1);
	initStringInfo(&out);
	while (off < len)
	{
		int			done = pg_do_encoding_conversion_buf(proc, PG_UTF8, db,
														 (unsigned char *) s + off, (int) (len - off),
														 buf, (int) (len * MAX_CONVERSION_GROWTH + 1), true);

		appendStringInfoString(&out, (const char *) buf);
		off += done;
		if (off < len)
		{
			appendStringInfoChar(&out, '?');
			off += pg_utf_mblen((const unsigned char *) s + off);
		}
	}
	pfree(buf);
	*out_len = out.len;
	return out.data;
}

char *
g4_text_to_server(const char *utf8, Size len, Size *out_len)
{
	char	   *clean = palloc(len + 1);
	Size		n = 0;
	Size		i;
	char	   *s;

	for (i = 0; i < len; i++)
		if (utf8[i] != '\0')
			clean[n++] = utf8[i];
	clean[n] = '\0';
	if (g4_untranslatable_characters == G4_UNTRANSLATABLE_REPLACE &&
		GetDatabaseEncoding() != PG_UTF8 && GetDatabaseEncoding() != PG_SQL_ASCII)
	{
		/* validated first, so that a conversion stopping early can only
		 * mean a character the encoding cannot hold */
		(void) pg_verify_mbstr(PG_UTF8, clean, (int) n, false);
		return convert_replacing(clean, n, out_len);
	}
	s = pg_any_to_server(clean, (int) n, PG_UTF8);
	*out_len = (s == clean) ? n : strlen(s);
	return s;
}
