/*
 * fuzz_paddlenlp_hp.c - libFuzzer target for the PaddleNLP hybrid-parallel
 * adapter (core/formats/sf_paddlenlp_hp.c): its model and optimizer
 * pickles (the restricted pickle reader with numpy's globals and paddle's
 * builtins.tuple wrapper), config.json, the pieces put together across
 * tensor ranks, pipeline stages and sharding ranks.
 *
 * Input: one byte choosing the layout (2 mod 4: the third; else even:
 * tensor parallel 2, the
 * names config.json, model_state.tp00.pdparams, model_state.tp01.pdparams,
 * optimizer.tp00.pdopt, optimizer.tp01.pdopt; odd: tensor parallel 2,
 * pipeline 2, sharding 2: config.json, model_meta.json, the four
 * model_state.tpXX_ppYY.pdparams and eight optimizer.tpXX_ppYY_shardZZ.pdopt;
 * third: the same saved with save_sharded_model, the model in eight
 * model_state.tpXX_ppYY_shardZZ.pdparams),
 * then parts, each a 4-byte little-endian length and that many bytes (a
 * length past the end takes what is left), written under the layout's
 * names in order in a directory (under /dev/shm, else $TMPDIR, else /tmp,
 * made once per process) that the adapter then opens; before each input
 * the directory holds exactly the files of its parts. Seeds: the
 * committed tp2, tp2pp2sh2, tp2pp2sh2v2 (sharding V2; also two
 * variants whose slices lie), tp2pp2sh2sm and tp2pp2sh2smbf16
 * (save_sharded_model) checkpoints (paddlenlp_seeds.py).
 *
 * For any input, open either fails with a domain error or -ENOMEM (with a
 * one-line message but for -ENOMEM) and no model, or gives a finished
 * model of format paddlenlp-hybrid in which every shard (strided ones
 * too) names one of the files written and lies inside it, and every
 * tensor is covered exactly once with replicas of the same box
 * (fuzz_adapter_check_model). Any violation aborts.
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
#include "sf_paddlenlp_hp.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

const char fuzz_target[] = "fuzz_paddlenlp_hp";

#define MAX_PARTS 18

static const char *const layouts[3][MAX_PARTS] = {
	{ "config.json", "model_state.tp00.pdparams", "model_state.tp01.pdparams",
	  "optimizer.tp00.pdopt", "optimizer.tp01.pdopt" },
	{ "config.json", "model_meta.json",
	  "model_state.tp00_pp00.pdparams", "model_state.tp00_pp01.pdparams",
	  "model_state.tp01_pp00.pdparams", "model_state.tp01_pp01.pdparams",
	  "optimizer.tp00_pp00_shard00.pdopt", "optimizer.tp00_pp00_shard01.pdopt",
	  "optimizer.tp00_pp01_shard00.pdopt", "optimizer.tp00_pp01_shard01.pdopt",
	  "optimizer.tp01_pp00_shard00.pdopt", "optimizer.tp01_pp00_shard01.pdopt",
	  "optimizer.tp01_pp01_shard00.pdopt", "optimizer.tp01_pp01_shard01.pdopt" },
	{ "config.json", "model_meta.json",
	  "model_state.tp00_pp00_shard00.pdparams", "model_state.tp00_pp00_shard01.pdparams",
	  "model_state.tp00_pp01_shard00.pdparams", "model_state.tp00_pp01_shard01.pdparams",
	  "model_state.tp01_pp00_shard00.pdparams", "model_state.tp01_pp00_shard01.pdparams",
	  "model_state.tp01_pp01_shard00.pdparams", "model_state.tp01_pp01_shard01.pdparams",
	  "optimizer.tp00_pp00_shard00.pdopt", "optimizer.tp00_pp00_shard01.pdopt",
	  "optimizer.tp00_pp01_shard00.pdopt", "optimizer.tp00_pp01_shard01.pdopt",
	  "optimizer.tp01_pp00_shard00.pdopt", "optimizer.tp01_pp00_shard01.pdopt",
	  "optimizer.tp01_pp01_shard00.pdopt", "optimizer.tp01_pp01_shard01.pdopt" },
};

static char dir[512];
static int dfd = -1;             /* dir, open for the process's life */
static int layout;               /* of the parts in dir */
static int nwritten;             /* parts 0..nwritten-1 are in dir */

static void remove_parts(int from)
{
	for (int i = from; i < nwritten; i++)
		if (unlinkat(dfd, layouts[layout][i], 0) != 0)
			fuzz_die("cannot remove a part", layouts[layout][i]);
	nwritten = from < nwritten ? from : nwritten;
}

static void cleanup(void)
{
	remove_parts(0);
	close(dfd);
	rmdir(dir);
}

static int write_part(const char *name, const uint8_t *p, size_t n)
{
	int fd = openat(dfd, name, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);

	if (fd < 0 || (n && write(fd, p, n) != (ssize_t)n))
		fuzz_die("cannot write a part", name);
	return fd;
}

struct parts {
	const int *fds;
	int n;
	int layout;
};

static int fd_of(void *ctx, const char *file)
{
	const struct parts *pt = ctx;
	int k = 0;

	while (k < MAX_PARTS && !(layouts[pt->layout][k] &&
				  strcmp(file, layouts[pt->layout][k]) == 0))
		k++;
	if (k == MAX_PARTS)
		fuzz_die("a shard names a file not written", file);
	if (k >= pt->n)
		fuzz_die("a shard's file is missing", file);
	return pt->fds[k];
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	int fds[MAX_PARTS], lay, nparts = 0, max;
	size_t at = 1;

	if (size < 1)
		return 0;
	if (!dir[0]) {
		dfd = fuzz_scratch_dir(dir, sizeof(dir));
		atexit(cleanup);
	}
	lay = data[0] % 4 == 2 ? 2 : data[0] & 1;
	for (max = 0; max < MAX_PARTS && layouts[lay][max]; max++)
		;
	if (lay != layout)
		remove_parts(0);
	layout = lay;
	while (nparts < max && size - at >= 4) {
		size_t n = (size_t)fuzz_le(data + at, 4);

		at += 4;
		if (n > size - at)
			n = size - at;
		fds[nparts] = write_part(layouts[lay][nparts], data + at, n);
		nparts++;
		at += n;
	}
	if (nparts > nwritten)
		nwritten = nparts;
	remove_parts(nparts); /* the previous input's parts past these */
	{
		struct parts pt = { fds, nparts, lay };

		fuzz_adapter_run(&sf_format_paddlenlp_hp, dfd, dir, SF_PADDLENLP_HP_FORMAT, NULL,
				 fd_of, &pt, "paddlenlp-hybrid");
	}
	for (int i = 0; i < nparts; i++)
		close(fds[i]);
	return 0;
}
