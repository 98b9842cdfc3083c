/*
 * sf_where.c - one-line messages that name where a problem is: "KIND NAME:
 * shard I: message", for the model's validator, the coverage check and
 * every codec and format adapter (sf_model.h).
 *
 * Invariant: a message is one printable line, bounded by the caller's
 * buffer: names are quoted with the log's escapes (sf_log_escape with
 * SF_ESC_QUOTE) and cut at SF_QNAME_MAX input bytes, never inside a UTF-8
 * sequence; control bytes of the message itself become '?' (the log
 * escapes what else a line must not hold).
 *
 * sf_quote_name is the one quoting of names: every message and log line
 * that names an entry, a file or a key from input uses it.
 */
#include "sf_model.h"

#include "sf_log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

const char *sf_quote_name(char *out, const char *s, size_t len)
{
	size_t n = 0, used = 0;

	out[n++] = '"';
	/* 4 output bytes per input byte at most: the cap never binds first */
	n += sf_log_escape(out + n, 4 * SF_QNAME_MAX + 1, s ? s : "",
			   s ? len : 0, SF_QNAME_MAX, SF_ESC_QUOTE, &used);
	out[n++] = '"';
	if (s && used < len) {
		memcpy(out + n, "...", 3);
		n += 3;
	}
	out[n] = '\0';
	return out;
}

const char *sf_quote_str(char *out, const char *s)
{
	return sf_quote_name(out, s, s ? strlen(s) : 0);
}

void sf_where_init(struct sf_where *w, char *err, size_t errlen)
{
	memset(w, 0, sizeof(*w));
	w->shard = -1;
	w->err = err;
	w->errlen = errlen;
	if (err && errlen)
		err[0] = '\0';
}

void sf_where_set(struct sf_where *w, const char *kind, const char *name,
		  size_t len)
{
	w->kind = kind;
	w->shard = -1;
	sf_quote_name(w->qname, name, len);
}

/* Advance *n by the result r of an snprintf into a buffer of size cap. */
static void advance(size_t *n, int r, size_t cap)
{
	if (r < 0)
		return;
	*n += (size_t)r;
	if (*n >= cap)
		*n = cap - 1;
}

/* Write "kind NAME: shard I: <message>" into w->err (one line, control
 * bytes replaced by '?', what else the log escapes escaped: the message
 * also reaches xattrs and shardctl's output) and return code. */
int sf_fail(const struct sf_where *w, int code, const char *fmt, ...)
{
	char msg[2048];
	int m;

	if (!w->err || w->errlen == 0)
		return code;
	size_t n = 0;
	w->err[0] = '\0';
	if (w->kind)
		advance(&n, snprintf(w->err + n, w->errlen - n, "%s %s: ",
				     w->kind, w->qname), w->errlen);
	if (w->shard >= 0)
		advance(&n, snprintf(w->err + n, w->errlen - n, "shard %ld: ",
				     w->shard), w->errlen);
	va_list ap;
	va_start(ap, fmt);
	m = vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (m < 0)
		m = 0;
	else if ((size_t)m >= sizeof(msg))
		m = (int)sf_utf8_cut(msg, sizeof(msg) - 1);
	/* Text quoted from the input (jansson's "near '...'") may hold
	 * control bytes: keep the message one printable line. */
	for (int i = 0; i < m; i++)
		if ((unsigned char)msg[i] < 0x20 || msg[i] == 0x7f)
			msg[i] = '?';
	sf_log_escape(w->err + n, w->errlen - n, msg, (size_t)m, (size_t)m, 0,
		      NULL);
	for (char *p = w->err; *p; p++) /* the kind's own text, too */
		if ((unsigned char)*p < 0x20 || *p == 0x7f)
			*p = '?';
	return code;
}

