/*
 * sf_mpi.c - the MPI peer layer's public face (sf_mpi.h): init on a private
 * communicator, start (inventory exchange, service thread), the commit and
 * commit-done calls to rank 0 (failing early, by name, when a rank is down),
 * the check that every rank is up before a delete, notices to every rank,
 * and an orderly leave.
 * The threads, messages and invariants of the layer are described in
 * sf_mpi_int.h; each job lives in a file of its own (listed there).
 */
#include "sf_mpi_int.h"

#include <strings.h>

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

const char *sf_mpi_host(const struct sf_mpi *mp, int rank)
{
	return mp && mp->hosts && rank >= 0 && rank < mp->size ? mp->hosts[rank] : "?";
}

int sf_mpi_size(const struct sf_mpi *mp)
{
	return mp ? mp->size : -EINVAL;
}

/*
 * Open MPI 4's mpirun ends every process of a job when one dies, unless it
 * was started with --enable-recovery; its launcher tells its processes so
 * in the environment (OMPI_MCA_orte_launch, OMPI_MCA_orte_enable_recovery).
 * Rank 0 says it once at start. Under any other launcher nothing can be
 * told, and nothing is said.
 */
static void warn_if_job_aborts_on_failure(const struct sf_mpi *mp)
{
	const char *rec = getenv("OMPI_MCA_orte_enable_recovery");

	if (mp->rank != 0 || !getenv("OMPI_MCA_orte_launch"))
		return;
	if (rec && (!strcmp(rec, "1") || !strcasecmp(rec, "true") ||
		    !strcasecmp(rec, "yes")))
		return;
	sf_warn("mpi: mpirun was started without --enable-recovery: if one daemon "
		"dies, Open MPI ends every daemon of the job and every mount goes; "
		"start it as 'mpirun --enable-recovery ... shardfs --mpi ...'");
}

/* COLLECTIVE: every rank's host name into mp->hosts (for logs that name
 * the nodes: a checkpoint two nodes disagree on). An MPI error code. */
static int gather_hosts(struct sf_mpi *mp)
{
	char name[MPI_MAX_PROCESSOR_NAME + 1] = "", mine[SF_MPI_HOST_MAX];
	int len = 0;

	if (MPI_Get_processor_name(name, &len) != MPI_SUCCESS || len <= 0)
		snprintf(name, sizeof(name), "?");
	name[len > 0 && len <= MPI_MAX_PROCESSOR_NAME ? len : 1] = '\0';
	memset(mine, 0, sizeof(mine));
	snprintf(mine, sizeof(mine), "%s", name);
	return MPI_Allgather(mine, SF_MPI_HOST_MAX, MPI_CHAR, mp->hosts,
			     SF_MPI_HOST_MAX, MPI_CHAR, mp->comm);
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
			ret = sf_mpi_fail("MPI_Init_thread", rc);
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
		ret = sf_mpi_fail("MPI_Comm_dup", rc);
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
	mp->live = calloc((size_t)mp->size, sizeof(*mp->live));
	mp->lp = calloc((size_t)mp->size, sizeof(*mp->lp));
	mp->sync_want = calloc((size_t)mp->size, sizeof(*mp->sync_want));
	mp->synced = calloc((size_t)mp->size, sizeof(*mp->synced));
	mp->hosts = calloc((size_t)mp->size, sizeof(*mp->hosts));
	if (!mp->left || !mp->live || !mp->lp || !mp->sync_want || !mp->synced ||
	    !mp->hosts) {
		free(mp->hosts);
		free(mp->left);
		free(mp->live);
		free(mp->lp);
		free(mp->sync_want);
		free(mp->synced);
		ret = -ENOMEM;
		goto out_free_comm;
	}
	rc = gather_hosts(mp);
	if (rc != MPI_SUCCESS) {
		ret = sf_mpi_fail("MPI_Allgather", rc);
		free(mp->hosts);
		free(mp->left);
		free(mp->live);
		free(mp->lp);
		free(mp->sync_want);
		free(mp->synced);
		goto out_free_comm;
	}
	pthread_mutex_init(&mp->pend_lock, NULL);
	pthread_mutex_init(&mp->reg_lock, NULL);
	pthread_mutex_init(&mp->src_lock, NULL);
	pthread_rwlock_init(&mp->inv_lock, NULL);
	pthread_mutex_init(&mp->own_lock, NULL);
	atomic_init(&mp->next_tag, 0);
	atomic_init(&mp->leaving, false);
	atomic_init(&mp->read_timeout_ms, SF_MPI_READ_TIMEOUT_MS);
	mp->left[mp->rank] = true; /* "left" lists the ranks not to wait for */
	snprintf(prefix, sizeof(prefix), "[rank %d] shardfs: ", mp->rank);
	sf_log_setup(prefix, SF_LOG_INFO);
	warn_if_job_aborts_on_failure(mp);
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

int sf_mpi_allreduce_single(struct sf_mpi *mp, int vote, int *single)
{
	int in[2] = { vote, -vote }, out[2];
	int rc;

	if (!mp || !single || mp->started)
		return -EINVAL;
	rc = MPI_Allreduce(in, out, 2, MPI_INT, MPI_MAX, mp->comm);
	if (rc != MPI_SUCCESS)
		return sf_mpi_fail("MPI_Allreduce", rc);
	/* out[0]: the largest vote; -out[1]: the smallest. */
	*single = out[0] == 2 && -out[1] >= 1;
	return 0;
}

/* SHARDFS_INV_CACHE: the (file, holder) pairs of fetched lists kept. */
static size_t inv_cache_max(void)
{
	const char *v = getenv("SHARDFS_INV_CACHE");
	char *end;
	unsigned long long n;

	if (!v || !*v)
		return SF_MPI_INV_CACHE_MAX;
	errno = 0;
	n = strtoull(v, &end, 10);
	if (errno || *end || n > SIZE_MAX / 2) {
		sf_warn("mpi: SHARDFS_INV_CACHE=%s is not a count: %u kept", v,
			SF_MPI_INV_CACHE_MAX);
		return SF_MPI_INV_CACHE_MAX;
	}
	return (size_t)n;
}

int sf_mpi_start(struct sf_mpi *mp, const char *store, int single)
{
	struct sf_mpi_wire_inv_buf ib = { 0 }, sum = { 0 };
	int *counts = NULL, *displs = NULL;
	unsigned char *all = NULL;
	int mine, rc, ret, anybad;
	long long total = 0;

	if (!mp || !store || mp->started)
		return -EINVAL;
	mp->store = strdup(store);
	if (!mp->store)
		return -ENOMEM;
	mp->store_fd = open(store, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (mp->store_fd < 0) {
		ret = -errno;
		sf_err("mpi: store %s: %s", store, sf_strerror(ret));
		goto out_free_store;
	}
	mp->single = single ? 1 : 0;
	ret = sf_local_source_create(&mp->local);
	if (ret)
		goto out_close_store;

	mp->inv_cache_max = inv_cache_max();
	ret = sf_mpi_build_inventory(store, mp->single, &ib);
	if (ret)
		sf_err("mpi: cannot index store %s: %s", store, sf_strerror(ret));
	else {
		/* the peers learn how many files of what this rank holds; the
		 * lists stay here (what INV_LIST answers) until asked for */
		sf_mpi_live_seed(mp, &ib, &sum);
		ret = sum.ret;
		if (ret)
			sf_err("mpi: cannot summarize store %s: %s", store,
			       sf_strerror(ret));
	}
	/* Everyone learns whether anyone failed, so all fail together. */
	rc = MPI_Allreduce(&(int){ ret ? 1 : 0 }, &anybad, 1, MPI_INT, MPI_MAX,
			   mp->comm);
	if (rc != MPI_SUCCESS) {
		ret = sf_mpi_fail("MPI_Allreduce", rc);
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
	mine = (int)sum.len;
	rc = MPI_Allgather(&mine, 1, MPI_INT, counts, 1, MPI_INT, mp->comm);
	if (rc != MPI_SUCCESS) {
		ret = sf_mpi_fail("MPI_Allgather", rc);
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
	rc = MPI_Allgatherv(sum.p ? sum.p : (unsigned char *)"", mine, MPI_BYTE,
			    all, counts, displs, MPI_BYTE, mp->comm);
	if (rc != MPI_SUCCESS) {
		ret = sf_mpi_fail("MPI_Allgatherv", rc);
		goto out_free_all;
	}
	for (int i = 0; i < mp->size && !ret; i++)
		ret = sf_mpi_inv_sum_parse(mp, i, all + displs[i],
					   (size_t)counts[i]);
	if (ret)
		goto out_free_inv;

	mp->src.ops = &sf_mpi_src_ops;
	mp->src.ctx = mp;
	ret = pthread_create(&mp->thread, NULL, sf_mpi_service_main, mp);
	if (ret) {
		ret = -ret;
		sf_err("mpi: cannot start the service thread: %s", strerror(-ret));
		goto out_free_inv;
	}
	mp->started = true;
	sf_info("mpi: %zu local payload files indexed, %lld summary bytes from %d ranks",
		ib.nfiles, total, mp->size);
	(void)sf_mpi_hb_start(mp); /* logs why not */
	(void)sf_mpi_live_start(mp); /* logs why not */
	goto out_free_all;

out_free_inv:
	sf_mpi_inv_free(mp);
out_free_all:
	free(all);
out_free_counts:
	free(counts);
	free(displs);
out_free_ib:
	sf_mpi_wire_inv_release(&ib);
	sf_mpi_wire_inv_release(&sum);
	if (mp->started)
		return 0;
	sf_mpi_live_free(mp); /* what the seeding kept */
	sf_source_destroy(mp->local);
	mp->local = NULL;
out_close_store:
	close(mp->store_fd);
	mp->store_fd = -1;
out_free_store:
	free(mp->store);
	mp->store = NULL;
	return ret;
}

/* "rank 3 is" or "ranks 1,3,7 are" for the ranks with flag[i] set,
 * capped (",..." when cut). */
static void ranks_are(const bool *flag, int n, char *buf, size_t cap)
{
	size_t pos = 0;
	int count = 0;

	for (int i = 0; i < n; i++)
		count += flag[i];
	pos = (size_t)snprintf(buf, cap, "rank%s ", count == 1 ? "" : "s");
	for (int i = 0, k = 0; i < n && pos + 32 < cap; i++)
		if (flag[i])
			pos += (size_t)snprintf(buf + pos, cap - pos, "%s%d",
						k++ ? "," : "", i);
	if (pos + 32 >= cap)
		pos += (size_t)snprintf(buf + pos, cap - pos, ",...");
	snprintf(buf + pos, cap - pos, count == 1 ? " is" : " are");
}

/* A probe's limit once its rank is marked down: SF_MPI_QUICK_PROBE_MS. */
static uint64_t quick_limit(uint64_t limit_ns)
{
	uint64_t q = (uint64_t)SF_MPI_QUICK_PROBE_MS * 1000000u;

	return limit_ns < q ? limit_ns : q;
}

/*
 * Ask the other ranks in want[] "are you there?", all at once, and wait: a
 * rank marked down (before or while it is asked: the heartbeat) has
 * SF_MPI_QUICK_PROBE_MS to answer, any other the read timeout. One that answers is marked up; one that does not (or that
 * cannot be asked) is marked down and flagged in dead[]. Returns how many
 * did not answer (*slowest_ms: the longest limit among them), or -ENOMEM.
 * Any thread; blocks at most the read timeout.
 */
static int probe_ranks(struct sf_mpi *mp, const bool *want, bool *dead,
		       const char *what, int *slowest_ms)
{
	struct peer_probe *pr = calloc((size_t)mp->size, sizeof(*pr));
	int rto = atomic_load(&mp->read_timeout_ms), left = 0, ndead = 0;
	uint64_t t0 = sf_mpi_now_ns();
	unsigned us = 10;

	if (!pr)
		return -ENOMEM;
	*slowest_ms = 0;
	for (int p = 0; p < mp->size; p++) {
		dead[p] = false;
		if (p == mp->rank || !want[p])
			continue;
		pr[p].limit_ns = (uint64_t)(sf_mpi_peer_down(mp, p) ?
			SF_MPI_QUICK_PROBE_MS : rto) * 1000000u;
		if (sf_mpi_post_probe(mp, p, &pr[p].rbuf, &pr[p].req) == 0) {
			pr[p].posted = true;
			left++;
		} else {
			sf_mpi_mark_down(mp, p, what, NULL, "MPI error");
			dead[p] = true;
			ndead++;
		}
	}
	while (left > 0) {
		uint64_t now = sf_mpi_now_ns();

		for (int p = 0; p < mp->size; p++) {
			int done = 0;

			if (!pr[p].posted)
				continue;
			MPI_Test(&pr[p].req, &done, MPI_STATUS_IGNORE);
			/* marked down meanwhile (the heartbeat found it
			 * silent): the quick limit */
			if (!done && sf_mpi_peer_down(mp, p))
				pr[p].limit_ns = quick_limit(pr[p].limit_ns);
			if (done) {
				free(pr[p].rbuf);
				sf_mpi_mark_up(mp, p);
			} else if (now - t0 > pr[p].limit_ns) {
				sf_mpi_recv_abandon(mp, &pr[p].req, pr[p].rbuf);
				sf_mpi_mark_down(mp, p, what, NULL, "timed out");
				dead[p] = true;
				ndead++;
				if ((int)(pr[p].limit_ns / 1000000u) > *slowest_ms)
					*slowest_ms = (int)(pr[p].limit_ns / 1000000u);
			} else {
				continue;
			}
			pr[p].posted = false;
			left--;
		}
		if (left > 0)
			sf_mpi_backoff(&us, SF_MPI_WAIT_POLL_US);
	}
	free(pr);
	return ndead;
}

int sf_mpi_peers_up(struct sf_mpi *mp, char *err, size_t errlen)
{
	bool *want, *dead;
	char ranks[256];
	int n, ms;

	if (errlen)
		err[0] = '\0';
	if (!mp || !mp->started)
		return -EINVAL;
	want = malloc((size_t)mp->size * sizeof(*want));
	dead = malloc((size_t)mp->size * sizeof(*dead));
	if (!want || !dead) {
		free(want);
		free(dead);
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	for (int p = 0; p < mp->size; p++)
		want[p] = true;
	n = probe_ranks(mp, want, dead, "a probe before a delete", &ms);
	if (n > 0) {
		ranks_are(dead, mp->size, ranks, sizeof(ranks));
		snprintf(err, errlen, "%s down (no answer within %.1f s)", ranks,
			 ms / 1000.0);
	} else if (n < 0) {
		snprintf(err, errlen, "out of memory");
	}
	free(want);
	free(dead);
	return n > 0 ? -SF_EPEER : n;
}

/* Before a commit: every rank this one has marked down must answer a quick
 * probe, or the commit fails at once (0, or -SF_EPEER with the reason). */
static int commit_precheck(struct sf_mpi *mp, const char *ckpt, char *err,
			   size_t errlen)
{
	bool *want, *dead;
	char ranks[256];
	int n = 0, ms = 0;

	if (sf_mpi_first_down(mp) < 0)
		return 0;
	want = malloc((size_t)mp->size * sizeof(*want));
	dead = malloc((size_t)mp->size * sizeof(*dead));
	if (want && dead) {
		for (int p = 0; p < mp->size; p++)
			want[p] = p != mp->rank && sf_mpi_peer_down(mp, p);
		n = probe_ranks(mp, want, dead, "a probe before a commit", &ms);
	} else {
		n = -ENOMEM;
	}
	if (n > 0) {
		ranks_are(dead, mp->size, ranks, sizeof(ranks));
		snprintf(err, errlen,
			 "%s down (marked down before, no answer to a quick probe "
			 "within %.1f s): the commit of \"%s\" needs every rank; it "
			 "stays uncommitted", ranks, ms / 1000.0, ckpt);
		sf_err("mpi: %s", err);
	} else if (n < 0) {
		snprintf(err, errlen, "out of memory");
	}
	free(want);
	free(dead);
	return n > 0 ? -SF_EPEER : n;
}

/* While a rank other than 0 waits for a verdict, it asks rank 0 "are you
 * there?" every SF_MPI_REPROBE_MS: one that does not answer within the read
 * timeout (SF_MPI_QUICK_PROBE_MS once it is marked down) is marked down, and the wait ends (-SF_EPEER) instead of lasting
 * the whole commit timeout. *pr is the caller's; 0 while rank 0 answers. */
static int coord_probe(struct sf_mpi *mp, struct peer_probe *pr)
{
	uint64_t now = sf_mpi_now_ns();
	int done = 0;

	if (mp->rank == 0)
		return 0;
	if (!pr->posted) {
		if (now < pr->next_ns)
			return 0;
		pr->next_ns = now + (uint64_t)SF_MPI_REPROBE_MS * 1000000u;
		pr->limit_ns = (uint64_t)(sf_mpi_peer_down(mp, 0) ?
			SF_MPI_QUICK_PROBE_MS : atomic_load(&mp->read_timeout_ms)) *
			1000000u;
		if (sf_mpi_post_probe(mp, 0, &pr->rbuf, &pr->req) == 0) {
			pr->posted = true;
			pr->sent_ns = now;
		}
		return 0;
	}
	MPI_Test(&pr->req, &done, MPI_STATUS_IGNORE);
	if (done) {
		free(pr->rbuf);
		pr->posted = false;
		sf_mpi_mark_up(mp, 0);
		return 0;
	}
	if (sf_mpi_peer_down(mp, 0)) /* the heartbeat found it silent */
		pr->limit_ns = quick_limit(pr->limit_ns);
	if (now - pr->sent_ns <= pr->limit_ns)
		return 0;
	sf_mpi_recv_abandon(mp, &pr->req, pr->rbuf);
	pr->posted = false;
	sf_mpi_mark_down(mp, 0, "a probe while waiting for a commit verdict", NULL,
			 "timed out");
	return -SF_EPEER;
}

/* Send a request to rank 0 and wait for its verdict on `tag`; the verdict
 * payload (NUL-terminated) goes to *payload (malloc'd) on success. */
static int coord_call(struct sf_mpi *mp, struct sbuf *sb, int tag,
		      int timeout_ms, char **payload, size_t *plen, char *err,
		      size_t errlen)
{
	uint64_t deadline = sf_mpi_now_ns() + (uint64_t)timeout_ms * 1000000u;
	MPI_Request sreq;
	MPI_Message msg;
	MPI_Status st;
	struct sf_mpi_wire_reply v;
	struct peer_probe pr = { 0 };
	unsigned char *buf;
	int rc, flag = 0, count = 0, ret;
	unsigned us = 50;

	rc = MPI_Isend(sb->data, (int)sb->len, MPI_BYTE, 0, SF_TAG_REQ,
		       mp->comm, &sreq);
	if (rc != MPI_SUCCESS) {
		snprintf(err, errlen, "cannot send to rank 0");
		return sf_mpi_fail("MPI_Isend", rc);
	}
	ret = sf_mpi_wait_req(&sreq, deadline, MPI_STATUS_IGNORE);
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
			ret = sf_mpi_fail("MPI_Improbe", rc);
			goto out_probe;
		}
		if (flag)
			break;
		if (sf_mpi_now_ns() >= deadline) {
			snprintf(err, errlen, "no verdict from rank 0 within %d ms",
				 timeout_ms);
			sf_err("mpi: %s", err);
			ret = -ETIMEDOUT;
			goto out_probe;
		}
		if (coord_probe(mp, &pr) < 0) {
			snprintf(err, errlen,
				 "rank 0 (the commit coordinator) is down (no answer within %.1f s): "
				 "the commit fails",
				 (double)(pr.limit_ns / 1000000u) / 1000.0);
			sf_err("mpi: %s", err);
			ret = -SF_EPEER;
			goto out_probe;
		}
		sf_mpi_backoff(&us, 2000);
	}
	if (pr.posted)
		sf_mpi_recv_abandon(mp, &pr.req, pr.rbuf);
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
		return sf_mpi_fail("MPI_Mrecv", rc);
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
out_probe:
	if (pr.posted)
		sf_mpi_recv_abandon(mp, &pr.req, pr.rbuf);
	return ret;
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
	/* A rank known to be down fails the commit here, at once; rank 0
	 * (which probes every rank its round waits for) fails it for the
	 * others. */
	ret = commit_precheck(mp, ckpt, err, errlen);
	if (ret < 0)
		return ret;
	h.len = partlen;
	h.data = (const unsigned char *)part;
	h.timeout_ms = (uint32_t)timeout_ms;
	h.reply_tag = sf_mpi_new_tag(mp);
	sb = sf_mpi_req_build(&h, ckpt, NULL);
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
	h.reply_tag = sf_mpi_new_tag(mp);
	sb = sf_mpi_req_build(&h, ckpt, NULL);
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
	struct sbuf *sb = sf_mpi_req_build(&h, ckpt, what);
	int ret = 0;

	if (!sb)
		return -ENOMEM;
	sb->refs = 1; /* ours, until every send is queued */
	for (int i = 0; i < mp->size; i++) {
		int r;

		if (i == mp->rank)
			continue;
		r = sf_mpi_send_async(mp, i, SF_TAG_REQ, sb);
		if (r && !ret)
			ret = r;
	}
	sf_mpi_sbuf_put(mp, sb);
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


int sf_mpi_finalize(struct sf_mpi *mp)
{
	int ret = 0;

	if (!mp)
		return 0;
	if (mp->started) {
		struct sf_mpi_src_stats st;
		size_t pairs = 0, names = 0;
		uint64_t fetched = 0;

		sf_mpi_pf_drain(mp, SF_MPI_SEND_DRAIN_MS);
		(void)sf_mpi_inv_cache(mp, NULL, &pairs, &names, &fetched);
		sf_info("mpi: inventory: %zu checkpoint names known, %zu (file, holder) pairs cached (at most %zu), %llu lists fetched",
			names, pairs, mp->inv_cache_max,
			(unsigned long long)fetched);
		sf_mpi_source_stats(mp, &st);
		if (st.claims + st.demand)
			sf_info("mpi: remote reads: %llu asked ahead and claimed "
				"(%.1f ms in all), %llu asked on demand (%.1f ms); "
				"hints: %llu reads named, %llu asked, "
				"%llu dropped; %llu asked after a read; %llu asked and "
				"never read; at most %llu asked ahead at once",
				(unsigned long long)st.claims, st.claim_ns / 1e6,
				(unsigned long long)st.demand, st.demand_ns / 1e6,
				(unsigned long long)st.hints,
				(unsigned long long)st.hint_posts,
				(unsigned long long)st.hint_drops,
				(unsigned long long)st.pf_posts,
				(unsigned long long)st.unused,
				(unsigned long long)st.peak);
		sf_mpi_live_stop(mp); /* no delta after the LEAVE */
		atomic_store(&mp->leaving, true);
		ret = broadcast(mp, SF_MPI_MSG_LEAVE, NULL, NULL);
		if (ret)
			sf_err("mpi: cannot tell the peers that this rank leaves: %s",
			       sf_strerror(ret));
		pthread_join(mp->thread, NULL);
		sf_mpi_live_free(mp); /* no INV_LIST is answered now */
		/* every peer left (or is gone): no one needs heartbeats now */
		sf_mpi_hb_stop(mp);
		sf_mpi_pend_drain(mp, SF_MPI_SEND_DRAIN_MS);
		for (struct round *r = mp->rounds, *next; r; r = next) {
			next = r->next;
			sf_mpi_round_free(r, mp->size);
		}
		sf_mpi_inv_free(mp);
		sf_source_destroy(mp->local);
		free(mp->store);
		close(mp->store_fd);
	}
	for (struct merge_reg *m = mp->merges, *next; m; m = next) {
		next = m->next;
		free(m->name);
		free(m);
	}
	if (mp->ngone) {
		/* MPI_Finalize would wait for the dead peer forever (Open MPI's
		 * runtime fences every process): leave without it; the job was
		 * started with --enable-recovery or it is gone already. */
		sf_err("mpi: %d peer(s) gone: leaving without MPI_Finalize",
		       mp->ngone);
	} else {
		MPI_Comm_free(&mp->comm);
		if (mp->own_init)
			MPI_Finalize();
	}
	pthread_mutex_destroy(&mp->pend_lock);
	pthread_mutex_destroy(&mp->reg_lock);
	pthread_mutex_destroy(&mp->src_lock);
	pthread_rwlock_destroy(&mp->inv_lock);
	pthread_mutex_destroy(&mp->own_lock);
	free(mp->sync_want);
	free(mp->synced);
	free(mp->hosts);
	free(mp->left);
	free(mp->live);
	free(mp->lp);
	free(mp);
	return ret;
}
