/*
 * sf_local_source.c - a payload source that reads ck->dir/file with pread.
 *
 * Open descriptors are kept in a small hash table keyed by checkpoint and
 * full path, at most SF_LOCAL_MAX_FDS of them; past that, reads open and
 * close their file each time. Entries are only removed by forget() of
 * their own checkpoint (after the engine dropped it, so no reader uses
 * them) and destroy(), so a descriptor is never closed under a concurrent
 * pread. The checkpoint is part of the key because a path outlives the
 * file behind it: a checkpoint deleted while a handle still reads it and a
 * new one written under the same name share paths, not files.
 *
 * advise() (a read-ahead hint from the engine), unless cachestat(2) finds
 * the range cached, queues it for ADVISE_THREADS threads, started on the
 * first hint. For a dense reader's hint (SF_ADVISE_DENSE: whole tensors)
 * they read it into the page cache ADVISE_CHUNK at a time and wait for
 * the disk: through a transient read-only shared mapping of the chunk
 * marked MADV_HUGEPAGE and populated (MADV_POPULATE_READ), so that the
 * kernel reads it in folios of up to 2 MiB, requests of 2-4 MiB, and some
 * way around the chunk (POSIX_FADV_WILLNEED reads in 4 KiB pages: requests
 * of about 1 MiB, and the slower disk time and the CPU of half a million
 * page insertions per 2 GB showed). A sparse reader's hint (a slice) gets
 * POSIX_FADV_WILLNEED, which reads exactly the range: populating read
 * 2.5 times the bytes of 128 slices of a few MB each. The mapping is never
 * registered and never serves a byte; a populate past the file's end (a
 * truncation) fails with EFAULT, it raises no SIGBUS. The pread or map of
 * those bytes then finds them in the page cache, or in flight. Hints are only queued
 * for descriptors in the table, and forget() drops the queued hints of its
 * checkpoint and waits for the running ones before it closes anything, so
 * a hint never reaches a closed (or reused) descriptor. A full queue drops
 * hints: they change no result.
 *
 * file_id() names a file's state by fstat (device, inode, size, times), so
 * the engine can trust blocks it verified earlier while the file stays as
 * it was.
 *
 * map() (blocks served without a copy) maps a block's range of a table
 * descriptor MAP_SHARED, read-only, under a read lease on that descriptor
 * (F_SETLEASE F_RDLCK: refused while any process has the file open for
 * writing; while it is held, an open for writing or a truncation waits
 * for it). The lease is taken with the first live mapping of a file and
 * dropped with the last (fd_ent.nleased). When one of this process's
 * leases is broken, the kernel sends a real-time signal of ours
 * (SIGRTMIN+6, set with F_SETSIG before each lease is taken: dropping a
 * lease resets it; and SIGIO, which the kernel falls back to when it
 * cannot queue the other, handled too where nobody else handles it),
 * whose handler only posts a semaphore; a thread of its own (one per process, serving
 * every local source) then, under each source's lock, replaces every live
 * mapping of each file whose lease is being broken (F_GETLEASE no longer
 * F_RDLCK) with an anonymous copy of the same bytes at the same address
 * (pread while the lease still holds, then mremap over it) and drops that
 * file's lease; other files keep theirs. So the bytes at a mapped block's
 * address are the file's bytes as they were when map() returned, until
 * unmap(): a writer waits only for the copies of its file's mapped blocks
 * (milliseconds: at most the engine's cache and its pins), the engine's
 * pointers stay valid, and no write or truncation is ever seen through a
 * mapping.
 *
 * Which files are leased (issue 30, 7): only those whose blocks the
 * engine maps, the payload files of checkpoints in the format shardfs
 * writes (shardfs/1: immutable once committed; sf_engine.c, native()). A
 * framework's files (every foreign format, indexed or saved through the
 * mount) are never leased: read() copies them with pread, or, for blocks
 * the engine serves unverified (no checksum, or verify off), map_live()
 * maps them without a lease (the file's bytes as they are at each access;
 * leases_break() never copies such a mapping).
 * A lease cannot stay out of a framework's way: while one is held, an
 * open for writing or a truncation waits until it is dropped (here: after
 * the copies, which cannot come first, since pinned replies are being
 * written from the mapping; with the daemon stopped, the kernel's
 * lease-break-time, 45 s by default), and an O_NONBLOCK open for writing
 * fails with EWOULDBLOCK however fast the holder answers (the kernel's
 * __break_lease starts the break and returns at once): inherent to any
 * lease, so no lease may be held on a file a framework may rewrite (a
 * re-save of the same step). Measured before (torch 1.13's 16 MiB .distcp
 * mapped, mount_lease): O_NONBLOCK open EAGAIN, truncate 0.05 s, open
 * O_TRUNC 0.04 s, each 45 s with the daemon stopped; now the cost of the
 * call itself. The engine keeps a framework's unverified blocks only while
 * the file keeps its identity (sf_engine.c), so a rewrite gives its new
 * bytes or EIO, never old ones mixed with new. Invariants (under
 * lock): an entry with nleased > 0 holds a lease that was not seen broken
 * (map() asks F_GETLEASE before it maps under a lease already held); an
 * entry forgotten while mappings of it live is kept, closed and freed by
 * the last unmap(). Leases are not used (map() answers -ENOTSUP) when
 * that signal is handled by someone else, leases are disabled, or the
 * system's lease-break-time is under a second (a writer could go on
 * before the copies are made). A lease the kernel revoked after
 * lease-break-time because this process did not answer (a stopped or
 * stuck daemon) is seen when the copies are finally made: a file whose
 * identity (stat_id) is no longer the one it had when a mapping was made
 * marks that mapping stale (map_stale()), and the engine fetches and
 * verifies its blocks anew instead of serving them. What leases cannot
 * cover: bytes the kernel copied out of a mapping for a reply between the
 * revocation and that copy, and pages that fail to read back (I/O errors:
 * the engine hashes under a SIGBUS guard, and the kernel's copies out of
 * a mapping fail with EFAULT, an EIO to the reader, instead).
 */
#include "sf_engine.h"
#include "sf_checksum.h"
#include "sf_error.h"
#include "sf_format.h"
#include "sf_io.h"
#include "sf_log.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <semaphore.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#define SF_LOCAL_MAX_FDS 1024
#define SF_LOCAL_BUCKETS 256
#define ADVISE_CHUNK (2u << 20) /* bytes per populate (or fadvise): each
				 * thread maps at most this (and the 2 MiB
				 * before it) at once, which counts in the
				 * daemon's RSS until unmapped: 8 MiB chunks
				 * took a cold read's peak to 66-71 MiB, 2 MiB
				 * keep it at 48-51, at the same speed */
#define ADVISE_THREADS 4        /* threads that run hints (they wait for
				 * the disk: one per rank file of a 4-rank
				 * checkpoint read in step) */
#define ADVISE_HUGE (2ull << 20) /* a populate starts on a multiple of
				  * this file offset: huge folios are
				  * aligned so in the file */
#define ADVISE_QUEUE 256        /* hints waiting, at most (more: dropped) */

struct fd_ent {
	const struct sf_ckpt_ref *ck;   /* owner, for forget() */
	char *path;                     /* owned */
	int fd;                         /* open, read-only */
	struct fd_ent *next;            /* bucket chain, or the zombie list */
	unsigned nmaps;                 /* live mappings of fd (lock) */
	unsigned nleased;               /* ... of them still file-backed: a
					 * lease is held while > 0 (lock) */
};

/* A live mapping made by map(): the token the engine holds. Fields under
 * the source's lock (base and len are fixed once made). */
struct lmap {
	unsigned char *base;            /* page-aligned start */
	size_t len;                     /* mapped bytes */
	uint64_t off;                   /* file offset of base */
	struct fd_ent *fe;              /* the file (kept while nmaps > 0) */
	bool anon;                      /* replaced by an anonymous copy */
	bool live;                      /* map_live(): no lease, never copied */
	uint64_t id;                    /* the file's identity (stat_id) when
					 * mapped, under the lease */
	_Atomic bool stale;             /* the copy was made after the file
					 * changed (its lease had been revoked):
					 * the bytes may not be the mapped
					 * ones (read without the lock) */
	struct lmap *prev, *next;       /* local_src.maps */
};

/* A queued hint: a range of a file whose descriptor is a table entry's. */
struct adv_job {
	const struct sf_ckpt_ref *ck;   /* the entry's owner: forget() waits */
	int fd;                         /* open until forget(ck) */
	uint64_t off, len;
	bool dense;                     /* SF_ADVISE_DENSE: populate */
};

struct local_src {
	pthread_mutex_t lock;           /* protects everything below */
	struct fd_ent *buckets[SF_LOCAL_BUCKETS];
	unsigned nfds;                  /* entries in the table */
	pthread_cond_t adv_cond;        /* a hint was queued, or stop */
	pthread_cond_t adv_idle;        /* a thread finished a hint */
	struct adv_job q[ADVISE_QUEUE]; /* ring: qlen hints from qhead */
	unsigned qhead, qlen;
	const struct sf_ckpt_ref *busy[ADVISE_THREADS]; /* ck of the hint
					 * thread i runs, or NULL */
	pthread_t threads[ADVISE_THREADS];
	unsigned nthreads;              /* started (lazily, on the first hint) */
	bool stop;                      /* destroy(): threads exit */
	struct lmap *maps;              /* live mappings (lock) */
	struct fd_ent *zombies;         /* forgotten entries with live mappings */
	struct local_src *reg_next;     /* the registry (reg_lock) */
};

/* Close and free an entry taken out of every list. */
static void fd_ent_free(struct fd_ent *e)
{
	close(e->fd);
	free(e->path);
	free(e);
}

static unsigned hash_path(const char *s)
{
	unsigned h = 2166136261u;

	for (; *s; s++)
		h = (h ^ (unsigned char)*s) * 16777619u;
	return h % SF_LOCAL_BUCKETS;
}

/* The entry of (ck, path) in bucket h, or NULL. Locked. */
static struct fd_ent *find_ent(struct local_src *ls, unsigned h,
			       const struct sf_ckpt_ref *ck, const char *path)
{
	struct fd_ent *e;

	for (e = ls->buckets[h]; e; e = e->next)
		if (e->ck == ck && strcmp(e->path, path) == 0)
			return e;
	return NULL;
}

/*
 * The descriptor of ck->dir/file in *fd: a kept one (*owned false), or,
 * when the table is full, one the caller closes (*owned true). Missing
 * files are not remembered: they may appear (restore). Opened beneath the
 * checkpoint: a symlink planted there never leads out.
 */
static int get_fd_ent(struct local_src *ls, const struct sf_ckpt_ref *ck,
		      const char *file, int *fd, bool *owned,
		      struct fd_ent **ent)
{
	char path[4096];
	struct fd_ent *e;
	unsigned h;
	int f;

	if ((size_t)snprintf(path, sizeof(path), "%s/%s", ck->dir, file) >=
	    sizeof(path))
		return -ENAMETOOLONG;
	h = hash_path(path);
	pthread_mutex_lock(&ls->lock);
	e = find_ent(ls, h, ck, path);
	pthread_mutex_unlock(&ls->lock);
	if (e) {
		*fd = e->fd;
		*owned = false;
		*ent = e;
		return 0;
	}
	f = sf_open_payload_ref(ck, file);
	if (f < 0)
		return f;
	pthread_mutex_lock(&ls->lock);
	/* Another reader may have opened it meanwhile; keep one entry. */
	e = find_ent(ls, h, ck, path);
	if (e) {
		pthread_mutex_unlock(&ls->lock);
		close(f);
		*fd = e->fd;
		*owned = false;
		*ent = e;
		return 0;
	}
	if (ls->nfds < SF_LOCAL_MAX_FDS) {
		e = calloc(1, sizeof(*e));
		if (e && (e->path = strdup(path))) {
			e->ck = ck;
			e->fd = f;
			e->next = ls->buckets[h];
			ls->buckets[h] = e;
			ls->nfds++;
			pthread_mutex_unlock(&ls->lock);
			*fd = f;
			*owned = false;
			*ent = e;
			return 0;
		}
		free(e);
	}
	pthread_mutex_unlock(&ls->lock);
	*fd = f;
	*owned = true;
	*ent = NULL;
	return 0;
}

/* get_fd_ent without the entry: the descriptor only. */
static int get_fd(struct local_src *ls, const struct sf_ckpt_ref *ck,
		  const char *file, int *fd, bool *owned)
{
	struct fd_ent *ent;

	return get_fd_ent(ls, ck, file, fd, owned, &ent);
}

static int local_read(void *ctx, const struct sf_ckpt_ref *ck, uint32_t rank,
		      const char *file, uint64_t off, void *buf, size_t len)
{
	bool owned;
	int fd, ret;

	(void)rank;
	ret = get_fd(ctx, ck, file, &fd, &owned);
	if (ret)
		return ret;
	ret = sf_pread_full(fd, buf, len, off);
	if (owned)
		close(fd);
	return ret;
}

/*
 * Is [off, off+len) of fd all in the page cache? cachestat(2) (Linux 6.5)
 * counts it far faster than a WILLNEED walks it page by page (measured:
 * 0.2 s of daemon CPU per warm 2 GB read went to hints for cached pages).
 * False when it cannot tell (older kernels: ENOSYS, then never asked again).
 */
#ifndef SYS_cachestat
#define SYS_cachestat 451 /* the same on every architecture */
#endif
static _Atomic bool no_cachestat;

static bool all_cached(int fd, uint64_t off, uint64_t len)
{
	struct { uint64_t off, len; } range = { off & ~4095ull, 0 };
	struct {
		uint64_t nr_cache, nr_dirty, nr_writeback, nr_evicted,
			 nr_recently_evicted;
	} cs;
	uint64_t pages;

	if (no_cachestat || len == 0)
		return false;
	range.len = ((off + len + 4095) & ~4095ull) - range.off;
	pages = range.len / 4096;
	if (syscall(SYS_cachestat, fd, &range, &cs, 0) != 0) {
		if (errno == ENOSYS)
			no_cachestat = true;
		return false;
	}
	return cs.nr_cache >= pages;
}

static _Atomic bool no_populate; /* MADV_POPULATE_READ refused (EINVAL:
				  * before Linux 5.14): fadvise only */

/* Read [off, off+len) of fd into the page cache and wait for it, through a
 * transient mapping (see the top of the file). False when that could not
 * be done (no mapping, no populate, an I/O error): the caller falls back
 * to fadvise. A range the file no longer reaches (EFAULT) counts as done. */
static bool populate_fd(int fd, uint64_t off, uint64_t len)
{
	uint64_t base = off & ~(ADVISE_HUGE - 1);
	size_t maplen = (size_t)(off + len - base);
	bool ok;
	void *p;

	if (atomic_load_explicit(&no_populate, memory_order_relaxed))
		return false;
	p = mmap(NULL, maplen, PROT_READ, MAP_SHARED, fd, (off_t)base);
	if (p == MAP_FAILED)
		return false;
	(void)madvise(p, maplen, MADV_HUGEPAGE); /* EINVAL without THP */
	ok = madvise(p, maplen, MADV_POPULATE_READ) == 0 || errno == EFAULT;
	if (!ok && errno == EINVAL)
		atomic_store_explicit(&no_populate, true, memory_order_relaxed);
	munmap(p, maplen);
	return ok;
}

/* Bring [off, off+len) into the page cache in ADVISE_CHUNK pieces,
 * skipping cached ones: populated and waited for when populate (a hint
 * thread, for a dense reader: the kernel reads whole huge folios, up to
 * 4 MiB around what is named, which such a reader reads anyway), else
 * (a sparse reader's hint, a caller that must not wait, a failed
 * populate) POSIX_FADV_WILLNEED, which only starts the reads, in 4 KiB
 * pages, of exactly the range (the kernel caps one call at the larger of
 * the device's readahead and its largest request). */
static void advise_fd(int fd, uint64_t off, uint64_t len, bool populate)
{
	for (uint64_t done = 0; done < len; done += ADVISE_CHUNK) {
		uint64_t k = len - done < ADVISE_CHUNK ? len - done : ADVISE_CHUNK;

		if (all_cached(fd, off + done, k) ||
		    (populate && populate_fd(fd, off + done, k)))
			continue;
		(void)posix_fadvise(fd, (off_t)(off + done), (off_t)k,
				    POSIX_FADV_WILLNEED);
	}
}

struct adv_thread {
	struct local_src *ls;
	unsigned i;
};

/* An advise thread: run queued hints until stop. */
static void *adv_main(void *arg)
{
	struct local_src *ls = ((struct adv_thread *)arg)->ls;
	unsigned i = ((struct adv_thread *)arg)->i;

	free(arg);
	pthread_mutex_lock(&ls->lock);
	for (;;) {
		struct adv_job j;

		while (!ls->stop && ls->qlen == 0)
			pthread_cond_wait(&ls->adv_cond, &ls->lock);
		if (ls->stop)
			break;
		j = ls->q[ls->qhead];
		ls->qhead = (ls->qhead + 1) % ADVISE_QUEUE;
		ls->qlen--;
		ls->busy[i] = j.ck;
		pthread_mutex_unlock(&ls->lock);
		advise_fd(j.fd, j.off, j.len, j.dense);
		pthread_mutex_lock(&ls->lock);
		ls->busy[i] = NULL;
		pthread_cond_broadcast(&ls->adv_idle);
	}
	pthread_mutex_unlock(&ls->lock);
	return NULL;
}

/* Queue a hint for the advise threads (started here the first time).
 * False when it was not queued: no thread, or the queue is full. Locked. */
static bool adv_queue(struct local_src *ls, const struct sf_ckpt_ref *ck,
		      int fd, uint64_t off, uint64_t len, bool dense)
{
	while (ls->nthreads < ADVISE_THREADS) {
		struct adv_thread *a = malloc(sizeof(*a));

		if (!a)
			break;
		a->ls = ls;
		a->i = ls->nthreads;
		if (pthread_create(&ls->threads[ls->nthreads], NULL, adv_main, a)) {
			free(a);
			break;
		}
		ls->nthreads++;
	}
	if (!ls->nthreads)
		return false;
	if (ls->qlen) {
		/* a range that goes on from the last one joins it */
		struct adv_job *last = &ls->q[(ls->qhead + ls->qlen - 1) % ADVISE_QUEUE];

		if (last->fd == fd && last->ck == ck && last->dense == dense &&
		    last->off + last->len == off) {
			last->len += len;
			return true;
		}
	}
	if (ls->qlen == ADVISE_QUEUE)
		return false;
	ls->q[(ls->qhead + ls->qlen) % ADVISE_QUEUE] =
		(struct adv_job){ .ck = ck, .fd = fd, .off = off, .len = len,
				  .dense = dense };
	ls->qlen++;
	pthread_cond_signal(&ls->adv_cond);
	return true;
}

/*
 * Start reading [off, off+len) of the file into the page cache, without
 * waiting for it: the hint is queued for the advise threads, so a reader
 * never waits while the kernel allocates and submits (measured: a quarter
 * to a half of a millisecond per 2 MiB on the 2-core VM). A range the page
 * cache holds whole is not queued (one cachestat here is cheaper than
 * waking a thread to find that out: with the payload cached, a first read
 * of 2 GB woke them 2,200 times, half the daemon's context switches). A
 * full queue drops the hint; a descriptor the table had no room for is
 * advised here and closed (the pages stay in the file's page cache).
 */
static void local_advise(void *ctx, const struct sf_ckpt_ref *ck,
			 uint32_t rank, const char *file, uint64_t off,
			 uint64_t len, uint64_t unit, unsigned flags)
{
	struct local_src *ls = ctx;
	bool owned;
	int fd;

	(void)rank;
	(void)unit; /* the kernel reads the range in its own pieces */
	if (get_fd(ls, ck, file, &fd, &owned))
		return;
	if (owned) {
		advise_fd(fd, off, len, false);
		close(fd);
		return;
	}
	if (all_cached(fd, off, len))
		return;
	pthread_mutex_lock(&ls->lock);
	(void)adv_queue(ls, ck, fd, off, len, flags & SF_ADVISE_DENSE);
	pthread_mutex_unlock(&ls->lock);
}

/* The identity of the file (for the engine's map of verified blocks):
 * XXH3 of its device, inode, size, and modification and change times. A
 * write, a truncation, a rename over it or a restore changes at least one
 * (the change time is bumped before the data of a write(2) or an mmap
 * store lands, to the file system's timestamp granularity). */
static uint64_t stat_id(const struct stat *st)
{
	uint64_t v[7];

	v[0] = (uint64_t)st->st_dev;
	v[1] = (uint64_t)st->st_ino;
	v[2] = (uint64_t)st->st_size;
	v[3] = (uint64_t)st->st_mtim.tv_sec;
	v[4] = (uint64_t)st->st_mtim.tv_nsec;
	v[5] = (uint64_t)st->st_ctim.tv_sec;
	v[6] = (uint64_t)st->st_ctim.tv_nsec;
	return sf_xxh3(v, sizeof(v));
}

static int local_file_id(void *ctx, const struct sf_ckpt_ref *ck,
			 uint32_t rank, const char *file, uint64_t *id)
{
	struct stat st;
	bool owned;
	int fd, ret;

	(void)rank;
	ret = get_fd(ctx, ck, file, &fd, &owned);
	if (ret)
		return ret;
	ret = fstat(fd, &st) ? -errno : 0;
	if (owned)
		close(fd);
	if (ret)
		return ret;
	*id = stat_id(&st);
	return 0;
}

/* --- mappings under read leases (map, unmap) --- */

/* Every local source that may hold leases, for the break thread. */
static pthread_mutex_t reg_lock = PTHREAD_MUTEX_INITIALIZER;
static struct local_src *reg_head;     /* chained by reg_next (reg_lock) */
static pthread_once_t brk_once = PTHREAD_ONCE_INIT;
static bool brk_ok;                    /* leases usable (set once) */
static int lease_sig;                  /* the signal a break sends */
static sem_t brk_sem;                  /* posted by the signal handler */

static void on_lease_sig(int sig)
{
	int saved = errno;

	(void)sig;
	sem_post(&brk_sem);
	errno = saved;
}

/* Replace lm's file pages with an anonymous copy of the same bytes at the
 * same address (read while the lease still holds: they are the bytes the
 * mapping showed). 0, or a negative errno (the mapping stays as it was).
 * Locked. */
static int lmap_to_anon(struct lmap *lm)
{
	void *copy = mmap(NULL, lm->len, PROT_READ | PROT_WRITE,
			  MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	struct stat st;
	size_t n;
	int ret;

	if (copy == MAP_FAILED)
		return -ENOMEM;
	ret = fstat(lm->fe->fd, &st) ? -errno : 0;
	if (ret == 0) {
		/* the file's tail page beyond its end reads as zeros */
		n = (uint64_t)st.st_size <= lm->off ? 0 :
		    (uint64_t)st.st_size - lm->off < lm->len ?
		    (size_t)((uint64_t)st.st_size - lm->off) : lm->len;
		ret = sf_pread_full(lm->fe->fd, copy, n, lm->off);
	}
	/* Changed since it was mapped: the lease was revoked before this
	 * copy (a writer went on), so the copied bytes may be new ones. */
	if (ret == 0 && fstat(lm->fe->fd, &st) == 0 && stat_id(&st) != lm->id)
		atomic_store(&lm->stale, true);
	if (ret == 0 && mprotect(copy, lm->len, PROT_READ) < 0)
		ret = -errno;
	if (ret == 0 && mremap(copy, lm->len, lm->len,
			       MREMAP_MAYMOVE | MREMAP_FIXED,
			       lm->base) == MAP_FAILED)
		ret = -errno;
	if (ret < 0) {
		munmap(copy, lm->len);
		return ret;
	}
	return 0;
}

/* A lease of this process is being broken: copy every file-backed
 * mapping of ls whose file's lease is being broken (F_GETLEASE no longer
 * answers F_RDLCK: being broken, or already revoked) and drop those
 * leases; the other files' mappings and leases stay as they are, so the
 * writer waits only for the copies of its own file's mapped blocks. A
 * mapping that cannot be copied keeps its lease (the writer then waits
 * until its block is dropped, or for the kernel's lease-break-time) and
 * is marked stale, so its block is fetched and verified anew before it is
 * served again. Locked. */
static void leases_break(struct local_src *ls)
{
	for (struct lmap *lm = ls->maps; lm; lm = lm->next) {
		if (lm->anon || lm->live ||
		    fcntl(lm->fe->fd, F_GETLEASE) == F_RDLCK)
			continue;
		if (lmap_to_anon(lm) < 0) {
			/* the bytes cannot be kept: once the kernel revokes
			 * the lease they may change, so the engine must not
			 * serve this mapping's block again without fetching
			 * and verifying it anew */
			atomic_store(&lm->stale, true);
			sf_err("payload %s: a lease is being broken and a mapping of it cannot be copied; the writer waits until the block is dropped or the lease revoked",
			       SF_QSTR(lm->fe->path));
			continue;
		}
		lm->anon = true;
		if (atomic_load(&lm->stale))
			sf_warn("payload %s changed before its mapped blocks were copied (its lease was revoked: the daemon did not answer within the kernel's lease-break-time); those blocks are fetched and verified again",
				SF_QSTR(lm->fe->path));
		if (--lm->fe->nleased == 0)
			(void)fcntl(lm->fe->fd, F_SETLEASE, F_UNLCK);
	}
}

/* The break thread: after each signal, every registered source. */
static void *brk_main(void *arg)
{
	(void)arg;
	for (;;) {
		while (sem_wait(&brk_sem) < 0 && errno == EINTR)
			;
		pthread_mutex_lock(&reg_lock);
		for (struct local_src *ls = reg_head; ls; ls = ls->reg_next) {
			pthread_mutex_lock(&ls->lock);
			leases_break(ls);
			pthread_mutex_unlock(&ls->lock);
		}
		pthread_mutex_unlock(&reg_lock);
	}
	return NULL;
}

/* A small integer from a /proc/sys file, or -1. */
static long proc_long(const char *path)
{
	char buf[32];
	long v = -1;
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	ssize_t n;

	if (fd < 0)
		return -1;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n > 0) {
		buf[n] = 0;
		v = strtol(buf, NULL, 10);
	}
	return v;
}

/* Once per process: may mappings be leased? The signal is taken only when
 * nobody else handles it; the thread starts here, detached, for good. */
static void brk_init(void)
{
	struct sigaction old, io, sa;
	pthread_attr_t at;
	pthread_t th;

	if (proc_long("/proc/sys/fs/leases-enable") == 0 ||
	    proc_long("/proc/sys/fs/lease-break-time") < 1)
		return;
	lease_sig = SIGRTMIN + 6;
	if (lease_sig > SIGRTMAX || sigaction(lease_sig, NULL, &old) < 0 ||
	    (old.sa_flags & SA_SIGINFO) || old.sa_handler != SIG_DFL ||
	    sigaction(SIGIO, NULL, &io) < 0)
		return;
	if (sem_init(&brk_sem, 0, 0) < 0)
		return;
	if (pthread_attr_init(&at))
		return;
	pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_lease_sig;
	sa.sa_flags = SA_RESTART;
	sigemptyset(&sa.sa_mask);
	if (sigaction(lease_sig, &sa, NULL) == 0) {
		if (pthread_create(&th, &at, brk_main, NULL) == 0) {
			brk_ok = true;
			/* SIGIO's default ends the process: a break that
			 * falls back to it must not */
			if (!(io.sa_flags & SA_SIGINFO) &&
			    io.sa_handler == SIG_DFL)
				sigaction(SIGIO, &sa, NULL);
		} else {
			sigaction(lease_sig, &old, NULL);
		}
	}
	pthread_attr_destroy(&at);
}

/* The table descriptor of ck's file (its fd_ent in *fe): a mapping is
 * kept only on it. -ENOTSUP when the file has none (a descriptor of its
 * own, closed here), or get_fd_ent's error. */
static int table_fd(struct local_src *ls, const struct sf_ckpt_ref *ck,
		    const char *file, int *fd, struct fd_ent **fe)
{
	bool owned;
	int ret = get_fd_ent(ls, ck, file, fd, &owned, fe);

	if (ret)
		return ret;
	if (owned) {
		close(*fd);
		return -ENOTSUP;
	}
	return 0;
}

/* Fill lm for the mapping p (total bytes from file offset base of fe's
 * file, as st was when mapped) and put it on ls->maps. ls->lock held. */
static void link_map_locked(struct local_src *ls, struct lmap *lm,
			    struct fd_ent *fe, void *p, size_t total,
			    uint64_t base, const struct stat *st)
{
	lm->base = p;
	lm->len = total;
	lm->off = base;
	lm->fe = fe;
	lm->id = stat_id(st);
	lm->next = ls->maps;
	if (ls->maps)
		ls->maps->prev = lm;
	ls->maps = lm;
	fe->nmaps++;
}

/*
 * Map bytes [off, off+len) of ck->dir/file under a read lease (see the
 * top of this file). -ENOTSUP where leases cannot be used or the file has
 * no table descriptor; -EAGAIN where the file cannot be leased now (open
 * for writing, a lease being broken, another owner without CAP_LEASE) or
 * is shorter than the range; -ENOMEM.
 */
static int local_map(void *ctx, const struct sf_ckpt_ref *ck, uint32_t rank,
		     const char *file, uint64_t off, size_t len,
		     const void **addr, void **token)
{
	struct local_src *ls = ctx;
	uint64_t pg = (uint64_t)sysconf(_SC_PAGESIZE);
	uint64_t base = off & ~(pg - 1);
	size_t delta = (size_t)(off - base);
	struct fd_ent *fe;
	struct lmap *lm;
	struct stat st;
	void *p;
	int fd, ret;

	(void)rank;
	pthread_once(&brk_once, brk_init);
	if (!brk_ok || len == 0)
		return -ENOTSUP;
	ret = table_fd(ls, ck, file, &fd, &fe);
	if (ret)
		return ret;
	lm = calloc(1, sizeof(*lm));
	if (!lm)
		return -ENOMEM;
	pthread_mutex_lock(&ls->lock);
	if (fe->nleased == 0) {
		/* every time: dropping a lease resets the descriptor's signal
		 * to SIGIO (measured on 6.18; the kernel's lease_modify) */
		if (fcntl(fd, F_SETSIG, lease_sig) < 0) {
			ret = -ENOTSUP;
			goto out_unlock;
		}
		if (fcntl(fd, F_SETLEASE, F_RDLCK) < 0) {
			ret = -EAGAIN;
			goto out_unlock;
		}
	} else if (fcntl(fd, F_GETLEASE) != F_RDLCK) {
		ret = -EAGAIN; /* being broken: the break thread comes */
		goto out_unlock;
	}
	/* Under the lease the size cannot change any more. */
	if (fstat(fd, &st) < 0 || (uint64_t)st.st_size < off + len) {
		ret = -EAGAIN;
		goto out_unlease;
	}
	p = mmap(NULL, len + delta, PROT_READ, MAP_SHARED, fd, (off_t)base);
	if (p == MAP_FAILED) {
		ret = -EAGAIN;
		goto out_unlease;
	}
	link_map_locked(ls, lm, fe, p, len + delta, base, &st);
	fe->nleased++;
	pthread_mutex_unlock(&ls->lock);
	*addr = (unsigned char *)p + delta;
	*token = lm;
	return 0;

out_unlease:
	if (fe->nleased == 0)
		(void)fcntl(fd, F_SETLEASE, F_UNLCK);
out_unlock:
	pthread_mutex_unlock(&ls->lock);
	free(lm);
	return ret;
}

/*
 * Map bytes [off, off+len) of ck->dir/file without a lease (sf_source.h,
 * map_live): the file's bytes as they are at each access, for blocks
 * served unverified; a framework rewriting the file never waits for it.
 * -ENOTSUP where the file has no table descriptor; -EAGAIN where it is
 * shorter than the range, or mmap fails; -ENOMEM.
 */
static int local_map_live(void *ctx, const struct sf_ckpt_ref *ck,
			  uint32_t rank, const char *file, uint64_t off,
			  size_t len, const void **addr, void **token)
{
	struct local_src *ls = ctx;
	uint64_t pg = (uint64_t)sysconf(_SC_PAGESIZE);
	uint64_t base = off & ~(pg - 1);
	size_t delta = (size_t)(off - base);
	struct fd_ent *fe;
	struct lmap *lm;
	struct stat st;
	void *p;
	int fd, ret;

	(void)rank;
	if (len == 0)
		return -ENOTSUP;
	ret = table_fd(ls, ck, file, &fd, &fe);
	if (ret)
		return ret;
	if (fstat(fd, &st) < 0 || (uint64_t)st.st_size < off + len)
		return -EAGAIN;
	lm = calloc(1, sizeof(*lm));
	if (!lm)
		return -ENOMEM;
	p = mmap(NULL, len + delta, PROT_READ, MAP_SHARED, fd, (off_t)base);
	if (p == MAP_FAILED) {
		free(lm);
		return -EAGAIN;
	}
	lm->live = true;
	pthread_mutex_lock(&ls->lock);
	link_map_locked(ls, lm, fe, p, len + delta, base, &st);
	pthread_mutex_unlock(&ls->lock);
	*addr = (unsigned char *)p + delta;
	*token = lm;
	return 0;
}

/* Whether lm's bytes may have changed since map() (see lmap.stale). */
static bool local_map_stale(void *ctx, void *token)
{
	(void)ctx;
	return atomic_load(&((struct lmap *)token)->stale);
}

/* Drop a mapping; with the file's last file-backed one its lease, and
 * with its last one a forgotten entry. */
static void local_unmap(void *ctx, void *token)
{
	struct local_src *ls = ctx;
	struct lmap *lm = token;
	struct fd_ent *fe = lm->fe;

	pthread_mutex_lock(&ls->lock);
	if (lm->prev)
		lm->prev->next = lm->next;
	else
		ls->maps = lm->next;
	if (lm->next)
		lm->next->prev = lm->prev;
	if (!lm->anon && !lm->live && --fe->nleased == 0)
		(void)fcntl(fe->fd, F_SETLEASE, F_UNLCK);
	if (--fe->nmaps == 0) {
		for (struct fd_ent **pp = &ls->zombies; *pp; pp = &(*pp)->next) {
			if (*pp != fe)
				continue;
			*pp = fe->next;
			fd_ent_free(fe);
			break;
		}
	}
	pthread_mutex_unlock(&ls->lock);
	munmap(lm->base, lm->len);
	free(lm);
}

static void local_forget(void *ctx, const struct sf_ckpt_ref *ck)
{
	struct local_src *ls = ctx;
	unsigned n = 0;

	pthread_mutex_lock(&ls->lock);
	/* No hint of ck queued or running once its descriptors close. */
	for (unsigned k = 0; k < ls->qlen; k++) {
		struct adv_job *j = &ls->q[(ls->qhead + k) % ADVISE_QUEUE];

		if (j->ck != ck)
			ls->q[(ls->qhead + n++) % ADVISE_QUEUE] = *j;
	}
	ls->qlen = n;
	for (unsigned i = 0; i < ADVISE_THREADS; i++)
		while (ls->busy[i] == ck)
			pthread_cond_wait(&ls->adv_idle, &ls->lock);
	for (unsigned h = 0; h < SF_LOCAL_BUCKETS; h++) {
		struct fd_ent **pp = &ls->buckets[h];
		while (*pp) {
			struct fd_ent *e = *pp;
			if (e->ck != ck) {
				pp = &e->next;
				continue;
			}
			*pp = e->next;
			ls->nfds--;
			if (e->nmaps) {
				/* the last unmap() closes it */
				e->next = ls->zombies;
				ls->zombies = e;
				continue;
			}
			fd_ent_free(e);
		}
	}
	pthread_mutex_unlock(&ls->lock);
}

static void local_destroy(void *ctx)
{
	struct local_src *ls = ctx;

	pthread_mutex_lock(&ls->lock);
	ls->stop = true;
	pthread_cond_broadcast(&ls->adv_cond);
	pthread_mutex_unlock(&ls->lock);
	for (unsigned i = 0; i < ls->nthreads; i++)
		pthread_join(ls->threads[i], NULL);
	pthread_mutex_lock(&reg_lock);
	for (struct local_src **pp = &reg_head; *pp; pp = &(*pp)->reg_next)
		if (*pp == ls) {
			*pp = ls->reg_next;
			break;
		}
	pthread_mutex_unlock(&reg_lock);
	/* Every mapping was dropped (sf_engine_destroy first); a leftover
	 * one is given back here all the same. */
	while (ls->maps) {
		struct lmap *lm = ls->maps;

		ls->maps = lm->next;
		munmap(lm->base, lm->len);
		free(lm);
	}
	for (struct fd_ent *e = ls->zombies, *next; e; e = next) {
		next = e->next;
		fd_ent_free(e);
	}

	for (unsigned h = 0; h < SF_LOCAL_BUCKETS; h++) {
		struct fd_ent *e = ls->buckets[h], *next;
		for (; e; e = next) {
			next = e->next;
			fd_ent_free(e);
		}
	}
	pthread_cond_destroy(&ls->adv_cond);
	pthread_cond_destroy(&ls->adv_idle);
	pthread_mutex_destroy(&ls->lock);
	free(ls);
}

static const struct sf_source_ops local_ops = {
	.read = local_read,
	.forget = local_forget,
	.advise = local_advise,
	.file_id = local_file_id,
	.map = local_map,
	.map_live = local_map_live,
	.map_stale = local_map_stale,
	.unmap = local_unmap,
	.destroy = local_destroy,
};

int sf_local_source_create(struct sf_source **out)
{
	struct sf_source *src = calloc(1, sizeof(*src));
	struct local_src *ls = calloc(1, sizeof(*ls));

	if (!src || !ls) {
		free(src);
		free(ls);
		return -ENOMEM;
	}
	pthread_mutex_init(&ls->lock, NULL);
	pthread_cond_init(&ls->adv_cond, NULL);
	pthread_cond_init(&ls->adv_idle, NULL);
	src->ops = &local_ops;
	src->ctx = ls;
	pthread_mutex_lock(&reg_lock);
	ls->reg_next = reg_head;
	reg_head = ls;
	pthread_mutex_unlock(&reg_lock);
	*out = src;
	return 0;
}

void sf_source_destroy(struct sf_source *src)
{
	if (!src)
		return;
	if (src->ops && src->ops->destroy)
		src->ops->destroy(src->ctx);
	free(src);
}
