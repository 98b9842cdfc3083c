/*
 * sf_pickle.c - the restricted pickle reader (see sf_pickle.h).
 *
 * A pickle is a program for a stack machine; this file runs it with
 * values that are plain nodes, so nothing is imported, called or
 * constructed: GLOBAL gives a GLOBAL node (refused unless allowlisted),
 * REDUCE/NEWOBJ/NEWOBJ_EX give OBJ nodes, BUILD records the state on its
 * OBJ, persistent ids give PERSID nodes. The decoder is one loop over the
 * opcodes, without recursion. Three files: sf_pickle_dec.c (messages,
 * nodes, the input window, stack and memo), sf_pickle_scalar.c (scalar,
 * string, bytes, global and persistent-id opcodes), and this one (the
 * containers, the calls, the loop, the accessors); sf_pickle_dec.h is
 * their shared, internal header.
 *
 * Invariants:
 *  - The input is read only through sf_input_read(), in a window of
 *    PK_WINDOW bytes; a bytes value is never read unless it is short
 *    (<= SF_PK_BYTES_COPY), only checked to lie inside the input. FRAME
 *    lengths are checked to lie inside the input and otherwise ignored.
 *  - Every node lives in a block of the document (struct sf_pickle); a
 *    node owns its arrays and strings, which sf_pickle_free() releases by
 *    walking the blocks (never the graph, which may share and cycle).
 *  - Caps (opts): nodes created <= max_nodes; bytes allocated for the
 *    document's strings, short bytes and node arrays <= max_bytes; stack
 *    length and mark count <= max_depth; memo indices < max_memo. Text
 *    lines (protocol 0 arguments) are at most PK_LINE_MAX bytes, string
 *    lines (UNICODE, STRING) at most what max_bytes leaves.
 *  - The stack is fenced by the innermost MARK, as in CPython: opcodes
 *    see only the values pushed after it. STOP needs exactly one value
 *    and no open MARK (CPython ignores leftovers; no pickler leaves any).
 *  - Containers are checked the way Python would fail: APPEND(S) only on
 *    a list or an OBJ, ADDITEMS only on a set, SETITEM(S) only on a dict
 *    or an OBJ, BUILD only on an OBJ and only once, REDUCE/NEWOBJ args a
 *    tuple, dict keys never a list or a dict.
 */
#include "sf_pickle.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sf_array.h"
#include "sf_budget.h"
#include "sf_error.h"

#include "sf_pickle_dec.h"

/* ------------------------------------------------------------------ */
/* containers                                                          */

/* A TUPLE/LIST (kind) of the values stack[start..sn), which are popped. */
static int make_seq(struct pk_dec *d, enum sf_pk_kind kind, size_t start,
		    unsigned flags)
{
	struct sf_pk *v;
	size_t n = d->sn - start;
	int rc = sf_pkd_new_node(d, kind, &v);

	if (rc < 0)
		return rc;
	node_of(v)->flags = flags;
	if (n) {
		rc = sf_pkd_seq_reserve(d, v, n);
		if (rc < 0)
			return rc;
		memcpy(v->u.seq.v, d->stack + start, n * sizeof(*v->u.seq.v));
	}
	v->u.seq.n = n;
	d->sn = start;
	return sf_pkd_push(d, v);
}

static int op_tuple_n(struct pk_dec *d, size_t n)
{
	if (d->sn - sf_pkd_fence(d) < n)
		return sf_pkd_underflow(d);
	return make_seq(d, SF_PK_TUPLE, d->sn - n, 0);
}

/* The list an APPEND(S)/ADDITEMS on target goes to, or an error. */
static int append_target(struct pk_dec *d, struct sf_pk *target, bool additems,
			 struct sf_pk **out)
{
	struct sf_pk *l;
	int rc;

	if (target->kind == SF_PK_LIST) {
		unsigned fl = node_of(target)->flags;
		if (additems ? !(fl & PKF_SET) : (fl & (PKF_SET | PKF_FROZEN)))
			return sf_pkd_fail(d, -SF_EFORMAT, additems ?
				    "ADDITEMS on something that is not a set" :
				    "append to a set");
		*out = target;
		return 0;
	}
	if (target->kind == SF_PK_OBJ && !additems) {
		if (!target->u.obj.elems) {
			rc = sf_pkd_new_node(d, SF_PK_LIST, &l);
			if (rc < 0)
				return rc;
			target->u.obj.elems = l;
		}
		*out = target->u.obj.elems;
		return 0;
	}
	return sf_pkd_fail(d, -SF_EFORMAT, "%s on a value that takes no elements",
		    additems ? "ADDITEMS" : "append");
}

/* Append stack[start..sn) to the value below start, and pop them. */
static int do_appends(struct pk_dec *d, size_t start, bool additems)
{
	struct sf_pk *target, *l = NULL;
	size_t n = d->sn - start;
	int rc;

	if (start <= sf_pkd_fence(d))
		return sf_pkd_underflow(d);
	if (n == 0) /* nothing to append: CPython does not look at the target */
		return 0;
	target = d->stack[start - 1];
	rc = append_target(d, target, additems, &l);
	if (rc < 0)
		return rc;
	if (n > SIZE_MAX - l->u.seq.n)
		return sf_pkd_fail(d, -SF_ETOOBIG, "list too long");
	rc = sf_pkd_seq_reserve(d, l, l->u.seq.n + n);
	if (rc < 0)
		return rc;
	memcpy(l->u.seq.v + l->u.seq.n, d->stack + start, n * sizeof(*l->u.seq.v));
	l->u.seq.n += n;
	d->sn = start;
	return 0;
}

static bool hashable(const struct sf_pk *k)
{
	return k->kind != SF_PK_LIST && k->kind != SF_PK_DICT;
}

/* Add the pairs stack[start..sn) to dict and pop them. */
static int add_pairs(struct pk_dec *d, struct sf_pk *dict, size_t start)
{
	size_t n = d->sn - start;
	int rc;

	if (n % 2)
		return sf_pkd_fail(d, -SF_EFORMAT, "odd number of keys and values");
	for (size_t i = start; i < d->sn; i += 2)
		if (!hashable(d->stack[i]))
			return sf_pkd_fail(d, -SF_EFORMAT, "unhashable dict key");
	n /= 2;
	if (n > SIZE_MAX / 2 - dict->u.dict.n)
		return sf_pkd_fail(d, -SF_ETOOBIG, "dict too long");
	rc = sf_pkd_seq_reserve(d, dict, dict->u.dict.n + n);
	if (rc < 0)
		return rc;
	for (size_t i = 0; i < n; i++) {
		dict->u.dict.k[dict->u.dict.n] = d->stack[start + 2 * i];
		dict->u.dict.v[dict->u.dict.n] = d->stack[start + 2 * i + 1];
		dict->u.dict.n++;
	}
	d->sn = start;
	return 0;
}

/* SETITEM(S): the pairs stack[start..sn) go to the value below start. */
static int do_setitems(struct pk_dec *d, size_t start)
{
	struct sf_pk *target, *dict;
	int rc;

	if (start <= sf_pkd_fence(d))
		return sf_pkd_underflow(d);
	if (start == d->sn) /* no pairs: CPython does not look at the target */
		return 0;
	target = d->stack[start - 1];
	if (target->kind == SF_PK_DICT) {
		dict = target;
	} else if (target->kind == SF_PK_OBJ) {
		if (!target->u.obj.items) {
			rc = sf_pkd_new_node(d, SF_PK_DICT, &dict);
			if (rc < 0)
				return rc;
			target->u.obj.items = dict;
		}
		dict = target->u.obj.items;
	} else {
		return sf_pkd_fail(d, -SF_EFORMAT, "setitem on a value that is not a dict");
	}
	return add_pairs(d, dict, start);
}

static int op_dict_mark(struct pk_dec *d)
{
	struct sf_pk *v;
	size_t start = 0;
	int rc = sf_pkd_pop_mark(d, &start);

	if (rc < 0)
		return rc;
	rc = sf_pkd_new_node(d, SF_PK_DICT, &v);
	if (rc < 0)
		return rc;
	rc = add_pairs(d, v, start);
	if (rc < 0)
		return rc;
	return sf_pkd_push(d, v);
}

static int op_reduce(struct pk_dec *d, bool newobj, bool ex)
{
	struct sf_pk *callable, *args, *kwargs = NULL, *v;
	int rc;

	if (ex && (rc = sf_pkd_pop(d, &kwargs)) < 0)
		return rc;
	if ((rc = sf_pkd_pop(d, &args)) < 0 || (rc = sf_pkd_pop(d, &callable)) < 0)
		return rc;
	if (args->kind != SF_PK_TUPLE)
		return sf_pkd_fail(d, -SF_EFORMAT, "arguments are not a tuple");
	if (kwargs && kwargs->kind != SF_PK_DICT)
		return sf_pkd_fail(d, -SF_EFORMAT, "keyword arguments are not a dict");
	rc = sf_pkd_push_new(d, SF_PK_OBJ, &v);
	if (rc < 0)
		return rc;
	v->u.obj.callable = callable;
	v->u.obj.args = args;
	v->u.obj.kwargs = kwargs;
	v->u.obj.newobj = newobj;
	return 0;
}

static int op_build(struct pk_dec *d)
{
	struct sf_pk *state, *obj;
	int rc;

	if ((rc = sf_pkd_pop(d, &state)) < 0 || (rc = sf_pkd_top(d, &obj)) < 0)
		return rc;
	if (obj->kind != SF_PK_OBJ)
		return sf_pkd_fail(d, -SF_EFORMAT, "BUILD on a value that is not an object");
	if (obj->u.obj.state)
		return sf_pkd_fail(d, -SF_EFORMAT, "BUILD on an object that has a state");
	obj->u.obj.state = state;
	return 0;
}

/* ------------------------------------------------------------------ */
/* the loop                                                            */

static int step(struct pk_dec *d, bool *stop)
{
	struct sf_pk *v;
	uint64_t n;
	size_t start = 0;
	unsigned char b;
	int rc;

	d->op_off = d->pos;
	d->have_op = false;
	if (d->pos >= d->in->size)
		return sf_pkd_fail(d, -SF_EFORMAT, "the input ends before STOP");
	rc = sf_pkd_get_byte(d, &d->op);
	if (rc < 0)
		return rc;
	d->have_op = true;
	switch (d->op) {
	case 0x80: /* PROTO */
		if ((rc = sf_pkd_get_byte(d, &b)) < 0)
			return rc;
		if (b > 5)
			return sf_pkd_fail(d, -SF_EFORMAT, "unsupported protocol %u", b);
		return 0;
	case 0x95: /* FRAME: framing only */
		if ((rc = sf_pkd_get_le(d, 8, &n)) < 0)
			return rc;
		if (n > d->in->size || d->pos > d->in->size - n)
			return sf_pkd_fail(d, -SF_EFORMAT, "frame of %" PRIu64
				    " bytes runs past the input", n);
		return 0;
	case '.': /* STOP */
		if ((rc = sf_pkd_pop(d, &v)) < 0)
			return rc;
		if (d->sn || d->mn)
			return sf_pkd_fail(d, -SF_EFORMAT, "%zu values and %zu marks left over",
				    d->sn, d->mn);
		d->doc->root = v;
		d->doc->end = d->pos;
		*stop = true;
		return 0;
	case '(': /* MARK */
		if (d->mn >= d->o->max_depth)
			return sf_pkd_fail(d, -SF_ETOOBIG, "more than %" PRIu32
				    " open marks (max_depth)", d->o->max_depth);
		rc = sf_array_grow(&d->marks, d->mn, &d->mcap, sizeof(*d->marks),
				   16, 0);
		if (rc < 0)
			return sf_pkd_fail(d, -ENOMEM, "out of memory");
		d->marks[d->mn++] = d->sn;
		return 0;
	case '0': /* POP: a value, or the mark just set when none is above */
		if (d->mn && d->marks[d->mn - 1] == d->sn) {
			d->mn--;
			return 0;
		}
		return sf_pkd_pop(d, &v);
	case '1': /* POP_MARK */
		if ((rc = sf_pkd_pop_mark(d, &start)) < 0)
			return rc;
		d->sn = start;
		return 0;
	case '2': /* DUP */
		if ((rc = sf_pkd_top(d, &v)) < 0)
			return rc;
		return sf_pkd_push(d, v);
	case 'N':
		return sf_pkd_push_new(d, SF_PK_NONE, NULL);
	case 0x88:
		return sf_pkd_push_bool(d, true);
	case 0x89:
		return sf_pkd_push_bool(d, false);
	case 'I':
		return sf_pkd_op_int_text(d, false);
	case 'L':
		return sf_pkd_op_int_text(d, true);
	case 'J':
		if ((rc = sf_pkd_get_le(d, 4, &n)) < 0)
			return rc;
		return sf_pkd_push_int(d, (int32_t)(uint32_t)n);
	case 'K':
		if ((rc = sf_pkd_get_le(d, 1, &n)) < 0)
			return rc;
		return sf_pkd_push_int(d, (int64_t)n);
	case 'M':
		if ((rc = sf_pkd_get_le(d, 2, &n)) < 0)
			return rc;
		return sf_pkd_push_int(d, (int64_t)n);
	case 0x8a: /* LONG1 */
		if ((rc = sf_pkd_get_le(d, 1, &n)) < 0)
			return rc;
		return sf_pkd_op_long_bin(d, n);
	case 0x8b: /* LONG4: a signed length */
		if ((rc = sf_pkd_get_le(d, 4, &n)) < 0)
			return rc;
		if (n & 0x80000000u)
			return sf_pkd_fail(d, -SF_EFORMAT, "negative length");
		return sf_pkd_op_long_bin(d, n);
	case 'F':
		return sf_pkd_op_float_text(d);
	case 'G':
		return sf_pkd_op_binfloat(d);
	case 'S':
		return sf_pkd_op_string(d);
	case 'T': /* BINSTRING: a signed length */
		if ((rc = sf_pkd_get_le(d, 4, &n)) < 0)
			return rc;
		if (n & 0x80000000u)
			return sf_pkd_fail(d, -SF_EFORMAT, "negative length");
		return sf_pkd_op_binbytes(d, n);
	case 'U':
	case 'C':
		if ((rc = sf_pkd_get_le(d, 1, &n)) < 0)
			return rc;
		return sf_pkd_op_binbytes(d, n);
	case 'B':
		if ((rc = sf_pkd_get_le(d, 4, &n)) < 0)
			return rc;
		return sf_pkd_op_binbytes(d, n);
	case 0x8e:
	case 0x96:
		if ((rc = sf_pkd_get_le(d, 8, &n)) < 0)
			return rc;
		return sf_pkd_op_binbytes(d, n);
	case 'V':
		return sf_pkd_op_unicode(d);
	case 0x8c:
		if ((rc = sf_pkd_get_le(d, 1, &n)) < 0)
			return rc;
		return sf_pkd_op_binunicode(d, n);
	case 'X':
		if ((rc = sf_pkd_get_le(d, 4, &n)) < 0)
			return rc;
		return sf_pkd_op_binunicode(d, n);
	case 0x8d:
		if ((rc = sf_pkd_get_le(d, 8, &n)) < 0)
			return rc;
		return sf_pkd_op_binunicode(d, n);
	case ')':
		return make_seq(d, SF_PK_TUPLE, d->sn, 0);
	case 't':
		if ((rc = sf_pkd_pop_mark(d, &start)) < 0)
			return rc;
		return make_seq(d, SF_PK_TUPLE, start, 0);
	case 0x85:
		return op_tuple_n(d, 1);
	case 0x86:
		return op_tuple_n(d, 2);
	case 0x87:
		return op_tuple_n(d, 3);
	case ']':
		return make_seq(d, SF_PK_LIST, d->sn, 0);
	case 'l':
		if ((rc = sf_pkd_pop_mark(d, &start)) < 0)
			return rc;
		return make_seq(d, SF_PK_LIST, start, 0);
	case 0x8f: /* EMPTY_SET */
		return make_seq(d, SF_PK_LIST, d->sn, PKF_SET);
	case 0x91: /* FROZENSET */
		if ((rc = sf_pkd_pop_mark(d, &start)) < 0)
			return rc;
		return make_seq(d, SF_PK_LIST, start, PKF_FROZEN);
	case 'a': /* APPEND */
		if (d->sn - sf_pkd_fence(d) < 2)
			return sf_pkd_underflow(d);
		return do_appends(d, d->sn - 1, false);
	case 'e':
		if ((rc = sf_pkd_pop_mark(d, &start)) < 0)
			return rc;
		return do_appends(d, start, false);
	case 0x90:
		if ((rc = sf_pkd_pop_mark(d, &start)) < 0)
			return rc;
		return do_appends(d, start, true);
	case '}':
		return sf_pkd_push_new(d, SF_PK_DICT, NULL);
	case 'd':
		return op_dict_mark(d);
	case 's': /* SETITEM */
		if (d->sn - sf_pkd_fence(d) < 3)
			return sf_pkd_underflow(d);
		return do_setitems(d, d->sn - 2);
	case 'u':
		if ((rc = sf_pkd_pop_mark(d, &start)) < 0)
			return rc;
		return do_setitems(d, start);
	case 'c':
		return sf_pkd_op_global(d);
	case 0x93:
		return sf_pkd_op_stack_global(d);
	case 'R':
		return op_reduce(d, false, false);
	case 0x81:
		return op_reduce(d, true, false);
	case 0x92:
		return op_reduce(d, true, true);
	case 'b':
		return op_build(d);
	case 'P':
		return sf_pkd_op_persid_text(d);
	case 'Q':
		if ((rc = sf_pkd_pop(d, &v)) < 0)
			return rc;
		return sf_pkd_push_persid(d, v);
	case 'p': {
		int64_t idx;
		if ((rc = sf_pkd_get_line(d, PK_LINE_MAX)) < 0)
			return rc;
		if (sf_pkd_parse_dec(d->line, d->line_len, &idx) < 0 || idx < 0)
			return sf_pkd_fail(d, -SF_EFORMAT, "malformed memo index");
		return sf_pkd_memo_put(d, (uint64_t)idx);
	}
	case 'q':
		if ((rc = sf_pkd_get_le(d, 1, &n)) < 0)
			return rc;
		return sf_pkd_memo_put(d, n);
	case 'r':
		if ((rc = sf_pkd_get_le(d, 4, &n)) < 0)
			return rc;
		return sf_pkd_memo_put(d, n);
	case 0x94:
		return sf_pkd_memo_put(d, d->memo_count);
	case 'g': {
		int64_t idx;
		if ((rc = sf_pkd_get_line(d, PK_LINE_MAX)) < 0)
			return rc;
		if (sf_pkd_parse_dec(d->line, d->line_len, &idx) < 0 || idx < 0)
			return sf_pkd_fail(d, -SF_EFORMAT, "malformed memo index");
		return sf_pkd_memo_get(d, (uint64_t)idx);
	}
	case 'h':
		if ((rc = sf_pkd_get_le(d, 1, &n)) < 0)
			return rc;
		return sf_pkd_memo_get(d, n);
	case 'j':
		if ((rc = sf_pkd_get_le(d, 4, &n)) < 0)
			return rc;
		return sf_pkd_memo_get(d, n);
	default:
		if (sf_pkd_op_name(d->op))
			return sf_pkd_fail(d, -SF_EFORMAT, "opcode not supported");
		return sf_pkd_fail(d, -SF_EFORMAT, "unknown opcode");
	}
}

static void node_release(struct pk_node *n)
{
	struct sf_pk *v = &n->pk;

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
		free((char *)v->u.global.module); /* name shares its buffer */
		break;
	default:
		break;
	}
}

void sf_pickle_free(struct sf_pickle *p)
{
	if (!p)
		return;
	for (size_t b = 0; b < p->nblocks; b++) {
		size_t used = b + 1 == p->nblocks ? p->used : pk_block_cap(b);
		for (size_t i = 0; i < used; i++)
			node_release(&p->blocks[b][i]);
		free(p->blocks[b]);
	}
	free(p->blocks);
	free(p);
}

int sf_pickle_load(const struct sf_input *in, const struct sf_pickle_opts *opts,
		   struct sf_pickle **out, char *err, size_t errlen)
{
	struct sf_pickle_opts o = {0};
	struct pk_dec d = {0};
	bool stop = false;
	int rc;

	*out = NULL;
	if (err && errlen)
		err[0] = 0;
	if (opts)
		o = *opts;
	if (!o.max_nodes)
		o.max_nodes = PK_DEF_NODES;
	if (!o.max_bytes)
		o.max_bytes = PK_DEF_BYTES;
	if (!o.max_depth)
		o.max_depth = PK_DEF_DEPTH;
	if (!o.max_memo)
		o.max_memo = PK_DEF_MEMO;
	d.in = in;
	d.o = &o;
	d.err = err;
	d.errlen = errlen;
	d.doc = calloc(1, sizeof(*d.doc));
	if (!d.doc)
		return sf_pkd_fail(&d, -ENOMEM, "out of memory");
	/* the window never holds more than the input */
	d.win = malloc(in->size < PK_WINDOW ? (in->size ? (size_t)in->size : 1)
					    : PK_WINDOW);
	if (!d.win) {
		rc = sf_pkd_fail(&d, -ENOMEM, "out of memory");
		goto out_free_doc;
	}
	for (uint64_t n = 1; !stop; n++) {
		rc = step(&d, &stop);
		if (rc < 0)
			goto out_free_doc;
		if (n % SF_PK_BUDGET_EVERY == 0 && sf_budget_check(o.budget)) {
			rc = sf_pkd_fail(&d, -SF_EBUDGET, "%s", sf_budget_why(o.budget));
			goto out_free_doc;
		}
	}
	*out = d.doc;
	d.doc = NULL;
	rc = 0;
out_free_doc:
	sf_pickle_free(d.doc);
	free(d.win);
	free(d.stack);
	free(d.marks);
	free(d.memo);
	free(d.line);
	return rc;
}

const struct sf_pk *sf_pickle_root(const struct sf_pickle *p)
{
	return p ? p->root : NULL;
}

uint64_t sf_pickle_end(const struct sf_pickle *p)
{
	return p ? p->end : 0;
}

/* ------------------------------------------------------------------ */
/* accessors                                                           */

bool sf_pk_is_global(const struct sf_pk *v, const char *module,
		     const char *name)
{
	return v && v->kind == SF_PK_GLOBAL && module && name &&
	       !strcmp(v->u.global.module, module) &&
	       !strcmp(v->u.global.name, name);
}

bool sf_pk_is_obj(const struct sf_pk *v, const char *module, const char *name)
{
	return v && v->kind == SF_PK_OBJ &&
	       sf_pk_is_global(v->u.obj.callable, module, name);
}

const struct sf_pk *sf_pk_get(const struct sf_pk *dict, const char *key)
{
	if (dict && dict->kind == SF_PK_OBJ)
		dict = dict->u.obj.items;
	if (!dict || dict->kind != SF_PK_DICT || !key)
		return NULL;
	size_t klen = strlen(key);
	/* From the end: a repeated key's last value is the one Python keeps. */
	for (size_t i = dict->u.dict.n; i-- > 0;) {
		const struct sf_pk *k = dict->u.dict.k[i];
		if (k->kind == SF_PK_STR && k->u.str.len == klen &&
		    !memcmp(k->u.str.s, key, klen))
			return dict->u.dict.v[i];
	}
	return NULL;
}

const struct sf_pk *sf_pk_attr(const struct sf_pk *obj, const char *name)
{
	const struct sf_pk *st, *v;

	if (!obj || obj->kind != SF_PK_OBJ || !name)
		return NULL;
	st = obj->u.obj.state;
	if (!st)
		return NULL;
	if (st->kind == SF_PK_DICT)
		return sf_pk_get(st, name);
	if (st->kind == SF_PK_TUPLE && st->u.seq.n == 2) {
		/* Slots are set after __dict__ is updated: they win. */
		v = sf_pk_get(st->u.seq.v[1], name);
		return v ? v : sf_pk_get(st->u.seq.v[0], name);
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
	if (!v || (v->kind != SF_PK_INT && v->kind != SF_PK_BOOL))
		return false;
	if (out)
		*out = v->kind == SF_PK_INT ? v->u.i : (int64_t)v->u.b;
	return true;
}

bool sf_pk_uints(const struct sf_pk *v, unsigned flags, uint64_t *out,
		 size_t max, unsigned *n)
{
	size_t len;

	if ((flags & SF_PK_UINTS_SIZE) && sf_pk_is_obj(v, "torch", "Size"))
		v = sf_pk_item(v->u.obj.args, 0);
	if (!v || (v->kind != SF_PK_TUPLE &&
		   !((flags & SF_PK_UINTS_LIST) && v->kind == SF_PK_LIST)))
		return false;
	len = sf_pk_len(v);
	if (len > max)
		return false;
	for (size_t i = 0; i < len; i++) {
		int64_t x;

		if (!sf_pk_int(sf_pk_item(v, i), &x) || x < 0)
			return false;
		out[i] = (uint64_t)x;
	}
	*n = (unsigned)len;
	return true;
}

bool sf_pk_bytes_span(const struct sf_pk *v, uint64_t *off, uint64_t *len)
{
	if (!v || v->kind != SF_PK_BYTES || v->u.bytes.escaped)
		return false;
	*off = v->u.bytes.off;
	*len = v->u.bytes.len;
	return true;
}

const char *sf_pk_str(const struct sf_pk *v)
{
	if (!v || v->kind != SF_PK_STR || strlen(v->u.str.s) != v->u.str.len)
		return NULL; /* not a STR, or one with a NUL inside */
	return v->u.str.s;
}
