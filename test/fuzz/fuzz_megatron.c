/*
 * fuzz_megatron.c - libFuzzer target for the Megatron-Core adapter
 * (core/formats/sf_megatron.h): its metadata.json decoder, its flat-range
 * to box cutter, and a whole open whose .metadata is the input.
 *
 * Input: byte 0 picks what the rest is (byte 0 % 4 == 3: case 3, else % 3):
 *   0  metadata.json text: sf_mcore_config_parse either gives a backend of
 *      1..31 bytes of [A-Za-z0-9_.-] and a version in 0..2^31-1, or fails
 *      with -SF_EFORMAT / -SF_ETOOBIG (a one-line message) or -ENOMEM;
 *   1  a block and a flat range, each number one byte: n (1..6), the n
 *      sides (1..8), origin multipliers, start, len: sf_mcore_flat_boxes
 *      either refuses (-SF_ERANGE) a range that is empty or leaves the
 *      block, or gives at most 2n - 1 boxes inside the block whose
 *      row-major walks visit exactly the range's elements in order;
 *   2  a .metadata pickle, written into a directory that holds the
 *      committed megatron-core 0.15.3 `distopt` fixture's other files
 *      (its .distcp chunks, metadata.json, common.pt; copied once per
 *      process from SHARDFS_MCORE_FIXTURE, their sizes kept, the directory
 *      kept open; each input rewrites .metadata in place): the Megatron
 *      adapter's open either fails with a negative code and a one-line
 *      message (none for -ENOMEM), or gives a finished model named
 *      megatron-torch_dist whose every shard lies inside its file;
 *   3  the same against the committed megatron-core 0.17.1
 *      `gpt_tp2dp2_singleton` fixture's files (SHARDFS_MCORE017_FIXTURE):
 *      its dp_reshardable buckets renamed under optimizer/ and its
 *      singleton_local_shards pairs joined (sf_megatron.c's 0.17 names).
 * Any violation aborts.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fuzz_util.h"
#include "sf_error.h"
#include "sf_format.h"
#include "sf_io.h"
#include "sf_log.h"
#include "sf_megatron.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

const char fuzz_target[] = "fuzz_megatron";

#if !defined(SHARDFS_MCORE_FIXTURE) || !defined(SHARDFS_MCORE017_FIXTURE)
#error "SHARDFS_MCORE_FIXTURE, SHARDFS_MCORE017_FIXTURE: the fixture directories"
#endif

/* --- 0: metadata.json --- */

static void one_config(const uint8_t *data, size_t size)
{
	struct sf_mcore_config c;
	bool foreign;
	char err[256];
	int rc;

	fuzz_poison(err, sizeof(err));
	rc = sf_mcore_config_parse((const char *)data, size, &c, &foreign, err,
				   sizeof(err));
	if (rc == -ENOMEM)
		return;
	if (rc) {
		if (rc != -SF_EFORMAT && rc != -SF_ETOOBIG)
			fuzz_die("undocumented error", sf_strerror(rc));
		fuzz_check_message(err, sizeof(err));
		return;
	}
	size_t n = strnlen(c.backend, sizeof(c.backend));
	if (n == 0 || n >= sizeof(c.backend) ||
	    strspn(c.backend, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
		   "0123456789_.-") != n)
		fuzz_die("bad backend accepted", NULL);
	if (c.version < 0 || c.version > INT32_MAX)
		fuzz_die("bad version accepted", NULL);
}

/* --- 1: flat ranges as boxes --- */

static void one_boxes(const uint8_t *data, size_t size)
{
	struct sf_box out[SF_MCORE_MAX_BOXES(SF_MAX_NDIM)];
	uint64_t org[SF_MAX_NDIM], blk[SF_MAX_NDIM], total = 1, f, start, len;
	unsigned n;
	size_t nb;
	int rc;

	if (size < 1)
		return;
	n = data[0] % 6 + 1;
	if (size < 1 + 2 * (size_t)n + 2)
		return;
	for (unsigned i = 0; i < n; i++) {
		blk[i] = data[1 + i] % 8 + 1;
		org[i] = (uint64_t)data[1 + n + i] * blk[i];
		total *= blk[i];
	}
	start = data[1 + 2 * n] * 2u;
	len = data[2 + 2 * n] * 2u;
	rc = sf_mcore_flat_boxes(n, org, blk, start, len, out, &nb);
	if (len == 0 || start + len > total) {
		if (rc != -SF_ERANGE)
			fuzz_die("a bad range was not refused", NULL);
		return;
	}
	if (rc || nb < 1 || nb > SF_MCORE_MAX_BOXES(n))
		fuzz_die("a good range was refused or cut in too many boxes", NULL);
	f = start;
	for (size_t k = 0; k < nb; k++) {
		uint64_t idx[SF_MAX_NDIM] = { 0 }, numel = 1;

		for (unsigned i = 0; i < n; i++) {
			if (out[k].len[i] == 0 || out[k].off[i] < org[i] ||
			    out[k].off[i] + out[k].len[i] > org[i] + blk[i])
				fuzz_die("a box leaves the block", NULL);
			numel *= out[k].len[i];
		}
		for (uint64_t e = 0; e < numel; e++, f++) {
			uint64_t g = f;

			for (unsigned i = n; i-- > 0;) {
				if (out[k].off[i] + idx[i] != org[i] + g % blk[i])
					fuzz_die("boxes do not walk the range in order", NULL);
				g /= blk[i];
			}
			for (unsigned i = n; i-- > 0;) {
				if (++idx[i] < out[k].len[i])
					break;
				idx[i] = 0;
			}
		}
	}
	if (f != start + len)
		fuzz_die("boxes do not cover the range", NULL);
}

/* --- 2: a whole open --- */

/* A scratch directory per fixture: the fixture files copied into dir and
 * their sizes: they never change (the adapter only reads), so a shard's
 * file is looked up here instead of stat'ed for every shard of every
 * open. .metadata is the input. */
#define MAX_FIXTURE_FILES 64
struct scratch {
	const char *src;         /* the fixture directory */
	char dir[256];
	int dfd;                 /* dir, open for the process's life */
	struct {
		char name[256];
		uint64_t size;
	} fixture[MAX_FIXTURE_FILES];
	size_t nfixture;
};
static struct scratch scr[2] = {
	{ .src = SHARDFS_MCORE_FIXTURE, .dfd = -1 },
	{ .src = SHARDFS_MCORE017_FIXTURE, .dfd = -1 },
};
static struct scratch *cur = &scr[0]; /* the one this input opens in */

static void cleanup_one(struct scratch *sc)
{
	DIR *d = opendir(sc->dir);
	struct dirent *de;

	if (!d)
		return;
	while ((de = readdir(d)))
		if (de->d_name[0] != '.' || strcmp(de->d_name, ".metadata") == 0)
			unlinkat(dirfd(d), de->d_name, 0);
	closedir(d);
	close(sc->dfd);
	rmdir(sc->dir);
}

static void cleanup(void)
{
	for (size_t i = 0; i < sizeof(scr) / sizeof(scr[0]); i++)
		if (scr[i].dir[0])
			cleanup_one(&scr[i]);
}

/* Copy cur's fixture's files but .metadata into a fresh directory, once. */
static void setup(void)
{
	const char *tmp = getenv("TMPDIR");
	DIR *d;
	struct dirent *de;

	if (cur->dir[0])
		return;
	sf_log_setup("", SF_LOG_ERROR);
	snprintf(cur->dir, sizeof(cur->dir), "%s/fuzz-megatron-XXXXXX",
		 access("/dev/shm", W_OK) == 0 ? "/dev/shm" : tmp ? tmp : "/tmp");
	if (!mkdtemp(cur->dir))
		fuzz_die("mkdtemp", cur->dir);
	if (!scr[0].dir[0] || !scr[1].dir[0])
		atexit(cleanup); /* the first set up (this one's dir is made) */
	d = opendir(cur->src);
	if (!d)
		fuzz_die("no fixture directory", cur->src);
	while ((de = readdir(d))) {
		char src[1024], dst[512], *buf;
		size_t len;
		FILE *f;

		if (de->d_name[0] == '.')
			continue;
		if (cur->nfixture == MAX_FIXTURE_FILES ||
		    strlen(de->d_name) >= sizeof(cur->fixture[0].name))
			fuzz_die("too many fixture files, or a long name", de->d_name);
		snprintf(src, sizeof(src), "%s/%s", cur->src, de->d_name);
		snprintf(dst, sizeof(dst), "%s/%s", cur->dir, de->d_name);
		if (sf_read_file(src, 1u << 24, &buf, &len) != 0)
			fuzz_die("cannot read the fixture", src);
		f = fopen(dst, "wb");
		if (!f || fwrite(buf, 1, len, f) != len || fclose(f) != 0)
			fuzz_die("cannot copy the fixture", dst);
		free(buf);
		strcpy(cur->fixture[cur->nfixture].name, de->d_name);
		cur->fixture[cur->nfixture++].size = len;
	}
	closedir(d);
	cur->dfd = open(cur->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (cur->dfd < 0)
		fuzz_die("cannot open the directory", cur->dir);
}

/* The size of cur->dir's file `name` (mdsize for .metadata): from the table
 * for a fixture file, else stat'ed (and a shard's file that is not there
 * aborts). */
static uint64_t file_size(const char *name, uint64_t mdsize)
{
	struct stat sb;

	if (strcmp(name, ".metadata") == 0)
		return mdsize;
	for (size_t i = 0; i < cur->nfixture; i++)
		if (strcmp(name, cur->fixture[i].name) == 0)
			return cur->fixture[i].size;
	if (fstatat(cur->dfd, name, &sb, AT_SYMLINK_NOFOLLOW) != 0)
		fuzz_die("a shard's file is not there", name);
	return (uint64_t)sb.st_size;
}

static void check_shards(const struct sf_tensor *arr, size_t n, uint64_t mdsize)
{
	for (size_t i = 0; i < n; i++) {
		for (size_t k = 0; k < arr[i].nshards; k++) {
			const struct sf_shard *s = &arr[i].shards[k];
			uint64_t size = file_size(s->file, mdsize);

			if (s->file_offset > size || s->nbytes > size - s->file_offset)
				fuzz_die("a shard lies past its file's end", arr[i].name);
		}
	}
}

static void one_open(const uint8_t *data, size_t size)
{
	struct sf_format_result res = { 0 };
	char err[512];
	int fd, rc;

	setup();
	fd = openat(cur->dfd, ".metadata", O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0 || (size && write(fd, data, size) != (ssize_t)size) || close(fd) != 0)
		fuzz_die("cannot write .metadata", cur->dir);
	fuzz_poison(err, sizeof(err));
	{
		struct sf_cdir cd = { .dirfd = cur->dfd, .dir = cur->dir, .name = "fz",
				      .ref = { .dir = cur->dir, .name = "fz" } };

		rc = sf_format_megatron.open(&cd, &res, err, sizeof(err));
	}
	if (rc) {
		if (rc > 0)
			fuzz_die("positive error", NULL);
		if (res.model || res.meta)
			fuzz_die("a failed open returned a model", err);
		if (rc != -ENOMEM)
			fuzz_check_message(err, sizeof(err));
		return;
	}
	if (!res.model || res.meta)
		fuzz_die("open gave no model, or a dump (the seam's)", NULL);
	rc = sf_format_result_dump(&res); /* over SF_MAX_MANIFEST_BYTES: refused */
	if (rc ? rc != -SF_ETOOBIG : !res.meta)
		fuzz_die("the model does not dump", sf_strerror(rc));
	if (strncmp(res.model->format, SF_MCORE_FORMAT " ", sizeof(SF_MCORE_FORMAT)) != 0)
		fuzz_die("format not named", res.model->format);
	check_shards(res.model->tensors, res.model->ntensors, size);
	check_shards(res.model->objects, res.model->nobjects, size);
	check_shards(res.model->files, res.model->nfiles, size);
	sf_format_result_clear(&res);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1)
		return 0;
	switch (data[0] % 4 == 3 ? 2 : data[0] % 3) {
	case 0:
		one_config(data + 1, size - 1);
		break;
	case 1:
		one_boxes(data + 1, size - 1);
		break;
	default:
		/* byte 0 % 4: 2, the 0.15.3 distopt files; 3, 0.17.1's
		 * gpt_tp2dp2_singleton files */
		cur = &scr[data[0] % 4 == 3];
		one_open(data + 1, size - 1);
		break;
	}
	return 0;
}
