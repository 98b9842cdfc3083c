/*
 * fuzz_colossal.c - libFuzzer target for the ColossalAI distributed
 * checkpoint IO adapter (core/formats/sf_colossal.c): its probe of the
 * names, its reading of every writer's meta (offsets, lengths,
 * global_shape, file), the parts it cuts from stored tensors (padded ones
 * strided), replicas, and buffers compared between writers; and through it
 * the safetensors header reader and the torch.save archive reader (zip,
 * restricted pickle) on the paths these files take.
 *
 * Input: parts, each a 4-byte little-endian length then that many bytes
 * (at most 12; a length past the end takes what is left). A part's first
 * byte picks its file's name, its second the writer W (0..3), its third a
 * shard number N; the rest is the file's bytes:
 *   0 pytorch_model-meta-dist-W.index.json   1 pytorch_model-meta-dist-W.json
 *   2 model-dist-W-shard-N.safetensors       3 pytorch_model-dist-W-shard-N.bin
 *   4 pytorch_model-dist-W.bin               5 pytorch_model-dist-W.safetensors
 *   6 NAME-N (another file; a meta's "file" may name it)
 * (W and N with 5 digits; a name already written this input is skipped).
 * The files go into a directory (under /dev/shm, else $TMPDIR, else /tmp,
 * made once per process) that the adapter then opens; before each input
 * it holds exactly the files of its parts. Seeds: the committed fixtures
 * the PR's own writer made (colossal_seeds.py).
 *
 * For any input, open either fails with a domain error or -ENOMEM (with a
 * one-line message but for -ENOMEM) and no model, or gives a finished
 * model of format "colossalai-dist" in which every shard names one of the
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
#include "sf_colossal.h"
#include "sf_error.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

const char fuzz_target[] = "fuzz_colossal";

#define MAX_PARTS 12

static char dir[512];
static char names[MAX_PARTS][80]; /* this input's (or the last one's) */
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

static void name_of(char *out, size_t n, unsigned kind, unsigned w, unsigned s)
{
	w %= 4;
	switch (kind % 7) {
	case 0: snprintf(out, n, "pytorch_model-meta-dist-%05u.index.json", w); break;
	case 1: snprintf(out, n, "pytorch_model-meta-dist-%05u.json", w); break;
	case 2: snprintf(out, n, "model-dist-%05u-shard-%05u.safetensors", w, s); break;
	case 3: snprintf(out, n, "pytorch_model-dist-%05u-shard-%05u.bin", w, s); break;
	case 4: snprintf(out, n, "pytorch_model-dist-%05u.bin", w); break;
	case 5: snprintf(out, n, "pytorch_model-dist-%05u.safetensors", w); break;
	default: snprintf(out, n, "other-%u-%u", w, s); break;
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	int fds[MAX_PARTS];
	size_t at = 0;
	int nparts = 0;

	if (!dir[0])
		setup();
	for (int i = 0; i < nwritten; i++)
		if (unlinkat(dfd, names[i], 0) != 0)
			fuzz_die("cannot remove a part", names[i]);
	nwritten = 0;
	while (nparts < MAX_PARTS && size - at >= 4) {
		size_t n = (size_t)fuzz_le(data + at, 4), body;
		const uint8_t *p;
		bool dup = false;

		at += 4;
		if (n > size - at)
			n = size - at;
		p = data + at;
		at += n;
		if (n < 3)
			continue;
		name_of(names[nparts], sizeof(names[nparts]), p[0], p[1], p[2]);
		for (int i = 0; i < nparts; i++)
			dup |= strcmp(names[i], names[nparts]) == 0;
		if (dup)
			continue;
		body = n - 3;
		fds[nparts] = openat(dfd, names[nparts], O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC,
				     0644);
		if (fds[nparts] < 0 ||
		    (body && write(fds[nparts], p + 3, body) != (ssize_t)body))
			fuzz_die("cannot write a part", names[nparts]);
		nparts++;
		nwritten = nparts;
	}
	{
		struct parts pt = { fds, nparts };

		fuzz_adapter_run(&sf_format_colossal, dfd, dir, SF_COLOSSAL_FORMAT, NULL,
				 fd_of, &pt, "colossal");
	}
	for (int i = 0; i < nparts; i++)
		close(fds[i]);
	return 0;
}
