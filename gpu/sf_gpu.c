/*
 * sf_gpu.c - the CUDA loader (see sf_gpu.h): plain C on the CUDA runtime.
 *
 * Pipeline of one load. The calling ("main") thread walks the pieces to
 * load (one per result, or one per safetensors data section), cuts them into
 * chunks of at most staging_bytes and hands chunk k to staging slot
 * k % depth: it first waits on the slot's event (the slot's previous H2D copy
 * is done, so its pinned buffer is free), fills in the chunk and queues the
 * slot for the reader threads. A reader pread()s the chunk into the slot's
 * pinned buffer and marks it DONE. The main thread takes slots back in chunk
 * order, issues cudaMemcpyAsync on the slot's stream and records the slot's
 * event. So at most `depth` chunks are in flight, reads run in parallel on
 * the reader pool, and copies of chunk k overlap the reads of chunk k+1...
 *
 * Invariants:
 *  - Only the main thread makes CUDA calls; readers touch only their slot's
 *    host buffer, file and result fields, and hand slots over under l->mu.
 *  - A slot is QUEUED from queueing until its reader sets DONE; the main
 *    thread never touches its chunk fields in between. A load never returns
 *    with a slot QUEUED or a copy pending (errors drain first).
 *  - Results are appended only when the whole load succeeded; a failed load
 *    frees the device memory it allocated and closes its files.
 *  - The direct path (sf_gpu_direct.c): a chunk read from a store file
 *    carries its blocks' XXH3; its reader checks every block before the
 *    slot is DONE, and on a failed read or check reads the same bytes
 *    again through the mount (which verifies them too: EIO when the store
 *    is corrupt). So a chunk is copied to the device only once its bytes
 *    were checked here or served by the mount.
 */
#include "sf_gpu.h"

#include <cuda_runtime_api.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "sf_array.h"
#include "sf_error.h"
#include "sf_gpu_direct.h"
#include "sf_model.h"
#include "sf_st_header.h"

#define SF_GPU_ALIGN 256u /* packing alignment inside a PER_FILE allocation */

enum slot_state { SLOT_IDLE, SLOT_QUEUED, SLOT_DONE };

struct slot {
	void *host;             /* pinned, staging_bytes; owned */
	cudaStream_t stream;    /* main thread only */
	cudaEvent_t copied;     /* recorded after this slot's H2D copy */
	bool copy_pending;      /* main thread only: `copied` not yet waited */
	/* chunk: written by the main thread while IDLE, read by one reader
	 * while QUEUED */
	int fd;
	const char *path;       /* borrowed from the load's piece */
	uint64_t file_off;      /* bytes */
	size_t len;             /* bytes, <= staging_bytes */
	char *dst;              /* device destination */
	const uint64_t *sums;   /* direct: XXH3 of its blocks of bs bytes */
	uint64_t bs;
	int mfd;                /* direct: the same bytes through the mount */
	const char *mpath;
	uint64_t moff;
	uint64_t lo, run, pitch; /* direct from a spread shard (see piece) */
	bool reread;            /* its reader read it again through the mount */
	enum slot_state state;  /* l->mu */
	int rc;                 /* l->mu: reader's result, valid when DONE */
};

/* One contiguous file range going to one contiguous device range. A
 * direct piece (sums set) is a run of whole blocks of a store file, at
 * most one staging buffer, with where its bytes lie in the mount. */
struct piece {
	int fd;                 /* borrowed from the job */
	const char *path;
	uint64_t off, len;      /* bytes */
	char *dst;
	bool whole;             /* the whole file (a tensor file may be direct) */
	const uint64_t *sums;   /* direct: borrowed from the job's gd */
	uint64_t bs;
	int mfd;
	const char *mpath;
	uint64_t moff;          /* the mount's offset of dst's first byte */
	/* a spread shard (run > 0): these are its bytes [lo, lo + len), its
	 * byte x going to dst + (x / run) * pitch + x % run (and lying at that
	 * offset from moff in the mount); run 0: one run at dst */
	uint64_t lo, run, pitch;
};

struct sf_gpu_loader {
	int device;
	size_t staging;         /* bytes per slot, <= SF_GPU_MAX_STAGING */
	unsigned depth;         /* slots, <= SF_GPU_MAX_DEPTH */
	unsigned nreaders;      /* <= SF_GPU_MAX_READERS */
	struct slot *slots;     /* [depth] */

	pthread_mutex_t mu;
	pthread_cond_t work_cv; /* queue non-empty, or stop */
	pthread_cond_t done_cv; /* some slot became DONE */
	unsigned queue[SF_GPU_MAX_DEPTH]; /* mu: ring of queued slot indices */
	unsigned qhead, qlen;   /* mu; qlen <= depth */
	bool stop;              /* mu: readers exit */
	uint64_t read_ns;       /* mu: summed pread time of the current load */
	uint64_t direct_bytes, mount_bytes, rereads; /* mu: of the current load */
	bool direct;            /* take the direct path where offered */
	pthread_t readers[SF_GPU_MAX_READERS];
	unsigned nstarted;      /* readers running */
	bool sync_ready;        /* mu, cvs initialized */

	/* results (main thread): records, names and paths owned */
	struct sf_gpu_tensor *res;
	size_t nres, cap_res;
	void **allocs;          /* device allocations, cudaFree'd on destroy */
	size_t nallocs, cap_allocs;

	char errbuf[SF_GPU_ERRLEN];
};

static int set_err(struct sf_gpu_loader *l, int rc, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static int set_err(struct sf_gpu_loader *l, int rc, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(l->errbuf, sizeof(l->errbuf), fmt, ap);
	va_end(ap);
	return rc;
}

/* Check a CUDA result: 0, or -SF_ECUDA with "what: cuda error" kept. */
static int ck(struct sf_gpu_loader *l, cudaError_t e, const char *what)
{
	if (e == cudaSuccess)
		return 0;
	return set_err(l, -SF_ECUDA, "%s: %s", what, cudaGetErrorString(e));
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* pread exactly len bytes: 0, -errno, or -SF_ESHORT at end of file. */
static int read_full(int fd, void *buf, size_t len, uint64_t off)
{
	size_t got = 0;
	ssize_t r;

	while (got < len) {
		r = pread(fd, (char *)buf + got, len - got, (off_t)(off + got));
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return -errno;
		if (r == 0)
			return -SF_ESHORT;
		got += (size_t)r;
	}
	return 0;
}

/* Read a spread shard's bytes [lo, lo + len) through fd, whose byte base
 * is the shard's first (sf_gpu_direct.h): row part by row part. */
static int read_rows(int fd, char *buf, uint64_t lo, size_t len, uint64_t run,
		     uint64_t pitch, uint64_t base)
{
	uint64_t x = lo, end = lo + len, n;
	int rc = 0;

	while (!rc && x < end) {
		n = run - x % run < end - x ? run - x % run : end - x;
		rc = read_full(fd, buf + (x - lo), (size_t)n,
			       base + x / run * pitch + x % run);
		x += n;
	}
	return rc;
}

static void *reader_main(void *arg)
{
	struct sf_gpu_loader *l = arg;
	struct slot *s;
	uint64_t t0, t1;
	bool reread;
	int rc;

	pthread_mutex_lock(&l->mu);
	for (;;) {
		while (!l->stop && l->qlen == 0)
			pthread_cond_wait(&l->work_cv, &l->mu);
		if (l->stop)
			break;
		s = &l->slots[l->queue[l->qhead]];
		l->qhead = (l->qhead + 1) % l->depth;
		l->qlen--;
		pthread_mutex_unlock(&l->mu);

		t0 = now_ns();
		rc = read_full(s->fd, s->host, s->len, s->file_off);
		reread = false;
		s->reread = false;
		if (s->sums) {
			if (!rc)
				rc = sf_gd_check(s->host, s->len, s->sums, s->bs);
			if (rc) { /* never the store's bytes unchecked */
				reread = s->reread = true;
				s->fd = s->mfd;
				s->path = s->mpath;
				s->file_off = s->moff;
				rc = s->run ? read_rows(s->fd, s->host, s->lo,
							s->len, s->run, s->pitch,
							s->moff)
					    : read_full(s->fd, s->host, s->len,
							s->file_off);
			}
		}
		t1 = now_ns();

		pthread_mutex_lock(&l->mu);
		l->read_ns += t1 - t0;
		l->rereads += reread;
		if (!rc && s->sums && !reread)
			l->direct_bytes += s->len;
		else if (!rc)
			l->mount_bytes += s->len;
		s->rc = rc;
		s->state = SLOT_DONE;
		pthread_cond_broadcast(&l->done_cv);
	}
	pthread_mutex_unlock(&l->mu);
	return NULL;
}

const char *sf_gpu_last_error(const struct sf_gpu_loader *l)
{
	return l ? l->errbuf : "no loader";
}

void sf_gpu_loader_destroy(struct sf_gpu_loader *l)
{
	size_t i;

	if (!l)
		return;
	if (l->sync_ready) {
		pthread_mutex_lock(&l->mu);
		l->stop = true;
		pthread_cond_broadcast(&l->work_cv);
		pthread_mutex_unlock(&l->mu);
	}
	for (i = 0; i < l->nstarted; i++)
		pthread_join(l->readers[i], NULL);
	/* errors on teardown are not actionable: the context may be gone */
	cudaSetDevice(l->device);
	for (i = 0; i < l->nallocs; i++)
		cudaFree(l->allocs[i]);
	for (i = 0; l->slots && i < l->depth; i++) {
		if (l->slots[i].copied)
			cudaEventDestroy(l->slots[i].copied);
		if (l->slots[i].stream)
			cudaStreamDestroy(l->slots[i].stream);
		if (l->slots[i].host)
			cudaFreeHost(l->slots[i].host);
	}
	for (i = 0; i < l->nres; i++) {
		free((char *)l->res[i].name);
		free((char *)l->res[i].path);
	}
	if (l->sync_ready) {
		pthread_cond_destroy(&l->done_cv);
		pthread_cond_destroy(&l->work_cv);
		pthread_mutex_destroy(&l->mu);
	}
	free(l->res);
	free(l->allocs);
	free(l->slots);
	free(l);
}

int sf_gpu_loader_create(const struct sf_gpu_opts *opts,
			 struct sf_gpu_loader **out, char *err, size_t errlen)
{
	struct sf_gpu_opts o = { 0 };
	struct sf_gpu_loader *l;
	cudaError_t e;
	int count = 0, rc;
	unsigned i;

	*out = NULL;
	if (opts)
		o = *opts;
	if (!o.staging_bytes)
		o.staging_bytes = SF_GPU_DEFAULT_STAGING;
	if (!o.depth)
		o.depth = SF_GPU_DEFAULT_DEPTH;
	if (!o.readers)
		o.readers = o.depth < SF_GPU_MAX_READERS ? o.depth : SF_GPU_MAX_READERS;
	if (o.device < 0 || o.staging_bytes > SF_GPU_MAX_STAGING ||
	    o.depth > SF_GPU_MAX_DEPTH || o.readers > SF_GPU_MAX_READERS) {
		if (err && errlen)
			snprintf(err, errlen,
				 "bad options: device >= 0, staging <= %u MiB, depth <= %u, readers <= %u",
				 SF_GPU_MAX_STAGING >> 20, SF_GPU_MAX_DEPTH,
				 SF_GPU_MAX_READERS);
		return -EINVAL;
	}
	e = cudaGetDeviceCount(&count);
	if (e != cudaSuccess || count <= 0 || o.device >= count) {
		if (err && errlen) {
			if (e != cudaSuccess)
				snprintf(err, errlen, "no CUDA device: %s",
					 cudaGetErrorString(e));
			else
				snprintf(err, errlen,
					 "no CUDA device: device %d asked, %d visible",
					 o.device, count);
		}
		return -SF_ECUDA;
	}

	l = calloc(1, sizeof(*l));
	if (!l)
		return -ENOMEM;
	l->device = o.device;
	l->staging = o.staging_bytes;
	l->depth = o.depth;
	l->nreaders = o.readers;
	l->direct = !o.no_direct;
	rc = ck(l, cudaSetDevice(l->device), "cudaSetDevice");
	if (rc)
		goto out_destroy;
	l->slots = calloc(l->depth, sizeof(*l->slots));
	if (!l->slots) {
		rc = set_err(l, -ENOMEM, "out of memory");
		goto out_destroy;
	}
	for (i = 0; i < l->depth; i++) {
		struct slot *s = &l->slots[i];

		rc = ck(l, cudaMallocHost(&s->host, l->staging), "cudaMallocHost");
		if (!rc)
			rc = ck(l, cudaStreamCreateWithFlags(&s->stream,
							     cudaStreamNonBlocking),
				"cudaStreamCreateWithFlags");
		if (!rc)
			rc = ck(l, cudaEventCreateWithFlags(&s->copied,
							    cudaEventDisableTiming),
				"cudaEventCreateWithFlags");
		if (rc)
			goto out_destroy;
	}
	if (pthread_mutex_init(&l->mu, NULL)) {
		rc = set_err(l, -ENOMEM, "pthread_mutex_init failed");
		goto out_destroy;
	}
	if (pthread_cond_init(&l->work_cv, NULL)) {
		pthread_mutex_destroy(&l->mu);
		rc = set_err(l, -ENOMEM, "pthread_cond_init failed");
		goto out_destroy;
	}
	if (pthread_cond_init(&l->done_cv, NULL)) {
		pthread_cond_destroy(&l->work_cv);
		pthread_mutex_destroy(&l->mu);
		rc = set_err(l, -ENOMEM, "pthread_cond_init failed");
		goto out_destroy;
	}
	l->sync_ready = true;
	for (i = 0; i < l->nreaders; i++) {
		rc = pthread_create(&l->readers[i], NULL, reader_main, l);
		if (rc) {
			rc = set_err(l, -rc, "pthread_create: %s", strerror(rc));
			goto out_destroy;
		}
		l->nstarted++;
	}
	snprintf(l->errbuf, sizeof(l->errbuf), "no error");
	*out = l;
	return 0;

out_destroy:
	if (err && errlen)
		snprintf(err, errlen, "%s", l->errbuf);
	sf_gpu_loader_destroy(l);
	return rc;
}

/* Wait for slot s's previous copy, if any. */
static int slot_wait_copy(struct sf_gpu_loader *l, struct slot *s)
{
	if (!s->copy_pending)
		return 0;
	s->copy_pending = false;
	return ck(l, cudaEventSynchronize(s->copied), "cudaEventSynchronize");
}

/* Queue slot s's H2D copy: one run, or a spread shard's rows (a part
 * row, whole rows in one 2-D copy, a part row). */
static int copy_chunk(struct sf_gpu_loader *l, struct slot *s)
{
	uint64_t x = s->lo, end = s->lo + s->len, n, col;
	const char *h = s->host;
	int rc = 0;

	if (!s->run)
		return ck(l, cudaMemcpyAsync(s->dst, s->host, s->len,
					     cudaMemcpyHostToDevice, s->stream),
			  "cudaMemcpyAsync");
	while (!rc && x < end) {
		char *d = s->dst + x / s->run * s->pitch;

		col = x % s->run;
		if (col || end - x < s->run) {
			n = s->run - col < end - x ? s->run - col : end - x;
			rc = ck(l, cudaMemcpyAsync(d + col, h, (size_t)n,
						   cudaMemcpyHostToDevice,
						   s->stream),
				"cudaMemcpyAsync");
		} else {
			n = (end - x) / s->run * s->run;
			rc = ck(l, cudaMemcpy2DAsync(d, s->pitch, h, s->run,
						     s->run, n / s->run,
						     cudaMemcpyHostToDevice,
						     s->stream),
				"cudaMemcpy2DAsync");
		}
		x += n;
		h += n;
	}
	return rc;
}

/*
 * Run pieces p[0..np) through the pipeline; with copy false, the reads
 * alone. Adds to *st. Drains everything before returning, also on error.
 */
static int pipeline(struct sf_gpu_loader *l, const struct piece *p, size_t np,
		    bool copy, struct sf_gpu_stats *st)
{
	uint64_t issued = 0, taken = 0, at = 0; /* at: offset in p[pi] */
	size_t pi = 0;
	unsigned i;
	int rc = 0, r;

	pthread_mutex_lock(&l->mu);
	l->read_ns = 0;
	l->direct_bytes = l->mount_bytes = l->rereads = 0;
	pthread_mutex_unlock(&l->mu);
	for (;;) {
		while (!rc && issued - taken < l->depth) {
			struct slot *s;
			uint64_t left;

			while (pi < np && at == p[pi].len) {
				pi++;
				at = 0;
			}
			if (pi == np)
				break;
			s = &l->slots[issued % l->depth];
			rc = slot_wait_copy(l, s);
			if (rc)
				break;
			left = p[pi].len - at;
			s->fd = p[pi].fd;
			s->path = p[pi].path;
			s->file_off = p[pi].off + at;
			s->len = left < l->staging ? (size_t)left : l->staging;
			s->dst = p[pi].dst ? p[pi].dst + at : NULL;
			/* a direct piece is one chunk (sf_gd_plan cuts them) */
			s->sums = s->len == left ? p[pi].sums : NULL;
			s->bs = p[pi].bs;
			s->mfd = p[pi].mfd;
			s->mpath = p[pi].mpath;
			s->moff = p[pi].moff;
			s->lo = p[pi].lo;
			s->run = s->sums ? p[pi].run : 0;
			s->pitch = p[pi].pitch;
			if (p[pi].sums && !s->sums) { /* cannot happen: mount */
				s->fd = p[pi].mfd;
				s->path = p[pi].mpath;
				s->file_off = p[pi].moff + at;
			}
			at += s->len;
			pthread_mutex_lock(&l->mu);
			s->state = SLOT_QUEUED;
			l->queue[(l->qhead + l->qlen) % l->depth] =
				(unsigned)(issued % l->depth);
			l->qlen++;
			pthread_cond_signal(&l->work_cv);
			pthread_mutex_unlock(&l->mu);
			issued++;
		}
		if (taken == issued)
			break;

		struct slot *s = &l->slots[taken % l->depth];

		pthread_mutex_lock(&l->mu);
		while (s->state != SLOT_DONE)
			pthread_cond_wait(&l->done_cv, &l->mu);
		s->state = SLOT_IDLE;
		r = s->rc;
		pthread_mutex_unlock(&l->mu);
		taken++;
		if (rc)
			continue; /* draining after an error */
		if (r) {
			rc = set_err(l, r, "read %s at %" PRIu64 " (%zu bytes): %s%s",
				     s->path, s->file_off, s->len,
				     sf_strerror(r),
				     s->reread ? " (the store file's copy failed its"
						 " check: read again through the mount)"
					       : "");
			continue;
		}
		if (copy && s->len) {
			rc = copy_chunk(l, s);
			if (!rc)
				rc = ck(l, cudaEventRecord(s->copied, s->stream),
					"cudaEventRecord");
			if (!rc)
				s->copy_pending = true;
		}
		st->bytes += s->len;
		st->chunks++;
	}
	/* drain every stream, not only recorded events: after a failed
	 * cudaEventRecord a queued copy has no event, and the caller may free
	 * its destination as soon as we return */
	for (i = 0; i < l->depth; i++) {
		l->slots[i].copy_pending = false;
		r = ck(l, cudaStreamSynchronize(l->slots[i].stream),
		       "cudaStreamSynchronize");
		if (!rc)
			rc = r;
	}
	pthread_mutex_lock(&l->mu);
	st->read_busy_s += (double)l->read_ns * 1e-9;
	st->direct_bytes += l->direct_bytes;
	st->mount_bytes += l->mount_bytes;
	st->rereads += l->rereads;
	pthread_mutex_unlock(&l->mu);
	return rc;
}

/* A load in preparation: its files, pieces, allocations and results. */
struct job {
	int *fds;               /* [nfds] open files, closed by job_end */
	size_t nfds;
	struct piece *pieces;   /* [npieces] of cap_pieces */
	size_t npieces, cap_pieces;
	struct sf_gd gd;        /* the direct path's files and checksums */
	void **allocs;          /* [nallocs] device memory, freed on failure */
	size_t nallocs;
	struct sf_gpu_tensor *res; /* [nres] pending results, names owned */
	size_t nres;
};

/* Room for n files, pieces, allocations and results. */
static int job_init(struct sf_gpu_loader *l, struct job *j, size_t n)
{
	memset(j, 0, sizeof(*j));
	sf_gd_init(&j->gd, l->staging);
	if (n > SF_GPU_MAX_RANGES)
		return set_err(l, -SF_ETOOBIG, "%zu ranges (max %u)", n,
			       SF_GPU_MAX_RANGES);
	if (!n)
		n = 1;
	j->fds = calloc(n, sizeof(*j->fds));
	j->pieces = calloc(n, sizeof(*j->pieces));
	j->allocs = calloc(n, sizeof(*j->allocs));
	j->res = calloc(n, sizeof(*j->res));
	if (!j->fds || !j->pieces || !j->allocs || !j->res)
		return set_err(l, -ENOMEM, "out of memory");
	j->cap_pieces = n;
	return 0;
}

/* Open path read-only into the job; the fd, or a negative error. */
static int job_open(struct sf_gpu_loader *l, struct job *j, const char *path,
		    uint64_t *size)
{
	struct stat sb;
	int fd;

	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return set_err(l, -errno, "open %s: %s", path, strerror(errno));
	j->fds[j->nfds++] = fd;
	if (fstat(fd, &sb))
		return set_err(l, -errno, "fstat %s: %s", path, strerror(errno));
	*size = (uint64_t)sb.st_size;
	return fd;
}

static int job_alloc(struct sf_gpu_loader *l, struct job *j, uint64_t bytes,
		     char **dev)
{
	void *p = NULL;
	int rc;

	*dev = NULL;
	if (!bytes)
		return 0;
	if (bytes > SIZE_MAX)
		return set_err(l, -SF_ETOOBIG, "allocation of %" PRIu64 " bytes",
			       bytes);
	rc = ck(l, cudaMalloc(&p, (size_t)bytes), "cudaMalloc");
	if (rc)
		return rc;
	j->allocs[j->nallocs++] = p;
	*dev = p;
	return 0;
}

/* Append a pending result (name and path copied). */
static int job_result(struct sf_gpu_loader *l, struct job *j,
		      const char *name, const char *path, uint64_t off,
		      uint64_t len, char *dev, struct sf_gpu_tensor **out)
{
	struct sf_gpu_tensor *t = &j->res[j->nres];

	memset(t, 0, sizeof(*t));
	t->name = strdup(name);
	t->path = strdup(path);
	if (!t->name || !t->path) {
		free((char *)t->name);
		free((char *)t->path);
		return set_err(l, -ENOMEM, "out of memory");
	}
	j->nres++;
	t->dtype = SF_DT_U8;
	t->ndim = 1;
	t->shape[0] = len;
	t->dev = dev;
	t->nbytes = len;
	t->file_offset = off;
	*out = t;
	return 0;
}

/* Append piece p; a plain one that continues the last (file and device)
 * joins it. */
static int job_add(struct sf_gpu_loader *l, struct job *j, struct piece p)
{
	struct piece *q = j->npieces ? &j->pieces[j->npieces - 1] : NULL;

	if (q && !p.sums && !q->sums && !p.whole && !q->whole && q->fd == p.fd &&
	    q->off + q->len == p.off && q->dst && q->dst + q->len == p.dst) {
		q->len += p.len;
		return 0;
	}
	if (sf_array_grow(&j->pieces, j->npieces, &j->cap_pieces,
			  sizeof(*j->pieces), 16, 0))
		return set_err(l, -ENOMEM, "out of memory");
	j->pieces[j->npieces++] = p;
	return 0;
}

static int job_piece(struct sf_gpu_loader *l, struct job *j, int fd,
		     const char *path, uint64_t off, uint64_t len, char *dst)
{
	return job_add(l, j, (struct piece){ .fd = fd, .path = path, .off = off,
					     .len = len, .dst = dst });
}

/*
 * The pieces of one tensor: its bytes lie at moff in mfd (mpath, a file
 * of the mount) and go to dst. With the direct path on and tpath (its
 * tensor file) given, what the mount offers is read from the store
 * files and checked, the rest through mfd.
 */
static int job_tensor(struct sf_gpu_loader *l, struct job *j, int mfd,
		      const char *mpath, uint64_t moff, uint64_t len,
		      char *dst, const char *tpath, unsigned ndim,
		      const uint64_t *shape)
{
	int rc;

	if (!l->direct || !tpath || !dst || j->gd.off)
		return job_piece(l, j, mfd, mpath, moff, len, dst);
	rc = sf_gd_plan(&j->gd, tpath, ndim, shape, len);
	if (rc)
		return set_err(l, rc, "%s: planning the direct path: %s", tpath,
			       sf_strerror(rc));
	for (size_t i = 0; i < j->gd.nseg && !rc; i++) {
		const struct sf_gd_seg *g = &j->gd.seg[i];

		if (g->fd < 0)
			rc = job_piece(l, j, mfd, mpath, moff + g->toff, g->len,
				       dst + g->toff);
		else
			rc = job_add(l, j, (struct piece){
				.fd = g->fd, .path = g->path, .off = g->off,
				.len = g->len, .dst = dst + g->toff,
				.sums = g->sums, .bs = g->bs, .mfd = mfd,
				.mpath = mpath, .moff = moff + g->toff,
				.lo = g->lo, .run = g->run, .pitch = g->pitch });
	}
	return rc;
}

/*
 * Finish a job: on success (rc >= 0) move its results and allocations into
 * the loader and return the number of results; else free them and return rc.
 */
static int job_end(struct sf_gpu_loader *l, struct job *j, int rc)
{
	size_t i, need;
	int grc = 0;

	if (rc >= 0) {
		/* room for every result and allocation of the job: each
		 * sf_array_grow with n == cap doubles the capacity */
		need = l->nres + j->nres;
		while (l->cap_res < need && !grc)
			grc = sf_array_grow(&l->res, l->cap_res, &l->cap_res,
					    sizeof(*l->res), 16, 0);
		need = l->nallocs + j->nallocs;
		while (l->cap_allocs < need && !grc)
			grc = sf_array_grow(&l->allocs, l->cap_allocs,
					    &l->cap_allocs, sizeof(*l->allocs), 16, 0);
		if (grc) {
			rc = set_err(l, grc, "out of memory");
			goto out_release;
		}
		memcpy(l->res + l->nres, j->res, j->nres * sizeof(*j->res));
		l->nres += j->nres;
		memcpy(l->allocs + l->nallocs, j->allocs,
		       j->nallocs * sizeof(*j->allocs));
		l->nallocs += j->nallocs;
		rc = (int)j->nres;
		j->nres = 0;
		j->nallocs = 0;
	}
out_release:
	for (i = 0; i < j->nallocs; i++)
		cudaFree(j->allocs[i]);
	for (i = 0; i < j->nres; i++) {
		free((char *)j->res[i].name);
		free((char *)j->res[i].path);
	}
	for (i = 0; i < j->nfds; i++)
		close(j->fds[i]);
	sf_gd_end(&j->gd);
	free(j->fds);
	free(j->pieces);
	free(j->allocs);
	free(j->res);
	return rc;
}

static uint64_t align_up(uint64_t x)
{
	return (x + SF_GPU_ALIGN - 1) / SF_GPU_ALIGN * SF_GPU_ALIGN;
}

/* Open the files of r[], resolve lengths and plan pieces (dst unset). */
static int plan_ranges(struct sf_gpu_loader *l, struct job *j,
		       const struct sf_gpu_range *r, size_t n)
{
	uint64_t size = 0, len;
	int fd = -1, rc;
	size_t i;

	for (i = 0; i < n; i++) {
		if (!r[i].path)
			return set_err(l, -EINVAL, "range %zu has no path", i);
		if (i == 0 || strcmp(r[i].path, r[i - 1].path)) {
			fd = job_open(l, j, r[i].path, &size);
			if (fd < 0)
				return fd;
		}
		if (r[i].offset > size)
			return set_err(l, -SF_ERANGE,
				       "%s: offset %" PRIu64 " past the end (%" PRIu64 " bytes)",
				       r[i].path, r[i].offset, size);
		len = r[i].length == SF_GPU_TO_EOF ? size - r[i].offset
						   : r[i].length;
		if (len > size - r[i].offset)
			return set_err(l, -SF_ERANGE,
				       "%s: range %" PRIu64 "+%" PRIu64 " past the end (%" PRIu64 " bytes)",
				       r[i].path, r[i].offset, len, size);
		rc = job_add(l, j, (struct piece){
			.fd = fd, .path = r[i].path, .off = r[i].offset,
			.len = len, .whole = r[i].offset == 0 && len == size });
		if (rc)
			return rc;
	}
	return 0;
}

/* Replace the job's pieces (one per range, dst set) by their plans: a
 * whole file may be a tensor file of a mount, read directly. */
static int expand_direct(struct sf_gpu_loader *l, struct job *j)
{
	struct piece *old = j->pieces;
	size_t n = j->npieces;
	int rc = 0;

	if (!l->direct)
		return 0;
	j->pieces = NULL;
	j->npieces = j->cap_pieces = 0;
	for (size_t i = 0; i < n && !rc; i++)
		rc = job_tensor(l, j, old[i].fd, old[i].path, old[i].off,
				old[i].len, old[i].dst,
				old[i].whole ? old[i].path : NULL,
				SF_WHEREIS_NOSHAPE, NULL);
	free(old);
	return rc;
}

int sf_gpu_load_ranges(struct sf_gpu_loader *l, const struct sf_gpu_range *r,
		       size_t n, enum sf_gpu_alloc alloc,
		       struct sf_gpu_stats *st)
{
	struct sf_gpu_stats local = { 0 };
	struct sf_gpu_tensor *t;
	double t0 = now_s();
	char namebuf[SF_MAX_NAME + 64];
	size_t i, g, k;
	uint64_t total;
	struct job j;
	char *base;
	int rc;

	if (!st)
		st = &local;
	rc = job_init(l, &j, n);
	if (!rc)
		rc = ck(l, cudaSetDevice(l->device), "cudaSetDevice");
	if (!rc)
		rc = plan_ranges(l, &j, r, n);
	/* allocate: per range, or per group of consecutive same-path ranges */
	for (i = 0; !rc && i < n; i = g) {
		g = i + 1;
		if (alloc == SF_GPU_PER_FILE)
			while (g < n && !strcmp(r[g].path, r[i].path))
				g++;
		total = 0;
		for (k = i; k < g; k++)
			total += align_up(j.pieces[k].len);
		rc = job_alloc(l, &j, g - i == 1 ? j.pieces[i].len : total,
			       &base);
		for (k = i; !rc && k < g; k++) {
			j.pieces[k].dst = base;
			if (base)
				base += align_up(j.pieces[k].len);
			if (!r[k].name) {
				snprintf(namebuf, sizeof(namebuf),
					 "%.1024s@%" PRIu64 "+%" PRIu64,
					 r[k].path, j.pieces[k].off,
					 j.pieces[k].len);
			}
			rc = job_result(l, &j, r[k].name ? r[k].name : namebuf,
					r[k].path, j.pieces[k].off,
					j.pieces[k].len, j.pieces[k].dst, &t);
		}
	}
	if (!rc)
		rc = expand_direct(l, &j);
	if (!rc)
		rc = pipeline(l, j.pieces, j.npieces, true, st);
	st->total_s += now_s() - t0;
	return job_end(l, &j, rc);
}

int sf_gpu_load_file(struct sf_gpu_loader *l, const char *path,
		     struct sf_gpu_stats *st)
{
	struct sf_gpu_range r = { path, 0, SF_GPU_TO_EOF, path };

	return sf_gpu_load_ranges(l, &r, 1, SF_GPU_PER_FILE, st);
}

int sf_gpu_read_only(struct sf_gpu_loader *l, const struct sf_gpu_range *r,
		     size_t n, struct sf_gpu_stats *st)
{
	struct sf_gpu_stats local = { 0 };
	double t0 = now_s();
	struct job j;
	int rc;

	if (!st)
		st = &local;
	rc = job_init(l, &j, n);
	if (!rc)
		rc = plan_ranges(l, &j, r, n);
	if (!rc)
		rc = pipeline(l, j.pieces, j.npieces, false, st);
	st->total_s += now_s() - t0;
	rc = job_end(l, &j, rc); /* no results: 0 on success */
	return rc < 0 ? rc : 0;
}

int sf_gpu_load_safetensors(struct sf_gpu_loader *l, const char *path,
			    enum sf_gpu_alloc alloc, struct sf_gpu_stats *st)
{
	struct sf_gpu_stats local = { 0 };
	struct sf_st_header *h = NULL;
	struct sf_gpu_tensor *t;
	double t0 = now_s();
	char perr[SF_GPU_ERRLEN - 64];
	uint64_t size;
	struct job j;
	char *base = NULL, *dev, *tname = NULL;
	char tpath[PATH_MAX];
	const char *slash;
	size_t i, dirlen;
	bool named;
	int fd, rc;

	if (!st)
		st = &local;
	rc = job_init(l, &j, 1);
	if (!rc)
		rc = ck(l, cudaSetDevice(l->device), "cudaSetDevice");
	if (rc)
		goto out_end;
	fd = job_open(l, &j, path, &size);
	if (fd < 0) {
		rc = fd;
		goto out_end;
	}
	rc = sf_st_header_read(fd, &h, perr, sizeof(perr));
	if (rc) {
		set_err(l, rc, "%s: %s", path, perr);
		goto out_end;
	}
	if (h->n > SF_GPU_MAX_RANGES) {
		rc = set_err(l, -SF_ETOOBIG, "%s: %zu tensors", path, h->n);
		goto out_end;
	}
	/* room for one allocation and result per tensor */
	free(j.allocs);
	free(j.res);
	j.allocs = calloc(h->n + 1, sizeof(*j.allocs));
	j.res = calloc(h->n + 1, sizeof(*j.res));
	if (!j.allocs || !j.res) {
		rc = set_err(l, -ENOMEM, "out of memory");
		goto out_end;
	}
	/* the tensor files beside it: DIR/tensors/NAME (a shardfs mount) */
	slash = strrchr(path, '/');
	dirlen = slash ? (size_t)(slash - path) + 1 : 0;
	if (l->direct && dirlen + sizeof("tensors/") + SF_MAX_NAME < PATH_MAX) {
		memcpy(tpath, path, dirlen);
		memcpy(tpath + dirlen, "tensors/", sizeof("tensors/"));
		tname = tpath + dirlen + sizeof("tensors/") - 1;
	}
	if (alloc == SF_GPU_PER_FILE) {
		rc = job_alloc(l, &j, h->data_len, &base);
		if (!rc && !tname)
			rc = job_piece(l, &j, fd, path, h->data_start,
				       h->data_len, base);
	}
	for (i = 0; !rc && i < h->n; i++) {
		const struct sf_st_entry *e = &h->entries[i];
		uint64_t len = e->end - e->begin;

		if (alloc == SF_GPU_PER_FILE) {
			dev = base ? base + e->begin : NULL;
		} else {
			rc = job_alloc(l, &j, len, &dev);
			if (rc)
				break;
		}
		/* a name that could leave tensors/ is read from this file */
		named = tname && strlen(e->name) <= SF_MAX_NAME &&
			e->name[0] != '/' && !strstr(e->name, "..");
		if (named)
			memcpy(tname, e->name, strlen(e->name) + 1);
		if ((alloc != SF_GPU_PER_FILE || tname) &&
		    (rc = job_tensor(l, &j, fd, path, h->data_start + e->begin,
				     len, dev, named ? tpath : NULL, e->ndim,
				     e->shape)))
			break;
		rc = job_result(l, &j, e->name, path, h->data_start + e->begin,
				len, dev, &t);
		if (rc)
			break;
		t->dtype = e->dtype;
		t->ndim = e->ndim;
		memcpy(t->shape, e->shape, sizeof(t->shape));
	}
	if (!rc)
		rc = pipeline(l, j.pieces, j.npieces, true, st);
out_end:
	sf_st_header_destroy(h);
	st->total_s += now_s() - t0;
	return job_end(l, &j, rc);
}

size_t sf_gpu_count(const struct sf_gpu_loader *l)
{
	return l ? l->nres : 0;
}

const struct sf_gpu_tensor *sf_gpu_get(const struct sf_gpu_loader *l,
				       size_t i)
{
	return l && i < l->nres ? &l->res[i] : NULL;
}

int sf_gpu_verify(struct sf_gpu_loader *l, const struct sf_gpu_tensor *t,
		  uint64_t *first_diff)
{
	uint64_t done = 0;
	size_t len, k;
	char *file;
	int fd, rc;

	if (!l || !t || !t->path)
		return -EINVAL;
	rc = ck(l, cudaSetDevice(l->device), "cudaSetDevice");
	if (rc)
		return rc;
	file = malloc(l->staging);
	if (!file)
		return set_err(l, -ENOMEM, "out of memory");
	fd = open(t->path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		rc = set_err(l, -errno, "open %s: %s", t->path, strerror(errno));
		goto out_free_file;
	}
	/* slot 0's pinned buffer is idle between loads */
	while (done < t->nbytes) {
		len = t->nbytes - done < l->staging ? (size_t)(t->nbytes - done)
						    : l->staging;
		rc = ck(l, cudaMemcpy(l->slots[0].host, (char *)t->dev + done,
				      len, cudaMemcpyDeviceToHost),
			"cudaMemcpy");
		if (rc)
			goto out_close_fd;
		rc = read_full(fd, file, len, t->file_offset + done);
		if (rc) {
			set_err(l, rc, "read %s: %s", t->path, sf_strerror(rc));
			goto out_close_fd;
		}
		if (memcmp(file, l->slots[0].host, len)) {
			for (k = 0; k < len; k++)
				if (file[k] != ((char *)l->slots[0].host)[k])
					break;
			if (first_diff)
				*first_diff = done + k;
			rc = set_err(l, -EBADMSG,
				     "%s: device bytes differ from %s at byte %" PRIu64,
				     t->name, t->path, done + k);
			goto out_close_fd;
		}
		done += len;
	}
out_close_fd:
	close(fd);
out_free_file:
	free(file);
	return rc;
}
