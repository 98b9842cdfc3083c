/*
 * fuzz_paddle.c - libFuzzer target for the PaddlePaddle adapter
 * (core/formats/sf_paddle.c): its metadata and .distcp decoding, and
 * through them the restricted pickle reader on the paths paddle's files
 * take.
 *
 * Input: parts, each a 4-byte little-endian length then that many bytes
 * (at most 32; a length past the end takes what is left). Part 0 becomes
 * 0.metadata, part i >= 1 becomes (i-1)_0.distcp, in a directory (under
 * /dev/shm, else $TMPDIR, else /tmp, made once per process) that the
 * adapter then opens; before each input the directory holds exactly the
 * files of its parts: a part's file is rewritten in place (O_TRUNC), the
 * files of the previous input's extra parts are removed. Seeds: the
 * committed fixtures paddle 3.3.1 wrote (paddle_seeds.py), and
 * hostile-escaped-string: shard2 with an array's data an escaped
 * protocol-0 STRING (test/mount/paddle_hostile.py's escaped/), which the
 * adapter must leave out rather than serve its text (issue 30; the pickle
 * reader gives such a value no span, fuzz_pickle checks); hostile-wide:
 * shard2 with one tensor stored one element per .distcp (27 parts,
 * paddle_hostile.py's wide/), past the 16 files the adapter's registry
 * (sf_fileset, through the kit) first holds.
 *
 * For any input, open either fails with a domain error or -ENOMEM (with a
 * one-line message but for -ENOMEM) and no model, or gives a finished
 * model of format paddle-dcp in which every shard names one of the files
 * written and lies inside it (its payload span from file_offset), and
 * every tensor's bytes are covered by shards that do not overlap; every
 * replica kept aside (sf_overlap_rule) has the box of the copy served and
 * lies inside a file written (seeds with replicas and overlaps:
 * overlap_seeds.py). The first and last payload bytes of
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

#include "fuzz_adapter.h"
#include "fuzz_util.h"
#include "sf_error.h"
#include "sf_paddle.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

const char fuzz_target[] = "fuzz_paddle";

#define MAX_PARTS 32

static char dir[512];
static char names[MAX_PARTS][32];
static int dfd = -1;             /* dir, open for the process's life */
static int nwritten;             /* parts 0..nwritten-1 are in dir */

static void cleanup(void)
{
	for (int i = 0; i < MAX_PARTS; i++)
		unlinkat(dfd, names[i], 0);
	close(dfd);
	rmdir(dir);
}

static void setup(void)
{
	dfd = fuzz_scratch_dir(dir, sizeof(dir));
	snprintf(names[0], sizeof(names[0]), "0.metadata");
	for (int i = 1; i < MAX_PARTS; i++)
		snprintf(names[i], sizeof(names[i]), "%d_0.distcp", i - 1);
	atexit(cleanup);
}

/* Part i's file, written (in place when it is there), kept open for the
 * checks: its descriptor. */
static int write_part(int i, const uint8_t *p, size_t n)
{
	int fd = openat(dfd, names[i], O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);

	if (fd < 0 || (n && write(fd, p, n) != (ssize_t)n))
		fuzz_die("cannot write a part", names[i]);
	return fd;
}

/* The parts written for this input: fds[i] is names[i], open (n of them). */
struct parts {
	const int *fds;
	int n;
};

/* fuzz_fd_of_fn: the part a shard names. */
static int fd_of(void *ctx, const char *file)
{
	const struct parts *pt = ctx;
	int k = 0;

	while (k < MAX_PARTS && strcmp(file, names[k]) != 0)
		k++;
	if (k == MAX_PARTS)
		fuzz_die("a shard names a file not written", file);
	if (k >= pt->n)
		fuzz_die("a shard's file is missing", file);
	return pt->fds[k];
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	int fds[MAX_PARTS];
	size_t at = 0;
	int nparts = 0;

	if (!dir[0])
		setup();
	while (nparts < MAX_PARTS && size - at >= 4) {
		size_t n = (size_t)fuzz_le(data + at, 4);

		at += 4;
		if (n > size - at)
			n = size - at;
		fds[nparts] = write_part(nparts, data + at, n);
		nparts++;
		at += n;
	}
	/* the previous input's parts past these are not this input's */
	for (int i = nparts; i < nwritten; i++)
		if (unlinkat(dfd, names[i], 0) != 0)
			fuzz_die("cannot remove a part", names[i]);
	nwritten = nparts;
	{
		struct parts pt = { fds, nparts };

		fuzz_adapter_run(&sf_format_paddle, dfd, dir, SF_PADDLE_FORMAT, NULL, fd_of, &pt,
				 "paddle");
	}
	for (int i = 0; i < nparts; i++)
		close(fds[i]);
	return 0;
}
