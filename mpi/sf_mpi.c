/*
 * sf_mpi.c - the MPI peer layer's public face (sf_mpi.h): init on a private
 * communicator, start (inventory exchange, service thread), the commit and
 * commit-done calls to rank 0, notices to every rank, and an orderly leave.
 * The threads, messages and invariants of the layer are described in
 * sf_mpi_int.h; each job lives in a file of its own (listed there).
 */
#include "sf_mpi_int.h"

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
	if (!mp->left || !mp->live || !mp->lp) {
		free(mp->left);
		free(mp->live);
		free(mp->lp);
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

	ret = sf_mpi_build_inventory(store, mp->single, &ib);
	if (ret)
		sf_err("mpi: cannot index store %s: %s", store, sf_strerror(ret));
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
	mine = (int)ib.len;
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
	rc = MPI_Allgatherv(ib.p ? ib.p : (unsigned char *)"", mine, MPI_BYTE,
			    all, counts, displs, MPI_BYTE, mp->comm);
	if (rc != MPI_SUCCESS) {
		ret = sf_mpi_fail("MPI_Allgatherv", rc);
		goto out_free_all;
	}
	for (int i = 0; i < mp->size && !ret; i++)
		ret = sf_mpi_inv_parse(mp, i, all + displs[i], (size_t)counts[i]);
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
	sf_info("mpi: %zu local payload files indexed, %lld inventory bytes from %d ranks",
		ib.nfiles, total, mp->size);
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
	uint64_t deadline = sf_mpi_now_ns() + (uint64_t)timeout_ms * 1000000u;
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
			return sf_mpi_fail("MPI_Improbe", rc);
		}
		if (flag)
			break;
		if (sf_mpi_now_ns() >= deadline) {
			snprintf(err, errlen, "no verdict from rank 0 within %d ms",
				 timeout_ms);
			sf_err("mpi: %s", err);
			return -ETIMEDOUT;
		}
		sf_mpi_backoff(&us, 2000);
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
		sf_mpi_pf_drain(mp, SF_MPI_SEND_DRAIN_MS);
		atomic_store(&mp->leaving, true);
		ret = broadcast(mp, SF_MPI_MSG_LEAVE, NULL, NULL);
		if (ret)
			sf_err("mpi: cannot tell the peers that this rank leaves: %s",
			       sf_strerror(ret));
		pthread_join(mp->thread, NULL);
		sf_mpi_pend_drain(mp, SF_MPI_SEND_DRAIN_MS);
		for (struct round *r = mp->rounds, *next; r; r = next) {
			next = r->next;
			sf_mpi_round_free(r, mp->size);
		}
		sf_mpi_inv_free(mp);
		sf_source_destroy(mp->local);
		free(mp->store);
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
	free(mp->left);
	free(mp->live);
	free(mp->lp);
	free(mp);
	return ret;
}
