/*
 * sf_mpi_int.h - what the files of the MPI peer layer share (mpi/ only;
 * never installed): tunables, the handle struct sf_mpi, and the functions
 * one file gives the others. The files form a tree:
 *
 *   sf_mpi.c        lifecycle, commit calls, notices    -> all below
 *   sf_mpi_serve.c  the service thread: serving reads, commit rounds on
 *                   rank 0, probes of the ranks a round or a leave waits
 *                   for, notices and leaves              -> fetch, xfer
 *   sf_mpi_fetch.c  the payload source: remote reads, prefetch, the
 *                   "are you there?" probe                -> inv, xfer
 *   sf_mpi_live.c   the live union: this rank's store scanned again
 *                   every SF_MPI_LIVE_MS, its changes sent to the peers
 *                   as per-checkpoint deltas; scans asked for (SYNC)
 *                   answered after their deltas     -> inv, xfer
 *   sf_mpi_inv.c    the inventory: which rank holds which file -> xfer
 *   sf_mpi_xfer.c   tags, send buffers, pending requests, waits, and which
 *                   peers are marked down
 *   sf_mpi_hb.c     the heartbeat thread: a tiny message to every peer
 *                   every SF_MPI_HB_EVERY_MS on its own tag; a peer not
 *                   heard for SF_MPI_HB_SILENCE_MS is marked down, and
 *                   taken back when it is heard again    -> xfer
 *
 * Threads and messages. All traffic runs on a private duplicate of
 * MPI_COMM_WORLD (errors return, never abort). Requests to a daemon go to
 * tag SF_TAG_REQ and are received by exactly one service thread per rank
 * (matched probe + MPI_Mrecv); each request names a reply tag, drawn by the
 * requester from an atomic counter in [SF_MPI_WIRE_TAG_BASE, MPI_TAG_UB],
 * that no other request in flight uses, so any thread may wait for its own
 * reply with MPI_Test polling against a deadline. Replies are
 * [int64 status][bytes]; a read's reply is that head without bytes and
 * then, for status 0, the bytes alone as a second message on the same tag,
 * received straight into the reader's buffer. A daemon sends a read's
 * bytes (256 KiB and more) from a mapping of the payload file's page
 * cache, under a read lease (sf_mpi_serve.c), so that on one node the only
 * copy is the one MPI makes into the reader's buffer.
 *
 * Invariants:
 *  - every received message is sized before it is received (anything over
 *    the wire caps is drained and dropped) and decoded by sf_mpi_wire.c,
 *    which checks every length inside it against what was received, before
 *    any file here uses any field;
 *  - a buffer under an MPI request is never freed before that request
 *    completed: a requester that gives up cancels its receive and, if the
 *    receive already matched, hands request and buffer to the "zombie" list
 *    that the service thread completes and frees later; a receive into a
 *    buffer the caller owns (a read's body) is instead cancelled and
 *    completed before the read returns (sf_mpi_recv_reclaim);
 *  - a payload file mapped under a send is leased for reading (nobody can
 *    truncate it or open it for writing meanwhile, so the mapping never
 *    faults); the lease is dropped when the send completes, or, when it is
 *    broken or has been held SF_MPI_MAP_HOLD_MS, after the mapped bytes
 *    were replaced by an anonymous copy at the same addresses;
 *  - the service thread never blocks on a peer: its replies are MPI_Isend
 *    whose buffers live on the pending list until the send completes;
 *  - the inventory's names (how many files each rank holds of each
 *    checkpoint) are built in sf_mpi_start from the ranks' summaries and
 *    changed afterwards only by the service thread applying a peer's
 *    notice; the file lists are fetched from their holders on demand
 *    (sf_mpi_inv_ensure) and cached up to inv_cache_max pairs; all of it
 *    under inv_lock held for writing; every reader holds it for reading
 *    and copies out what it keeps;
 *  - a rank answers INV_LIST from the records it last told of (own,
 *    updated before its notice is sent), so a list fetched after a notice
 *    came is at least as new as that notice;
 *  - a peer's notices and its SYNCED answers come in the order it sent
 *    them (one sender thread, one tag: MPI does not overtake), so a
 *    SYNCED says that every notice of the scan it closes was applied here;
 *  - commit/commit-done rounds exist only on rank 0 and are touched only by
 *    its service thread;
 *  - a collective (commit, commit-done, a committed checkpoint's delete)
 *    needs every rank: a rank marked down fails it within
 *    SF_MPI_QUICK_PROBE_MS (unless a quick probe finds it back), one that
 *    dies or stops fails it within SF_MPI_QUICK_PROBE_MS of the heartbeat
 *    marking it down, one that is alive and does not answer fails it
 *    within the read timeout (rank 0 probes the
 *    ranks a round waits for; the others probe rank 0 while they wait),
 *    and the commit timeout bounds everything.
 *
 * Wire format: sf_mpi_wire.h describes every message (request headers,
 * reply framing, verdicts, notices, inventories) and sf_mpi_wire.c encodes
 * and validates them; these files only send and receive the bytes, as
 * MPI_BYTE.
 */
#ifndef SF_MPI_INT_H
#define SF_MPI_INT_H

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
#define SF_TAG_HB 2                       /* heartbeats (sf_mpi_hb.c) */
#define SF_MPI_CHUNK (4u << 20)           /* bytes per read message */
#define SF_MPI_INFLIGHT 8                 /* chunk requests in flight per read */
#define SF_MPI_PF_SLOTS 32                /* ranges asked ahead per daemon
					   * (hinted or not), at most */
#define SF_MPI_PF_STALE_MS 500            /* one unclaimed this long may be
					   * given up for a new hint */
#define SF_MPI_PF_MAX (8u << 20)          /* largest prefetched range */
#define SF_MPI_PF_DEPTH 1                 /* ranges prefetched ahead per stream */
#define SF_MPI_WAIT_POLL_US 100           /* longest sleep of a waiting reader */
#define SF_MPI_SERVE_POLL_US 100          /* service poll while requests come */
#define SF_MPI_IDLE_POLL_US 2000          /* service poll when idle */
#define SF_MPI_ACTIVE_NS 200000000ull     /* "requests come": one in last 200 ms */
#define SF_MPI_STREAMS 32                 /* remembered sequential streams */
#define SF_MPI_READ_TIMEOUT_MS 30000      /* default bound on one peer read */
#define SF_MPI_PROBE_EVERY_MS 1000        /* a down peer: one read probes it this often */
#define SF_MPI_PROBE_TIMEOUT_MS 1000      /* bound on such a probe */
#define SF_MPI_REPROBE_MS 2000            /* a rank a round or a leave waits
					   * for is asked again this often */
#define SF_MPI_SEND_DRAIN_MS 5000         /* bound on draining sends at exit */
#define SF_MPI_BUF_MIN (256u << 10)       /* buffers this large are reused */
#define SF_MPI_BUF_KEEP (16u << 20)       /* free buffer bytes kept for reuse */
#define SF_MPI_MAP_MIN (256u << 10)       /* reads this large are sent from a
					   * mapping of the file */
#define SF_MPI_MAP_HOLD_MS 1000           /* longest a lease is held */
#define SF_MPI_MAP_SETTLE_S 2             /* a file modified this recently is
					   * served by copy */
#define SF_MPI_MAX_DEPTH 16               /* directory depth walked */
#define SF_MPI_MAX_TEXT 1024              /* error text in a verdict */
#define SF_MPI_INV_BUCKETS 65536          /* hash buckets of files and of names */
#define SF_MPI_LIVE_MS 250                /* this rank's store scanned again */
#define SF_MPI_LIVE_MAX_CKPTS 100000      /* checkpoints a rank tells of */
#define SF_MPI_INV_CACHE_MAX (1u << 20)   /* (file, holder) pairs of fetched
					   * lists kept (SHARDFS_INV_CACHE) */
#define SF_MPI_LIST_TIMEOUT_MS 2000       /* bound on fetching the lists */
#define SF_MPI_HB_EVERY_MS 250            /* a heartbeat to every peer */
#define SF_MPI_HB_SILENCE_MS 1500         /* a peer not heard this long is
					   * marked down (a dead daemon's
					   * reads fail within 2 s) */
#define SF_MPI_HB_POLL_MS 20              /* the heartbeat thread looks */
#define SF_MPI_HB_STALL_MS 500            /* a gap this long in its own loop:
					   * it did not run (stopped, starved),
					   * and judges nobody by it */

/* A send buffer shared by several MPI_Isend (refcount under pend_lock). */
struct sbuf {
	unsigned refs;
	size_t len;
	bool pooled;          /* from the buffer cache (sf_mpi_sbuf_big) */
	/* A body sent from a mapping of a payload file (sf_mpi_sbuf_map): the
	 * mapping, unmapped when the buffer is freed; fd holds the read lease
	 * that keeps the file intact, -1 once the mapping became an anonymous
	 * copy (sf_mpi_map_release). On mp->mapped while fd >= 0. */
	void *map;            /* NULL: none */
	size_t maplen;        /* bytes */
	int fd;
	uint64_t map_ns;      /* when mapped (sf_mpi_now_ns) */
	struct sbuf *mnext;   /* mp->mapped */
	unsigned char data[];
};

/* One outstanding request with a buffer that must outlive it: a send on the
 * pending list, or a receive someone gave up on (zombie). */
struct pend {
	MPI_Request req;
	struct sbuf *sb;      /* send buffer (shared), or NULL */
	void *rbuf;           /* abandoned receive buffer, or NULL */
	bool rpooled;         /* rbuf is from the buffer cache */
	size_t drain;         /* rbuf is a read's head: when it says a body of
			       * this many bytes follows, receive and drop it */
	struct pend *next;
};

/* Inventory entry: one file some other ranks hold, of a checkpoint whose
 * lists this rank fetched (sf_mpi_inv_ensure). */
struct inv_holder {
	int rank;
	uint64_t size;        /* bytes, as the holder listed it */
};
struct inv_ent {
	char *key;            /* "ckpt\0file" (owned) */
	size_t keylen;        /* bytes of key including the inner NUL */
	struct inv_holder *h; /* owned; grown by sf_array_grow */
	unsigned nh;          /* <= the world size */
	size_t hcap;          /* slots of h */
	struct inv_ent *next;
	struct inv_ent *nnext; /* the next file of the same checkpoint */
};

/* What one rank holds of a checkpoint, as its last notice said, and the
 * round of its list cached here. */
struct inv_peer {
	uint64_t files;       /* files it holds there (0: none) */
	uint64_t round;       /* its scan round then (0: start-up) */
	uint64_t lround;      /* the round its cached list answered with */
	bool lhave;           /* its list is cached (ents) */
};

/* A checkpoint name: every rank knows every name and how many files each
 * rank holds of it (peer, from the start-up summaries and the INV_NAME
 * notices); the file lists themselves (ents, through nnext) only while
 * cached here: fetched from their holders when asked for (lists_stamp is
 * the stamp they were fetched at; only the holders whose round moved since
 * are asked again), dropped when the cache is over its cap (least recently
 * used first). */
struct inv_name {
	char *name;           /* owned */
	struct inv_peer *peer; /* [world size]; owned */
	unsigned held;        /* other ranks with files > 0 */
	uint64_t stamp;       /* inv_stamp when a notice last changed it */
	bool cached;          /* ents are the lists as of lists_stamp */
	uint64_t lists_stamp;
	size_t nrec;          /* (file, holder) pairs in ents */
	atomic_uint_least64_t used; /* inv_tick at its last lookup */
	struct inv_ent *ents;
	struct inv_name *next;
};

/* One chunk read in flight. Its reply comes as two messages on one reply
 * tag (sf_mpi_wire.h): the head (the status) into head, then, for status
 * 0, the body of len bytes straight into the reader's buffer. */
struct rd {
	unsigned char *head;             /* SF_MPI_WIRE_REPLY_HDR bytes; owned;
					  * under hreq */
	MPI_Request hreq;
	MPI_Request breq;                /* the body; MPI_REQUEST_NULL when none
					  * is posted (probes, prefetches not
					  * yet claimed) or it completed */
	int peer;
	int tag;                         /* the reply tag */
	size_t len;                      /* body bytes */
};

/* A range of a remote file asked for ahead of its read (after a read of
 * the block before it, or by an engine hint). Every field under src_lock;
 * rd is the poster's while POSTING and the claimer's while CLAIMED. */
enum pf_state {
	PF_FREE = 0,
	PF_POSTING,                      /* keyed, its request being sent */
	PF_PENDING,                      /* asked for; no read claimed it yet */
	PF_CLAIMED,                      /* a read receives its body */
};
struct pf_slot {
	enum pf_state state;
	const struct sf_ckpt_ref *ck;    /* identity of the checkpoint */
	char *file;                      /* owned; set unless FREE */
	uint64_t off, len;               /* bytes of the file; len <=
					  * SF_MPI_PF_MAX */
	struct rd rd;                    /* head posted; body posted by the
					  * read that claims the slot */
	uint64_t stamp;                  /* issue order, for eviction */
	uint64_t posted_ns;              /* when asked (sf_mpi_now_ns) */
	bool hint;                       /* asked by an engine hint */
};

/* A reader of a remote file: the next offset expected of (ck, file hash),
 * and the length of its last read. */
struct stream {
	const struct sf_ckpt_ref *ck;
	uint64_t fhash;
	uint64_t next;
	uint64_t len;
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

/*
 * A peer as reads and collectives see it. The heartbeat thread marks it
 * down when it was not heard for SF_MPI_HB_SILENCE_MS (silent), a read or
 * a probe that gets no answer in time marks it down too (one log line
 * either way); a marking down wakes every read waiting on it (downs
 * changes: sf_mpi_wait_peer). While it is down, reads that need only it
 * fail at once; one that is down but not silent (its heartbeat comes, its
 * service does not answer) is also tried by one read every
 * SF_MPI_PROBE_EVERY_MS with a short deadline (the probe). A collective
 * fails unless a quick probe (SF_MPI_QUICK_PROBE_MS) finds it back. Any
 * answer, any request from it, and for a silent one its next heartbeat,
 * marks it up again (one log line). Atomics only: every thread shares the
 * verdict.
 */
struct peer_live {
	atomic_bool down;
	atomic_bool silent;              /* down by the heartbeat's silence:
					  * the heartbeat takes it back */
	atomic_uint downs;               /* times marked down */
	atomic_uint_least64_t heard_ns;  /* last sign of life (sf_mpi_now_ns) */
	atomic_uint_least64_t probe_ns;  /* down: earliest next probe (sf_mpi_now_ns) */
	atomic_bool probing;             /* down: one read is probing it */
};

/* The service thread asks a peer "are you there?" (a read no checkpoint
 * has, answered at once by a live service thread) every SF_MPI_REPROBE_MS
 * while this rank leaves and the peer has not left (one that does not
 * answer within the read timeout is gone: killed, its node lost, and not
 * waited for), and on rank 0 while a commit round waits for the peer (one
 * that does not answer is marked down and fails the round). Service thread
 * only. */
struct peer_probe {
	unsigned char *rbuf;             /* owned while posted */
	MPI_Request req;
	bool posted;
	uint64_t sent_ns, next_ns;       /* sf_mpi_now_ns */
	uint64_t limit_ns;               /* posted: no answer after this long
					  * is a timeout */
};

struct pbuf; /* a free large buffer: sf_mpi_xfer.c's alone */
struct hb_state; /* sf_mpi_hb.c's alone */

#define SF_MPI_HOST_MAX 64 /* a host name as logs give it, NUL included */

struct sf_mpi {
	MPI_Comm comm;                   /* private duplicate; set by init */
	int rank, size;                  /* fixed after init */
	int tag_ub;                      /* MPI_TAG_UB of the comm */
	char (*hosts)[SF_MPI_HOST_MAX];  /* [size]: each rank's host name
					  * (MPI_Get_processor_name, cut),
					  * fixed after init */
	bool own_init;                   /* we called MPI_Init_thread */
	atomic_uint next_tag;            /* reply tag counter */

	char *store;                     /* owned; set by start */
	int store_fd;                    /* owned; set by start: the store's
					  * directory then; peers' reads are
					  * opened beneath it, never by path */
	int single;                      /* store is one checkpoint */
	pthread_rwlock_t inv_lock;       /* protects inv, names, inv_stamp,
					  * inv_cached */
	struct inv_ent *inv[SF_MPI_INV_BUCKETS];
	struct inv_name *names[SF_MPI_INV_BUCKETS];
	uint64_t inv_stamp;              /* notices applied, in all */
	size_t inv_cached;               /* (file, holder) pairs cached, all
					  * names; <= inv_cache_max, but for
					  * the lists of one name */
	size_t inv_cache_max;            /* set by start (SHARDFS_INV_CACHE) */
	atomic_uint_least64_t inv_tick;  /* lookups, for the LRU */
	atomic_uint_least64_t inv_fetched; /* lists fetched from peers */

	/* the live union (sf_mpi_live.c) */
	pthread_t live_thread;
	bool live_running;               /* main thread only */
	atomic_bool live_stop;
	atomic_bool live_on;             /* the live thread scans (a SYNC is
					  * answered by it, else at once) */
	pthread_mutex_t own_lock;        /* guards own/nown/capown against the
					  * service thread's INV_LIST answers;
					  * the live thread (and start) alone
					  * change them, under it */
	struct live_own *own;            /* what the peers were last told */
	size_t nown, capown;
	struct live_watch *watch;        /* live thread only: inotify, or NULL
					  * (every checkpoint scanned each
					  * round) */
	atomic_uint_least64_t *sync_want; /* [size]: the highest SYNC each
					   * peer asked (service thread writes) */
	atomic_uint_least64_t *synced;   /* [size]: the highest SYNCED each
					  * peer answered (service thread writes) */
	atomic_uint_least64_t sync_seq;  /* SYNCs this rank asked */

	pthread_t thread;                /* service thread */
	bool started;                    /* thread running (main thread only) */
	pthread_t hb_thread;             /* heartbeat thread (sf_mpi_hb.c) */
	struct hb_state *hb;             /* its state; owned; main thread */
	bool hb_running;                 /* main thread only */
	atomic_bool hb_stop;
	atomic_bool leaving;             /* finalize called on this rank */

	pthread_mutex_t pend_lock;       /* protects pend, zombies and bufs */
	struct pend *pend;               /* sends and abandoned receives */
	struct pbuf *bufs;               /* free large buffers, for reuse */
	size_t buf_bytes;                /* their bytes, <= SF_MPI_BUF_KEEP */
	struct sbuf *mapped;             /* send buffers holding a lease */
	bool map_ok;                     /* reads may be served from mappings
					  * (set once by the service thread) */

	pthread_mutex_t reg_lock;        /* protects merges, notice_fn/arg */
	struct merge_reg *merges;
	sf_notice_fn notice_fn;
	void *notice_arg;

	struct round *rounds;            /* rank 0 service thread only */
	bool *left;                      /* [size] LEAVE seen (or gone); service thread */
	struct peer_probe *lp;           /* [size]; owned; service thread */
	int nprobes;                     /* lp[] posted; service thread */
	int ngone;                       /* peers found gone while leaving;
					  * service thread, read after join */
	int nleft;                       /* service thread */

	/* payload source */
	struct sf_source src;            /* what sf_mpi_source returns */
	struct sf_source *local;         /* core local source (owned) */
	atomic_int read_timeout_ms;
	struct peer_live *live;          /* [size]; owned; set by init */
	pthread_mutex_t src_lock;        /* protects pf, streams, stamp,
					  * pf_full; st_peak is written under it */
	struct pf_slot pf[SF_MPI_PF_SLOTS];
	struct stream streams[SF_MPI_STREAMS];
	uint64_t stamp;
	uint64_t pf_full;                /* longest remote read seen (bytes) */
	/* counters of sf_mpi_source_stats (sf_mpi.h), atomics */
	atomic_uint_least64_t st_hints, st_hint_posts, st_hint_drops;
	atomic_uint_least64_t st_pf_posts, st_claims, st_demand, st_unused;
	atomic_uint_least64_t st_peak, st_claim_ns, st_demand_ns;
};



/* --- sf_mpi_xfer.c: tags, buffers, pending requests, waits --- */

uint64_t sf_mpi_now_ns(void);
void sf_mpi_backoff(unsigned *us, unsigned max);
uint64_t sf_mpi_fnv64(const void *p, size_t n);
int sf_mpi_fail(const char *what, int rc);
int sf_mpi_new_tag(struct sf_mpi *mp);
struct sbuf *sf_mpi_sbuf_new(size_t len);
struct sbuf *sf_mpi_sbuf_big(struct sf_mpi *mp, size_t len);
void *sf_mpi_buf_get(struct sf_mpi *mp, size_t len);
void sf_mpi_buf_put(struct sf_mpi *mp, void *p);
struct sbuf *sf_mpi_req_build(struct sf_mpi_wire_req *r, const char *name,
			      const char *file);
struct sbuf *sf_mpi_reply_build(int64_t status, const void *data, size_t len);
int sf_mpi_send_async(struct sf_mpi *mp, int dest, int tag, struct sbuf *sb);
/* Send sb (refs 0, malloc'd: sf_mpi_sbuf_new) to dest without blocking and
 * without pend_lock when it completes at once (an eager send): sb is then
 * freed; else it goes on the pending list, freed when the send completes.
 * 0, or -SF_EPEER when MPI refused it (sb is still the caller's). */
int sf_mpi_send_nowait(struct sf_mpi *mp, int dest, int tag, struct sbuf *sb);
int sf_mpi_send_part(struct sf_mpi *mp, int dest, int tag, struct sbuf *sb,
		     size_t off, size_t len);
int sf_mpi_send_ptr(struct sf_mpi *mp, int dest, int tag, struct sbuf *sb,
		    const void *ptr, size_t len);
void sf_mpi_sbuf_free(struct sf_mpi *mp, struct sbuf *sb);
/* Mapped send buffers (struct sbuf): sbuf_map makes sb own the mapping
 * and the leased fd; map_release turns those held longer than
 * SF_MPI_MAP_HOLD_MS (every one when all) into anonymous copies and drops
 * their leases. */
void sf_mpi_sbuf_map(struct sf_mpi *mp, struct sbuf *sb, void *map,
		     size_t maplen, int fd);
void sf_mpi_map_release(struct sf_mpi *mp, bool all);
void sf_mpi_recv_reclaim(MPI_Request *req, int peer);
void sf_mpi_sbuf_put(struct sf_mpi *mp, struct sbuf *sb);
void sf_mpi_recv_abandon(struct sf_mpi *mp, MPI_Request *req, void *rbuf);
void sf_mpi_recv_orphan(struct sf_mpi *mp, MPI_Request *req, void *rbuf);
void sf_mpi_recv_orphan_buf(struct sf_mpi *mp, MPI_Request *req, void *rbuf);
/* Leave a read's head receive (head: malloc'd, taken over) to complete;
 * when the head says a body of len bytes follows, that is received into a
 * cached buffer and dropped, so that the peer's send completes. */
void sf_mpi_recv_orphan_read(struct sf_mpi *mp, MPI_Request *hreq,
			     void *head, size_t len);
unsigned sf_mpi_pend_poll(struct sf_mpi *mp);
int sf_mpi_wait_req(MPI_Request *req, uint64_t deadline, MPI_Status *st);
/* sf_mpi_wait_req for a reply from peer, that also ends, with -EHOSTDOWN
 * (req still active), once peer was marked down after downs0 was read
 * (sf_mpi_peer_downs): a read waiting on a peer found dead is woken. */
int sf_mpi_wait_peer(struct sf_mpi *mp, MPI_Request *req, int peer,
		     unsigned downs0, uint64_t deadline, MPI_Status *st);
void sf_mpi_pend_drain(struct sf_mpi *mp, unsigned drain_ms);

/* Peer liveness (struct peer_live), from any thread. mark_down logs once
 * per episode: "rank P did not answer WHAT[ FILE] (WHY): marked down"
 * (file may be NULL); mark_silent (the heartbeat thread) "rank P not heard
 * for S s: marked down"; mark_up logs when the peer was down, and notes
 * it heard (a sign of life). first_down is the lowest other rank marked
 * down, or -1; downs, how often peer was marked down. */
bool sf_mpi_peer_down(const struct sf_mpi *mp, int peer);
bool sf_mpi_peer_silent(const struct sf_mpi *mp, int peer);
unsigned sf_mpi_peer_downs(const struct sf_mpi *mp, int peer);
int sf_mpi_first_down(const struct sf_mpi *mp);
void sf_mpi_mark_down(struct sf_mpi *mp, int peer, const char *what,
		      const char *file, const char *why);
void sf_mpi_mark_silent(struct sf_mpi *mp, int peer, uint64_t silent_ns);
void sf_mpi_mark_up(struct sf_mpi *mp, int peer);

/* --- sf_mpi_hb.c: the heartbeat --- */

/* sf_mpi_start: every peer heard now; start the heartbeat thread (none
 * with one rank). 0 or a negative errno (logged: dead peers are then
 * found by the read timeout only). */
int sf_mpi_hb_start(struct sf_mpi *mp);
/* sf_mpi_finalize, after the service thread ended: stop and join it. */
void sf_mpi_hb_stop(struct sf_mpi *mp);

/* --- sf_mpi_fetch.c --- */

/* Post an "are you there?" to peer: a 1-byte read of no checkpoint, which a
 * live service thread answers at once (with -SF_ESHORT). *rbuf under *req
 * as post_read gives them; 0 or a negative error. */
int sf_mpi_post_probe(struct sf_mpi *mp, int peer, unsigned char **rbuf,
		      MPI_Request *req);

/* --- sf_mpi_inv.c: the inventory --- */

/* The entry of (name, file), or NULL; the caller holds inv_lock (either
 * way) while it uses it, and called sf_mpi_inv_ensure(name) before. */
struct inv_ent *sf_mpi_inv_find(const struct sf_mpi *mp, const char *name,
				const char *file);
/* Make the cached lists of checkpoint name current: when another rank
 * holds files of it and they were not fetched since its last notice, ask
 * each such rank for its list (INV_LIST; live ones only, bounded by
 * SF_MPI_LIST_TIMEOUT_MS) and replace what is cached of it; a rank that
 * does not answer keeps what was cached of it. Any thread; takes inv_lock
 * itself. 0, or the first error (what could be fetched is kept). */
int sf_mpi_inv_ensure(struct sf_mpi *mp, const char *name);
void sf_mpi_inv_rdlock(const struct sf_mpi *mp);
void sf_mpi_inv_unlock(const struct sf_mpi *mp);
void sf_mpi_inv_free(struct sf_mpi *mp);
int sf_mpi_build_inventory(const char *store, int single,
			   struct sf_mpi_wire_inv_buf *ib);
/* sf_mpi_start: rank r's summaries (len untrusted bytes) into the names. */
int sf_mpi_inv_sum_parse(struct sf_mpi *mp, int r, const unsigned char *p,
			 size_t len);
/* What the other ranks hold, for the payload source's peer_files,
 * peer_size and peer_ckpts (sf_source.h): files of checkpoint name held by
 * another rank (name "" in a single-checkpoint store), with the largest
 * size (the lists fetched first: sf_mpi_inv_ensure); names of checkpoints
 * of which another rank holds a file (a name may come more than once).
 * peer_size with live: only holders not marked down (peer_size_live). */
int sf_mpi_inv_peer_files(struct sf_mpi *mp, const char *name,
			  int (*fn)(void *arg, const char *file, uint64_t size),
			  void *arg);
int sf_mpi_inv_peer_size(struct sf_mpi *mp, const char *name,
			 const char *file, bool live, uint64_t *size);
int sf_mpi_inv_peer_ckpts(const struct sf_mpi *mp,
			  int (*fn)(void *arg, const char *name), void *arg);
/* sf_mpi_union_cache (sf_mpi.h). */
int sf_mpi_inv_cache(struct sf_mpi *mp, const char *name, size_t *pairs,
		     size_t *names, uint64_t *fetched);
/* Service thread: rank r says it holds `files` files of checkpoint name
 * now (0: none), as of its round. 0 or -ENOMEM. */
int sf_mpi_inv_note(struct sf_mpi *mp, int r, const char *name,
		    uint64_t files, uint64_t round);
/* Checkpoint name as the peers hold it: *stamp, the inventory's change
 * counter when a notice last touched it (0: none since start), *held 1
 * when another rank holds a file of it. */
int sf_mpi_inv_name_state(const struct sf_mpi *mp, const char *name,
			  uint64_t *stamp, int *held);
/* The walk of one checkpoint directory into serialized records (what
 * sf_mpi_build_inventory does per checkpoint). */
void sf_mpi_inv_scan_ckpt(struct sf_mpi_wire_inv_buf *ib, const char *ckpt,
			  const char *cdir);

/* --- sf_mpi_live.c: the live union --- */

/* What this rank last told its peers of one checkpoint of its store. */
struct live_own {
	char *name;           /* owned */
	uint64_t hash;        /* of its records */
	size_t len;           /* bytes of its records */
	unsigned char *recs;  /* its records (len bytes; owned; NULL when
			       * len is 0): what an INV_LIST is answered */
	uint64_t round;       /* the round they were told in (0: start) */
	bool told;            /* the peers were told of these records */
	bool mark;            /* seen by the current scan */
	bool unwatched;       /* not every directory of it is watched:
			       * scanned every round */
};
struct live_watch;    /* sf_mpi_live.c's alone */
/* sf_mpi_start, before the service thread starts: remember this rank's
 * start-up records (ib) as told, and append one summary per checkpoint
 * of them (sf_mpi_wire_sum_put: what the peers get) to *sum (released by
 * the caller; an error sticks in sum->ret). */
void sf_mpi_live_seed(struct sf_mpi *mp, const struct sf_mpi_wire_inv_buf *ib,
		      struct sf_mpi_wire_inv_buf *sum);
/* sf_mpi_start: start the live thread. 0 or a negative errno (the union
 * stays frozen at start then; logged). */
int sf_mpi_live_start(struct sf_mpi *mp);
/* Stop and join the live thread (no notice is sent after). */
void sf_mpi_live_stop(struct sf_mpi *mp);
/* After the service thread ended: free what the peers were told. */
void sf_mpi_live_free(struct sf_mpi *mp);
/* Service thread: the reply to an INV_LIST of checkpoint name (round and
 * this rank's records of it as last told; none: round 0, no records), or
 * NULL (no memory). */
struct sbuf *sf_mpi_live_list(struct sf_mpi *mp, const char *name);
/* Service thread: peer src asked for a scan (SYNC seq), or answered ours
 * (SYNCED seq). */
void sf_mpi_live_sync_in(struct sf_mpi *mp, int src, uint64_t seq);
void sf_mpi_live_synced_in(struct sf_mpi *mp, int src, uint64_t seq);

/* --- sf_mpi_serve.c: the service thread --- */

void sf_mpi_round_free(struct round *r, int size);
void *sf_mpi_service_main(void *arg);

/* --- sf_mpi_fetch.c: the payload source --- */

void sf_mpi_pf_drain(struct sf_mpi *mp, unsigned drain_ms);
extern const struct sf_source_ops sf_mpi_src_ops;

#endif
