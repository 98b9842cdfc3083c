/*
 * sf_pickle_scalar.c - the pickle reader's opcodes for scalars, strings,
 * bytes, globals and persistent ids (see sf_pickle.c for the loop and the
 * invariants of the whole reader).
 *
 * Invariants: every argument is read through the decoder's window
 * (sf_pkd_get_*); a bytes value longer than SF_PK_BYTES_COPY is only
 * checked to lie inside the input, never read; every copy is charged to
 * max_bytes before it is made, except the transient decode buffer of a
 * UNICODE line (at most twice the line, itself capped by max_bytes); STRs
 * are strict UTF-8 (no surrogates) and may hold NULs; a global is pushed
 * only when it is on the allowlist.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sf_error.h"
#include "sf_pickle_dec.h"

/* ------------------------------------------------------------------ */
/* scalars                                                             */

int sf_pkd_push_new(struct pk_dec *d, enum sf_pk_kind kind, struct sf_pk **out)
{
	struct sf_pk *v;
	int rc = sf_pkd_new_node(d, kind, &v);

	if (rc < 0)
		return rc;
	rc = sf_pkd_push(d, v);
	if (rc < 0)
		return rc;
	if (out)
		*out = v;
	return 0;
}

int sf_pkd_push_bool(struct pk_dec *d, bool b)
{
	struct sf_pk *v;
	int rc = sf_pkd_push_new(d, SF_PK_BOOL, &v);

	if (rc == 0)
		v->u.b = b;
	return rc;
}

int sf_pkd_push_int(struct pk_dec *d, int64_t i)
{
	struct sf_pk *v;
	int rc = sf_pkd_push_new(d, SF_PK_INT, &v);

	if (rc == 0)
		v->u.i = i;
	return rc;
}

/* A decimal integer [+-]?[0-9]+ of s[0..len) into *out. 0; -1 malformed;
 * -2 out of int64's range. */
int sf_pkd_parse_dec(const char *s, size_t len, int64_t *out)
{
	bool neg = false;
	uint64_t v = 0, lim;
	size_t i = 0;

	if (len && (s[0] == '-' || s[0] == '+')) {
		neg = s[0] == '-';
		i = 1;
	}
	if (i == len)
		return -1;
	lim = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
	bool big = false;
	for (; i < len; i++) {
		if (s[i] < '0' || s[i] > '9')
			return -1;
		if (big)
			continue;
		unsigned dg = (unsigned)(s[i] - '0');
		if (v > (lim - dg) / 10)
			big = true; /* keep checking the syntax */
		else
			v = v * 10 + dg;
	}
	if (big)
		return -2;
	*out = neg ? (int64_t)(0 - v) : (int64_t)v;
	return 0;
}

int sf_pkd_op_int_text(struct pk_dec *d, bool is_long)
{
	int64_t v;
	size_t len;
	int rc = sf_pkd_get_line(d, PK_LINE_MAX);

	if (rc < 0)
		return rc;
	len = d->line_len;
	if (!is_long && len == 2 && d->line[0] == '0' &&
	    (d->line[1] == '0' || d->line[1] == '1'))
		return sf_pkd_push_bool(d, d->line[1] == '1');
	if (is_long && len && d->line[len - 1] == 'L')
		len--;
	rc = sf_pkd_parse_dec(d->line, len, &v);
	if (rc == -2)
		return sf_pkd_fail(d, -SF_ETOOBIG, "integer does not fit int64");
	if (rc < 0)
		return sf_pkd_fail(d, -SF_EFORMAT, "malformed integer");
	return sf_pkd_push_int(d, v);
}

/* LONG1/LONG4: n bytes, little-endian two's complement. */
int sf_pkd_op_long_bin(struct pk_dec *d, uint64_t n)
{
	unsigned char b[PK_LONG_MAX];
	uint64_t v = 0;
	int rc;

	if (n > PK_LONG_MAX)
		return sf_pkd_fail(d, -SF_ETOOBIG, "a %" PRIu64 "-byte integer does not fit int64",
			    n);
	rc = sf_pkd_get_bytes(d, b, (size_t)n);
	if (rc < 0)
		return rc;
	if (n == 0)
		return sf_pkd_push_int(d, 0);
	bool neg = b[n - 1] & 0x80;
	/* Bytes beyond 8 must only extend the sign. */
	for (size_t i = 8; i < n; i++)
		if (b[i] != (neg ? 0xff : 0x00))
			return sf_pkd_fail(d, -SF_ETOOBIG, "integer does not fit int64");
	size_t k = n < 8 ? (size_t)n : 8;
	for (size_t i = k; i-- > 0;)
		v = (v << 8) | b[i];
	if (k < 8 && neg)
		v |= ~(uint64_t)0 << (8 * k);
	if (n > 8 && (bool)(v >> 63) != neg)
		return sf_pkd_fail(d, -SF_ETOOBIG, "integer does not fit int64");
	return sf_pkd_push_int(d, (int64_t)v);
}

int sf_pkd_op_float_text(struct pk_dec *d)
{
	struct sf_pk *v;
	char *end;
	double f;
	int rc = sf_pkd_get_line(d, PK_LINE_MAX);

	if (rc < 0)
		return rc;
	/* Python's float() (the C locale's strtod: shardfs never calls
	 * setlocale): decimal, inf, nan; strtod's hex forms are not. */
	if (d->line_len == 0 || strpbrk(d->line, "xXpP") ||
	    d->line[0] == ' ' || d->line[0] == '\t')
		return sf_pkd_fail(d, -SF_EFORMAT, "malformed float");
	f = strtod(d->line, &end);
	if (end != d->line + d->line_len)
		return sf_pkd_fail(d, -SF_EFORMAT, "malformed float");
	rc = sf_pkd_push_new(d, SF_PK_FLOAT, &v);
	if (rc == 0)
		v->u.f = f;
	return rc;
}

int sf_pkd_op_binfloat(struct pk_dec *d)
{
	unsigned char b[8];
	struct sf_pk *v;
	uint64_t u = 0;
	double f;
	int rc = sf_pkd_get_bytes(d, b, 8);

	if (rc < 0)
		return rc;
	for (int i = 0; i < 8; i++)
		u = (u << 8) | b[i]; /* big-endian */
	memcpy(&f, &u, sizeof(f));
	rc = sf_pkd_push_new(d, SF_PK_FLOAT, &v);
	if (rc == 0)
		v->u.f = f;
	return rc;
}

/* ------------------------------------------------------------------ */
/* strings and bytes                                                   */

/* Strict UTF-8: no overlong forms, no surrogates, <= U+10FFFF. With
 * nul_ok false a NUL byte fails too. */
static bool utf8_ok(const unsigned char *s, size_t n, bool nul_ok)
{
	size_t i = 0;

	while (i < n) {
		unsigned c = s[i];
		if (c < 0x80) {
			if (c == 0 && !nul_ok)
				return false;
			i++;
			continue;
		}
		size_t k;
		unsigned cp, min;
		if (c >= 0xc2 && c <= 0xdf) {
			k = 1; cp = c & 0x1f; min = 0x80;
		} else if (c >= 0xe0 && c <= 0xef) {
			k = 2; cp = c & 0x0f; min = 0x800;
		} else if (c >= 0xf0 && c <= 0xf4) {
			k = 3; cp = c & 0x07; min = 0x10000;
		} else {
			return false;
		}
		if (n - i <= k)
			return false;
		for (size_t j = 1; j <= k; j++) {
			if ((s[i + j] & 0xc0) != 0x80)
				return false;
			cp = (cp << 6) | (s[i + j] & 0x3f);
		}
		if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
			return false;
		i += k + 1;
	}
	return true;
}

/* Push a STR that takes ownership of s (len bytes + NUL, already
 * charged to max_bytes). NUL characters are allowed inside: protocol 0-2
 * pickles carry bytes (numpy arrays among them) as latin-1 strs. */
static int push_str_owned(struct pk_dec *d, char *s, size_t len)
{
	struct sf_pk *v;
	int rc;

	if (!utf8_ok((const unsigned char *)s, len, true)) {
		free(s);
		return sf_pkd_fail(d, -SF_EFORMAT, "string is not valid UTF-8");
	}
	rc = sf_pkd_push_new(d, SF_PK_STR, &v);
	if (rc < 0) {
		free(s);
		return rc;
	}
	v->u.str.s = s;
	v->u.str.len = len;
	return 0;
}

/* BINUNICODE, SHORT_BINUNICODE, BINUNICODE8: n bytes of UTF-8. */
int sf_pkd_op_binunicode(struct pk_dec *d, uint64_t n)
{
	char *s;
	int rc;

	if (n > d->in->size || d->pos > d->in->size - n)
		return sf_pkd_truncated(d);
	if (n >= SIZE_MAX)
		return sf_pkd_fail(d, -SF_ETOOBIG, "string too long");
	rc = sf_pkd_charge(d, n + 1);
	if (rc < 0)
		return rc;
	s = malloc((size_t)n + 1);
	if (!s)
		return sf_pkd_fail(d, -ENOMEM, "out of memory");
	rc = sf_pkd_get_bytes(d, s, (size_t)n);
	if (rc < 0) {
		free(s);
		return rc;
	}
	s[n] = 0;
	/* Python decodes with surrogatepass, which accepts lone surrogates;
	 * a STR is UTF-8, so push_str_owned refuses them. */
	return push_str_owned(d, s, (size_t)n);
}

static size_t utf8_put(char *out, uint32_t cp)
{
	if (cp < 0x80) {
		out[0] = (char)cp;
		return 1;
	}
	if (cp < 0x800) {
		out[0] = (char)(0xc0 | (cp >> 6));
		out[1] = (char)(0x80 | (cp & 0x3f));
		return 2;
	}
	if (cp < 0x10000) {
		out[0] = (char)(0xe0 | (cp >> 12));
		out[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
		out[2] = (char)(0x80 | (cp & 0x3f));
		return 3;
	}
	out[0] = (char)(0xf0 | (cp >> 18));
	out[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
	out[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
	out[3] = (char)(0x80 | (cp & 0x3f));
	return 4;
}

static int hexval(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

/* The max_bytes left, as a line cap. */
static size_t bytes_left(const struct pk_dec *d)
{
	uint64_t left = d->o->max_bytes - d->doc->bytes;

	return left > SIZE_MAX / 4 ? SIZE_MAX / 4 : (size_t)left;
}

/* UNICODE: a raw-unicode-escape line. Every byte is its own code point
 * (latin-1) except \uXXXX and \UXXXXXXXX; the result must be valid
 * UTF-8 (no surrogates) without NUL. */
int sf_pkd_op_unicode(struct pk_dec *d)
{
	char *s;
	size_t n = 0;
	int rc = sf_pkd_get_line(d, bytes_left(d));

	if (rc < 0)
		return rc;
	if (d->line_len > (SIZE_MAX - 1) / 2)
		return sf_pkd_fail(d, -SF_ETOOBIG, "string too long");
	/* Each input byte gives at most 2 bytes of UTF-8 (\uXXXX: 6 -> 3,
	 * \UXXXXXXXX: 10 -> 4). */
	s = malloc(d->line_len * 2 + 1);
	if (!s)
		return sf_pkd_fail(d, -ENOMEM, "out of memory");
	for (size_t i = 0; i < d->line_len;) {
		unsigned char c = (unsigned char)d->line[i];
		size_t k = 0;
		if (c == '\\' && i + 1 < d->line_len &&
		    (d->line[i + 1] == 'u' || d->line[i + 1] == 'U'))
			k = d->line[i + 1] == 'u' ? 4 : 8;
		if (!k) {
			n += utf8_put(s + n, c);
			i++;
			continue;
		}
		if (d->line_len - i - 2 < k) {
			free(s);
			return sf_pkd_fail(d, -SF_EFORMAT, "truncated \\u escape");
		}
		uint32_t cp = 0;
		for (size_t j = 0; j < k; j++) {
			int h = hexval(d->line[i + 2 + j]);
			if (h < 0) {
				free(s);
				return sf_pkd_fail(d, -SF_EFORMAT, "malformed \\u escape");
			}
			cp = (cp << 4) | (uint32_t)h;
			if (cp > 0x10ffff) {
				free(s);
				return sf_pkd_fail(d, -SF_EFORMAT, "\\U escape beyond U+10FFFF");
			}
		}
		if (cp >= 0xd800 && cp <= 0xdfff) {
			free(s);
			return sf_pkd_fail(d, -SF_EFORMAT, "surrogate in a string");
		}
		n += utf8_put(s + n, cp);
		i += 2 + k;
	}
	s[n] = 0;
	rc = sf_pkd_charge(d, (uint64_t)n + 1);
	if (rc < 0) {
		free(s);
		return rc;
	}
	return push_str_owned(d, s, n);
}

/* A BYTES node for [off, off+n) of the input; pos is already past it.
 * data: the n bytes when already copied (ownership passes), else NULL
 * and they are read here when n <= SF_PK_BYTES_COPY. escaped: data is an
 * escaped STRING's decoded value, not the input's bytes at off. */
static int push_bytes(struct pk_dec *d, uint64_t off, uint64_t n,
		      unsigned char *data, bool escaped)
{
	struct sf_pk *v;
	int rc;

	if (!data && n <= SF_PK_BYTES_COPY) {
		rc = sf_pkd_charge(d, n ? n : 1);
		if (rc < 0)
			return rc;
		data = malloc(n ? (size_t)n : 1);
		if (!data)
			return sf_pkd_fail(d, -ENOMEM, "out of memory");
		rc = n ? sf_input_read(d->in, data, (size_t)n, off) : 0;
		if (rc < 0) {
			free(data);
			return sf_pkd_in_error(d, rc);
		}
	}
	rc = sf_pkd_push_new(d, SF_PK_BYTES, &v);
	if (rc < 0) {
		free(data);
		return rc;
	}
	v->u.bytes.off = off;
	v->u.bytes.len = n;
	v->u.bytes.data = data;
	v->u.bytes.escaped = escaped;
	return 0;
}

/* BINBYTES, SHORT_BINBYTES, BINBYTES8, BYTEARRAY8, BINSTRING,
 * SHORT_BINSTRING: n raw bytes, recorded, not read (unless short). */
int sf_pkd_op_binbytes(struct pk_dec *d, uint64_t n)
{
	uint64_t off = d->pos;
	int rc = sf_pkd_skip(d, n);

	if (rc < 0)
		return rc;
	return push_bytes(d, off, n, NULL, false);
}

/* STRING: a quoted Python 2 str repr, decoded like codecs.escape_decode.
 * Without a backslash the bytes are the input's at off; with escapes
 * (data differs from the input) the value is only in data, which is why
 * such strings are refused above SF_PK_BYTES_COPY. */
int sf_pkd_op_string(struct pk_dec *d)
{
	uint64_t start = d->pos;
	unsigned char *out;
	const char *s;
	size_t len, n = 0;
	int rc = sf_pkd_get_line(d, bytes_left(d));

	if (rc < 0)
		return rc;
	s = d->line;
	len = d->line_len;
	if (len < 2 || s[0] != s[len - 1] || (s[0] != '\'' && s[0] != '"'))
		return sf_pkd_fail(d, -SF_EFORMAT, "the STRING argument must be quoted");
	s++;
	len -= 2;
	if (!memchr(s, '\\', len))
		return push_bytes(d, start + 1, len, NULL, false);
	if (len > SF_PK_BYTES_COPY)
		return sf_pkd_fail(d, -SF_ETOOBIG, "escaped STRING longer than %d bytes",
			    SF_PK_BYTES_COPY);
	out = malloc(len ? len : 1);
	if (!out)
		return sf_pkd_fail(d, -ENOMEM, "out of memory");
	for (size_t i = 0; i < len; i++) {
		if (s[i] != '\\') {
			out[n++] = (unsigned char)s[i];
			continue;
		}
		if (++i == len) {
			free(out);
			return sf_pkd_fail(d, -SF_EFORMAT, "trailing backslash in STRING");
		}
		char c = s[i];
		switch (c) {
		case '\n': break;
		case '\\': out[n++] = '\\'; break;
		case '\'': out[n++] = '\''; break;
		case '"': out[n++] = '"'; break;
		case 'a': out[n++] = 7; break;
		case 'b': out[n++] = 8; break;
		case 'f': out[n++] = 12; break;
		case 'n': out[n++] = 10; break;
		case 'r': out[n++] = 13; break;
		case 't': out[n++] = 9; break;
		case 'v': out[n++] = 11; break;
		case 'x': {
			int h1 = i + 1 < len ? hexval(s[i + 1]) : -1;
			int h2 = i + 2 < len ? hexval(s[i + 2]) : -1;
			if (h1 < 0 || h2 < 0) {
				free(out);
				return sf_pkd_fail(d, -SF_EFORMAT, "malformed \\x escape");
			}
			out[n++] = (unsigned char)(h1 * 16 + h2);
			i += 2;
			break;
		}
		default:
			if (c >= '0' && c <= '7') {
				unsigned v = (unsigned)(c - '0');
				for (int j = 0; j < 2 && i + 1 < len &&
				     s[i + 1] >= '0' && s[i + 1] <= '7'; j++)
					v = v * 8 + (unsigned)(s[++i] - '0');
				out[n++] = (unsigned char)v;
			} else { /* unknown escapes stay as they are */
				out[n++] = '\\';
				out[n++] = (unsigned char)c;
			}
		}
	}
	rc = sf_pkd_charge(d, n ? n : 1);
	if (rc < 0) {
		free(out);
		return rc;
	}
	return push_bytes(d, start + 1, n, out, true);
}

/* ------------------------------------------------------------------ */
/* globals and persistent ids                                          */

static bool allowed(const struct pk_dec *d, const char *m, const char *n)
{
	for (size_t i = 0; i < d->o->nallow; i++) {
		const struct sf_pk_global *g = &d->o->allow[i];
		if (g->module && g->name && !strcmp(g->module, m) &&
		    !strcmp(g->name, n))
			return true;
	}
	return false;
}

/* Push GLOBAL module.name (ml, nl bytes), refused unless allowlisted. */
static int push_global(struct pk_dec *d, const char *m, size_t ml,
		       const char *nm, size_t nl)
{
	char sm[96], sn[96];
	struct sf_pk *v;
	char *buf;
	int rc;

	if (!utf8_ok((const unsigned char *)m, ml, false) ||
	    !utf8_ok((const unsigned char *)nm, nl, false))
		return sf_pkd_fail(d, -SF_EFORMAT, "global name is not valid UTF-8");
	rc = sf_pkd_charge(d, (uint64_t)ml + nl + 2);
	if (rc < 0)
		return rc;
	buf = malloc(ml + nl + 2);
	if (!buf)
		return sf_pkd_fail(d, -ENOMEM, "out of memory");
	memcpy(buf, m, ml);
	buf[ml] = 0;
	memcpy(buf + ml + 1, nm, nl);
	buf[ml + 1 + nl] = 0;
	if (!allowed(d, buf, buf + ml + 1)) {
		sf_pkd_sanitize(sm, sizeof(sm), m, ml);
		sf_pkd_sanitize(sn, sizeof(sn), nm, nl);
		free(buf);
		return sf_pkd_fail(d, -SF_EREFUSED, "global %s.%s is not allowed", sm, sn);
	}
	rc = sf_pkd_push_new(d, SF_PK_GLOBAL, &v);
	if (rc < 0) {
		free(buf);
		return rc;
	}
	v->u.global.module = buf;
	v->u.global.name = buf + ml + 1;
	return 0;
}

int sf_pkd_op_global(struct pk_dec *d)
{
	char *m;
	size_t ml;
	int rc = sf_pkd_get_line(d, PK_LINE_MAX);

	if (rc < 0)
		return rc;
	ml = d->line_len;
	m = malloc(ml + 1);
	if (!m)
		return sf_pkd_fail(d, -ENOMEM, "out of memory");
	memcpy(m, d->line, ml + 1);
	rc = sf_pkd_get_line(d, PK_LINE_MAX);
	if (rc == 0)
		rc = push_global(d, m, ml, d->line, d->line_len);
	free(m);
	return rc;
}

int sf_pkd_op_stack_global(struct pk_dec *d)
{
	struct sf_pk *m, *n;
	int rc;

	if ((rc = sf_pkd_pop(d, &n)) < 0 || (rc = sf_pkd_pop(d, &m)) < 0)
		return rc;
	if (m->kind != SF_PK_STR || n->kind != SF_PK_STR)
		return sf_pkd_fail(d, -SF_EFORMAT, "module and name must be strings");
	return push_global(d, m->u.str.s, m->u.str.len, n->u.str.s, n->u.str.len);
}

int sf_pkd_push_persid(struct pk_dec *d, struct sf_pk *id)
{
	struct sf_pk *v;
	int rc = sf_pkd_push_new(d, SF_PK_PERSID, &v);

	if (rc == 0)
		v->u.persid = id;
	return rc;
}

int sf_pkd_op_persid_text(struct pk_dec *d)
{
	struct sf_pk *id;
	char *s;
	int rc = sf_pkd_get_line(d, PK_LINE_MAX);

	if (rc < 0)
		return rc;
	for (size_t i = 0; i < d->line_len; i++)
		if ((unsigned char)d->line[i] >= 0x80)
			return sf_pkd_fail(d, -SF_EFORMAT, "persistent id is not ASCII");
	rc = sf_pkd_charge(d, d->line_len + 1);
	if (rc < 0)
		return rc;
	s = malloc(d->line_len + 1);
	if (!s)
		return sf_pkd_fail(d, -ENOMEM, "out of memory");
	memcpy(s, d->line, d->line_len + 1);
	rc = push_str_owned(d, s, d->line_len);
	if (rc < 0 || (rc = sf_pkd_pop(d, &id)) < 0)
		return rc;
	return sf_pkd_push_persid(d, id);
}
