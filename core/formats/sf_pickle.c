/*
 * sf_pickle.c - the pickle reader that never executes anything
 * (sf_pickle.h).
 *
 * A stack machine over the opcodes, building sf_pk nodes instead of
 * objects: a global becomes a GLOBAL node (on the caller's allowlist, or
 * the load is refused), a call or BUILD an OBJ node recording what would
 * have been called with what, a persistent id a PERSID node. Nothing is
 * imported, called, or looked up outside the allowlist.
 *
 * Invariants:
 *  - every node lives on p->nodes and is freed with the document; a node
 *    owns its arrays and strings; nodes may be shared (memo) and form
 *    cycles, never freed twice (freed by walking p->nodes, not the graph);
 *  - every count, length and depth is capped before it is used (struct
 *    sf_pickle_opts); arithmetic on lengths from the input is checked
 *    against what is left of the input first;
 *  - input bytes are read only through a window filled by sf_input_read;
 *    a long BYTES value is skipped, never read.
 * The UNICODE text opcode is read for plain ASCII only, and STRING only
 * without escapes; anything else there is refused (no writer of the
 * formats shardfs reads uses them).
 */
#include "sf_pickle.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sf_array.h"
#include "sf_error.h"

#define WIN 65536                   /* bytes of the read window */
#define MAX_LINE 4096               /* a text opcode's argument */
#define MAX_STACK (1u << 22)        /* values on the stack */
#define DEF_MAX_NODES (1u << 22)
#define DEF_MAX_BYTES (256ull << 20)
#define DEF_MAX_DEPTH 4096u
#define DEF_MAX_MEMO (1u << 22)

struct sf_pickle {
	struct sf_pk **nodes;       /* every node (owned) */
	size_t nnodes, capnodes;
	const struct sf_pk *root;
	uint64_t end;               /* offset after STOP */
};

struct ld {
	const struct sf_input *in;
	const struct sf_pickle_opts *o;
	struct sf_pickle *p;
	uint64_t pos;               /* next byte to decode */
	unsigned char win[WIN];
	uint64_t wstart;            /* input offset of win[0] */
	size_t wlen;
	struct sf_pk **st;          /* the stack */
	size_t nst, capst;
	size_t *marks;              /* stack heights at MARK */
	size_t nmarks, capmarks;
	struct sf_pk **memo;        /* dense by index; NULL: unset */
	size_t capmemo;
	uint64_t nmemo;             /* entries set (MEMOIZE's next index) */
	uint64_t bytes;             /* copied so far */
	uint64_t op_at;             /* offset of the opcode being decoded */
	int node_rc;                /* why the last node() failed */
	char *err;
	size_t errlen;
};

static int fail(struct ld *l, int code, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static int fail(struct ld *l, int code, const char *fmt, ...)
{
	va_list ap;
	int n = 0;

	if (l->err && l->errlen) {
		n = snprintf(l->err, l->errlen, "pickle at byte %llu: ",
			     (unsigned long long)l->op_at);
		if (n >= 0 && (size_t)n < l->errlen) {
			va_start(ap, fmt);
			vsnprintf(l->err + n, l->errlen - (size_t)n, fmt, ap);
			va_end(ap);
		}
		for (char *s = l->err; *s; s++)
			if ((unsigned char)*s < 0x20 || (unsigned char)*s >= 0x7f)
				*s = '?'; /* one printable ASCII line */
	}
	return code;
}

/* --- input --- */

/* Make [pos, pos+n) (n <= WIN) available in the window. */
static int need(struct ld *l, size_t n, const unsigned char **out)
{
	uint64_t left;

	if (l->pos > l->in->size || n > l->in->size - l->pos)
		return fail(l, -SF_EFORMAT, "truncated (%zu more bytes wanted)", n);
	if (l->pos < l->wstart || l->pos + n > l->wstart + l->wlen) {
		left = l->in->size - l->pos;
		l->wlen = left < WIN ? (size_t)left : WIN;
		l->wstart = l->pos;
		if (sf_input_read(l->in, l->win, l->wlen, l->wstart))
			return fail(l, -EIO, "read error");
	}
	*out = l->win + (l->pos - l->wstart);
	l->pos += n;
	return 0;
}

static int rd_u(struct ld *l, size_t n, uint64_t *v)
{
	const unsigned char *b;
	int rc = need(l, n, &b);

	if (rc)
		return rc;
	*v = 0;
	for (size_t i = n; i-- > 0;)
		*v = *v << 8 | b[i];
	return 0;
}

/* A text argument up to '\n' into buf (NUL-terminated, without '\n'). */
static int rd_line(struct ld *l, char *buf, size_t *len)
{
	for (size_t i = 0; i < MAX_LINE; i++) {
		const unsigned char *b;
		int rc = need(l, 1, &b);

		if (rc)
			return rc;
		if (*b == '\n') {
			buf[i] = '\0';
			*len = i;
			return 0;
		}
		buf[i] = (char)*b;
	}
	return fail(l, -SF_EFORMAT, "text argument longer than %d bytes", MAX_LINE);
}

/* --- nodes --- */

static struct sf_pk *node(struct ld *l, enum sf_pk_kind kind)
{
	struct sf_pk *v;

	if (l->p->nnodes >= l->o->max_nodes) {
		l->node_rc = fail(l, -SF_ETOOBIG, "more than %llu values",
				  (unsigned long long)l->o->max_nodes);
		return NULL;
	}
	if (sf_array_grow(&l->p->nodes, l->p->nnodes, &l->p->capnodes,
			  sizeof(*l->p->nodes), 64, 0)) {
		l->node_rc = fail(l, -ENOMEM, "out of memory");
		return NULL;
	}
	v = calloc(1, sizeof(*v));
	if (!v) {
		l->node_rc = fail(l, -ENOMEM, "out of memory");
		return NULL;
	}
	v->kind = kind;
	l->p->nodes[l->p->nnodes++] = v;
	return v;
}

/* Count n copied bytes against the cap. */
static int charge(struct ld *l, uint64_t n)
{
	if (n > l->o->max_bytes || l->bytes > l->o->max_bytes - n)
		return fail(l, -SF_ETOOBIG, "more than %llu bytes of strings",
			    (unsigned long long)l->o->max_bytes);
	l->bytes += n;
	return 0;
}

/* A copy of n input bytes at the current position (n <= WIN). */
static int copy_in(struct ld *l, size_t n, char **out)
{
	const unsigned char *b;
	int rc = charge(l, n + 1);

	if (!rc)
		rc = need(l, n, &b);
	if (rc)
		return rc;
	*out = malloc(n + 1);
	if (!*out)
		return fail(l, -ENOMEM, "out of memory");
	memcpy(*out, b, n);
	(*out)[n] = '\0';
	return 0;
}

static bool utf8_ok(const unsigned char *s, size_t n)
{
	size_t i = 0;

	while (i < n) {
		unsigned char c = s[i];
		size_t k;
		uint32_t cp;

		if (c == 0)
			return false;
		if (c < 0x80) {
			i++;
			continue;
		}
		if ((c & 0xE0) == 0xC0) {
			k = 1;
			cp = c & 0x1F;
		} else if ((c & 0xF0) == 0xE0) {
			k = 2;
			cp = c & 0x0F;
		} else if ((c & 0xF8) == 0xF0) {
			k = 3;
			cp = c & 0x07;
		} else {
			return false;
		}
		if (i + k >= n)
			return false;
		for (size_t j = 1; j <= k; j++) {
			if ((s[i + j] & 0xC0) != 0x80)
				return false;
			cp = cp << 6 | (s[i + j] & 0x3F);
		}
		if ((k == 1 && cp < 0x80) || (k == 2 && cp < 0x800) ||
		    (k == 3 && cp < 0x10000) || cp > 0x10FFFF ||
		    (cp >= 0xD800 && cp <= 0xDFFF))
			return false;
		i += k + 1;
	}
	return true;
}

/* --- the stack --- */

static int push(struct ld *l, struct sf_pk *v)
{
	if (!v)
		return l->node_rc ? l->node_rc : -ENOMEM; /* node() said why */
	if (l->nst >= MAX_STACK)
		return fail(l, -SF_ETOOBIG, "stack deeper than %u", MAX_STACK);
	if (sf_array_grow(&l->st, l->nst, &l->capst, sizeof(*l->st), 64, 0))
		return fail(l, -ENOMEM, "out of memory");
	l->st[l->nst++] = v;
	return 0;
}

/* The stack's floor: items above the innermost mark are reachable. */
static size_t floor_of(const struct ld *l)
{
	return l->nmarks ? l->marks[l->nmarks - 1] : 0;
}

static int pop(struct ld *l, struct sf_pk **out)
{
	if (l->nst <= floor_of(l))
		return fail(l, -SF_EFORMAT, "stack underflow");
	*out = l->st[--l->nst];
	return 0;
}

static int top(struct ld *l, struct sf_pk **out)
{
	if (l->nst <= floor_of(l))
		return fail(l, -SF_EFORMAT, "stack underflow");
	*out = l->st[l->nst - 1];
	return 0;
}

/* Pop the innermost mark: the items above it are st[*from .. nst). */
static int pop_mark(struct ld *l, size_t *from)
{
	if (!l->nmarks)
		return fail(l, -SF_EFORMAT, "no MARK");
	*from = l->marks[--l->nmarks];
	return 0;
}

/* Append n values to a seq node (TUPLE/LIST). */
static int seq_add(struct ld *l, struct sf_pk *s, struct sf_pk **v, size_t n)
{
	size_t cap = s->u.seq.n; /* exact-size arrays: grow to n exactly */

	if (!n)
		return 0;
	if (s->u.seq.n > SIZE_MAX / sizeof(*v) - n)
		return fail(l, -SF_ETOOBIG, "sequence too long");
	cap = s->u.seq.n + n;
	struct sf_pk **a = realloc(s->u.seq.v, cap * sizeof(*a));
	if (!a)
		return fail(l, -ENOMEM, "out of memory");
	memcpy(a + s->u.seq.n, v, n * sizeof(*v));
	s->u.seq.v = a;
	s->u.seq.n = cap;
	return 0;
}

/* Add pairs kv[0..2n) to a DICT node. */
static int dict_add(struct ld *l, struct sf_pk *d, struct sf_pk **kv, size_t n)
{
	size_t cap;
	struct sf_pk **k, **v;

	if (!n)
		return 0;
	if (d->u.dict.n > SIZE_MAX / sizeof(*k) - n)
		return fail(l, -SF_ETOOBIG, "dict too long");
	cap = d->u.dict.n + n;
	k = realloc(d->u.dict.k, cap * sizeof(*k));
	if (!k)
		return fail(l, -ENOMEM, "out of memory");
	d->u.dict.k = k;
	v = realloc(d->u.dict.v, cap * sizeof(*v));
	if (!v)
		return fail(l, -ENOMEM, "out of memory");
	d->u.dict.v = v;
	for (size_t i = 0; i < n; i++) {
		k[d->u.dict.n + i] = kv[2 * i];
		v[d->u.dict.n + i] = kv[2 * i + 1];
	}
	d->u.dict.n = cap;
	return 0;
}

/* The list APPENDs go to: the LIST itself, or an OBJ's elems. */
static int append_target(struct ld *l, struct sf_pk *t, struct sf_pk **out)
{
	if (t->kind == SF_PK_LIST) {
		*out = t;
		return 0;
	}
	if (t->kind == SF_PK_OBJ) {
		if (!t->u.obj.elems && !(t->u.obj.elems = node(l, SF_PK_LIST)))
			return l->node_rc ? l->node_rc : -ENOMEM;
		*out = t->u.obj.elems;
		return 0;
	}
	return fail(l, -SF_EFORMAT, "APPEND to something not a list");
}

static int setitem_target(struct ld *l, struct sf_pk *t, struct sf_pk **out)
{
	if (t->kind == SF_PK_DICT) {
		*out = t;
		return 0;
	}
	if (t->kind == SF_PK_OBJ) {
		if (!t->u.obj.items && !(t->u.obj.items = node(l, SF_PK_DICT)))
			return l->node_rc ? l->node_rc : -ENOMEM;
		*out = t->u.obj.items;
		return 0;
	}
	return fail(l, -SF_EFORMAT, "SETITEM on something not a dict");
}

static int memo_put(struct ld *l, uint64_t idx, struct sf_pk *v)
{
	if (idx >= l->o->max_memo)
		return fail(l, -SF_ETOOBIG, "memo index %llu over %u",
			    (unsigned long long)idx, l->o->max_memo);
	if (idx >= l->capmemo) {
		size_t cap = l->capmemo ? l->capmemo : 64;
		struct sf_pk **m;

		while (cap <= idx)
			cap *= 2;
		m = realloc(l->memo, cap * sizeof(*m));
		if (!m)
			return fail(l, -ENOMEM, "out of memory");
		memset(m + l->capmemo, 0, (cap - l->capmemo) * sizeof(*m));
		l->memo = m;
		l->capmemo = cap;
	}
	if (!l->memo[idx])
		l->nmemo++;
	l->memo[idx] = v;
	return 0;
}

static int memo_get(struct ld *l, uint64_t idx)
{
	if (idx >= l->capmemo || !l->memo[idx])
		return fail(l, -SF_EFORMAT, "memo entry %llu is not set",
			    (unsigned long long)idx);
	return push(l, l->memo[idx]);
}

/* --- values from the input --- */

static int push_int(struct ld *l, int64_t i)
{
	struct sf_pk *v = node(l, SF_PK_INT);

	if (v)
		v->u.i = i;
	return push(l, v);
}

/* A little-endian two's complement integer of n bytes (LONG1/LONG4). */
static int push_long(struct ld *l, uint64_t n)
{
	const unsigned char *b;
	uint64_t u = 0;
	int rc;

	if (n > 8)
		return fail(l, -SF_EFORMAT, "an integer of %llu bytes (more than 64 bits)",
			    (unsigned long long)n);
	if (n == 0)
		return push_int(l, 0);
	rc = need(l, (size_t)n, &b);
	if (rc)
		return rc;
	for (size_t i = (size_t)n; i-- > 0;)
		u = u << 8 | b[i];
	if (n < 8 && (b[n - 1] & 0x80))
		u |= ~0ull << (8 * n); /* sign-extend */
	return push_int(l, (int64_t)u);
}

static int push_str(struct ld *l, uint64_t n)
{
	struct sf_pk *v;
	char *s;
	int rc;

	if (n > WIN)
		return fail(l, -SF_ETOOBIG, "a string of %llu bytes",
			    (unsigned long long)n);
	rc = copy_in(l, (size_t)n, &s);
	if (rc)
		return rc;
	if (!utf8_ok((unsigned char *)s, (size_t)n)) {
		free(s);
		return fail(l, -SF_EFORMAT, "a string that is not UTF-8 (or holds NUL)");
	}
	v = node(l, SF_PK_STR);
	if (!v) {
		free(s);
		return l->node_rc ? l->node_rc : -ENOMEM;
	}
	v->u.str.s = s;
	v->u.str.len = (size_t)n;
	return push(l, v);
}

/* A bytes value of n bytes at the current position: recorded, copied
 * when short, skipped otherwise. */
static int push_bytes(struct ld *l, uint64_t n)
{
	struct sf_pk *v;
	uint64_t at = l->pos;
	char *data = NULL;
	int rc;

	if (at > l->in->size || n > l->in->size - at)
		return fail(l, -SF_EFORMAT, "bytes of %llu run past the end",
			    (unsigned long long)n);
	if (n <= SF_PK_BYTES_COPY) {
		rc = copy_in(l, (size_t)n, &data);
		if (rc)
			return rc;
	} else {
		l->pos += n;
	}
	v = node(l, SF_PK_BYTES);
	if (!v) {
		free(data);
		return l->node_rc ? l->node_rc : -ENOMEM;
	}
	v->u.bytes.off = at;
	v->u.bytes.len = n;
	v->u.bytes.data = (const unsigned char *)data;
	return push(l, v);
}

static bool allowed(const struct sf_pickle_opts *o, const char *m, const char *n)
{
	for (size_t i = 0; i < o->nallow; i++)
		if (strcmp(o->allow[i].module, m) == 0 &&
		    strcmp(o->allow[i].name, n) == 0)
			return true;
	return false;
}

/* A global module.name (strings owned by the caller until success). */
static int push_global(struct ld *l, char *m, char *n)
{
	struct sf_pk *v;

	if (!allowed(l->o, m, n)) {
		fail(l, -SF_EREFUSED, "names %.100s.%.100s, which shardfs does not accept",
		     m, n);
		free(m);
		free(n);
		return -SF_EREFUSED;
	}
	v = node(l, SF_PK_GLOBAL);
	if (!v) {
		free(m);
		free(n);
		return l->node_rc ? l->node_rc : -ENOMEM;
	}
	v->u.global.module = m;
	v->u.global.name = n;
	return push(l, v);
}

static int push_obj(struct ld *l, struct sf_pk *callable, struct sf_pk *args,
		    struct sf_pk *kwargs, bool newobj)
{
	struct sf_pk *v;

	if (args->kind != SF_PK_TUPLE)
		return fail(l, -SF_EFORMAT, "call arguments are not a tuple");
	if (kwargs && kwargs->kind != SF_PK_DICT)
		return fail(l, -SF_EFORMAT, "call keywords are not a dict");
	v = node(l, SF_PK_OBJ);
	if (!v)
		return l->node_rc ? l->node_rc : -ENOMEM;
	v->u.obj.callable = callable;
	v->u.obj.args = args;
	v->u.obj.kwargs = kwargs;
	v->u.obj.newobj = newobj;
	return push(l, v);
}

/* Pop the items above the innermost mark into a new seq of kind. */
static int push_seq_from_mark(struct ld *l, enum sf_pk_kind kind)
{
	struct sf_pk *v;
	size_t from = 0;
	int rc = pop_mark(l, &from);

	if (rc)
		return rc;
	v = node(l, kind);
	if (!v)
		return l->node_rc ? l->node_rc : -ENOMEM;
	/* l->st may still be NULL (nothing pushed yet): no pointer math then */
	if (l->nst > from)
		rc = seq_add(l, v, l->st + from, l->nst - from);
	if (rc)
		return rc;
	l->nst = from;
	return push(l, v);
}

static int push_tuple_n(struct ld *l, size_t n)
{
	struct sf_pk *v;
	int rc;

	if (l->nst < floor_of(l) + n)
		return fail(l, -SF_EFORMAT, "stack underflow");
	v = node(l, SF_PK_TUPLE);
	if (!v)
		return l->node_rc ? l->node_rc : -ENOMEM;
	rc = seq_add(l, v, l->st + l->nst - n, n);
	if (rc)
		return rc;
	l->nst -= n;
	return push(l, v);
}

/* --- the opcodes --- */

static int op_text(struct ld *l, unsigned char op)
{
	char line[MAX_LINE + 1];
	size_t len;
	int rc = rd_line(l, line, &len);

	if (rc)
		return rc;
	switch (op) {
	case 'I': /* INT */
	case 'L': { /* LONG */
		char *end;
		long long x;

		if (op == 'I' && strcmp(line, "00") == 0)
			goto out_bool_false;
		if (op == 'I' && strcmp(line, "01") == 0)
			goto out_bool_true;
		if (op == 'L' && len && line[len - 1] == 'L')
			line[--len] = '\0';
		errno = 0;
		x = strtoll(line, &end, 10);
		if (!len || *end || errno)
			return fail(l, -SF_EFORMAT, "a bad or too large text integer");
		return push_int(l, (int64_t)x);
	}
	case 'F': { /* FLOAT */
		struct sf_pk *v;
		char *end;
		double d = strtod(line, &end);

		if (!len || *end)
			return fail(l, -SF_EFORMAT, "a bad text float");
		v = node(l, SF_PK_FLOAT);
		if (v)
			v->u.f = d;
		return push(l, v);
	}
	case 'p': /* PUT */
	case 'g': { /* GET */
		char *end;
		unsigned long long idx;

		errno = 0;
		idx = strtoull(line, &end, 10);
		if (!len || *end || errno || line[0] == '-')
			return fail(l, -SF_EFORMAT, "a bad memo index");
		if (op == 'g')
			return memo_get(l, idx);
		{
			struct sf_pk *t;

			rc = top(l, &t);
			return rc ? rc : memo_put(l, idx, t);
		}
	}
	case 'V': { /* UNICODE: plain ASCII only */
		for (size_t i = 0; i < len; i++)
			if ((unsigned char)line[i] < 0x20 || (unsigned char)line[i] > 0x7e ||
			    line[i] == '\\')
				return fail(l, -SF_EFORMAT, "a UNICODE text opcode with escapes");
		l->pos -= len + 1;
		rc = push_str(l, len);
		l->pos += 1;
		return rc;
	}
	case 'S': { /* STRING: a quoted literal without escapes */
		if (len < 2 || line[0] != line[len - 1] ||
		    (line[0] != '\'' && line[0] != '"') || memchr(line, '\\', len))
			return fail(l, -SF_EFORMAT, "a STRING with escapes or no quotes");
		l->pos -= len; /* at the first byte after the opening quote */
		rc = push_bytes(l, len - 2);
		l->pos += 2;
		return rc;
	}
	case 'P': { /* PERSID */
		struct sf_pk *v, *id;

		l->pos -= len + 1;
		rc = push_str(l, len);
		l->pos += 1;
		if (rc || (rc = pop(l, &id)))
			return rc;
		v = node(l, SF_PK_PERSID);
		if (v)
			v->u.persid = id;
		return push(l, v);
	}
	case 'c': { /* GLOBAL module\nname\n */
		char *m = strdup(line), *n;
		char line2[MAX_LINE + 1];

		if (!m)
			return fail(l, -ENOMEM, "out of memory");
		rc = rd_line(l, line2, &len);
		if (rc) {
			free(m);
			return rc;
		}
		n = strdup(line2);
		if (!n || charge(l, strlen(m) + len + 2)) {
			free(m);
			free(n);
			return n ? -SF_ETOOBIG : fail(l, -ENOMEM, "out of memory");
		}
		return push_global(l, m, n);
	}
	}
	return fail(l, -SF_EFORMAT, "unknown text opcode");
out_bool_false:
out_bool_true: {
		struct sf_pk *v = node(l, SF_PK_BOOL);

		if (v)
			v->u.b = strcmp(line, "01") == 0;
		return push(l, v);
	}
}

static int op_one(struct ld *l, unsigned char op, bool *stop)
{
	struct sf_pk *a, *b, *c, *t;
	uint64_t n;
	size_t from = 0;
	int rc;

	switch (op) {
	case 0x80: /* PROTO */
		rc = rd_u(l, 1, &n);
		if (!rc && n > 5)
			rc = fail(l, -SF_EFORMAT, "protocol %llu", (unsigned long long)n);
		return rc;
	case 0x95: /* FRAME: framing only */
		rc = rd_u(l, 8, &n);
		if (!rc && (l->pos > l->in->size || n > l->in->size - l->pos))
			rc = fail(l, -SF_EFORMAT, "a frame past the end");
		return rc;
	case '.': /* STOP */
		rc = pop(l, &a);
		if (rc)
			return rc;
		l->p->root = a;
		*stop = true;
		return 0;
	case '(': /* MARK */
		if (l->nmarks >= l->o->max_depth)
			return fail(l, -SF_ETOOBIG, "MARKs nested deeper than %u",
				    l->o->max_depth);
		if (sf_array_grow(&l->marks, l->nmarks, &l->capmarks,
				  sizeof(*l->marks), 16, 0))
			return fail(l, -ENOMEM, "out of memory");
		l->marks[l->nmarks++] = l->nst;
		return 0;
	case '0': /* POP */
		return pop(l, &a);
	case '1': /* POP_MARK */
		rc = pop_mark(l, &from);
		if (!rc)
			l->nst = from;
		return rc;
	case '2': /* DUP */
		rc = top(l, &a);
		return rc ? rc : push(l, a);
	case 'N':
		return push(l, node(l, SF_PK_NONE));
	case 0x88: /* NEWTRUE */
	case 0x89: /* NEWFALSE */
		a = node(l, SF_PK_BOOL);
		if (a)
			a->u.b = op == 0x88;
		return push(l, a);
	case 'J': /* BININT */
		rc = rd_u(l, 4, &n);
		return rc ? rc : push_int(l, (int32_t)(uint32_t)n);
	case 'K': /* BININT1 */
		rc = rd_u(l, 1, &n);
		return rc ? rc : push_int(l, (int64_t)n);
	case 'M': /* BININT2 */
		rc = rd_u(l, 2, &n);
		return rc ? rc : push_int(l, (int64_t)n);
	case 0x8a: /* LONG1 */
		rc = rd_u(l, 1, &n);
		return rc ? rc : push_long(l, n);
	case 0x8b: /* LONG4 */
		rc = rd_u(l, 4, &n);
		if (rc)
			return rc;
		if (n & 0x80000000u)
			return fail(l, -SF_EFORMAT, "LONG4 with a negative length");
		return push_long(l, n);
	case 'G': { /* BINFLOAT, big-endian */
		const unsigned char *p;
		uint64_t u = 0;
		double d;

		rc = need(l, 8, &p);
		if (rc)
			return rc;
		for (int i = 0; i < 8; i++)
			u = u << 8 | p[i];
		memcpy(&d, &u, sizeof(d));
		a = node(l, SF_PK_FLOAT);
		if (a)
			a->u.f = d;
		return push(l, a);
	}
	case 'X': /* BINUNICODE */
		rc = rd_u(l, 4, &n);
		return rc ? rc : push_str(l, n);
	case 0x8c: /* SHORT_BINUNICODE */
		rc = rd_u(l, 1, &n);
		return rc ? rc : push_str(l, n);
	case 0x8d: /* BINUNICODE8 */
		rc = rd_u(l, 8, &n);
		return rc ? rc : push_str(l, n);
	case 'T': /* BINSTRING */
	case 'B': /* BINBYTES */
		rc = rd_u(l, 4, &n);
		if (!rc && op == 'T' && (n & 0x80000000u))
			rc = fail(l, -SF_EFORMAT, "BINSTRING with a negative length");
		return rc ? rc : push_bytes(l, n);
	case 'U': /* SHORT_BINSTRING */
	case 'C': /* SHORT_BINBYTES */
		rc = rd_u(l, 1, &n);
		return rc ? rc : push_bytes(l, n);
	case 0x8e: /* BINBYTES8 */
	case 0x96: /* BYTEARRAY8 */
		rc = rd_u(l, 8, &n);
		return rc ? rc : push_bytes(l, n);
	case ')': /* EMPTY_TUPLE */
		return push(l, node(l, SF_PK_TUPLE));
	case 't': /* TUPLE */
		return push_seq_from_mark(l, SF_PK_TUPLE);
	case 0x85: case 0x86: case 0x87: /* TUPLE1..3 */
		return push_tuple_n(l, (size_t)(op - 0x84));
	case ']': /* EMPTY_LIST */
	case 0x8f: /* EMPTY_SET */
		return push(l, node(l, SF_PK_LIST));
	case 'l': /* LIST */
	case 0x91: /* FROZENSET */
		return push_seq_from_mark(l, SF_PK_LIST);
	case 'a': /* APPEND */
		if ((rc = pop(l, &a)) || (rc = top(l, &t)) ||
		    (rc = append_target(l, t, &b)))
			return rc;
		return seq_add(l, b, &a, 1);
	case 'e': /* APPENDS */
	case 0x90: /* ADDITEMS */
		if ((rc = pop_mark(l, &from)))
			return rc;
		if (from <= floor_of(l))
			return fail(l, -SF_EFORMAT, "APPENDS with nothing below its MARK");
		t = l->st[from - 1];
		if (op == 0x90 && t->kind != SF_PK_LIST)
			return fail(l, -SF_EFORMAT, "ADDITEMS to something not a set");
		if ((rc = append_target(l, t, &b)) ||
		    (rc = seq_add(l, b, l->st + from, l->nst - from)))
			return rc;
		l->nst = from;
		return 0;
	case '}': /* EMPTY_DICT */
		return push(l, node(l, SF_PK_DICT));
	case 'd': /* DICT */
		if ((rc = pop_mark(l, &from)))
			return rc;
		if ((l->nst - from) % 2)
			return fail(l, -SF_EFORMAT, "DICT with an odd number of items");
		a = node(l, SF_PK_DICT);
		if (!a)
			return l->node_rc ? l->node_rc : -ENOMEM;
		if (l->nst > from && (rc = dict_add(l, a, l->st + from, (l->nst - from) / 2)))
			return rc;
		l->nst = from;
		return push(l, a);
	case 's': /* SETITEM */
		if ((rc = pop(l, &b)) || (rc = pop(l, &a)) || (rc = top(l, &t)) ||
		    (rc = setitem_target(l, t, &c)))
			return rc;
		{
			struct sf_pk *kv[2] = { a, b };

			return dict_add(l, c, kv, 1);
		}
	case 'u': /* SETITEMS */
		if ((rc = pop_mark(l, &from)))
			return rc;
		if (from <= floor_of(l) || (l->nst - from) % 2)
			return fail(l, -SF_EFORMAT, "SETITEMS without a dict or with an odd count");
		if ((rc = setitem_target(l, l->st[from - 1], &c)) ||
		    (rc = dict_add(l, c, l->st + from, (l->nst - from) / 2)))
			return rc;
		l->nst = from;
		return 0;
	case 0x93: /* STACK_GLOBAL */
		if ((rc = pop(l, &b)) || (rc = pop(l, &a)))
			return rc;
		if (a->kind != SF_PK_STR || b->kind != SF_PK_STR)
			return fail(l, -SF_EFORMAT, "STACK_GLOBAL of non-strings");
		{
			char *m = strdup(a->u.str.s), *nm = strdup(b->u.str.s);

			if (!m || !nm) {
				free(m);
				free(nm);
				return fail(l, -ENOMEM, "out of memory");
			}
			return push_global(l, m, nm);
		}
	case 'R': /* REDUCE */
		if ((rc = pop(l, &b)) || (rc = pop(l, &a)))
			return rc;
		return push_obj(l, a, b, NULL, false);
	case 0x81: /* NEWOBJ */
		if ((rc = pop(l, &b)) || (rc = pop(l, &a)))
			return rc;
		return push_obj(l, a, b, NULL, true);
	case 0x92: /* NEWOBJ_EX */
		if ((rc = pop(l, &c)) || (rc = pop(l, &b)) || (rc = pop(l, &a)))
			return rc;
		return push_obj(l, a, b, c, true);
	case 'b': /* BUILD: a second BUILD replaces the state */
		if ((rc = pop(l, &a)) || (rc = top(l, &t)))
			return rc;
		if (t->kind != SF_PK_OBJ)
			return fail(l, -SF_EFORMAT, "BUILD on something not an object");
		t->u.obj.state = a;
		return 0;
	case 'Q': /* BINPERSID */
		if ((rc = pop(l, &a)))
			return rc;
		b = node(l, SF_PK_PERSID);
		if (b)
			b->u.persid = a;
		return push(l, b);
	case 'q': /* BINPUT */
	case 'r': /* LONG_BINPUT */
		if ((rc = rd_u(l, op == 'q' ? 1 : 4, &n)) || (rc = top(l, &t)))
			return rc;
		return memo_put(l, n, t);
	case 0x94: /* MEMOIZE */
		if ((rc = top(l, &t)))
			return rc;
		return memo_put(l, l->nmemo, t);
	case 'h': /* BINGET */
	case 'j': /* LONG_BINGET */
		rc = rd_u(l, op == 'h' ? 1 : 4, &n);
		return rc ? rc : memo_get(l, n);
	case 'I': case 'L': case 'F': case 'p': case 'g': case 'V': case 'S':
	case 'P': case 'c':
		return op_text(l, op);
	}
	return fail(l, -SF_EFORMAT, "opcode 0x%02x is not read (%s)", op,
		    op == 'i' || op == 'o' ? "INST/OBJ" :
		    op >= 0x82 && op <= 0x84 ? "extension registry" :
		    op == 0x97 || op == 0x98 ? "out-of-band buffer" : "unknown");
}

int sf_pickle_load(const struct sf_input *in, const struct sf_pickle_opts *opts,
		   struct sf_pickle **out, char *err, size_t errlen)
{
	struct sf_pickle_opts o = { 0 };
	struct ld *l;
	bool stop = false;
	int rc = 0;

	*out = NULL;
	if (err && errlen)
		err[0] = '\0';
	if (opts)
		o = *opts;
	if (!o.max_nodes)
		o.max_nodes = DEF_MAX_NODES;
	if (!o.max_bytes)
		o.max_bytes = DEF_MAX_BYTES;
	if (!o.max_depth)
		o.max_depth = DEF_MAX_DEPTH;
	if (!o.max_memo)
		o.max_memo = DEF_MAX_MEMO;
	l = calloc(1, sizeof(*l));
	if (!l)
		return -ENOMEM;
	l->p = calloc(1, sizeof(*l->p));
	if (!l->p) {
		free(l);
		return -ENOMEM;
	}
	l->in = in;
	l->o = &o;
	l->err = err;
	l->errlen = errlen;
	while (!stop && !rc) {
		const unsigned char *b;

		l->op_at = l->pos;
		rc = need(l, 1, &b);
		if (!rc)
			rc = op_one(l, *b, &stop);
	}
	if (!rc) {
		l->p->end = l->pos;
		*out = l->p;
	} else {
		if (rc == -ENOMEM && err && errlen && !err[0])
			snprintf(err, errlen, "pickle: out of memory");
		sf_pickle_free(l->p);
	}
	free(l->st);
	free(l->marks);
	free(l->memo);
	free(l);
	return rc;
}

void sf_pickle_free(struct sf_pickle *p)
{
	if (!p)
		return;
	for (size_t i = 0; i < p->nnodes; i++) {
		struct sf_pk *v = p->nodes[i];

		switch (v->kind) {
		case SF_PK_STR:
			free((char *)v->u.str.s);
			break;
		case SF_PK_BYTES:
			free((unsigned char *)v->u.bytes.data);
			break;
		case SF_PK_TUPLE:
		case SF_PK_LIST:
			free(v->u.seq.v);
			break;
		case SF_PK_DICT:
			free(v->u.dict.k);
			free(v->u.dict.v);
			break;
		case SF_PK_GLOBAL:
			free((char *)v->u.global.module);
			free((char *)v->u.global.name);
			break;
		default:
			break;
		}
		free(v);
	}
	free(p->nodes);
	free(p);
}

const struct sf_pk *sf_pickle_root(const struct sf_pickle *p)
{
	return p ? p->root : NULL;
}

uint64_t sf_pickle_end(const struct sf_pickle *p)
{
	return p ? p->end : 0;
}

/* --- accessors --- */

bool sf_pk_is_global(const struct sf_pk *v, const char *module,
		     const char *name)
{
	return v && v->kind == SF_PK_GLOBAL &&
	       strcmp(v->u.global.module, module) == 0 &&
	       strcmp(v->u.global.name, name) == 0;
}

bool sf_pk_is_obj(const struct sf_pk *v, const char *module, const char *name)
{
	return v && v->kind == SF_PK_OBJ &&
	       sf_pk_is_global(v->u.obj.callable, module, name);
}

const struct sf_pk *sf_pk_get(const struct sf_pk *d, const char *key)
{
	if (d && d->kind == SF_PK_OBJ)
		d = d->u.obj.items;
	if (!d || d->kind != SF_PK_DICT)
		return NULL;
	/* the last of repeated keys, as Python's dict keeps it */
	for (size_t i = d->u.dict.n; i-- > 0;) {
		const char *k = sf_pk_str(d->u.dict.k[i]);

		if (k && strcmp(k, key) == 0)
			return d->u.dict.v[i];
	}
	return NULL;
}

const struct sf_pk *sf_pk_attr(const struct sf_pk *obj, const char *name)
{
	const struct sf_pk *st, *v;

	if (!obj || obj->kind != SF_PK_OBJ || !(st = obj->u.obj.state))
		return NULL;
	if (st->kind == SF_PK_DICT)
		return sf_pk_get(st, name);
	if (st->kind == SF_PK_TUPLE && st->u.seq.n == 2) {
		v = sf_pk_get(st->u.seq.v[0], name);
		return v ? v : sf_pk_get(st->u.seq.v[1], name);
	}
	return NULL;
}

const struct sf_pk *sf_pk_item(const struct sf_pk *seq, size_t i)
{
	if (!seq || (seq->kind != SF_PK_TUPLE && seq->kind != SF_PK_LIST) ||
	    i >= seq->u.seq.n)
		return NULL;
	return seq->u.seq.v[i];
}

size_t sf_pk_len(const struct sf_pk *v)
{
	if (!v)
		return 0;
	if (v->kind == SF_PK_TUPLE || v->kind == SF_PK_LIST)
		return v->u.seq.n;
	if (v->kind == SF_PK_DICT)
		return v->u.dict.n;
	return 0;
}

bool sf_pk_int(const struct sf_pk *v, int64_t *out)
{
	if (!v)
		return false;
	if (v->kind == SF_PK_INT) {
		*out = v->u.i;
		return true;
	}
	if (v->kind == SF_PK_BOOL) {
		*out = v->u.b;
		return true;
	}
	return false;
}

const char *sf_pk_str(const struct sf_pk *v)
{
	return v && v->kind == SF_PK_STR ? v->u.str.s : NULL;
}
