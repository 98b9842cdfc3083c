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
static struct fuzz_parts parts = { .dfd = -1 }; /* dfd: dir, open for the process's life */

/* fuzz_part_name_fn: the metadata, then rank files. */
static void part_name(int i, int n, char *name, size_t size)
{
	(void)n;
	if (i == 0)
		snprintf(name, size, "0.metadata");
	else
		snprintf(name, size, "%d_0.distcp", i - 1);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	fuzz_parts_begin(&parts, dir, sizeof(dir));
	fuzz_parts_write(&parts, data, size, MAX_PARTS, part_name);
	fuzz_adapter_run(&sf_format_paddle, parts.dfd, dir, SF_PADDLE_FORMAT, NULL,
			 fuzz_parts_fd_of, &parts, "paddle");
	fuzz_parts_close(&parts);
	return 0;
}
