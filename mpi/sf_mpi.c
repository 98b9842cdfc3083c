/*
 * sf_mpi.c - the MPI peer layer: inventory exchange, peer payload reads,
 * commit coordination, notices and an orderly leave.
 *
 * Threads and messages. All traffic runs on a private duplicate of
 * MPI_COMM_WORLD (errors return, never abort). Requests to a daemon go to
 * tag SF_TAG_REQ and are received by exactly one service thread per rank
 * (matched probe + MPI_Mrecv); each request names a reply tag, drawn by the
 * requester from an atomic counter in [SF_MPI_WIRE_TAG_BASE, MPI_TAG_UB],
 * that no other request in flight uses, so any thread may wait for its own
 * reply with MPI_Test polling against a deadline. Replies are
 * [int64 status][bytes].
 *
 * Invariants:
 *  - every received message is sized before it is received (anything over
 *    the wire caps is drained and dropped) and decoded by sf_mpi_wire.c,
 *    which checks every length inside it against what was received, before
 *    this file uses any field;
 *  - a buffer under an MPI request is never freed before that request
 *    completed: a requester that gives up cancels its receive and, if the
 *    receive already matched, hands request and buffer to the "zombie" list
 *    that the service thread completes and frees later;
 *  - the service thread never blocks on a peer: its replies are MPI_Isend
 *    whose buffers live on the pending list until the send completes;
 *  - the inventory is built once in sf_mpi_start and read-only afterwards;
 *  - commit/commit-done rounds exist only on rank 0 and are touched only by
 *    its service thread.
 *
 * Wire format: sf_mpi_wire.h describes every message (request headers,
 * reply framing, verdicts, notices, inventories) and sf_mpi_wire.c encodes
 * and validates them; this file only sends and receives the bytes, as
 * MPI_BYTE.
 */
#include "sf_mpi.h"
#include "sf_error.h"
#include "sf_io.h"
#include "sf_log.h"
#include "sf_model.h"
#include "sf_mpi_wire.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <mpi.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define SF_TAG_REQ 1
#define SF_MPI_CHUNK (4u << 20)           /* bytes per read message */
#define SF_MPI_INFLIGHT 8                 /* chunk requests in flight per read */
#define SF_MPI_PF_SLOTS 8                 /* prefetch buffers per daemon */
#define SF_MPI_PF_MAX (8u << 20)          /* largest prefetched range */
#define SF_MPI_PF_DEPTH 2                 /* ranges prefetched ahead per stream */
#define SF_MPI_WAIT_POLL_US 100           /* longest sleep of a waiting reader */
#define SF_MPI_SERVE_POLL_US 100          /* service poll while requests come */
#define SF_MPI_IDLE_POLL_US 2000          /* service poll when idle */
#define SF_MPI_ACTIVE_NS 20000000ull      /* "requests come": one in last 20 ms */
#define SF_MPI_STREAMS 32                 /* remembered sequential streams */
#define SF_MPI_READ_TIMEOUT_MS 30000      /* default bound on one peer read */
#define SF_MPI_SEND_DRAIN_MS 5000         /* bound on draining sends at exit */
#define SF_MPI_MAX_DEPTH 16               /* directory depth walked */
#define SF_MPI_MAX_TEXT 1024              /* error text in a verdict */
#define SF_MPI_INV_BUCKETS 4096

/* A send buffer shared by several MPI_Isend (refcount under pend_lock). */
struct sbuf {
	unsigned refs;
	size_t len;
	unsigned char data[];
};

/* One outstanding request with a buffer that must outlive it: a send on the
 * pending list, or a receive someone gave up on (zombie). */
struct pend {
	MPI_Request req;
	struct sbuf *sb;      /* send buffer (shared), or NULL */
	void *rbuf;           /* abandoned receive buffer, or NULL */
	struct pend *next;
};

/* Inventory entry: one file some ranks hold. */
struct inv_holder {
	int rank;
	uint64_t size;        /* bytes, at start-up */
};
struct inv_ent {
	char *key;            /* "ckpt\0file" (owned) */
	size_t keylen;        /* bytes of key including the inner NUL */
	struct inv_holder *h; /* owned */
	unsigned nh;
	struct inv_ent *next;
};

/* A prefetched (or being prefetched) range of a remote file. */
enum pf_state { PF_FREE = 0, PF_PENDING, PF_CLAIMED };
struct pf_slot {
	enum pf_state state;             /* under src_lock */
	const struct sf_ckpt_ref *ck;    /* identity of the checkpoint */
	char *file;                      /* owned */
	uint64_t off, len;               /* bytes of the file */
	int peer;
	unsigned char *buf;              /* reply of len bytes, owned; under req */
	MPI_Request req;
	uint64_t stamp;                  /* issue order, for eviction */
};

/* A sequential reader: the next offset expected of (ck, file hash). */
struct stream {
	const struct sf_ckpt_ref *ck;
	uint64_t fhash;
	uint64_t next;
	uint64_t stamp;
};

/* Commit coordination state on rank 0 (service thread only). */
struct round {
	enum sf_mpi_msg kind;            /* SF_MPI_MSG_COMMIT_PART or _DONE */
	char *name;                      /* checkpoint (owned) */
	uint64_t deadline_ns;            /* CLOCK_MONOTONIC */
	uint32_t timeout_ms;
	int nhave;
	bool *have;                      /* [size] */
	int *tag;                        /* [size] reply tag per rank */
	int *status;                     /* [size] COMMIT_DONE results */
	char **parts;                    /* [size] NUL-terminated copies */
	size_t *lens;                    /* [size] */
	struct round *next;
};

/* Rank 0's merge function for a checkpoint being committed. */
struct merge_reg {
	char *name;                      /* owned */
	sf_merge_fn fn;
	void *arg;
	struct merge_reg *next;
};

struct sf_mpi {
	MPI_Comm comm;                   /* private duplicate; set by init */
	int rank, size;                  /* fixed after init */
	int tag_ub;                      /* MPI_TAG_UB of the comm */
	bool own_init;                   /* we called MPI_Init_thread */
	atomic_uint next_tag;            /* reply tag counter */

	char *store;                     /* owned; set by start */
	int single;                      /* store is one checkpoint */
	struct inv_ent *inv[SF_MPI_INV_BUCKETS]; /* read-only after start */

	pthread_t thread;                /* service thread */
	bool started;                    /* thread running (main thread only) */
	atomic_bool leaving;             /* finalize called on this rank */

	pthread_mutex_t pend_lock;       /* protects pend and zombies */
	struct pend *pend;               /* sends and abandoned receives */

	pthread_mutex_t reg_lock;        /* protects merges, notice_fn/arg */
	struct merge_reg *merges;
	sf_notice_fn notice_fn;
	void *notice_arg;

	struct round *rounds;            /* rank 0 service thread only */
	bool *left;                      /* [size] LEAVE seen; service thread */
	int nleft;                       /* service thread */

	/* payload source */
	struct sf_source src;            /* what sf_mpi_source returns */
	struct sf_source *local;         /* core local source (owned) */
	atomic_int read_timeout_ms;
	pthread_mutex_t src_lock;        /* protects pf, streams, stamp */
	struct pf_slot pf[SF_MPI_PF_SLOTS];
	struct stream streams[SF_MPI_STREAMS];
	uint64_t stamp;
};

/* ------------------------------------------------------------------ */
/* small helpers                                                       */

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Sleep for a poll backoff step (*us microseconds), doubling up to max. */
static void backoff(unsigned *us, unsigned max)
{
	struct timespec ts = { 0, (long)*us * 1000 };

	nanosleep(&ts, NULL);
	if (*us < max)
		*us = *us * 2 > max ? max : *us * 2;
}

static uint64_t fnv64(const void *p, size_t n)
{
	const unsigned char *s = p;
	uint64_t h = 14695981039346656037ull;

	while (n--)
		h = (h ^ *s++) * 1099511628211ull;
	return h;
}

static int mpi_fail(const char *what, int rc)
{
	char msg[MPI_MAX_ERROR_STRING];
	int n = 0;

	if (MPI_Error_string(rc, msg, &n) != MPI_SUCCESS)
		snprintf(msg, sizeof(msg), "error %d", rc);
	sf_err("mpi: %s failed: %s", what, msg);
	return -SF_EPEER;
}

static int new_tag(struct sf_mpi *mp)
{
	unsigned span = (unsigned)(mp->tag_ub - SF_MPI_WIRE_TAG_BASE) + 1;

	return SF_MPI_WIRE_TAG_BASE +
	       (int)(atomic_fetch_add(&mp->next_tag, 1) % span);
}

/* A send buffer of len bytes, no references yet. */
static struct sbuf *sbuf_new(size_t len)
{
	struct sbuf *sb = malloc(sizeof(*sb) + len);

	if (!sb)
		return NULL;
	sb->refs = 0;
	sb->len = len;
	return sb;
}

/* Encode request r, with name and file given as C strings (NULL: none),
 * into a new send buffer. NULL when out of memory or when r breaks a wire
 * cap (the callers check their arguments first). */
static struct sbuf *req_build(struct sf_mpi_wire_req *r, const char *name,
			      const char *file)
{
	struct sbuf *sb;
	size_t len;

	r->name = name;
	r->name_len = name ? strlen(name) : 0;
	r->file = file;
	r->file_len = file ? strlen(file) : 0;
	if (sf_mpi_wire_req_size(r, &len) < 0 || !(sb = sbuf_new(len)))
		return NULL;
	if (sf_mpi_wire_req_encode(r, sb->data, sb->len) < 0) {
		free(sb);
		return NULL;
	}
	return sb;
}

/* Reply buffer [int64 status][payload]. */
static struct sbuf *reply_build(int64_t status, const void *data, size_t len)
{
	struct sbuf *sb = sbuf_new(sf_mpi_wire_reply_size(len));

	if (sb)
		sf_mpi_wire_reply_encode(sb->data, status, data, len);
	return sb;
}

/* Isend sb to dest and leave it on the pending list (sb is freed once its
 * last send completes). Never blocks on the peer. */
static int send_async(struct sf_mpi *mp, int dest, int tag, struct sbuf *sb)
{
	struct pend *p = calloc(1, sizeof(*p));
	int rc;

	if (!p)
		return -ENOMEM;
	pthread_mutex_lock(&mp->pend_lock);
	rc = MPI_Isend(sb->data, (int)sb->len, MPI_BYTE, dest, tag, mp->comm,
		       &p->req);
	if (rc != MPI_SUCCESS) {
		pthread_mutex_unlock(&mp->pend_lock);
		free(p);
		return mpi_fail("MPI_Isend", rc);
	}
	sb->refs++;
	p->sb = sb;
	p->next = mp->pend;
	mp->pend = p;
	pthread_mutex_unlock(&mp->pend_lock);
	return 0;
}

/*
 * Sending one sbuf to several ranks: the sender holds its own reference
 * (refs = 1 before the first send_async) for the whole loop, because any
 * thread's pend_poll may complete and free an earlier send meanwhile, and
 * drops it here. Takes pend_lock.
 */
static void sbuf_put(struct sf_mpi *mp, struct sbuf *sb)
{
	pthread_mutex_lock(&mp->pend_lock);
	if (--sb->refs == 0)
		free(sb);
	pthread_mutex_unlock(&mp->pend_lock);
}

/* Give up on a receive. A request to a peer that failed or timed out is
 * cancelled (cancel true); one whose peer will still answer (an unused
 * prefetch) is left to complete, so that the peer's reply does not hang.
 * Either way, if it is not complete now the service thread completes and
 * frees it later. Takes ownership of rbuf. */
static void recv_abandon_how(struct sf_mpi *mp, MPI_Request *req, void *rbuf,
			     bool cancel)
{
	int done = 0;
	struct pend *p;

	if (cancel)
		MPI_Cancel(req);
	MPI_Test(req, &done, MPI_STATUS_IGNORE);
	if (done) {
		free(rbuf);
		return;
	}
	p = calloc(1, sizeof(*p));
	if (!p) {
		/* Cannot track it: leak the buffer rather than free it under MPI. */
		sf_err("mpi: out of memory tracking an abandoned receive");
		return;
	}
	p->req = *req;
	p->rbuf = rbuf;
	pthread_mutex_lock(&mp->pend_lock);
	p->next = mp->pend;
	mp->pend = p;
	pthread_mutex_unlock(&mp->pend_lock);
}

static void recv_abandon(struct sf_mpi *mp, MPI_Request *req, void *rbuf)
{
	recv_abandon_how(mp, req, rbuf, true);
}

static void recv_orphan(struct sf_mpi *mp, MPI_Request *req, void *rbuf)
{
	recv_abandon_how(mp, req, rbuf, false);
}

/* Test every pending request; free what completed. Returns how many are
 * still pending. */
static unsigned pend_poll(struct sf_mpi *mp)
{
	unsigned left = 0;

	pthread_mutex_lock(&mp->pend_lock);
	for (struct pend **pp = &mp->pend; *pp;) {
		struct pend *p = *pp;
		int done = 0;

		MPI_Test(&p->req, &done, MPI_STATUS_IGNORE);
		if (!done) {
			left++;
			pp = &p->next;
			continue;
		}
		*pp = p->next;
		if (p->sb && --p->sb->refs == 0)
			free(p->sb);
		free(p->rbuf);
		free(p);
	}
	pthread_mutex_unlock(&mp->pend_lock);
	return left;
}

/* Wait for req until deadline (polling). 0 when complete (status in *st),
 * -ETIMEDOUT otherwise (req still active). */
static int wait_req(MPI_Request *req, uint64_t deadline, MPI_Status *st)
{
	unsigned us = 10;
	int done = 0;

	for (;;) {
		if (MPI_Test(req, &done, st) != MPI_SUCCESS)
			return -SF_EPEER;
		if (done)
			return 0;
		if (now_ns() >= deadline)
			return -ETIMEDOUT;
		backoff(&us, SF_MPI_WAIT_POLL_US);
	}
}

/* ------------------------------------------------------------------ */
/* inventory                                                           */

static unsigned inv_bucket(const char *key, size_t keylen)
{
	return (unsigned)(fnv64(key, keylen) % SF_MPI_INV_BUCKETS);
}

static struct inv_ent *inv_find(const struct sf_mpi *mp, const char *name,
				const char *file)
{
	size_t nl = strlen(name), fl = strlen(file);
	char key[SF_MAX_COMPONENT + 1 + SF_MAX_NAME + 1];
	size_t keylen = nl + 1 + fl;

	if (nl > SF_MAX_COMPONENT || fl > SF_MAX_NAME)
		return NULL;
	memcpy(key, name, nl + 1);
	memcpy(key + nl + 1, file, fl);
	for (struct inv_ent *e = mp->inv[inv_bucket(key, keylen)]; e; e = e->next)
		if (e->keylen == keylen && memcmp(e->key, key, keylen) == 0)
			return e;
	return NULL;
}

static int inv_add(struct sf_mpi *mp, const char *name, size_t nl,
		   const char *file, size_t fl, int rank, uint64_t size)
{
	size_t keylen = nl + 1 + fl;
	char key[SF_MAX_COMPONENT + 1 + SF_MAX_NAME + 1];
	unsigned b;
	struct inv_ent *e;
	struct inv_holder *h;

	memcpy(key, name, nl);
	key[nl] = '\0';
	memcpy(key + nl + 1, file, fl);
	b = inv_bucket(key, keylen);
	for (e = mp->inv[b]; e; e = e->next)
		if (e->keylen == keylen && memcmp(e->key, key, keylen) == 0)
			break;
	if (!e) {
		e = calloc(1, sizeof(*e));
		if (!e || !(e->key = malloc(keylen + 1))) {
			free(e);
			return -ENOMEM;
		}
		memcpy(e->key, key, keylen);
		e->key[keylen] = '\0';
		e->keylen = keylen;
		e->next = mp->inv[b];
		mp->inv[b] = e;
	}
	if (e->nh >= (unsigned)mp->size)
		return 0; /* a rank listed twice: ignore */
	h = realloc(e->h, (e->nh + 1) * sizeof(*h));
	if (!h)
		return -ENOMEM;
	e->h = h;
	e->h[e->nh].rank = rank;
	e->h[e->nh].size = size;
	e->nh++;
	return 0;
}

static void inv_free(struct sf_mpi *mp)
{
	for (unsigned b = 0; b < SF_MPI_INV_BUCKETS; b++) {
		struct inv_ent *e = mp->inv[b], *next;
		for (; e; e = next) {
			next = e->next;
			free(e->key);
			free(e->h);
			free(e);
		}
		mp->inv[b] = NULL;
	}
}

/* Walk dir (absolute) whose path relative to the checkpoint is rel, adding
 * every regular, non-hidden file to the serialized inventory. */
static void walk_payloads(struct sf_mpi_wire_inv_buf *ib, const char *ckpt,
			  const char *dir, const char *rel, unsigned depth)
{
	DIR *d;
	struct dirent *de;

	if (depth > SF_MPI_MAX_DEPTH)
		return;
	d = opendir(dir);
	if (!d) {
		sf_warn("mpi: cannot list %s: %s", dir, strerror(errno));
		return;
	}
	while (!ib->ret && (de = readdir(d))) {
		char path[4096], relp[SF_MAX_NAME + 1];
		struct stat sb;

		if (de->d_name[0] == '.')
			continue; /* ".", "..", temp and hidden files */
		if ((size_t)snprintf(path, sizeof(path), "%s/%s", dir,
				     de->d_name) >= sizeof(path) ||
		    (size_t)snprintf(relp, sizeof(relp), "%s%s%s", rel,
				     rel[0] ? "/" : "", de->d_name) >= sizeof(relp))
			continue;
		if (lstat(path, &sb) < 0)
			continue;
		if (S_ISDIR(sb.st_mode))
			walk_payloads(ib, ckpt, path, relp, depth + 1);
		else if (S_ISREG(sb.st_mode) && sf_relpath_valid(relp))
			sf_mpi_wire_inv_put(ib, ckpt, strlen(ckpt), relp,
					    strlen(relp), (uint64_t)sb.st_size);
	}
	closedir(d);
}

/* Add every file of checkpoint dir `cdir` named `ckpt`, whatever its
 * format: the payloads a peer may ask for are files inside it. */
static void scan_ckpt(struct sf_mpi_wire_inv_buf *ib, const char *ckpt,
		      const char *cdir)
{
	walk_payloads(ib, ckpt, cdir, "", 0);
}

static int build_inventory(const char *store, int single,
			   struct sf_mpi_wire_inv_buf *ib)
{
	DIR *d;
	struct dirent *de;

	if (single) {
		scan_ckpt(ib, "", store);
		return ib->ret;
	}
	d = opendir(store);
	if (!d)
		return -errno;
	while (!ib->ret && (de = readdir(d))) {
		char path[4096];
		struct stat sb;

		if (de->d_name[0] == '.' ||
		    !sf_mpi_wire_ckpt_name_ok(de->d_name, strlen(de->d_name)))
			continue;
		if ((size_t)snprintf(path, sizeof(path), "%s/%s", store,
				     de->d_name) >= sizeof(path))
			continue;
		if (lstat(path, &sb) == 0 && S_ISDIR(sb.st_mode))
			scan_ckpt(ib, de->d_name, path);
	}
	closedir(d);
	return ib->ret;
}

/* One rank's records, as sf_mpi_wire_inv_parse hands them over. */
struct inv_from {
	struct sf_mpi *mp;
	int rank;
};

static int inv_add_rec(void *arg, const struct sf_mpi_wire_inv_rec *rec)
{
	struct inv_from *from = arg;

	return inv_add(from->mp, rec->name, rec->name_len, rec->file,
		       rec->file_len, from->rank, rec->size);
}

/* Parse rank r's serialized inventory (untrusted bytes) into the map. */
static int inv_parse(struct sf_mpi *mp, int r, const unsigned char *p,
		     size_t len)
{
	struct inv_from from = { mp, r };
	size_t bad_at = 0;
	int ret;

	ret = sf_mpi_wire_inv_parse(p, len, inv_add_rec, &from, &bad_at);
	if (ret == -SF_EPEER)
		sf_err("mpi: rank %d sent a malformed inventory at byte %zu", r,
		       bad_at);
	return ret;
}

/* ------------------------------------------------------------------ */
/* service thread                                                      */

/* Reply status + data to (dest, tag); logs on failure. */
static void reply(struct sf_mpi *mp, int dest, int tag, int64_t status,
		  const void *data, size_t len)
{
	struct sbuf *sb = reply_build(status, data, len);

	if (!sb || send_async(mp, dest, tag, sb) < 0) {
		sf_err("mpi: cannot reply to rank %d", dest);
		free(sb);
	}
}

/* Answer a READ: pread the file straight into the reply buffer. */
static void serve_read(struct sf_mpi *mp, int src,
		       const struct sf_mpi_wire_req *h, const char *name,
		       const char *file)
{
	size_t len = (size_t)h->len; /* <= SF_MPI_MAX_MSG: decoded */
	char path[4096];
	struct sbuf *sb;
	int fd, ret, n;

	if (mp->single)
		n = snprintf(path, sizeof(path), "%s/%s", mp->store, file);
	else if (!name[0])
		n = -1;
	else
		n = snprintf(path, sizeof(path), "%s/%s/%s", mp->store, name, file);
	if (n < 0 || (size_t)n >= sizeof(path)) {
		reply(mp, src, h->reply_tag, -SF_ESHORT, NULL, 0);
		return;
	}
	sb = sbuf_new(sf_mpi_wire_reply_size(len));
	if (!sb) {
		reply(mp, src, h->reply_tag, -ENOMEM, NULL, 0);
		return;
	}
	fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
	if (fd < 0) {
		ret = errno == ENOENT || errno == ENOTDIR ? -SF_ESHORT : -EIO;
	} else {
		ret = sf_pread_full(fd, sb->data + SF_MPI_WIRE_REPLY_HDR, len,
				    h->off);
		close(fd);
	}
	/* The payload is in place already: only the status is written. */
	if (ret < 0)
		sb->len = sf_mpi_wire_reply_size(0);
	sf_mpi_wire_reply_encode(sb->data, ret < 0 ? ret : 0, NULL, 0);
	if (send_async(mp, src, h->reply_tag, sb) < 0) {
		sf_err("mpi: cannot answer rank %d's read of %s", src, file);
		free(sb);
	}
}

static void round_free(struct round *r, int size)
{
	if (!r)
		return;
	if (r->parts)
		for (int i = 0; i < size; i++)
			free(r->parts[i]);
	free(r->parts);
	free(r->lens);
	free(r->have);
	free(r->tag);
	free(r->status);
	free(r->name);
	free(r);
}

static struct round *round_get(struct sf_mpi *mp, enum sf_mpi_msg kind,
			       const char *name, uint32_t timeout_ms)
{
	struct round *r;
	int n = mp->size;

	for (r = mp->rounds; r; r = r->next)
		if (r->kind == kind && strcmp(r->name, name) == 0)
			return r;
	r = calloc(1, sizeof(*r));
	if (!r)
		return NULL;
	r->kind = kind;
	r->name = strdup(name);
	r->have = calloc((size_t)n, sizeof(*r->have));
	r->tag = calloc((size_t)n, sizeof(*r->tag));
	r->status = calloc((size_t)n, sizeof(*r->status));
	r->parts = calloc((size_t)n, sizeof(*r->parts));
	r->lens = calloc((size_t)n, sizeof(*r->lens));
	if (!r->name || !r->have || !r->tag || !r->status || !r->parts ||
	    !r->lens) {
		round_free(r, n);
		return NULL;
	}
	/* Decide a little before the ranks' own deadlines so that they get
	 * the reason rather than their local timeout. */
	r->timeout_ms = timeout_ms;
	r->deadline_ns = now_ns() + (uint64_t)timeout_ms * 900000u;
	r->next = mp->rounds;
	mp->rounds = r;
	return r;
}

static void round_unlink(struct sf_mpi *mp, struct round *r)
{
	for (struct round **pp = &mp->rounds; *pp; pp = &(*pp)->next)
		if (*pp == r) {
			*pp = r->next;
			return;
		}
}

/* Send one verdict (status, text or manifest) to every rank that is in. */
static void round_answer(struct sf_mpi *mp, struct round *r, int64_t status,
			 const void *data, size_t len)
{
	struct sbuf *sb = reply_build(status, data, len);

	if (!sb) {
		sf_err("mpi: out of memory answering the commit of %s", r->name);
		return;
	}
	sb->refs = 1; /* ours, until every send is queued */
	for (int i = 0; i < mp->size; i++)
		if (r->have[i] && send_async(mp, i, r->tag[i], sb) < 0)
			sf_err("mpi: cannot send the verdict on %s to rank %d",
			       r->name, i);
	sbuf_put(mp, sb);
}

/* "1,3,7" of the ranks with have[i] == want, capped. */
static void rank_list(const bool *have, int n, bool want, char *buf,
		      size_t cap)
{
	size_t pos = 0;

	buf[0] = '\0';
	for (int i = 0; i < n && pos + 16 < cap; i++)
		if (have[i] == want)
			pos += (size_t)snprintf(buf + pos, cap - pos, "%s%d",
						pos ? "," : "", i);
	if (pos + 16 >= cap)
		snprintf(buf + pos, cap - pos, ",...");
}

static void round_complete(struct sf_mpi *mp, struct round *r)
{
	char err[SF_MPI_MAX_TEXT] = "";

	if (r->kind == SF_MPI_MSG_COMMIT_PART) {
		sf_merge_fn fn = NULL;
		void *arg = NULL;
		char *out = NULL;
		size_t outlen = 0;
		int ret;

		pthread_mutex_lock(&mp->reg_lock);
		for (struct merge_reg *m = mp->merges; m; m = m->next)
			if (strcmp(m->name, r->name) == 0) {
				fn = m->fn;
				arg = m->arg;
				break;
			}
		pthread_mutex_unlock(&mp->reg_lock);
		if (!fn) {
			ret = -SF_EPEER;
			snprintf(err, sizeof(err),
				 "rank 0 no longer waits for the commit of %s",
				 r->name);
		} else {
			ret = fn(arg, r->name, (const char *const *)r->parts,
				 r->lens, mp->size, &out, &outlen, err,
				 sizeof(err));
			err[sizeof(err) - 1] = '\0';
			if (ret >= 0 && !out) {
				ret = -EIO;
				snprintf(err, sizeof(err), "merge produced nothing");
			}
			if (ret >= 0 && outlen > SF_MAX_MANIFEST_BYTES) {
				ret = -SF_ETOOBIG;
				snprintf(err, sizeof(err),
					 "merged manifest is %zu bytes", outlen);
			}
		}
		if (ret < 0) {
			if (!err[0])
				snprintf(err, sizeof(err), "merge failed: %s",
					 sf_strerror(ret));
			sf_err("mpi: commit of %s: %s", r->name, err);
			round_answer(mp, r, ret, err, strlen(err));
		} else {
			round_answer(mp, r, 0, out, outlen);
		}
		free(out);
	} else {
		int first = 0;
		bool *good = calloc((size_t)mp->size, sizeof(*good));

		for (int i = 0; i < mp->size; i++) {
			if (good)
				good[i] = r->status[i] >= 0;
			if (r->status[i] < 0 && !first)
				first = r->status[i];
		}
		if (!first) {
			round_answer(mp, r, 0, NULL, 0);
		} else {
			char ranks[256] = "?";

			if (good)
				rank_list(good, mp->size, false, ranks,
					  sizeof(ranks));
			snprintf(err, sizeof(err),
				 "rank(s) %s failed to publish %s: %s", ranks,
				 r->name, sf_strerror(first));
			sf_err("mpi: %s", err);
			round_answer(mp, r, first, err, strlen(err));
		}
		free(good);
	}
	round_unlink(mp, r);
	round_free(r, mp->size);
}

/* Expire rounds whose deadline passed: the ranks that are in get the
 * reason, the state is discarded. */
static void rounds_expire(struct sf_mpi *mp)
{
	uint64_t now = now_ns();

	for (struct round *r = mp->rounds, *next; r; r = next) {
		char ranks[256], err[SF_MPI_MAX_TEXT];

		next = r->next;
		if (now < r->deadline_ns)
			continue;
		rank_list(r->have, mp->size, false, ranks, sizeof(ranks));
		snprintf(err, sizeof(err),
			 "rank(s) %s did not %s \"%s\" within %.1f s", ranks,
			 r->kind == SF_MPI_MSG_COMMIT_PART ? "commit" : "report publishing",
			 r->name, r->timeout_ms / 1000.0);
		sf_err("mpi: %s", err);
		round_answer(mp, r, -ETIMEDOUT, err, strlen(err));
		round_unlink(mp, r);
		round_free(r, mp->size);
	}
}

static void serve_commit(struct sf_mpi *mp, int src,
			 const struct sf_mpi_wire_req *h, const char *name)
{
	struct round *r;
	char err[SF_MPI_MAX_TEXT];

	if (mp->rank != 0 || !name[0] || h->timeout_ms == 0) {
		snprintf(err, sizeof(err), "bad commit request to rank %d",
			 mp->rank);
		reply(mp, src, h->reply_tag, -EINVAL, err, strlen(err));
		return;
	}
	r = round_get(mp, (enum sf_mpi_msg)h->kind, name, h->timeout_ms);
	if (!r) {
		reply(mp, src, h->reply_tag, -ENOMEM, "out of memory", 13);
		return;
	}
	if (r->have[src]) {
		snprintf(err, sizeof(err), "rank %d reported %s twice", src, name);
		sf_warn("mpi: %s", err);
		reply(mp, src, h->reply_tag, -EALREADY, err, strlen(err));
		return;
	}
	if (h->kind == SF_MPI_MSG_COMMIT_PART) {
		r->parts[src] = malloc(h->len + 1);
		if (!r->parts[src]) {
			reply(mp, src, h->reply_tag, -ENOMEM, "out of memory", 13);
			return;
		}
		if (h->len)
			memcpy(r->parts[src], h->data, h->len);
		r->parts[src][h->len] = '\0';
		r->lens[src] = h->len;
	} else {
		r->status[src] = sf_mpi_wire_publish_status(h->status);
	}
	r->have[src] = true;
	r->tag[src] = h->reply_tag;
	if (++r->nhave == mp->size)
		round_complete(mp, r);
}

static void serve_notice(struct sf_mpi *mp, int src, const char *name,
			 const char *what)
{
	sf_notice_fn fn;
	void *arg;

	pthread_mutex_lock(&mp->reg_lock);
	fn = mp->notice_fn;
	arg = mp->notice_arg;
	pthread_mutex_unlock(&mp->reg_lock);
	if (fn)
		fn(arg, src, what, name);
}

/* Validate and dispatch one received request (msg, len bytes from src). */
static void serve_one(struct sf_mpi *mp, int src, const unsigned char *msg,
		      size_t len)
{
	struct sf_mpi_wire_req h;
	struct sf_mpi_wire_reject rej;
	char name[SF_MAX_COMPONENT + 1], file[SF_MAX_NAME + 1];

	if (sf_mpi_wire_req_decode(msg, len, mp->tag_ub, &h, &rej) < 0) {
		sf_err("mpi: request from rank %d: %s", src, rej.why);
		if (rej.answer)
			reply(mp, src, rej.reply_tag, rej.answer, rej.text,
			      rej.text ? strlen(rej.text) : 0);
		return;
	}
	/* Decoded: both fit and hold no NUL. */
	memcpy(name, h.name, h.name_len);
	name[h.name_len] = '\0';
	memcpy(file, h.file, h.file_len);
	file[h.file_len] = '\0';

	switch (h.kind) {
	case SF_MPI_MSG_READ:
		serve_read(mp, src, &h, name, file);
		break;
	case SF_MPI_MSG_COMMIT_PART:
	case SF_MPI_MSG_COMMIT_DONE:
		serve_commit(mp, src, &h, name);
		break;
	case SF_MPI_MSG_NOTICE:
		serve_notice(mp, src, name, file);
		break;
	case SF_MPI_MSG_LEAVE:
		if (!mp->left[src]) {
			mp->left[src] = true;
			mp->nleft++;
		}
		break;
	}
}

/* Receive and serve at most one request. Returns 1 if one was handled. */
static int serve_poll(struct sf_mpi *mp)
{
	MPI_Message msg;
	MPI_Status st;
	int flag = 0, count = 0, rc;
	unsigned char *buf;

	rc = MPI_Improbe(MPI_ANY_SOURCE, SF_TAG_REQ, mp->comm, &flag, &msg, &st);
	if (rc != MPI_SUCCESS || !flag)
		return 0;
	MPI_Get_count(&st, MPI_BYTE, &count);
	if (count < 0 || (size_t)count > SF_MPI_WIRE_MAX_REQ) {
		unsigned char sink[sizeof(struct sf_mpi_wire_hdr)];

		/* Drain it into a small buffer (truncated) and drop it. */
		sf_err("mpi: dropping a %d-byte request from rank %d", count,
		       st.MPI_SOURCE);
		MPI_Mrecv(sink, (int)sizeof(sink), MPI_BYTE, &msg,
			  MPI_STATUS_IGNORE);
		return 1;
	}
	buf = malloc(count ? (size_t)count : 1);
	if (!buf) {
		unsigned char sink[sizeof(struct sf_mpi_wire_hdr)];

		sf_err("mpi: out of memory for a request from rank %d",
		       st.MPI_SOURCE);
		MPI_Mrecv(sink, (int)sizeof(sink), MPI_BYTE, &msg,
			  MPI_STATUS_IGNORE);
		return 1;
	}
	rc = MPI_Mrecv(buf, count, MPI_BYTE, &msg, MPI_STATUS_IGNORE);
	if (rc == MPI_SUCCESS && st.MPI_SOURCE >= 0 && st.MPI_SOURCE < mp->size)
		serve_one(mp, st.MPI_SOURCE, buf, (size_t)count);
	else
		mpi_fail("MPI_Mrecv", rc);
	free(buf);
	return 1;
}

static void *service_main(void *arg)
{
	struct sf_mpi *mp = arg;
	unsigned us = 20;
	uint64_t last_note = now_ns(), last_busy = 0;

	for (;;) {
		int busy = 0;

		while (serve_poll(mp) && busy < 64)
			busy++;
		pend_poll(mp);
		if (mp->rank == 0 && mp->rounds)
			rounds_expire(mp);
		if (atomic_load(&mp->leaving)) {
			if (mp->nleft >= mp->size - 1)
				break;
			if (now_ns() - last_note > 60000000000ull) {
				char ranks[256];

				rank_list(mp->left, mp->size, false, ranks,
					  sizeof(ranks));
				sf_info("mpi: still serving; waiting for rank(s) %s to leave",
					ranks);
				last_note = now_ns();
			}
		}
		/* Poll often while peers are reading (a sleep here is latency
		 * on every remote block), back off to 2 ms once they stop. */
		if (busy) {
			us = 20;
			last_busy = now_ns();
		} else {
			backoff(&us, now_ns() - last_busy < SF_MPI_ACTIVE_NS ?
				SF_MPI_SERVE_POLL_US : SF_MPI_IDLE_POLL_US);
		}
	}
	return NULL;
}

/* ------------------------------------------------------------------ */
/* payload source                                                      */

/* Choose the peer for (name, file) bytes [off, off+len): a holder in the
 * inventory (the writer rank first), else the writer rank. */
static int pick_peer(const struct sf_mpi *mp, const char *name,
		     const char *file, uint32_t writer, uint64_t end)
{
	const struct inv_ent *e = inv_find(mp, name, file);
	int best = -1;

	if (!e)
		return (int)writer < mp->size && (int)writer != mp->rank ?
			       (int)writer : -1;
	for (unsigned i = 0; i < e->nh; i++) {
		if (e->h[i].rank == mp->rank || e->h[i].size < end)
			continue;
		if (best < 0 || e->h[i].rank == (int)writer)
			best = e->h[i].rank;
	}
	return best;
}

/* Post the receive for a chunk reply and send its request. *rbuf is a new
 * buffer of sf_mpi_wire_reply_size(len) bytes under *rreq. */
static int post_read(struct sf_mpi *mp, int peer, const char *name,
		     const char *file, uint64_t off, size_t len,
		     unsigned char **rbuf, MPI_Request *rreq)
{
	struct sf_mpi_wire_req h = {
		.kind = SF_MPI_MSG_READ, .off = off, .len = len
	};
	size_t rlen = sf_mpi_wire_reply_size(len);
	struct sbuf *sb;
	int rc;

	h.reply_tag = new_tag(mp);
	*rbuf = malloc(rlen);
	if (!*rbuf)
		return -ENOMEM;
	sb = req_build(&h, name, file);
	if (!sb)
		goto out_free_rbuf;
	rc = MPI_Irecv(*rbuf, (int)rlen, MPI_BYTE, peer, h.reply_tag,
		       mp->comm, rreq);
	if (rc != MPI_SUCCESS) {
		free(sb);
		mpi_fail("MPI_Irecv", rc);
		goto out_free_rbuf;
	}
	/* Requests are small: the send completes locally (eager). */
	rc = MPI_Send(sb->data, (int)sb->len, MPI_BYTE, peer, SF_TAG_REQ,
		      mp->comm);
	free(sb);
	if (rc != MPI_SUCCESS) {
		mpi_fail("MPI_Send", rc);
		recv_abandon(mp, rreq, *rbuf);
		*rbuf = NULL;
		return -SF_EPEER;
	}
	return 0;
out_free_rbuf:
	free(*rbuf);
	*rbuf = NULL;
	return -ENOMEM;
}

/* Wait for a chunk reply of `want` payload bytes and copy len of them,
 * from byte `skip` on, to dst. Consumes rbuf. */
static int finish_read(struct sf_mpi *mp, int peer, const char *file,
		       unsigned char *rbuf, MPI_Request *rreq, size_t want,
		       void *dst, size_t skip, size_t len, uint64_t deadline)
{
	struct sf_mpi_wire_reply rp;
	MPI_Status st;
	int count = 0, ret;

	ret = wait_req(rreq, deadline, &st);
	if (ret < 0) {
		sf_err("mpi: rank %d did not answer a read of %s (%s)", peer,
		       file, ret == -ETIMEDOUT ? "timed out" : "MPI error");
		recv_abandon(mp, rreq, rbuf);
		return -SF_EPEER;
	}
	MPI_Get_count(&st, MPI_BYTE, &count);
	ret = count < 0 ? -SF_EPEER :
	      sf_mpi_wire_read_reply_decode(rbuf, (size_t)count, want, &rp);
	if (ret == 0 && (skip > want || len > want - skip))
		ret = -SF_EPEER;
	if (ret == 0)
		memcpy(dst, rp.data + skip, len);
	else if (ret == -SF_EPEER)
		sf_err("mpi: rank %d answered a read of %s badly (%d bytes)",
		       peer, file, count);
	free(rbuf);
	return ret;
}

/* Read [off, off+len) of a remote file, pipelining chunk requests. */
static int fetch_remote(struct sf_mpi *mp, int peer, const char *name,
			const char *file, uint64_t off, unsigned char *buf,
			size_t len)
{
	struct {
		unsigned char *rbuf;
		MPI_Request req;
		size_t pos, len;
	} q[SF_MPI_INFLIGHT];
	size_t posted = 0, head = 0, tail = 0; /* q ring indexes (mod) */
	uint64_t deadline = now_ns() +
		(uint64_t)atomic_load(&mp->read_timeout_ms) * 1000000u;
	int ret = 0;

	while (head < tail || (posted < len && !ret)) {
		while (!ret && posted < len && tail - head < SF_MPI_INFLIGHT) {
			size_t n = len - posted < SF_MPI_CHUNK ? len - posted :
								SF_MPI_CHUNK;
			size_t i = tail % SF_MPI_INFLIGHT;

			ret = post_read(mp, peer, name, file, off + posted, n,
					&q[i].rbuf, &q[i].req);
			if (ret)
				break;
			q[i].pos = posted;
			q[i].len = n;
			posted += n;
			tail++;
		}
		if (head == tail)
			break;
		{
			size_t i = head % SF_MPI_INFLIGHT;

			/* Failed: drop what is still in flight (a peer that
			 * answered will answer the rest; one that did not is
			 * cancelled). */
			if (ret == -SF_EPEER)
				recv_abandon(mp, &q[i].req, q[i].rbuf);
			else if (ret)
				recv_orphan(mp, &q[i].req, q[i].rbuf);
			else
				ret = finish_read(mp, peer, file, q[i].rbuf,
						  &q[i].req, q[i].len,
						  buf + q[i].pos, 0, q[i].len,
						  deadline);
			head++;
		}
	}
	return ret;
}

static void pf_release(struct sf_mpi *mp, struct pf_slot *s)
{
	free(s->file);
	s->file = NULL;
	s->buf = NULL;
	s->state = PF_FREE;
}

/* Take a pending prefetch covering [off, off+len) of (ck, file), if any. */
static struct pf_slot *pf_claim(struct sf_mpi *mp, const struct sf_ckpt_ref *ck,
				const char *file, uint64_t off, size_t len)
{
	struct pf_slot *hit = NULL;

	pthread_mutex_lock(&mp->src_lock);
	for (int i = 0; i < SF_MPI_PF_SLOTS; i++) {
		struct pf_slot *s = &mp->pf[i];

		if (s->state == PF_PENDING && s->ck == ck && off >= s->off &&
		    off + len <= s->off + s->len && strcmp(s->file, file) == 0) {
			s->state = PF_CLAIMED;
			hit = s;
			break;
		}
	}
	pthread_mutex_unlock(&mp->src_lock);
	return hit;
}

/* Record a read; if it continues a stream, return the range to prefetch. */
static bool stream_next(struct sf_mpi *mp, const struct sf_ckpt_ref *ck,
			const char *file, uint64_t off, size_t len,
			uint64_t *pf_off)
{
	uint64_t fh = fnv64(file, strlen(file));
	struct stream *old = &mp->streams[0];
	bool seq = false;

	pthread_mutex_lock(&mp->src_lock);
	mp->stamp++;
	for (int i = 0; i < SF_MPI_STREAMS; i++) {
		struct stream *s = &mp->streams[i];

		if (s->ck == ck && s->fhash == fh && s->next == off) {
			seq = true;
			old = s;
			break;
		}
		if (s->stamp < old->stamp)
			old = s;
	}
	old->ck = ck;
	old->fhash = fh;
	old->next = off + len;
	old->stamp = mp->stamp;
	pthread_mutex_unlock(&mp->src_lock);
	*pf_off = off + len;
	return seq;
}

/* Start fetching [off, off+len) of a remote file into a free slot (or the
 * oldest unclaimed one). Best effort: failures just skip the prefetch. */
static void pf_issue(struct sf_mpi *mp, const struct sf_ckpt_ref *ck,
		     const char *name, const char *file, int peer, uint64_t off,
		     size_t len)
{
	struct pf_slot *s = NULL;
	unsigned char *rbuf;
	MPI_Request req;
	char *fcopy;

	pthread_mutex_lock(&mp->src_lock);
	for (int i = 0; i < SF_MPI_PF_SLOTS; i++) {
		struct pf_slot *c = &mp->pf[i];

		if (c->state == PF_PENDING && c->ck == ck && c->off == off &&
		    strcmp(c->file, file) == 0) {
			pthread_mutex_unlock(&mp->src_lock);
			return; /* already under way */
		}
		if (c->state == PF_FREE && (!s || s->state != PF_FREE))
			s = c;
		else if (c->state == PF_PENDING &&
			 (!s || (s->state == PF_PENDING && c->stamp < s->stamp)))
			s = c;
	}
	if (!s) {
		pthread_mutex_unlock(&mp->src_lock);
		return;
	}
	if (s->state == PF_PENDING) { /* evict the oldest */
		recv_orphan(mp, &s->req, s->buf);
		pf_release(mp, s);
	}
	s->state = PF_CLAIMED; /* ours while we post */
	pthread_mutex_unlock(&mp->src_lock);

	fcopy = strdup(file);
	if (!fcopy || post_read(mp, peer, name, file, off, len, &rbuf, &req)) {
		free(fcopy);
		pthread_mutex_lock(&mp->src_lock);
		s->state = PF_FREE;
		pthread_mutex_unlock(&mp->src_lock);
		return;
	}
	pthread_mutex_lock(&mp->src_lock);
	s->ck = ck;
	s->file = fcopy;
	s->off = off;
	s->len = len;
	s->peer = peer;
	s->buf = rbuf;
	s->req = req;
	s->stamp = ++mp->stamp;
	s->state = PF_PENDING;
	pthread_mutex_unlock(&mp->src_lock);
}

/* Serve [off, off+len) from a claimed prefetch slot; frees the slot. */
static int pf_consume(struct sf_mpi *mp, struct pf_slot *s, uint64_t off,
		      void *buf, size_t len)
{
	uint64_t deadline = now_ns() +
		(uint64_t)atomic_load(&mp->read_timeout_ms) * 1000000u;
	int ret;

	ret = finish_read(mp, s->peer, s->file, s->buf, &s->req, s->len, buf,
			  off - s->off, len, deadline);
	pthread_mutex_lock(&mp->src_lock);
	pf_release(mp, s);
	pthread_mutex_unlock(&mp->src_lock);
	return ret;
}

static int mpi_src_read(void *ctx, const struct sf_ckpt_ref *ck, uint32_t rank,
			const char *file, uint64_t off, void *buf, size_t len)
{
	struct sf_mpi *mp = ctx;
	const char *name = mp->single ? "" : ck->name;
	char path[4096];
	struct pf_slot *s;
	struct stat sb;
	uint64_t pf_off;
	int peer, ret;

	if (!sf_relpath_valid(file) ||
	    !sf_mpi_wire_ckpt_name_ok(name, strlen(name)))
		return -EINVAL;
	if (len == 0)
		return 0;
	if (off > UINT64_MAX - len)
		return -SF_ERANGE;
	ret = mp->local->ops->read(mp->local->ctx, ck, rank, file, off, buf, len);
	if (ret != -SF_ESHORT)
		return ret;
	if ((size_t)snprintf(path, sizeof(path), "%s/%s", ck->dir, file) >=
	    sizeof(path))
		return -ENAMETOOLONG;
	if (stat(path, &sb) == 0)
		return -SF_ESHORT; /* here, but short: a peer's copy won't help */

	peer = pick_peer(mp, name, file, rank, off + len);
	if (peer < 0)
		return -SF_ESHORT;
	s = pf_claim(mp, ck, file, off, len);
	if (s) {
		ret = pf_consume(mp, s, off, buf, len);
		if (ret == 0)
			goto out_prefetch;
	}
	ret = fetch_remote(mp, peer, name, file, off, buf, len);
	if (ret)
		return ret;
out_prefetch:
	/* A sequential stream: keep the next SF_MPI_PF_DEPTH ranges of the
	 * same length under way (pf_issue skips one already pending). */
	if (stream_next(mp, ck, file, off, len, &pf_off)) {
		const struct inv_ent *e = inv_find(mp, name, file);
		uint64_t step = len < SF_MPI_PF_MAX ? len : SF_MPI_PF_MAX;
		uint64_t size = UINT64_MAX; /* unknown file: best effort */

		for (unsigned i = 0; e && i < e->nh; i++)
			if (e->h[i].rank == peer)
				size = e->h[i].size;
		for (int k = 0; k < SF_MPI_PF_DEPTH && pf_off < size;
		     k++, pf_off += step)
			pf_issue(mp, ck, name, file, peer, pf_off,
				 (size_t)(size - pf_off < step ? size - pf_off :
								 step));
	}
	return 0;
}

static void mpi_src_forget(void *ctx, const struct sf_ckpt_ref *ck)
{
	struct sf_mpi *mp = ctx;

	mp->local->ops->forget(mp->local->ctx, ck);
	pthread_mutex_lock(&mp->src_lock);
	for (int i = 0; i < SF_MPI_PF_SLOTS; i++) {
		struct pf_slot *s = &mp->pf[i];

		if (s->state == PF_PENDING && s->ck == ck) {
			recv_orphan(mp, &s->req, s->buf);
			pf_release(mp, s);
		}
	}
	for (int i = 0; i < SF_MPI_STREAMS; i++)
		if (mp->streams[i].ck == ck)
			mp->streams[i].ck = NULL;
	pthread_mutex_unlock(&mp->src_lock);
}

static const struct sf_source_ops mpi_src_ops = {
	.read = mpi_src_read,
	.forget = mpi_src_forget,
	.destroy = NULL, /* owned by the handle: freed by sf_mpi_finalize */
};

struct sf_source *sf_mpi_source(struct sf_mpi *mp)
{
	return mp && mp->started ? &mp->src : NULL;
}

void sf_mpi_set_read_timeout(struct sf_mpi *mp, int timeout_ms)
{
	if (mp && timeout_ms > 0)
		atomic_store(&mp->read_timeout_ms, timeout_ms);
}

/* ------------------------------------------------------------------ */
/* lifecycle                                                           */

int sf_mpi_built(void)
{
	return 1;
}

int sf_mpi_rank(const struct sf_mpi *mp)
{
	return mp ? mp->rank : -EINVAL;
}

int sf_mpi_size(const struct sf_mpi *mp)
{
	return mp ? mp->size : -EINVAL;
}

int sf_mpi_init(int *argc, char ***argv, struct sf_mpi **out)
{
	struct sf_mpi *mp;
	int inited = 0, provided = 0, rc, flag = 0, ret;
	char prefix[64];
	void *ub = NULL;

	mp = calloc(1, sizeof(*mp));
	if (!mp)
		return -ENOMEM;
	MPI_Initialized(&inited);
	if (!inited) {
		rc = MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
		if (rc != MPI_SUCCESS) {
			ret = mpi_fail("MPI_Init_thread", rc);
			goto out_free_mp;
		}
		mp->own_init = true;
	} else {
		MPI_Query_thread(&provided);
	}
	if (provided < MPI_THREAD_MULTIPLE) {
		sf_err("mpi: the MPI library does not provide MPI_THREAD_MULTIPLE (got level %d)",
		       provided);
		ret = -ENOTSUP;
		goto out_finalize;
	}
	rc = MPI_Comm_dup(MPI_COMM_WORLD, &mp->comm);
	if (rc != MPI_SUCCESS) {
		ret = mpi_fail("MPI_Comm_dup", rc);
		goto out_finalize;
	}
	MPI_Comm_set_errhandler(mp->comm, MPI_ERRORS_RETURN);
	MPI_Comm_rank(mp->comm, &mp->rank);
	MPI_Comm_size(mp->comm, &mp->size);
	if (mp->size > (int)SF_MAX_WORLD) {
		sf_err("mpi: %d ranks exceed the limit of %u", mp->size,
		       SF_MAX_WORLD);
		ret = -SF_ETOOBIG;
		goto out_free_comm;
	}
	MPI_Comm_get_attr(mp->comm, MPI_TAG_UB, &ub, &flag);
	mp->tag_ub = flag && ub ? *(int *)ub : 32767;
	mp->left = calloc((size_t)mp->size, sizeof(*mp->left));
	if (!mp->left) {
		ret = -ENOMEM;
		goto out_free_comm;
	}
	pthread_mutex_init(&mp->pend_lock, NULL);
	pthread_mutex_init(&mp->reg_lock, NULL);
	pthread_mutex_init(&mp->src_lock, NULL);
	atomic_init(&mp->next_tag, 0);
	atomic_init(&mp->leaving, false);
	atomic_init(&mp->read_timeout_ms, SF_MPI_READ_TIMEOUT_MS);
	mp->left[mp->rank] = true; /* "left" lists the ranks not to wait for */
	snprintf(prefix, sizeof(prefix), "[rank %d] shardfs: ", mp->rank);
	sf_log_setup(prefix, SF_LOG_INFO);
	*out = mp;
	return 0;

out_free_comm:
	MPI_Comm_free(&mp->comm);
out_finalize:
	if (mp->own_init)
		MPI_Finalize();
out_free_mp:
	free(mp);
	return ret;
}

int sf_mpi_start(struct sf_mpi *mp, const char *store, int single)
{
	struct sf_mpi_wire_inv_buf ib = { 0 };
	int *counts = NULL, *displs = NULL;
	unsigned char *all = NULL;
	int mine, rc, ret, anybad;
	long long total = 0;

	if (!mp || !store || mp->started)
		return -EINVAL;
	mp->store = strdup(store);
	if (!mp->store)
		return -ENOMEM;
	mp->single = single ? 1 : 0;
	ret = sf_local_source_create(&mp->local);
	if (ret)
		goto out_free_store;

	ret = build_inventory(store, mp->single, &ib);
	if (ret)
		sf_err("mpi: cannot index store %s: %s", store, sf_strerror(ret));
	/* Everyone learns whether anyone failed, so all fail together. */
	rc = MPI_Allreduce(&(int){ ret ? 1 : 0 }, &anybad, 1, MPI_INT, MPI_MAX,
			   mp->comm);
	if (rc != MPI_SUCCESS) {
		ret = mpi_fail("MPI_Allreduce", rc);
		goto out_free_ib;
	}
	if (anybad) {
		ret = ret ? ret : -SF_EPEER;
		goto out_free_ib;
	}
	counts = calloc((size_t)mp->size, sizeof(*counts));
	displs = calloc((size_t)mp->size, sizeof(*displs));
	if (!counts || !displs) {
		ret = -ENOMEM; /* the peers will block in Allgather: fatal */
		sf_err("mpi: out of memory exchanging inventories");
		MPI_Abort(MPI_COMM_WORLD, 1);
		goto out_free_counts;
	}
	mine = (int)ib.len;
	rc = MPI_Allgather(&mine, 1, MPI_INT, counts, 1, MPI_INT, mp->comm);
	if (rc != MPI_SUCCESS) {
		ret = mpi_fail("MPI_Allgather", rc);
		goto out_free_counts;
	}
	for (int i = 0; i < mp->size; i++) {
		if (counts[i] < 0 || counts[i] > (int)SF_MPI_WIRE_MAX_INV_BYTES)
			total = -1;
		if (total < 0)
			break;
		displs[i] = (int)total;
		total += counts[i];
		if (total > 0x7fffffffLL)
			total = -1;
	}
	if (total < 0) {
		/* Every rank sees the same counts, so all fail here together. */
		sf_err("mpi: the inventories are too large to exchange");
		ret = -SF_ETOOBIG;
		goto out_free_counts;
	}
	all = malloc(total ? (size_t)total : 1);
	if (!all) {
		sf_err("mpi: out of memory for %lld inventory bytes", total);
		MPI_Abort(MPI_COMM_WORLD, 1);
		ret = -ENOMEM;
		goto out_free_counts;
	}
	rc = MPI_Allgatherv(ib.p ? ib.p : (unsigned char *)"", mine, MPI_BYTE,
			    all, counts, displs, MPI_BYTE, mp->comm);
	if (rc != MPI_SUCCESS) {
		ret = mpi_fail("MPI_Allgatherv", rc);
		goto out_free_all;
	}
	for (int i = 0; i < mp->size && !ret; i++)
		ret = inv_parse(mp, i, all + displs[i], (size_t)counts[i]);
	if (ret)
		goto out_free_inv;

	mp->src.ops = &mpi_src_ops;
	mp->src.ctx = mp;
	ret = pthread_create(&mp->thread, NULL, service_main, mp);
	if (ret) {
		ret = -ret;
		sf_err("mpi: cannot start the service thread: %s", strerror(-ret));
		goto out_free_inv;
	}
	mp->started = true;
	sf_info("mpi: %zu local payload files indexed, %lld inventory bytes from %d ranks",
		ib.nfiles, total, mp->size);
	goto out_free_all;

out_free_inv:
	inv_free(mp);
out_free_all:
	free(all);
out_free_counts:
	free(counts);
	free(displs);
out_free_ib:
	sf_mpi_wire_inv_release(&ib);
	if (mp->started)
		return 0;
	sf_source_destroy(mp->local);
	mp->local = NULL;
out_free_store:
	free(mp->store);
	mp->store = NULL;
	return ret;
}

/* Send a request to rank 0 and wait for its verdict on `tag`; the verdict
 * payload (NUL-terminated) goes to *payload (malloc'd) on success. */
static int coord_call(struct sf_mpi *mp, struct sbuf *sb, int tag,
		      int timeout_ms, char **payload, size_t *plen, char *err,
		      size_t errlen)
{
	uint64_t deadline = now_ns() + (uint64_t)timeout_ms * 1000000u;
	MPI_Request sreq;
	MPI_Message msg;
	MPI_Status st;
	struct sf_mpi_wire_reply v;
	unsigned char *buf;
	int rc, flag = 0, count = 0, ret;
	unsigned us = 50;

	rc = MPI_Isend(sb->data, (int)sb->len, MPI_BYTE, 0, SF_TAG_REQ,
		       mp->comm, &sreq);
	if (rc != MPI_SUCCESS) {
		snprintf(err, errlen, "cannot send to rank 0");
		return mpi_fail("MPI_Isend", rc);
	}
	ret = wait_req(&sreq, deadline, MPI_STATUS_IGNORE);
	if (ret < 0) {
		/* sb stays allocated: the send may still be in progress. */
		MPI_Cancel(&sreq);
		MPI_Request_free(&sreq);
		snprintf(err, errlen, "rank 0 did not take the request within %d ms",
			 timeout_ms);
		sf_err("mpi: %s", err);
		return -ETIMEDOUT;
	}
	free(sb);
	for (;;) {
		rc = MPI_Improbe(0, tag, mp->comm, &flag, &msg, &st);
		if (rc != MPI_SUCCESS) {
			snprintf(err, errlen, "MPI error waiting for rank 0");
			return mpi_fail("MPI_Improbe", rc);
		}
		if (flag)
			break;
		if (now_ns() >= deadline) {
			snprintf(err, errlen, "no verdict from rank 0 within %d ms",
				 timeout_ms);
			sf_err("mpi: %s", err);
			return -ETIMEDOUT;
		}
		backoff(&us, 2000);
	}
	MPI_Get_count(&st, MPI_BYTE, &count);
	/* Sized before it is received: drain anything out of bounds. */
	if (count < SF_MPI_WIRE_REPLY_HDR ||
	    (size_t)count > SF_MPI_WIRE_MAX_VERDICT) {
		unsigned char sink[SF_MPI_WIRE_REPLY_HDR];

		MPI_Mrecv(sink, (int)sizeof(sink), MPI_BYTE, &msg,
			  MPI_STATUS_IGNORE);
		goto out_bad;
	}
	buf = malloc((size_t)count + 1);
	if (!buf) {
		unsigned char sink[SF_MPI_WIRE_REPLY_HDR];

		MPI_Mrecv(sink, (int)sizeof(sink), MPI_BYTE, &msg,
			  MPI_STATUS_IGNORE);
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	rc = MPI_Mrecv(buf, count, MPI_BYTE, &msg, MPI_STATUS_IGNORE);
	if (rc != MPI_SUCCESS) {
		free(buf);
		snprintf(err, errlen, "MPI error receiving rank 0's verdict");
		return mpi_fail("MPI_Mrecv", rc);
	}
	if (sf_mpi_wire_verdict_decode(buf, (size_t)count, &v) < 0) {
		free(buf);
		goto out_bad;
	}
	if (v.status < 0) {
		sf_mpi_wire_text(err, errlen, v.data, v.len);
		free(buf);
		return sf_mpi_wire_verdict_error(v.status);
	}
	if (payload) {
		/* The manifest moves to the front, NUL-terminated. */
		memmove(buf, v.data, v.len);
		buf[v.len] = '\0';
		*payload = (char *)buf;
		*plen = v.len;
	} else {
		free(buf);
	}
	return 0;
out_bad:
	snprintf(err, errlen, "bad %d-byte verdict from rank 0", count);
	sf_err("mpi: %s", err);
	return -SF_EPEER;
}

int sf_mpi_commit(struct sf_mpi *mp, const char *ckpt, const char *part,
		  size_t partlen, sf_merge_fn merge, void *merge_arg,
		  int timeout_ms, char **manifest, size_t *manifest_len,
		  char *err, size_t errlen)
{
	struct sf_mpi_wire_req h = { .kind = SF_MPI_MSG_COMMIT_PART };
	struct merge_reg *reg = NULL;
	struct sbuf *sb;
	int ret;

	if (errlen)
		err[0] = '\0';
	if (!mp || !mp->started || !ckpt || !ckpt[0] ||
	    !sf_mpi_wire_ckpt_name_ok(ckpt, strlen(ckpt)) || (!part && partlen) ||
	    timeout_ms <= 0 || !manifest || !manifest_len ||
	    (mp->rank == 0 && !merge)) {
		snprintf(err, errlen, "bad arguments to commit");
		return -EINVAL;
	}
	if (partlen > SF_MPI_MAX_PART) {
		snprintf(err, errlen, "commit part of %zu bytes exceeds %u",
			 partlen, SF_MPI_MAX_PART);
		return -SF_ETOOBIG;
	}
	h.len = partlen;
	h.data = (const unsigned char *)part;
	h.timeout_ms = (uint32_t)timeout_ms;
	h.reply_tag = new_tag(mp);
	sb = req_build(&h, ckpt, NULL);
	if (!sb) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	if (mp->rank == 0) {
		reg = calloc(1, sizeof(*reg));
		if (!reg || !(reg->name = strdup(ckpt))) {
			free(reg);
			free(sb);
			snprintf(err, errlen, "out of memory");
			return -ENOMEM;
		}
		reg->fn = merge;
		reg->arg = merge_arg;
		pthread_mutex_lock(&mp->reg_lock);
		reg->next = mp->merges;
		mp->merges = reg;
		pthread_mutex_unlock(&mp->reg_lock);
	}
	ret = coord_call(mp, sb, h.reply_tag, timeout_ms, manifest,
			 manifest_len, err, errlen);
	if (reg) {
		pthread_mutex_lock(&mp->reg_lock);
		for (struct merge_reg **pp = &mp->merges; *pp; pp = &(*pp)->next)
			if (*pp == reg) {
				*pp = reg->next;
				break;
			}
		pthread_mutex_unlock(&mp->reg_lock);
		free(reg->name);
		free(reg);
	}
	return ret;
}

int sf_mpi_commit_done(struct sf_mpi *mp, const char *ckpt, int publish_result,
		       int timeout_ms, char *err, size_t errlen)
{
	struct sf_mpi_wire_req h = { .kind = SF_MPI_MSG_COMMIT_DONE };
	struct sbuf *sb;

	if (errlen)
		err[0] = '\0';
	if (!mp || !mp->started || !ckpt || !ckpt[0] ||
	    !sf_mpi_wire_ckpt_name_ok(ckpt, strlen(ckpt)) || timeout_ms <= 0) {
		snprintf(err, errlen, "bad arguments to commit_done");
		return -EINVAL;
	}
	h.status = publish_result < 0 ? publish_result : 0;
	h.timeout_ms = (uint32_t)timeout_ms;
	h.reply_tag = new_tag(mp);
	sb = req_build(&h, ckpt, NULL);
	if (!sb) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	return coord_call(mp, sb, h.reply_tag, timeout_ms, NULL, NULL, err,
			  errlen);
}

void sf_mpi_set_notice(struct sf_mpi *mp, sf_notice_fn fn, void *arg)
{
	if (!mp)
		return;
	pthread_mutex_lock(&mp->reg_lock);
	mp->notice_fn = fn;
	mp->notice_arg = arg;
	pthread_mutex_unlock(&mp->reg_lock);
}

/* Send a body-less message of `kind` to every other rank, asynchronously. */
static int broadcast(struct sf_mpi *mp, enum sf_mpi_msg kind, const char *what,
		     const char *ckpt)
{
	struct sf_mpi_wire_req h = { .kind = kind };
	struct sbuf *sb = req_build(&h, ckpt, what);
	int ret = 0;

	if (!sb)
		return -ENOMEM;
	sb->refs = 1; /* ours, until every send is queued */
	for (int i = 0; i < mp->size; i++) {
		int r;

		if (i == mp->rank)
			continue;
		r = send_async(mp, i, SF_TAG_REQ, sb);
		if (r && !ret)
			ret = r;
	}
	sbuf_put(mp, sb);
	return ret;
}

int sf_mpi_notify(struct sf_mpi *mp, const char *what, const char *ckpt)
{
	if (!mp || !mp->started || !what || !ckpt)
		return -EINVAL;
	if (!sf_mpi_wire_what_ok(what, strnlen(what, SF_MPI_WIRE_MAX_WHAT + 1)) ||
	    !sf_mpi_wire_ckpt_name_ok(ckpt, strlen(ckpt)))
		return -EINVAL;
	return broadcast(mp, SF_MPI_MSG_NOTICE, what, ckpt);
}

/* Let every outstanding prefetch finish (bounded), so that the peers'
 * replies complete instead of waiting on a cancelled receive; what does not
 * finish in time is abandoned. No reader runs any more. */
static void pf_drain(struct sf_mpi *mp, unsigned drain_ms)
{
	uint64_t deadline = now_ns() + (uint64_t)drain_ms * 1000000u;

	pthread_mutex_lock(&mp->src_lock);
	for (int i = 0; i < SF_MPI_PF_SLOTS; i++) {
		struct pf_slot *s = &mp->pf[i];

		if (s->state != PF_PENDING)
			continue;
		if (wait_req(&s->req, deadline, MPI_STATUS_IGNORE) == 0)
			free(s->buf);
		else
			recv_abandon(mp, &s->req, s->buf);
		pf_release(mp, s);
	}
	pthread_mutex_unlock(&mp->src_lock);
}

/* Finish or cancel whatever is still pending, waiting at most drain_ms for
 * sends; abandoned receives are cancelled. */
static void pend_drain(struct sf_mpi *mp, unsigned drain_ms)
{
	uint64_t deadline = now_ns() + (uint64_t)drain_ms * 1000000u;
	unsigned us = 50;

	while (pend_poll(mp) && now_ns() < deadline)
		backoff(&us, 2000);
	pthread_mutex_lock(&mp->pend_lock);
	for (struct pend *p = mp->pend, *next; p; p = next) {
		int done = 0;

		next = p->next;
		MPI_Cancel(&p->req);
		MPI_Test(&p->req, &done, MPI_STATUS_IGNORE);
		if (done) {
			if (p->sb && --p->sb->refs == 0)
				free(p->sb);
			free(p->rbuf);
		} else {
			/* MPI still owns the buffer: leak it, never free it. */
			MPI_Request_free(&p->req);
			sf_warn("mpi: %s of %zu bytes never completed",
				p->sb ? "a reply" : "an abandoned receive",
				p->sb ? p->sb->len : (size_t)0);
		}
		free(p);
	}
	mp->pend = NULL;
	pthread_mutex_unlock(&mp->pend_lock);
}

int sf_mpi_finalize(struct sf_mpi *mp)
{
	int ret = 0;

	if (!mp)
		return 0;
	if (mp->started) {
		pf_drain(mp, SF_MPI_SEND_DRAIN_MS);
		atomic_store(&mp->leaving, true);
		ret = broadcast(mp, SF_MPI_MSG_LEAVE, NULL, NULL);
		if (ret)
			sf_err("mpi: cannot tell the peers that this rank leaves: %s",
			       sf_strerror(ret));
		pthread_join(mp->thread, NULL);
		pend_drain(mp, SF_MPI_SEND_DRAIN_MS);
		for (struct round *r = mp->rounds, *next; r; r = next) {
			next = r->next;
			round_free(r, mp->size);
		}
		inv_free(mp);
		sf_source_destroy(mp->local);
		free(mp->store);
	}
	for (struct merge_reg *m = mp->merges, *next; m; m = next) {
		next = m->next;
		free(m->name);
		free(m);
	}
	MPI_Comm_free(&mp->comm);
	if (mp->own_init)
		MPI_Finalize();
	pthread_mutex_destroy(&mp->pend_lock);
	pthread_mutex_destroy(&mp->reg_lock);
	pthread_mutex_destroy(&mp->src_lock);
	free(mp->left);
	free(mp);
	return ret;
}
