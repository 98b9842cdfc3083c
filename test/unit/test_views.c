/*
 * test_views.c - model.safetensors and npy headers, checked from outside.
 *
 * The safetensors head is parsed here with jansson exactly as a safetensors
 * reader would (8-byte little-endian length N, N bytes of JSON) and checked
 * against the kit's model: sorted keys, dtype/shape/data_offsets of every
 * tensor, contiguous offsets, the file size. sf_st_read is compared with the
 * naive file: head followed by every tensor's model bytes in sorted order.
 * npy headers are taken apart byte by byte against the npy format 1.0 spec.
 * Expected dtype names and npy descrs come from tables in this file, not
 * from core.
 */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

#include "sf_checksum.h"
#include "sf_dtype.h"
#include "sf_engine.h"
#include "sf_error.h"
#include "sf_model.h"
#include "sf_test.h"
#include "sf_testkit.h"
#include "sf_views.h"

#define PROG "test_views"

/* safetensors names and numpy descrs, per SPEC.md and the npy format. */
static const struct {
	enum sf_dtype dt;
	const char *name;
	const char *descr;  /* NULL: no numpy type */
	const char *descr_alt; /* 1-byte types: numpy reads '<' and '|' alike */
} dtypes[] = {
	{ SF_DT_F64, "F64", "<f8", NULL },
	{ SF_DT_F32, "F32", "<f4", NULL },
	{ SF_DT_F16, "F16", "<f2", NULL },
	{ SF_DT_BF16, "BF16", NULL, NULL },
	{ SF_DT_F8_E4M3, "F8_E4M3", NULL, NULL },
	{ SF_DT_F8_E5M2, "F8_E5M2", NULL, NULL },
	{ SF_DT_I64, "I64", "<i8", NULL },
	{ SF_DT_I32, "I32", "<i4", NULL },
	{ SF_DT_I16, "I16", "<i2", NULL },
	{ SF_DT_I8, "I8", "|i1", "<i1" },
	{ SF_DT_U64, "U64", "<u8", NULL },
	{ SF_DT_U32, "U32", "<u4", NULL },
	{ SF_DT_U16, "U16", "<u2", NULL },
	{ SF_DT_U8, "U8", "|u1", "<u1" },
	{ SF_DT_BOOL, "BOOL", "|b1", "<b1" },
};
#define NDTYPES (sizeof(dtypes) / sizeof(dtypes[0]))

static size_t dtype_index(enum sf_dtype dt)
{
	for (size_t i = 0; i < NDTYPES; i++)
		if (dtypes[i].dt == dt)
			return i;
	return 0;
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

static uint64_t le64(const unsigned char *p)
{
	uint64_t v = 0;

	for (int i = 7; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

/* Check the head of st against the kit; fills data_b[i] (offset of
 * k->tensors[i]'s bytes after the head). Returns false on a mismatch. */
static bool check_st_head(const struct kit *k, const struct sf_st_layout *st,
			  uint64_t *data_b)
{
	const unsigned char *h = (const unsigned char *)st->head;
	bool ok = true;
	json_error_t jerr;

	if (!CHECK(st->head_len >= 8) || !CHECK_EQ(st->head_len % 8, 0))
		return false;
	uint64_t n = le64(h);
	if (!CHECK(n == st->head_len - 8))
		return false;
	json_t *root = json_loadb(st->head + 8, n, 0, &jerr);
	if (!CHECK(root && json_is_object(root))) {
		fprintf(stderr, "  safetensors head: %s\n", jerr.text);
		json_decref(root);
		return false;
	}
	/* Data starts 8-aligned after padding with spaces (nothing else). */
	size_t end = n;
	while (end > 0 && st->head[8 + end - 1] == ' ')
		end--;
	ok &= CHECK(end > 0 && st->head[8 + end - 1] == '}');

	/* The names we built, sorted independently. */
	const char **want = malloc((k->ntensors + 1) * sizeof(*want));
	if (!want) {
		json_decref(root);
		return CHECK(!"out of memory");
	}
	for (size_t i = 0; i < k->ntensors; i++)
		want[i] = k->tensors[i].t->name;
	qsort(want, k->ntensors, sizeof(*want), cmp_str);

	const char *key;
	json_t *val;
	size_t i = 0;
	uint64_t pos = 0;
	json_object_foreach(root, key, val) {
		if (strcmp(key, "__metadata__") == 0) {
			const char *mk;
			json_t *mv;

			ok &= CHECK(json_is_object(val));
			json_object_foreach(val, mk, mv)
				ok &= CHECK(json_is_string(mv));
			continue;
		}
		if (!CHECK(i < k->ntensors)) {
			ok = false;
			break;
		}
		/* Keys come in sorted order (jansson keeps insertion order). */
		if (!CHECK(strcmp(key, want[i]) == 0)) {
			fprintf(stderr, "  key %zu is \"%s\", want \"%s\"\n", i, key,
				want[i]);
			ok = false;
			break;
		}
		size_t ti = 0;
		while (strcmp(k->tensors[ti].t->name, key) != 0)
			ti++; /* present: key == want[i], a kit name */
		const struct kit_tensor *kt = &k->tensors[ti];
		const struct sf_tensor *t = kt->t;
		json_t *dt = json_object_get(val, "dtype");
		json_t *shape = json_object_get(val, "shape");
		json_t *offs = json_object_get(val, "data_offsets");

		ok &= CHECK(json_is_string(dt) &&
			    strcmp(json_string_value(dt),
				   dtypes[dtype_index(t->dtype)].name) == 0);
		uint64_t nbytes = kt->itemsize;
		if (CHECK(json_is_array(shape)) &&
		    CHECK_EQ(json_array_size(shape), t->ndim)) {
			for (unsigned d = 0; d < t->ndim; d++) {
				json_t *x = json_array_get(shape, d);

				ok &= CHECK(json_is_integer(x) &&
					    (uint64_t)json_integer_value(x) ==
						    t->shape[d]);
				nbytes *= t->shape[d];
			}
		} else {
			ok = false;
		}
		if (CHECK(json_is_array(offs)) && CHECK_EQ(json_array_size(offs), 2)) {
			uint64_t b = (uint64_t)json_integer_value(json_array_get(offs, 0));
			uint64_t e = (uint64_t)json_integer_value(json_array_get(offs, 1));

			ok &= CHECK(b == pos);
			ok &= CHECK(e == b + nbytes);
			data_b[ti] = b;
			if (CHECK(ti < st->ntensors))
				ok &= CHECK(st->data_off[ti] == st->head_len + b);
			pos = e;
		} else {
			ok = false;
		}
		i++;
	}
	ok &= CHECK_EQ(i, k->ntensors);
	ok &= CHECK_EQ(st->ntensors, k->ntensors);
	ok &= CHECK(st->total == st->head_len + pos);
	free(want);
	json_decref(root);
	return ok;
}

static unsigned long st_gathered, st_e2big; /* sf_st_readv outcomes */

static void test_safetensors(void)
{
	for (int round = 0; round < 25; round++) {
		struct kit *k;
		struct sf_st_layout *st = NULL;
		struct sf_engine *e = NULL;
		uint64_t rng = sf_rand();
		unsigned char *file = NULL, *buf = NULL;

		if (!CHECK_EQ(kit_create(sf_rand(), 1 + sf_rand_below(8), false, &k), 0))
			continue;
		uint64_t *data_b = calloc(k->ntensors, sizeof(*data_b));
		if (!CHECK(data_b != NULL))
			goto out_destroy_kit;
		if (!CHECK_EQ(sf_st_layout_build(k->m, &st), 0))
			goto out_free_data_b;
		if (!check_st_head(k, st, data_b))
			goto out_destroy_layout;

		/* The naive file. */
		file = malloc(st->total);
		buf = malloc(st->total + 1);
		if (!CHECK(file && buf))
			goto out_free_file;
		memcpy(file, st->head, st->head_len);
		for (size_t ti = 0; ti < k->ntensors; ti++)
			memcpy(file + st->head_len + data_b[ti], k->tensors[ti].bytes,
			       k->tensors[ti].t->nbytes);

		struct sf_engine_opts o = { .cache_bytes = (round % 2) ? 8192 : 64u << 20,
					    .verify = true };
		if (!CHECK_EQ(sf_engine_create(&o, &k->src, &e), 0))
			goto out_free_file;
		for (int r = 0; r < 100; r++) {
			uint64_t off, len;

			switch (r % 4) {
			case 0: /* anywhere */
				off = sf_rand_r(&rng) % (st->total + 1);
				len = sf_rand_r(&rng) % (st->total - off + 1);
				break;
			case 1: /* across the end of the head */
				off = sf_rand_r(&rng) % st->head_len;
				len = st->head_len - off +
				      sf_rand_r(&rng) % (st->total - st->head_len + 1);
				break;
			case 2: /* short, in the data */
				off = st->head_len +
				      sf_rand_r(&rng) % (st->total - st->head_len + 1);
				len = sf_rand_r(&rng) % 100;
				if (len > st->total - off)
					len = st->total - off;
				break;
			default: /* the whole file */
				off = 0;
				len = st->total;
			}
			memset(buf, 0xee, len + 1);
			if (!CHECK_EQ(sf_st_read(e, &k->ref, k->m, st, off, buf, len), 0))
				continue;
			if (!CHECK(memcmp(buf, file + off, len) == 0))
				fprintf(stderr, "  safetensors off %llu len %llu\n",
					(unsigned long long)off,
					(unsigned long long)len);
			CHECK_EQ(buf[len], 0xee);

			/* The same range without copying: pieces that gather to
			 * the same bytes, or -E2BIG (then nothing held) when the
			 * limits are small. */
			struct iovec iov[64];
			struct sf_engine_hold holds[4];
			unsigned maxiov = 1 + (unsigned)(sf_rand_r(&rng) % 64);
			unsigned maxholds = 1 + (unsigned)(sf_rand_r(&rng) % 4);
			unsigned nholds = 99;
			int cnt = sf_st_readv(e, &k->ref, k->m, st, off, len, iov,
					      maxiov, holds, maxholds, &nholds);

			if (cnt == -E2BIG) {
				CHECK_EQ(nholds, 0);
				st_e2big++;
				continue;
			}
			if (!CHECK(cnt >= 0) || !CHECK((unsigned)cnt <= maxiov) ||
			    !CHECK(nholds <= maxholds))
				continue;
			size_t at = 0;
			bool same = true;
			for (int j = 0; j < cnt; j++) {
				same &= at + iov[j].iov_len <= len &&
					memcmp(file + off + at, iov[j].iov_base,
					       iov[j].iov_len) == 0;
				at += iov[j].iov_len;
			}
			if (!CHECK(same && at == len))
				fprintf(stderr, "  safetensors readv off %llu len %llu\n",
					(unsigned long long)off,
					(unsigned long long)len);
			for (unsigned h = 0; h < nholds; h++)
				sf_engine_release(e, &holds[h]);
			st_gathered++;
		}
		/* every hold was dropped: a cache of 8 KiB is back under its
		 * bound */
		struct sf_engine_stats es;
		sf_engine_stats(e, &es);
		CHECK(es.cached_bytes <= o.cache_bytes);
		sf_engine_destroy(e);
out_free_file:
		free(file);
		free(buf);
out_destroy_layout:
		sf_st_layout_destroy(st);
out_free_data_b:
		free(data_b);
out_destroy_kit:
		kit_destroy(k);
	}
	sf_st_layout_destroy(NULL);
	/* both outcomes of sf_st_readv were seen */
	CHECK(st_gathered > 100);
	CHECK(st_e2big > 10);
	printf("test_views: model.safetensors zero-copy: %lu reads gathered, %lu too large\n",
	       st_gathered, st_e2big);
}

/* Parse "(a, b, ...)" at *p (spaces allowed after commas); 1-d needs the
 * trailing comma. Returns the number of dims, or -1 when malformed. */
static int parse_tuple(const char *p, uint64_t *dims, int max)
{
	int n = 0;

	if (*p++ != '(')
		return -1;
	for (;;) {
		while (*p == ' ')
			p++;
		if (*p == ')')
			break;
		if (*p < '0' || *p > '9' || n == max)
			return -1;
		char *end;
		dims[n++] = strtoull(p, &end, 10);
		p = end;
		while (*p == ' ')
			p++;
		if (*p == ',') {
			p++;
			continue;
		}
		if (*p != ')')
			return -1;
		if (n == 1)
			return -1; /* "(3)" is an int, not a tuple */
		break;
	}
	return n;
}

static void check_npy(const struct sf_tensor *t)
{
	const char *descr = dtypes[dtype_index(t->dtype)].descr;
	const char *alt = dtypes[dtype_index(t->dtype)].descr_alt;
	char *h = NULL;
	size_t len = 0;
	int rc = sf_npy_header(t, &h, &len);

	if (!descr) {
		CHECK_EQ(rc, -ENOTSUP);
		return;
	}
	if (!CHECK_EQ(rc, 0) || !CHECK(h != NULL))
		return;
	if (!CHECK(len >= 16) || !CHECK(memcmp(h, "\x93NUMPY", 6) == 0))
		goto out_free_header;
	unsigned char major = (unsigned char)h[6], minor = (unsigned char)h[7];
	size_t start, hl;
	if (major == 1) {
		start = 10;
		hl = (unsigned char)h[8] | (size_t)(unsigned char)h[9] << 8;
	} else {
		CHECK_EQ(major, 2);
		start = 12;
		hl = le64((const unsigned char[8]){ (unsigned char)h[8],
			(unsigned char)h[9], (unsigned char)h[10],
			(unsigned char)h[11], 0, 0, 0, 0 });
	}
	CHECK_EQ(minor, 0);
	CHECK_EQ(major, 1); /* these headers are small: 1.0 suffices */
	if (!CHECK_EQ(start + hl, len) || !CHECK_EQ(len % 64, 0) ||
	    !CHECK_EQ(h[len - 1], '\n'))
		goto out_free_header;

	/* The dict: one line, '{' ... '}' then spaces and '\n'. */
	char *text = strndup(h + start, hl);
	if (!CHECK(text != NULL))
		goto out_free_header;
	char want_descr[32], want_alt[32];
	snprintf(want_descr, sizeof(want_descr), "'descr': '%s'", descr);
	snprintf(want_alt, sizeof(want_alt), "'descr': '%s'", alt ? alt : descr);
	CHECK(text[0] == '{');
	CHECK(strstr(text, want_descr) || strstr(text, want_alt));
	CHECK(strstr(text, "'fortran_order': False") != NULL);
	char *close = strrchr(text, '}');
	if (CHECK(close != NULL)) {
		for (char *p = close + 1; p < text + hl - 1; p++)
			if (!CHECK(*p == ' '))
				break;
	}
	CHECK(strchr(text, '\n') == text + hl - 1);
	char *sh = strstr(text, "'shape': ");
	if (CHECK(sh != NULL)) {
		uint64_t dims[SF_MAX_NDIM + 1];
		int n = parse_tuple(sh + 9, dims, SF_MAX_NDIM + 1);

		if (CHECK_EQ(n, (int)t->ndim)) {
			for (unsigned d = 0; d < t->ndim; d++)
				CHECK(dims[d] == t->shape[d]);
		} else {
			fprintf(stderr, "  npy header: %s", text);
		}
		if (t->ndim == 0)
			CHECK(strncmp(sh + 9, "()", 2) == 0);
	}
	free(text);
out_free_header:
	free(h);
}

static void test_npy(void)
{
	/* Fixed shapes whose text is known. */
	struct sf_tensor t = { .name = "x", .dtype = SF_DT_F32, .ndim = 1 };

	t.shape[0] = 3;
	t.nbytes = 12;
	check_npy(&t);
	{
		char *h = NULL;
		size_t len;

		if (CHECK_EQ(sf_npy_header(&t, &h, &len), 0)) {
			CHECK(memmem(h, len, "(3,)", 4) != NULL);
			CHECK(memmem(h, len, "'<f4'", 5) != NULL);
		}
		free(h);
		t.ndim = 0;
		t.nbytes = 4;
		h = NULL;
		if (CHECK_EQ(sf_npy_header(&t, &h, &len), 0))
			CHECK(memmem(h, len, "'shape': ()", 11) != NULL);
		free(h);
	}
	/* Every dtype, random shapes up to SF_MAX_NDIM dims of big numbers. */
	for (int iter = 0; iter < 5000; iter++) {
		struct sf_tensor r = { .name = "y/z" };

		r.dtype = dtypes[sf_rand_below(NDTYPES)].dt;
		r.ndim = (unsigned)sf_rand_below(iter % 10 ? 6 : SF_MAX_NDIM + 1);
		r.nbytes = sf_dtype_size(r.dtype);
		for (unsigned d = 0; d < r.ndim; d++) {
			r.shape[d] = sf_rand_below(r.ndim > 3 ? 100 : 1000000);
			r.nbytes *= r.shape[d];
		}
		check_npy(&r);
	}
}

/* The head is byte for byte what jansson's compact, key-sorted dump of
 * the same object gives (how it was built before it was written straight
 * from the model): names with quotes, backslashes, UTF-8, and around
 * "__metadata__" in the key order. */
static void test_st_head_bytes(void)
{
	static const char *const names[] = {
		"A\"quote", "B\\back", "_", "__a", "__metadata", "__metadata_x",
		"__metadatb", "a/b/c", "z\xc3\xa9", "\xe2\x82\xac.w",
	};
	struct sf_model *m = sf_model_new("ck\"\\", 1, SF_DEFAULT_BLOCK_SIZE);
	struct sf_st_layout *st = NULL;
	json_t *root = json_object(), *meta = json_object();
	char err[256], *text = NULL;
	uint64_t shape[2] = { 3, 5 }, off = 0;

	if (!CHECK(m && root && meta))
		goto out_free;
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		struct sf_tensor *t;
		uint64_t zero[2] = { 0, 0 };
		struct sf_shard s = { .off = zero, .len = shape, .file = "f",
				      .nbytes = 3 * 5 * 4 };

		shape[0] = 3 + i;
		s.nbytes = shape[0] * shape[1] * 4;
		if (!CHECK_EQ(sf_model_add_tensor(m, false, names[i], SF_DT_F32, 2,
						  shape, &t), 0) ||
		    !CHECK_EQ(sf_tensor_add_shard(m, t, &s), 0))
			goto out_free;
	}
	if (!CHECK_EQ(sf_model_finish(m, err, sizeof(err)), 0) ||
	    !CHECK_EQ(sf_st_layout_build(m, &st), 0))
		goto out_free;
	json_object_set_new(meta, "format", json_string("pt"));
	json_object_set_new(meta, "shardfs.checkpoint", json_string(m->name));
	json_object_set_new(root, "__metadata__", meta);
	meta = NULL;
	for (size_t i = 0; i < m->ntensors; i++) {
		const struct sf_tensor *t = &m->tensors[i];

		json_object_set_new(root, t->name,
			json_pack("{s:[I,I], s:s, s:[I,I]}", "data_offsets",
				  (json_int_t)off, (json_int_t)(off + t->nbytes),
				  "dtype", "F32", "shape", (json_int_t)t->shape[0],
				  (json_int_t)t->shape[1]));
		off += t->nbytes;
	}
	text = json_dumps(root, JSON_COMPACT | JSON_SORT_KEYS);
	if (!CHECK(text != NULL))
		goto out_free;
	size_t n = strlen(text);
	if (CHECK_EQ(st->head_len, (n + 8 + 7) / 8 * 8) &&
	    !CHECK(memcmp(st->head + 8, text, n) == 0))
		fprintf(stderr, "  head %.*s\n  want %s\n", (int)n, st->head + 8, text);
out_free:
	free(text);
	json_decref(meta);
	json_decref(root);
	sf_st_layout_destroy(st);
	sf_model_destroy(m);
}

int main(void)
{
	sf_test_seed(PROG, 31337);
	test_npy();
	test_safetensors();
	test_st_head_bytes();
	return sf_test_done(PROG);
}
