/*
 * fuzz_dtensor.c - libFuzzer target for the per-rank DTensor pickle adapter
 * (core/formats/sf_dtensor.c): its reading of every rank's DTensors (mesh,
 * coordinate, placements, the boxes torch's chunking gives) and FSDP1
 * ShardedTensors (local shards at their metadata's offsets), and through it
 * the torch.save archive reader (sf_torchsave.c's sf_ts_doc), the zip
 * reader and the restricted pickle reader on the paths these files take.
 *
 * Input: parts, each a 4-byte little-endian length then that many bytes
 * (at most 8; a length past the end takes what is left). With N parts,
 * part R becomes model_world_size_N_rank_R.pt in a directory (under
 * /dev/shm, else $TMPDIR, else /tmp, made once per process) that the
 * adapter then opens; before each input the directory holds exactly the
 * files of its parts. Seeds: the committed fixtures torch 2.15 wrote
 * (dtensor_seeds.py).
 *
 * For any input, open either fails with a domain error or -ENOMEM (with a
 * one-line message but for -ENOMEM) and no model, or gives a finished
 * model of format "torch-dtensor" in which every shard names one of the
 * files written and lies inside it, every tensor's bytes are covered by
 * shards that do not overlap, and every replica has its kept copy's box.
 * The first and last payload bytes of each shard are read back. Any
 * violation aborts.
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
#include "sf_dtensor.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

const char fuzz_target[] = "fuzz_dtensor";

#define MAX_PARTS 8

static char dir[512];
static char names[MAX_PARTS][64]; /* this input's (or the last one's) */
static int dfd = -1;              /* dir, open for the process's life */
static int nwritten;              /* names[0..nwritten) are in dir */

static void cleanup(void)
{
	for (int i = 0; i < nwritten; i++)
		unlinkat(dfd, names[i], 0);
	close(dfd);
	rmdir(dir);
}

static void setup(void)
{
	dfd = fuzz_scratch_dir(dir, sizeof(dir));
	atexit(cleanup);
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

	while (k < pt->n && strcmp(file, names[k]) != 0)
		k++;
	if (k == pt->n)
		fuzz_die("a shard names a file not written", file);
	return pt->fds[k];
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	int fds[MAX_PARTS];
	size_t lens[MAX_PARTS], offs[MAX_PARTS], at = 0;
	int nparts = 0;

	if (!dir[0])
		setup();
	while (nparts < MAX_PARTS && size - at >= 4) {
		size_t n = (size_t)fuzz_le(data + at, 4);

		at += 4;
		if (n > size - at)
			n = size - at;
		offs[nparts] = at;
		lens[nparts++] = n;
		at += n;
	}
	/* the previous input's files go: their names carry its world size */
	for (int i = 0; i < nwritten; i++)
		if (unlinkat(dfd, names[i], 0) != 0)
			fuzz_die("cannot remove a part", names[i]);
	for (int i = 0; i < nparts; i++) {
		snprintf(names[i], sizeof(names[i]), "model_world_size_%d_rank_%d.pt",
			 nparts, i);
		fds[i] = openat(dfd, names[i], O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
		if (fds[i] < 0 || (lens[i] && write(fds[i], data + offs[i], lens[i]) !=
						(ssize_t)lens[i]))
			fuzz_die("cannot write a part", names[i]);
	}
	nwritten = nparts;
	{
		struct parts pt = { fds, nparts };

		fuzz_adapter_run(&sf_format_dtensor, dfd, dir, SF_DTENSOR_FORMAT, NULL, fd_of, &pt,
				 "dtensor");
	}
	for (int i = 0; i < nparts; i++)
		close(fds[i]);
	return 0;
}
