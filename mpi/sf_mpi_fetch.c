/*
 * sf_mpi_fetch.c - the MPI payload source: reads a shard's bytes locally when
 * the file is here, else from a peer that holds it (the inventory says
 * which), in chunks with several in flight, with a small prefetch of the
 * next ranges of a sequential reader.
 *
 * Invariants: src_lock guards the prefetch slots and streams; a slot's
 * buffer stays under its request until the request completed or was
 * handed over as a zombie.
 */
#include "sf_mpi_int.h"

/* ------------------------------------------------------------------ */
/* payload source                                                      */

/* Peer liveness (sf_mpi_peer_down and friends) lives in sf_mpi_xfer.c:
 * the service thread and the commit calls share it. */
/* May this read probe down peer `peer` now? At most one at a time, one
 * every SF_MPI_PROBE_EVERY_MS. */
static bool probe_claim(struct sf_mpi *mp, int peer)
{
	struct peer_live *l = &mp->live[peer];
	bool no = false;

	return sf_mpi_now_ns() >= atomic_load(&l->probe_ns) &&
	       atomic_compare_exchange_strong(&l->probing, &no, true);
}

static void probe_release(struct sf_mpi *mp, int peer)
{
	struct peer_live *l = &mp->live[peer];

	atomic_store(&l->probe_ns, sf_mpi_now_ns() +
		     (uint64_t)SF_MPI_PROBE_EVERY_MS * 1000000u);
	atomic_store(&l->probing, false);
}

/* Choose the peer for (name, file) bytes [off, off+len): a holder in the
 * inventory (a live one before a down one, the writer rank first), else
 * the writer rank. */
static int pick_peer(const struct sf_mpi *mp, const char *name,
		     const char *file, uint32_t writer, uint64_t end)
{
	const struct inv_ent *e = sf_mpi_inv_find(mp, name, file);
	int best = -1;

	if (!e)
		return (int)writer < mp->size && (int)writer != mp->rank ?
			       (int)writer : -1;
	for (unsigned i = 0; i < e->nh; i++) {
		int r = e->h[i].rank;
		bool bd, rd;

		if (r == mp->rank || e->h[i].size < end)
			continue;
		bd = best >= 0 && sf_mpi_peer_down(mp, best);
		rd = sf_mpi_peer_down(mp, r);

		if (best < 0 || (bd && !rd) || (r == (int)writer && bd >= rd))
			best = r;
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

	h.reply_tag = sf_mpi_new_tag(mp);
	*rbuf = malloc(rlen);
	if (!*rbuf)
		return -ENOMEM;
	sb = sf_mpi_req_build(&h, name, file);
	if (!sb)
		goto out_free_rbuf;
	rc = MPI_Irecv(*rbuf, (int)rlen, MPI_BYTE, peer, h.reply_tag,
		       mp->comm, rreq);
	if (rc != MPI_SUCCESS) {
		free(sb);
		sf_mpi_fail("MPI_Irecv", rc);
		goto out_free_rbuf;
	}
	/* Requests are small: the send completes locally (eager). */
	rc = MPI_Send(sb->data, (int)sb->len, MPI_BYTE, peer, SF_TAG_REQ,
		      mp->comm);
	free(sb);
	if (rc != MPI_SUCCESS) {
		sf_mpi_fail("MPI_Send", rc);
		sf_mpi_recv_abandon(mp, rreq, *rbuf);
		*rbuf = NULL;
		return -SF_EPEER;
	}
	return 0;
out_free_rbuf:
	free(*rbuf);
	*rbuf = NULL;
	return -ENOMEM;
}

int sf_mpi_post_probe(struct sf_mpi *mp, int peer, unsigned char **rbuf,
		      MPI_Request *req)
{
	/* Name "" in a store of checkpoints is no checkpoint: the peer answers
	 * -SF_ESHORT without touching its store. In a single-checkpoint store
	 * "" is the checkpoint, and a file that cannot exist is asked for. */
	return post_read(mp, peer, "", mp->single ? ".shardfs-probe/none" : "probe",
			 0, 1, rbuf, req);
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

	ret = sf_mpi_wait_req(rreq, deadline, &st);
	if (ret < 0) {
		sf_debug("mpi: rank %d did not answer a read of %s (%s)", peer,
			 file, ret == -ETIMEDOUT ? "timed out" : "MPI error");
		sf_mpi_mark_down(mp, peer, "a read of", file,
				 ret == -ETIMEDOUT ? "timed out" : "MPI error");
		sf_mpi_recv_abandon(mp, rreq, rbuf);
		return -SF_EPEER;
	}
	sf_mpi_mark_up(mp, peer);
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
			size_t len, int timeout_ms)
{
	struct {
		unsigned char *rbuf;
		MPI_Request req;
		size_t pos, len;
	} q[SF_MPI_INFLIGHT];
	size_t posted = 0, head = 0, tail = 0; /* q ring indexes (mod) */
	uint64_t deadline = sf_mpi_now_ns() + (uint64_t)timeout_ms * 1000000u;
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
				sf_mpi_recv_abandon(mp, &q[i].req, q[i].rbuf);
			else if (ret)
				sf_mpi_recv_orphan(mp, &q[i].req, q[i].rbuf);
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
	uint64_t fh = sf_mpi_fnv64(file, strlen(file));
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
		sf_mpi_recv_orphan(mp, &s->req, s->buf);
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
	uint64_t deadline = sf_mpi_now_ns() +
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
	if (sf_mpi_peer_down(mp, peer)) {
		/* No live holder: fail at once, or be the one probe. */
		int t = atomic_load(&mp->read_timeout_ms);

		if (!probe_claim(mp, peer))
			return -SF_EPEER;
		ret = fetch_remote(mp, peer, name, file, off, buf, len,
				   t < SF_MPI_PROBE_TIMEOUT_MS ? t : SF_MPI_PROBE_TIMEOUT_MS);
		probe_release(mp, peer);
		return ret;
	}
	s = pf_claim(mp, ck, file, off, len);
	if (s) {
		ret = pf_consume(mp, s, off, buf, len);
		if (ret == 0)
			goto out_prefetch;
	}
	ret = fetch_remote(mp, peer, name, file, off, buf, len,
			   atomic_load(&mp->read_timeout_ms));
	if (ret)
		return ret;
out_prefetch:
	/* A sequential stream: keep the next SF_MPI_PF_DEPTH ranges of the
	 * same length under way (pf_issue skips one already pending). */
	if (!sf_mpi_peer_down(mp, peer) && stream_next(mp, ck, file, off, len, &pf_off)) {
		const struct inv_ent *e = sf_mpi_inv_find(mp, name, file);
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
			sf_mpi_recv_orphan(mp, &s->req, s->buf);
			pf_release(mp, s);
		}
	}
	for (int i = 0; i < SF_MPI_STREAMS; i++)
		if (mp->streams[i].ck == ck)
			mp->streams[i].ck = NULL;
	pthread_mutex_unlock(&mp->src_lock);
}

static int mpi_src_peer_files(void *ctx, const struct sf_ckpt_ref *ck,
			      int (*fn)(void *arg, const char *file, uint64_t size),
			      void *arg)
{
	struct sf_mpi *mp = ctx;

	return sf_mpi_inv_peer_files(mp, mp->single ? "" : ck->name, fn, arg);
}

static int mpi_src_peer_size(void *ctx, const struct sf_ckpt_ref *ck,
			     const char *file, uint64_t *size)
{
	struct sf_mpi *mp = ctx;

	return sf_mpi_inv_peer_size(mp, mp->single ? "" : ck->name, file, size);
}

static int mpi_src_peer_ckpts(void *ctx, int (*fn)(void *arg, const char *name),
			      void *arg)
{
	struct sf_mpi *mp = ctx;

	return mp->single ? 0 : sf_mpi_inv_peer_ckpts(mp, fn, arg);
}

const struct sf_source_ops sf_mpi_src_ops = {
	.read = mpi_src_read,
	.forget = mpi_src_forget,
	.peer_files = mpi_src_peer_files,
	.peer_size = mpi_src_peer_size,
	.peer_ckpts = mpi_src_peer_ckpts,
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

/* Let every outstanding prefetch finish (bounded), so that the peers'
 * replies complete instead of waiting on a cancelled receive; what does not
 * finish in time is abandoned. No reader runs any more. */
void sf_mpi_pf_drain(struct sf_mpi *mp, unsigned drain_ms)
{
	uint64_t deadline = sf_mpi_now_ns() + (uint64_t)drain_ms * 1000000u;

	pthread_mutex_lock(&mp->src_lock);
	for (int i = 0; i < SF_MPI_PF_SLOTS; i++) {
		struct pf_slot *s = &mp->pf[i];

		if (s->state != PF_PENDING)
			continue;
		if (sf_mpi_wait_req(&s->req, deadline, MPI_STATUS_IGNORE) == 0)
			free(s->buf);
		else
			sf_mpi_recv_abandon(mp, &s->req, s->buf);
		pf_release(mp, s);
	}
	pthread_mutex_unlock(&mp->src_lock);
}
