/*
 * sf_pickle_dec.c - the pickle reader's machinery (see sf_pickle.c for the
 * reader as a whole): opcode names and error messages, the document's
 * nodes and its byte account, the windowed input, the stack with its
 * marks, and the memo.
 *
 * Invariants: the input is read only through sf_input_read(), PK_WINDOW
 * bytes at a time (a large copy straight into its destination); skip()
 * checks a range lies inside the input without reading it; the stack
 * holds at most max_depth values and max_depth marks, and no opcode sees
 * below the innermost mark (sf_pkd_fence); memo indices are below
 * max_memo; every message is one printable line.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sf_array.h"
#include "sf_error.h"
#include "sf_pickle_dec.h"

/* ------------------------------------------------------------------ */
/* opcode names                                                        */

const char *sf_pkd_op_name(unsigned char op)
{
	switch (op) {
	case '(': return "MARK";
	case '.': return "STOP";
	case '0': return "POP";
	case '1': return "POP_MARK";
	case '2': return "DUP";
	case 'F': return "FLOAT";
	case 'I': return "INT";
	case 'J': return "BININT";
	case 'K': return "BININT1";
	case 'L': return "LONG";
	case 'M': return "BININT2";
	case 'N': return "NONE";
	case 'P': return "PERSID";
	case 'Q': return "BINPERSID";
	case 'R': return "REDUCE";
	case 'S': return "STRING";
	case 'T': return "BINSTRING";
	case 'U': return "SHORT_BINSTRING";
	case 'V': return "UNICODE";
	case 'X': return "BINUNICODE";
	case 'a': return "APPEND";
	case 'b': return "BUILD";
	case 'c': return "GLOBAL";
	case 'd': return "DICT";
	case '}': return "EMPTY_DICT";
	case 'e': return "APPENDS";
	case 'g': return "GET";
	case 'h': return "BINGET";
	case 'i': return "INST";
	case 'j': return "LONG_BINGET";
	case 'l': return "LIST";
	case ']': return "EMPTY_LIST";
	case 'o': return "OBJ";
	case 'p': return "PUT";
	case 'q': return "BINPUT";
	case 'r': return "LONG_BINPUT";
	case 's': return "SETITEM";
	case 't': return "TUPLE";
	case ')': return "EMPTY_TUPLE";
	case 'u': return "SETITEMS";
	case 'G': return "BINFLOAT";
	case 0x80: return "PROTO";
	case 0x81: return "NEWOBJ";
	case 0x82: return "EXT1";
	case 0x83: return "EXT2";
	case 0x84: return "EXT4";
	case 0x85: return "TUPLE1";
	case 0x86: return "TUPLE2";
	case 0x87: return "TUPLE3";
	case 0x88: return "NEWTRUE";
	case 0x89: return "NEWFALSE";
	case 0x8a: return "LONG1";
	case 0x8b: return "LONG4";
	case 'B': return "BINBYTES";
	case 'C': return "SHORT_BINBYTES";
	case 0x8c: return "SHORT_BINUNICODE";
	case 0x8d: return "BINUNICODE8";
	case 0x8e: return "BINBYTES8";
	case 0x8f: return "EMPTY_SET";
	case 0x90: return "ADDITEMS";
	case 0x91: return "FROZENSET";
	case 0x92: return "NEWOBJ_EX";
	case 0x93: return "STACK_GLOBAL";
	case 0x94: return "MEMOIZE";
	case 0x95: return "FRAME";
	case 0x96: return "BYTEARRAY8";
	case 0x97: return "NEXT_BUFFER";
	case 0x98: return "READONLY_BUFFER";
	default: return NULL;
	}
}

/* ------------------------------------------------------------------ */
/* errors                                                              */

static int vfail(struct pk_dec *d, int rc, const char *fmt, va_list ap)
{
	char msg[256];
	const char *name = sf_pkd_op_name(d->op);

	if (!d->err || !d->errlen)
		return rc;
	vsnprintf(msg, sizeof(msg), fmt, ap);
	if (!d->have_op)
		snprintf(d->err, d->errlen, "pickle: at offset %" PRIu64 ": %s",
			 d->op_off, msg);
	else if (name)
		snprintf(d->err, d->errlen, "pickle: %s at offset %" PRIu64 ": %s",
			 name, d->op_off, msg);
	else
		snprintf(d->err, d->errlen,
			 "pickle: opcode 0x%02x at offset %" PRIu64 ": %s",
			 d->op, d->op_off, msg);
	/* Names from the input are sanitized where quoted; this keeps the
	 * whole message one printable line whatever slipped through. */
	for (char *p = d->err; *p; p++)
		if ((unsigned char)*p < 0x20 || (unsigned char)*p >= 0x7f)
			*p = '?';
	return rc;
}

int sf_pkd_fail(struct pk_dec *d, int rc, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	rc = vfail(d, rc, fmt, ap);
	va_end(ap);
	return rc;
}

/* A printable copy of s[0..len) for a message: at most 80 bytes, every
 * byte outside 0x20..0x7e as '?'. */
void sf_pkd_sanitize(char *out, size_t outlen, const char *s, size_t len)
{
	size_t n = 0;

	for (size_t i = 0; i < len && n + 4 < outlen && i < 80; i++, n++)
		out[n] = ((unsigned char)s[i] < 0x20 ||
			  (unsigned char)s[i] >= 0x7f) ? '?' : s[i];
	if (len > 80 && n + 4 < outlen) {
		memcpy(out + n, "...", 3);
		n += 3;
	}
	out[n] = 0;
}

/* ------------------------------------------------------------------ */
/* the document: nodes and accounted allocations                       */

int sf_pkd_charge(struct pk_dec *d, uint64_t n)
{
	if (n > d->o->max_bytes || d->doc->bytes > d->o->max_bytes - n)
		return sf_pkd_fail(d, -SF_ETOOBIG,
			    "the document would exceed %" PRIu64 " bytes (max_bytes)",
			    d->o->max_bytes);
	d->doc->bytes += n;
	return 0;
}

int sf_pkd_new_node(struct pk_dec *d, enum sf_pk_kind kind, struct sf_pk **out)
{
	struct sf_pickle *doc = d->doc;
	struct pk_node *n;
	int rc;

	if (doc->nodes >= d->o->max_nodes)
		return sf_pkd_fail(d, -SF_ETOOBIG, "more than %" PRIu64 " values (max_nodes)",
			    d->o->max_nodes);
	if (doc->nblocks == 0 || doc->used == pk_block_cap(doc->nblocks - 1)) {
		rc = sf_array_grow(&doc->blocks, doc->nblocks, &doc->blocks_cap,
				   sizeof(*doc->blocks), 16, 0);
		if (rc < 0)
			return sf_pkd_fail(d, -ENOMEM, "out of memory");
		/* Not zeroed here: a node is zeroed when handed out below, so
		 * a small document does not clear a whole block (that memset
		 * was most of a small open under the fuzzers). Only the used
		 * nodes of a block are ever read (sf_pickle_free too). */
		doc->blocks[doc->nblocks] = malloc(pk_block_cap(doc->nblocks) *
						   sizeof(struct pk_node));
		if (!doc->blocks[doc->nblocks])
			return sf_pkd_fail(d, -ENOMEM, "out of memory");
		doc->nblocks++;
		doc->used = 0;
	}
	n = &doc->blocks[doc->nblocks - 1][doc->used++];
	*n = (struct pk_node){ 0 };
	doc->nodes++;
	n->pk.kind = kind;
	*out = &n->pk;
	return 0;
}

/* Room for `want` elements in a TUPLE/LIST (seq.v) or DICT (k and v),
 * charged to max_bytes. */
int sf_pkd_seq_reserve(struct pk_dec *d, struct sf_pk *v, size_t want)
{
	struct pk_node *n = node_of(v);
	size_t old = n->cap < n->cap2 || v->kind != SF_PK_DICT ? n->cap : n->cap2;
	size_t now;
	int rc;

	if (want == 0 || want <= old)
		return 0;
	if (v->kind == SF_PK_DICT) {
		rc = sf_array_grow(&v->u.dict.k, want - 1, &n->cap,
				   sizeof(struct sf_pk *), 4, 0);
		if (rc == 0)
			rc = sf_array_grow(&v->u.dict.v, want - 1, &n->cap2,
					   sizeof(struct sf_pk *), 4, 0);
		if (rc < 0)
			return sf_pkd_fail(d, -ENOMEM, "out of memory");
		now = n->cap < n->cap2 ? n->cap : n->cap2;
		return sf_pkd_charge(d, (uint64_t)(now - old) * 2 * sizeof(void *));
	}
	rc = sf_array_grow(&v->u.seq.v, want - 1, &n->cap, sizeof(struct sf_pk *),
			   4, 0);
	if (rc < 0)
		return sf_pkd_fail(d, -ENOMEM, "out of memory");
	return sf_pkd_charge(d, (uint64_t)(n->cap - old) * sizeof(void *));
}

/* ------------------------------------------------------------------ */
/* input                                                               */

int sf_pkd_truncated(struct pk_dec *d)
{
	return sf_pkd_fail(d, -SF_EFORMAT, "truncated (input ends at %" PRIu64 ")",
		    d->in->size);
}

int sf_pkd_in_error(struct pk_dec *d, int rc)
{
	if (rc == -SF_ESHORT)
		return sf_pkd_fail(d, -SF_EFORMAT, "the input is shorter than it claims");
	return sf_pkd_fail(d, rc, "read error: %s", sf_strerror(rc));
}

/* Make win hold the byte at pos. */
static int fill(struct pk_dec *d)
{
	uint64_t left;
	size_t n;
	int rc;

	if (d->pos >= d->in->size)
		return sf_pkd_truncated(d);
	left = d->in->size - d->pos;
	n = left < PK_WINDOW ? (size_t)left : PK_WINDOW;
	rc = sf_input_read(d->in, d->win, n, d->pos);
	if (rc < 0) {
		d->win_len = 0;
		return sf_pkd_in_error(d, rc);
	}
	d->win_off = d->pos;
	d->win_len = n;
	return 0;
}

int sf_pkd_get_byte(struct pk_dec *d, unsigned char *b)
{
	int rc;

	if (d->pos < d->win_off || d->pos - d->win_off >= d->win_len) {
		rc = fill(d);
		if (rc < 0)
			return rc;
	}
	*b = d->win[d->pos - d->win_off];
	d->pos++;
	return 0;
}

/* Copy n bytes at pos into buf and advance. */
int sf_pkd_get_bytes(struct pk_dec *d, void *buf, size_t n)
{
	unsigned char *out = buf;
	int rc;

	if (n > d->in->size || d->pos > d->in->size - n)
		return sf_pkd_truncated(d);
	while (n) {
		if (d->pos < d->win_off || d->pos - d->win_off >= d->win_len) {
			if (n >= PK_WINDOW) { /* large: straight from the input */
				rc = sf_input_read(d->in, out, n, d->pos);
				if (rc < 0)
					return sf_pkd_in_error(d, rc);
				d->pos += n;
				return 0;
			}
			rc = fill(d);
			if (rc < 0)
				return rc;
		}
		size_t at = (size_t)(d->pos - d->win_off);
		size_t k = d->win_len - at;
		if (k > n)
			k = n;
		memcpy(out, d->win + at, k);
		out += k;
		d->pos += k;
		n -= k;
	}
	return 0;
}

/* Advance over n bytes that must lie inside the input; nothing is read. */
int sf_pkd_skip(struct pk_dec *d, uint64_t n)
{
	if (n > d->in->size || d->pos > d->in->size - n)
		return sf_pkd_truncated(d);
	d->pos += n;
	return 0;
}

int sf_pkd_get_le(struct pk_dec *d, size_t n, uint64_t *v)
{
	unsigned char b[8];
	int rc = sf_pkd_get_bytes(d, b, n);

	if (rc < 0)
		return rc;
	*v = 0;
	while (n--)
		*v = (*v << 8) | b[n];
	return 0;
}

/* A text line up to '\n' into d->line (NUL-terminated, no newline),
 * at most max bytes. */
int sf_pkd_get_line(struct pk_dec *d, size_t max)
{
	unsigned char c;
	int rc;

	d->line_len = 0;
	for (;;) {
		rc = sf_pkd_get_byte(d, &c);
		if (rc < 0)
			return rc;
		if (c == '\n')
			break;
		if (d->line_len >= max)
			return sf_pkd_fail(d, max == PK_LINE_MAX ? -SF_EFORMAT : -SF_ETOOBIG,
				    "text argument longer than %zu bytes%s", max,
				    max == PK_LINE_MAX ? "" : " (max_bytes)");
		rc = sf_array_grow(&d->line, d->line_len + 1, &d->line_cap, 1,
				   64, 0);
		if (rc < 0)
			return sf_pkd_fail(d, -ENOMEM, "out of memory");
		d->line[d->line_len++] = (char)c;
	}
	if (!d->line) {
		rc = sf_array_grow(&d->line, 0, &d->line_cap, 1, 64, 0);
		if (rc < 0)
			return sf_pkd_fail(d, -ENOMEM, "out of memory");
	}
	d->line[d->line_len] = 0;
	return 0;
}

/* ------------------------------------------------------------------ */
/* the stack, marks and memo                                           */

size_t sf_pkd_fence(const struct pk_dec *d)
{
	return d->mn ? d->marks[d->mn - 1] : 0;
}

int sf_pkd_push(struct pk_dec *d, struct sf_pk *v)
{
	int rc;

	if (d->sn >= d->o->max_depth)
		return sf_pkd_fail(d, -SF_ETOOBIG, "stack deeper than %" PRIu32 " (max_depth)",
			    d->o->max_depth);
	rc = sf_array_grow(&d->stack, d->sn, &d->scap, sizeof(*d->stack), 64, 0);
	if (rc < 0)
		return sf_pkd_fail(d, -ENOMEM, "out of memory");
	d->stack[d->sn++] = v;
	return 0;
}

int sf_pkd_underflow(struct pk_dec *d)
{
	return sf_pkd_fail(d, -SF_EFORMAT, "stack underflow");
}

int sf_pkd_pop(struct pk_dec *d, struct sf_pk **v)
{
	if (d->sn <= sf_pkd_fence(d))
		return sf_pkd_underflow(d);
	*v = d->stack[--d->sn];
	return 0;
}

int sf_pkd_top(struct pk_dec *d, struct sf_pk **v)
{
	if (d->sn <= sf_pkd_fence(d))
		return sf_pkd_underflow(d);
	*v = d->stack[d->sn - 1];
	return 0;
}

/* Close the innermost MARK: *start is the index of the first value
 * above it (values stay on the stack). */
int sf_pkd_pop_mark(struct pk_dec *d, size_t *start)
{
	if (!d->mn)
		return sf_pkd_fail(d, -SF_EFORMAT, "no MARK to close");
	*start = d->marks[--d->mn];
	return 0;
}

int sf_pkd_memo_put(struct pk_dec *d, uint64_t idx)
{
	struct sf_pk *v;
	int rc = sf_pkd_top(d, &v);

	if (rc < 0)
		return rc;
	if (idx >= d->o->max_memo)
		return sf_pkd_fail(d, -SF_ETOOBIG, "memo index %" PRIu64 " not below %" PRIu32
			    " (max_memo)", idx, d->o->max_memo);
	while (d->memo_len <= idx) {
		rc = sf_array_grow(&d->memo, d->memo_len, &d->memo_cap,
				   sizeof(*d->memo), 64, d->o->max_memo);
		if (rc < 0)
			return sf_pkd_fail(d, rc == -SF_ETOOBIG ? rc : -ENOMEM,
				    "memo of %" PRIu64 " entries", idx + 1);
		/* Fill the whole new capacity up to idx in one go. */
		size_t upto = (size_t)idx < d->memo_cap ? (size_t)idx + 1 : d->memo_cap;
		memset(d->memo + d->memo_len, 0,
		       (upto - d->memo_len) * sizeof(*d->memo));
		d->memo_len = upto;
	}
	if (!d->memo[idx])
		d->memo_count++;
	d->memo[idx] = v;
	return 0;
}

int sf_pkd_memo_get(struct pk_dec *d, uint64_t idx)
{
	if (idx >= d->memo_len || !d->memo[idx])
		return sf_pkd_fail(d, -SF_EFORMAT, "memo entry %" PRIu64 " is not defined",
			    idx);
	return sf_pkd_push(d, d->memo[idx]);
}

