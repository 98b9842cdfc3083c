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
static struct fuzz_parts parts = { .dfd = -1 }; /* dfd: dir, open for the process's life */

static const char *const part_names[MAX_PARTS] = {
	"model.safetensors.index.json", "optimizer.safetensors.index.json",
	"master_weights.safetensors.index.json", "config.json",
	"model-00001-of-00001.safetensors", "optimizer-00001-of-00001.safetensors",
	"master_weights-00001-of-00001.safetensors",
	"model-00002-of-00002.safetensors",
};

/* fuzz_part_name_fn: the fixed names above. */
static void part_name(int i, int n, char *name, size_t size)
{
	(void)n;
	snprintf(name, size, "%s", part_names[i]);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	fuzz_parts_begin(&parts, dir, sizeof(dir));
	fuzz_parts_write(&parts, data, size, MAX_PARTS, part_name);
	fuzz_adapter_run(&sf_format_paddlenlp, parts.dfd, dir, SF_PADDLENLP_FORMAT, NULL,
			 fuzz_parts_fd_of, &parts, "paddlenlp");
	fuzz_parts_close(&parts);
	return 0;
}
