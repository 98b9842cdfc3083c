/*
 * test_pickle.c - the restricted pickle reader (core/formats/sf_pickle.c).
 *
 * Usage: test_pickle [CORPUS]   (CORPUS: test/corpus/pickle, optional;
 * walked by corpus_case.h)
 *
 * Without CORPUS: hand-built pickles for the opcodes Python 3 never
 * writes (STRING escapes, INT bools, PERSID, POP_MARK, ...), the caps of
 * sf_pickle_opts, a 1 GiB BINBYTES8 in a sparse file (recorded, never
 * read), every prefix of a small pickle (each must fail -SF_EFORMAT), and
 * the accessors on NULL and on nodes of the wrong kind.
 *
 * With CORPUS (written by test/unit/pickle_cases.py from real pickles):
 * every valid/CASE is loaded from memory and from a region in the middle
 * of a file; dump() of the result must equal expected.txt, which Python's
 * own unpickler produced; every BYTES node's copy must equal the input at
 * its (off, len); raw.bin (a numpy array's bytes) must be found at some
 * BYTES node's (off, len) in the file, or, for protocol 2, as the latin-1
 * string numpy's _codecs.encode call carries; without its allowlist the
 * load is refused; truncating it anywhere fails -SF_EFORMAT; a few cases
 * are also read through the accessors the DCP adapter uses. Every
 * invalid/CASE must fail with the error and reason in its `error` file.
 * special/CASE (main's first corpus): numpy arrays of protocols 3 and 4
 * (the raw data lies at the recorded offset; refused without numpy on
 * the allowlist), an OrderedDict (SETITEMS on a call), a dataclass
 * (NEWOBJ + BUILD dict) and a __slots__ object (BUILD with a (None,
 * slots) tuple). And a dict with a repeated key answers the last value.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "corpus_case.h"
#include "sf_error.h"
#include "sf_io.h"
#include "sf_pickle.h"
#include "sf_test.h"

/* ------------------------------------------------------------------ */
/* a growing string                                                    */

struct sb {
	char *s;
	size_t n, cap;
};

static void sb_add(struct sb *b, const char *fmt, ...)
{
	va_list ap;
	int k;

	for (;;) {
		va_start(ap, fmt);
		k = vsnprintf(b->s ? b->s + b->n : NULL, b->s ? b->cap - b->n : 0,
			      fmt, ap);
		va_end(ap);
		if (k < 0)
			abort();
		if (b->s && b->n + (size_t)k < b->cap)
			break;
		b->cap = (b->cap + (size_t)k + 1) * 2;
		b->s = realloc(b->s, b->cap);
		if (!b->s)
			abort();
	}
	b->n += (size_t)k;
}

/* ------------------------------------------------------------------ */
/* the dumper (format: see pickle_cases.py)                            */

#define DUMP_MAX_DEPTH 200

static uint64_t fnv_step(uint64_t h, const unsigned char *p, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		h ^= p[i];
		h *= 0x100000001b3ull;
	}
	return h;
}

static void dump_text(struct sb *b, char kind, const unsigned char *p, size_t n)
{
	if (n > 64) {
		sb_add(b, "%c:%zu#%016llx", kind, n,
		       (unsigned long long)fnv_step(0xcbf29ce484222325ull, p, n));
		return;
	}
	sb_add(b, kind == 'b' ? "b'" : "'");
	for (size_t i = 0; i < n; i++)
		if (p[i] >= 0x20 && p[i] < 0x7f && p[i] != '\\' && p[i] != '\'')
			sb_add(b, "%c", p[i]);
		else
			sb_add(b, "\\x%02x", p[i]);
	sb_add(b, "'");
}

struct dumper {
	struct sb out;
	const struct sf_input *in;
	const struct sf_pk *path[DUMP_MAX_DEPTH];
	size_t depth;
	unsigned long bytes_checked, bytes_bad;
};

static void dump(struct dumper *d, const struct sf_pk *v);

static void dump_pairs(struct dumper *d, const struct sf_pk *dict)
{
	sb_add(&d->out, "{");
	for (size_t i = 0; i < dict->u.dict.n; i++) {
		if (i)
			sb_add(&d->out, ", ");
		dump(d, dict->u.dict.k[i]);
		sb_add(&d->out, ": ");
		dump(d, dict->u.dict.v[i]);
	}
	sb_add(&d->out, "}");
}

/* BYTES: from the input at (off, len), which must match the copy; an
 * escaped STRING's value is its copy only (sf_pk_bytes_span refuses it). */
static void dump_bytes(struct dumper *d, const struct sf_pk *v)
{
	uint64_t len = v->u.bytes.len, off, slen;
	unsigned char *buf;

	if (v->u.bytes.escaped) {
		if (!v->u.bytes.data || sf_pk_bytes_span(v, &off, &slen))
			d->bytes_bad++;
		else
			d->bytes_checked++;
		dump_text(&d->out, 'b', v->u.bytes.data ? v->u.bytes.data :
			  (const unsigned char *)"", v->u.bytes.data ? len : 0);
		return;
	}
	if (!sf_pk_bytes_span(v, &off, &slen) || off != v->u.bytes.off || slen != len)
		d->bytes_bad++;
	buf = malloc(len ? len : 1);

	if (!buf || sf_input_read(d->in, buf, len, v->u.bytes.off) < 0) {
		d->bytes_bad++;
		sb_add(&d->out, "<bytes outside the input>");
		free(buf);
		return;
	}
	d->bytes_checked++;
	if ((len <= SF_PK_BYTES_COPY) != (v->u.bytes.data != NULL) ||
	    (v->u.bytes.data && memcmp(v->u.bytes.data, buf, len)))
		d->bytes_bad++;
	dump_text(&d->out, 'b', buf, len);
	free(buf);
}

static void dump(struct dumper *d, const struct sf_pk *v)
{
	struct sb *o = &d->out;

	switch (v->kind) {
	case SF_PK_NONE: sb_add(o, "None"); return;
	case SF_PK_BOOL: sb_add(o, v->u.b ? "True" : "False"); return;
	case SF_PK_INT: sb_add(o, "%lld", (long long)v->u.i); return;
	case SF_PK_FLOAT: sb_add(o, "f:%.17g", v->u.f); return;
	case SF_PK_STR:
		CHECK(v->u.str.s[v->u.str.len] == 0);
		CHECK((sf_pk_str(v) != NULL) == (strlen(v->u.str.s) == v->u.str.len));
		dump_text(o, 's', (const unsigned char *)v->u.str.s, v->u.str.len);
		return;
	case SF_PK_BYTES: dump_bytes(d, v); return;
	case SF_PK_GLOBAL:
		sb_add(o, "G(%s.%s)", v->u.global.module, v->u.global.name);
		return;
	default:
		break;
	}
	for (size_t i = 0; i < d->depth; i++)
		if (d->path[i] == v) {
			sb_add(o, "...");
			return;
		}
	if (d->depth == DUMP_MAX_DEPTH) {
		sb_add(o, "<deep>");
		return;
	}
	d->path[d->depth++] = v;
	switch (v->kind) {
	case SF_PK_TUPLE:
	case SF_PK_LIST:
		sb_add(o, v->kind == SF_PK_TUPLE ? "(" : "[");
		for (size_t i = 0; i < v->u.seq.n; i++) {
			if (i)
				sb_add(o, ", ");
			dump(d, v->u.seq.v[i]);
		}
		sb_add(o, v->kind == SF_PK_TUPLE ? ")" : "]");
		break;
	case SF_PK_DICT:
		dump_pairs(d, v);
		break;
	case SF_PK_PERSID:
		sb_add(o, "PID(");
		dump(d, v->u.persid);
		sb_add(o, ")");
		break;
	case SF_PK_OBJ:
		sb_add(o, "OBJ(");
		dump(d, v->u.obj.callable);
		sb_add(o, ", ");
		dump(d, v->u.obj.args);
		if (v->u.obj.newobj)
			sb_add(o, ", new");
		if (v->u.obj.kwargs && v->u.obj.kwargs->u.dict.n) {
			sb_add(o, ", kwargs=");
			dump_pairs(d, v->u.obj.kwargs);
		}
		if (v->u.obj.state) {
			sb_add(o, ", state=");
			dump(d, v->u.obj.state);
		}
		if (v->u.obj.items) {
			sb_add(o, ", items=");
			dump_pairs(d, v->u.obj.items);
		}
		if (v->u.obj.elems) {
			sb_add(o, ", elems=");
			dump(d, v->u.obj.elems);
		}
		sb_add(o, ")");
		break;
	default:
		sb_add(o, "<kind %d>", (int)v->kind);
	}
	d->depth--;
}

/* The dump of p's root (malloc'd); bytes checked against in. */
static char *dump_doc(const struct sf_pickle *p, const struct sf_input *in)
{
	struct dumper d = {.in = in};

	dump(&d, sf_pickle_root(p));
	CHECK_EQ(d.bytes_bad, 0);
	sb_add(&d.out, "%s", "");
	return d.out.s;
}

/* ------------------------------------------------------------------ */
/* helpers                                                             */

static const char *code_name(int rc)
{
	switch (rc) {
	case 0: return "0";
	case -SF_EFORMAT: return "SF_EFORMAT";
	case -SF_EREFUSED: return "SF_EREFUSED";
	case -SF_ETOOBIG: return "SF_ETOOBIG";
	case -ENOMEM: return "ENOMEM";
	case -EIO: return "EIO";
	default: return "other";
	}
}

static bool one_line(const char *err)
{
	if (!err[0])
		return false;
	for (const char *p = err; *p; p++)
		if ((unsigned char)*p < 0x20 || (unsigned char)*p >= 0x7f)
			return false;
	return true;
}

/* Load buf[0..len) from memory. */
static int load_mem(const void *buf, size_t len, const struct sf_pickle_opts *o,
		    struct sf_pickle **p, char *err, size_t errlen)
{
	struct sf_input in = sf_input_mem(buf, len);

	return sf_pickle_load(&in, o, p, err, errlen);
}

/* Expect buf to fail with rc and a message holding `what`. */
static void expect_fail(const char *name, const void *buf, size_t len,
			const struct sf_pickle_opts *o, int want, const char *what)
{
	struct sf_pickle *p = (struct sf_pickle *)1;
	char err[256];
	int rc = load_mem(buf, len, o, &p, err, sizeof(err));

	if (!CHECK(rc == want && p == NULL && one_line(err) &&
		   (!what || strstr(err, what))))
		fprintf(stderr, "  %s: rc %d (%s) want %s, err '%s', want '%s'\n",
			name, rc, code_name(rc), code_name(want), err,
			what ? what : "");
	if (rc == 0)
		sf_pickle_free(p);
}

/* Load buf, which must succeed; dump must equal want (when non-NULL). */
static struct sf_pickle *expect_ok(const char *name, const void *buf, size_t len,
				   const struct sf_pickle_opts *o, const char *want)
{
	struct sf_input in = sf_input_mem(buf, len);
	struct sf_pickle *p = NULL;
	char err[256];
	int rc = sf_pickle_load(&in, o, &p, err, sizeof(err));

	if (!CHECK(rc == 0 && p)) {
		fprintf(stderr, "  %s: rc %d: %s\n", name, rc, err);
		return NULL;
	}
	if (want) {
		char *got = dump_doc(p, &in);
		if (!CHECK(strcmp(got, want) == 0))
			fprintf(stderr, "  %s:\n   got  %s\n   want %s\n", name, got,
				want);
		free(got);
	}
	return p;
}

#define S(lit) lit, sizeof(lit) - 1

/* ------------------------------------------------------------------ */
/* hand-built pickles                                                  */

static const struct sf_pk_global test_allow[] = {
	{"__builtin__", "object"},
	{"builtins", "object"},
	{"mod", "Cls"},
	{"torch", "FloatStorage"},
};

static const struct sf_pickle_opts allow_opts = {
	.allow = test_allow,
	.nallow = sizeof(test_allow) / sizeof(test_allow[0]),
};

static void test_opcodes(void)
{
	struct sf_pickle *p;

	/* Protocol 0 text forms. */
	p = expect_ok("text ints", S("(I01\nI00\nI-17\nI+5\nL123L\nL-9223372036854775808L\n"
			  "I9223372036854775807\nF-1.25\nFinf\nNt."), NULL,
		      "(True, False, -17, 5, 123, -9223372036854775808, "
		      "9223372036854775807, f:-1.25, f:inf, None)");
	sf_pickle_free(p);
	p = expect_ok("STRING escapes", S("(S'a\\'b\\\\c\\n\\x41\\101\\q'\nS\"plain\"\nS''\nt."),
		      NULL, NULL);
	if (p) {
		/* Escaped: data is the decoded value, not the input's bytes,
		 * and no span is given for it (issue 30: never served by
		 * offset). */
		const struct sf_pk *e = sf_pk_item(sf_pickle_root(p), 0);
		uint64_t off = 1, len = 1;
		CHECK(e && e->kind == SF_PK_BYTES && e->u.bytes.len == 10 &&
		      e->u.bytes.data && e->u.bytes.escaped &&
		      !memcmp(e->u.bytes.data, "a'b\\c\nAA\\q", 10));
		CHECK(!sf_pk_bytes_span(e, &off, &len) && off == 1 && len == 1);
		CHECK(sf_pk_item(sf_pickle_root(p), 2)->u.bytes.len == 0);
		/* Without escapes the bytes are the input's at off. */
		const struct sf_pk *plain = sf_pk_item(sf_pickle_root(p), 1);
		CHECK(plain && plain->kind == SF_PK_BYTES && plain->u.bytes.off == 26 &&
		      plain->u.bytes.len == 5 && !plain->u.bytes.escaped);
		CHECK(sf_pk_bytes_span(plain, &off, &len) && off == 26 && len == 5);
		CHECK(!sf_pk_bytes_span(sf_pickle_root(p), &off, &len)); /* a tuple */
		CHECK(!sf_pk_bytes_span(NULL, &off, &len));
	}
	sf_pickle_free(p);
	/* The escaped STRING's data is decoded, not the input's bytes: the
	 * dumper reads the input, so check data directly. */
	p = expect_ok("STRING escaped data", S("S'x\\ty'\n."), &allow_opts, NULL);
	if (p) {
		const struct sf_pk *r = sf_pickle_root(p);
		CHECK(r->kind == SF_PK_BYTES && r->u.bytes.len == 3 &&
		      r->u.bytes.data && !memcmp(r->u.bytes.data, "x\ty", 3));
	}
	sf_pickle_free(p);
	p = expect_ok("UNICODE", S("(Vabc\nVcaf\xe9\nV\\u2603\\U0001f600\\x\nV\nt."), NULL,
		      "('abc', 'caf\\xc3\\xa9', '\\xe2\\x98\\x83\\xf0\\x9f\\x98\\x80\\x5cx', '')");
	sf_pickle_free(p);
	/* Binary ints, LONG1 edges, BINFLOAT. */
	p = expect_ok("binary ints", S("\x80\x02(J\xff\xff\xff\xffK\xffM\xff\xff"
			  "\x8a\x00\x8a\x01\x80\x8a\x08\xff\xff\xff\xff\xff\xff\xff\x7f"
			  "\x8a\x08\x00\x00\x00\x00\x00\x00\x00\x80"
			  "\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x80\xff"
			  "\x8a\x0a\xff\xff\xff\xff\xff\xff\xff\x7f\x00\x00"
			  "\x8b\x02\x00\x00\x00\x01\x01"
			  "G\x3f\xf8\x00\x00\x00\x00\x00\x00t."), NULL,
		      "(-1, 255, 65535, 0, -128, 9223372036854775807, "
		      "-9223372036854775808, -9223372036854775808, "
		      "9223372036854775807, 257, f:1.5)");
	sf_pickle_free(p);
	expect_fail("LONG1 9 bytes positive 2**63", S("\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x80\x00."),
		    NULL, -SF_ETOOBIG, "does not fit");
	expect_fail("LONG1 -2**63-1", S("\x8a\x09\xff\xff\xff\xff\xff\xff\xff\x7f\xff."),
		    NULL, -SF_ETOOBIG, "does not fit");
	expect_fail("INT too big", S("I9223372036854775808\n."), NULL, -SF_ETOOBIG,
		    "does not fit");
	expect_fail("LONG4 negative length", S("\x8b\xff\xff\xff\xff."), NULL,
		    -SF_EFORMAT, "negative length");
	/* Stack and memo: DUP, POP, POP_MARK, POP of a bare mark, PUT/GET. */
	p = expect_ok("stack ops", S("(K\x01K\x02" "1" "(0]20p7\nK\x05" "ag7\nK\x05" "a0"
			  "K\x03q\x02\x94r\x05\x00\x00\x00h\x02j\x05\x00\x00\x00"
			  "\x87\x86."), NULL,
		      "([5, 5], (3, 3, 3))");
	sf_pickle_free(p);
	/* Containers: DICT, LIST, TUPLE1-3, sets, APPENDS, SETITEMS. */
	p = expect_ok("containers", S("\x80\x04((K\x01K\x02" "dK\x03\x85(K\x04lq\x00"
			  "(K\x05K\x06" "eh\x00\x8f(K\x07\x90(K\x08\x91}(\x8c\x01kK\x09u"
			  "\x8c\x01zK\x0as\x8c\x01z\x8c\x01y\x86t."), NULL,
		      "({1: 2}, (3), [4, 5, 6], [4, 5, 6], [7], [8], {'k': 9, 'z': 10}, ('z', 'y'))");
	sf_pickle_free(p);
	/* Objects: NEWOBJ_EX, BUILD, BINPERSID, PERSID, SETITEMS on an OBJ,
	 * APPEND on an OBJ. */
	p = expect_ok("objects", S("\x80\x04(\x8c\x03mod\x8c\x03" "Cls\x93q\x00)}\x8c\x01kK\x01s\x92"
			  "}\x8c\x01" "aK\x02sbh\x00)\x81K\x03" "aK\x04K\x05s"
			  "ctorch\nFloatStorage\n\x85QPid7\nt."), &allow_opts,
		      "(OBJ(G(mod.Cls), (), new, kwargs={'k': 1}, state={'a': 2}), "
		      "OBJ(G(mod.Cls), (), new, items={4: 5}, elems=[3]), "
		      "PID((G(torch.FloatStorage))), PID('id7'))");
	if (p) {
		const struct sf_pk *r = sf_pickle_root(p), *o = sf_pk_item(r, 0);
		CHECK(sf_pk_is_obj(o, "mod", "Cls"));
		CHECK(!sf_pk_is_obj(o, "mod", "Other"));
		CHECK(sf_pk_is_global(o->u.obj.callable, "mod", "Cls"));
		int64_t a = 0;
		CHECK(sf_pk_int(sf_pk_attr(o, "a"), &a) && a == 2);
		CHECK(sf_pk_attr(o, "b") == NULL);
		CHECK(sf_pk_get(sf_pk_item(r, 1), "k") == NULL);
		CHECK_EQ(sf_pickle_end(p), sizeof("\x80\x04(\x8c\x03mod\x8c\x03" "Cls\x93q\x00)}\x8c\x01kK\x01s\x92"
				  "}\x8c\x01" "aK\x02sbh\x00)\x81K\x03" "aK\x04K\x05s"
				  "ctorch\nFloatStorage\n\x85QPid7\nt.") - 1);
	}
	sf_pickle_free(p);
	/* A self-referencing list through the memo; FRAME; trailing bytes
	 * after STOP are ignored and sf_pickle_end says where STOP ended. */
	p = expect_ok("cycle+frame", S("\x80\x04\x95\x08\x00\x00\x00\x00\x00\x00\x00"
			  "]\x94(K\x01h\x00" "e.garbage"), NULL, "[1, ...]");
	CHECK_EQ(sf_pickle_end(p), 20);
	sf_pickle_free(p);
	/* Duplicate keys: sf_pk_get answers the last, like Python. */
	p = expect_ok("dup keys", S("(X\x01\x00\x00\x00kK\x01X\x01\x00\x00\x00kK\x02" "d."), NULL, NULL);
	if (p) {
		int64_t v = 0;
		CHECK(sf_pk_int(sf_pk_get(sf_pickle_root(p), "k"), &v) && v == 2);
	}
	sf_pickle_free(p);
	/* Refusals that the corpus does not carry. */
	expect_fail("global refused by default", S("c__builtin__\nobject\n."), NULL,
		    -SF_EREFUSED, "global __builtin__.object is not allowed");
	expect_fail("refused name sanitized", S("cos\nsys\x01tem\n."), NULL,
		    -SF_EREFUSED, "os.sys?tem");
	expect_fail("GLOBAL not UTF-8", S("cos\xff\nx\n."), &allow_opts, -SF_EFORMAT,
		    "UTF-8");
	expect_fail("PERSID not ASCII", S("P\xc3\xa9\n."), NULL, -SF_EFORMAT, "ASCII");
	/* A STR with a NUL inside: kept whole, but never a C string. */
	p = expect_ok("NUL in strs", S("(Va\\u0000b\nX\x03\x00\x00\x00" "a\x00" "b"
			  "\x8c\x01" "aK\x01" "d."), NULL, "{'a\\x00b': 'a\\x00b', 'a': 1}");
	if (p) {
		const struct sf_pk *r = sf_pickle_root(p);
		CHECK(sf_pk_str(r->u.dict.k[0]) == NULL && r->u.dict.k[0]->u.str.len == 3);
		int64_t one = 0;
		CHECK(sf_pk_int(sf_pk_get(r, "a"), &one) && one == 1);
	}
	sf_pickle_free(p);
	expect_fail("STRING trailing backslash", S("S'a\\'\n."), NULL, -SF_EFORMAT,
		    "backslash");
	expect_fail("STRING bad hex", S("S'\\xZ1'\n."), NULL, -SF_EFORMAT, "\\x");
	expect_fail("FLOAT hex", S("F0x1p3\n."), NULL, -SF_EFORMAT, "malformed float");
	expect_fail("FLOAT empty", S("F\n."), NULL, -SF_EFORMAT, "malformed float");
	expect_fail("NEWOBJ_EX kwargs", S("\x80\x04N))\x92."), NULL, -SF_EFORMAT,
		    "not a dict");
	expect_fail("GET malformed", S("g-1\n."), NULL, -SF_EFORMAT, "memo index");
	expect_fail("PUT on empty", S("p0\n."), NULL, -SF_EFORMAT, "underflow");
	expect_fail("APPEND above mark", S("](K\x01" "a."), NULL, -SF_EFORMAT,
		    "underflow");
	expect_fail("BUILD on a dict", S("}}b."), NULL, -SF_EFORMAT, "not an object");
	expect_fail("line too long (no newline in 64 KiB)", NULL, 0, NULL,
		    -SF_EFORMAT, NULL); /* empty input */
}

/* Caps of sf_pickle_opts. */
static void test_caps(void)
{
	struct sf_pickle_opts o = {0};
	char buf[64];

	o.max_nodes = 3;
	expect_fail("max_nodes", S("(K\x01K\x02K\x03t."), &o, -SF_ETOOBIG,
		    "max_nodes");
	o = (struct sf_pickle_opts){.max_depth = 2};
	expect_fail("max_depth stack", S("K\x01K\x02K\x03"), &o, -SF_ETOOBIG,
		    "max_depth");
	expect_fail("max_depth marks", S("((("), &o, -SF_ETOOBIG, "max_depth");
	o = (struct sf_pickle_opts){.max_memo = 10};
	expect_fail("max_memo", S("K\x01q\x0a."), &o, -SF_ETOOBIG, "max_memo");
	struct sf_pickle *p = expect_ok("max_memo edge", S("K\x01q\x09h\x09\x86."),
					&o, "(1, 1)");
	sf_pickle_free(p);
	o = (struct sf_pickle_opts){.max_bytes = 32};
	memcpy(buf, "X\x28\x00\x00\x00", 5);
	memset(buf + 5, 'a', 40);
	buf[45] = '.';
	expect_fail("max_bytes string", buf, 46, &o, -SF_ETOOBIG, "max_bytes");
	expect_fail("max_bytes list", S("(K\x01K\x01K\x01K\x01K\x01K\x01K\x01K\x01l."),
		    &o, -SF_ETOOBIG, "max_bytes");
	expect_fail("max_bytes UNICODE line", S("Vaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\n."),
		    &o, -SF_ETOOBIG, "max_bytes");
	/* A memo index far out with the default cap: refused before any
	 * allocation of that size. */
	expect_fail("memo index 2**32-1", S("K\x01r\xff\xff\xff\xff."), NULL,
		    -SF_ETOOBIG, "max_memo");
}

/* A 1 GiB BINBYTES8 in a sparse file, read as a region of it: recorded
 * (off, len), data NULL, never read. */
static void test_big_bytes(void)
{
	char path[] = "/tmp/test_pickle.XXXXXX";
	const uint64_t big = 1ull << 30, base = 4096;
	unsigned char head[16] = {0x80, 0x04, 0x8e};
	struct sf_pickle *p = NULL;
	struct sf_input in;
	char err[256];
	int fd = mkstemp(path), rc;

	if (!CHECK(fd >= 0))
		return;
	unlink(path);
	for (int i = 0; i < 8; i++)
		head[3 + i] = (unsigned char)(big >> (8 * i));
	CHECK(pwrite(fd, head, 11, base) == 11);
	CHECK(pwrite(fd, ".", 1, base + 11 + big) == 1);
	CHECK(pwrite(fd, "junk", 4, base + 12 + big) == 4);
	in = sf_input_fd(fd, base, 12 + big);
	rc = sf_pickle_load(&in, NULL, &p, err, sizeof(err));
	if (CHECK(rc == 0)) {
		const struct sf_pk *r = sf_pickle_root(p);
		CHECK(r->kind == SF_PK_BYTES && r->u.bytes.off == 11 &&
		      r->u.bytes.len == big && r->u.bytes.data == NULL);
		CHECK_EQ(sf_pickle_end(p), 12 + big);
		sf_pickle_free(p);
	} else {
		fprintf(stderr, "  big bytes: %s\n", err);
	}
	/* One byte short: the STOP is outside the region. */
	in = sf_input_fd(fd, base, 11 + big);
	rc = sf_pickle_load(&in, NULL, &p, err, sizeof(err));
	CHECK(rc == -SF_EFORMAT && p == NULL);
	/* The region ends inside the bytes. */
	in = sf_input_fd(fd, base, 100);
	rc = sf_pickle_load(&in, NULL, &p, err, sizeof(err));
	CHECK(rc == -SF_EFORMAT && strstr(err, "truncated"));
	close(fd);
}

/* Every proper prefix of buf fails with -SF_EFORMAT, from memory. */
static void truncations(const char *name, const unsigned char *buf, size_t len,
			const struct sf_pickle_opts *o)
{
	unsigned long bad = 0;

	for (size_t n = 0; n < len; n++) {
		struct sf_pickle *p = (struct sf_pickle *)1;
		char err[256];
		unsigned char *copy = malloc(n ? n : 1); /* exact size: ASan */
		memcpy(copy, buf, n);
		int rc = load_mem(copy, n, o, &p, err, sizeof(err));
		if (rc != -SF_EFORMAT || p || !one_line(err)) {
			if (bad++ < 3)
				fprintf(stderr, "  %s cut at %zu: rc %d: %s\n", name, n,
					rc, err);
			if (rc == 0)
				sf_pickle_free(p);
		}
		free(copy);
	}
	CHECK_EQ(bad, 0);
}

static void test_truncations(void)
{
	static const unsigned char small[] =
		"\x80\x04\x95\x02\x00\x00\x00\x00\x00\x00\x00}\x94(\x8c\x01" "a\x94"
		"]\x94(K\x01J\xff\xff\xff\xff\x8a\x02\x00\x01G\x3f\xf0\x00\x00\x00"
		"\x00\x00\x00" "e\x8c\x01" "b\x94" "C\x03xyzh\x01\x86u.";
	struct sf_pickle *p = expect_ok("small", small, sizeof(small) - 1, NULL,
		"{'a': [1, -1, 256, f:1], 'b': (b'xyz', 'a')}");
	sf_pickle_free(p);
	truncations("small", small, sizeof(small) - 1, NULL);
	static const unsigned char text[] =
		"(dp0\nVkey\np1\n(lp2\nI01\naL5L\naF0.5\naS'q'\nag1\nas.";
	p = expect_ok("text", text, sizeof(text) - 1, NULL,
		      "{'key': [True, 5, f:0.5, b'q', 'key']}");
	sf_pickle_free(p);
	truncations("text", text, sizeof(text) - 1, NULL);
}

static void test_accessors(void)
{
	int64_t i = 7;

	CHECK(!sf_pk_is_global(NULL, "a", "b"));
	CHECK(!sf_pk_is_obj(NULL, "a", "b"));
	CHECK(sf_pk_get(NULL, "k") == NULL);
	CHECK(sf_pk_attr(NULL, "k") == NULL);
	CHECK(sf_pk_item(NULL, 0) == NULL);
	CHECK_EQ(sf_pk_len(NULL), 0);
	CHECK(!sf_pk_int(NULL, &i) && i == 7);
	CHECK(sf_pk_str(NULL) == NULL);
	CHECK(sf_pickle_root(NULL) == NULL);
	CHECK_EQ(sf_pickle_end(NULL), 0);
	sf_pickle_free(NULL);

	struct sf_pickle *p = expect_ok("kinds", S("(\x88K\x05X\x01\x00\x00\x00s}N]t."),
					NULL, "(True, 5, 's', {}, None, [])");
	if (!p)
		return;
	const struct sf_pk *r = sf_pickle_root(p);
	CHECK_EQ(sf_pk_len(r), 6);
	CHECK(sf_pk_item(r, 6) == NULL);
	CHECK(sf_pk_int(sf_pk_item(r, 0), &i) && i == 1);
	CHECK(sf_pk_int(sf_pk_item(r, 1), &i) && i == 5);
	CHECK(!sf_pk_int(sf_pk_item(r, 2), &i));
	CHECK(sf_pk_str(sf_pk_item(r, 2)) && !strcmp(sf_pk_str(sf_pk_item(r, 2)), "s"));
	CHECK(sf_pk_str(sf_pk_item(r, 1)) == NULL);
	for (size_t k = 0; k < 6; k++) {
		const struct sf_pk *v = sf_pk_item(r, k);
		CHECK(sf_pk_get(v, "s") == NULL);
		CHECK(sf_pk_attr(v, "s") == NULL);
		CHECK(!sf_pk_is_global(v, "a", "b") && !sf_pk_is_obj(v, "a", "b"));
		CHECK(sf_pk_item(v, 0) == NULL);
	}
	CHECK_EQ(sf_pk_len(sf_pk_item(r, 3)), 0);
	CHECK_EQ(sf_pk_len(sf_pk_item(r, 2)), 0);
	sf_pickle_free(p);
}

/* ------------------------------------------------------------------ */
/* the corpus                                                          */

/* allow.txt: "module name" lines, into a list (strings in *store). */
static struct sf_pk_global *parse_allow(char *text, size_t *n)
{
	struct sf_pk_global *g = calloc(256, sizeof(*g));
	char *save = NULL;

	*n = 0;
	for (char *line = strtok_r(text, "\n", &save); line && *n < 256;
	     line = strtok_r(NULL, "\n", &save)) {
		char *sp = strchr(line, ' ');
		if (!sp)
			continue;
		*sp = 0;
		g[*n].module = line;
		g[*n].name = sp + 1;
		(*n)++;
	}
	return g;
}

/* Find raw (a numpy array's bytes): at a BYTES node's (off, len) in the
 * input, or as the latin-1 STR of a protocol-2 _codecs.encode call.
 * Returns 1 (bytes), 2 (latin-1 str) or 0. */
static int find_raw(const struct sf_pk *v, const struct sf_input *in,
		    const unsigned char *raw, size_t rawlen, int depth)
{
	int r;

	if (!v || depth > 50)
		return 0;
	switch (v->kind) {
	case SF_PK_BYTES:
		if (v->u.bytes.len == rawlen) {
			unsigned char *b = malloc(rawlen ? rawlen : 1);
			int ok = b && sf_input_read(in, b, rawlen, v->u.bytes.off) == 0 &&
				 !memcmp(b, raw, rawlen);
			free(b);
			return ok ? 1 : 0;
		}
		return 0;
	case SF_PK_OBJ:
		if (sf_pk_is_global(v->u.obj.callable, "_codecs", "encode") &&
		    sf_pk_str(sf_pk_item(v->u.obj.args, 1)) &&
		    !strcmp(sf_pk_str(sf_pk_item(v->u.obj.args, 1)), "latin1")) {
			const struct sf_pk *s = sf_pk_item(v->u.obj.args, 0);
			const unsigned char *u;
			size_t k = 0, i = 0;
			if (!s || s->kind != SF_PK_STR)
				return 0;
			u = (const unsigned char *)s->u.str.s;
			for (; i < s->u.str.len && k < rawlen; k++) {
				unsigned c = u[i];
				if (c >= 0x80) { /* U+0080..U+00FF: 2 bytes */
					c = ((c & 0x1f) << 6) | (u[i + 1] & 0x3f);
					i += 2;
				} else {
					i++;
				}
				if (c != raw[k])
					return 0;
			}
			return i == s->u.str.len && k == rawlen ? 2 : 0;
		}
		if ((r = find_raw(v->u.obj.args, in, raw, rawlen, depth + 1)))
			return r;
		return find_raw(v->u.obj.state, in, raw, rawlen, depth + 1);
	case SF_PK_TUPLE:
	case SF_PK_LIST:
		for (size_t i = 0; i < v->u.seq.n; i++)
			if ((r = find_raw(v->u.seq.v[i], in, raw, rawlen, depth + 1)))
				return r;
		return 0;
	default:
		return 0;
	}
}

/* What the DCP adapter and torch loader will read, on real files. */
static void case_checks(const char *name, const struct sf_pk *r)
{
	int64_t x;

	if (!strcmp(name, "slots_p4") || !strcmp(name, "slots_p2")) {
		CHECK(sf_pk_is_obj(r, "__main__", "Slotted"));
		CHECK(sf_pk_int(sf_pk_attr(r, "a"), &x) && x == 1);
		CHECK(sf_pk_str(sf_pk_attr(r, "b")) &&
		      !strcmp(sf_pk_str(sf_pk_attr(r, "b")), "two"));
	}
	if (!strcmp(name, "dataclass_p4")) {
		const struct sf_pk *pt = sf_pk_item(r, 0);
		CHECK(sf_pk_is_obj(pt, "__main__", "Point"));
		CHECK(sf_pk_int(sf_pk_attr(pt, "x"), &x) && x == 3);
		CHECK(sf_pk_str(sf_pk_attr(pt, "name")) &&
		      !strcmp(sf_pk_str(sf_pk_attr(pt, "name")), "p\xc3\xa9"));
	}
	if (!strcmp(name, "ordered_dict_p4")) {
		CHECK(sf_pk_is_obj(r, "collections", "OrderedDict"));
		CHECK(sf_pk_int(sf_pk_get(r, "a"), &x) && x == 1);
		CHECK_EQ(sf_pk_len(sf_pk_get(r, "b")), 2);
	}
	if (!strcmp(name, "torch_save_data_pkl")) {
		const struct sf_pk *w = sf_pk_get(r, "w"), *t = sf_pk_get(r, "t");
		CHECK(sf_pk_is_obj(w, "torch._utils", "_rebuild_tensor_v2"));
		const struct sf_pk *pid = sf_pk_item(w ? w->u.obj.args : NULL, 0);
		CHECK(pid && pid->kind == SF_PK_PERSID);
		const struct sf_pk *id = pid ? pid->u.persid : NULL;
		CHECK(sf_pk_str(sf_pk_item(id, 0)) &&
		      !strcmp(sf_pk_str(sf_pk_item(id, 0)), "storage"));
		CHECK(sf_pk_is_global(sf_pk_item(id, 1), "torch", "FloatStorage"));
		CHECK(sf_pk_int(sf_pk_item(id, 4), &x) && x == 6);
		/* t = w.t(): the same storage, memoized by the pickler. */
		const struct sf_pk *tpid = sf_pk_item(t ? t->u.obj.args : NULL, 0);
		CHECK(tpid && tpid->kind == SF_PK_PERSID);
	}
	if (!strcmp(name, "dcp_metadata_torch113")) {
		const char *m = "torch.distributed._shard.checkpoint.metadata";
		CHECK(sf_pk_is_obj(r, m, "Metadata"));
		const struct sf_pk *sdm = sf_pk_attr(r, "state_dict_metadata");
		const struct sf_pk *w = sf_pk_get(sdm, "layer.weight");
		CHECK(sf_pk_is_obj(w, m, "TensorStorageMetadata"));
		const struct sf_pk *size = sf_pk_attr(w, "size");
		CHECK(sf_pk_is_obj(size, "torch", "Size"));
		const struct sf_pk *dims = sf_pk_item(size ? size->u.obj.args : NULL, 0);
		CHECK(sf_pk_len(dims) == 2 && sf_pk_int(sf_pk_item(dims, 0), &x) &&
		      x == 4 && sf_pk_int(sf_pk_item(dims, 1), &x) && x == 3);
		/* TensorProperties' state is a tuple, not a dict. */
		const struct sf_pk *props = sf_pk_attr(w, "properties");
		CHECK(props && props->u.obj.state &&
		      props->u.obj.state->kind == SF_PK_TUPLE);
		CHECK(sf_pk_is_global(sf_pk_item(props ? props->u.obj.state : NULL, 0),
				      "torch", "float32"));
		CHECK(sf_pk_is_obj(sf_pk_get(sdm, "extra"), m, "BytesStorageMetadata"));
		CHECK_EQ(sf_pk_len(sf_pk_attr(r, "storage_data")), 4);
	}
}

static void valid_case(struct corpus_case *c, void *arg)
{
	const char *name = c->name;
	size_t len = c->len, elen = strlen(c->want), alen, rawlen = 0, nallow = 0;
	char *in = c->input, *want = c->want;
	char *allow_text = corpus_slurp(c->dir, "allow.txt", &alen);
	char *raw = corpus_slurp(c->dir, "raw.bin", &rawlen);
	struct sf_pk_global *allow;
	struct sf_pickle *p = NULL;
	char err[256], path[] = "/tmp/test_pickle.XXXXXX";
	int rc, fd;

	(void)arg;
	if (!CHECK(allow_text)) {
		fprintf(stderr, "  %s: no allow.txt\n", c->dir);
		goto out_free;
	}
	if (elen && want[elen - 1] == '\n')
		want[elen - 1] = 0;
	allow = parse_allow(allow_text, &nallow);
	struct sf_pickle_opts o = {.allow = allow, .nallow = nallow};

	/* From memory. */
	struct sf_input min = sf_input_mem(in, len);
	rc = sf_pickle_load(&min, &o, &p, err, sizeof(err));
	if (!CHECK(rc == 0)) {
		fprintf(stderr, "  %s: rc %d: %s\n", name, rc, err);
		goto out_free_allow;
	}
	char *got = dump_doc(p, &min);
	if (!CHECK(strcmp(got, want) == 0))
		fprintf(stderr, "  %s:\n   got  %s\n   want %s\n", name, got, want);
	CHECK_EQ(sf_pickle_end(p), len);
	case_checks(name, sf_pickle_root(p));
	if (raw) {
		int how = find_raw(sf_pickle_root(p), &min, (unsigned char *)raw,
				   rawlen, 0);
		if (!CHECK(how != 0))
			fprintf(stderr, "  %s: raw.bin not found\n", name);
		/* Protocol 2 has no bytes opcode: numpy's data is a latin-1
		 * str, not the raw bytes. */
		CHECK(how == (strstr(name, "_p2") ? 2 : 1));
	}
	sf_pickle_free(p);
	p = NULL;

	/* From a region in the middle of a file. */
	fd = mkstemp(path);
	if (CHECK(fd >= 0)) {
		unlink(path);
		CHECK(pwrite(fd, "JUNKJUNK", 8, 0) == 8);
		CHECK(pwrite(fd, in, len, 8) == (ssize_t)len);
		CHECK(pwrite(fd, "TAIL", 4, 8 + len) == 4);
		struct sf_input fin = sf_input_fd(fd, 8, len);
		rc = sf_pickle_load(&fin, &o, &p, err, sizeof(err));
		if (CHECK(rc == 0)) {
			char *got2 = dump_doc(p, &fin);
			CHECK(strcmp(got2, want) == 0);
			free(got2);
			sf_pickle_free(p);
			p = NULL;
		}
		close(fd);
	}

	/* Without the allowlist: refused, naming a global of the list. */
	if (nallow) {
		rc = load_mem(in, len, NULL, &p, err, sizeof(err));
		bool named = false;
		for (size_t i = 0; i < nallow; i++) {
			char full[512];
			snprintf(full, sizeof(full), "global %s.%s is not allowed",
				 allow[i].module, allow[i].name);
			named |= strstr(err, full) != NULL;
		}
		if (!CHECK(rc == -SF_EREFUSED && p == NULL && named))
			fprintf(stderr, "  %s without allowlist: rc %d: %s\n", name,
				rc, err);
	}
	/* Cut anywhere: malformed. Large cases are cut at a sample. */
	if (len <= 4096) {
		truncations(name, (unsigned char *)in, len, &o);
	} else {
		for (int k = 0; k < 64; k++) {
			size_t n = (size_t)sf_rand_below(len);
			struct sf_pickle *q = NULL;
			rc = load_mem(in, n, &o, &q, err, sizeof(err));
			if (!CHECK(rc == -SF_EFORMAT))
				fprintf(stderr, "  %s cut at %zu: rc %d %s\n", name,
					n, rc, err);
			sf_pickle_free(q);
		}
	}
	free(got);
out_free_allow:
	free(allow);
out_free:
	free(allow_text);
	free(raw);
}

static void invalid_case(struct corpus_case *c, void *arg)
{
	int want = -SF_EFORMAT;

	(void)arg;
	if (!CHECK(corpus_code_is(c->code, -SF_EFORMAT) ||
		   corpus_code_is(c->code, -SF_EREFUSED) ||
		   corpus_code_is(c->code, -SF_ETOOBIG))) {
		fprintf(stderr, "  %s: unknown code %s\n", c->name, c->code);
		return;
	}
	if (corpus_code_is(c->code, -SF_EREFUSED))
		want = -SF_EREFUSED;
	else if (corpus_code_is(c->code, -SF_ETOOBIG))
		want = -SF_ETOOBIG;
	/* torch/numpy-like globals allowed: a refusal must come from the
	 * global itself, not from these. */
	expect_fail(c->name, c->input, c->len, &allow_opts, want, c->sub);
}

/* --- main's first corpus: special/ and the repeated key --- */

static const struct sf_pk_global special_allow[] = {
	{ "numpy.core.multiarray", "_reconstruct" },
	{ "numpy.core.multiarray", "scalar" },
	{ "numpy", "ndarray" },
	{ "numpy", "dtype" },
	{ "collections", "OrderedDict" },
	{ "mod", "Point" },
	{ "mod", "Slotted" },
	{ "copyreg", "_reconstructor" },
	{ "builtins", "object" },
};

static int load(const char *in, size_t len, size_t nallow,
		struct sf_pickle **p, char *err)
{
	struct sf_input inp = sf_input_mem(in, len);
	struct sf_pickle_opts o = { .allow = special_allow, .nallow = nallow };

	return sf_pickle_load(&inp, &o, p, err, 256);
}

static void run_special(const char *top)
{
	char dir[4096], err[256];
	const struct sf_pk *r, *st;
	struct sf_pickle *p;
	char *in, *data;
	size_t len = 0, dlen = 0;

	for (int proto = 3; proto <= 4; proto++) {
		snprintf(dir, sizeof(dir), "%s/special/numpy_p%d", top, proto);
		in = corpus_slurp(dir, "input.pkl", &len);
		data = corpus_slurp(dir, "data.bin", &dlen);
		p = NULL;
		if (CHECK(in && data) && CHECK(load(in, len, 9, &p, err) == 0)) {
			r = sf_pickle_root(p);
			st = r && r->kind == SF_PK_OBJ ? r->u.obj.state : NULL;
			CHECK(sf_pk_is_obj(r, "numpy.core.multiarray", "_reconstruct"));
			/* state: (version, shape, dtype, fortran, data) */
			const struct sf_pk *raw = sf_pk_item(st, 4);

			if (CHECK(raw && raw->kind == SF_PK_BYTES) &&
			    CHECK(raw->u.bytes.len == dlen))
				CHECK(memcmp(in + raw->u.bytes.off, data, dlen) == 0);
			/* without numpy on the allowlist: refused */
			sf_pickle_free(p);
			p = NULL;
			CHECK(load(in, len, 0, &p, err) == -SF_EREFUSED);
			CHECK(strstr(err, "numpy") != NULL);
		}
		sf_pickle_free(p);
		free(in);
		free(data);
	}
	snprintf(dir, sizeof(dir), "%s/special/ordered_dict", top);
	in = corpus_slurp(dir, "input.pkl", &len);
	p = NULL;
	if (CHECK(in) && (CHECK(load(in, len, 9, &p, err) == 0) ||
			  (printf("  ordered_dict: %s\n", err), 0))) {
		int64_t x = 0;

		r = sf_pickle_root(p);
		CHECK(sf_pk_is_obj(r, "collections", "OrderedDict"));
		CHECK(sf_pk_int(sf_pk_get(r, "b"), &x) && x == 2);
	}
	sf_pickle_free(p);
	free(in);
	snprintf(dir, sizeof(dir), "%s/special/dataclass", top);
	in = corpus_slurp(dir, "input.pkl", &len);
	p = NULL;
	if (CHECK(in) && CHECK(load(in, len, 9, &p, err) == 0)) {
		int64_t x = 0;

		r = sf_pickle_root(p);
		CHECK(sf_pk_is_obj(r, "mod", "Point") && r->u.obj.newobj);
		CHECK(sf_pk_int(sf_pk_attr(r, "x"), &x) && x == 3);
		CHECK(sf_pk_str(sf_pk_attr(r, "y")) &&
		      strcmp(sf_pk_str(sf_pk_attr(r, "y")), "q") == 0);
		CHECK(sf_pk_attr(r, "z") == NULL);
	}
	sf_pickle_free(p);
	free(in);
	snprintf(dir, sizeof(dir), "%s/special/slots", top);
	in = corpus_slurp(dir, "input.pkl", &len);
	p = NULL;
	if (CHECK(in) && CHECK(load(in, len, 9, &p, err) == 0)) {
		int64_t x = 0;

		r = sf_pickle_root(p);
		CHECK(sf_pk_int(sf_pk_attr(r, "a"), &x) && x == 1);
		CHECK(sf_pk_str(sf_pk_attr(r, "b")) != NULL);
	}
	sf_pickle_free(p);
	free(in);
}

/* A dict with a repeated key (no Python pickler writes one; a hostile file
 * may): sf_pk_get answers the last, as Python's unpickler keeps it. */
static void run_repeated_key(void)
{
	/* split so that no hex escape swallows the key's letter */
	static const char in[] = "\x80\x04}(\x8c\x01" "a" "K\x01\x8c\x01" "a"
				 "K\x02u.";
	struct sf_pickle *p = NULL;
	char err[256];
	int64_t x = 0;

	if (CHECK(load(in, sizeof(in) - 1, 0, &p, err) == 0)) {
		CHECK_EQ(sf_pk_len(sf_pickle_root(p)), 2);
		CHECK(sf_pk_int(sf_pk_get(sf_pickle_root(p), "a"), &x) && x == 2);
	}
	sf_pickle_free(p);
}

int main(int argc, char **argv)
{
	sf_test_seed("test_pickle", 0x9e3779b97f4a7c15ull);
	test_opcodes();
	test_caps();
	test_big_bytes();
	test_truncations();
	test_accessors();
	run_repeated_key();
	if (argc > 1) {
		int v = corpus_walk(argv[1], "valid", "input.pkl", valid_case, NULL);
		int i = corpus_walk(argv[1], "invalid", "input.pkl", invalid_case, NULL);

		printf("test_pickle: corpus %s: %d valid, %d invalid cases\n",
		       argv[1], v, i);
		CHECK(v >= 30 && i >= 40);
		run_special(argv[1]);
	}
	return sf_test_done("test_pickle");
}
