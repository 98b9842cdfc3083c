/*
 * sf_mpi_hb.c - the heartbeat: finds a dead or stopped peer daemon in
 * SF_MPI_HB_SILENCE_MS, whatever the read timeout. Open MPI 4.1 has no
 * ULFM (nothing tells a process that a peer died), so every daemon runs
 * one small thread that sends a 16-byte heartbeat (sf_mpi_wire.h) to every
 * peer every SF_MPI_HB_EVERY_MS on its own tag (SF_TAG_HB), receives the
 * peers' ones (sized before received, matched probe + MPI_Mrecv, like the
 * service thread's requests), and marks a peer down that it has not heard
 * for SF_MPI_HB_SILENCE_MS (sf_mpi_mark_silent: one log line; every read
 * waiting on it is woken and fails, later reads that need only it fail at
 * once). The next heartbeat from a peer it marked so takes it back
 * (sf_mpi_mark_up: one log line).
 *
 * Why a thread of its own: the service thread may spend a while on one
 * pass (up to 64 requests, each a pread of up to 4 MiB, a commit's merge,
 * a notice's reload), and a reader waits on its own reply; neither must
 * make a live daemon look dead. This thread does nothing but tiny
 * non-blocking MPI calls and a short sleep, and each of them also drives
 * MPI's progress (MPI_THREAD_MULTIPLE: any thread may), so heartbeats are
 * sent and received while the other threads are busy. Any other sign of
 * life (a request from the peer, an answer) counts as heard too
 * (sf_mpi_mark_up).
 *
 * Invariants: at most one heartbeat send per peer is in flight, and it
 * is synchronous (a peer that does not take them, stopped or dead, holds
 * one message, not a queue: see hb_send); the bytes sent are a constant in static storage, so a send
 * still in flight at the end is freed without waiting; a gap of more than
 * SF_MPI_HB_STALL_MS in this thread's own loop (this process was stopped
 * or starved) judges nobody: every peer's silence starts again; a peer is
 * judged only while this rank is not leaving (peers that leave go on
 * sending until every rank left, and the leave has its own probes).
 */
#include "sf_mpi_int.h"

static unsigned char hb_msg[SF_MPI_WIRE_HB_LEN]; /* constant once set */
static pthread_once_t hb_once = PTHREAD_ONCE_INIT;

static void hb_msg_init(void)
{
	sf_mpi_wire_hb_encode(hb_msg, 0); /* seq: 0, reserved */
}

/* Receive every heartbeat waiting (at most a few rounds' worth, so that
 * a flood cannot hold the thread); a valid one from a peer this thread
 * found silent takes it back. */
static void hb_drain(struct sf_mpi *mp, bool *quiet)
{
	for (int n = 0; n < 4 * mp->size; n++) {
		unsigned char buf[SF_MPI_WIRE_HB_LEN];
		MPI_Message msg;
		MPI_Status st;
		uint64_t seq;
		int flag = 0, count = 0, src;

		if (MPI_Improbe(MPI_ANY_SOURCE, SF_TAG_HB, mp->comm, &flag, &msg,
				&st) != MPI_SUCCESS || !flag)
			return;
		MPI_Get_count(&st, MPI_BYTE, &count);
		src = st.MPI_SOURCE;
		if (count != (int)sizeof(buf)) {
			/* Sized before received: anything else is drained
			 * (truncated into buf) and dropped. */
			MPI_Mrecv(buf, (int)sizeof(buf), MPI_BYTE, &msg,
				  MPI_STATUS_IGNORE);
			sf_debug("mpi: dropping a %d-byte heartbeat from rank %d",
				 count, src);
			continue;
		}
		if (MPI_Mrecv(buf, count, MPI_BYTE, &msg, MPI_STATUS_IGNORE) !=
			    MPI_SUCCESS ||
		    src < 0 || src >= mp->size || src == mp->rank ||
		    sf_mpi_wire_hb_decode(buf, (size_t)count, &seq) < 0)
			continue;
		atomic_store(&mp->live[src].heard_ns, sf_mpi_now_ns());
		if (quiet[src]) {
			quiet[src] = false;
			if (sf_mpi_peer_silent(mp, src))
				sf_mpi_mark_up(mp, src);
		}
	}
}

/* A heartbeat to every peer that took its last one. Synchronous sends: one
 * completes only once the peer received it, and none is sent while one is
 * out, so a peer that takes none (stopped, dead) holds one message of
 * this process's and no more (a plain send completes at once, into
 * MPI's shared-memory slots for that peer, and a dead peer never gives
 * those back: a few hundred later, every send to it blocks). */
static void hb_send(struct sf_mpi *mp, MPI_Request *sreq)
{
	for (int p = 0; p < mp->size; p++) {
		int done = 0;

		if (p == mp->rank)
			continue;
		if (sreq[p] != MPI_REQUEST_NULL) {
			if (MPI_Test(&sreq[p], &done, MPI_STATUS_IGNORE) !=
				    MPI_SUCCESS)
				done = 1; /* a failed send: try anew */
			if (!done)
				continue;
			sreq[p] = MPI_REQUEST_NULL;
		}
		if (MPI_Issend(hb_msg, SF_MPI_WIRE_HB_LEN, MPI_BYTE, p, SF_TAG_HB,
			       mp->comm, &sreq[p]) != MPI_SUCCESS)
			sreq[p] = MPI_REQUEST_NULL;
	}
}

/* Mark down every peer not heard for SF_MPI_HB_SILENCE_MS. */
static void hb_judge(struct sf_mpi *mp, bool *quiet, uint64_t now)
{
	const uint64_t limit = (uint64_t)SF_MPI_HB_SILENCE_MS * 1000000u;

	for (int p = 0; p < mp->size; p++) {
		uint64_t heard = atomic_load(&mp->live[p].heard_ns);

		if (p == mp->rank)
			continue;
		if (quiet[p] && !sf_mpi_peer_silent(mp, p))
			quiet[p] = false; /* someone else heard it meanwhile */
		if (quiet[p] || now <= heard || now - heard <= limit)
			continue;
		quiet[p] = true;
		sf_mpi_mark_silent(mp, p, now - heard);
	}
}

struct hb_state {
	struct sf_mpi *mp;
	MPI_Request *sreq;               /* [size] */
	bool *quiet;                     /* [size]: found silent, not heard since */
};

static void *hb_main(void *arg)
{
	struct hb_state *hs = arg;
	struct sf_mpi *mp = hs->mp;
	const struct timespec poll = { 0, SF_MPI_HB_POLL_MS * 1000000L };
	uint64_t now = sf_mpi_now_ns(), last = now, next_send = now;

	while (!atomic_load(&mp->hb_stop)) {
		hb_drain(mp, hs->quiet);
		now = sf_mpi_now_ns();
		if (now - last > (uint64_t)SF_MPI_HB_STALL_MS * 1000000u) {
			/* This thread did not run: its silence is not theirs. */
			for (int p = 0; p < mp->size; p++)
				atomic_store(&mp->live[p].heard_ns, now);
			next_send = now;
		}
		last = now;
		if (now >= next_send) {
			hb_send(mp, hs->sreq);
			next_send = now + (uint64_t)SF_MPI_HB_EVERY_MS * 1000000u;
		}
		if (!atomic_load(&mp->leaving))
			hb_judge(mp, hs->quiet, now);
		nanosleep(&poll, NULL);
	}
	return NULL;
}

int sf_mpi_hb_start(struct sf_mpi *mp)
{
	struct hb_state *hs;
	uint64_t now = sf_mpi_now_ns();
	int ret;

	for (int p = 0; p < mp->size; p++)
		atomic_store(&mp->live[p].heard_ns, now);
	if (mp->size < 2)
		return 0;
	pthread_once(&hb_once, hb_msg_init);
	hs = calloc(1, sizeof(*hs));
	if (!hs)
		return -ENOMEM;
	hs->mp = mp;
	hs->sreq = malloc((size_t)mp->size * sizeof(*hs->sreq));
	hs->quiet = calloc((size_t)mp->size, sizeof(*hs->quiet));
	if (!hs->sreq || !hs->quiet) {
		ret = -ENOMEM;
		goto out_free;
	}
	for (int p = 0; p < mp->size; p++)
		hs->sreq[p] = MPI_REQUEST_NULL;
	atomic_store(&mp->hb_stop, false);
	mp->hb = hs;
	ret = -pthread_create(&mp->hb_thread, NULL, hb_main, hs);
	if (ret == 0) {
		mp->hb_running = true;
		return 0;
	}
	mp->hb = NULL;
out_free:
	sf_err("mpi: cannot start the heartbeat: %s; a dead peer is found by "
	       "the read timeout only", sf_strerror(ret));
	free(hs->sreq);
	free(hs->quiet);
	free(hs);
	return ret;
}

void sf_mpi_hb_stop(struct sf_mpi *mp)
{
	struct hb_state *hs = mp->hb;

	if (!mp->hb_running)
		return;
	atomic_store(&mp->hb_stop, true);
	pthread_join(mp->hb_thread, NULL);
	mp->hb_running = false;
	for (int p = 0; p < mp->size; p++) {
		int done = 0;

		if (hs->sreq[p] == MPI_REQUEST_NULL)
			continue;
		/* its bytes are static: a send a dead peer never takes is
		 * let go without waiting */
		if (MPI_Test(&hs->sreq[p], &done, MPI_STATUS_IGNORE) !=
			    MPI_SUCCESS || !done)
			MPI_Request_free(&hs->sreq[p]);
	}
	free(hs->sreq);
	free(hs->quiet);
	free(hs);
	mp->hb = NULL;
}
