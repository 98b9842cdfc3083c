/*
 * shardfs.c - the daemon's command line: parse options, set up logging and
 * hand over to sf_fs_run() (fs/sf_fs.h), which owns everything after.
 *
 * Exit status: 0 after a clean unmount, 1 when the store cannot be served
 * or the mount fails, 2 for bad usage.
 */
#include <errno.h>
#include <getopt.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sf_error.h"
#include "sf_fs.h"
#include "sf_log.h"

#define MAX_FUSE_OPTS 64
#define MAX_CACHE_MB (1ull << 20) /* 1 TiB of cached blocks */
/* glibc's largest mmap threshold (HEAP_MAX_SIZE / 2 on 64-bit): blocks up
 * to 32 MiB (the default block size is 4 MiB) come from the heap. */
#define MMAP_THRESHOLD (32 << 20)

static void usage(FILE *f)
{
	fprintf(f,
		"usage: shardfs [options] STORE MOUNTPOINT\n"
		"Show the sharded checkpoints in STORE as directories of whole tensors.\n"
		"\n"
		"  -f                  stay in the foreground\n"
		"  -d                  FUSE debug output (implies -f)\n"
		"  -s                  serve requests on a single thread\n"
		"  -o OPT[,OPT...]     FUSE mount options (ro, allow_other, ...)\n"
		"  --no-verify         skip XXH3 checksum verification of payloads\n"
		"  --cache-mb N        block cache size in MiB (default 256)\n"
		"  --log-level LEVEL   error, warn, info or debug (default warn)\n"
		"  --mpi               one daemon per MPI rank (see SPEC section 2)\n"
		"  -h, --help          show this help\n"
		"  -V, --version       show the version\n");
}

static int bad_usage(const char *fmt, const char *arg)
{
	fprintf(stderr, "shardfs: ");
	fprintf(stderr, fmt, arg);
	fprintf(stderr, "\nTry 'shardfs --help'.\n");
	return 2;
}

static int parse_level(const char *s, enum sf_log_level *out)
{
	static const char *const names[] = { "error", "warn", "info", "debug" };
	unsigned i;

	for (i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		if (strcmp(s, names[i]) == 0) {
			*out = (enum sf_log_level)i;
			return 0;
		}
	}
	return -EINVAL;
}

int main(int argc, char **argv)
{
	enum { OPT_NO_VERIFY = 256, OPT_CACHE_MB, OPT_LOG_LEVEL, OPT_MPI };
	static const struct option longopts[] = {
		{ "no-verify", no_argument, NULL, OPT_NO_VERIFY },
		{ "cache-mb", required_argument, NULL, OPT_CACHE_MB },
		{ "log-level", required_argument, NULL, OPT_LOG_LEVEL },
		{ "mpi", no_argument, NULL, OPT_MPI },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'V' },
		{ NULL, 0, NULL, 0 },
	};
	const char *fuse_opts[MAX_FUSE_OPTS];
	enum sf_log_level level = SF_LOG_WARN;
	struct sf_fs_config cfg = { 0 };
	unsigned long long mb = 256;
	bool mpi = false;
	char *end;
	int c, rc;

	cfg.fuse_opts = fuse_opts;
	cfg.engine.verify = true;
	while ((c = getopt_long(argc, argv, "+fdso:hV", longopts, NULL)) != -1) {
		switch (c) {
		case 'f':
			cfg.foreground = true;
			break;
		case 'd':
			cfg.debug = true;
			cfg.foreground = true;
			break;
		case 's':
			cfg.single_thread = true;
			break;
		case 'o':
			if (cfg.nfuse_opts == MAX_FUSE_OPTS)
				return bad_usage("more than 64 -o options%s", "");
			fuse_opts[cfg.nfuse_opts++] = optarg;
			break;
		case OPT_NO_VERIFY:
			cfg.engine.verify = false;
			break;
		case OPT_CACHE_MB:
			errno = 0;
			mb = strtoull(optarg, &end, 10);
			if (errno || end == optarg || *end || optarg[0] == '-' ||
			    mb == 0 || mb > MAX_CACHE_MB)
				return bad_usage("--cache-mb wants a size in MiB from 1 to 1048576, not '%s'",
						 optarg);
			break;
		case OPT_LOG_LEVEL:
			if (parse_level(optarg, &level))
				return bad_usage("--log-level wants error, warn, info or debug, not '%s'",
						 optarg);
			break;
		case OPT_MPI:
			mpi = true;
			break;
		case 'h':
			usage(stdout);
			return 0;
		case 'V':
			printf("shardfs %s\n", SHARDFS_VERSION);
			return 0;
		default:
			return bad_usage("bad option%s", "");
		}
	}
	if (mpi) {
		fprintf(stderr, "shardfs: --mpi: this build's MPI mode is not wired yet\n");
		return 2;
	}
	if (argc - optind != 2) {
		usage(stderr);
		return 2;
	}
	cfg.store = argv[optind];
	cfg.mountpoint = argv[optind + 1];
	cfg.engine.cache_bytes = (uint64_t)mb << 20;

	/*
	 * The engine allocates and frees checksum blocks (up to
	 * SF_MAX_BLOCK_SIZE) all the time. Keep them on the heap and keep freed
	 * memory mapped: fresh pages fault on first touch, and on some VMs a
	 * fault costs tens of microseconds, which halves read throughput. One
	 * arena, so a block freed by one worker is reused by the next (per
	 * thread arenas kept asking the kernel for fresh pages; measured 1.6x).
	 */
	mallopt(M_ARENA_MAX, 1);
	mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD);
	mallopt(M_TRIM_THRESHOLD, 1 << 30);
	sf_log_setup("shardfs: ", level);
	rc = sf_fs_run(&cfg);
	return rc ? 1 : 0;
}
