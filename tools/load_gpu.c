/*
 * load_gpu.c - shardfs-load-gpu: load files into CUDA device memory and
 * report how fast, e.g. model.safetensors from a shardfs mount.
 *
 *   shardfs-load-gpu [--device N] [--per-tensor] [--staging-mb N]
 *                    [--depth N] [--verify] [--no-direct] FILE...
 *
 * A FILE ending in .safetensors is loaded tensor by tensor (one device
 * allocation per file, or per tensor with --per-tensor); any other FILE is
 * loaded whole. Two timings are printed: the whole load, and the file reads
 * alone (the same files through the same reader pool and staging ring with
 * no device copies, run after the load, so its reads may come from the page
 * cache: the comparison errs against the loader). --verify copies every
 * result back and compares it with its file.
 *
 * On a shardfs mount (a tensor file tensors/NAME, or the mount's
 * model.safetensors) the loader takes the direct path (sf_gpu.h): the
 * bytes the mount offers are read from this node's store files with the
 * caller's rights and checked block by block, the rest through the mount;
 * "direct path:" counts the bytes each way. --no-direct reads everything
 * through the files named.
 *
 * Exit status: 0 on success, 1 on any failure (no CUDA device: "no CUDA
 * device: <cuda error>"; stub build: "shardfs was built without CUDA"),
 * 2 on bad usage.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sf_error.h"
#include "sf_parse.h"
#include "sf_gpu.h"

#define MAX_FILES 4096u /* FILE arguments per run */

static void usage(FILE *f)
{
	fprintf(f,
		"usage: shardfs-load-gpu [--device N] [--per-tensor] [--staging-mb N]\n"
		"                        [--depth N] [--verify] [--no-direct] FILE...\n"
		"  FILE.safetensors is loaded per tensor; other files whole.\n");
}

/* Parse a decimal in [lo, hi] into *out; false if not one. */
static bool parse_uint(const char *s, unsigned long lo, unsigned long hi,
		       unsigned long *out)
{
	uint64_t v;

	if (sf_parse_u64(s, hi, &v) || v < lo)
		return false;
	*out = (unsigned long)v;
	return true;
}

static bool is_safetensors(const char *path)
{
	size_t n = strlen(path), k = strlen(".safetensors");

	return n > k && !strcmp(path + n - k, ".safetensors");
}

static void print_rate(const char *what, const struct sf_gpu_stats *st,
		       double s)
{
	printf("%-17s %" PRIu64 " bytes in %.6f s = %.3f GB/s\n", what, st->bytes,
	       s, s > 0 ? (double)st->bytes / s / 1e9 : 0.0);
}

int main(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "device", required_argument, NULL, 'd' },
		{ "per-tensor", no_argument, NULL, 't' },
		{ "staging-mb", required_argument, NULL, 's' },
		{ "depth", required_argument, NULL, 'q' },
		{ "verify", no_argument, NULL, 'v' },
		{ "no-direct", no_argument, NULL, 'n' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	struct sf_gpu_opts o = { 0 };
	struct sf_gpu_stats load = { 0 }, reads = { 0 };
	struct sf_gpu_loader *l = NULL;
	struct sf_gpu_range *ranges = NULL;
	enum sf_gpu_alloc alloc = SF_GPU_PER_FILE;
	bool verify = false;
	char err[SF_GPU_ERRLEN] = "";
	unsigned long v;
	uint64_t diff;
	size_t i, nfiles, bad = 0;
	int c, rc, status = 1;

	while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
		switch (c) {
		case 'd':
			if (!parse_uint(optarg, 0, INT_MAX, &v))
				goto out_usage;
			o.device = (int)v;
			break;
		case 't':
			alloc = SF_GPU_PER_TENSOR;
			break;
		case 's':
			if (!parse_uint(optarg, 1, SF_GPU_MAX_STAGING >> 20, &v))
				goto out_usage;
			o.staging_bytes = (size_t)v << 20;
			break;
		case 'q':
			if (!parse_uint(optarg, 1, SF_GPU_MAX_DEPTH, &v))
				goto out_usage;
			o.depth = (unsigned)v;
			break;
		case 'v':
			verify = true;
			break;
		case 'n':
			o.no_direct = true;
			break;
		case 'h':
			usage(stdout);
			return 0;
		default:
			goto out_usage;
		}
	}
	nfiles = (size_t)(argc - optind);
	if (nfiles == 0 || nfiles > MAX_FILES)
		goto out_usage;

	rc = sf_gpu_loader_create(&o, &l, err, sizeof(err));
	if (rc) {
		fprintf(stderr, "shardfs-load-gpu: %s\n", err);
		return 1;
	}
	ranges = calloc(nfiles, sizeof(*ranges));
	if (!ranges) {
		fprintf(stderr, "shardfs-load-gpu: out of memory\n");
		goto out_destroy;
	}
	for (i = 0; i < nfiles; i++) {
		const char *path = argv[optind + (int)i];

		ranges[i] = (struct sf_gpu_range){ path, 0, SF_GPU_TO_EOF, path };
		rc = is_safetensors(path)
			     ? sf_gpu_load_safetensors(l, path, alloc, &load)
			     : sf_gpu_load_file(l, path, &load);
		if (rc < 0) {
			fprintf(stderr, "shardfs-load-gpu: %s: %s\n", path,
				sf_gpu_last_error(l));
			goto out_free_ranges;
		}
	}
	rc = sf_gpu_read_only(l, ranges, nfiles, &reads);
	if (rc < 0) {
		fprintf(stderr, "shardfs-load-gpu: read pass: %s\n",
			sf_gpu_last_error(l));
		goto out_free_ranges;
	}
	printf("loaded %zu tensors from %zu files to device %d (%s, staging %zu MiB x %u)\n",
	       sf_gpu_count(l), nfiles, o.device,
	       alloc == SF_GPU_PER_TENSOR ? "per tensor" : "per file",
	       (o.staging_bytes ? o.staging_bytes : SF_GPU_DEFAULT_STAGING) >> 20,
	       o.depth ? o.depth : SF_GPU_DEFAULT_DEPTH);
	print_rate("file reads alone:", &reads, reads.total_s);
	print_rate("whole load:", &load, load.total_s);
	printf("%-17s %.6f s summed over reader threads\n", "reads in load:",
	       load.read_busy_s);
	printf("%-17s %" PRIu64 " bytes read direct, %" PRIu64
	       " through the mount, %" PRIu64 " chunks re-read through it%s\n",
	       "direct path:", load.direct_bytes, load.mount_bytes, load.rereads,
	       o.no_direct ? " (--no-direct)" : "");
	status = 0;
	if (verify) {
		for (i = 0; i < sf_gpu_count(l); i++) {
			const struct sf_gpu_tensor *t = sf_gpu_get(l, i);

			rc = sf_gpu_verify(l, t, &diff);
			if (rc) {
				fprintf(stderr, "shardfs-load-gpu: verify: %s\n",
					sf_gpu_last_error(l));
				bad++;
			}
		}
		printf("verify: %zu of %zu tensors match their files\n",
		       sf_gpu_count(l) - bad, sf_gpu_count(l));
		if (bad)
			status = 1;
	}
out_free_ranges:
	free(ranges);
out_destroy:
	sf_gpu_loader_destroy(l);
	return status;

out_usage:
	usage(stderr);
	return 2;
}
