/*
 * sf_mpi_xfer.c - the transport under the MPI peer layer: reply tags, shared
 * send buffers (malloc'd, from the buffer cache, or a leased mapping of a
 * payload file), asynchronous sends on the pending list, abandoned
 * receives (zombies), receives taken back from a caller's buffer, and
 * waiting on a request against a deadline.
 *
 * Invariants: a buffer under an MPI request is freed only after the request
 * completed (pend_lock guards the list, the buffer cache and the list of
 * mapped send buffers); a requester that gives up cancels its receive or
 * hands it over as a zombie, which pend_poll completes; a mapped send
 * buffer keeps its lease until it is freed or its bytes were copied into
 * anonymous memory at the same addresses.
 */
#include "sf_mpi_int.h"
#include <stddef.h>
#include <sys/mman.h>

/* ------------------------------------------------------------------ */
/* small helpers                                                       */

uint64_t sf_mpi_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Sleep for a poll sf_mpi_backoff step (*us microseconds), doubling up to max. */
void sf_mpi_backoff(unsigned *us, unsigned max)
{
	struct timespec ts = { 0, (long)*us * 1000 };

	nanosleep(&ts, NULL);
	if (*us < max)
		*us = *us * 2 > max ? max : *us * 2;
}

uint64_t sf_mpi_fnv64(const void *p, size_t n)
{
	const unsigned char *s = p;
	uint64_t h = 14695981039346656037ull;

	while (n--)
		h = (h ^ *s++) * 1099511628211ull;
	return h;
}

int sf_mpi_fail(const char *what, int rc)
{
	char msg[MPI_MAX_ERROR_STRING];
	int n = 0;

	if (MPI_Error_string(rc, msg, &n) != MPI_SUCCESS)
		snprintf(msg, sizeof(msg), "error %d", rc);
	sf_err("mpi: %s failed: %s", what, msg);
	return -SF_EPEER;
}

int sf_mpi_new_tag(struct sf_mpi *mp)
{
	unsigned span = (unsigned)(mp->tag_ub - SF_MPI_WIRE_TAG_BASE) + 1;

	return SF_MPI_WIRE_TAG_BASE +
	       (int)(atomic_fetch_add(&mp->next_tag, 1) % span);
}

/*
 * The buffer cache: large buffers (reply payloads, prefetched bodies) go
 * back to a free list, up to SF_MPI_BUF_KEEP bytes, and are handed out
 * again, so that steady-state transfers reuse memory instead of faulting
 * in fresh pages (on a VM a fresh page can cost tens of microseconds: a
 * 4 MiB buffer several milliseconds). A buffer is preceded by its header;
 * the free list is under pend_lock, since send buffers are freed there.
 */
struct pbuf {
	size_t cap;                      /* bytes after the header */
	struct pbuf *next;               /* free list */
	max_align_t align;
};

/* The smallest free buffer that fits len without wasting over a quarter of
 * it, or NULL. Locked. */
static struct pbuf *buf_take_locked(struct sf_mpi *mp, size_t len)
{
	struct pbuf **best = NULL;

	for (struct pbuf **pp = &mp->bufs; *pp; pp = &(*pp)->next)
		if ((*pp)->cap >= len && (*pp)->cap - len <= len / 4 &&
		    (!best || (*pp)->cap < (*best)->cap))
			best = pp;
	if (!best)
		return NULL;
	struct pbuf *b = *best;
	*best = b->next;
	mp->buf_bytes -= b->cap;
	return b;
}

static void buf_put_locked(struct sf_mpi *mp, void *p)
{
	struct pbuf *b = (struct pbuf *)p - 1;

	if (mp->buf_bytes + b->cap > SF_MPI_BUF_KEEP) {
		free(b);
		return;
	}
	b->next = mp->bufs;
	mp->bufs = b;
	mp->buf_bytes += b->cap;
}

/* A new buffer of at least len bytes (rounded up to 64 KiB), or NULL. */
static void *buf_new(size_t len)
{
	struct pbuf *b;
	size_t cap = (len + 65535) & ~(size_t)65535;

	if (cap < len || cap > SIZE_MAX - sizeof(*b) || !(b = malloc(sizeof(*b) + cap)))
		return NULL;
	b->cap = cap;
	return b + 1;
}

/* A buffer of at least len bytes (from the cache, else new); NULL when out
 * of memory. Give it back with sf_mpi_buf_put. */
void *sf_mpi_buf_get(struct sf_mpi *mp, size_t len)
{
	struct pbuf *b;

	pthread_mutex_lock(&mp->pend_lock);
	b = buf_take_locked(mp, len);
	pthread_mutex_unlock(&mp->pend_lock);
	return b ? b + 1 : buf_new(len);
}

void sf_mpi_buf_put(struct sf_mpi *mp, void *p)
{
	if (!p)
		return;
	pthread_mutex_lock(&mp->pend_lock);
	buf_put_locked(mp, p);
	pthread_mutex_unlock(&mp->pend_lock);
}

/* A send buffer of len bytes, no references yet. */
struct sbuf *sf_mpi_sbuf_new(size_t len)
{
	struct sbuf *sb = malloc(sizeof(*sb) + len);

	if (!sb)
		return NULL;
	sb->refs = 0;
	sb->len = len;
	sb->pooled = false;
	sb->map = NULL;
	return sb;
}

/* The same from the buffer cache (freed by sf_mpi_sbuf_free). */
struct sbuf *sf_mpi_sbuf_big(struct sf_mpi *mp, size_t len)
{
	struct sbuf *sb = sf_mpi_buf_get(mp, sizeof(*sb) + len);

	if (!sb)
		return NULL;
	sb->refs = 0;
	sb->len = len;
	sb->pooled = true;
	sb->map = NULL;
	return sb;
}

/* Encode request r, with name and file given as C strings (NULL: none),
 * into a new send buffer. NULL when out of memory or when r breaks a wire
 * cap (the callers check their arguments first). */
struct sbuf *sf_mpi_req_build(struct sf_mpi_wire_req *r, const char *name,
			      const char *file)
{
	struct sbuf *sb;
	size_t len;

	r->name = name;
	r->name_len = name ? strlen(name) : 0;
	r->file = file;
	r->file_len = file ? strlen(file) : 0;
	if (sf_mpi_wire_req_size(r, &len) < 0 || !(sb = sf_mpi_sbuf_new(len)))
		return NULL;
	if (sf_mpi_wire_req_encode(r, sb->data, sb->len) < 0) {
		free(sb);
		return NULL;
	}
	return sb;
}

/* Reply buffer [int64 status][payload]. */
struct sbuf *sf_mpi_reply_build(int64_t status, const void *data, size_t len)
{
	struct sbuf *sb = sf_mpi_sbuf_new(sf_mpi_wire_reply_size(len));

	if (sb)
		sf_mpi_wire_reply_encode(sb->data, status, data, len);
	return sb;
}

/* Isend sb to dest and leave it on the pending list (sb is freed once its
 * last send completes). Never blocks on the peer. */
int sf_mpi_send_async(struct sf_mpi *mp, int dest, int tag, struct sbuf *sb)
{
	return sf_mpi_send_part(mp, dest, tag, sb, 0, sb->len);
}

void sf_mpi_sbuf_map(struct sf_mpi *mp, struct sbuf *sb, void *map,
		     size_t maplen, int fd)
{
	sb->map = map;
	sb->maplen = maplen;
	sb->fd = fd;
	sb->map_ns = sf_mpi_now_ns();
	pthread_mutex_lock(&mp->pend_lock);
	sb->mnext = mp->mapped;
	mp->mapped = sb;
	pthread_mutex_unlock(&mp->pend_lock);
}

/* Drop sb's lease and close its fd. Locked (pend_lock). */
static void map_unlease_locked(struct sf_mpi *mp, struct sbuf *sb)
{
	for (struct sbuf **pp = &mp->mapped; *pp; pp = &(*pp)->mnext)
		if (*pp == sb) {
			*pp = sb->mnext;
			break;
		}
	fcntl(sb->fd, F_SETLEASE, F_UNLCK);
	close(sb->fd);
	sb->fd = -1;
}

/*
 * Replace the file mapping under a send with an anonymous copy of the same
 * bytes at the same addresses, so that the lease can go while MPI may
 * still read them. The copy is taken while the lease still holds (the file
 * is intact: no SIGBUS); mremap swaps the pages in one step. 0, or -1 when
 * out of memory (the lease stays, to be tried again). Locked.
 */
static int map_to_anon_locked(struct sbuf *sb)
{
	void *copy = mmap(NULL, sb->maplen, PROT_READ | PROT_WRITE,
			  MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	if (copy == MAP_FAILED)
		return -1;
	memcpy(copy, sb->map, sb->maplen);
	if (mremap(copy, sb->maplen, sb->maplen, MREMAP_MAYMOVE | MREMAP_FIXED,
		   sb->map) == MAP_FAILED) {
		munmap(copy, sb->maplen);
		return -1;
	}
	return 0;
}

void sf_mpi_map_release(struct sf_mpi *mp, bool all)
{
	uint64_t now = sf_mpi_now_ns();

	pthread_mutex_lock(&mp->pend_lock);
	for (struct sbuf *sb = mp->mapped, *next; sb; sb = next) {
		next = sb->mnext;
		if ((all || now - sb->map_ns >
			    (uint64_t)SF_MPI_MAP_HOLD_MS * 1000000u) &&
		    map_to_anon_locked(sb) == 0)
			map_unlease_locked(mp, sb);
	}
	pthread_mutex_unlock(&mp->pend_lock);
}

/* Free sb (its last reference is gone). Locked (pend_lock). */
void sf_mpi_sbuf_free(struct sf_mpi *mp, struct sbuf *sb)
{
	if (sb && sb->map) {
		if (sb->fd >= 0)
			map_unlease_locked(mp, sb);
		munmap(sb->map, sb->maplen);
	}
	if (sb && sb->pooled)
		buf_put_locked(mp, sb);
	else
		free(sb);
}

/* The same for bytes [off, off+len) of sb only (off + len <= sb->len). */
int sf_mpi_send_part(struct sf_mpi *mp, int dest, int tag, struct sbuf *sb,
		     size_t off, size_t len)
{
	return sf_mpi_send_ptr(mp, dest, tag, sb, sb->data + off, len);
}

int sf_mpi_send_ptr(struct sf_mpi *mp, int dest, int tag, struct sbuf *sb,
		    const void *ptr, size_t len)
{
	struct pend *p = calloc(1, sizeof(*p));
	int rc;

	if (!p)
		return -ENOMEM;
	pthread_mutex_lock(&mp->pend_lock);
	rc = MPI_Isend(ptr, (int)len, MPI_BYTE, dest, tag, mp->comm,
		       &p->req);
	if (rc != MPI_SUCCESS) {
		pthread_mutex_unlock(&mp->pend_lock);
		free(p);
		return sf_mpi_fail("MPI_Isend", rc);
	}
	sb->refs++;
	p->sb = sb;
	p->next = mp->pend;
	mp->pend = p;
	pthread_mutex_unlock(&mp->pend_lock);
	return 0;
}

int sf_mpi_send_nowait(struct sf_mpi *mp, int dest, int tag, struct sbuf *sb)
{
	MPI_Request req;
	struct pend *p;
	int rc, done = 0;

	rc = MPI_Isend(sb->data, (int)sb->len, MPI_BYTE, dest, tag, mp->comm,
		       &req);
	if (rc != MPI_SUCCESS)
		return sf_mpi_fail("MPI_Isend", rc);
	if (MPI_Test(&req, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && done) {
		free(sb);
		return 0;
	}
	p = calloc(1, sizeof(*p));
	if (!p) {
		/* MPI still reads sb: let the request go, keep sb (leaked) */
		sf_err("mpi: out of memory tracking a send to rank %d", dest);
		MPI_Request_free(&req);
		return 0;
	}
	sb->refs = 1;
	p->req = req;
	p->sb = sb;
	pthread_mutex_lock(&mp->pend_lock);
	p->next = mp->pend;
	mp->pend = p;
	pthread_mutex_unlock(&mp->pend_lock);
	return 0;
}

/*
 * Sending one sbuf to several ranks: the sender holds its own reference
 * (refs = 1 before the first sf_mpi_send_async) for the whole loop, because any
 * thread's sf_mpi_pend_poll may complete and free an earlier send meanwhile, and
 * drops it here. Takes pend_lock.
 */
void sf_mpi_sbuf_put(struct sf_mpi *mp, struct sbuf *sb)
{
	pthread_mutex_lock(&mp->pend_lock);
	if (--sb->refs == 0)
		sf_mpi_sbuf_free(mp, sb);
	pthread_mutex_unlock(&mp->pend_lock);
}

/* Give up on a receive. A request to a peer that failed or timed out is
 * cancelled (cancel true); one whose peer will still answer (an unused
 * prefetch) is left to complete, so that the peer's reply does not hang.
 * Either way, if it is not complete now the service thread completes and
 * frees it later. Takes ownership of rbuf (malloc'd, or from the buffer
 * cache when pooled). */
static void recv_abandon_how(struct sf_mpi *mp, MPI_Request *req, void *rbuf,
			     bool cancel, bool pooled)
{
	int done = 0;
	struct pend *p;

	if (cancel)
		MPI_Cancel(req);
	MPI_Test(req, &done, MPI_STATUS_IGNORE);
	if (done) {
		if (pooled)
			sf_mpi_buf_put(mp, rbuf);
		else
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
	p->rpooled = pooled;
	pthread_mutex_lock(&mp->pend_lock);
	p->next = mp->pend;
	mp->pend = p;
	pthread_mutex_unlock(&mp->pend_lock);
}

void sf_mpi_recv_abandon(struct sf_mpi *mp, MPI_Request *req, void *rbuf)
{
	recv_abandon_how(mp, req, rbuf, true, false);
}

void sf_mpi_recv_orphan(struct sf_mpi *mp, MPI_Request *req, void *rbuf)
{
	recv_abandon_how(mp, req, rbuf, false, false);
}

void sf_mpi_recv_orphan_buf(struct sf_mpi *mp, MPI_Request *req, void *rbuf)
{
	recv_abandon_how(mp, req, rbuf, false, true);
}

/*
 * A read's head came (status st) on a read nobody waits for: when it says
 * a body of len bytes follows, post a receive for that into a cached
 * buffer, as a zombie put on *extra (for the caller to add to the pending
 * list: it may be walking it). Locked (pend_lock).
 */
static void drain_body_locked(struct sf_mpi *mp, const void *head,
			      const MPI_Status *st, size_t len,
			      struct pend **extra)
{
	struct sf_mpi_wire_reply rp;
	struct pbuf *b;
	struct pend *p;
	void *buf;
	int count = 0;

	MPI_Get_count(st, MPI_BYTE, &count);
	if (count < 0 ||
	    sf_mpi_wire_read_reply_decode(head, (size_t)count, 0, &rp) != 0)
		return; /* the peer's error (or garbage): no body comes */
	b = buf_take_locked(mp, len);
	buf = b ? (void *)(b + 1) : buf_new(len);
	p = calloc(1, sizeof(*p));
	if (!buf || !p ||
	    MPI_Irecv(buf, (int)len, MPI_BYTE, st->MPI_SOURCE, st->MPI_TAG,
		      mp->comm, &p->req) != MPI_SUCCESS) {
		sf_err("mpi: cannot take an unused %zu-byte reply from rank %d; "
		       "its send stays pending there", len, st->MPI_SOURCE);
		if (buf)
			buf_put_locked(mp, buf);
		free(p);
		return;
	}
	p->rbuf = buf;
	p->rpooled = true;
	p->next = *extra;
	*extra = p;
}

void sf_mpi_recv_orphan_read(struct sf_mpi *mp, MPI_Request *hreq,
			     void *head, size_t len)
{
	struct pend *extra = NULL, *p;
	MPI_Status st;
	int done = 0;

	MPI_Test(hreq, &done, &st);
	if (!done) {
		p = calloc(1, sizeof(*p));
		if (!p) {
			sf_err("mpi: out of memory tracking an abandoned receive");
			return; /* leak the head rather than free it under MPI */
		}
		p->req = *hreq;
		p->rbuf = head;
		p->drain = len;
		pthread_mutex_lock(&mp->pend_lock);
		p->next = mp->pend;
		mp->pend = p;
		pthread_mutex_unlock(&mp->pend_lock);
		return;
	}
	pthread_mutex_lock(&mp->pend_lock);
	drain_body_locked(mp, head, &st, len, &extra);
	if (extra) {
		extra->next = mp->pend;
		mp->pend = extra;
	}
	pthread_mutex_unlock(&mp->pend_lock);
	free(head);
}

/* Free a completed pending entry's buffers. Locked (pend_lock). */
static void pend_free_locked(struct sf_mpi *mp, struct pend *p)
{
	if (p->sb && --p->sb->refs == 0)
		sf_mpi_sbuf_free(mp, p->sb);
	if (p->rbuf && p->rpooled)
		buf_put_locked(mp, p->rbuf);
	else
		free(p->rbuf);
	free(p);
}

/*
 * Take back a receive into a buffer this layer does not own (a read's body,
 * posted straight into the caller's buffer) that will not be used: cancel
 * it and return only once it is complete, so the caller may reuse the
 * buffer. A receive that has not matched (its peer never sent, or sent
 * nothing yet) is cancelled at once. One that matched is under way: with a
 * single-copy transport (shared memory, RDMA) the receiver pulls the bytes
 * itself and it completes in the same progress call; only a transport that
 * the sender drives, with the sender stopped in mid-message, makes this
 * wait, and it waits (logging) rather than let MPI write into a buffer that
 * was given back.
 */
void sf_mpi_recv_reclaim(MPI_Request *req, int peer)
{
	uint64_t t0 = sf_mpi_now_ns(), note = 0;
	unsigned us = 10;
	int done = 0;

	if (*req == MPI_REQUEST_NULL)
		return;
	MPI_Cancel(req);
	for (;;) {
		if (MPI_Test(req, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS || done)
			break;
		if (sf_mpi_now_ns() - t0 >= note) {
			if (note)
				sf_warn("mpi: a transfer from rank %d into a read buffer "
					"is under way and cannot be cancelled; waiting for it",
					peer);
			note += 10000000000ull;
		}
		sf_mpi_backoff(&us, SF_MPI_WAIT_POLL_US);
	}
	*req = MPI_REQUEST_NULL;
}

/* Test every pending request; free what completed. Returns how many are
 * still pending. */
unsigned sf_mpi_pend_poll(struct sf_mpi *mp)
{
	struct pend *extra = NULL;
	unsigned left = 0;

	pthread_mutex_lock(&mp->pend_lock);
	for (struct pend **pp = &mp->pend; *pp;) {
		struct pend *p = *pp;
		MPI_Status st;
		int done = 0;

		MPI_Test(&p->req, &done, &st);
		if (!done) {
			left++;
			pp = &p->next;
			continue;
		}
		*pp = p->next;
		if (p->drain)
			drain_body_locked(mp, p->rbuf, &st, p->drain, &extra);
		pend_free_locked(mp, p);
	}
	while (extra) { /* bodies still to come */
		struct pend *p = extra;

		extra = p->next;
		p->next = mp->pend;
		mp->pend = p;
		left++;
	}
	pthread_mutex_unlock(&mp->pend_lock);
	return left;
}

/* Wait for req until deadline (polling). 0 when complete (status in *st),
 * -ETIMEDOUT otherwise (req still active). */
int sf_mpi_wait_req(MPI_Request *req, uint64_t deadline, MPI_Status *st)
{
	unsigned us = 10;
	int done = 0;

	for (;;) {
		if (MPI_Test(req, &done, st) != MPI_SUCCESS)
			return -SF_EPEER;
		if (done)
			return 0;
		if (sf_mpi_now_ns() >= deadline)
			return -ETIMEDOUT;
		sf_mpi_backoff(&us, SF_MPI_WAIT_POLL_US);
	}
}

int sf_mpi_wait_peer(struct sf_mpi *mp, MPI_Request *req, int peer,
		     unsigned downs0, uint64_t deadline, MPI_Status *st)
{
	unsigned us = 10;
	int done = 0;

	for (;;) {
		if (MPI_Test(req, &done, st) != MPI_SUCCESS)
			return -SF_EPEER;
		if (done)
			return 0;
		if (sf_mpi_peer_downs(mp, peer) != downs0)
			return -EHOSTDOWN;
		if (sf_mpi_now_ns() >= deadline)
			return -ETIMEDOUT;
		sf_mpi_backoff(&us, SF_MPI_WAIT_POLL_US);
	}
}

/* Finish or cancel whatever is still pending, waiting at most drain_ms for
 * sends; abandoned receives are cancelled. */
void sf_mpi_pend_drain(struct sf_mpi *mp, unsigned drain_ms)
{
	uint64_t deadline = sf_mpi_now_ns() + (uint64_t)drain_ms * 1000000u;
	unsigned us = 50;

	while (sf_mpi_pend_poll(mp) && sf_mpi_now_ns() < deadline)
		sf_mpi_backoff(&us, 2000);
	pthread_mutex_lock(&mp->pend_lock);
	for (struct pend *p = mp->pend, *next; p; p = next) {
		int done = 0;

		next = p->next;
		MPI_Cancel(&p->req);
		MPI_Test(&p->req, &done, MPI_STATUS_IGNORE);
		if (done) {
			pend_free_locked(mp, p);
			continue;
		}
		/* MPI still owns the buffer: leak it, never free it. */
		MPI_Request_free(&p->req);
		sf_warn("mpi: %s of %zu bytes never completed",
			p->sb ? "a reply" : "an abandoned receive",
			p->sb ? p->sb->len : (size_t)0);
		free(p);
	}
	mp->pend = NULL;
	while (mp->bufs) {
		struct pbuf *b = mp->bufs;

		mp->bufs = b->next;
		free(b);
	}
	mp->buf_bytes = 0;
	pthread_mutex_unlock(&mp->pend_lock);
}

/* ------------------------------------------------------------------ */
/* peer liveness (struct peer_live)                                    */

bool sf_mpi_peer_down(const struct sf_mpi *mp, int peer)
{
	return atomic_load(&mp->live[peer].down);
}

bool sf_mpi_peer_silent(const struct sf_mpi *mp, int peer)
{
	return atomic_load(&mp->live[peer].silent);
}

unsigned sf_mpi_peer_downs(const struct sf_mpi *mp, int peer)
{
	return atomic_load(&mp->live[peer].downs);
}

int sf_mpi_first_down(const struct sf_mpi *mp)
{
	for (int p = 0; p < mp->size; p++)
		if (p != mp->rank && sf_mpi_peer_down(mp, p))
			return p;
	return -1;
}

void sf_mpi_mark_down(struct sf_mpi *mp, int peer, const char *what,
		      const char *file, const char *why)
{
	struct peer_live *l = &mp->live[peer];

	atomic_store(&l->probe_ns, sf_mpi_now_ns() +
		     (uint64_t)SF_MPI_PROBE_EVERY_MS * 1000000u);
	if (atomic_exchange(&l->down, true))
		return;
	atomic_fetch_add(&l->downs, 1); /* wakes the reads waiting on it */
	sf_err("mpi: rank %d did not answer %s%s%s (%s): marked down; "
	       "reads that need only it fail at once until it answers a probe "
	       "(one every %d ms), commits and deletes fail while it is down",
	       peer, what, file ? " " : "", file ? SF_QSTR(file) : "", why,
	       SF_MPI_PROBE_EVERY_MS);
}

/* The heartbeat found peer silent for silent_ns: down, and the heartbeat
 * takes it back (reads do not probe it meanwhile). */
void sf_mpi_mark_silent(struct sf_mpi *mp, int peer, uint64_t silent_ns)
{
	struct peer_live *l = &mp->live[peer];

	atomic_store(&l->silent, true);
	if (atomic_exchange(&l->down, true))
		return; /* down already (a read timed out): no new episode */
	atomic_fetch_add(&l->downs, 1); /* wakes the reads waiting on it */
	sf_err("mpi: rank %d not heard for %.1f s (no heartbeat): marked down; "
	       "reads that need only it fail at once until it is heard again, "
	       "commits and deletes fail while it is down",
	       peer, (double)(silent_ns / 1000000u) / 1000.0);
}

void sf_mpi_mark_up(struct sf_mpi *mp, int peer)
{
	struct peer_live *l = &mp->live[peer];

	atomic_store(&l->heard_ns, sf_mpi_now_ns());
	if (atomic_load(&l->down) && atomic_exchange(&l->down, false)) {
		atomic_store(&l->silent, false);
		sf_err("mpi: rank %d answers again: marked up", peer);
	}
}
