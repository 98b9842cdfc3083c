/*
 * test_wckpt.c - the write path of core: writable checkpoints, the journal
 * and resume, and the commit merge, against bytes the test keeps itself.
 *
 * Every scenario writes into a fresh mkdtemp directory under /tmp, removed
 * at the end. Expected bytes are the test's own arrays; read-back goes
 * through sf_ckpt_open + the engine, the same path the mount uses.
 */
#include "sf_test.h"

#include "sf_engine.h"
#include "sf_error.h"
#include "sf_log.h"
#include "sf_store.h"
#include "sf_commit.h"
#include "sf_wckpt.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define BS 4096u

static char tmpl[] = "/tmp/sf-wckpt-XXXXXX";

static void rm_rf(const char *dir)
{
	char cmd[512];

	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	if (system(cmd) != 0)
		fprintf(stderr, "warning: could not remove %s\n", dir);
}

/* Merge the given parts, publish on w0 and read tensor `name` back. */
static int commit(struct sf_wckpt **ws, int n, char *err, size_t errlen)
{
	char *parts[8];
	size_t lens[8];
	char *merged = NULL;
	size_t mlen = 0;
	struct sf_source *src = NULL;
	struct sf_ckpt_ref ck = { .dir = sf_wckpt_dir(ws[0]), .name = sf_wckpt_name(ws[0]) };
	int ret;

	for (int i = 0; i < n; i++) {
		ret = sf_wckpt_export_part(ws[i], &parts[i], &lens[i]);
		if (ret)
			return ret;
	}
	ret = sf_local_source_create(&src);
	if (!ret)
		ret = sf_commit_merge(sf_wckpt_name(ws[0]), (const char *const *)parts,
				      lens, n, src, &ck, &merged, &mlen, err, errlen);
	if (!ret)
		ret = sf_wckpt_publish(ws[0], merged, mlen);
	if (!ret)
		ret = sf_wckpt_finish(ws[0]);
	sf_source_destroy(src);
	free(merged);
	for (int i = 0; i < n; i++)
		free(parts[i]);
	return ret;
}

static bool read_back(const char *dir, const char *name, bool is_file,
		      const void *want, size_t len)
{
	struct sf_ckpt *ck = NULL;
	struct sf_source *src = NULL;
	struct sf_engine *e = NULL;
	struct sf_engine_opts o = { .cache_bytes = 1 << 20, .verify = true };
	const struct sf_tensor *t;
	char err[256];
	unsigned char *got = malloc(len + 1);
	bool ok = false;

	if (sf_ckpt_open(dir, NULL, &ck, err, sizeof(err))) {
		fprintf(stderr, "open: %s\n", err);
		goto out;
	}
	t = is_file ? sf_model_find_file(ck->m, name) : sf_model_find(ck->m, name);
	if (!t || t->nbytes != len)
		goto out;
	if (sf_local_source_create(&src) || sf_engine_create(&o, src, &e))
		goto out;
	ok = sf_engine_read(e, &ck->ref, ck->m, t, NULL, 0, got, len) == 0 &&
	     memcmp(got, want, len) == 0;
out:
	sf_engine_destroy(e);
	sf_source_destroy(src);
	sf_ckpt_close(ck);
	free(got);
	return ok;
}

/* Single rank: box halves, out-of-order flat runs, a root file. */
static void test_single(const char *root)
{
	char dir[512], err[512];
	struct sf_wckpt *w = NULL;
	struct sf_wfile *f;
	uint64_t shape[2] = { 8, 600 }, flat[1] = { 20000 };
	float a[8 * 600];
	unsigned char b[20000], cfg[] = "{\"hidden\": 64}";
	struct sf_box half = { .ndim = 2, .off = { 4, 0 }, .len = { 4, 600 } };
	size_t resumed = 99;

	snprintf(dir, sizeof(dir), "%s/single", root);
	for (int i = 0; i < 8 * 600; i++)
		a[i] = (float)i * 0.5f;
	sf_rand_fill(b, sizeof(b));
	CHECK_EQ(sf_wckpt_open(dir, "single", 0, 1, BS, &w, &resumed), 0);
	CHECK_EQ(resumed, 0);
	CHECK_EQ(sf_wckpt_declare(w, "layers/0/w", SF_DT_F32, 2, shape), 0);
	CHECK_EQ(sf_wckpt_declare(w, "layers/0/w", SF_DT_F32, 2, shape), 0);
	shape[1] = 601;
	CHECK_EQ(sf_wckpt_declare(w, "layers/0/w", SF_DT_F32, 2, shape), -SF_ECONFLICT);
	CHECK_EQ(sf_wckpt_declare(w, "layers/0/w", SF_DT_BF16, 2, (uint64_t[]){ 8, 600 }),
		 -SF_ECONFLICT);
	CHECK_EQ(sf_wckpt_declare(w, "b", SF_DT_U8, 1, flat), 0);
	CHECK_EQ(sf_wckpt_add_file(w, "config.json"), 0);
	/* an undeclared tensor cannot be written */
	CHECK_EQ(sf_wfile_open(w, "nope", NULL, &f), -ENOENT);

	/* box: bottom half through a box handle, written in 3 pieces */
	CHECK_EQ(sf_wfile_open(w, "layers/0/w", &half, &f), 0);
	CHECK_EQ(sf_wfile_write(f, (char *)&a[2400], 1000, 0), 0);
	CHECK_EQ(sf_wfile_write(f, (char *)&a[2400] + 1000, 5000, 1000), 0);
	CHECK_EQ(sf_wfile_write(f, (char *)&a[2400], 16, 0), -EINVAL); /* not sequential */
	CHECK_EQ(sf_wfile_write(f, (char *)&a[2400] + 6000, 3600, 6000), 0);
	CHECK_EQ(sf_wfile_write(f, "x", 1, 9600), -SF_ERANGE); /* past the box */
	CHECK_EQ(sf_wfile_close(f), 0);
	/* top half as a flat range of the flattened tensor */
	CHECK_EQ(sf_wfile_open(w, "layers/0/w", NULL, &f), 0);
	CHECK_EQ(sf_wfile_write(f, a, 9600, 0), 0);
	CHECK_EQ(sf_wfile_close(f), 0);
	/* flat: three runs, out of order, one handle */
	CHECK_EQ(sf_wfile_open(w, "b", NULL, &f), 0);
	CHECK_EQ(sf_wfile_write(f, b + 10000, 5000, 10000), 0);
	CHECK_EQ(sf_wfile_write(f, b + 15000, 5000, 15000), 0); /* coalesced */
	CHECK_EQ(sf_wfile_write(f, b, 10000, 0), 0);
	CHECK_EQ(sf_wfile_write(f, b, 1, 20000), -SF_ERANGE);
	CHECK_EQ(sf_wfile_close(f), 0);
	CHECK_EQ(sf_wfile_open(w, "config.json", NULL, &f), 0);
	CHECK_EQ(sf_wfile_write(f, cfg, sizeof(cfg) - 1, 0), 0);
	CHECK_EQ(sf_wfile_close(f), 0);

	struct sf_wentry_info info;
	CHECK_EQ(sf_wckpt_info(w, "b", &info), 0);
	CHECK_EQ(info.nshards, 2); /* the two contiguous runs coalesced */
	CHECK_EQ(sf_wckpt_info(w, "config.json", &info), 0);
	CHECK(info.is_file && info.nbytes == sizeof(cfg) - 1);

	/* A published checkpoint can still back out (another rank failed):
	 * unpublish removes manifest.json and the journal resumes it all. */
	{
		struct sf_wckpt *w2 = NULL;
		char *part = NULL, m[600], j[600];
		size_t plen = 0;

		CHECK_EQ(sf_wckpt_export_part(w, &part, &plen), 0);
		CHECK_EQ(sf_wckpt_publish(w, part, plen), 0);
		snprintf(m, sizeof(m), "%s/manifest.json", dir);
		snprintf(j, sizeof(j), "%s/rank-00000/journal.jsonl", dir);
		CHECK(access(m, F_OK) == 0 && access(j, F_OK) == 0);
		CHECK_EQ(sf_wckpt_unpublish(w), 0);
		CHECK(access(m, F_OK) != 0);
		CHECK_EQ(sf_wckpt_open(dir, "single", 0, 1, BS, &w2, &resumed), 0);
		CHECK_EQ(resumed, 5); /* w: box + flat; b: 2 runs; config.json */
		sf_wckpt_close(w2);
		free(part);
	}
	CHECK_EQ(commit(&w, 1, err, sizeof(err)), 0);
	sf_wckpt_close(w);
	CHECK(read_back(dir, "layers/0/w", false, a, sizeof(a)));
	CHECK(read_back(dir, "b", false, b, sizeof(b)));
	CHECK(read_back(dir, "config.json", true, cfg, sizeof(cfg) - 1));
	CHECK(access(dir, F_OK) == 0);
	char j[600];
	snprintf(j, sizeof(j), "%s/rank-00000/journal.jsonl", dir);
	CHECK(access(j, F_OK) != 0); /* the journal is gone once committed */
}

/* Commit failures: a gap, and overlapping flat shards that differ. */
static void test_failures(const char *root)
{
	char dir[512], err[512] = "";
	struct sf_wckpt *w = NULL;
	struct sf_wfile *f;
	uint64_t shape[1] = { 1000 };
	unsigned char x[1000];

	sf_rand_fill(x, sizeof(x));
	snprintf(dir, sizeof(dir), "%s/gap", root);
	CHECK_EQ(sf_wckpt_open(dir, "gap", 0, 1, BS, &w, NULL), 0);
	CHECK_EQ(sf_wckpt_declare(w, "t", SF_DT_I8, 1, shape), 0);
	CHECK_EQ(sf_wfile_open(w, "t", NULL, &f), 0);
	CHECK_EQ(sf_wfile_write(f, x, 400, 0), 0);
	CHECK_EQ(sf_wfile_write(f, x + 500, 500, 500), 0);
	CHECK_EQ(sf_wfile_close(f), 0);
	CHECK_EQ(commit(&w, 1, err, sizeof(err)), -SF_EGAP);
	CHECK(strstr(err, "400") != NULL); /* names the first missing element */
	snprintf(dir, sizeof(dir), "%s/gap/manifest.json", root);
	CHECK(access(dir, F_OK) != 0);     /* nothing published */
	/* fill the gap with bytes that disagree where they overlap */
	CHECK_EQ(sf_wfile_open(w, "t", NULL, &f), 0);
	x[550] ^= 1;
	CHECK_EQ(sf_wfile_write(f, x + 300, 300, 300), 0);
	CHECK_EQ(sf_wfile_close(f), 0);
	CHECK_EQ(commit(&w, 1, err, sizeof(err)), -SF_ECONFLICT);
	CHECK(strstr(err, "differ") != NULL);
	/* a scalar may be declared without a shape array (UBSan watches) */
	CHECK_EQ(sf_wckpt_declare(w, "s", SF_DT_F32, 0, NULL), 0);
	CHECK_EQ(sf_wckpt_declare(w, "s", SF_DT_F32, 0, NULL), 0);
	CHECK_EQ(sf_wckpt_declare(w, "s", SF_DT_F32, 1, shape), -SF_ECONFLICT);
	sf_wckpt_close(w);
}

/* Kill mid-checkpoint: reopen keeps intact shards, drops a damaged one. */
static void test_resume(const char *root)
{
	char dir[512], path[600], err[512];
	struct sf_wckpt *w = NULL;
	struct sf_wfile *f;
	uint64_t shape[1] = { 3 * BS };
	unsigned char x[3 * BS];
	size_t resumed = 0;
	int fd;

	sf_rand_fill(x, sizeof(x));
	snprintf(dir, sizeof(dir), "%s/resume", root);
	CHECK_EQ(sf_wckpt_open(dir, "resume", 0, 1, BS, &w, NULL), 0);
	CHECK_EQ(sf_wckpt_declare(w, "t", SF_DT_U8, 1, shape), 0);
	for (int i = 0; i < 3; i++) {
		CHECK_EQ(sf_wfile_open(w, "t", NULL, &f), 0);
		CHECK_EQ(sf_wfile_write(f, x + i * BS, BS, (uint64_t)i * BS), 0);
		CHECK_EQ(sf_wfile_close(f), 0);
	}
	sf_wckpt_close(w); /* "crash": no commit */
	/* one handle after another: the three shards share one payload file */
	snprintf(path, sizeof(path), "%s/rank-00000/data-1.bin", dir);
	CHECK(access(path, F_OK) != 0);
	/* damage the second shard (bytes BS..2BS of data-0.bin) */
	snprintf(path, sizeof(path), "%s/rank-00000/data-0.bin", dir);
	fd = open(path, O_WRONLY);
	CHECK(fd >= 0);
	{
		unsigned char b = (unsigned char)(x[BS + 7] ^ 0xff);

		CHECK(pwrite(fd, &b, 1, BS + 7) == 1);
	}
	close(fd);
	/* and tear the journal's last line as a crash mid-append would */
	snprintf(path, sizeof(path), "%s/rank-00000/journal.jsonl", dir);
	fd = open(path, O_WRONLY | O_APPEND);
	CHECK(fd >= 0);
	CHECK(write(fd, "{\"op\":\"shard\",\"na", 17) == 17);
	close(fd);
	CHECK_EQ(sf_wckpt_open(dir, "resume", 0, 1, BS, &w, &resumed), 0);
	CHECK_EQ(resumed, 2);
	/* the dropped range is a gap until rewritten; new payloads must not
	 * clobber old ones */
	CHECK_EQ(commit(&w, 1, err, sizeof(err)), -SF_EGAP);
	CHECK_EQ(sf_wfile_open(w, "t", NULL, &f), 0);
	CHECK_EQ(sf_wfile_write(f, x + BS, BS, BS), 0);
	CHECK_EQ(sf_wfile_close(f), 0);
	CHECK_EQ(commit(&w, 1, err, sizeof(err)), 0);
	sf_wckpt_close(w);
	CHECK(read_back(dir, "t", false, x, sizeof(x)));
}

/* Two ranks in one directory: halves of a box plus a replicated norm. */
static void test_two_ranks(const char *root)
{
	char dir[512], err[512] = "";
	struct sf_wckpt *w[2] = { NULL, NULL };
	struct sf_wfile *f;
	uint64_t shape[2] = { 16, 64 }, nshape[1] = { 64 };
	uint16_t a[16 * 64], norm[64];

	for (int i = 0; i < 16 * 64; i++)
		a[i] = (uint16_t)(i * 7);
	for (int i = 0; i < 64; i++)
		norm[i] = (uint16_t)(1000 + i);
	snprintf(dir, sizeof(dir), "%s/two", root);
	for (int r = 0; r < 2; r++) {
		struct sf_box cols = { .ndim = 2, .off = { 0, 32 * (uint64_t)r }, .len = { 16, 32 } };
		uint16_t blk[16 * 32];
		for (int i = 0; i < 16; i++)
			memcpy(&blk[i * 32], &a[i * 64 + 32 * r], 64);
		CHECK_EQ(sf_wckpt_open(dir, "two", (uint32_t)r, 2, BS, &w[r], NULL), 0);
		CHECK_EQ(sf_wckpt_declare(w[r], "wo", SF_DT_BF16, 2, shape), 0);
		CHECK_EQ(sf_wckpt_declare(w[r], "norm", SF_DT_BF16, 1, nshape), 0);
		CHECK_EQ(sf_wfile_open(w[r], "wo", &cols, &f), 0);
		CHECK_EQ(sf_wfile_write(f, blk, sizeof(blk), 0), 0);
		CHECK_EQ(sf_wfile_close(f), 0);
		CHECK_EQ(sf_wfile_open(w[r], "norm", NULL, &f), 0);
		CHECK_EQ(sf_wfile_write(f, norm, sizeof(norm), 0), 0);
		CHECK_EQ(sf_wfile_close(f), 0);
	}
	CHECK_EQ(commit(w, 2, err, sizeof(err)), 0);
	if (err[0])
		fprintf(stderr, "merge: %s\n", err);
	CHECK(read_back(dir, "wo", false, a, sizeof(a)));
	CHECK(read_back(dir, "norm", false, norm, sizeof(norm)));
	sf_wckpt_close(w[0]);
	sf_wckpt_close(w[1]);

	/* declarations that disagree across ranks */
	snprintf(dir, sizeof(dir), "%s/two-bad", root);
	CHECK_EQ(sf_wckpt_open(dir, "two-bad", 0, 2, BS, &w[0], NULL), 0);
	CHECK_EQ(sf_wckpt_open(dir, "two-bad", 1, 2, BS, &w[1], NULL), 0);
	CHECK_EQ(sf_wckpt_declare(w[0], "norm", SF_DT_BF16, 1, nshape), 0);
	CHECK_EQ(sf_wckpt_declare(w[1], "norm", SF_DT_F16, 1, nshape), 0);
	CHECK_EQ(commit(w, 2, err, sizeof(err)), -SF_ECONFLICT);
	CHECK(strstr(err, "norm") != NULL);
	sf_wckpt_close(w[0]);
	sf_wckpt_close(w[1]);
}

int main(void)
{
	char *root = mkdtemp(tmpl);

	sf_test_seed("test_wckpt", 7);
	sf_log_setup("test_wckpt: ", SF_LOG_ERROR);
	if (!root)
		sf_test_skip("test_wckpt", "mkdtemp failed");
	test_single(root);
	test_failures(root);
	test_resume(root);
	test_two_ranks(root);
	rm_rf(root);
	return sf_test_done("test_wckpt");
}
