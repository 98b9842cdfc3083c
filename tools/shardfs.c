/*
 * shardfs.c - the daemon's command line: parse options, set up logging and
 * hand over to sf_fs_run() (fs/sf_fs.h), which owns everything after.
 *
 * MPI mode (--mpi, one daemon per rank under mpirun): sf_mpi_init runs
 * before anything starts a thread or could fork (option parsing only reads
 * argv); then %r is expanded in STORE and MOUNTPOINT, the peer layer
 * indexes the store (collective), the daemon serves in the foreground with
 * the cluster glue of sf_cluster_mpi.c, and after the mount is gone
 * sf_mpi_finalize keeps answering peers until every daemon has left.
 *
 * Exit status: 0 after a clean unmount, 1 when the store cannot be served
 * or the mount fails, 2 for bad usage (also --mpi in a build without MPI).
 */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "sf_cluster_mpi.h"
#include "sf_error.h"
#include "sf_fs.h"
#include "sf_log.h"
#include "sf_mpi.h"
#include "sf_parse.h"
#include "sf_store.h"

#define MAX_FUSE_OPTS 64
#define MAX_CACHE_MB (1ull << 20) /* 1 TiB of cached blocks */
/* glibc's largest mmap threshold (HEAP_MAX_SIZE / 2 on 64-bit): blocks up
 * to 32 MiB (the default block size is 4 MiB) come from the heap. */
#define MMAP_THRESHOLD (32 << 20)
/* Heap reserved for transparent huge pages at start-up (see heap_thp). */
#define HEAP_THP_BYTES (256u << 20)
#define HEAP_THP_STEP (24u << 20)  /* below MMAP_THRESHOLD: from the heap */
#define MAX_TIMEOUT_S 86400       /* --commit-timeout, --peer-timeout */
#define DEFAULT_COMMIT_TIMEOUT_S 60

/*
 * Ask for transparent huge pages on the first HEAP_THP_BYTES of the heap:
 * grow it with malloc, madvise(MADV_HUGEPAGE) the range, free it again (the
 * trim threshold keeps it mapped). Nothing is touched here, so nothing
 * becomes resident; later allocations there fault in 2 MiB at a time.
 * Parsing a 10,000-tensor manifest makes ~10^6 small allocations, and on
 * VMs where a 4 KiB first-touch fault costs tens of microseconds that was
 * half of its time. Best effort: when the heap cannot grow contiguously
 * (or THP is off) nothing changes.
 */
static void heap_thp(void)
{
	void *p[HEAP_THP_BYTES / HEAP_THP_STEP];
	uintptr_t lo = UINTPTR_MAX, hi = 0, pg = 2u << 20;
	size_t n;

	for (n = 0; n < sizeof(p) / sizeof(p[0]); n++) {
		uintptr_t a;

		p[n] = malloc(HEAP_THP_STEP);
		if (!p[n])
			break;
		a = (uintptr_t)p[n];
		lo = a < lo ? a : lo;
		hi = a + HEAP_THP_STEP > hi ? a + HEAP_THP_STEP : hi;
	}
	lo = (lo + pg - 1) & ~(pg - 1);
	hi &= ~(pg - 1);
	/* Contiguous (one heap, not mmap'd chunks): madvise the whole span. */
	if (n && hi > lo && hi - lo <= (uintptr_t)n * (HEAP_THP_STEP + 4096))
		(void)madvise((void *)lo, hi - lo, MADV_HUGEPAGE);
	while (n > 0)
		free(p[--n]);
}

static void usage(FILE *f)
{
	fprintf(f,
		"usage: shardfs [options] STORE MOUNTPOINT\n"
		"       mpirun -np N shardfs --mpi [options] STORE MOUNTPOINT\n"
		"Show the sharded checkpoints in STORE as directories of whole tensors.\n"
		"\n"
		"  -f                  stay in the foreground\n"
		"  -d                  FUSE debug output (implies -f)\n"
		"  -s                  serve requests on a single thread\n"
		"  -o OPT[,OPT...]     FUSE mount options (ro, allow_other, ...)\n"
		"  --no-verify         skip XXH3 checksum verification of payloads\n"
		"  --cache-mb N        block cache size in MiB (default 256)\n"
		"  --direct-io         read committed files with FUSE direct_io (no copy\n"
		"                      through the mount's page cache; mmap still works)\n"
		"  --log-level LEVEL   error, warn, info or debug (default warn)\n"
		"  --no-default-permissions\n"
		"                      do not have the kernel check the modes shown (with\n"
		"                      -o allow_other every user may then read everything;\n"
		"                      changes stay limited to root and the store's owner)\n"
		"  --mpi               one daemon per MPI rank, always in the foreground;\n"
		"                      %%r in STORE and MOUNTPOINT is the rank (%%%% is %%)\n"
		"  --commit-timeout S  MPI: bound on a collective commit (default 60)\n"
		"  --peer-timeout S    MPI: bound on one read from a peer (default 30)\n"
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

/* A whole number of seconds, 1..MAX_TIMEOUT_S, into *ms. */
static int parse_seconds(const char *s, int *ms)
{
	uint64_t v;

	if (sf_parse_u64(s, MAX_TIMEOUT_S, &v) || v == 0)
		return -EINVAL;
	*ms = (int)v * 1000;
	return 0;
}

/*
 * MPI mode, after option parsing. cfg holds the parsed options with
 * store and mountpoint still as patterns. Returns the exit status.
 */
static int run_mpi(int *argc, char ***argv, struct sf_fs_config *cfg,
		   enum sf_log_level level, int commit_timeout_ms,
		   int peer_timeout_ms)
{
	char store[PATH_MAX], mnt[PATH_MAX], *store_abs;
	struct sf_cluster_mpi *cl = NULL;
	struct sf_mpi *mp = NULL;
	int ret, single, status = 1;

	if (!sf_mpi_built()) {
		fprintf(stderr, "shardfs: --mpi: this shardfs was built without MPI (configure with Open MPI installed and SHARDFS_WITH_MPI=ON)\n");
		return 2;
	}
	ret = sf_mpi_init(argc, argv, &mp);
	if (ret) {
		fprintf(stderr, "shardfs: --mpi: cannot initialize MPI: %s\n",
			sf_strerror(ret));
		return 1;
	}
	sf_log_setup(NULL, level); /* keep the "[rank R]" prefix */
	/* Tried with the widest rank first, so that every rank takes the
	 * same branch and none is left alone in the collective start. */
	if (sf_cluster_mpi_expand(cfg->store, sf_mpi_size(mp) - 1, store,
				  sizeof(store)) ||
	    sf_cluster_mpi_expand(cfg->mountpoint, sf_mpi_size(mp) - 1, mnt,
				  sizeof(mnt))) {
		sf_err("STORE or MOUNTPOINT is too long after %%r expansion");
		status = 2;
		goto out_finalize;
	}
	(void)sf_cluster_mpi_expand(cfg->store, sf_mpi_rank(mp), store,
				    sizeof(store));
	(void)sf_cluster_mpi_expand(cfg->mountpoint, sf_mpi_rank(mp), mnt,
				    sizeof(mnt));
	/* Resolved now: the peer layer answers reads relative to it. */
	store_abs = realpath(store, NULL);
	/* Decided together: a checkpoint spread over node-local stores (its
	 * metadata on one node only) is one checkpoint on every daemon. */
	ret = sf_mpi_allreduce_single(mp, store_abs ? sf_store_single_vote(store_abs) : 0,
				      &single);
	if (ret) {
		sf_err("mpi: cannot agree on the store's shape: %s", sf_strerror(ret));
		free(store_abs);
		goto out_finalize;
	}
	ret = sf_mpi_start(mp, store_abs ? store_abs : store, single);
	free(store_abs);
	if (ret) {
		sf_err("mpi: cannot start on store %s: %s", store,
		       sf_strerror(ret));
		goto out_finalize;
	}
	if (peer_timeout_ms)
		sf_mpi_set_read_timeout(mp, peer_timeout_ms);
	ret = sf_cluster_mpi_create(mp, single, commit_timeout_ms, &cl);
	if (ret) {
		sf_err("mpi: %s", sf_strerror(ret));
		goto out_finalize;
	}
	cfg->store = store;
	cfg->mountpoint = mnt;
	cfg->foreground = true; /* never fork after MPI_Init */
	cfg->cluster = sf_cluster_mpi_fs(cl);
	sf_info("mpi: rank %d of %d: %s%s at %s", sf_mpi_rank(mp),
		sf_mpi_size(mp), store, single ? " (one checkpoint)" : "", mnt);
	ret = sf_fs_run(cfg);
	status = ret ? 1 : 0;
out_finalize:
	/* Also after a failed mount: this rank's store still serves peers. */
	ret = sf_mpi_finalize(mp);
	if (ret && !status)
		status = 1;
	sf_cluster_mpi_destroy(cl); /* after the service thread stopped */
	return status;
}

int main(int argc, char **argv)
{
	enum { OPT_NO_VERIFY = 256, OPT_CACHE_MB, OPT_LOG_LEVEL, OPT_MPI,
	       OPT_COMMIT_TIMEOUT, OPT_PEER_TIMEOUT, OPT_NO_DEFAULT_PERMS,
	       OPT_DIRECT_IO };
	static const struct option longopts[] = {
		{ "no-verify", no_argument, NULL, OPT_NO_VERIFY },
		{ "cache-mb", required_argument, NULL, OPT_CACHE_MB },
		{ "log-level", required_argument, NULL, OPT_LOG_LEVEL },
		{ "mpi", no_argument, NULL, OPT_MPI },
		{ "commit-timeout", required_argument, NULL, OPT_COMMIT_TIMEOUT },
		{ "peer-timeout", required_argument, NULL, OPT_PEER_TIMEOUT },
		{ "no-default-permissions", no_argument, NULL, OPT_NO_DEFAULT_PERMS },
		{ "direct-io", no_argument, NULL, OPT_DIRECT_IO },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'V' },
		{ NULL, 0, NULL, 0 },
	};
	const char *fuse_opts[MAX_FUSE_OPTS];
	enum sf_log_level level = SF_LOG_WARN;
	struct sf_fs_config cfg = { 0 };
	uint64_t mb = 256;
	bool mpi = false;
	int commit_timeout_ms = DEFAULT_COMMIT_TIMEOUT_S * 1000;
	int peer_timeout_ms = 0; /* 0: the peer layer's default */
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
			if (sf_parse_u64(optarg, MAX_CACHE_MB, &mb) || mb == 0)
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
		case OPT_NO_DEFAULT_PERMS:
			cfg.no_default_permissions = true;
			break;
		case OPT_DIRECT_IO:
			cfg.direct_io = true;
			break;
		case OPT_COMMIT_TIMEOUT:
			if (parse_seconds(optarg, &commit_timeout_ms))
				return bad_usage("--commit-timeout wants whole seconds from 1 to 86400, not '%s'",
						 optarg);
			break;
		case OPT_PEER_TIMEOUT:
			if (parse_seconds(optarg, &peer_timeout_ms))
				return bad_usage("--peer-timeout wants whole seconds from 1 to 86400, not '%s'",
						 optarg);
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
	heap_thp();
	sf_log_setup("shardfs: ", level);
	if (mpi)
		return run_mpi(&argc, &argv, &cfg, level, commit_timeout_ms,
			       peer_timeout_ms);
	rc = sf_fs_run(&cfg);
	return rc ? 1 : 0;
}
