/*
 * test_jr.c - the streaming JSON reader (core/sf_jr.c) and the manifest
 * parser built on it, checked from outside.
 *
 * 1. Accept/refuse agrees with jansson's json_loadb(JSON_REJECT_DUPLICATES
 *    | JSON_ALLOW_NUL), which the reader replaced, on hand-picked edge
 *    cases (numbers at the int64 edges, reals that overflow, escapes and
 *    surrogates, raw control bytes and bad UTF-8, duplicate keys also
 *    through escapes, nesting at 2048 and 2049, trailing garbage) and on
 *    thousands of random mutations of a manifest.
 * 2. The window: a manifest of several MiB, padded with random white
 *    space so tokens straddle every window edge, read through a file and
 *    through a callback with a small window gives the very model that the
 *    in-memory parse gives (the dumps are equal), and truncating the file
 *    under the reader is a clean error.
 */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "sf_checksum.h"
#include "sf_error.h"
#include "sf_jr.h"
#include "sf_manifest.h"
#include "sf_test.h"

#define PROG "test_jr"

/* Does the reader accept text as one JSON document? */
static bool jr_accepts(const char *text, size_t len)
{
	struct sf_input in = sf_input_mem(text, len);
	char msg[256];
	struct sf_jr r;
	int k;

	if (sf_jr_init(&r, &in, msg, sizeof(msg)))
		return false;
	k = sf_jr_top(&r);
	if (k >= 0)
		k = sf_jr_skip(&r);
	if (k >= 0)
		k = sf_jr_end(&r);
	sf_jr_free(&r);
	return k >= 0;
}

static bool jansson_accepts(const char *text, size_t len)
{
	json_error_t e;
	json_t *v = json_loadb(text, len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &e);

	json_decref(v);
	return v != NULL;
}

static void agree(const char *text, size_t len)
{
	bool a = jr_accepts(text, len), b = jansson_accepts(text, len);

	if (!CHECK_EQ(a, b))
		fprintf(stderr, "  reader %s, jansson %s: %.*s\n", a ? "accepts" : "refuses",
			b ? "accepts" : "refuses", (int)(len < 200 ? len : 200), text);
}

static void test_cases(void)
{
	static const char *const cases[] = {
		"{}", "[]", " [ ] ", "{\"a\":1}", "[1,2,3]", "[1,]", "[,1]", "{\"a\":1,}",
		"{\"a\" 1}", "{\"a\":}", "{1:2}", "[1 2]", "{\"a\":1 \"b\":2}", "",
		"   ", "1", "\"s\"", "null", "[tru]", "[true]", "[truex]", "[True]",
		"[nul]", "[null]", "[false]", "[fals]", "[true1]", "[-]", "[-0]",
		"[0]", "[01]", "[00]", "[-01]", "[1.]", "[1.5]", "[.5]", "[1e]",
		"[1e5]", "[1E+5]", "[1e-5]", "[1e+]", "[1.5e3]", "[9223372036854775807]",
		"[9223372036854775808]", "[-9223372036854775808]", "[-9223372036854775809]",
		"[99999999999999999999]", "[1e400]", "[-1e400]", "[1e-400]", "[0.0]",
		"[\"a\\\"b\"]", "[\"\\u0041\"]", "[\"\\u00e9\"]", "[\"\\u0000\"]",
		"{\"\\u0000\":1}", "{\"a\\u0000b\":1}", "[\"\\ud83d\\ude00\"]",
		"[\"\\ud83d\"]", "[\"\\ud83dx\"]", "[\"\\ude00\"]", "[\"\\ud83d\\u0041\"]",
		"[\"\\uZZZZ\"]", "[\"\\u12\"]", "[\"\\x\"]", "[\"\\/\\b\\f\\n\\r\\t\"]",
		"[\"a\nb\"]", "[\"a\tb\"]", "[\"a\x01\"]", "[\"\x7f\"]", "[\"\xc3\xa9\"]",
		"[\"\xc3\"]", "[\"\xc0\x80\"]", "[\"\xe0\x80\x80\"]", "[\"\xed\xa0\x80\"]",
		"[\"\xf4\x90\x80\x80\"]", "[\"\xf0\x9f\x98\x80\"]", "[\"\xff\"]", "[\xc3\xa9]",
		"{\"a\":1,\"a\":2}", "{\"a\":1,\"\\u0061\":2}", "{\"a\":{\"b\":1,\"b\":1}}",
		"[{\"x\":1},{\"x\":1}]", "{\"a\":1,\"b\":{\"a\":1}}", "{} x", "{}{}", "[]]",
		"{\"a\":[1,{\"b\":[true,false,null,\"\\u20ac\"]}]}", "[\"unterminated",
		"{\"a\":1", "[1,2", "\t\r\n{}\n", "[1]\x00", "{\"a\"\x00:1}",
	};
	char *deep;

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
		agree(cases[i], strlen(cases[i]));
	/* raw NUL bytes inside a string and after the document */
	agree("[\"a\0b\"]", 7);
	agree("{}\0", 3);
	/* nesting: 2048 values deep is fine, 2049 is not */
	deep = malloc(2 * 2049 + 2);
	if (!CHECK(deep != NULL))
		return;
	for (int depth = 2046; depth <= 2050; depth++) {
		size_t n = 0;

		for (int i = 0; i < depth; i++)
			deep[n++] = '[';
		for (int i = 0; i < depth; i++)
			deep[n++] = ']';
		agree(deep, n);
		n = 0;
		for (int i = 0; i < depth - 1; i++)
			deep[n++] = '[';
		deep[n++] = '1';
		for (int i = 0; i < depth - 1; i++)
			deep[n++] = ']';
		agree(deep, n);
	}
	free(deep);
}

/* A small manifest (two tensors, a root file) for mutating. */
static const char base_manifest[] =
	"{\"format\": \"shardfs/1\", \"name\": \"step-1\", \"world_size\": 2,\n"
	" \"block_size\": 4096, \"tensors\": {\"a/w\": {\"dtype\": \"F32\",\n"
	" \"shape\": [4, 6], \"shards\": [{\"rank\": 0, \"offsets\": [0, 0],\n"
	" \"lengths\": [2, 6], \"file\": \"rank-00000/d\", \"file_offset\": 0,\n"
	" \"nbytes\": 48, \"xxh3\": [\"9e3779b97f4a7c15\"]}, {\"rank\": 1,\n"
	" \"flat\": [48, 48], \"file\": \"rank-00001/d\", \"file_offset\": 7,\n"
	" \"nbytes\": 48, \"xxh3\": [\"3c6ef372fe94f82a\"]}]}, \"b\": {\"dtype\":\n"
	" \"BF16\", \"shape\": [], \"shards\": [{\"rank\": 0, \"offsets\": [],\n"
	" \"lengths\": [], \"file\": \"r\\u00e9/x\", \"file_offset\": 9, \"nbytes\": 2,\n"
	" \"xxh3\": [\"0000000000000001\"]}]}}, \"files\": {\"c.json\": {\"dtype\":\n"
	" \"U8\", \"shape\": [3], \"shards\": [{\"rank\": 1, \"flat\": [0, 3], \"file\":\n"
	" \"rank-00001/d\", \"file_offset\": 0, \"nbytes\": 3, \"xxh3\":\n"
	" [\"00000000000000ff\"]}]}}, \"extra\": {\"k\": [1.5, -2, null, true]}}\n";

static void test_mutations(void)
{
	static const char specials[] = "{}[],:\"\\ 0-1eE.tfnu\x01\x80\xff\xc3";
	size_t blen = sizeof(base_manifest) - 1;
	char *buf = malloc(blen + 16);
	char err[512];
	struct sf_model *m = NULL;

	if (!CHECK(buf != NULL))
		return;
	/* the base is valid, and parses as a manifest */
	CHECK(jr_accepts(base_manifest, blen));
	if (!CHECK_EQ(sf_manifest_parse(base_manifest, blen, &m, err, sizeof(err)), 0))
		fprintf(stderr, "  base: %s\n", err);
	sf_model_destroy(m);
	for (int i = 0; i < 20000; i++) {
		size_t n = blen, at = sf_rand_below(blen);

		memcpy(buf, base_manifest, blen);
		switch (sf_rand_below(4)) {
		case 0: /* replace a byte */
			buf[at] = specials[sf_rand_below(sizeof(specials) - 1)];
			break;
		case 1: /* delete a byte */
			memmove(buf + at, buf + at + 1, blen - at - 1);
			n--;
			break;
		case 2: /* insert a byte */
			memmove(buf + at + 1, buf + at, blen - at);
			buf[at] = specials[sf_rand_below(sizeof(specials) - 1)];
			n++;
			break;
		default: /* flip a bit */
			buf[at] ^= (char)(1u << sf_rand_below(8));
			break;
		}
		agree(buf, n);
		/* the manifest parser refuses whatever is not JSON */
		if (!jansson_accepts(buf, n)) {
			m = NULL;
			CHECK(sf_manifest_parse(buf, n, &m, err, sizeof(err)) < 0);
			sf_model_destroy(m);
		}
	}
	free(buf);
}

/* ---- the window ---- */

/* A manifest of nt tensors (nsh row shards each) with white space of
 * random length everywhere white space may go. malloc'd, *len set. */
static char *big_manifest(unsigned nt, unsigned nsh, size_t *len)
{
	size_t cap = (size_t)nt * nsh * 400 + 4096, n = 0;
	char *b = malloc(cap);

#define WS() do { size_t k_ = sf_rand_below(4) ? 0 : sf_rand_below(9); \
		  while (k_--) b[n++] = " \n\t\r"[sf_rand_below(4)]; } while (0)
#define PUT(...) (n += (size_t)snprintf(b + n, cap - n, __VA_ARGS__))
	if (!b)
		return NULL;
	PUT("{");
	WS();
	PUT("\"format\"");
	WS();
	PUT(":");
	WS();
	PUT("\"shardfs/1\",\"name\":\"big\",\"world_size\":%u,\"block_size\":4096,", nsh);
	WS();
	PUT("\"tensors\":{");
	for (unsigned i = 0; i < nt; i++) {
		WS();
		/* long names and \u escapes straddle window edges too */
		PUT("%s\"layer.%05u.%.*s\\u00e9\"", i ? "," : "", i,
		    (int)sf_rand_below(60), "abcdefghijklmnopqrstuvwxyzabcdefghijklmnopqrstuvwxyzabcdefgh");
		WS();
		PUT(":{\"dtype\":\"F32\",");
		WS();
		PUT("\"shape\":[%u,16],\"shards\":[", 2 * nsh);
		for (unsigned s = 0; s < nsh; s++) {
			WS();
			PUT("%s{\"rank\":%u,", s ? "," : "", s);
			WS();
			PUT("\"offsets\":[%u,0],\"lengths\":[2,16],", 2 * s);
			WS();
			PUT("\"file\":\"rank-%05u/data-%u.bin\",\"file_offset\":%u,", s, s % 3,
			    i * 128);
			WS();
			PUT("\"nbytes\":128,\"xxh3\":[\"%016llx\"]}",
			    (unsigned long long)sf_rand());
		}
		WS();
		PUT("]}");
	}
	WS();
	PUT("}}");
	WS();
#undef PUT
#undef WS
	*len = n;
	return b;
}

struct cb_ctx {
	const char *text;
	size_t len;
};

static int cb_read(void *ctx, void *buf, size_t len, uint64_t off)
{
	const struct cb_ctx *c = ctx;

	if (off > c->len || len > c->len - off)
		return -SF_ESHORT;
	memcpy(buf, c->text + off, len);
	return 0;
}

static void test_window(void)
{
	char path[] = "/tmp/test_jr_XXXXXX", err[512];
	struct sf_model *a = NULL, *b = NULL, *c = NULL, *d = NULL;
	char *da = NULL, *db = NULL, *dc = NULL;
	size_t len = 0, la = 0, lb = 0, lc = 0;
	char *text = big_manifest(6000, 4, &len);
	struct cb_ctx cb = { text, len };
	struct sf_input in;
	int fd;

	if (!CHECK(text != NULL))
		return;
	CHECK(len > 3 * SF_JR_WINDOW);
	fd = mkstemp(path);
	if (!CHECK(fd >= 0))
		goto out_free;
	unlink(path);
	if (!CHECK((size_t)write(fd, text, len) == len))
		goto out_close;
	if (!CHECK_EQ(sf_manifest_parse(text, len, &a, err, sizeof(err)), 0))
		fprintf(stderr, "  memory: %s\n", err);
	in = sf_input_fd(fd, 0, len);
	if (!CHECK_EQ(sf_manifest_parse_input(&in, false, &b, err, sizeof(err)), 0))
		fprintf(stderr, "  file: %s\n", err);
	in = sf_input_cb(cb_read, &cb, 0, len);
	if (!CHECK_EQ(sf_manifest_parse_input(&in, false, &c, err, sizeof(err)), 0))
		fprintf(stderr, "  callback: %s\n", err);
	if (a && b && c && CHECK_EQ(a->ntensors, 6000) &&
	    CHECK_EQ(sf_manifest_dump(a, &da, &la), 0) &&
	    CHECK_EQ(sf_manifest_dump(b, &db, &lb), 0) &&
	    CHECK_EQ(sf_manifest_dump(c, &dc, &lc), 0)) {
		CHECK(la == lb && memcmp(da, db, la) == 0);
		CHECK(la == lc && memcmp(da, dc, la) == 0);
	}
	/* the file shrinks under the reader: an error, never a crash */
	if (CHECK_EQ(ftruncate(fd, (off_t)(len / 2)), 0)) {
		in = sf_input_fd(fd, 0, len);
		CHECK(sf_manifest_parse_input(&in, false, &d, err, sizeof(err)) < 0 && !d);
	}
out_close:
	close(fd);
out_free:
	free(da);
	free(db);
	free(dc);
	sf_model_destroy(a);
	sf_model_destroy(b);
	sf_model_destroy(c);
	sf_model_destroy(d);
	free(text);
}

/* ---- what the reader reads, byte for byte ---- */

struct out {
	char *b;
	size_t n, cap;
};

static void out_mem(struct out *o, const void *p, size_t n)
{
	if (o->n + n + 1 > o->cap) {
		size_t cap = o->cap ? o->cap : 4096;

		while (cap < o->n + n + 1)
			cap *= 2;
		o->b = realloc(o->b, cap);
		o->cap = cap;
	}
	memcpy(o->b + o->n, p, n);
	o->n += n;
}

/* A string as jansson's compact dump escapes it. */
static void out_str(struct out *o, const char *s, size_t n)
{
	out_mem(o, "\"", 1);
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)s[i];
		char e[8];

		if (c == '"' || c == '\\') {
			e[0] = '\\';
			e[1] = (char)c;
			out_mem(o, e, 2);
		} else if (c < 0x20) {
			const char *sh = c == '\b' ? "\\b" : c == '\f' ? "\\f" :
					 c == '\n' ? "\\n" : c == '\r' ? "\\r" :
					 c == '\t' ? "\\t" : NULL;

			if (sh)
				out_mem(o, sh, 2);
			else
				out_mem(o, e, (size_t)snprintf(e, sizeof(e), "\\u%04X", c));
		} else {
			out_mem(o, &s[i], 1);
		}
	}
	out_mem(o, "\"", 1);
}

/* Write the value at the reader as compact JSON (integers only). */
static int reserialize(struct sf_jr *r, struct out *o)
{
	struct sf_jr_str s;
	struct sf_jr_num n;
	struct sf_jr_it it;
	char num[32];
	int k = sf_jr_peek(r), rc;
	bool first = true;

	switch (k) {
	case SF_JR_OBJECT:
		rc = sf_jr_obj_begin(r, &it);
		out_mem(o, "{", 1);
		while (rc == 0 && (rc = sf_jr_obj_next(r, &it, &s)) == 1) {
			if (!first)
				out_mem(o, ",", 1);
			first = false;
			out_str(o, s.s, s.len);
			out_mem(o, ":", 1);
			rc = reserialize(r, o);
		}
		out_mem(o, "}", 1);
		return rc;
	case SF_JR_ARRAY:
		rc = sf_jr_arr_begin(r, &it);
		out_mem(o, "[", 1);
		while (rc == 0 && (rc = sf_jr_arr_next(r, &it)) == 1) {
			if (!first)
				out_mem(o, ",", 1);
			first = false;
			rc = reserialize(r, o);
		}
		out_mem(o, "]", 1);
		return rc;
	case SF_JR_STRING:
		rc = sf_jr_string(r, &s);
		if (!rc)
			out_str(o, s.s, s.len);
		return rc;
	case SF_JR_NUMBER:
		rc = sf_jr_number(r, &n);
		if (!rc)
			out_mem(o, num, (size_t)snprintf(num, sizeof(num), "%s%llu",
					 n.neg && n.u ? "-" : "", (unsigned long long)n.u));
		return rc;
	case SF_JR_TRUE:
	case SF_JR_FALSE:
	case SF_JR_NULL:
		out_mem(o, k == SF_JR_TRUE ? "true" : k == SF_JR_FALSE ? "false" : "null",
			k == SF_JR_FALSE ? 5 : 4);
		return sf_jr_skip(r);
	default:
		return k;
	}
}

/* Through windows of 1 byte on, what the reader reads is what jansson
 * reads: every key and string (escapes, UTF-8), number and literal. */
static void test_fidelity(void)
{
	size_t len = 0;
	char *text = big_manifest(300, 3, &len);
	static const char extra[] =
		"{\"k\u00e9y\" :\t[ \"\\u0000a\\n\\\"\\\\\\ud83d\\ude00\", -0 , -12 ,"
		" 9223372036854775807, -9223372036854775808, true ,false, null,"
		" {\"\\/\":{}} , [] ],\n\"\xe2\x82\xac\":\"\x7f\\u001f\"}";
	const char *docs[2] = { text, extra };
	size_t lens[2] = { len, sizeof(extra) - 1 };
	static const size_t windows[] = { 1, 2, 3, 5, 8, 13, 64, 4096 };

	if (!CHECK(text != NULL))
		return;
	for (int d = 0; d < 2; d++) {
		json_t *v = json_loadb(docs[d], lens[d], JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, NULL);
		char *want = v ? json_dumps(v, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
		struct cb_ctx cb = { docs[d], lens[d] };

		json_decref(v);
		if (!CHECK(want != NULL))
			continue;
		for (size_t w = 0; w < sizeof(windows) / sizeof(windows[0]); w++) {
			struct sf_input in = sf_input_cb(cb_read, &cb, 0, lens[d]);
			struct out o = { 0 };
			struct sf_jr r;
			char msg[256];
			int rc;

			if (!CHECK_EQ(sf_jr_init_window(&r, &in, windows[w], msg, sizeof(msg)), 0))
				continue;
			rc = sf_jr_top(&r) < 0 ? -1 : reserialize(&r, &o);
			if (!rc)
				rc = sf_jr_end(&r);
			sf_jr_free(&r);
			out_mem(&o, "", 1);
			if (!CHECK_EQ(rc, 0))
				fprintf(stderr, "  doc %d window %zu: %s\n", d, windows[w], msg);
			else if (!CHECK(strcmp(o.b, want) == 0))
				fprintf(stderr, "  doc %d window %zu: read %.300s\n  want %.300s\n",
					d, windows[w], o.b, want);
			free(o.b);
		}
		free(want);
	}
	free(text);
}

/* sf_jr_arr_next_hex64 reads exactly the 16-lowercase-hex strings, with
 * their values, and leaves every other element to the caller. */
static void test_hex64(void)
{
	enum { N = 20000 };
	static const char bad[] = "ABCDEFgxyz/:@`G -~";
	uint64_t *want = calloc(N, sizeof(*want));
	bool *ok = calloc(N, sizeof(*ok));
	char *text = malloc((size_t)N * 24 + 8);
	size_t n = 0, i = 0, got_ok = 0;
	uint64_t out[64];
	struct sf_jr_str str;
	struct sf_input in;
	struct sf_jr_it it;
	struct sf_jr r;
	char msg[256];
	uint64_t v;
	int rc;

	if (!CHECK(want && ok && text))
		goto out_free;
	text[n++] = '[';
	for (size_t k = 0; k < N; k++) {
		char hex[17];

		want[k] = sf_rand() >> sf_rand_below(64);
		snprintf(hex, sizeof(hex), "%016llx", (unsigned long long)want[k]);
		ok[k] = sf_rand_below(3) != 0;
		if (!ok[k])
			hex[sf_rand_below(16)] = bad[sf_rand_below(sizeof(bad) - 1)];
		n += (size_t)sprintf(text + n, "%s%s\"%s\"", k ? "," : "",
				     sf_rand_below(4) ? "" : " \n", hex);
	}
	text[n++] = ']';
	in = sf_input_mem(text, n);
	if (!CHECK_EQ(sf_jr_init(&r, &in, msg, sizeof(msg)), 0))
		goto out_free;
	rc = sf_jr_arr_begin(&r, &it);
	while (rc == 0) {
		/* batches of random size, as a caller's room allows */
		size_t max = 1 + sf_rand_below(64);
		size_t got = sf_jr_arr_hex64s(&r, &it, out, max);

		CHECK(got <= max);
		for (size_t k = 0; k < got; k++, i++) {
			got_ok++;
			CHECK(i < N && ok[i] && out[k] == want[i]);
		}
		if (got)
			continue;
		rc = sf_jr_arr_next(&r, &it);
		if (rc <= 0)
			break;
		/* the next element is the caller's: a bad one, or after "\n" */
		CHECK(i < N && (!ok[i] || sf_jr_peek(&r) == SF_JR_STRING));
		rc = sf_jr_string(&r, &str);
		if (!rc && i < N && ok[i]) {
			CHECK(sf_xxh3_parse(str.s, str.len, &v) == 0 && v == want[i]);
			got_ok++;
		}
		i++;
	}
	CHECK_EQ(rc, 0);
	CHECK_EQ(i, N);
	CHECK(got_ok > N / 2);
	CHECK(got_ok <= N);
	sf_jr_free(&r);
out_free:
	free(want);
	free(ok);
	free(text);
}

int main(void)
{
	sf_test_seed(PROG, 424242);
	test_hex64();
	test_cases();
	test_mutations();
	test_window();
	test_fidelity();
	return sf_test_done(PROG);
}
