/*
 * sf_jr.c - the streaming JSON reader (see sf_jr.h).
 *
 * Invariants: buf[pos..lim) holds input bytes [base + pos, base + lim)
 * not consumed yet; a file's window is refilled only when a token needs
 * more bytes than it holds (bytes before pos are dropped then), so memory
 * stays one window plus the scratch buffers, whose sizes are bounded by
 * the longest string or real in the input. A number or literal that
 * sf_jr_peek lexed is consumed already and waits in pend until a reading
 * call takes it. depth counts open containers; a value begun at depth d
 * is jansson's depth d + 1, refused past SF_JR_MAX_DEPTH.
 *
 * Error texts follow jansson's, so messages about a manifest read the
 * same as before this reader replaced json_loadb.
 */
#include "sf_jr.h"

#include <errno.h>
#include <inttypes.h>
#include <locale.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sf_array.h"
#include "sf_checksum.h"
#include "sf_error.h"

/* ------------------------------------------------------------------ */
/* input                                                               */

int sf_jr_init(struct sf_jr *r, const struct sf_input *in, char *msg,
	       size_t msglen)
{
	return sf_jr_init_window(r, in, SF_JR_WINDOW, msg, msglen);
}

int sf_jr_init_window(struct sf_jr *r, const struct sf_input *in,
		      size_t window, char *msg, size_t msglen)
{
	memset(r, 0, sizeof(*r));
	r->in = *in;
	r->msg = msg;
	r->msglen = msglen;
	r->line = 1;
	if (msg && msglen)
		msg[0] = '\0';
	if (in->mem) {
		r->buf = in->mem;
		r->lim = (size_t)in->size;
		return 0;
	}
	r->wcap = window ? window : 1;
	r->win = malloc(r->wcap);
	if (!r->win)
		return -ENOMEM;
	r->buf = r->win;
	return 0;
}

void sf_jr_free(struct sf_jr *r)
{
	free(r->win);
	free(r->sbuf);
	free(r->kbuf);
	r->win = NULL;
	r->sbuf = r->kbuf = NULL;
	r->buf = NULL;
}

uint64_t sf_jr_offset(const struct sf_jr *r)
{
	return r->pend ? r->pend_off : r->base + r->pos;
}

int sf_jr_fail(struct sf_jr *r, const char *fmt, ...)
{
	char what[160];
	va_list ap;

	if (r->err)
		return r->err;
	va_start(ap, fmt);
	vsnprintf(what, sizeof(what), fmt, ap);
	va_end(ap);
	if (r->msg && r->msglen)
		snprintf(r->msg, r->msglen, "invalid JSON at line %" PRIu64
			 " column %" PRIu64 ": %s", r->line,
			 r->base + r->pos - r->line_start + 1, what);
	r->err = -SF_EMANIFEST;
	return r->err;
}

/* Make at least need bytes available at pos if the input has them.
 * Returns the bytes available (< need only at the end of the input), or
 * a negative error. */
static long jr_fill(struct sf_jr *r, size_t need)
{
	uint64_t end = r->base + r->lim, left;
	size_t keep, from, n;
	int rc;

	if (r->err)
		return r->err;
	if (r->lim - r->pos >= need || !r->win || end >= r->in.size)
		return (long)(r->lim - r->pos);
	/* keep from pos, or from the pinned key (sf_jr_obj_next) */
	from = r->pinned ? r->pin : r->pos;
	keep = r->lim - from;
	need += r->pos - from;
	if (need > r->wcap) {
		unsigned char *w;
		size_t cap = r->wcap;

		while (cap < need)
			cap *= 2;
		w = malloc(cap);
		if (!w)
			return r->err = -ENOMEM;
		memcpy(w, r->win + from, keep);
		free(r->win);
		r->win = w;
		r->wcap = cap;
	} else if (from) {
		memmove(r->win, r->win + from, keep);
	}
	r->buf = r->win;
	r->base += from;
	r->pos -= from;
	if (r->pinned)
		r->pin -= from;
	r->lim = keep;
	left = r->in.size - end;
	n = r->wcap - keep;
	if (n > left)
		n = (size_t)left;
	rc = sf_input_read(&r->in, r->win + keep, n, end);
	if (rc) {
		if (r->msg && r->msglen)
			snprintf(r->msg, r->msglen, "cannot read the JSON text: %s",
				 sf_strerror(rc));
		return r->err = rc;
	}
	r->lim += n;
	return (long)r->lim - (long)r->pos;
}

/* The next byte (not consumed), -1 at the end of the input, or the error. */
static int jr_look(struct sf_jr *r)
{
	long n;

	if (r->pos < r->lim)
		return r->buf[r->pos];
	n = jr_fill(r, 1);
	if (n < 0)
		return (int)n;
	return n ? r->buf[r->pos] : -1;
}

/* Skip white space; the next byte as jr_look. */
static int jr_ws_slow(struct sf_jr *r)
{
	for (;;) {
		while (r->pos < r->lim) {
			unsigned char c = r->buf[r->pos];

			if (c == ' ' || c == '\t' || c == '\r') {
				r->pos++;
			} else if (c == '\n') {
				r->pos++;
				r->line++;
				r->line_start = r->base + r->pos;
			} else {
				return c;
			}
		}
		long n = jr_fill(r, 1);

		if (n <= 0)
			return n < 0 ? (int)n : -1;
	}
}

/* The common cases first: no white space, or one space. */
static inline int jr_ws(struct sf_jr *r)
{
	if (r->pos + 1 < r->lim) {
		unsigned char c = r->buf[r->pos];

		if (c > ' ')
			return c;
		if (c == ' ' && r->buf[r->pos + 1] > ' ')
			return r->buf[++r->pos];
	}
	return jr_ws_slow(r);
}

/* ------------------------------------------------------------------ */
/* strings                                                             */

/* Append n bytes to a growable scratch buffer. */
static int sb_add(struct sf_jr *r, char **b, size_t *len, size_t *cap,
		  const void *p, size_t n)
{
	if (n == 0)
		return 0;
	if (n > *cap - *len) {
		size_t c = *cap ? *cap : 256;

		while (c - *len < n) {
			if (c > SIZE_MAX / 2)
				return r->err = -ENOMEM;
			c *= 2;
		}
		char *nb = realloc(*b, c);

		if (!nb)
			return r->err = -ENOMEM;
		*b = nb;
		*cap = c;
	}
	memcpy(*b + *len, p, n);
	*len += n;
	return 0;
}

/* Length of the UTF-8 sequence starting with byte c (2..4), 0 if c cannot
 * start one (jansson's utf8_check_first). */
static unsigned utf8_first(unsigned c)
{
	if (c >= 0xc2 && c <= 0xdf)
		return 2;
	if (c >= 0xe0 && c <= 0xef)
		return 3;
	if (c >= 0xf0 && c <= 0xf4)
		return 4;
	return 0;
}

/* Is p[0..n) (n from utf8_first) a valid sequence: continuation bytes,
 * no overlong form, no surrogate, at most U+10FFFF? */
static bool utf8_full(const unsigned char *p, unsigned n)
{
	uint32_t cp = p[0] & (n == 2 ? 0x1f : n == 3 ? 0x0f : 0x07);

	for (unsigned i = 1; i < n; i++) {
		if ((p[i] & 0xc0) != 0x80)
			return false;
		cp = cp << 6 | (p[i] & 0x3f);
	}
	return !((n == 3 && cp < 0x800) || (n == 4 && cp < 0x10000) ||
		 cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff));
}

static int hex4(const unsigned char *p)
{
	int v = 0;

	for (int i = 0; i < 4; i++) {
		unsigned c = p[i];

		v <<= 4;
		if (c >= '0' && c <= '9')
			v += (int)(c - '0');
		else if (c >= 'a' && c <= 'f')
			v += (int)(c - 'a' + 10);
		else if (c >= 'A' && c <= 'F')
			v += (int)(c - 'A' + 10);
		else
			return -1;
	}
	return v;
}

/* One escape at pos (after the backslash) into the scratch buffer. */
static int jr_escape(struct sf_jr *r, char **b, size_t *len, size_t *cap)
{
	static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
	unsigned char out[4];
	const char *e;
	long n;
	int v, v2;

	n = jr_fill(r, 1);
	if (n < 1)
		return n < 0 ? (int)n : sf_jr_fail(r, "premature end of input");
	if (r->buf[r->pos] != 'u') {
		e = strchr(from, r->buf[r->pos]);
		if (!e || !r->buf[r->pos])
			return sf_jr_fail(r, "invalid escape");
		r->pos++;
		return sb_add(r, b, len, cap, &to[e - from], 1);
	}
	n = jr_fill(r, 5);
	if (n < 0)
		return (int)n;
	if (n < 5 || (v = hex4(r->buf + r->pos + 1)) < 0)
		return sf_jr_fail(r, "invalid escape");
	r->pos += 5;
	if (v >= 0xd800 && v <= 0xdbff) {
		n = jr_fill(r, 6);
		if (n < 0)
			return (int)n;
		if (n < 2 || r->buf[r->pos] != '\\' || r->buf[r->pos + 1] != 'u')
			return sf_jr_fail(r, "invalid Unicode '\\u%04X'", (unsigned)v);
		if (n < 6 || (v2 = hex4(r->buf + r->pos + 2)) < 0)
			return sf_jr_fail(r, "invalid escape");
		if (v2 < 0xdc00 || v2 > 0xdfff)
			return sf_jr_fail(r, "invalid Unicode '\\u%04X\\u%04X'",
					  (unsigned)v, (unsigned)v2);
		r->pos += 6;
		v = ((v - 0xd800) << 10) + (v2 - 0xdc00) + 0x10000;
	} else if (v >= 0xdc00 && v <= 0xdfff) {
		return sf_jr_fail(r, "invalid Unicode '\\u%04X'", (unsigned)v);
	}
	if (v < 0x80) {
		out[0] = (unsigned char)v;
		return sb_add(r, b, len, cap, out, 1);
	}
	if (v < 0x800) {
		out[0] = (unsigned char)(0xc0 | v >> 6);
		out[1] = (unsigned char)(0x80 | (v & 0x3f));
		return sb_add(r, b, len, cap, out, 2);
	}
	if (v < 0x10000) {
		out[0] = (unsigned char)(0xe0 | v >> 12);
		out[1] = (unsigned char)(0x80 | ((v >> 6) & 0x3f));
		out[2] = (unsigned char)(0x80 | (v & 0x3f));
		return sb_add(r, b, len, cap, out, 3);
	}
	out[0] = (unsigned char)(0xf0 | v >> 18);
	out[1] = (unsigned char)(0x80 | ((v >> 12) & 0x3f));
	out[2] = (unsigned char)(0x80 | ((v >> 6) & 0x3f));
	out[3] = (unsigned char)(0x80 | (v & 0x3f));
	return sb_add(r, b, len, cap, out, 4);
}

/*
 * The string at pos (its opening quote). Plain strings that lie in the
 * window are returned in place; others (escapes, or crossing the window)
 * are decoded into the scratch buffer *b.
 */
/* Bytes a string holds as they are: ASCII from ' ' on but '"' and '\\'
 * (control bytes, escapes and UTF-8 take the slow path). */
static const unsigned char plain[256] = {
	0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
	0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
	1, 1, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
	1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
	1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
	1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 1,
	1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
	1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
	0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
	0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
	0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
	0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
	0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
	0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
	0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
	0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
};

static int jr_str(struct sf_jr *r, char **b, size_t *len, size_t *cap,
		  struct sf_jr_str *out)
{
	size_t start;
	bool copy = false;
	int rc;

	r->pos++; /* the quote */
	start = r->pos;
	*len = 0;
	for (;;) {
		while (r->pos < r->lim) {
			unsigned c;

			while (r->pos < r->lim && plain[r->buf[r->pos]])
				r->pos++;
			if (r->pos == r->lim)
				break;
			c = r->buf[r->pos];
			if (c == '"') {
				if (!copy) {
					out->s = (const char *)r->buf + start;
					out->len = r->pos - start;
				} else {
					rc = sb_add(r, b, len, cap, r->buf + start,
						    r->pos - start);
					if (rc)
						return rc;
					out->s = *b;
					out->len = *len;
				}
				r->pos++;
				return 0;
			}
			if (c < 0x20)
				return sf_jr_fail(r, c == '\n' ? "unexpected newline" :
						  "control character 0x%x", c);
			/* an escape or a multi-byte character: may need bytes
			 * past the window, so flush what is plain so far */
			rc = sb_add(r, b, len, cap, r->buf + start, r->pos - start);
			if (rc)
				return rc;
			copy = true;
			if (c == '\\') {
				r->pos++;
				rc = jr_escape(r, b, len, cap);
			} else {
				unsigned n = utf8_first(c);
				long av = jr_fill(r, n ? n : 1);

				if (av < 0)
					return (int)av;
				if (!n || (size_t)av < n ||
				    !utf8_full(r->buf + r->pos, n))
					return sf_jr_fail(r, "unable to decode byte 0x%x", c);
				rc = sb_add(r, b, len, cap, r->buf + r->pos, n);
				r->pos += n;
			}
			if (rc)
				return rc;
			start = r->pos;
		}
		/* the window ends inside the string */
		rc = sb_add(r, b, len, cap, r->buf + start, r->pos - start);
		if (rc)
			return rc;
		copy = true;
		long n = jr_fill(r, 1);

		if (n < 0)
			return (int)n;
		if (n == 0)
			return sf_jr_fail(r, "premature end of input");
		start = r->pos;
	}
}

/* ------------------------------------------------------------------ */
/* numbers and literals                                                */

/* Take the byte at pos into the token copy; the next byte as jr_look. */
static int num_next(struct sf_jr *r)
{
	int rc = sb_add(r, &r->sbuf, &r->slen, &r->scap, r->buf + r->pos, 1);

	if (rc)
		return rc;
	r->pos++;
	return jr_look(r);
}

static bool is_digit(int c)
{
	return c >= '0' && c <= '9';
}

/* The common case: an integer of at most 18 digits, wholly in the window
 * (followed by a byte that ends it). 1 when lexed, 0 to take the general
 * path. */
static int jr_lex_int_fast(struct sf_jr *r)
{
	const unsigned char *p, *e, *d;
	struct sf_jr_num *v = &r->num;
	uint64_t u = 0;

	if (r->lim - r->pos < 24 && jr_fill(r, 24) < 0)
		return 0;
	p = r->buf + r->pos;
	e = r->buf + r->lim;
	memset(v, 0, sizeof(*v));
	if (*p == '-') {
		v->neg = true;
		p++;
	}
	d = p;
	while (p < e && p - d < 19 && *p >= '0' && *p <= '9')
		u = u * 10 + (unsigned)(*p++ - '0');
	if (p == d || p == e || p - d >= 19 || (*d == '0' && p - d > 1) ||
	    *p == '.' || *p == 'e' || *p == 'E')
		return 0;
	v->u = u;
	v->integer = true;
	r->pos = (size_t)(p - r->buf);
	return 1;
}

/* Lex the number at pos into r->num (jansson's lex_scan_number). */
static int jr_lex_number(struct sf_jr *r)
{
	struct sf_jr_num *v = &r->num;
	bool over = false;
	int c;

	if (jr_lex_int_fast(r))
		return 0;
	c = jr_look(r);

	memset(v, 0, sizeof(*v));
	r->slen = 0;
	if (c == '-') {
		v->neg = true;
		c = num_next(r);
	}
	if (c == '0') {
		c = num_next(r);
		if (is_digit(c))
			return sf_jr_fail(r, "invalid token");
	} else if (is_digit(c)) {
		do {
			unsigned d = (unsigned)(c - '0');

			if (v->u > (UINT64_MAX - d) / 10)
				over = true;
			else
				v->u = v->u * 10 + d;
			c = num_next(r);
		} while (is_digit(c));
	} else {
		return c < -1 ? c : sf_jr_fail(r, "invalid token");
	}
	if (c < -1)
		return c;
	if (c != '.' && c != 'e' && c != 'E') {
		/* int64, as strtoll: [-2^63, 2^63 - 1] */
		if (over || (!v->neg && v->u > (uint64_t)INT64_MAX) ||
		    (v->neg && v->u > (uint64_t)INT64_MAX + 1))
			return sf_jr_fail(r, v->neg ? "too big negative integer" :
					  "too big integer");
		v->integer = true;
		return 0;
	}
	if (c == '.') {
		c = num_next(r);
		if (!is_digit(c))
			return c < -1 ? c : sf_jr_fail(r, "invalid token");
		do
			c = num_next(r);
		while (is_digit(c));
	}
	if (c == 'e' || c == 'E') {
		c = num_next(r);
		if (c == '+' || c == '-')
			c = num_next(r);
		if (!is_digit(c))
			return c < -1 ? c : sf_jr_fail(r, "invalid token");
		do
			c = num_next(r);
		while (is_digit(c));
	}
	if (c < -1)
		return c;
	/* a real: only whether it overflows a double matters (no field of a
	 * manifest takes one); strtod wants the locale's decimal point */
	{
		const char *dp = localeconv()->decimal_point;
		char *dot, *end;
		double d;
		int rc = sb_add(r, &r->sbuf, &r->slen, &r->scap, "", 1);

		if (rc)
			return rc;
		dot = strchr(r->sbuf, '.');
		if (dot && dp && dp[0] && !dp[1])
			*dot = dp[0];
		errno = 0;
		d = strtod(r->sbuf, &end);
		if ((d == HUGE_VAL || d == -HUGE_VAL) && errno == ERANGE)
			return sf_jr_fail(r, "real number overflow");
	}
	return 0;
}

/* Lex true, false or null at pos: jansson reads the whole run of letters. */
static int jr_lex_word(struct sf_jr *r)
{
	char w[8];
	size_t n = 0;
	int c = jr_look(r);

	while ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) {
		if (n == sizeof(w) - 1)
			return sf_jr_fail(r, "invalid token");
		w[n++] = (char)c;
		r->pos++;
		c = jr_look(r);
	}
	if (c < -1)
		return c;
	w[n] = '\0';
	if (strcmp(w, "true") == 0)
		return SF_JR_TRUE;
	if (strcmp(w, "false") == 0)
		return SF_JR_FALSE;
	if (strcmp(w, "null") == 0)
		return SF_JR_NULL;
	return sf_jr_fail(r, "invalid token");
}

/* ------------------------------------------------------------------ */
/* structure                                                           */

int sf_jr_peek(struct sf_jr *r)
{
	int c, rc;

	if (r->err)
		return r->err;
	if (r->pend)
		return r->pend;
	c = jr_ws(r);
	if (c < -1)
		return c;
	if (c == -1)
		return sf_jr_fail(r, "premature end of input");
	if (r->depth + 1 > SF_JR_MAX_DEPTH)
		return sf_jr_fail(r, "maximum parsing depth reached");
	switch (c) {
	case '{':
	case '[':
	case '"':
		return c;
	default:
		break;
	}
	r->pend_off = r->base + r->pos;
	if (c == '-' || is_digit(c)) {
		rc = jr_lex_number(r);
		if (rc)
			return rc;
		return r->pend = SF_JR_NUMBER;
	}
	if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) {
		rc = jr_lex_word(r);
		if (rc < 0)
			return rc;
		return r->pend = rc;
	}
	return sf_jr_fail(r, c == '}' || c == ']' || c == ',' || c == ':' ?
			  "unexpected token" : "invalid token");
}

int sf_jr_top(struct sf_jr *r)
{
	int c = jr_ws(r);

	if (c < -1)
		return c;
	if (c != '{' && c != '[')
		return sf_jr_fail(r, "'[' or '{' expected");
	return c;
}

int sf_jr_end(struct sf_jr *r)
{
	int c;

	if (r->err)
		return r->err;
	c = jr_ws(r);
	if (c < -1)
		return c;
	if (c != -1)
		return sf_jr_fail(r, "end of file expected");
	return 0;
}

static int jr_begin(struct sf_jr *r, struct sf_jr_it *it, int want)
{
	int k = sf_jr_peek(r);

	if (k < 0)
		return k;
	if (k != want)
		return sf_jr_fail(r, "unexpected token");
	r->pos++;
	r->depth++;
	it->started = false;
	return 0;
}

int sf_jr_obj_begin(struct sf_jr *r, struct sf_jr_it *it)
{
	return jr_begin(r, it, '{');
}

int sf_jr_arr_begin(struct sf_jr *r, struct sf_jr_it *it)
{
	return jr_begin(r, it, '[');
}

int sf_jr_obj_next(struct sf_jr *r, struct sf_jr_it *it, struct sf_jr_str *key)
{
	int c, rc;

	if (r->err)
		return r->err;
	r->pend = 0;
	c = jr_ws(r);
	if (c < -1)
		return c;
	if (c == '}') {
		r->pos++;
		r->depth--;
		return 0;
	}
	if (it->started) {
		if (c != ',')
			return sf_jr_fail(r, "'}' expected");
		r->pos++;
		c = jr_ws(r);
		if (c < -1)
			return c;
	}
	if (c != '"')
		return sf_jr_fail(r, "string or '}' expected");
	it->started = true;
	r->pin = r->pos + 1;
	rc = jr_str(r, &r->kbuf, &r->klen, &r->kcap, key);
	if (rc)
		return rc;
	/* a key in the window stays there (pinned) while the ':' is found;
	 * only an escape can make a NUL byte, and escapes go to kbuf */
	if (key->s == r->kbuf && memchr(key->s, '\0', key->len))
		return sf_jr_fail(r, "NUL byte in object key not supported");
	r->pinned = key->s != r->kbuf;
	c = jr_ws(r);
	r->pinned = false;
	if (r->pin + key->len <= r->lim && key->s != r->kbuf)
		key->s = (const char *)r->buf + r->pin;
	if (c < -1)
		return c;
	if (c != ':')
		return sf_jr_fail(r, "':' expected");
	r->pos++;
	return 1;
}

int sf_jr_arr_next(struct sf_jr *r, struct sf_jr_it *it)
{
	int c;

	if (r->err)
		return r->err;
	r->pend = 0;
	c = jr_ws(r);
	if (c < -1)
		return c;
	if (c == ']') {
		r->pos++;
		r->depth--;
		return 0;
	}
	if (it->started) {
		if (c != ',')
			return sf_jr_fail(r, "']' expected");
		r->pos++;
	}
	it->started = true;
	return 1;
}

/* The value of 8 lowercase hex digits at p (the first the most
 * significant), or false when one is not [0-9a-f]. Eight bytes at once:
 * each byte must be a digit (0x30..0x39) or a letter (0x61..0x66), found
 * by adding to every byte (all below 0x80, so no carry crosses bytes) and
 * looking at the high bits; the nibbles are then packed pairwise. */
static inline bool hex8(const unsigned char *p, uint32_t *out)
{
	const uint64_t hi = UINT64_C(0x8080808080808080), ones = UINT64_C(0x0101010101010101);
	uint64_t x, digit, letter, v;

	memcpy(&x, p, 8);
#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
	x = __builtin_bswap64(x);
#endif
	if (x & hi)
		return false;
	digit = (x + ones * (0x80 - 0x30)) & ~(x + ones * (0x80 - 0x3a)) & hi;
	letter = (x + ones * (0x80 - 0x61)) & ~(x + ones * (0x80 - 0x67)) & hi;
	if ((digit | letter) != hi)
		return false;
	v = (x & ones * 0x0f) + (letter >> 7) * 9;
	v = __builtin_bswap64(v); /* the first digit in the top byte */
	v = (v | v >> 4) & UINT64_C(0x00ff00ff00ff00ff);
	v = (v | v >> 8) & UINT64_C(0x0000ffff0000ffff);
	v = (v | v >> 16) & UINT64_C(0x00000000ffffffff);
	*out = (uint32_t)v;
	return true;
}

size_t sf_jr_arr_hex64s(struct sf_jr *r, struct sf_jr_it *it, uint64_t *out,
			size_t max)
{
	size_t n = 0;

	if (r->err || r->pend || r->depth + 1 > SF_JR_MAX_DEPTH)
		return 0;
	while (n < max) {
		const unsigned char *p, *e;
		uint32_t h1, h2;

		if (r->lim - r->pos < 64 && jr_fill(r, 64) < 0)
			break; /* the error waits for sf_jr_arr_next */
		p = r->buf + r->pos;
		e = r->buf + r->lim;
		if (it->started) {
			if (p == e || *p != ',')
				break;
			p++;
		}
		while (p < e && *p == ' ')
			p++;
		if (e - p < 18 || p[0] != '"' || p[17] != '"' ||
		    !hex8(p + 1, &h1) || !hex8(p + 9, &h2))
			break;
		out[n++] = (uint64_t)h1 << 32 | h2;
		r->pos = (size_t)(p + 18 - r->buf);
		it->started = true;
	}
	return n;
}

int sf_jr_string(struct sf_jr *r, struct sf_jr_str *out)
{
	int k = sf_jr_peek(r);

	if (k < 0)
		return k;
	if (k != SF_JR_STRING)
		return sf_jr_fail(r, "unexpected token");
	return jr_str(r, &r->sbuf, &r->slen, &r->scap, out);
}

int sf_jr_number(struct sf_jr *r, struct sf_jr_num *out)
{
	int k = sf_jr_peek(r);

	if (k < 0)
		return k;
	if (k != SF_JR_NUMBER)
		return sf_jr_fail(r, "unexpected token");
	*out = r->num;
	r->pend = 0;
	return 0;
}

int sf_jr_skip(struct sf_jr *r)
{
	struct sf_jr_keys keys = { 0 };
	struct sf_jr_str s;
	struct sf_jr_it it;
	int k = sf_jr_peek(r), rc;

	if (k < 0)
		return k;
	switch (k) {
	case SF_JR_STRING:
		return jr_str(r, &r->sbuf, &r->slen, &r->scap, &s);
	case SF_JR_OBJECT:
		rc = sf_jr_obj_begin(r, &it);
		while (rc == 0 && (rc = sf_jr_obj_next(r, &it, &s)) == 1) {
			rc = sf_jr_keys_add(&keys, s.s, s.len);
			if (rc == 1)
				rc = sf_jr_fail(r, "duplicate object key");
			else if (rc < 0)
				rc = r->err = rc;
			else
				rc = sf_jr_skip(r);
		}
		sf_jr_keys_free(&keys);
		return rc;
	case SF_JR_ARRAY:
		rc = sf_jr_arr_begin(r, &it);
		while (rc == 0 && (rc = sf_jr_arr_next(r, &it)) == 1)
			rc = sf_jr_skip(r);
		return rc;
	default:
		r->pend = 0; /* a number or literal: lexed already */
		return 0;
	}
}

/* ------------------------------------------------------------------ */
/* duplicate keys                                                      */

static bool key_eq(const struct sf_jr_keys *k, size_t i, uint64_t h,
		   const char *s, size_t len)
{
	const struct sf_jr_key *e = &k->ent[i];

	return e->hash == h && e->len == len &&
	       (len == 0 || memcmp(k->text + e->off, s, len) == 0);
}

/* Put key index i into the table (no duplicate check). */
static void slot_put(struct sf_jr_keys *k, size_t i)
{
	size_t mask = k->nslots - 1, at = (size_t)k->ent[i].hash & mask;

	while (k->slots[at])
		at = (at + 1) & mask;
	k->slots[at] = (uint32_t)(i + 1);
}

static int table_grow(struct sf_jr_keys *k)
{
	size_t ns = k->nslots ? k->nslots * 2 : 64;
	uint32_t *s;

	if (k->n >= UINT32_MAX - 1 || ns > SIZE_MAX / sizeof(*s))
		return -ENOMEM;
	s = calloc(ns, sizeof(*s));
	if (!s)
		return -ENOMEM;
	free(k->slots);
	k->slots = s;
	k->nslots = ns;
	for (size_t i = 0; i < k->n; i++)
		slot_put(k, i);
	return 0;
}

int sf_jr_keys_add(struct sf_jr_keys *k, const char *s, size_t len)
{
	uint64_t h = sf_xxh3(s, len);
	size_t i;
	int rc;

	if (k->slots) {
		size_t mask = k->nslots - 1;

		for (size_t at = (size_t)h & mask; k->slots[at]; at = (at + 1) & mask)
			if (key_eq(k, k->slots[at] - 1, h, s, len))
				return 1;
	} else {
		for (i = 0; i < k->n; i++)
			if (key_eq(k, i, h, s, len))
				return 1;
	}
	rc = sf_array_grow(&k->ent, k->n, &k->cap, sizeof(*k->ent), 8, 0);
	if (rc)
		return -ENOMEM;
	if (len > k->tcap - k->tlen) {
		size_t c = k->tcap ? k->tcap : 256;
		char *t;

		while (c - k->tlen < len) {
			if (c > SIZE_MAX / 2)
				return -ENOMEM;
			c *= 2;
		}
		t = realloc(k->text, c);
		if (!t)
			return -ENOMEM;
		k->text = t;
		k->tcap = c;
	}
	if (len) /* an empty key: text may still be NULL */
		memcpy(k->text + k->tlen, s, len);
	k->ent[k->n] = (struct sf_jr_key){ .hash = h, .off = k->tlen, .len = len };
	k->tlen += len;
	k->n++;
	if (k->n > SF_JR_KEYS_LINEAR && 2 * k->n > k->nslots)
		return table_grow(k) ? -ENOMEM : 0;
	if (k->slots)
		slot_put(k, k->n - 1);
	return 0;
}

void sf_jr_keys_free(struct sf_jr_keys *k)
{
	free(k->text);
	free(k->ent);
	free(k->slots);
	memset(k, 0, sizeof(*k));
}
