/*
 * sf_jw.c - the streaming JSON writer (see sf_jw.h).
 * Invariant: buf holds len valid bytes and room for one more (the NUL);
 * len never exceeds the bound.
 */
#include "sf_jw.h"
#include "sf_error.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static bool jw_reserve(struct sf_jw *w, size_t n)
{
	size_t max = w->max ? w->max : SF_JW_DEFAULT_MAX;

	if (w->err)
		return false;
	if (n > max - w->len) {
		w->err = -SF_ETOOBIG;
		return false;
	}
	if (w->len + n + 1 > w->cap) {
		size_t cap = w->cap ? w->cap : 4096;

		while (cap < w->len + n + 1)
			cap *= 2;
		if (cap > max + 1)
			cap = max + 1;
		char *b = realloc(w->buf, cap);

		if (!b) {
			w->err = -ENOMEM;
			return false;
		}
		w->buf = b;
		w->cap = cap;
	}
	return true;
}

void sf_jw_mem(struct sf_jw *w, const char *p, size_t n)
{
	if (jw_reserve(w, n)) {
		memcpy(w->buf + w->len, p, n);
		w->len += n;
	}
}

void sf_jw_lit(struct sf_jw *w, const char *p)
{
	sf_jw_mem(w, p, strlen(p));
}

void sf_jw_comma(struct sf_jw *w)
{
	sf_jw_mem(w, ", ", w->pretty ? 2 : 1);
}

void sf_jw_u64(struct sf_jw *w, uint64_t v)
{
	char tmp[20];
	size_t n = 0;

	do {
		tmp[sizeof(tmp) - 1 - n++] = (char)('0' + v % 10);
		v /= 10;
	} while (v);
	sf_jw_mem(w, tmp + sizeof(tmp) - n, n);
}

void sf_jw_str(struct sf_jw *w, const char *s)
{
	static const char hex[] = "0123456789abcdef";
	size_t run = 0, n = strlen(s);

	sf_jw_mem(w, "\"", 1);
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)s[i];
		char esc[6] = { '\\', 'u', '0', '0', hex[c >> 4], hex[c & 15] };

		if (c >= 0x20 && c != '"' && c != '\\')
			continue;
		sf_jw_mem(w, s + run, i - run);
		if (c == '"' || c == '\\') {
			esc[1] = (char)c;
			sf_jw_mem(w, esc, 2);
		} else {
			sf_jw_mem(w, esc, 6);
		}
		run = i + 1;
	}
	sf_jw_mem(w, s + run, n - run);
	sf_jw_mem(w, "\"", 1);
}

void sf_jw_key(struct sf_jw *w, const char *key)
{
	sf_jw_str(w, key);
	sf_jw_mem(w, ": ", w->pretty ? 2 : 1);
}

void sf_jw_u64_array(struct sf_jw *w, const uint64_t *v, size_t n)
{
	sf_jw_mem(w, "[", 1);
	for (size_t i = 0; i < n; i++) {
		if (i)
			sf_jw_comma(w);
		sf_jw_u64(w, v[i]);
	}
	sf_jw_mem(w, "]", 1);
}

int sf_jw_finish(struct sf_jw *w, char **out, size_t *len)
{
	jw_reserve(w, 0); /* room for the NUL, also when nothing was written */
	if (w->err) {
		free(w->buf);
		w->buf = NULL;
		return w->err;
	}
	w->buf[w->len] = '\0';
	*out = w->buf;
	if (len)
		*len = w->len;
	w->buf = NULL;
	return 0;
}
