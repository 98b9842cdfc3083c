/*
 * fuzz_paddlenlp.c - libFuzzer target for the PaddleNLP unified checkpoint
 * adapter (core/formats/sf_paddlenlp.c): its three indexes, config.json's
 * dtype and the safetensors headers of the files the indexes name.
 *
 * Input: parts, each a 4-byte little-endian length then that many bytes
 * (at most 8; a length past the end takes what is left), written as
 * model.safetensors.index.json, optimizer.safetensors.index.json,
 * master_weights.safetensors.index.json, config.json,
 * model-00001-of-00001.safetensors, optimizer-00001-of-00001.safetensors,
 * master_weights-00001-of-00001.safetensors and
 * model-00002-of-00002.safetensors, in a directory (under /dev/shm, else
 * $TMPDIR, else /tmp, made once per process) that the adapter then opens;
 * before each input the directory holds exactly the files of its parts.
 * An index may name any of them (config.json too) or files not there.
 * Seeds: the committed unified checkpoints paddlenlp 2.8.1 wrote
 * (paddlenlp_seeds.py).
 *
 * For any input, open either fails with a domain error or -ENOMEM (with a
 * one-line message but for -ENOMEM) and no model, or gives a finished
 * model of format paddlenlp-unified in which every shard names one of the
 * files written and lies inside it, and every tensor's bytes are covered
 * by shards that do not overlap (fuzz_adapter_check_model: the first and
 * last payload bytes of each shard are read back). Any violation aborts.
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
#include "sf_paddlenlp.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

const char fuzz_target[] = "fuzz_paddlenlp";

#define MAX_PARTS 8

static char dir[512];
static char names[MAX_PARTS][48];
static int dfd = -1;             /* dir, open for the process's life */
static int nwritten;             /* parts 0..nwritten-1 are in dir */

static void cleanup(void)
{
	for (int i = 0; i < MAX_PARTS; i++)
		unlinkat(dfd, names[i], 0);
	close(dfd);
	rmdir(dir);
}

static const char *const part_names[MAX_PARTS] = {
	"model.safetensors.index.json", "optimizer.safetensors.index.json",
	"master_weights.safetensors.index.json", "config.json",
	"model-00001-of-00001.safetensors", "optimizer-00001-of-00001.safetensors",
	"master_weights-00001-of-00001.safetensors",
	"model-00002-of-00002.safetensors",
};

static void setup(void)
{
	dfd = fuzz_scratch_dir(dir, sizeof(dir));
	for (int i = 0; i < MAX_PARTS; i++)
		snprintf(names[i], sizeof(names[i]), "%s", part_names[i]);
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

		fuzz_adapter_run(&sf_format_paddlenlp, dfd, dir, SF_PADDLENLP_FORMAT, NULL, fd_of,
				 &pt, "paddlenlp");
	}
	for (int i = 0; i < nparts; i++)
		close(fds[i]);
	return 0;
}
