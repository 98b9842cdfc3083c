/*
 * sf_cluster_mpi.c - MPI mode of the shardfs daemon: implements the
 * struct sf_fs_cluster that fs/ calls with the peer layer of mpi/.
 *
 *   source       sf_mpi_source(): local pread, else the peer holding the file
 *   commit       sf_mpi_commit(): every rank sends its part to rank 0, whose
 *                service thread merges them (merge_parts below) and sends
 *                the manifest back to everyone
 *   commit_done  sf_mpi_commit_done(): returns once every rank published
 *   removing     sf_mpi_peers_up(): a committed checkpoint is deleted only
 *                while every rank answers (each holds a copy), else the
 *                user's rm fails with EIO and nothing is deleted anywhere
 *   removed      sf_mpi_notify("removed", ...): each peer deletes its own
 *                copy (on_notice queues the name, rm_main runs
 *                sf_fs_remove), so `shardctl rm` on one rank deletes a
 *                committed checkpoint on every rank
 *   attach       starts / stops rm_main while the daemon serves
 *   union_*      the live union (sf_mpi_union_*): what the peers hold of a
 *                checkpoint now, and a scan asked of every peer before one
 *                is shown
 *
 * Invariants:
 *  - the merge runs on rank 0's service thread, while rank 0's own FUSE
 *    worker waits inside sf_mpi_commit. It reads overlapping shards through
 *    the MPI source: a local file is a pread, a remote one a point-to-point
 *    request answered by the *peer's* service thread, and the source never
 *    sends a request to its own rank, so the merge cannot wait on itself;
 *  - the merge finds the checkpoint's directory under `lock` by name, never
 *    through a pointer into the committing thread's stack: that thread may
 *    time out and return while the merge still runs;
 *  - the merge's temporary struct sf_ckpt_ref is forgotten by the source
 *    before it goes out of scope (the source keys prefetch and stream state
 *    by its address);
 *  - the service thread never waits on the daemon: a delete takes the
 *    daemon's commit_lock, which a commit here holds while it waits for
 *    messages only the service thread delivers. So on_notice only queues
 *    the name (rm_lock is held briefly, never across sf_fs_remove) and one
 *    worker, rm_main, applies the queue in order. The queue is bounded
 *    (SF_CLUSTER_RM_QUEUE; beyond, a removal is dropped with a warning) and
 *    its names are checked and capped (SF_MAX_COMPONENT) before copying;
 *  - rm_main runs only between attach(fs) and attach(NULL): rm_fs is set
 *    before it starts and cleared after it was joined, so it never sees a
 *    freed daemon; notices arriving outside that window are logged only.
 */
#include "sf_cluster_mpi.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "sf_error.h"
#include "sf_log.h"
#include "sf_model.h"
#include "sf_commit.h"
#include "sf_wckpt.h"

#define SF_CLUSTER_RM_QUEUE 64  /* peers' removals waiting for rm_main */

/* A peer's removal waiting to be applied here. */
struct rm_item {
	char *name;                /* owned; checkpoint name, <= SF_MAX_COMPONENT */
	int from_rank;             /* the rank whose user ran `shardctl rm` */
};

struct sf_cluster_mpi {
	struct sf_fs_cluster fs;   /* handed to sf_fs_run; fs.ctx == this */
	struct sf_mpi *mp;         /* borrowed, started */
	int single;                /* STORE is one checkpoint: nothing to commit */
	int commit_timeout_ms;     /* bound on each commit round, > 0 */

	pthread_mutex_t lock;      /* protects commit_name, commit_dir */
	char *commit_name;         /* checkpoint being committed here, or NULL */
	char *commit_dir;          /* its directory in this rank's store */

	pthread_mutex_t rm_lock;   /* protects rm_fs, rm_stop and the queue */
	pthread_cond_t rm_cv;      /* rm_lock: the queue grew or rm_stop set */
	struct sf_fs *rm_fs;       /* rm_lock; borrowed: attached daemon or NULL */
	bool rm_stop;              /* rm_lock: rm_main returns */
	struct rm_item rm_q[SF_CLUSTER_RM_QUEUE]; /* rm_lock: FIFO ring */
	unsigned rm_head, rm_n;    /* rm_lock: first entry, entries queued */
	pthread_t rm_thread;       /* valid while rm_running */
	bool rm_running;           /* only the thread calling attach/destroy */
};

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Fill why with a reason when the layer left it empty. */
static void why_default(char *why, size_t whylen, int ret)
{
	if (whylen && !why[0])
		snprintf(why, whylen, "%s", sf_strerror(ret));
}

/*
 * sf_merge_fn, on rank 0's service thread: merge the parts of all ranks
 * with sf_commit_merge, reading overlapping shards through the MPI source.
 */
static int merge_parts(void *arg, const char *ckpt, const char *const *parts,
		       const size_t *lens, int nparts, char **out,
		       size_t *outlen, char *err, size_t errlen)
{
	struct sf_cluster_mpi *c = arg;
	struct sf_source *src = sf_mpi_source(c->mp);
	struct sf_ckpt_ref ref = { 0 };
	double t0 = now_s();
	char *dir = NULL;
	int ret;

	pthread_mutex_lock(&c->lock);
	if (c->commit_name && strcmp(c->commit_name, ckpt) == 0)
		dir = strdup(c->commit_dir);
	pthread_mutex_unlock(&c->lock);
	if (!dir) {
		snprintf(err, errlen, "rank 0 is no longer committing %s", ckpt);
		return -SF_EPEER;
	}
	ref.dir = dir;
	ref.name = ckpt;
	ret = sf_commit_merge(ckpt, parts, lens, nparts, src, &ref, out,
			      outlen, err, errlen);
	free(dir);
	if (ret >= 0)
		sf_info("mpi: merged %d parts of %s in %.3f s (%zu-byte manifest)",
			nparts, ckpt, now_s() - t0, *outlen);
	return ret;
}

static void commit_register(struct sf_cluster_mpi *c, char *name, char *dir)
{
	pthread_mutex_lock(&c->lock);
	free(c->commit_name);
	free(c->commit_dir);
	c->commit_name = name;
	c->commit_dir = dir;
	pthread_mutex_unlock(&c->lock);
}

static int cl_commit(void *ctx, const char *name, const char *ckpt_dir,
		     const char *part, size_t partlen, char **manifest,
		     size_t *mlen, char *why, size_t whylen)
{
	struct sf_cluster_mpi *c = ctx;
	double t0 = now_s();
	char *n, *d;
	int ret;

	if (whylen)
		why[0] = '\0';
	if (c->single) {
		snprintf(why, whylen, "STORE is one committed checkpoint");
		return -EROFS;
	}
	n = strdup(name);
	d = strdup(ckpt_dir);
	if (!n || !d) {
		free(n);
		free(d);
		snprintf(why, whylen, "out of memory");
		return -ENOMEM;
	}
	commit_register(c, n, d);
	sf_info("mpi: committing %s (%zu-byte part, timeout %d ms)", name,
		partlen, c->commit_timeout_ms);
	ret = sf_mpi_commit(c->mp, name, part, partlen, merge_parts, c,
			    c->commit_timeout_ms, manifest, mlen, why, whylen);
	commit_register(c, NULL, NULL);
	if (ret < 0)
		why_default(why, whylen, ret);
	else
		sf_info("mpi: %s: merged manifest received after %.3f s", name,
			now_s() - t0);
	return ret;
}

static int cl_commit_done(void *ctx, const char *name, int publish_rc,
			  char *why, size_t whylen)
{
	struct sf_cluster_mpi *c = ctx;
	int ret;

	if (whylen)
		why[0] = '\0';
	ret = sf_mpi_commit_done(c->mp, name, publish_rc, c->commit_timeout_ms,
				 why, whylen);
	if (ret < 0)
		why_default(why, whylen, ret);
	else
		sf_info("mpi: %s committed on every rank", name);
	return ret;
}

/* Before a user's rm of a committed checkpoint: every rank committed it and
 * holds its manifest, so every rank must be up to delete its copy. Deleting
 * the live ranks' copies while a dead rank keeps its own would bring the
 * checkpoint back, half-present, when that node restarts: refuse instead
 * (bounded by the peer timeout; a rank marked down answers a quick probe
 * or fails it at once). */
static int cl_removing(void *ctx, const char *name, char *why, size_t whylen)
{
	struct sf_cluster_mpi *c = ctx;
	char err[256];
	int ret;

	if (whylen)
		why[0] = '\0';
	ret = sf_mpi_peers_up(c->mp, err, sizeof(err));
	if (ret < 0)
		snprintf(why, whylen, "%s: every rank holds a copy of %s, so every "
			 "rank must be up to delete it; rm it again once they are",
			 err, name);
	return ret;
}

static void cl_removed(void *ctx, const char *name)
{
	struct sf_cluster_mpi *c = ctx;
	int ret = sf_mpi_notify(c->mp, "removed", name);

	if (ret < 0)
		sf_warn("mpi: cannot tell the peers that %s was removed: %s",
			name, sf_strerror(ret));
}

/* rm_main: apply one peer's removal to this rank's store. */
static void rm_apply(struct sf_fs *fs, const struct rm_item *it)
{
	int ret = sf_fs_remove(fs, it->name);

	if (ret == 0)
		sf_info("mpi: %s: removed here too (rank %d removed it)", it->name,
			it->from_rank);
	else if (ret == -ENOENT)
		sf_info("mpi: %s: rank %d removed it; no copy here (removed already?)",
			it->name, it->from_rank);
	else
		sf_warn("mpi: %s: rank %d removed it, but this rank keeps its copy: %s",
			it->name, it->from_rank, sf_strerror(ret));
}

/* The one worker that applies peers' removals, in arrival order. */
static void *rm_main(void *arg)
{
	struct sf_cluster_mpi *c = arg;
	struct rm_item it;
	struct sf_fs *fs;

	pthread_mutex_lock(&c->rm_lock);
	for (;;) {
		while (!c->rm_stop && c->rm_n == 0)
			pthread_cond_wait(&c->rm_cv, &c->rm_lock);
		if (c->rm_stop)
			break;
		it = c->rm_q[c->rm_head];
		c->rm_head = (c->rm_head + 1) % SF_CLUSTER_RM_QUEUE;
		c->rm_n--;
		fs = c->rm_fs; /* stable until this thread was joined */
		pthread_mutex_unlock(&c->rm_lock);
		rm_apply(fs, &it);
		free(it.name);
		pthread_mutex_lock(&c->rm_lock);
	}
	pthread_mutex_unlock(&c->rm_lock);
	return NULL;
}

/* Service thread: queue peer from_rank's removal of ckpt; never waits on
 * anything but rm_lock. */
static void rm_enqueue(struct sf_cluster_mpi *c, int from_rank,
		       const char *ckpt)
{
	size_t len = strnlen(ckpt, SF_MAX_COMPONENT + 1);
	const char *why = NULL;
	char *name = NULL;

	if (len == 0 || len > SF_MAX_COMPONENT) {
		sf_warn("mpi: rank %d: removal notice with a bad name ignored",
			from_rank);
		return;
	}
	pthread_mutex_lock(&c->rm_lock);
	if (!c->rm_fs || c->rm_stop)
		why = "this daemon is not serving";
	else if (c->rm_n == SF_CLUSTER_RM_QUEUE)
		why = "too many removals queued";
	else if (!(name = strndup(ckpt, len)))
		why = "out of memory";
	if (!why) {
		c->rm_q[(c->rm_head + c->rm_n) % SF_CLUSTER_RM_QUEUE] =
			(struct rm_item){ .name = name, .from_rank = from_rank };
		c->rm_n++;
		pthread_cond_signal(&c->rm_cv);
	}
	pthread_mutex_unlock(&c->rm_lock);
	if (why)
		sf_warn("mpi: %.*s: rank %d removed it, but this rank keeps its copy: %s",
			(int)len, ckpt, from_rank, why);
}

/* Service thread: a peer's notice. "removed" is acted on; anything else
 * (every rank commits its own copy) is only logged. */
static void on_notice(void *arg, int from_rank, const char *what,
		      const char *ckpt)
{
	struct sf_cluster_mpi *c = arg;

	if (strcmp(what, "removed") == 0) {
		rm_enqueue(c, from_rank, ckpt);
		return;
	}
	sf_info("mpi: rank %d: %s %s", from_rank, what, ckpt[0] ? ckpt : "(store)");
}

/* attach(fs): start rm_main. On failure peers' removals are only logged. */
static void rm_worker_start(struct sf_cluster_mpi *c, struct sf_fs *fs)
{
	int ret;

	pthread_mutex_lock(&c->rm_lock);
	c->rm_fs = fs;
	c->rm_stop = false;
	pthread_mutex_unlock(&c->rm_lock);
	ret = pthread_create(&c->rm_thread, NULL, rm_main, c);
	if (ret == 0) {
		c->rm_running = true;
		return;
	}
	sf_err("mpi: cannot start the removal thread: %s; peers' removals will not be applied here",
	       strerror(ret));
	pthread_mutex_lock(&c->rm_lock);
	c->rm_fs = NULL;
	pthread_mutex_unlock(&c->rm_lock);
}

/* attach(NULL) and destroy: stop and join rm_main (after the removal it
 * may be running), then drop what is still queued. */
static void rm_worker_stop(struct sf_cluster_mpi *c)
{
	pthread_mutex_lock(&c->rm_lock);
	c->rm_stop = true;
	pthread_cond_signal(&c->rm_cv);
	pthread_mutex_unlock(&c->rm_lock);
	if (c->rm_running) {
		pthread_join(c->rm_thread, NULL);
		c->rm_running = false;
	}
	pthread_mutex_lock(&c->rm_lock);
	c->rm_fs = NULL;
	for (; c->rm_n > 0; c->rm_n--) {
		struct rm_item *it = &c->rm_q[c->rm_head];

		sf_warn("mpi: %s: rank %d removed it, but this daemon stopped before removing its copy",
			it->name, it->from_rank);
		free(it->name);
		c->rm_head = (c->rm_head + 1) % SF_CLUSTER_RM_QUEUE;
	}
	pthread_mutex_unlock(&c->rm_lock);
}

static int cl_union_state(void *ctx, const char *name, uint64_t *stamp,
			  int *held)
{
	struct sf_cluster_mpi *c = ctx;

	return sf_mpi_union_state(c->mp, name, stamp, held);
}

static const char *cl_host(void *ctx, uint32_t rank)
{
	struct sf_cluster_mpi *c = ctx;

	return sf_mpi_host(c->mp, (int)rank);
}

static uint64_t cl_union_sync(void *ctx)
{
	struct sf_cluster_mpi *c = ctx;

	return sf_mpi_union_sync(c->mp);
}

static int cl_union_synced(void *ctx, uint64_t seq)
{
	struct sf_cluster_mpi *c = ctx;

	return sf_mpi_union_synced(c->mp, seq);
}

static void cl_attach(void *ctx, struct sf_fs *fs)
{
	struct sf_cluster_mpi *c = ctx;

	if (fs)
		rm_worker_start(c, fs);
	else
		rm_worker_stop(c);
}

int sf_cluster_mpi_create(struct sf_mpi *mp, int single, int commit_timeout_ms,
			  struct sf_cluster_mpi **out)
{
	struct sf_cluster_mpi *c;
	struct sf_source *src;

	if (!mp || commit_timeout_ms <= 0)
		return -EINVAL;
	src = sf_mpi_source(mp);
	if (!src)
		return -SF_ENOMPI;
	c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	pthread_mutex_init(&c->lock, NULL);
	pthread_mutex_init(&c->rm_lock, NULL);
	pthread_cond_init(&c->rm_cv, NULL);
	c->mp = mp;
	c->single = single ? 1 : 0;
	c->commit_timeout_ms = commit_timeout_ms;
	c->fs.rank = (uint32_t)sf_mpi_rank(mp);
	c->fs.world_size = (uint32_t)sf_mpi_size(mp);
	c->fs.ctx = c;
	c->fs.source = src;
	c->fs.store_single = c->single;
	c->fs.commit = cl_commit;
	c->fs.commit_done = cl_commit_done;
	c->fs.removing = cl_removing;
	c->fs.removed = cl_removed;
	c->fs.attach = cl_attach;
	c->fs.host = cl_host;
	if (!c->single) {
		c->fs.union_state = cl_union_state;
		c->fs.union_sync = cl_union_sync;
		c->fs.union_synced = cl_union_synced;
	}
	/* No shutdown hook: sf_mpi_finalize frees the source fs/ still holds,
	 * so the executable calls it after sf_fs_run returned; the service
	 * thread goes on answering peers meanwhile. */
	c->fs.shutdown = NULL;
	sf_mpi_set_notice(mp, on_notice, c);
	*out = c;
	return 0;
}

void sf_cluster_mpi_destroy(struct sf_cluster_mpi *c)
{
	if (!c)
		return;
	rm_worker_stop(c); /* sf_fs_run detached already; this only drains */
	free(c->commit_name);
	free(c->commit_dir);
	pthread_cond_destroy(&c->rm_cv);
	pthread_mutex_destroy(&c->rm_lock);
	pthread_mutex_destroy(&c->lock);
	free(c);
}

struct sf_fs_cluster *sf_cluster_mpi_fs(struct sf_cluster_mpi *c)
{
	return &c->fs;
}

int sf_cluster_mpi_expand(const char *pattern, int rank, char *out,
			  size_t outlen)
{
	char num[16];
	size_t pos = 0, nl;
	const char *p;

	nl = (size_t)snprintf(num, sizeof(num), "%d", rank);
	if (!outlen)
		return -ENAMETOOLONG;
	for (p = pattern; *p; p++) {
		const char *add = p;
		size_t n = 1;

		if (p[0] == '%' && p[1] == 'r') {
			add = num;
			n = nl;
			p++;
		} else if (p[0] == '%' && p[1] == '%') {
			p++;
		}
		if (n >= outlen - pos)
			return -ENAMETOOLONG;
		memcpy(out + pos, add, n);
		pos += n;
	}
	out[pos] = '\0';
	return 0;
}
