/*
 * fuzz_paddle.c - libFuzzer target for the PaddlePaddle adapter
 * (core/formats/sf_paddle.c): its metadata and .distcp decoding, and
 * through them the restricted pickle reader on the paths paddle's files
 * take.
 *
 * Input: parts, each a 4-byte little-endian length then that many bytes
 * (at most 5; a length past the end takes what is left). Part 0 becomes
 * 0.metadata, part i >= 1 becomes (i-1)_0.distcp, in a fresh directory
 * (under /dev/shm, else $TMPDIR, else /tmp) that the adapter then opens.
 * Seeds: the committed fixtures paddle 3.3.1 wrote (paddle_seeds.py).
 *
 * For any input, open either fails with a domain error or -ENOMEM (with a
 * one-line message but for -ENOMEM) and no model, or gives a finished
 * model of format paddle-dcp in which every shard names one of the files
 * written and lies inside it (its payload span from file_offset), and
 * every tensor's bytes are covered. The first and last payload bytes of
 * each shard are read back. Any violation aborts.
 */
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
#include "sf_paddle.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

const char fuzz_target[] = "fuzz_paddle";

#define MAX_PARTS 5

static char dir[512];
static char names[MAX_PARTS][32];

static void cleanup(void)
{
	char p[700];

	for (int i = 0; i < MAX_PARTS; i++) {
		snprintf(p, sizeof(p), "%s/%s", dir, names[i]);
		unlink(p);
	}
	rmdir(dir);
}

static void setup(void)
{
	const char *bases[] = { "/dev/shm", getenv("TMPDIR"), "/tmp" };

	for (size_t i = 0; i < 3; i++) {
		if (!bases[i])
			continue;
		snprintf(dir, sizeof(dir), "%s/fuzz_paddle.XXXXXX", bases[i]);
		if (mkdtemp(dir))
			break;
		dir[0] = '\0';
	}
	if (!dir[0])
		fuzz_die("no temporary directory", NULL);
	snprintf(names[0], sizeof(names[0]), "0.metadata");
	for (int i = 1; i < MAX_PARTS; i++)
		snprintf(names[i], sizeof(names[i]), "%d_0.distcp", i - 1);
	atexit(cleanup);
}

static void write_part(int dfd, int i, const uint8_t *p, size_t n)
{
	int fd = openat(dfd, names[i], O_WRONLY | O_CREAT | O_TRUNC, 0644);

	if (fd < 0 || (n && write(fd, p, n) != (ssize_t)n))
		fuzz_die("cannot write a part", names[i]);
	close(fd);
}

static void check_shard(int dfd, const struct sf_tensor *t, const struct sf_shard *s)
{
	struct stat sb;
	unsigned char b;
	int known = 0, fd;

	for (int i = 0; i < MAX_PARTS; i++)
		known |= strcmp(s->file, names[i]) == 0;
	if (!known)
		fuzz_die("a shard names a file not written", s->file);
	if (fstatat(dfd, s->file, &sb, 0) != 0)
		fuzz_die("a shard's file is missing", s->file);
	if (s->file_offset > (uint64_t)sb.st_size ||
	    s->nbytes > (uint64_t)sb.st_size - s->file_offset)
		fuzz_die("a shard lies past its file's end", t->name);
	if (s->xxh3)
		fuzz_die("a paddle shard with checksums", t->name);
	if (s->nbytes == 0)
		return;
	fd = openat(dfd, s->file, O_RDONLY);
	if (fd < 0 || pread(fd, &b, 1, (off_t)s->file_offset) != 1 ||
	    pread(fd, &b, 1, (off_t)(s->file_offset + s->nbytes - 1)) != 1)
		fuzz_die("a shard's bytes are unreadable", t->name);
	close(fd);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct sf_format_result res = { 0 };
	char err[256];
	size_t at = 0;
	int nparts = 0, dfd, rc;

	if (!dir[0])
		setup();
	dfd = open(dir, O_RDONLY | O_DIRECTORY);
	if (dfd < 0)
		fuzz_die("cannot open the directory", dir);
	for (int i = 0; i < MAX_PARTS; i++)
		unlinkat(dfd, names[i], 0);
	while (nparts < MAX_PARTS && size - at >= 4) {
		size_t n = (size_t)fuzz_le(data + at, 4);

		at += 4;
		if (n > size - at)
			n = size - at;
		write_part(dfd, nparts++, data + at, n);
		at += n;
	}
	fuzz_poison(err, sizeof(err));
	{
		struct sf_cdir cd = { .dirfd = dfd, .dir = dir, .name = "fz",
				      .ref = { dir, "fz" } };

		rc = sf_format_paddle.open(&cd, &res, err, sizeof(err));
	}
	if (rc) {
		if (res.model || res.meta)
			fuzz_die("result on failure", NULL);
		if (rc != -ENOMEM && rc != -SF_EFORMAT && rc != -SF_EREFUSED &&
		    rc != -SF_ETOOBIG && rc != -SF_ESHORT && rc != -ENOENT &&
		    rc != -SF_EMANIFEST && rc != -SF_EGAP && rc != -SF_ERANGE)
			fuzz_die("unexpected error code", sf_strerror(rc));
		if (rc != -ENOMEM)
			fuzz_check_message(err, sizeof(err));
		close(dfd);
		return 0;
	}
	if (!res.model || !res.meta || strcmp(res.model->format, SF_PADDLE_FORMAT) != 0)
		fuzz_die("success without a paddle model", NULL);
	for (size_t i = 0; i < res.model->ntensors; i++) {
		const struct sf_tensor *t = &res.model->tensors[i];
		char why[256];

		for (size_t j = 0; j < t->nshards; j++)
			check_shard(dfd, t, &t->shards[j]);
		if (sf_tensor_check_coverage(t, why, sizeof(why)) != 0)
			fuzz_die("a tensor not covered", t->name);
	}
	sf_format_result_clear(&res);
	close(dfd);
	return 0;
}
