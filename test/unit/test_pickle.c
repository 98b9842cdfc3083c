/*
 * test_pickle.c - the pickle reader against pickles Python wrote
 * (test/corpus/pickle, made by pickle_cases.py).
 *
 *   test_pickle CORPUS_DIR
 *
 * valid/CASE: the decoded graph, dumped canonically (the format of
 * pickle_cases.py), equals the dump Python made of the value itself;
 * every prefix of the input fails cleanly (truncation), never crashes.
 * special/CASE: numpy arrays, protocols 3 and 4 (the raw data lies at the recorded offset),
 * an OrderedDict (SETITEMS on a call), a dataclass (NEWOBJ + BUILD dict),
 * a __slots__ object (BUILD with a (None, slots) tuple) and a refused
 * global when the allowlist lacks it. invalid/CASE: the load fails with
 * the code and a reason holding the substring in `error`.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "corpus_case.h"
#include "sf_error.h"
#include "sf_io.h"
#include "sf_pickle.h"
#include "sf_test.h"

struct buf {
	char *s;
	size_t n, cap;
};

static void put(struct buf *b, const char *s, size_t n)
{
	if (b->n + n + 1 > b->cap) {
		b->cap = (b->n + n + 1) * 2;
		b->s = realloc(b->s, b->cap);
		if (!b->s)
			abort();
	}
	memcpy(b->s + b->n, s, n);
	b->n += n;
	b->s[b->n] = '\0';
}

static void puts_(struct buf *b, const char *s)
{
	put(b, s, strlen(s));
}

static void hex(struct buf *b, const unsigned char *p, size_t n)
{
	char h[3];

	for (size_t i = 0; i < n; i++) {
		snprintf(h, sizeof(h), "%02x", p[i]);
		put(b, h, 2);
	}
}

static void dump(struct buf *b, const struct sf_pk *v, int depth,
		 const unsigned char *input)
{
	char t[64];

	if (depth > 12) {
		puts_(b, "^");
		return;
	}
	switch (v->kind) {
	case SF_PK_NONE:
		puts_(b, "N");
		break;
	case SF_PK_BOOL:
		puts_(b, v->u.b ? "T" : "F");
		break;
	case SF_PK_INT:
		snprintf(t, sizeof(t), "I%lld", (long long)v->u.i);
		puts_(b, t);
		break;
	case SF_PK_FLOAT: {
		unsigned char be[8];
		uint64_t u;

		memcpy(&u, &v->u.f, 8);
		for (int i = 0; i < 8; i++)
			be[i] = (unsigned char)(u >> (56 - 8 * i));
		puts_(b, "D");
		hex(b, be, 8);
		break;
	}
	case SF_PK_STR:
		puts_(b, "S");
		hex(b, (const unsigned char *)v->u.str.s, v->u.str.len);
		break;
	case SF_PK_BYTES:
		puts_(b, "B");
		/* short ones copied; long ones only located: read from the input */
		CHECK(v->u.bytes.len > SF_PK_BYTES_COPY || v->u.bytes.data);
		hex(b, v->u.bytes.data ? v->u.bytes.data : input + v->u.bytes.off,
		    v->u.bytes.len);
		break;
	case SF_PK_TUPLE:
	case SF_PK_LIST:
		puts_(b, v->kind == SF_PK_TUPLE ? "(" : "[");
		for (size_t i = 0; i < v->u.seq.n; i++) {
			if (i)
				puts_(b, ",");
			dump(b, v->u.seq.v[i], depth + 1, input);
		}
		puts_(b, v->kind == SF_PK_TUPLE ? ")" : "]");
		break;
	case SF_PK_DICT:
		puts_(b, "{");
		for (size_t i = 0; i < v->u.dict.n; i++) {
			if (i)
				puts_(b, ",");
			dump(b, v->u.dict.k[i], depth + 1, input);
			puts_(b, ":");
			dump(b, v->u.dict.v[i], depth + 1, input);
		}
		puts_(b, "}");
		break;
	default:
		puts_(b, "?");
	}
}

static const struct sf_pk_global allow[] = {
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
	struct sf_pickle_opts o = { .allow = allow, .nallow = nallow };

	return sf_pickle_load(&inp, &o, p, err, 256);
}

static void valid_case(struct corpus_case *c, void *arg)
{
	struct sf_pickle *p = NULL;
	struct buf b = { 0 };
	char err[256];

	(void)arg;
	c->want[strcspn(c->want, "\n")] = '\0';
	if (!CHECK(load(c->input, c->len, 0, &p, err) == 0)) {
		printf("  %s: %s\n", c->name, err);
		return;
	}
	CHECK_EQ(sf_pickle_end(p), c->len);
	dump(&b, sf_pickle_root(p), 0, (const unsigned char *)c->input);
	if (!CHECK(b.s && strcmp(b.s, c->want) == 0))
		printf("  %s:\n   got  %.300s\n   want %.300s\n", c->name, b.s,
		       c->want);
	free(b.s);
	sf_pickle_free(p);
	/* every prefix fails, cleanly */
	for (size_t cut = 0; cut < c->len; cut += c->len > 3000 ? 7 : 1) {
		struct sf_pickle *q = NULL;
		int rc = load(c->input, cut, 0, &q, err);

		CHECK(rc == -SF_EFORMAT && q == NULL && err[0]);
		sf_pickle_free(q);
	}
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

static void invalid_case(struct corpus_case *c, void *arg)
{
	struct sf_pickle *p = NULL;
	char err[256];
	int rc;

	(void)arg;
	rc = load(c->input, c->len, 0, &p, err);
	CHECK(rc != 0 && p == NULL);
	sf_pickle_free(p);
	if (!CHECK(corpus_code_is(c->code, rc)) ||
	    !CHECK(strstr(err, c->sub) != NULL))
		printf("  %s: %s (%s), want %s %s\n", c->name, err,
		       sf_strerror(rc), c->code, c->sub);
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: test_pickle CORPUS_DIR\n");
		return 2;
	}
	CHECK(corpus_walk(argv[1], "valid", "input.pkl", valid_case, NULL) >= 7);
	run_special(argv[1]);
	run_repeated_key();
	CHECK(corpus_walk(argv[1], "invalid", "input.pkl", invalid_case, NULL) >= 10);
	return sf_test_done("test_pickle");
}
