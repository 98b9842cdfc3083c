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
 * Calling conventions: options may stand before or after the paths, so
 * mount.fuse3 (mount -t fuse.shardfs, /etc/fstab) can run `shardfs STORE
 * DIR -o OPTS`; -o lists carry shardfs's own options too (cache_mb=N,
 * no_verify, log_level=L, log_file=PATH, nonempty, transport=T,
 * no_default_permissions),
 * fstab-only ones (defaults, nofail, _netdev, x-*, ...) are dropped, the
 * rest go to FUSE unchanged.
 *
 * Logging: --log-file PATH (SIGHUP reopens it), else syslog (LOG_DAEMON)
 * when the daemon detaches, else stderr (see sf_log.h).
 *
 * Exit status: 0 after a clean unmount (or, without -f, once mounted and
 * detached), 1 when the store cannot be served, the log file cannot be
 * opened or the mount fails, 2 for bad usage (also --mpi in a build
 * without MPI).
 */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <malloc.h>
#include <signal.h>
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
		"usage: shardfs [options] STORE MOUNTPOINT [options]\n"
		"       mpirun -np N shardfs --mpi [options] STORE MOUNTPOINT\n"
		"Show the sharded checkpoints in STORE as directories of whole tensors.\n"
		"\n"
		"  -f                  stay in the foreground\n"
		"  -d                  FUSE debug output (implies -f)\n"
		"  -s                  serve requests on a single thread\n"
		"  -o OPT[,OPT...]     mount options: shardfs's own (cache_mb=N, no_verify,\n"
		"                      log_level=L, log_file=PATH, nonempty, open_wait=S,\n"
		"                      transport=T, no_default_permissions), FUSE's (ro,\n"
		"                      allow_other, ...);\n"
		"                      fstab-only ones (defaults, nofail, _netdev, x-*, ...)\n"
		"                      are ignored\n"
		"  --no-verify         skip XXH3 checksum verification of payloads\n"
		"  --cache-mb N        block cache size in MiB (default 32)\n"
		"  --direct-io         read committed files with FUSE direct_io (no copy\n"
		"                      through the mount's page cache; mmap still works)\n"
		"  --transport T       how requests arrive: dev (/dev/fuse, the default),\n"
		"                      uring (FUSE over io_uring; root's enable_uring on)\n"
		"                      or auto (io_uring where it works, else /dev/fuse)\n"
		"  --log-level LEVEL   error, warn, info or debug (default warn)\n"
		"  --log-file PATH     append the log to PATH (SIGHUP reopens it); without\n"
		"                      it the log goes to stderr with -f, else to syslog\n"
		"  --nonempty          allow a MOUNTPOINT that holds files (they are hidden)\n"
		"  --open-wait S       how long mounting waits for checkpoints to open\n"
		"                      (default 10); slower ones appear once opened\n"
		"  --no-default-permissions\n"
		"                      do not have the kernel check the modes shown (with\n"
		"                      -o allow_other every user may then read everything;\n"
		"                      changes stay limited to root and the store's owner)\n"
		"  --mpi               one daemon per MPI rank, always in the foreground;\n"
		"                      %%r in STORE, MOUNTPOINT and the log file is the rank\n"
		"                      (%%%% is %%)\n"
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

/* The command line, parsed. Strings are borrowed from argv except those
 * in owned (freed by args_free). */
struct args {
	struct sf_fs_config cfg;
	const char *fuse_opts[MAX_FUSE_OPTS];  /* cfg.fuse_opts */
	char *owned[MAX_FUSE_OPTS];            /* malloc'd: the filtered -o lists */
	size_t nowned;
	char *log_file_owned;                  /* malloc'd: -o log_file=PATH */
	const char *pos[2];                    /* STORE, MOUNTPOINT */
	size_t npos;
	enum sf_log_level level;
	const char *log_file;                  /* NULL: stderr or syslog */
	uint64_t mb;
	bool mpi;
	int commit_timeout_ms;
	int peer_timeout_ms;                   /* 0: the peer layer's default */
};

static void args_free(struct args *a)
{
	while (a->nowned > 0)
		free(a->owned[--a->nowned]);
	free(a->log_file_owned);
}

static int set_cache_mb(struct args *a, const char *v)
{
	if (sf_parse_u64(v, MAX_CACHE_MB, &a->mb) || a->mb == 0)
		return bad_usage("cache size (--cache-mb, -o cache_mb) wants MiB from 1 to 1048576, not '%s'",
				 v);
	return 0;
}

/* Seconds with at most three decimals, 0 to 3600, into ms. */
static int set_open_wait(struct args *a, const char *v)
{
	char whole[16], frac[4] = "000";
	const char *dot = strchr(v, '.');
	uint64_t s, f;
	size_t n = dot ? (size_t)(dot - v) : strlen(v);

	if (n == 0 || n >= sizeof(whole) ||
	    (dot && (!dot[1] || strlen(dot + 1) > 3)))
		goto bad;
	memcpy(whole, v, n);
	whole[n] = '\0';
	if (dot)
		memcpy(frac, dot + 1, strlen(dot + 1));
	if (sf_parse_u64(whole, 3600, &s) || sf_parse_u64(frac, 999, &f) ||
	    s * 1000 + f > 3600000)
		goto bad;
	a->cfg.open_wait_ms = (unsigned)(s * 1000 + f);
	return 0;
bad:
	return bad_usage("--open-wait (-o open_wait) wants seconds from 0 to 3600 (e.g. 10, 0.5), not '%s'",
			 v);
}

static int set_level(struct args *a, const char *v)
{
	if (parse_level(v, &a->level))
		return bad_usage("log level (--log-level, -o log_level) wants error, warn, info or debug, not '%s'",
				 v);
	return 0;
}

/* Options of fstab and mount(8) that mean nothing to a FUSE mount (mount
 * and mount.fuse3 consume most of them; they are dropped here too, for a
 * helper or a unit that hands them on). */
static bool fstab_only(const char *o)
{
	static const char *const names[] = {
		"defaults", "auto", "noauto", "user", "nouser", "users", "owner",
		"group", "nofail", "_netdev",
	};

	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
		if (strcmp(o, names[i]) == 0)
			return true;
	return strncmp(o, "x-", 2) == 0 || strncmp(o, "comment=", 8) == 0;
}

static int set_transport(struct args *a, const char *v)
{
	if (strcmp(v, "auto") == 0)
		a->cfg.transport = SF_FS_TRANSPORT_AUTO;
	else if (strcmp(v, "dev") == 0)
		a->cfg.transport = SF_FS_TRANSPORT_DEV;
	else if (strcmp(v, "uring") == 0)
		a->cfg.transport = SF_FS_TRANSPORT_URING;
	else
		return bad_usage("transport (--transport, -o transport) wants auto, dev or uring, not '%s'",
				 v);
	return 0;
}

/*
 * One item of a -o list: shardfs's own option (applied, returns 1),
 * dropped (returns 1), for FUSE (returns 0), or bad (returns the exit
 * status 2, message printed). item is unescaped ("\," is ',').
 */
static int own_opt(struct args *a, const char *item)
{
	if (strncmp(item, "cache_mb=", 9) == 0)
		return set_cache_mb(a, item + 9) ? 2 : 1;
	if (strncmp(item, "log_level=", 10) == 0)
		return set_level(a, item + 10) ? 2 : 1;
	if (strncmp(item, "open_wait=", 10) == 0)
		return set_open_wait(a, item + 10) ? 2 : 1;
	if (strncmp(item, "log_file=", 9) == 0) {
		if (!item[9])
			return bad_usage("-o log_file= wants a path%s", "");
		free(a->log_file_owned);
		a->log_file_owned = strdup(item + 9);
		if (!a->log_file_owned) {
			fprintf(stderr, "shardfs: out of memory\n");
			return 2;
		}
		a->log_file = a->log_file_owned;
		return 1;
	}
	if (strncmp(item, "transport=", 10) == 0)
		return set_transport(a, item + 10) ? 2 : 1;
	if (strcmp(item, "no_verify") == 0)
		a->cfg.engine.verify = false;
	else if (strcmp(item, "no_default_permissions") == 0)
		a->cfg.no_default_permissions = true;
	else if (strcmp(item, "nonempty") == 0)
		a->cfg.nonempty = true;
	else if (!item[0] || fstab_only(item))
		return 1;
	else
		return 0;
	return 1;
}

/*
 * A -o argument: take shardfs's own options out of the comma list (FUSE's
 * syntax: "\," is a comma inside an item) and keep the rest, as written,
 * for FUSE. Returns 0 or an exit status.
 */
static int add_o(struct args *a, const char *list)
{
	size_t len = strlen(list);
	char *fuse = malloc(len + 1), *item = malloc(len + 1);
	const char *p = list;
	size_t nf = 0;
	int rc = 0;

	if (!fuse || !item) {
		fprintf(stderr, "shardfs: out of memory\n");
		rc = 1;
		goto out_free;
	}
	while (*p) {
		const char *start = p;
		size_t ni = 0;

		for (; *p && *p != ','; p++) {
			if (*p == '\\' && p[1])
				p++;
			item[ni++] = *p;
		}
		item[ni] = '\0';
		rc = own_opt(a, item);
		if (rc == 2)
			goto out_free;
		if (rc == 0) {
			if (nf)
				fuse[nf++] = ',';
			memcpy(fuse + nf, start, (size_t)(p - start));
			nf += (size_t)(p - start);
		}
		rc = 0;
		if (*p == ',')
			p++;
	}
	fuse[nf] = '\0';
	if (nf) {
		if (a->cfg.nfuse_opts == MAX_FUSE_OPTS) {
			rc = bad_usage("more than 64 -o options%s", "");
			goto out_free;
		}
		a->owned[a->nowned++] = fuse;
		a->fuse_opts[a->cfg.nfuse_opts++] = fuse;
		fuse = NULL;
	}
out_free:
	free(item);
	free(fuse);
	return rc;
}

/*
 * MPI mode, after option parsing. a->cfg holds the parsed options with
 * store, mountpoint and log file still as patterns. Returns the exit
 * status.
 */
static int run_mpi(int *argc, char ***argv, struct args *a)
{
	char store[PATH_MAX], mnt[PATH_MAX], logf[PATH_MAX], *store_abs;
	struct sf_fs_config *cfg = &a->cfg;
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
	sf_log_setup(NULL, a->level); /* keep the "[rank R]" prefix */
	if (a->log_file) {
		/* A rank that cannot open its log file logs to stderr: failing
		 * alone here would leave the others in the collective start. */
		ret = sf_cluster_mpi_expand(a->log_file, sf_mpi_rank(mp), logf,
					    sizeof(logf));
		if (!ret)
			ret = sf_log_to_file(logf);
		if (ret)
			sf_err("cannot open the log file %s: %s; logging to stderr",
			       a->log_file, sf_strerror(ret));
	}
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
	if (a->peer_timeout_ms)
		sf_mpi_set_read_timeout(mp, a->peer_timeout_ms);
	ret = sf_cluster_mpi_create(mp, single, a->commit_timeout_ms, &cl);
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

/* SIGHUP with --log-file: reopen it (logrotate's postrotate). */
static void on_sighup(int sig)
{
	int e = errno;

	(void)sig;
	(void)sf_log_reopen();
	errno = e;
}

/*
 * Parse argv into a. Options may come before, between and after the two
 * paths (`shardfs STORE DIR -o ro` is how mount.fuse3 calls it); after
 * "--" everything is a path. Returns -1 to go on, else the exit status.
 */
static int parse_args(int argc, char **argv, struct args *a)
{
	enum { OPT_NO_VERIFY = 256, OPT_CACHE_MB, OPT_LOG_LEVEL, OPT_LOG_FILE,
	       OPT_NONEMPTY, OPT_MPI, OPT_COMMIT_TIMEOUT, OPT_PEER_TIMEOUT,
	       OPT_NO_DEFAULT_PERMS, OPT_DIRECT_IO, OPT_OPEN_WAIT, OPT_TRANSPORT };
	static const struct option longopts[] = {
		{ "no-verify", no_argument, NULL, OPT_NO_VERIFY },
		{ "cache-mb", required_argument, NULL, OPT_CACHE_MB },
		{ "log-level", required_argument, NULL, OPT_LOG_LEVEL },
		{ "log-file", required_argument, NULL, OPT_LOG_FILE },
		{ "nonempty", no_argument, NULL, OPT_NONEMPTY },
		{ "mpi", no_argument, NULL, OPT_MPI },
		{ "commit-timeout", required_argument, NULL, OPT_COMMIT_TIMEOUT },
		{ "peer-timeout", required_argument, NULL, OPT_PEER_TIMEOUT },
		{ "no-default-permissions", no_argument, NULL, OPT_NO_DEFAULT_PERMS },
		{ "direct-io", no_argument, NULL, OPT_DIRECT_IO },
		{ "open-wait", required_argument, NULL, OPT_OPEN_WAIT },
		{ "transport", required_argument, NULL, OPT_TRANSPORT },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'V' },
		{ NULL, 0, NULL, 0 },
	};
	int c, rc;

	/* '-': paths come back as option 1, in order, wherever they are */
	while ((c = getopt_long(argc, argv, "-fdso:hV", longopts, NULL)) != -1) {
		switch (c) {
		case 1:
			if (a->npos == 2)
				return bad_usage("one STORE and one MOUNTPOINT, then '%s'?",
						 optarg);
			a->pos[a->npos++] = optarg;
			break;
		case 'f':
			a->cfg.foreground = true;
			break;
		case 'd':
			a->cfg.debug = true;
			a->cfg.foreground = true;
			break;
		case 's':
			a->cfg.single_thread = true;
			break;
		case 'o':
			rc = add_o(a, optarg);
			if (rc)
				return rc;
			break;
		case OPT_NO_VERIFY:
			a->cfg.engine.verify = false;
			break;
		case OPT_CACHE_MB:
			if (set_cache_mb(a, optarg))
				return 2;
			break;
		case OPT_LOG_LEVEL:
			if (set_level(a, optarg))
				return 2;
			break;
		case OPT_LOG_FILE:
			a->log_file = optarg;
			break;
		case OPT_NONEMPTY:
			a->cfg.nonempty = true;
			break;
		case OPT_MPI:
			a->mpi = true;
			break;
		case OPT_NO_DEFAULT_PERMS:
			a->cfg.no_default_permissions = true;
			break;
		case OPT_DIRECT_IO:
			a->cfg.direct_io = true;
			break;
		case OPT_OPEN_WAIT:
			if (set_open_wait(a, optarg))
				return 2;
			break;
		case OPT_TRANSPORT:
			if (set_transport(a, optarg))
				return 2;
			break;
		case OPT_COMMIT_TIMEOUT:
			if (parse_seconds(optarg, &a->commit_timeout_ms))
				return bad_usage("--commit-timeout wants whole seconds from 1 to 86400, not '%s'",
						 optarg);
			break;
		case OPT_PEER_TIMEOUT:
			if (parse_seconds(optarg, &a->peer_timeout_ms))
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
	for (; optind < argc; optind++) { /* after "--" */
		if (a->npos == 2)
			return bad_usage("one STORE and one MOUNTPOINT, then '%s'?",
					 argv[optind]);
		a->pos[a->npos++] = argv[optind];
	}
	if (a->npos != 2) {
		usage(stderr);
		return 2;
	}
	return -1;
}

/*
 * Where the log goes: --log-file (reopened on SIGHUP), else syslog when
 * the daemon will detach from the terminal, else stderr. MPI mode (always
 * in the foreground) opens its file itself, after %r expansion. Returns
 * -1 to go on, else the exit status.
 */
static int setup_log(struct args *a)
{
	struct sigaction sa;
	int rc;

	sf_log_setup("shardfs: ", a->level);
	if (a->mpi)
		return -1;
	if (!a->log_file) {
		if (!a->cfg.foreground)
			sf_log_to_syslog("shardfs");
		return -1;
	}
	rc = sf_log_to_file(a->log_file);
	if (rc) {
		fprintf(stderr, "shardfs: cannot open the log file %s: %s\n",
			a->log_file, sf_strerror(rc));
		return 1;
	}
	/* Installed before libfuse's handlers, which then leave SIGHUP
	 * alone: with a log file it reopens the file instead of unmounting. */
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_sighup;
	sa.sa_flags = SA_RESTART;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGHUP, &sa, NULL);
	return -1;
}

int main(int argc, char **argv)
{
	struct args a;
	int rc;

	memset(&a, 0, sizeof(a));
	a.cfg.fuse_opts = a.fuse_opts;
	a.cfg.engine.verify = true;
	a.cfg.open_wait_ms = SF_FS_OPEN_WAIT_MS;
	a.level = SF_LOG_WARN;
	a.mb = 32;
	a.commit_timeout_ms = DEFAULT_COMMIT_TIMEOUT_S * 1000;
	rc = parse_args(argc, argv, &a);
	if (rc >= 0)
		goto out_free;
	a.cfg.store = a.pos[0];
	a.cfg.mountpoint = a.pos[1];
	a.cfg.engine.cache_bytes = (uint64_t)a.mb << 20;

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
	rc = setup_log(&a);
	if (rc >= 0)
		goto out_free;
	if (a.mpi) {
		/* A window of 32 MiB, not the engine's 128: a remote shard's
		 * hints become requests to its peer (prefetch slots), and the
		 * wider window made remote-heavy reads slower (bench_mpi.sh:
		 * 0.75-0.80x of a single process against 0.81-0.82x); the
		 * page cache's read-ahead of local files is what gains from
		 * 128 (cold reads). */
		a.cfg.engine.readahead_bytes = 32ull << 20;
		rc = run_mpi(&argc, &argv, &a);
	} else {
		rc = sf_fs_run(&a.cfg) ? 1 : 0;
	}
out_free:
	args_free(&a);
	return rc;
}
