/*
 * test_index.c - shardfs.index.json (core/formats/sf_index.h): the parser
 * accepts what the dump writes (round trip to identical text) and refuses
 * every malformed or hostile index with its code and a one-line reason;
 * the builder reads every shard of a model (files of random bytes in a
 * temporary directory) into the XXH3 of each block, computed here
 * independently; the writer leaves exactly one new file; the matcher
 * attaches the checksums to a fresh model, reports changed and new files,
 * and leaves the model untouched when the index does not fit.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <dirent.h>
#include <xxhash.h>

#include "sf_checksum.h"
#include "sf_error.h"
#include "sf_index.h"
#include "sf_io.h"
#include "sf_log.h"
#include "sf_save.h"
#include "sf_test.h"

#define BS 4096u

/* --- parser --- */

static const char good[] =
	"{\"format\": \"shardfs-index\", \"version\": 1, \"adapter\": \"torch-dcp\","
	" \"checkpoint_format\": \"torch-dcp 1.0.0\", \"block_size\": 4096,"
	" \"files\": {\"b.bin\": {\"size\": 9000, \"mtime_ns\": -5},"
	"             \"a.bin\": {\"size\": 100, \"mtime_ns\": 1700000000123456789}},"
	" \"shards\": ["
	"  {\"kind\": \"tensor\", \"name\": \"w\", \"file\": \"b.bin\", \"file_offset\": 10,"
	"   \"nbytes\": 8192, \"xxh3\": [\"0123456789abcdef\", \"fedcba9876543210\"]},"
	"  {\"kind\": \"file\", \"name\": \"a.bin\", \"file\": \"a.bin\", \"file_offset\": 0,"
	"   \"nbytes\": 100, \"xxh3\": [\"0000000000000001\"]},"
	"  {\"kind\": \"object\", \"name\": \"step\", \"file\": \"b.bin\", \"file_offset\": 0,"
	"   \"nbytes\": 0, \"xxh3\": []}]}";

static void test_parse_good(void)
{
	struct sf_index *ix = NULL, *ix2 = NULL;
	char err[256], *t1 = NULL, *t2 = NULL;
	size_t l1 = 0, l2 = 0;

	if (!CHECK_EQ(sf_index_parse(good, strlen(good), &ix, err, sizeof(err)), 0)) {
		fprintf(stderr, "  %s\n", err);
		return;
	}
	CHECK(strcmp(ix->adapter, "torch-dcp") == 0);
	CHECK(strcmp(ix->format, "torch-dcp 1.0.0") == 0);
	CHECK_EQ(ix->block_size, 4096);
	CHECK_EQ(ix->nfiles, 2);
	CHECK(strcmp(ix->files[0].name, "a.bin") == 0); /* sorted */
	CHECK_EQ(ix->files[0].mtime_ns, 1700000000123456789LL);
	CHECK_EQ(ix->files[1].mtime_ns, -5);
	CHECK_EQ(ix->nshards, 3);
	/* sorted by kind, then name */
	CHECK_EQ(ix->shards[0].kind, SF_ENTRY_TENSOR);
	CHECK_EQ(ix->shards[0].nblocks, 2);
	CHECK_EQ(ix->shards[0].xxh3[1], 0xfedcba9876543210ULL);
	CHECK_EQ(ix->shards[1].kind, SF_ENTRY_FILE);
	CHECK_EQ(ix->shards[2].kind, SF_ENTRY_OBJECT);
	CHECK_EQ(ix->shards[2].nblocks, 0);
	/* dump, parse, dump: the same text */
	CHECK_EQ(sf_index_dump(ix, &t1, &l1), 0);
	CHECK_EQ(sf_index_parse(t1, l1, &ix2, err, sizeof(err)), 0);
	if (ix2) {
		CHECK_EQ(sf_index_dump(ix2, &t2, &l2), 0);
		CHECK(t2 && l1 == l2 && memcmp(t1, t2, l1) == 0);
	}
	free(t1);
	free(t2);
	sf_index_free(ix);
	sf_index_free(ix2);
}

struct bad {
	const char *what;
	const char *from, *to;   /* replace the first `from` in good by `to` */
	int want;
};

static const struct bad bads[] = {
	{ "not an object", "{\"format\"", "[{\"format\"", -SF_EMANIFEST },
	{ "wrong format", "shardfs-index", "shardfs-indexx", -SF_EMANIFEST },
	{ "newer version", "\"version\": 1", "\"version\": 2", -SF_EMANIFEST },
	{ "version a string", "\"version\": 1", "\"version\": \"1\"", -SF_EMANIFEST },
	{ "no adapter", "\"adapter\"", "\"adaptor\"", -SF_EMANIFEST },
	{ "adapter too long", "\"adapter\": \"torch-dcp\"",
	  "\"adapter\": \"0123456789012345678901234567890123456789012345678901234567890123456789\"",
	  -SF_ETOOBIG },
	{ "adapter control char", "\"adapter\": \"torch-dcp\"", "\"adapter\": \"torch\\n\"",
	  -SF_EMANIFEST },
	{ "block size small", "\"block_size\": 4096", "\"block_size\": 4095", -SF_EMANIFEST },
	{ "block size huge", "\"block_size\": 4096", "\"block_size\": 1099511627776",
	  -SF_EMANIFEST },
	{ "block size negative", "\"block_size\": 4096", "\"block_size\": -4096",
	  -SF_EMANIFEST },
	{ "files an array", "\"files\": {", "\"files\": [1], \"x\": {", -SF_EMANIFEST },
	{ "file name ..", "\"b.bin\": {", "\"../b.bin\": {", -SF_EMANIFEST },
	{ "file name absolute", "\"a.bin\": {", "\"/a.bin\": {", -SF_EMANIFEST },
	{ "file name empty", "\"a.bin\": {", "\"\": {", -SF_EMANIFEST },
	{ "file size negative", "\"size\": 100", "\"size\": -100", -SF_EMANIFEST },
	{ "file mtime float", "\"mtime_ns\": -5", "\"mtime_ns\": 1.5", -SF_EMANIFEST },
	{ "duplicate file", "\"a.bin\": {\"size\": 100",
	  "\"b.bin\": {\"size\": 100", -SF_EMANIFEST },
	{ "shards an object", "\"shards\": [", "\"shards\": {}, \"y\": [", -SF_EMANIFEST },
	{ "shard not an object", "\"shards\": [", "\"shards\": [1, ", -SF_EMANIFEST },
	{ "bad kind", "\"kind\": \"object\"", "\"kind\": \"blob\"", -SF_EMANIFEST },
	{ "entry name ..", "\"name\": \"w\"", "\"name\": \"a/../w\"", -SF_EMANIFEST },
	{ "entry name with @", "\"name\": \"w\"", "\"name\": \"w@0:1\"", -SF_EMANIFEST },
	{ "shard file unlisted", "\"file\": \"b.bin\"", "\"file\": \"c.bin\"", -SF_EMANIFEST },
	{ "shard file ..", "\"file\": \"b.bin\"", "\"file\": \"../b.bin\"", -SF_EMANIFEST },
	{ "offset + nbytes overflow", "\"file_offset\": 10", "\"file_offset\": 9223372036854775000",
	  -SF_EMANIFEST },
	{ "too many checksums", "\"xxh3\": [\"0000000000000001\"]",
	  "\"xxh3\": [\"0000000000000001\", \"0000000000000002\"]", -SF_EMANIFEST },
	{ "too few checksums", "\"xxh3\": [\"0000000000000001\"]", "\"xxh3\": []",
	  -SF_EMANIFEST },
	{ "checksums missing", "\"xxh3\": [\"0000000000000001\"]", "\"x\": 1", -SF_EMANIFEST },
	{ "checksum upper case", "0123456789abcdef", "0123456789ABCDEF", -SF_EMANIFEST },
	{ "checksum short", "0123456789abcdef", "0123456789abcde", -SF_EMANIFEST },
	{ "huge nbytes", "\"nbytes\": 8192", "\"nbytes\": 4611686018427387904", -SF_EMANIFEST },
	{ "truncated", ", \"xxh3\": []}]}", ", \"xxh3\": []", -SF_EMANIFEST },
	{ "duplicate key", "\"version\": 1,", "\"version\": 1, \"version\": 1,", -SF_EMANIFEST },
	{ "NUL in a name", "\"name\": \"w\"", "\"name\": \"w\\u0000x\"", -SF_EMANIFEST },
};

/* good with the first `from` replaced by `to` (malloc'd). */
static char *edited(const char *from, const char *to)
{
	const char *at = strstr(good, from);
	size_t n = strlen(good) - strlen(from) + strlen(to);
	char *s;

	if (!at)
		return NULL;
	s = malloc(n + 1);
	if (!s)
		return NULL;
	memcpy(s, good, (size_t)(at - good));
	strcpy(s + (at - good), to);
	strcat(s, at + strlen(from));
	return s;
}

static void test_parse_bad(void)
{
	for (size_t i = 0; i < sizeof(bads) / sizeof(bads[0]); i++) {
		char err[256] = "";
		struct sf_index *ix = NULL;
		char *text = edited(bads[i].from, bads[i].to);
		int rc;

		if (!CHECK(text != NULL)) {
			fprintf(stderr, "  case %s: pattern not found\n", bads[i].what);
			continue;
		}
		rc = sf_index_parse(text, strlen(text), &ix, err, sizeof(err));
		if (!CHECK_EQ(rc, bads[i].want))
			fprintf(stderr, "  case %s: %s\n", bads[i].what, err);
		if (rc) {
			CHECK(ix == NULL);
			CHECK(err[0] != '\0' && !strchr(err, '\n'));
		}
		sf_index_free(ix);
		free(text);
	}
	/* the same shard twice */
	{
		const char *dup = "{\"format\": \"shardfs-index\", \"version\": 1, \"adapter\": \"x\","
			" \"block_size\": 4096, \"files\": {\"f\": {\"size\": 1, \"mtime_ns\": 1}},"
			" \"shards\": [{\"kind\": \"tensor\", \"name\": \"w\", \"file\": \"f\","
			" \"file_offset\": 0, \"nbytes\": 0, \"xxh3\": []},"
			" {\"kind\": \"tensor\", \"name\": \"w\", \"file\": \"f\","
			" \"file_offset\": 0, \"nbytes\": 0, \"xxh3\": []}]}";
		struct sf_index *ix = NULL;
		char err[256];

		CHECK_EQ(sf_index_parse(dup, strlen(dup), &ix, err, sizeof(err)), -SF_EMANIFEST);
		CHECK(strstr(err, "listed twice") != NULL);
	}
	/* over the size cap: refused before parsing */
	{
		struct sf_index *ix = NULL;
		char err[256];

		CHECK_EQ(sf_index_parse(good, (size_t)SF_INDEX_MAX_BYTES + 1, &ix, err,
					sizeof(err)), -SF_ETOOBIG);
	}
	/* every prefix of a good index: refused cleanly, no crash */
	for (size_t n = 0; n < strlen(good); n++) {
		struct sf_index *ix = NULL;
		char err[256];

		if (sf_index_parse(good, n, &ix, err, sizeof(err)) == 0) {
			CHECK(!"a prefix parsed");
			sf_index_free(ix);
		}
	}
}

/* --- build, write, apply on real files --- */

/* Cut or grow dir/name to size bytes. */
static int truncate_at(int dirfd, const char *name, off_t size)
{
	int fd = openat(dirfd, name, O_WRONLY);
	int rc;

	if (fd < 0)
		return -1;
	rc = ftruncate(fd, size);
	close(fd);
	return rc;
}

#define FILE_A 20000u   /* bytes of a.bin */
#define FILE_B 3000u    /* bytes of b.bin */

static unsigned char bytes_a[FILE_A], bytes_b[FILE_B];

static int write_file(int dirfd, const char *name, const void *p, size_t n)
{
	int fd = openat(dirfd, name, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	int ok;

	if (fd < 0)
		return -1;
	ok = write(fd, p, n) == (ssize_t)n;
	close(fd);
	return ok ? 0 : -1;
}

/* A model of the two files: tensor "w" (U8, 12000) in two shards of
 * a.bin, object "step" (b.bin, 100 bytes at 7), root file "b.bin". */
static struct sf_model *make_model(void)
{
	struct sf_model *m = sf_model_new("ck", 1, SF_DEFAULT_BLOCK_SIZE);
	struct sf_tensor *t;
	uint64_t shape = 12000, size_b = FILE_B;
	struct sf_box bx = { .ndim = 1 };
	struct sf_shard s = { .off = bx.off, .len = bx.len };
	char err[256];

	if (!m)
		return NULL;
	sf_model_set_format(m, "test-format 1");
	if (sf_model_add_tensor(m, false, "w", SF_DT_U8, 1, &shape, &t))
		goto fail;
	bx.off[0] = 0;
	bx.len[0] = 9000;
	s.file = "a.bin";
	s.file_offset = 1000;
	s.nbytes = 9000;
	if (sf_tensor_add_shard(m, t, &s))
		goto fail;
	bx.off[0] = 9000;
	bx.len[0] = 3000;
	s.file_offset = 15000;
	s.nbytes = 3000;
	if (sf_tensor_add_shard(m, t, &s))
		goto fail;
	if (sf_model_add_object(m, "step", 100, &t))
		goto fail;
	bx.off[0] = 0;
	bx.len[0] = 100;
	s.file = "b.bin";
	s.file_offset = 7;
	s.nbytes = 100;
	if (sf_tensor_add_shard(m, t, &s))
		goto fail;
	if (sf_model_add_tensor(m, true, "b.bin", SF_DT_U8, 1, &size_b, &t))
		goto fail;
	bx.len[0] = FILE_B;
	s.file_offset = 0;
	s.nbytes = FILE_B;
	if (sf_tensor_add_shard(m, t, &s))
		goto fail;
	if (sf_model_finish(m, err, sizeof(err)))
		goto fail;
	return m;
fail:
	fprintf(stderr, "make_model: %s\n", sf_model_why(m));
	sf_model_destroy(m);
	return NULL;
}

static const struct sf_shard *shard_of(const struct sf_model *m, const char *name,
				       size_t k)
{
	const struct sf_tensor *t = sf_model_find(m, name);

	if (!t)
		t = sf_model_find_object(m, name);
	if (!t)
		t = sf_model_find_file(m, name);
	return t && k < t->nshards ? &t->shards[k] : NULL;
}

static uint64_t progress_calls, progress_last;

static void on_progress(void *arg, uint64_t done, uint64_t total)
{
	(void)arg;
	(void)total;
	progress_calls++;
	progress_last = done;
}

/* Names in dir other than "." and "..", counted; *has_tmp: a temporary. */
static int count_names(const char *dir, bool *has_tmp)
{
	DIR *d = opendir(dir);
	struct dirent *de;
	int n = 0;

	*has_tmp = false;
	if (!d)
		return -1;
	while ((de = readdir(d))) {
		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		n++;
		if (!strncmp(de->d_name, SF_INDEX_TMP_PREFIX, strlen(SF_INDEX_TMP_PREFIX)))
			*has_tmp = true;
	}
	closedir(d);
	return n;
}

static void test_build_apply(void)
{
	char dir[] = "/tmp/test_index.XXXXXX", err[512];
	struct sf_index *ix = NULL, *back = NULL;
	struct sf_model *m = NULL, *m2 = NULL;
	struct sf_index_status st;
	struct timespec times[2];
	char *text = NULL;
	size_t len = 0;
	bool has_tmp;
	int dirfd;

	if (!CHECK(mkdtemp(dir) != NULL))
		return;
	dirfd = open(dir, O_RDONLY | O_DIRECTORY);
	sf_rand_fill(bytes_a, sizeof(bytes_a));
	sf_rand_fill(bytes_b, sizeof(bytes_b));
	CHECK_EQ(write_file(dirfd, "a.bin", bytes_a, FILE_A), 0);
	CHECK_EQ(write_file(dirfd, "b.bin", bytes_b, FILE_B), 0);
	m = make_model();
	if (!CHECK(m != NULL))
		goto out;
	CHECK(!sf_model_verified(m));

	/* build: every block's XXH3, computed here from the bytes */
	CHECK_EQ(sf_index_build(dirfd, m, "test", BS, on_progress, NULL, &ix, err,
				sizeof(err)), 0);
	if (!CHECK(ix != NULL)) {
		fprintf(stderr, "  %s\n", err);
		goto out;
	}
	CHECK_EQ(ix->nfiles, 2);
	CHECK_EQ(ix->nshards, 4);
	CHECK_EQ(ix->block_size, BS);
	CHECK(strcmp(ix->format, "test-format 1") == 0);
	CHECK_EQ(progress_last, 9000 + 3000 + 100 + FILE_B);
	CHECK(progress_calls >= 4);
	for (size_t i = 0; i < ix->nshards; i++) {
		const struct sf_index_shard *s = &ix->shards[i];
		const unsigned char *base = strcmp(s->file, "a.bin") == 0 ? bytes_a : bytes_b;

		CHECK_EQ(s->nblocks, sf_nblocks(s->nbytes, BS));
		for (uint64_t b = 0; b < s->nblocks; b++) {
			uint64_t off = s->file_offset + b * BS;
			size_t n = (size_t)(s->nbytes - b * BS < BS ? s->nbytes - b * BS : BS);

			CHECK_EQ(s->xxh3[b], XXH3_64bits(base + off, n));
		}
	}
	/* write: exactly one new file, parsed back to the same text */
	CHECK_EQ(sf_index_write(dirfd, ix, err, sizeof(err)), 0);
	CHECK_EQ(sf_index_write(dirfd, ix, err, sizeof(err)), 0); /* replaces */
	CHECK_EQ(count_names(dir, &has_tmp), 3);
	CHECK(!has_tmp);
	{
		char path[64];
		char *t2 = NULL;
		size_t l2 = 0;

		snprintf(path, sizeof(path), "%s/" SF_INDEX_NAME, dir);
		CHECK_EQ(sf_read_file(path, SF_INDEX_MAX_BYTES, &text, &len), 0);
		CHECK_EQ(sf_index_parse(text, len, &back, err, sizeof(err)), 0);
		if (back) {
			CHECK_EQ(sf_index_dump(back, &t2, &l2), 0);
			CHECK(t2 && l2 == len && memcmp(t2, text, len) == 0);
		}
		free(t2);
	}

	/* apply to a fresh model: every shard verified, block size taken */
	memset(&st, 0, sizeof(st));
	CHECK_EQ(sf_index_apply(dirfd, "ck", "test", ix, m, &st), 0);
	CHECK(sf_model_verified(m));
	CHECK_EQ(m->block_size, BS);
	CHECK_EQ(st.shards, 4);
	CHECK_EQ(st.changed, 0);
	CHECK_EQ(shard_of(m, "w", 0)->nblocks, 3);
	CHECK_EQ(shard_of(m, "w", 0)->xxh3[2], XXH3_64bits(bytes_a + 1000 + 2 * BS, 9000 - 2 * BS));

	/* another adapter: refused, the model untouched */
	m2 = make_model();
	CHECK_EQ(sf_index_apply(dirfd, "ck", "other", ix, m2, &st), -SF_EMANIFEST);
	CHECK(strstr(st.why, "other") != NULL);
	CHECK(!sf_model_verified(m2));
	CHECK_EQ(m2->block_size, SF_DEFAULT_BLOCK_SIZE);

	/* a touched file: reported, still verified (its shards match) */
	times[0].tv_sec = 1;
	times[0].tv_nsec = 0;
	times[1] = times[0];
	CHECK_EQ(utimensat(dirfd, "b.bin", times, 0), 0);
	CHECK_EQ(sf_index_apply(dirfd, "ck", "test", ix, m2, &st), 0);
	CHECK_EQ(st.changed, 1);
	CHECK_EQ(st.unverified, 0);
	CHECK(sf_model_verified(m2));
	sf_model_destroy(m2);

	/* an index missing a shard of an unchanged file: refused */
	m2 = make_model();
	{
		struct sf_index cut = *ix;
		size_t k;

		for (k = 0; k < ix->nshards && strcmp(ix->shards[k].file, "a.bin"); k++)
			;
		/* drop shard k by showing the matcher the rest */
		struct sf_index_shard *rest = calloc(ix->nshards, sizeof(*rest));
		size_t n = 0;

		for (size_t i = 0; rest && i < ix->nshards; i++)
			if (i != k)
				rest[n++] = ix->shards[i];
		cut.shards = rest;
		cut.nshards = n;
		CHECK_EQ(sf_index_apply(dirfd, "ck", "test", &cut, m2, &st), -SF_EMANIFEST);
		CHECK(strstr(st.why, "not in the index") != NULL);
		CHECK(!sf_model_verified(m2));
		/* the file it lies in changed size: its shards go unverified */
		CHECK_EQ(truncate_at(dirfd, "a.bin", FILE_A + 1), 0);
		CHECK_EQ(sf_index_apply(dirfd, "ck", "test", &cut, m2, &st), 0);
		CHECK_EQ(st.unverified, 1);
		CHECK_EQ(st.changed, 2); /* a.bin (size), b.bin (mtime) */
		CHECK(!sf_model_verified(m2));
		free(rest);
	}
	sf_model_destroy(m2);
	m2 = NULL;

	/* a file the index does not know: its shard unverified, reported */
	m2 = make_model();
	{
		struct sf_index cut = *ix;
		struct sf_index_shard *rest = calloc(ix->nshards, sizeof(*rest));
		struct sf_index_file f1 = ix->files[0]; /* a.bin only */
		size_t n = 0;

		for (size_t i = 0; rest && i < ix->nshards; i++)
			if (strcmp(ix->shards[i].file, "b.bin") != 0)
				rest[n++] = ix->shards[i];
		cut.shards = rest;
		cut.nshards = n;
		cut.files = &f1;
		cut.nfiles = 1;
		CHECK_EQ(sf_index_apply(-1, "ck", "test", &cut, m2, &st), 0);
		CHECK_EQ(st.unverified, 2);  /* step and b.bin */
		CHECK_EQ(st.changed, 1);
		CHECK(shard_of(m2, "w", 1)->xxh3 != NULL);
		CHECK(shard_of(m2, "step", 0)->xxh3 == NULL);
		free(rest);
	}

	/* build refuses a short file */
	{
		struct sf_index *ix2 = NULL;

		CHECK_EQ(truncate_at(dirfd, "b.bin", 50), 0);
		CHECK(sf_index_build(dirfd, m2, "test", BS, NULL, NULL, &ix2, err,
				     sizeof(err)) < 0);
		CHECK(strstr(err, "past the end") != NULL);
		CHECK(ix2 == NULL);
	}
out:
	sf_index_free(ix);
	sf_index_free(back);
	sf_model_destroy(m);
	sf_model_destroy(m2);
	free(text);
	unlinkat(dirfd, SF_INDEX_NAME, 0);
	unlinkat(dirfd, "a.bin", 0);
	unlinkat(dirfd, "b.bin", 0);
	close(dirfd);
	rmdir(dir);
}

/* --- merge (a save's parts under MPI, sf_save.h) --- */

static const char part_b[] =
	"{\"format\": \"shardfs-index\", \"version\": 1, \"adapter\": \"torch-dcp\","
	" \"checkpoint_format\": \"torch-dcp 1.0.0\", \"block_size\": 4096,"
	" \"files\": {\"c.bin\": {\"size\": 50, \"mtime_ns\": 7}},"
	" \"shards\": ["
	"  {\"kind\": \"tensor\", \"name\": \"v\", \"file\": \"c.bin\", \"file_offset\": 0,"
	"   \"nbytes\": 50, \"xxh3\": [\"00000000000000aa\"]}]}";

static void test_merge(void)
{
	struct sf_index *a = NULL, *b = NULL, *m = NULL;
	const struct sf_index *parts[3];
	char err[256];

	if (!CHECK_EQ(sf_index_parse(good, strlen(good), &a, err, sizeof(err)), 0) ||
	    !CHECK_EQ(sf_index_parse(part_b, strlen(part_b), &b, err, sizeof(err)), 0))
		goto out;
	/* two ranks' parts, one of them twice: every file and shard once */
	parts[0] = b;
	parts[1] = a;
	parts[2] = b;
	if (CHECK_EQ(sf_index_merge(parts, 3, &m, err, sizeof(err)), 0)) {
		CHECK_EQ(m->nfiles, 3);
		CHECK(strcmp(m->files[2].name, "c.bin") == 0);
		CHECK_EQ(m->nshards, 4);
		CHECK(strcmp(m->shards[0].entry, "v") == 0); /* sorted: kind, name */
		CHECK_EQ(m->shards[0].xxh3[0], 0xaaULL);
		sf_index_free(m);
		m = NULL;
	}
	/* the same shard with other checksums: refused, with a reason */
	b->shards[0].xxh3[0] ^= 1;
	parts[1] = b;
	parts[0] = a;
	{
		struct sf_index *b2 = NULL;

		CHECK_EQ(sf_index_parse(part_b, strlen(part_b), &b2, err, sizeof(err)), 0);
		parts[2] = b2;
		CHECK_EQ(sf_index_merge(parts, 3, &m, err, sizeof(err)), -SF_EMANIFEST);
		CHECK(m == NULL && err[0]);
		/* the same file with another size: refused */
		b->shards[0].xxh3[0] ^= 1;
		b->files[0].size = 51;
		CHECK_EQ(sf_index_merge(parts, 3, &m, err, sizeof(err)), -SF_EMANIFEST);
		CHECK(m == NULL);
		sf_index_free(b2);
	}
	/* another block size: refused */
	b->files[0].size = 50;
	b->block_size = 8192;
	CHECK_EQ(sf_index_merge(parts, 2, &m, err, sizeof(err)), -SF_EMANIFEST);
out:
	sf_index_free(a);
	sf_index_free(b);
	sf_index_free(m);
}

/* The save marker's body (a peer's, under MPI): what it names, what is
 * refused. */
#define MARKER_PARSE(lit) sf_save_marker_parse(lit, sizeof(lit) - 1, &u, &g)

static void test_save_marker(void)
{
	char body[SF_SAVE_MARKER_MAX], big[SF_SAVE_MARKER_MAX + 8];
	size_t n = sf_save_marker_body(65534, 100, body, sizeof(body));
	uid_t u = 1;
	gid_t g = 1;

	CHECK(n > 0 && n < sizeof(body));
	CHECK_EQ(sf_save_marker_parse(body, n, &u, &g), 0);
	CHECK(u == 65534 && g == 100);
	/* an older daemon's marker: no gid */
	CHECK_EQ(MARKER_PARSE("{\"saved_by_uid\": 0}\n"), 0);
	CHECK(u == 0 && g == (gid_t)-1);
	CHECK_EQ(MARKER_PARSE("{}"), -SF_EFORMAT);
	CHECK_EQ(MARKER_PARSE("{\"saved_by_uid\": x}"), -SF_EFORMAT);
	CHECK_EQ(MARKER_PARSE("{\"saved_by_uid\": 4294967295}"),
		 -SF_EFORMAT);
	CHECK_EQ(MARKER_PARSE("{\"saved_by_uid\": 12345678901}"),
		 -SF_EFORMAT);
	CHECK_EQ(MARKER_PARSE("{\"saved_by_uid\": 5, \"saved_by_gid\": -1}"), -SF_EFORMAT);
	CHECK_EQ(MARKER_PARSE("{\"saved_by_uid\":\0 5}"), -SF_EFORMAT);
	memset(big, ' ', sizeof(big));
	memcpy(big, body, n);
	CHECK_EQ(sf_save_marker_parse(big, sizeof(big), &u, &g), -SF_EFORMAT);
}

int main(void)
{
	sf_log_setup("test_index: ", SF_LOG_ERROR);
	sf_test_seed("test_index", 11);
	test_parse_good();
	test_parse_bad();
	test_build_apply();
	test_merge();
	test_save_marker();
	return sf_test_done("test_index");
}
