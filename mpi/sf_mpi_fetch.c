/*
 * sf_mpi_fetch.c - the MPI payload source: reads a shard's bytes locally when
 * the file is here, else from a peer that holds it (the inventory says
 * which), in chunks of up to SF_MPI_CHUNK with several in flight. Each
 * chunk's reply is a head (the status) and a body that MPI receives
 * straight into the caller's buffer: no staging copy. After a whole-block
 * read (or in a stream of equal reads) that no hint announced, the next
 * range of the file is asked for right behind the read itself (a guess),
 * so that the peer serves it next; its body stays with the peer (its send pending) until a read claims the
 * range, and is then received straight into that read's buffer when it
 * wants exactly that range, else into a cached buffer and copied out. An
 * unclaimed one is received into a cached buffer and dropped, so that the
 * peer's send completes.
 *
 * Blocks of a file held here may also be mapped (map(): the local
 * source's leased mappings, as in a single-process mount).
 *
 * Hints (advise(), the engine's read-ahead): a range of a file held here
 * goes to the local source's advise (the page cache); one of a remote
 * file is split into the reads the engine will make (its unit, a block)
 * and each is asked for the same way, into a prefetch slot, so that the
 * first block of the next remote shard is under way before the reader
 * gets there. A hint never evicts a range asked for and not yet read,
 * unless it was left unclaimed SF_MPI_PF_STALE_MS or its peer is marked
 * down; without such a slot the hint is dropped (the read then asks
 * itself, as without hints). A hint never names a peer marked down, never
 * waits for a peer, and never changes what a read returns: the read
 * claims a slot only for bytes inside its range, and the engine verifies
 * every block as before. Slots are keyed (checkpoint, file, range) from
 * the moment they are taken, so a hint and the prefetch after a read
 * never ask twice for the same range.
 *
 * Invariants: src_lock guards the prefetch slots and streams; a slot's
 * buffer stays under its request until the request completed or was
 * handed over as a zombie; a read never returns while a receive into the
 * caller's buffer is still posted (rd_cancel takes it back first); at
 * most SF_MPI_PF_SLOTS ranges are asked ahead at once, and no memory is
 * held here for them (their bodies wait at the peers' side).
 */
#include "sf_mpi_int.h"

/* ------------------------------------------------------------------ */
/* payload source                                                      */

/* Peer liveness (sf_mpi_peer_down and friends) lives in sf_mpi_xfer.c:
 * the service thread and the commit calls share it. */
/* May this read probe down peer `peer` now? At most one at a time, one
 * every SF_MPI_PROBE_EVERY_MS, and none while the heartbeat finds it
 * silent (its next heartbeat takes it back). */
static bool probe_claim(struct sf_mpi *mp, int peer)
{
	struct peer_live *l = &mp->live[peer];
	bool no = false;

	return !sf_mpi_peer_silent(mp, peer) &&
	       sf_mpi_now_ns() >= atomic_load(&l->probe_ns) &&
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
 * inventory that holds them (a live one before a down one, the writer rank
 * first), else the writer rank. The inventory is a hint that lags a live
 * store by up to a rescan: a file the writer grew since is asked of the
 * writer all the same (a commit right after its writers closed reads so),
 * and the writer's own answer says whether the bytes are there. */
static int pick_peer(struct sf_mpi *mp, const char *name,
		     const char *file, uint32_t writer, uint64_t end)
{
	const struct inv_ent *e;
	int best = -1;

	(void)sf_mpi_inv_ensure(mp, name); /* logs failures */
	sf_mpi_inv_rdlock(mp);
	e = sf_mpi_inv_find(mp, name, file);
	if (!e) {
		sf_mpi_inv_unlock(mp);
		return (int)writer < mp->size && (int)writer != mp->rank ?
			       (int)writer : -1;
	}
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
	sf_mpi_inv_unlock(mp);
	if (best < 0 && (int)writer < mp->size && (int)writer != mp->rank)
		best = (int)writer;
	return best;
}

/* Give up on a chunk read: its body receive is taken back (complete before
 * this returns), its head receive cancelled or left as a zombie. */
static void rd_cancel(struct sf_mpi *mp, struct rd *rd)
{
	/* The body first: until the head came it cannot have matched. */
	sf_mpi_recv_reclaim(&rd->breq, rd->peer);
	if (rd->head)
		sf_mpi_recv_abandon(mp, &rd->hreq, rd->head);
	rd->head = NULL;
}

/* Give up on a prefetch (its body not posted) whose peer will still
 * answer: nothing is cancelled, so that the peer's sends complete; the
 * body, if the head says one comes, is received into a cached buffer and
 * dropped (sf_mpi_recv_orphan_read). */
static void rd_orphan(struct sf_mpi *mp, struct rd *rd)
{
	if (rd->head)
		sf_mpi_recv_orphan_read(mp, &rd->hreq, rd->head, rd->len);
	rd->head = NULL;
}

/* Post the receive of rd's body (rd->len bytes) into dst, after its head
 * was posted (it may have come already). 0 or -SF_EPEER. */
static int rd_post_body(struct sf_mpi *mp, struct rd *rd, void *dst)
{
	int rc = MPI_Irecv(dst, (int)rd->len, MPI_BYTE, rd->peer, rd->tag,
			   mp->comm, &rd->breq);

	if (rc == MPI_SUCCESS)
		return 0;
	rd->breq = MPI_REQUEST_NULL;
	return sf_mpi_fail("MPI_Irecv", rc);
}

/* Post the receives for a chunk's reply (the head into a new buffer, the
 * body of len bytes straight into dst; dst NULL: the body's receive is
 * left to rd_post_body, or there is none: a probe) and send the request.
 * On failure nothing is left posted. */
static int post_read(struct sf_mpi *mp, int peer, const char *name,
		     const char *file, uint64_t off, size_t len, void *dst,
		     struct rd *rd)
{
	struct sf_mpi_wire_req h = {
		.kind = SF_MPI_MSG_READ, .off = off, .len = len
	};
	struct sbuf *sb;
	int rc;

	h.reply_tag = sf_mpi_new_tag(mp);
	rd->peer = peer;
	rd->tag = h.reply_tag;
	rd->len = len;
	rd->breq = MPI_REQUEST_NULL;
	rd->head = malloc(SF_MPI_WIRE_REPLY_HDR);
	if (!rd->head)
		return -ENOMEM;
	sb = sf_mpi_req_build(&h, name, file);
	if (!sb)
		goto out_free_head;
	/* Head first: a peer sends the head first, and MPI matches messages
	 * of one sender and tag to receives in the order they were posted. */
	rc = MPI_Irecv(rd->head, SF_MPI_WIRE_REPLY_HDR, MPI_BYTE, peer,
		       h.reply_tag, mp->comm, &rd->hreq);
	if (rc == MPI_SUCCESS && dst) {
		rc = MPI_Irecv(dst, (int)len, MPI_BYTE, peer, h.reply_tag,
			       mp->comm, &rd->breq);
		if (rc != MPI_SUCCESS) {
			sf_mpi_recv_abandon(mp, &rd->hreq, rd->head);
			rd->head = NULL;
		}
	}
	if (rc != MPI_SUCCESS) {
		free(sb);
		sf_mpi_fail("MPI_Irecv", rc);
		goto out_free_head;
	}
	/* Requests are small: the send completes locally (eager), unless the
	 * peer took none for a while (dead, stopped: MPI's slots for it are
	 * full); then the pending list holds it, never this thread. */
	if (sf_mpi_send_nowait(mp, peer, SF_TAG_REQ, sb) < 0) {
		free(sb);
		rd_cancel(mp, rd);
		return -SF_EPEER;
	}
	return 0;
out_free_head:
	free(rd->head);
	rd->head = NULL;
	return -ENOMEM;
}

int sf_mpi_post_probe(struct sf_mpi *mp, int peer, unsigned char **rbuf,
		      MPI_Request *req)
{
	struct rd rd;
	int ret;

	/* Name "" in a store of checkpoints is no checkpoint: the peer answers
	 * -SF_ESHORT without touching its store. In a single-checkpoint store
	 * "" is the checkpoint, and a file that cannot exist is asked for. */
	ret = post_read(mp, peer, "", mp->single ? ".shardfs-probe/none" : "probe",
			0, 1, NULL, &rd);
	if (ret == 0) {
		*rbuf = rd.head;
		*req = rd.hreq;
	}
	return ret;
}

/* Wait for a chunk's reply until deadline, or until its peer is marked
 * down after downs0 (sf_mpi_wait_peer): its head, then (status 0) its
 * body, which must be exactly rd->len bytes. Consumes rd: on any failure
 * nothing is left writing into the body's buffer. */
static int finish_read(struct sf_mpi *mp, struct rd *rd, const char *file,
		       unsigned downs0, uint64_t deadline)
{
	struct sf_mpi_wire_reply rp;
	MPI_Status st;
	int count = 0, ret;

	ret = sf_mpi_wait_peer(mp, &rd->hreq, rd->peer, downs0, deadline, &st);
	if (ret == 0) {
		MPI_Get_count(&st, MPI_BYTE, &count);
		/* the head is a read reply without payload */
		ret = count < 0 ? -SF_EPEER :
		      sf_mpi_wire_read_reply_decode(rd->head, (size_t)count, 0, &rp);
		free(rd->head);
		rd->head = NULL;
		if (ret == 0 && rd->breq != MPI_REQUEST_NULL) {
			ret = sf_mpi_wait_peer(mp, &rd->breq, rd->peer, downs0,
					       deadline, &st);
			if (ret == 0) {
				MPI_Get_count(&st, MPI_BYTE, &count);
				if (count < 0 || (size_t)count != rd->len)
					ret = -SF_EPEER;
				rd->breq = MPI_REQUEST_NULL;
			} else if (ret == -ETIMEDOUT || ret == -EHOSTDOWN) {
				goto out_timeout;
			}
		}
		sf_mpi_mark_up(mp, rd->peer);
		if (ret == -SF_EPEER)
			sf_err("mpi: rank %d answered a read of %s badly (%d bytes)",
			       rd->peer, SF_QSTR(file), count);
		sf_mpi_recv_reclaim(&rd->breq, rd->peer); /* error: no body came */
		return ret;
	}
out_timeout:
	sf_debug("mpi: rank %d did not answer a read of %s (%s)", rd->peer,
		 SF_QSTR(file), ret == -ETIMEDOUT ? "timed out" :
		 ret == -EHOSTDOWN ? "marked down meanwhile" : "MPI error");
	if (ret != -EHOSTDOWN) /* else it is marked down (logged) already */
		sf_mpi_mark_down(mp, rd->peer, "a read of", file,
				 ret == -ETIMEDOUT ? "timed out" : "MPI error");
	rd_cancel(mp, rd);
	return -SF_EPEER;
}

/* The ranges to prefetch after a read: n of step bytes from off on, not
 * past size. */
struct pf_plan {
	const struct sf_ckpt_ref *ck;
	uint64_t off, step, size;
	int n;
};

static int pf_issue(struct sf_mpi *mp, const struct sf_ckpt_ref *ck,
		    const char *name, const char *file, int peer, uint64_t off,
		    size_t len, bool hint);

static void pf_start(struct sf_mpi *mp, const struct pf_plan *pl,
		     const char *name, const char *file, int peer)
{
	uint64_t o = pl->off;

	for (int k = 0; k < pl->n && o < pl->size; k++, o += pl->step)
		(void)pf_issue(mp, pl->ck, name, file, peer, o,
			       (size_t)(pl->size - o < pl->step ? pl->size - o :
								  pl->step),
			       false);
}

/* Read [off, off+len) of a remote file straight into buf, pipelining chunk
 * requests; the prefetches of pl (may be NULL) are asked for right after
 * the first chunks, so that the peer serves them next. */
static int fetch_remote(struct sf_mpi *mp, int peer, unsigned downs0,
			const char *name, const char *file, uint64_t off,
			unsigned char *buf, size_t len, int timeout_ms,
			const struct pf_plan *pl)
{
	struct rd q[SF_MPI_INFLIGHT];
	size_t posted = 0, head = 0, tail = 0; /* q ring indexes (mod) */
	uint64_t deadline = sf_mpi_now_ns() + (uint64_t)timeout_ms * 1000000u;
	int ret = 0;

	while (head < tail || (posted < len && !ret)) {
		while (!ret && posted < len && tail - head < SF_MPI_INFLIGHT) {
			size_t n = len - posted < SF_MPI_CHUNK ? len - posted :
								SF_MPI_CHUNK;

			ret = post_read(mp, peer, name, file, off + posted, n,
					buf + posted, &q[tail % SF_MPI_INFLIGHT]);
			if (ret)
				break;
			posted += n;
			tail++;
		}
		if (pl && !ret) {
			pf_start(mp, pl, name, file, peer);
			pl = NULL;
		}
		if (head == tail)
			break;
		/* Failed: a peer that did not answer has the rest cancelled;
		 * one that did is waited for (its bytes land in buf). */
		if (ret == -SF_EPEER)
			rd_cancel(mp, &q[head % SF_MPI_INFLIGHT]);
		else if (ret)
			finish_read(mp, &q[head % SF_MPI_INFLIGHT], file, downs0,
				    deadline);
		else
			ret = finish_read(mp, &q[head % SF_MPI_INFLIGHT], file,
					  downs0, deadline);
		head++;
	}
	return ret;
}

static void pf_release(struct sf_mpi *mp, struct pf_slot *s)
{
	(void)mp;
	free(s->file);
	s->file = NULL;
	s->state = PF_FREE;
}

/* Give up a PENDING slot nobody read: its peer, when up, still answers
 * (the body is then received into a cached buffer and dropped, so that
 * the peer's send completes); one marked down has its receive cancelled,
 * so nothing waits on a peer that may never answer. Frees the slot.
 * Locked (src_lock). */
static void pf_drop_locked(struct sf_mpi *mp, struct pf_slot *s)
{
	if (sf_mpi_peer_down(mp, s->rd.peer))
		rd_cancel(mp, &s->rd);
	else
		rd_orphan(mp, &s->rd);
	atomic_fetch_add(&mp->st_unused, 1);
	pf_release(mp, s);
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

/*
 * Record a remote read of (ck, file); true when the range after it is
 * worth prefetching: the read is as long as the longest one seen (a whole
 * checksum block, as the engine asks: its shard most likely goes on after
 * it), or it continues a stream of reads of one length (a sequential
 * reader). Not after the shorter last block of a shard that follows a
 * whole one: what comes after it in the file is another shard, which the
 * reader may never want next.
 */
static bool pf_wanted(struct sf_mpi *mp, const struct sf_ckpt_ref *ck,
		      const char *file, uint64_t off, size_t len)
{
	uint64_t fh = sf_mpi_fnv64(file, strlen(file));
	struct stream *old = &mp->streams[0];
	bool stream = false, full;

	pthread_mutex_lock(&mp->src_lock);
	mp->stamp++;
	if (len > mp->pf_full)
		mp->pf_full = len;
	full = len == mp->pf_full;
	for (int i = 0; i < SF_MPI_STREAMS; i++) {
		struct stream *s = &mp->streams[i];

		if (s->ck == ck && s->fhash == fh && s->next == off) {
			stream = s->len == len;
			old = s;
			break;
		}
		if (s->stamp < old->stamp)
			old = s;
	}
	old->ck = ck;
	old->fhash = fh;
	old->next = off + len;
	old->len = len;
	old->stamp = mp->stamp;
	pthread_mutex_unlock(&mp->src_lock);
	return full || stream;
}

/*
 * Ask for [off, off+len) of a remote file ahead of its read, into a slot:
 * a free one; else one left unclaimed SF_MPI_PF_STALE_MS or whose peer is
 * marked down; else, for the prefetch after a read (not a hint), the
 * oldest such prefetch not yet claimed (a hint, the engine's knowledge of
 * what it reads next, is never replaced by that guess). Best effort: 0
 * when asked or already asked for (a slot's range, posting, pending or
 * claimed, covers it), -EBUSY when no slot could be had, another negative
 * errno when asking failed (nothing is left asked).
 */
static int pf_issue(struct sf_mpi *mp, const struct sf_ckpt_ref *ck,
		    const char *name, const char *file, int peer, uint64_t off,
		    size_t len, bool hint)
{
	uint64_t now, stale = (uint64_t)SF_MPI_PF_STALE_MS * 1000000u;
	struct pf_slot *s = NULL, *rec = NULL, *old = NULL;
	unsigned busy = 0;
	char *fcopy = strdup(file);
	struct rd rd;
	int ret;

	if (!fcopy)
		return -ENOMEM;
	pthread_mutex_lock(&mp->src_lock);
	now = sf_mpi_now_ns(); /* under the lock: no posted_ns is later */
	for (int i = 0; i < SF_MPI_PF_SLOTS; i++) {
		struct pf_slot *c = &mp->pf[i];

		if (c->state == PF_FREE) {
			s = s ? s : c;
			continue;
		}
		busy++;
		/* already under way: a range that holds this one, or for the
		 * guess after a read one that starts where it does (the hint
		 * for a shard's shorter last block, which the guess's whole
		 * block would overrun) */
		if (c->ck == ck &&
		    ((off >= c->off && off + len <= c->off + c->len) ||
		     (!hint && off == c->off)) &&
		    strcmp(c->file, file) == 0) {
			pthread_mutex_unlock(&mp->src_lock);
			free(fcopy);
			return 0;
		}
		if (c->state != PF_PENDING)
			continue;
		if ((now - c->posted_ns >= stale ||
		     sf_mpi_peer_down(mp, c->rd.peer)) &&
		    (!rec || c->stamp < rec->stamp))
			rec = c; /* reclaimable by anyone: the oldest */
		if (!c->hint && (!old || c->stamp < old->stamp))
			old = c; /* a guess may replace an older guess */
	}
	if (!s && (rec || !hint))
		s = rec ? rec : old;
	if (!s) {
		pthread_mutex_unlock(&mp->src_lock);
		free(fcopy);
		return -EBUSY;
	}
	if (s->state == PF_PENDING)
		pf_drop_locked(mp, s); /* counted in busy already */
	else if (++busy > atomic_load(&mp->st_peak))
		atomic_store(&mp->st_peak, busy); /* only here, under the lock */
	/* keyed now: a second hint or prefetch of the range finds it */
	s->state = PF_POSTING;
	s->ck = ck;
	s->file = fcopy;
	s->off = off;
	s->len = len;
	s->hint = hint;
	pthread_mutex_unlock(&mp->src_lock);

	/* The body's receive is posted when a read claims the range, straight
	 * into its buffer when it wants exactly this range: until then the
	 * peer's send waits, and nobody here copies it. */
	ret = post_read(mp, peer, name, file, off, len, NULL, &rd);
	pthread_mutex_lock(&mp->src_lock);
	if (ret) {
		pf_release(mp, s);
	} else {
		s->rd = rd;
		s->stamp = ++mp->stamp;
		s->posted_ns = sf_mpi_now_ns();
		s->state = PF_PENDING;
	}
	pthread_mutex_unlock(&mp->src_lock);
	if (!ret)
		atomic_fetch_add(hint ? &mp->st_hint_posts : &mp->st_pf_posts, 1);
	return ret;
}

/* Serve [off, off+len) from a claimed prefetch slot: its body is received
 * straight into buf when the read wants exactly the slot's range, else
 * into a cached buffer and copied out. Frees the slot. */
static int pf_consume(struct sf_mpi *mp, struct pf_slot *s, unsigned downs0,
		      uint64_t off, void *buf, size_t len)
{
	uint64_t deadline = sf_mpi_now_ns() +
		(uint64_t)atomic_load(&mp->read_timeout_ms) * 1000000u;
	bool exact = off == s->off && len == s->len;
	unsigned char *stage = exact ? NULL : sf_mpi_buf_get(mp, s->len);
	int ret;

	if (!exact && !stage) {
		rd_orphan(mp, &s->rd);
		ret = -ENOMEM;
	} else if (rd_post_body(mp, &s->rd, exact ? buf : stage) < 0) {
		rd_orphan(mp, &s->rd);
		ret = -SF_EPEER;
	} else {
		ret = finish_read(mp, &s->rd, s->file, downs0, deadline);
	}
	if (ret == 0 && !exact)
		memcpy(buf, stage + (off - s->off), len);
	sf_mpi_buf_put(mp, stage);
	pthread_mutex_lock(&mp->src_lock);
	pf_release(mp, s);
	pthread_mutex_unlock(&mp->src_lock);
	return ret;
}

/* Does this daemon hold payload file of ck (where the local source reads
 * it: beneath the pinned directory, or by path)? 1, 0, or -errno. */
static int held_here(const struct sf_ckpt_ref *ck, const char *file)
{
	char path[4096];
	struct stat sb;

	if (ck->pinned)
		return ck->dirfd >= 0 &&
		       fstatat(ck->dirfd, file, &sb, AT_SYMLINK_NOFOLLOW) == 0;
	if ((size_t)snprintf(path, sizeof(path), "%s/%s", ck->dir, file) >=
	    sizeof(path))
		return -ENAMETOOLONG;
	return stat(path, &sb) == 0;
}

static int mpi_src_read(void *ctx, const struct sf_ckpt_ref *ck, uint32_t rank,
			const char *file, uint64_t off, void *buf, size_t len)
{
	struct sf_mpi *mp = ctx;
	const char *name = mp->single ? "" : ck->name;
	struct pf_plan plan, *pl = NULL;
	struct pf_slot *s;
	uint64_t t0;
	unsigned downs0;
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
	ret = held_here(ck, file);
	if (ret < 0)
		return ret;
	if (ret)
		return -SF_ESHORT; /* here, but short: a peer's copy won't help */

	peer = pick_peer(mp, name, file, rank, off + len);
	if (peer < 0)
		return -SF_ESHORT;
	/* before the check: a marking down from now on wakes this read */
	downs0 = sf_mpi_peer_downs(mp, peer);
	if (sf_mpi_peer_down(mp, peer)) {
		/* No live holder: fail at once, or be the one probe. */
		int t = atomic_load(&mp->read_timeout_ms);

		if (!probe_claim(mp, peer))
			return -SF_EPEER;
		ret = fetch_remote(mp, peer, downs0, name, file, off, buf, len,
				   t < SF_MPI_PROBE_TIMEOUT_MS ? t : SF_MPI_PROBE_TIMEOUT_MS,
				   NULL);
		probe_release(mp, peer);
		return ret;
	}
	if (pf_wanted(mp, ck, file, off, len)) {
		const struct inv_ent *e;

		plan.ck = ck;
		plan.off = off + len;
		plan.step = len < SF_MPI_PF_MAX ? len : SF_MPI_PF_MAX;
		plan.size = UINT64_MAX; /* unknown file: best effort */
		plan.n = SF_MPI_PF_DEPTH;
		sf_mpi_inv_rdlock(mp);
		e = sf_mpi_inv_find(mp, name, file);
		for (unsigned i = 0; e && i < e->nh; i++)
			if (e->h[i].rank == peer)
				plan.size = e->h[i].size;
		sf_mpi_inv_unlock(mp);
		pl = &plan;
	}
	t0 = sf_mpi_now_ns();
	s = pf_claim(mp, ck, file, off, len);
	if (s) {
		/* asked for already: the next ranges go out before the wait,
		 * unless a hint asked for this one (the engine's read-ahead
		 * follows this reader and names what it reads next itself) */
		if (pl && !s->hint)
			pf_start(mp, pl, name, file, peer);
		atomic_fetch_add(&mp->st_claims, 1);
		ret = pf_consume(mp, s, downs0, off, buf, len);
		/* a peer that did not answer in time is not asked again now */
		if (ret == 0 || (ret == -SF_EPEER && sf_mpi_peer_down(mp, peer))) {
			atomic_fetch_add(&mp->st_claim_ns, sf_mpi_now_ns() - t0);
			return ret;
		}
		pl = NULL;
	}
	atomic_fetch_add(&mp->st_demand, 1);
	ret = fetch_remote(mp, peer, downs0, name, file, off, buf, len,
			   atomic_load(&mp->read_timeout_ms), pl);
	atomic_fetch_add(&mp->st_demand_ns, sf_mpi_now_ns() - t0);
	return ret;
}

/*
 * A read-ahead hint (sf_source.h): a file held here is the local source's
 * to advise; [off, off+len) of a remote one is asked of its peer as the
 * reads of `unit` bytes from off that the engine will make, each into a
 * prefetch slot (pf_issue), until no slot is free. Nothing is asked of a
 * peer marked down, of a coded stream (unit 0: read in other pieces), or
 * in pieces larger than SF_MPI_PF_MAX. Never waits on a peer.
 */
static void mpi_src_advise(void *ctx, const struct sf_ckpt_ref *ck,
			   uint32_t rank, const char *file, uint64_t off,
			   uint64_t len, uint64_t unit, unsigned flags)
{
	struct sf_mpi *mp = ctx;
	const char *name = mp->single ? "" : ck->name;
	uint64_t end, o, n, left;
	int peer;

	if (len == 0 || off > UINT64_MAX - len || !sf_relpath_valid(file) ||
	    !sf_mpi_wire_ckpt_name_ok(name, strlen(name)))
		return;
	if (held_here(ck, file) > 0) {
		if (mp->local->ops->advise)
			mp->local->ops->advise(mp->local->ctx, ck, rank, file, off,
					       len, unit, flags);
		return;
	}
	if (unit == 0 || unit > SF_MPI_PF_MAX)
		return;
	end = off + len;
	left = (len + unit - 1) / unit;
	atomic_fetch_add(&mp->st_hints, left);
	peer = pick_peer(mp, name, file, rank, end);
	if (peer < 0 || sf_mpi_peer_down(mp, peer)) {
		atomic_fetch_add(&mp->st_hint_drops, left);
		return;
	}
	for (o = off; o < end; o += n, left--) {
		n = end - o < unit ? end - o : unit;
		if (pf_issue(mp, ck, name, file, peer, o, (size_t)n, true) < 0) {
			/* no slot (or no memory): the rest waits for its read */
			atomic_fetch_add(&mp->st_hint_drops, left);
			return;
		}
	}
}

/*
 * Mappings (sf_source.h): a block of a file held here is mapped by the
 * local source, under its read lease (a framework's unverified blocks:
 * without one, map_live), exactly as in a single-process mount (no copy); a file held by a peer has none (the local source finds
 * no file: the engine then reads the block, over MPI). Tokens are the
 * local source's.
 */
static int mpi_src_map(void *ctx, const struct sf_ckpt_ref *ck, uint32_t rank,
		       const char *file, uint64_t off, size_t len,
		       const void **addr, void **token)
{
	struct sf_mpi *mp = ctx;

	if (!mp->local->ops->map || !sf_relpath_valid(file))
		return -ENOTSUP;
	return mp->local->ops->map(mp->local->ctx, ck, rank, file, off, len,
				   addr, token);
}

/* As mpi_src_map, without a lease (sf_source.h map_live): a framework's
 * unverified blocks of a file held here. */
static int mpi_src_map_live(void *ctx, const struct sf_ckpt_ref *ck,
			    uint32_t rank, const char *file, uint64_t off,
			    size_t len, const void **addr, void **token)
{
	struct sf_mpi *mp = ctx;

	if (!mp->local->ops->map_live || !sf_relpath_valid(file))
		return -ENOTSUP;
	return mp->local->ops->map_live(mp->local->ctx, ck, rank, file, off,
					len, addr, token);
}

static void mpi_src_unmap(void *ctx, void *token)
{
	struct sf_mpi *mp = ctx;

	mp->local->ops->unmap(mp->local->ctx, token);
}

static bool mpi_src_map_stale(void *ctx, void *token)
{
	struct sf_mpi *mp = ctx;

	return mp->local->ops->map_stale &&
	       mp->local->ops->map_stale(mp->local->ctx, token);
}

static void mpi_src_forget(void *ctx, const struct sf_ckpt_ref *ck)
{
	struct sf_mpi *mp = ctx;

	mp->local->ops->forget(mp->local->ctx, ck);
	pthread_mutex_lock(&mp->src_lock);
	for (int i = 0; i < SF_MPI_PF_SLOTS; i++) {
		struct pf_slot *s = &mp->pf[i];

		if (s->state == PF_PENDING && s->ck == ck)
			pf_drop_locked(mp, s);
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

	return sf_mpi_inv_peer_size(mp, mp->single ? "" : ck->name, file, false,
				    size);
}

/* peer_size over the holders not marked down (pick_peer's view). */
static int mpi_src_peer_size_live(void *ctx, const struct sf_ckpt_ref *ck,
				  const char *file, uint64_t *size)
{
	struct sf_mpi *mp = ctx;

	return sf_mpi_inv_peer_size(mp, mp->single ? "" : ck->name, file, true,
				    size);
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
	.peer_size_live = mpi_src_peer_size_live,
	.peer_ckpts = mpi_src_peer_ckpts,
	.advise = mpi_src_advise,
	.map = mpi_src_map,
	.map_live = mpi_src_map_live,
	.unmap = mpi_src_unmap,
	.map_stale = mpi_src_map_stale,
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

/* Leave every outstanding prefetch to complete (its body, if one comes,
 * received and dropped), so that the peers' sends complete instead of
 * waiting forever; sf_mpi_pend_drain then waits for them (bounded). No
 * reader runs any more. */
void sf_mpi_pf_drain(struct sf_mpi *mp, unsigned drain_ms)
{
	(void)drain_ms;
	pthread_mutex_lock(&mp->src_lock);
	for (int i = 0; i < SF_MPI_PF_SLOTS; i++) {
		struct pf_slot *s = &mp->pf[i];

		if (s->state == PF_PENDING)
			pf_drop_locked(mp, s);
	}
	pthread_mutex_unlock(&mp->src_lock);
}

void sf_mpi_source_stats(const struct sf_mpi *mp, struct sf_mpi_src_stats *out)
{
	memset(out, 0, sizeof(*out));
	if (!mp)
		return;
	out->hints = atomic_load(&mp->st_hints);
	out->hint_posts = atomic_load(&mp->st_hint_posts);
	out->hint_drops = atomic_load(&mp->st_hint_drops);
	out->pf_posts = atomic_load(&mp->st_pf_posts);
	out->claims = atomic_load(&mp->st_claims);
	out->demand = atomic_load(&mp->st_demand);
	out->unused = atomic_load(&mp->st_unused);
	out->peak = atomic_load(&mp->st_peak);
	out->claim_ns = atomic_load(&mp->st_claim_ns);
	out->demand_ns = atomic_load(&mp->st_demand_ns);
}
