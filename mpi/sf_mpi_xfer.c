/*
 * sf_mpi_xfer.c - the transport under the MPI peer layer: reply tags, shared
 * send buffers, asynchronous sends on the pending list, abandoned receives
 * (zombies), and waiting on a request against a deadline.
 *
 * Invariants: a buffer under an MPI request is freed only after the request
 * completed (pend_lock guards the list); a requester that gives up cancels
 * its receive or hands it over as a zombie, which pend_poll completes.
 */
#include "sf_mpi_int.h"

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

/* A send buffer of len bytes, no references yet. */
struct sbuf *sf_mpi_sbuf_new(size_t len)
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
		return sf_mpi_fail("MPI_Isend", rc);
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
 * (refs = 1 before the first sf_mpi_send_async) for the whole loop, because any
 * thread's sf_mpi_pend_poll may complete and free an earlier send meanwhile, and
 * drops it here. Takes pend_lock.
 */
void sf_mpi_sbuf_put(struct sf_mpi *mp, struct sbuf *sb)
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

void sf_mpi_recv_abandon(struct sf_mpi *mp, MPI_Request *req, void *rbuf)
{
	recv_abandon_how(mp, req, rbuf, true);
}

void sf_mpi_recv_orphan(struct sf_mpi *mp, MPI_Request *req, void *rbuf)
{
	recv_abandon_how(mp, req, rbuf, false);
}

/* Test every pending request; free what completed. Returns how many are
 * still pending. */
unsigned sf_mpi_pend_poll(struct sf_mpi *mp)
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

/* ------------------------------------------------------------------ */
/* peer liveness (struct peer_live)                                    */

bool sf_mpi_peer_down(const struct sf_mpi *mp, int peer)
{
	return atomic_load(&mp->live[peer].down);
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
	if (!atomic_exchange(&l->down, true))
		sf_err("mpi: rank %d did not answer %s%s%s (%s): marked down; "
		       "reads that need only it fail at once until it answers a probe "
		       "(one every %d ms), commits and deletes fail while it is down",
		       peer, what, file ? " " : "", file ? file : "", why,
		       SF_MPI_PROBE_EVERY_MS);
}

void sf_mpi_mark_up(struct sf_mpi *mp, int peer)
{
	if (atomic_load(&mp->live[peer].down) &&
	    atomic_exchange(&mp->live[peer].down, false))
		sf_err("mpi: rank %d answers again: marked up", peer);
}
