/*
 * test_manifest_corpus.c - the manifest corpus and the builder/coverage
 * unit tests.
 *
 * Usage: test_manifest_corpus CORPUS_DIR
 *   CORPUS_DIR/valid/NAME.json    must parse; dump and re-parse must give a
 *                              field-by-field identical manifest, and the
 *                              second dump must equal the first byte for
 *                              byte; every tensor's shards JSON must be a
 *                              list with one entry per shard.
 *   CORPUS_DIR/invalid/NAME.json  must fail; NAME.expect gives the error code
 *                              name on its first line and a substring the
 *                              one-line error message must contain on its
 *                              second.
 * Then the builder API and the coverage check are tested directly,
 * including a randomized comparison of coverage against a byte bitmap.
 * Exits 0 only if every check ran and passed; a corpus with fewer than
 * MIN_VALID / MIN_INVALID cases fails rather than passing vacuously.
 */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "manifest_cmp.h"
#include "sf_checksum.h"
#include "sf_error.h"
#include "sf_manifest.h"
#include "sf_model.h"

#define MIN_VALID 10
#define MIN_INVALID 35
#define CORPUS_MAX_INPUT (64u << 20) /* corpus file size cap */
#define ERRLEN 512

static int failures;
static int checks;

__attribute__((format(printf, 2, 3)))
static void check(bool ok, const char *fmt, ...)
{
	checks++;
	if (ok)
		return;
	failures++;
	va_list ap;
	va_start(ap, fmt);
	fputs("FAIL: ", stderr);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
}

/* Read a whole file (at most CORPUS_MAX_INPUT bytes) into a malloc'd
 * buffer the caller frees; NUL-terminated for convenience. */
static int read_file(const char *path, char **out, size_t *len)
{
	struct stat st;
	int rc = -ENOMEM;
	FILE *f = fopen(path, "rb");
	if (!f)
		return -errno;
	if (fstat(fileno(f), &st) != 0 || st.st_size < 0 || st.st_size > CORPUS_MAX_INPUT) {
		rc = -EFBIG;
		goto out_close;
	}
	size_t size = (size_t)st.st_size;
	char *buf = malloc(size + 1);
	if (!buf)
		goto out_close;
	if (fread(buf, 1, size, f) != size) {
		rc = -EIO;
		free(buf);
		goto out_close;
	}
	buf[size] = '\0';
	*out = buf;
	*len = size;
	rc = 0;
out_close:
	fclose(f);
	return rc;
}

/* dir/name+suffix into buf; -ENAMETOOLONG if it does not fit. */
static int join(char *buf, size_t size, const char *dir, const char *name,
		const char *suffix)
{
	int n = snprintf(buf, size, "%s/%s%s", dir, name, suffix);
	return n < 0 || (size_t)n >= size ? -ENAMETOOLONG : 0;
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

static void free_names(char **names, size_t n)
{
	for (size_t i = 0; i < n; i++)
		free(names[i]);
	free(names);
}

/* Sorted list of the *.json names in dir (malloc'd array of malloc'd
 * strings; free with free_names). */
static int list_json(const char *dir, char ***out, size_t *n)
{
	DIR *d = opendir(dir);
	if (!d)
		return -errno;
	char **names = NULL;
	size_t cnt = 0, cap = 0;
	int rc = 0;
	struct dirent *e;
	while ((e = readdir(d))) {
		size_t l = strlen(e->d_name);
		if (l < 6 || strcmp(e->d_name + l - 5, ".json") != 0)
			continue;
		if (cnt == cap) {
			cap = cap ? cap * 2 : 64;
			char **q = realloc(names, cap * sizeof(*q));
			if (!q) {
				rc = -ENOMEM;
				break;
			}
			names = q;
		}
		if (!(names[cnt] = strdup(e->d_name))) {
			rc = -ENOMEM;
			break;
		}
		cnt++;
	}
	closedir(d);
	if (cnt > 1)
		qsort(names, cnt, sizeof(*names), cmp_str);
	*out = names;
	*n = cnt;
	return rc;
}

/* ------------------------------------------------------------------ */
/* corpus                                                              */

/* Does every tensor's shards JSON list one object per shard, without
 * checksums? */
static bool shards_json_ok(const struct sf_tensor *t)
{
	char *js = NULL;
	size_t len = 0;
	if (sf_manifest_shards_json(t, &js, &len) != 0 || !js || strlen(js) != len)
		return false;
	json_error_t jerr;
	json_t *v = json_loads(js, 0, &jerr);
	bool ok = v && json_is_array(v) && json_array_size(v) == t->nshards;
	for (size_t i = 0; ok && i < t->nshards; i++) {
		json_t *s = json_array_get(v, i);
		ok = json_is_object(s) && !json_object_get(s, "xxh3") &&
		     json_integer_value(json_object_get(s, "rank")) == t->shards[i].rank &&
		     json_is_string(json_object_get(s, "file"));
	}
	json_decref(v);
	free(js);
	return ok;
}

static void run_valid(const char *dir, const char *name)
{
	char path[4096], err[ERRLEN], why[256];
	char *buf = NULL, *d1 = NULL, *d2 = NULL;
	size_t len, l1, l2;
	struct sf_model *m = NULL, *m2 = NULL, *m3 = NULL;

	int rc = join(path, sizeof(path), dir, name, "");
	if (rc == 0)
		rc = read_file(path, &buf, &len);
	check(rc == 0, "%s: cannot read (%s)", path, sf_strerror(rc));
	if (rc)
		return;
	rc = sf_manifest_parse(buf, len, &m, err, sizeof(err));
	check(rc == 0 && m, "valid/%s: parse failed: %s: %s", name, sf_strerror(rc), err);
	if (rc)
		goto out_free;
	rc = sf_manifest_dump(m, &d1, &l1);
	check(rc == 0 && d1 && strlen(d1) == l1, "valid/%s: dump failed: %s", name, sf_strerror(rc));
	if (rc)
		goto out_free;
	rc = sf_manifest_parse(d1, l1, &m2, err, sizeof(err));
	check(rc == 0, "valid/%s: re-parse of dump failed: %s", name, err);
	if (rc)
		goto out_free;
	check(manifest_equal(m, m2, why, sizeof(why)), "valid/%s: parse(dump(m)) != m: %s", name, why);
	rc = sf_manifest_dump(m2, &d2, &l2);
	check(rc == 0 && l1 == l2 && memcmp(d1, d2, l1) == 0, "valid/%s: second dump differs", name);
	/* The dump is also accepted without a trailing NUL in the length. */
	rc = sf_manifest_parse(d1, l1, &m3, err, sizeof(err));
	check(rc == 0 && manifest_equal(m, m3, why, sizeof(why)), "valid/%s: third parse", name);
	for (size_t i = 0; i < m->ntensors; i++) {
		const struct sf_tensor *t = &m->tensors[i];
		check(sf_model_find(m, t->name) == t, "valid/%s: find(\"%s\")", name, t->name);
		check(i == 0 || strcmp(m->tensors[i - 1].name, t->name) < 0,
		      "valid/%s: tensors not sorted at %zu", name, i);
		check(shards_json_ok(t), "valid/%s: shards json of \"%s\"", name, t->name);
	}
	for (size_t i = 0; i < m->nfiles; i++) {
		check(sf_model_find_file(m, m->files[i].name) == &m->files[i],
		      "valid/%s: find_file(\"%s\")", name, m->files[i].name);
		check(sf_model_find(m, m->files[i].name) == NULL,
		      "valid/%s: file \"%s\" found as a tensor", name, m->files[i].name);
	}
	check(sf_model_find(m, "no such tensor") == NULL, "valid/%s: find of a missing name", name);
out_free:
	sf_model_destroy(m3);
	sf_model_destroy(m2);
	sf_model_destroy(m);
	free(d2);
	free(d1);
	free(buf);
}

static const char *code_name(int rc)
{
	switch (rc) {
	case -SF_EMANIFEST: return "SF_EMANIFEST";
	case -SF_EGAP: return "SF_EGAP";
	case -SF_ETOOBIG: return "SF_ETOOBIG";
	case -ENOMEM: return "ENOMEM";
	case 0: return "OK";
	default: return "OTHER";
	}
}

static void run_invalid(const char *dir, const char *name)
{
	char path[4096], err[ERRLEN];
	char *buf = NULL, *exp = NULL;
	size_t len, elen;
	struct sf_model *m = NULL;

	int rc = join(path, sizeof(path), dir, name, "");
	if (rc == 0)
		rc = read_file(path, &buf, &len);
	check(rc == 0, "%s: cannot read (%s)", path, sf_strerror(rc));
	if (rc)
		return;
	char stem[256];
	snprintf(stem, sizeof(stem), "%.*s", (int)(strlen(name) - 5), name);
	rc = join(path, sizeof(path), dir, stem, ".expect");
	if (rc == 0)
		rc = read_file(path, &exp, &elen);
	check(rc == 0, "%s: missing expectation (%s)", path, sf_strerror(rc));
	if (rc)
		goto out_free;
	char *code = exp, *nl = strchr(exp, '\n');
	check(nl != NULL, "%s: needs two lines", path);
	if (!nl)
		goto out_free;
	*nl = '\0';
	char *sub = nl + 1;
	if ((nl = strchr(sub, '\n')))
		*nl = '\0';
	check(*sub != '\0', "%s: empty substring", path);

	memset(err, 'X', sizeof(err));
	rc = sf_manifest_parse(buf, len, &m, err, sizeof(err));
	check(rc < 0 && m == NULL, "invalid/%s: parsed successfully", name);
	check(strcmp(code_name(rc), code) == 0, "invalid/%s: got %s (%s), expected %s",
	      name, code_name(rc), err, code);
	check(memchr(err, '\0', sizeof(err)) && strstr(err, sub),
	      "invalid/%s: message \"%s\" lacks \"%s\"", name, err, sub);
	check(!strchr(err, '\n'), "invalid/%s: message is not one line", name);
	sf_model_destroy(m);
out_free:
	free(exp);
	free(buf);
}

static size_t run_dir(const char *corpus, const char *sub, bool valid)
{
	char dir[4096];
	char **names = NULL;
	size_t n = 0;
	int rc = join(dir, sizeof(dir), corpus, sub, "");
	if (rc == 0)
		rc = list_json(dir, &names, &n);
	check(rc == 0, "%s: %s", dir, sf_strerror(rc));
	for (size_t i = 0; i < n; i++) {
		int before = failures;
		if (valid)
			run_valid(dir, names[i]);
		else
			run_invalid(dir, names[i]);
		if (failures == before)
			printf("ok   %s/%s\n", sub, names[i]);
	}
	free_names(names, n);
	return n;
}

/* ------------------------------------------------------------------ */
/* builder                                                             */

static uint64_t sums[64];

/* A shard with dummy checksums sized for block size bs (it borrows off
 * and len: they must live until it is added). */
static struct sf_shard mk_box(uint32_t rank, unsigned ndim, const uint64_t *off,
			      const uint64_t *len, size_t isz, uint64_t bs)
{
	struct sf_shard s = { .rank = rank, .file = "rank-00000/b" };
	uint64_t n = isz;
	s.off = off;
	s.len = len;
	for (unsigned d = 0; d < ndim; d++)
		n *= len[d];
	s.nbytes = n;
	s.nblocks = sf_nblocks(n, bs);
	s.xxh3 = sums;
	return s;
}

static struct sf_shard mk_flat(uint32_t rank, uint64_t off, uint64_t len, uint64_t bs)
{
	struct sf_shard s = { .rank = rank, .file = "rank-00000/f", .flat = true,
			      .flat_off = off, .flat_len = len, .nbytes = len };
	s.nblocks = sf_nblocks(len, bs);
	s.xxh3 = sums;
	return s;
}

static void test_builder(void)
{
	char err[ERRLEN], why[256];
	const uint64_t bs = 4096;
	for (size_t i = 0; i < 64; i++)
		sums[i] = 0x0123456789abcdefull * (i + 1);

	check(sf_model_new("a/b", 1, bs) == NULL, "new: name with '/'");
	check(sf_model_new("..", 1, bs) == NULL, "new: name \"..\"");
	check(sf_model_new("x", 0, bs) == NULL, "new: world_size 0");
	check(sf_model_new("x", SF_MAX_WORLD + 1, bs) == NULL, "new: world_size too big");
	check(sf_model_new("x", 1, SF_MIN_BLOCK_SIZE - 1) == NULL, "new: block too small");
	check(sf_model_new("x", 1, SF_MAX_BLOCK_SIZE + 1ull) == NULL, "new: block too big");
	sf_model_destroy(NULL);

	struct sf_model *m = sf_model_new("step-3000", 4, bs);
	check(m != NULL, "new");
	if (!m)
		return;
	struct sf_tensor *t;
	uint64_t shape[2] = { 320, 40 }, big[3] = { 1ull << 32, 1ull << 32, 16 };
	uint64_t ones[17] = { 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1 };
	check(sf_model_add_tensor(m, false, "bad@name", SF_DT_F32, 2, shape, &t) == -EINVAL, "add: '@'");
	check(sf_model_add_tensor(m, false, "a//b", SF_DT_F32, 2, shape, &t) == -EINVAL, "add: empty component");
	check(sf_model_add_tensor(m, false, "a\x01", SF_DT_F32, 2, shape, &t) == -EINVAL, "add: control char");
	check(sf_model_add_tensor(m, false, "bad\xff", SF_DT_F32, 2, shape, &t) == -EINVAL, "add: invalid UTF-8");
	check(sf_model_add_tensor(m, false, "x", SF_DT_INVALID, 2, shape, &t) == -EINVAL, "add: dtype");
	check(sf_model_add_tensor(m, false, "x", SF_DT_U8, 17, ones, &t) == -SF_ETOOBIG, "add: ndim 17");
	check(sf_model_add_tensor(m, false, "x", SF_DT_U8, 3, big, &t) == -SF_ETOOBIG, "add: overflow");
	check(sf_model_add_tensor(m, true, "cfg", SF_DT_F32, 1, shape, &t) == -EINVAL, "add: file F32");
	check(sf_model_add_tensor(m, true, "cfg", SF_DT_U8, 2, shape, &t) == -EINVAL, "add: file 2-d");
	check(sf_model_add_tensor(m, true, "npy", SF_DT_U8, 1, shape, &t) == -EINVAL, "add: file npy");
	check(!sf_manifest_file_name_ok("rank-1", 6) && sf_manifest_file_name_ok("rank1", 5),
	      "shardfs/1: no root file named like a rank directory");
	check(m->ntensors == 0 && m->nfiles == 0, "rejected adds left entries");

	/* SPEC's example, scaled down: half the rows as a box, the rest as
	 * one flat range; plus a replicated copy of a middle box. */
	check(sf_model_add_tensor(m, false, "model.embed.weight", SF_DT_BF16, 2, shape, &t) == 0, "add embed");
	uint64_t o0[2] = { 0, 0 }, l0[2] = { 160, 40 };
	struct sf_shard s = mk_box(0, 2, o0, l0, 2, bs);
	check(sf_tensor_add_shard(m, t, &s) == 0, "add box shard");
	s = mk_flat(1, 12800, 12800, bs);
	check(sf_tensor_add_shard(m, t, &s) == 0, "add flat shard");
	uint64_t o1[2] = { 100, 10 }, l1[2] = { 100, 20 };
	s = mk_box(3, 2, o1, l1, 2, bs);
	check(sf_tensor_add_shard(m, t, &s) == 0, "add replicated box");
	check(sf_tensor_check_coverage(t, err, sizeof(err)) == 0, "spec mix coverage: %s", err);

	/* shard rejections */
	uint64_t o2[2] = { 300, 0 }, l2[2] = { 21, 40 };
	s = mk_box(0, 2, o2, l2, 2, bs);
	check(sf_tensor_add_shard(m, t, &s) == -SF_ERANGE, "shard: box outside");
	s = mk_flat(0, 25000, 601, bs);
	check(sf_tensor_add_shard(m, t, &s) == -SF_ERANGE, "shard: flat outside");
	s = mk_flat(4, 0, 10, bs);
	check(sf_tensor_add_shard(m, t, &s) == -EINVAL, "shard: rank >= world");
	s = mk_flat(0, 0, 10, bs);
	s.nbytes = 11;
	check(sf_tensor_add_shard(m, t, &s) == -EINVAL, "shard: nbytes mismatch");
	s = mk_flat(0, 0, 10, bs);
	s.nblocks = 2;
	check(sf_tensor_add_shard(m, t, &s) == -EINVAL, "shard: nblocks mismatch");
	s = mk_flat(0, 0, 10, bs);
	s.file = "../x";
	check(sf_tensor_add_shard(m, t, &s) == -EINVAL, "shard: bad file");
	s = mk_flat(0, 0, 10, bs);
	s.file_offset = INT64_MAX - 5;
	check(sf_tensor_add_shard(m, t, &s) == -SF_ETOOBIG, "shard: file range overflow");
	check(t->nshards == 3, "rejected shards left entries (%zu)", t->nshards);

	uint64_t fshape[1] = { 532 };
	check(sf_model_add_tensor(m, true, "config.json", SF_DT_U8, 1, fshape, &t) == 0, "add file");
	s = mk_flat(2, 0, 532, bs);
	check(sf_tensor_add_shard(m, t, &s) == 0, "add file shard");
	/* Added after the file, sorts before the embed. */
	uint64_t sc[1] = { 0 };
	check(sf_model_add_tensor(m, false, "a.scalar", SF_DT_F64, 0, sc, &t) == 0, "add scalar");
	s = mk_box(0, 0, sc, sc, 8, bs);
	check(sf_tensor_add_shard(m, t, &s) == 0, "add scalar shard");
	/* A name the dump must escape ('"', '\\') or pass through (UTF-8). */
	check(sf_model_add_tensor(m, false, "we\"ird\\name/\xc3\xa9", SF_DT_F64, 0, sc,
				     &t) == 0, "add escaped name");
	s = mk_box(0, 0, sc, sc, 8, bs);
	check(sf_tensor_add_shard(m, t, &s) == 0, "add escaped-name shard");

	check(sf_model_finish(m, err, sizeof(err)) == 0, "finish: %s", err);
	check(m->ntensors == 3 && strcmp(m->tensors[0].name, "a.scalar") == 0, "finish sorts");
	const struct sf_tensor *e = sf_model_find(m, "model.embed.weight");
	check(e && e->nshards == 3 && e->nbytes == 320 * 40 * 2, "find embed");
	check(e && e->shards[0].xxh3 != sums && e->shards[0].xxh3[0] == sums[0], "shard checksums deep-copied");
	check(sf_model_find_file(m, "config.json") != NULL, "find_file");

	char *js = NULL;
	size_t jl;
	struct sf_model *m2 = NULL;
	check(sf_manifest_dump(m, &js, &jl) == 0, "dump built manifest");
	check(js && sf_manifest_parse(js, jl, &m2, err, sizeof(err)) == 0, "parse built dump: %s", err);
	check(m2 && manifest_equal(m, m2, why, sizeof(why)), "built round trip: %s", why);
	check(js && strstr(js, "\"flat\"") && strstr(js, "\"offsets\"") && strstr(js, "\"xxh3\""),
	      "dump has the SPEC keys");
	check(js && strstr(js, "\"we\\\"ird\\\\name/\xc3\xa9\": {"), "dump escapes names");
	check(m2 && sf_model_find(m2, "we\"ird\\name/\xc3\xa9") != NULL, "escaped name round trip");
	sf_model_destroy(m2);
	free(js);

	/* duplicates and directory prefixes are caught at finish */
	uint64_t one[1] = { 1 };
	check(sf_model_add_tensor(m, false, "a.scalar", SF_DT_U8, 1, one, &t) == 0, "add duplicate");
	check(sf_model_finish(m, err, sizeof(err)) == -SF_EMANIFEST && strstr(err, "duplicate tensor name \"a.scalar\""),
	      "finish: duplicate (%s)", err);
	sf_model_destroy(m);

	m = sf_model_new("p", 1, bs);
	check(m != NULL, "new p");
	if (!m)
		return;
	const char *names[] = { "x/y/z", "x.y", "x/y" };
	for (size_t i = 0; i < 3; i++) {
		check(sf_model_add_tensor(m, false, names[i], SF_DT_U8, 1, one, &t) == 0, "add %s", names[i]);
		s = mk_flat(0, 0, 1, bs);
		check(sf_tensor_add_shard(m, t, &s) == 0, "shard %s", names[i]);
	}
	check(sf_model_finish(m, err, sizeof(err)) == -SF_EMANIFEST &&
	      strstr(err, "tensor \"x/y\" is also a directory of tensor \"x/y/z\""),
	      "finish: prefix (%s)", err);
	sf_model_destroy(m);

	check(sf_name_valid("layers/0/wq") && !sf_name_valid("wq@0:1") && !sf_name_valid("a/../b") &&
	      !sf_name_valid("") && !sf_name_valid("/a") && !sf_name_valid(NULL), "sf_name_valid");
	check(sf_relpath_valid("rank-00000/x@1") && !sf_relpath_valid("/abs") &&
	      !sf_relpath_valid("a/./b") && !sf_relpath_valid("a\tb"), "sf_relpath_valid");
}

/* ------------------------------------------------------------------ */
/* coverage against a naive byte bitmap                                */

/* A foreign model as the mount shows it (sf_manifest_dump): another format's
 * name, a shard without checksums, a strided box, a zstd-coded shard, an
 * object. sf_manifest_parse_shown reads all of it back; the strict parser
 * refuses it. */
static void test_shown(void)
{
	char err[ERRLEN], why[256];
	struct sf_model *m = sf_model_new("fx", 2, 4096), *back = NULL;
	struct sf_tensor *t;
	char *js = NULL;
	size_t jl = 0;

	check(m != NULL, "new fx");
	if (!m)
		return;
	sf_model_set_format(m, "torch-dcp 1.0.0");
	uint64_t shape[2] = { 5, 6 }, off[2] = { 0, 0 }, strides[2] = { 1, 5 };
	check(sf_model_add_tensor(m, false, "transposed", SF_DT_F32, 2, shape, &t) == 0,
	      "shown: add transposed");
	struct sf_shard s = mk_box(0, 2, off, shape, 4, 4096);
	s.xxh3 = NULL;
	s.nblocks = 0;
	s.strides = strides;
	check(sf_tensor_add_shard(m, t, &s) == 0, "shown: strided shard: %s", sf_model_why(m));
	uint64_t n[1] = { 100 };
	check(sf_model_add_tensor(m, false, "ramp", SF_DT_U8, 1, n, &t) == 0, "shown: add ramp");
	s = mk_flat(1, 0, 100, 4096);
	s.xxh3 = NULL;
	s.nblocks = 0;
	s.codec = SF_CODEC_ZSTD;
	s.stored_len = 40;
	s.decoded_off = 8;
	s.decoded_len = 200;
	check(sf_tensor_add_shard(m, t, &s) == 0, "shown: coded shard: %s", sf_model_why(m));
	check(sf_model_add_object(m, "step", 7, &t) == 0, "shown: add object");
	s = mk_flat(0, 0, 7, 4096);
	check(sf_tensor_add_shard(m, t, &s) == 0, "shown: object shard: %s", sf_model_why(m));
	check(sf_model_finish(m, err, sizeof(err)) == 0, "shown: finish: %s", err);
	check(sf_manifest_dump(m, &js, &jl) == 0, "shown: dump");
	check(js && sf_manifest_parse(js, jl, &back, err, sizeof(err)) == -SF_EMANIFEST &&
	      strstr(err, "\"format\""), "shown: the strict parser refuses it (%s)", err);
	sf_model_destroy(back);
	back = NULL;
	check(js && sf_manifest_parse_shown(js, jl, &back, err, sizeof(err)) == 0,
	      "shown: parse_shown: %s", err);
	if (back) {
		const struct sf_tensor *r = sf_model_find(back, "ramp");
		const struct sf_tensor *tr = sf_model_find(back, "transposed");
		const struct sf_tensor *o = sf_model_find_object(back, "step");

		check(manifest_equal(m, back, why, sizeof(why)), "shown: round trip: %s", why);
		check(strcmp(back->format, "torch-dcp 1.0.0") == 0, "shown: format kept");
		check(r && r->shards[0].codec == SF_CODEC_ZSTD && r->shards[0].stored_len == 40 &&
		      r->shards[0].decoded_off == 8 && r->shards[0].decoded_len == 200 &&
		      !r->shards[0].xxh3, "shown: coded shard read back");
		check(tr && tr->shards[0].strides && tr->shards[0].strides[1] == 5,
		      "shown: strides read back");
		check(o && o->shards[0].xxh3 && o->nbytes == 7, "shown: object with checksums");
	}
	sf_model_destroy(back);
	free(js);
	/* what stays refused: a format string with a control byte */
	static const char bad[] = "{\"format\":\"x\\u0001\",\"name\":\"a\",\"world_size\":1,"
				  "\"block_size\":4096,\"tensors\":{}}";
	back = NULL;
	check(sf_manifest_parse_shown(bad, sizeof(bad) - 1, &back, err, sizeof(err)) ==
	      -SF_EMANIFEST, "shown: control byte in format refused (%s)", err);
	sf_model_destroy(back);
	sf_model_destroy(m);
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rnd(uint64_t n) /* uniform-ish in [0, n), n > 0 */
{
	rng_state ^= rng_state << 13;
	rng_state ^= rng_state >> 7;
	rng_state ^= rng_state << 17;
	return rng_state % n;
}

/* Mark a box's bytes in the bitmap (row-major over the box's elements). */
static void mark_box(unsigned char *map, const struct sf_tensor *t, const struct sf_box *b)
{
	size_t isz = sf_dtype_size(t->dtype);
	uint64_t idx[SF_MAX_NDIM] = { 0 };
	uint64_t n = sf_box_numel(b);
	for (uint64_t e = 0; e < n; e++) {
		uint64_t flat = 0;
		for (unsigned d = 0; d < t->ndim; d++)
			flat = flat * t->shape[d] + b->off[d] + idx[d];
		memset(map + flat * isz, 1, isz);
		for (unsigned d = t->ndim; d-- > 0;) {
			if (++idx[d] < b->len[d])
				break;
			idx[d] = 0;
		}
	}
}

static void test_coverage_random(void)
{
	char err[ERRLEN];
	const uint64_t bs = 4096;
	const enum sf_dtype dts[] = { SF_DT_U8, SF_DT_F16, SF_DT_F32, SF_DT_F64 };
	int gaps = 0, covered = 0;

	for (int iter = 0; iter < 3000; iter++) {
		struct sf_model *m = sf_model_new("c", 4, bs);
		struct sf_tensor *t;
		uint64_t shape[4];
		unsigned ndim = (unsigned)rnd(5);
		for (unsigned d = 0; d < ndim; d++)
			shape[d] = 1 + rnd(5);
		enum sf_dtype dt = dts[rnd(4)];
		if (!m || sf_model_add_tensor(m, false, "t", dt, ndim, shape, &t) != 0) {
			check(false, "coverage setup");
			sf_model_destroy(m);
			return;
		}
		unsigned char *map = calloc(1, t->nbytes);
		unsigned nsh = (unsigned)rnd(6);
		/* Usually start from a flat partition with a piece dropped
		 * sometimes, then add random boxes and flat ranges. */
		if (rnd(2)) {
			uint64_t at = 0;
			while (at < t->nbytes) {
				uint64_t l = 1 + rnd(t->nbytes - at);
				if (rnd(8)) {
					struct sf_shard s = mk_flat(0, at, l, bs);
					check(sf_tensor_add_shard(m, t, &s) == 0, "add partition flat");
					memset(map + at, 1, l);
				}
				at += l;
			}
		}
		for (unsigned i = 0; i < nsh; i++) {
			struct sf_shard s;
			uint64_t off[4], len[4];
			if (rnd(2)) {
				uint64_t o = rnd(t->nbytes + 1);
				s = mk_flat(1, o, rnd(t->nbytes - o + 1), bs);
				memset(map + o, 1, s.flat_len);
			} else {
				struct sf_box b;
				for (unsigned d = 0; d < ndim; d++) {
					off[d] = rnd(shape[d]);
					len[d] = 1 + rnd(shape[d] - off[d]);
				}
				s = mk_box(2, ndim, off, len, sf_dtype_size(dt), bs);
				sf_shard_box(&s, ndim, &b);
				mark_box(map, t, &b);
			}
			check(sf_tensor_add_shard(m, t, &s) == 0, "add random shard");
		}
		uint64_t first = UINT64_MAX;
		for (uint64_t b = 0; b < t->nbytes; b++)
			if (!map[b]) {
				first = b / sf_dtype_size(dt);
				break;
			}
		int rc = sf_tensor_check_coverage(t, err, sizeof(err));
		if (first == UINT64_MAX) {
			covered++;
			check(rc == 0, "iter %d: covered tensor reported: %s", iter, err);
		} else {
			char want[64];
			snprintf(want, sizeof(want), "element %" PRIu64 " [", first);
			gaps++;
			check(rc == -SF_EGAP && strstr(err, want), "iter %d: expected gap at %s, got %d: %s",
			      iter, want, rc, err);
		}
		free(map);
		sf_model_destroy(m);
	}
	check(gaps > 100 && covered > 100, "random cases exercise both outcomes (%d gaps, %d covered)",
	      gaps, covered);
}

/* Many shards: a grid of single-row blocks in reverse order with one
 * element missing, and a fully covered fine grid; both decided within
 * the work bound. */
static void test_coverage_large(void)
{
	char err[ERRLEN];
	const uint64_t bs = 4096;
	struct sf_model *m = sf_model_new("big", 1, bs);
	struct sf_tensor *t;
	uint64_t shape[2] = { 256, 256 };
	if (!m || sf_model_add_tensor(m, false, "grid", SF_DT_U8, 2, shape, &t) != 0) {
		check(false, "large setup");
		sf_model_destroy(m);
		return;
	}
	for (uint64_t i = 256; i-- > 0;)
		for (uint64_t j = 256; j-- > 0;) {
			if (i == 200 && j == 7)
				continue;
			uint64_t off[2] = { i, j }, len[2] = { 1, 1 };
			struct sf_shard s = mk_box(0, 2, off, len, 1, bs);
			if (sf_tensor_add_shard(m, t, &s) != 0) {
				check(false, "large add");
				goto out_destroy;
			}
		}
	int rc = sf_tensor_check_coverage(t, err, sizeof(err));
	check(rc == -SF_EGAP && strstr(err, "element 51207 [200, 7]"), "65535-shard grid gap: %d %s", rc, err);
	uint64_t off[2] = { 200, 7 }, len[2] = { 1, 1 };
	struct sf_shard s = mk_box(0, 2, off, len, 1, bs);
	check(sf_tensor_add_shard(m, t, &s) == 0, "large add last");
	rc = sf_tensor_check_coverage(t, err, sizeof(err));
	check(rc == 0, "65536-shard grid covered: %d %s", rc, err);
	check(sf_tensor_add_shard(m, t, &s) == -SF_ETOOBIG, "shard count limit");
out_destroy:
	sf_model_destroy(m);
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
		return 2;
	}
	size_t nv = run_dir(argv[1], "valid", true);
	size_t ni = run_dir(argv[1], "invalid", false);
	check(nv >= MIN_VALID, "only %zu valid cases (want >= %d)", nv, MIN_VALID);
	check(ni >= MIN_INVALID, "only %zu invalid cases (want >= %d)", ni, MIN_INVALID);
	test_builder();
	test_shown();
	test_coverage_random();
	test_coverage_large();
	printf("%d checks, %d failed (%zu valid, %zu invalid manifests)\n", checks, failures, nv, ni);
	return failures ? 1 : 0;
}
