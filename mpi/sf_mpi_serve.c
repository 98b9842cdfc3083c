/*
 * sf_mpi_serve.c - the service thread of a daemon: receives every request on
 * SF_TAG_REQ (sized before received), serves payload reads from the local
 * store, runs the commit and commit-done rounds on rank 0 (probing the
 * ranks they wait for, so that a dead rank fails them early and by name),
 * delivers notices, and notes peers that leave (probing those that do not).
 *
 * Reads of 256 KiB and more of a shardfs/1 checkpoint's payload are
 * answered from a mapping of the payload file under a read lease
 * (serve_mapped), smaller ones, files that cannot be leased, and every
 * file of a framework's checkpoint by a copy into a send buffer: a lease
 * would delay the framework re-saving that file and fail its O_NONBLOCK
 * open for writing with EAGAIN (issue 30, 7; sf_local_source.c).
 *
 * Invariants: it never blocks on a peer (replies are MPI_Isend kept on the
 * pending list until complete; a probe's request is a small eager send);
 * rounds exist only on rank 0 and are touched only by this thread; a
 * round that fails is answered and freed at once, so a later commit of
 * the same name starts a new round.
 */
#include "sf_mpi_int.h"
#include "sf_manifest.h"
#include "sf_open.h"
#include <signal.h>
#include <sys/mman.h>

/* ------------------------------------------------------------------ */
/* service thread                                                      */

/* Reply status + data to (dest, tag); logs on failure. */
static void reply(struct sf_mpi *mp, int dest, int tag, int64_t status,
		  const void *data, size_t len)
{
	struct sbuf *sb = sf_mpi_reply_build(status, data, len);

	if (!sb || sf_mpi_send_async(mp, dest, tag, sb) < 0) {
		sf_err("mpi: cannot reply to rank %d", dest);
		free(sb);
	}
}

/* A lease of this process is being broken (SIGIO, see serve_mapped). */
static volatile sig_atomic_t lease_break;

static void on_sigio(int sig)
{
	(void)sig;
	lease_break = 1;
}

/*
 * Can this process take read leases safely? Breaking one sends SIGIO,
 * whose default action ends the process: when SIGIO is at its default, a
 * handler that only notes the break is installed; when someone else set
 * it (ignored or handled), that stays, and a break is noticed by age only
 * (sf_mpi_map_release). Service thread, once.
 */
static bool leases_usable(void)
{
	struct sigaction old, sa;

	if (sigaction(SIGIO, NULL, &old) < 0)
		return false;
	if ((old.sa_flags & SA_SIGINFO) || old.sa_handler != SIG_DFL)
		return true;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_sigio;
	sa.sa_flags = SA_RESTART;
	sigemptyset(&sa.sa_mask);
	return sigaction(SIGIO, &sa, NULL) == 0;
}

/*
 * Serve a READ from a mapping of the payload file (fd, open for reading):
 * the reply's body is sent straight out of the page cache, so that no copy
 * is made here (on one node the requester copies the bytes out of this
 * process itself, single-copy). A read lease on fd keeps the file from
 * being truncated or opened for writing while the mapping is under a send
 * (a file some process has open for writing cannot be leased, and is
 * served by copy); the mapping is given back when the sends completed, or
 * turned into an anonymous copy first when the lease is broken or held too
 * long (sf_mpi_map_release), so that a writer waits at most
 * SF_MPI_MAP_HOLD_MS. Returns true when the read was answered this way (fd
 * is then owned by the send buffer), false to serve it by copy (fd still
 * open, no lease held).
 */
static bool serve_mapped(struct sf_mpi *mp, int src,
			 const struct sf_mpi_wire_req *h, int fd,
			 const char *file)
{
	size_t len = (size_t)h->len, pg = (size_t)sysconf(_SC_PAGESIZE);
	uint64_t base = h->off & ~(uint64_t)(pg - 1);
	size_t delta = (size_t)(h->off - base);
	struct timespec now;
	struct sbuf *sb;
	struct stat st;
	void *map;

	if (!mp->map_ok || len < SF_MPI_MAP_MIN)
		return false;
	if (fcntl(fd, F_SETLEASE, F_RDLCK) < 0)
		return false;
	/* Under the lease the size cannot shrink any more. A file written
	 * moments ago may be written again: served by copy. */
	clock_gettime(CLOCK_REALTIME, &now);
	if (fstat(fd, &st) < 0 || (uint64_t)st.st_size < h->off + len ||
	    st.st_mtim.tv_sec + SF_MPI_MAP_SETTLE_S > now.tv_sec)
		goto out_unlease;
	map = mmap(NULL, len + delta, PROT_READ, MAP_SHARED, fd, (off_t)base);
	if (map == MAP_FAILED)
		goto out_unlease;
	sb = sf_mpi_sbuf_new(SF_MPI_WIRE_REPLY_HDR);
	if (!sb) {
		munmap(map, len + delta);
		goto out_unlease;
	}
	sf_mpi_wire_reply_encode(sb->data, 0, NULL, 0);
	sf_mpi_sbuf_map(mp, sb, map, len + delta, fd);
	sb->refs = 1; /* ours, until both sends are queued */
	if (sf_mpi_send_part(mp, src, h->reply_tag, sb, 0,
			     SF_MPI_WIRE_REPLY_HDR) < 0 ||
	    sf_mpi_send_ptr(mp, src, h->reply_tag, sb,
			    (unsigned char *)map + delta, len) < 0)
		sf_err("mpi: cannot answer rank %d's read of %s", src, SF_QSTR(file));
	sf_mpi_sbuf_put(mp, sb);
	return true;
out_unlease:
	fcntl(fd, F_SETLEASE, F_UNLCK);
	return false;
}

/* Whether the checkpoint directory dirfd is one shardfs wrote (it holds
 * a regular manifest.json): only its payload files are ever leased. */
static bool leasable_ckpt(int dirfd)
{
	struct stat st;

	return fstatat(dirfd, SF_SHARDFS_MANIFEST, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
	       S_ISREG(st.st_mode);
}

/* Answer a READ: pread the file straight into the reply buffer, then send
 * its head (the status: a read reply without payload) and, when the read
 * succeeded, the payload as a second message on the same tag, so that the
 * requester receives it straight into its own buffer (sf_mpi_wire.h). */
static void serve_read(struct sf_mpi *mp, int src,
		       const struct sf_mpi_wire_req *h, const char *name,
		       const char *file)
{
	size_t len = (size_t)h->len; /* <= SF_MPI_MAX_MSG: decoded */
	struct sbuf *sb;
	bool leasable = false;
	int dfd, fd, ret;

	/* Beneath the store opened at start and the checkpoint directory it
	 * holds now (never a symlink: a checkpoint swapped for one serves
	 * nothing), a regular file: a symlink planted in this store never
	 * serves a byte from outside it, a FIFO never blocks. Only shardfs's
	 * own checkpoints are served from leased mappings. */
	if (mp->single) {
		fd = sf_open_payload_at(mp->store_fd, file);
		leasable = fd >= 0 && leasable_ckpt(mp->store_fd);
	} else if (!name[0]) {
		fd = -SF_ESHORT;
	} else {
		dfd = sf_open_ckpt_dir(mp->store_fd, name, NULL, NULL);
		if (dfd < 0) {
			fd = dfd == -ENOENT || dfd == -ENOTDIR || dfd == -ELOOP ?
			     -SF_ESHORT : -EIO;
		} else {
			fd = sf_open_payload_at(dfd, file);
			leasable = fd >= 0 && leasable_ckpt(dfd);
			close(dfd);
		}
	}
	if (fd >= 0 && len >= SF_MPI_MAP_MIN && leasable &&
	    serve_mapped(mp, src, h, fd, file))
		return;
	sb = len >= SF_MPI_BUF_MIN ? sf_mpi_sbuf_big(mp, sf_mpi_wire_reply_size(len)) :
				     sf_mpi_sbuf_new(sf_mpi_wire_reply_size(len));
	if (!sb) {
		if (fd >= 0)
			close(fd);
		reply(mp, src, h->reply_tag, -ENOMEM, NULL, 0);
		return;
	}
	if (fd < 0) {
		ret = fd;
	} else {
		ret = sf_pread_full(fd, sb->data + SF_MPI_WIRE_REPLY_HDR, len,
				    h->off);
		close(fd);
	}
	/* The payload is in place already: only the status is written. */
	sf_mpi_wire_reply_encode(sb->data, ret < 0 ? ret : 0, NULL, 0);
	sb->refs = 1; /* ours, until both sends are queued */
	if (sf_mpi_send_part(mp, src, h->reply_tag, sb, 0,
			     SF_MPI_WIRE_REPLY_HDR) < 0 ||
	    (ret >= 0 && sf_mpi_send_part(mp, src, h->reply_tag, sb,
					  SF_MPI_WIRE_REPLY_HDR, len) < 0))
		sf_err("mpi: cannot answer rank %d's read of %s", src, SF_QSTR(file));
	sf_mpi_sbuf_put(mp, sb);
}

void sf_mpi_round_free(struct round *r, int size)
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
		sf_mpi_round_free(r, n);
		return NULL;
	}
	/* Decide a little before the ranks' own deadlines so that they get
	 * the reason rather than their local timeout. */
	r->timeout_ms = timeout_ms;
	r->deadline_ns = sf_mpi_now_ns() + (uint64_t)timeout_ms * 900000u;
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
	struct sbuf *sb = sf_mpi_reply_build(status, data, len);

	if (!sb) {
		sf_err("mpi: out of memory answering the commit of %s", r->name);
		return;
	}
	sb->refs = 1; /* ours, until every send is queued */
	for (int i = 0; i < mp->size; i++)
		if (r->have[i] && sf_mpi_send_async(mp, i, r->tag[i], sb) < 0)
			sf_err("mpi: cannot send the verdict on %s to rank %d",
			       r->name, i);
	sf_mpi_sbuf_put(mp, sb);
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
	sf_mpi_round_free(r, mp->size);
}

/* End round r with an error: the ranks that are in get status and the
 * reason (logged), the state is discarded. */
static void round_fail(struct sf_mpi *mp, struct round *r, int status,
		       const char *err)
{
	sf_err("mpi: %s", err);
	round_answer(mp, r, status, err, strlen(err));
	round_unlink(mp, r);
	sf_mpi_round_free(r, mp->size);
}

/* Expire rounds whose deadline passed. */
static void rounds_expire(struct sf_mpi *mp)
{
	uint64_t now = sf_mpi_now_ns();

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
		round_fail(mp, r, -ETIMEDOUT, err);
	}
}

/* Peer p did not answer rank 0's probe within limit_ms: every round that
 * waits for it fails at once, naming it (nothing was published yet for a
 * commit round; a commit-done round makes the ranks take theirs back). */
static void rounds_fail_peer(struct sf_mpi *mp, int p, uint64_t limit_ms)
{
	for (struct round *r = mp->rounds, *next; r; r = next) {
		char err[SF_MPI_MAX_TEXT];

		next = r->next;
		if (r->have[p])
			continue;
		snprintf(err, sizeof(err),
			 "rank %d is down (no answer to rank 0 within %.1f s): %s \"%s\" "
			 "needs every rank; it stays uncommitted", p,
			 (double)limit_ms / 1000.0,
			 r->kind == SF_MPI_MSG_COMMIT_PART ? "the commit of" :
			 "publishing", r->name);
		round_fail(mp, r, -SF_EPEER, err);
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
	/* A request from src: it is there (whatever a timeout said). */
	sf_mpi_mark_up(mp, src);
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
	case SF_MPI_MSG_INV_NAME:
		(void)sf_mpi_inv_note(mp, src, name, h.len, h.off);
		break;
	case SF_MPI_MSG_INV_LIST: {
		struct sbuf *sb = sf_mpi_live_list(mp, name);

		if (!sb || sf_mpi_send_async(mp, src, h.reply_tag, sb) < 0) {
			sf_err("mpi: cannot answer rank %d's list of %s", src,
			       name[0] ? name : "(store)");
			free(sb);
		}
		break;
	}
	case SF_MPI_MSG_SYNC:
		sf_mpi_live_sync_in(mp, src, h.off);
		break;
	case SF_MPI_MSG_SYNCED:
		sf_mpi_live_synced_in(mp, src, h.off);
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
		sf_mpi_fail("MPI_Mrecv", rc);
	free(buf);
	return 1;
}

/* Does a round (rank 0 only) wait for peer p? */
static bool round_waits_for(const struct sf_mpi *mp, int p)
{
	for (const struct round *r = mp->rounds; r; r = r->next)
		if (!r->have[p])
			return true;
	return false;
}

/*
 * Probe the peers someone waits for (struct peer_probe): while leaving,
 * those that have not left (no answer within the read timeout: gone, not
 * waited for); on rank 0, those a round waits for (no answer within the
 * read timeout, or SF_MPI_QUICK_PROBE_MS for one marked down, already or
 * meanwhile (the heartbeat): it is marked down and every round that waits
 * for it fails). A peer marked
 * down is probed at once when a round starts waiting for it, so a commit
 * with a dead rank fails in well under a second. Any answer marks the peer
 * up. Probes nobody needs any more are left to complete on the pending
 * list.
 */
static void probe_peers(struct sf_mpi *mp)
{
	uint64_t now = sf_mpi_now_ns();
	int rto = atomic_load(&mp->read_timeout_ms);
	bool leaving = atomic_load(&mp->leaving);

	for (int p = 0; p < mp->size; p++) {
		struct peer_probe *lp = &mp->lp[p];
		bool want = p != mp->rank &&
			    (leaving ? !mp->left[p] : round_waits_for(mp, p));
		bool down = sf_mpi_peer_down(mp, p);
		uint64_t limit_ms;
		int done = 0;

		if (!want) {
			if (lp->posted) {
				sf_mpi_recv_orphan(mp, &lp->req, lp->rbuf);
				lp->posted = false;
				mp->nprobes--;
			}
			continue;
		}
		if (!lp->posted) {
			/* Rounds ask a down peer at once: it must prove it is
			 * back, quickly, or the round fails. */
			if (now < lp->next_ns && (leaving || !down))
				continue;
			if (sf_mpi_post_probe(mp, p, &lp->rbuf, &lp->req) == 0) {
				lp->posted = true;
				mp->nprobes++;
				lp->sent_ns = now;
				limit_ms = !leaving && down ? SF_MPI_QUICK_PROBE_MS :
					   (uint64_t)rto;
				lp->limit_ns = limit_ms * 1000000u;
			}
			lp->next_ns = now + (uint64_t)SF_MPI_REPROBE_MS * 1000000u;
			continue;
		}
		MPI_Test(&lp->req, &done, MPI_STATUS_IGNORE);
		if (done) {
			free(lp->rbuf);
			lp->posted = false; /* alive: still waited for */
			mp->nprobes--;
			sf_mpi_mark_up(mp, p);
			continue;
		}
		/* a round's peer marked down meanwhile (the heartbeat found
		 * it silent): it has the quick probe's time, no more */
		if (!leaving && down &&
		    lp->limit_ns > (uint64_t)SF_MPI_QUICK_PROBE_MS * 1000000u)
			lp->limit_ns = (uint64_t)SF_MPI_QUICK_PROBE_MS * 1000000u;
		if (now - lp->sent_ns <= lp->limit_ns)
			continue;
		sf_mpi_recv_abandon(mp, &lp->req, lp->rbuf);
		lp->posted = false;
		mp->nprobes--;
		limit_ms = lp->limit_ns / 1000000u;
		if (leaving) {
			sf_err("mpi: rank %d neither left nor answers (%llu ms): gone, "
			       "not waited for", p, (unsigned long long)limit_ms);
			mp->left[p] = true;
			mp->nleft++;
			mp->ngone++;
		} else {
			sf_mpi_mark_down(mp, p, "a probe from the commit coordinator",
					 NULL, "timed out");
			rounds_fail_peer(mp, p, limit_ms);
		}
	}
}

void *sf_mpi_service_main(void *arg)
{
	struct sf_mpi *mp = arg;
	unsigned us = 20;

	mp->map_ok = leases_usable();
	uint64_t last_note = sf_mpi_now_ns(), last_busy = 0;

	for (;;) {
		int busy = 0;

		while (serve_poll(mp) && busy < 64)
			busy++;
		sf_mpi_pend_poll(mp);
		if (lease_break) {
			lease_break = 0;
			sf_mpi_map_release(mp, true);
		} else if (mp->map_ok) {
			sf_mpi_map_release(mp, false);
		}
		if (mp->rank == 0 && mp->rounds)
			rounds_expire(mp);
		if (mp->rounds || mp->nprobes || atomic_load(&mp->leaving))
			probe_peers(mp);
		if (atomic_load(&mp->leaving)) {
			if (mp->nleft >= mp->size - 1)
				break;
			if (sf_mpi_now_ns() - last_note > 60000000000ull) {
				char ranks[256];

				rank_list(mp->left, mp->size, false, ranks,
					  sizeof(ranks));
				sf_info("mpi: still serving; waiting for rank(s) %s to leave",
					ranks);
				last_note = sf_mpi_now_ns();
			}
		}
		/* Poll often while peers are reading (a sleep here is latency
		 * on every remote block that was not prefetched: the first of
		 * each shard), back off to 2 ms once none asked for 200 ms. A
		 * reader of several peers asks each one only every few
		 * milliseconds (the others' shards come between): after
		 * 20 ms, as before, a demand read waited up to 2 ms for the
		 * peer to look. */
		if (busy) {
			us = 20;
			last_busy = sf_mpi_now_ns();
		} else {
			sf_mpi_backoff(&us, sf_mpi_now_ns() - last_busy < SF_MPI_ACTIVE_NS ?
				SF_MPI_SERVE_POLL_US : SF_MPI_IDLE_POLL_US);
		}
	}
	for (int p = 0; p < mp->size; p++) /* probes still out */
		if (mp->lp[p].posted) {
			sf_mpi_recv_orphan(mp, &mp->lp[p].req, mp->lp[p].rbuf);
			mp->lp[p].posted = false;
			mp->nprobes--;
		}
	return NULL;
}
