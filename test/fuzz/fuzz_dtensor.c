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
static struct fuzz_parts parts = { .dfd = -1 }; /* dfd: dir, open for the process's life */

/* fuzz_part_name_fn: rank i's file of a world of n (the previous input's
 * files go when n changes). */
static void part_name(int i, int n, char *name, size_t size)
{
	snprintf(name, size, "model_world_size_%d_rank_%d.pt", n, i);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	fuzz_parts_begin(&parts, dir, sizeof(dir));
	fuzz_parts_write(&parts, data, size, MAX_PARTS, part_name);
	fuzz_adapter_run(&sf_format_dtensor, parts.dfd, dir, SF_DTENSOR_FORMAT, NULL,
			 fuzz_parts_fd_of, &parts, "dtensor");
	fuzz_parts_close(&parts);
	return 0;
}
