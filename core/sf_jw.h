/*
 * sf_jw.h - a streaming JSON writer: text appended straight into one
 * growing buffer, no tree. A 10,000-tensor manifest is ~10 MB and ~10^6
 * values; building a jansson tree first was most of a commit's time.
 *
 * Errors are sticky: after the first one (-ENOMEM, or -SF_ETOOBIG past
 * the cap) every call does nothing and sf_jw_finish() returns it. Strings
 * are escaped ('"', '\\' and control characters), so the output is valid
 * JSON whatever it is given (strings must be UTF-8 to be valid JSON; the
 * callers pass validated names).
 */
#ifndef SF_JW_H
#define SF_JW_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct sf_jw {
	char *buf;      /* malloc'd; NUL-terminated by sf_jw_finish */
	size_t len;     /* bytes written */
	size_t cap;     /* bytes allocated, <= max + 1 */
	size_t max;     /* bound on len (0: SF_JW_DEFAULT_MAX) */
	bool pretty;    /* ", " and ": " separators */
	int err;        /* first error; sticky */
};

#define SF_JW_DEFAULT_MAX (256u << 20)

/* A writer is a zero-initialized struct sf_jw (set pretty / max first). */
void sf_jw_mem(struct sf_jw *w, const char *p, size_t n);
void sf_jw_lit(struct sf_jw *w, const char *p);
/* "," plus a space when pretty */
void sf_jw_comma(struct sf_jw *w);
void sf_jw_u64(struct sf_jw *w, uint64_t v);
/* s as an escaped JSON string */
void sf_jw_str(struct sf_jw *w, const char *s);
/* "key": (with the space when pretty) */
void sf_jw_key(struct sf_jw *w, const char *key);
void sf_jw_u64_array(struct sf_jw *w, const uint64_t *v, size_t n);

/* Hand the text to the caller (*out NUL-terminated, malloc'd, the caller
 * frees; *len without the NUL, len may be NULL), or free it and return the
 * first error. */
int sf_jw_finish(struct sf_jw *w, char **out, size_t *len);

#endif
