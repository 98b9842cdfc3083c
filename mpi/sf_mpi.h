/*
 * sf_mpi.h - the MPI peer layer: one shardfs daemon per rank.
 *
 * MPI is used as a library: a private duplicate of MPI_COMM_WORLD, log
 * lines prefixed "[rank R] ", and every collective function is named and
 * documented as collective. One service thread answers peers (payload reads,
 * commit coordination, leave notices); FUSE worker threads never issue a
 * blocking collective: they only do point-to-point requests with bounded
 * waits. Every message size is bounded and checked before use.
 *
 * With MPI off (SHARDFS_WITH_MPI=OFF) sf_mpi_stub.c stands behind this
 * header and every entry point returns -SF_ENOMPI.
 *
 * Ownership: struct sf_mpi is created by sf_mpi_init and freed by
 * sf_mpi_finalize (which accepts NULL). The source returned by
 * sf_mpi_source() is owned by the sf_mpi handle and valid until finalize.
 */
#ifndef SF_MPI_H
#define SF_MPI_H

#include <stddef.h>
#include <stdint.h>

#include "sf_engine.h"

#define SF_MPI_MAX_MSG (64u << 20)       /* largest message accepted (bytes) */
#define SF_MPI_MAX_PART (256u << 20)     /* largest commit part (bytes) */
#define SF_MPI_QUICK_PROBE_MS 300        /* a rank marked down that a commit
					  * or delete needs: this long to
					  * answer, or the call fails */

struct sf_mpi;

/* 1 if this build has MPI support. */
int sf_mpi_built(void);

/*
 * COLLECTIVE (all ranks of MPI_COMM_WORLD). MPI_Init_thread with
 * MPI_THREAD_MULTIPLE, duplicate the communicator, set the log prefix.
 * Must run before any thread is started and the process never forks after.
 */
int sf_mpi_init(int *argc, char ***argv, struct sf_mpi **out);

int sf_mpi_rank(const struct sf_mpi *mp);
int sf_mpi_size(const struct sf_mpi *mp);
/* The host name of rank (MPI_Get_processor_name, at most 63 bytes), or
 * "?" for a rank out of range; a string valid until sf_mpi_finalize. */
const char *sf_mpi_host(const struct sf_mpi *mp, int rank);

/*
 * COLLECTIVE. Index the payload files of every checkpoint in this rank's
 * store (STORE/CKPT/rank-NNNNN/... or, when single, STORE/rank-NNNNN/...)
 * and exchange the inventories, so that any (checkpoint name, file) can be
 * located on the ranks that hold it. Then start the service thread.
 */
int sf_mpi_start(struct sf_mpi *mp, const char *store, int single);

/*
 * COLLECTIVE (before sf_mpi_start). Whether every rank's STORE is one
 * checkpoint: vote is this rank's sf_store_single_vote() (2: one complete
 * checkpoint, 1: could be part of one, 0: a store of checkpoints); *single
 * becomes 1 on every rank when some rank voted 2 and none voted 0, so a
 * checkpoint spread over node-local stores (its metadata on one node) is
 * one checkpoint everywhere. 0, or a negative error on every rank.
 */
int sf_mpi_allreduce_single(struct sf_mpi *mp, int vote, int *single);

/*
 * The payload source of this daemon: a file present in the local store is
 * read with pread; otherwise it is fetched from a peer that holds it (from
 * the inventory, else the shard's writer rank). Reads are split into
 * messages of at most SF_MPI_MAX_MSG and a sequential reader gets the next
 * chunk prefetched; the engine's read-ahead hints (advise()) ask the
 * peers for the blocks it will read next (a bounded number at a time,
 * their bodies left at the peer until the read comes). Errors: -SF_ESHORT if no rank has the file or it is
 * short, -SF_EPEER if the peer is gone or timed out.
 */
struct sf_source *sf_mpi_source(struct sf_mpi *mp);

/*
 * What the payload source did with remote reads since start (counters,
 * each read atomically; for tests and the log line at finalize):
 *   hints        ranges the engine's read-ahead named in peers' files
 *                (advise(), split into the engine's reads)
 *   hint_posts   of them, asked of a peer ahead of the read
 *   hint_drops   of them, not asked: no free prefetch slot, or no live
 *                holder (a peer marked down is never asked by a hint)
 *   pf_posts     ranges asked ahead after a read (the next block of a
 *                stream), not hints
 *   claims       remote reads served from a range asked ahead (hinted or
 *                not), its body received when the read wanted it
 *   demand       remote reads that asked the peer themselves
 *   unused       ranges asked ahead and given up unread (evicted, stale,
 *                their checkpoint forgotten, or at finalize)
 *   peak         the most ranges asked ahead at once (at most
 *                SF_MPI_PF_SLOTS)
 *   claim_ns, demand_ns  the time the claims and the demand reads took,
 *                in all (nanoseconds, from the claim or the request to
 *                the last byte in the reader's buffer)
 * Zeros with MPI off or for NULL.
 */
struct sf_mpi_src_stats {
	uint64_t hints, hint_posts, hint_drops, pf_posts, claims, demand, unused;
	uint64_t peak, claim_ns, demand_ns;
};
void sf_mpi_source_stats(const struct sf_mpi *mp, struct sf_mpi_src_stats *out);

/*
 * Added by the MPI layer: the bound on one peer read (all its chunks), in
 * milliseconds (default 30000). A read that passes it fails with -SF_EPEER.
 * Thread-safe; takes effect for reads that start afterwards.
 */
void sf_mpi_set_read_timeout(struct sf_mpi *mp, int timeout_ms);

/*
 * Merge the parts of all ranks into one manifest (text, malloc'd into
 * *out), or fail with a reason in err. Called on the coordinating rank only,
 * from the service thread. The parts array is in rank order.
 */
typedef int (*sf_merge_fn)(void *arg, const char *ckpt,
			   const char *const *parts, const size_t *lens,
			   int nparts, char **out, size_t *outlen,
			   char *err, size_t errlen);

/*
 * Commit checkpoint `ckpt` across all ranks (each rank calls this once, from
 * a non-FUSE thread or a FUSE thread: it only does point-to-point messages
 * with the coordinator, rank 0, and waits at most timeout_ms). Rank 0
 * collects one part from every rank, calls merge, and sends the merged
 * manifest to all ranks; each rank returns it in *manifest (malloc'd) for
 * the caller to publish, then calls sf_mpi_commit_done() with the publish
 * result; sf_mpi_commit_done returns once all ranks reported (0), or an
 * error if any rank failed or the timeout passed. A rank that never commits
 * makes every other rank's commit fail with -ETIMEDOUT after timeout_ms,
 * with the reason in err.
 *
 * A rank that is down fails both calls sooner, with -SF_EPEER and a reason
 * naming it: within SF_MPI_QUICK_PROBE_MS when this rank or rank 0 marked
 * it down already (a read or probe timed out; a quick probe that it
 * answers marks it up and the commit goes on) or of the heartbeat marking
 * it down (1.5 s after it died or stopped), within the read timeout when
 * it is alive but stops answering rank 0's probes during the round (or,
 * for rank 0 itself, the waiting rank's), and never later than timeout_ms.
 */
int sf_mpi_commit(struct sf_mpi *mp, const char *ckpt, const char *part,
		  size_t partlen, sf_merge_fn merge, void *merge_arg,
		  int timeout_ms, char **manifest, size_t *manifest_len,
		  char *err, size_t errlen);
int sf_mpi_commit_done(struct sf_mpi *mp, const char *ckpt, int publish_result,
		       int timeout_ms, char *err, size_t errlen);

/*
 * Whether every other rank is up, before a change that must reach them all
 * (a committed checkpoint's delete): each is asked "are you there?" at
 * once; one marked down has SF_MPI_QUICK_PROBE_MS to answer, any other the
 * read timeout. An answer marks a rank up, silence marks it down. Returns 0
 * when all answered, else -SF_EPEER with "rank(s) N,M down (...)" in err
 * (errlen bytes, NUL-terminated), or -ENOMEM. Any thread; blocks at most
 * the read timeout.
 */
int sf_mpi_peers_up(struct sf_mpi *mp, char *err, size_t errlen);

/*
 * Tell peers that checkpoint `ckpt` was deleted or (re)committed, so that
 * they drop or reload it. Point-to-point, non-blocking for the caller.
 * The callback given here runs on the service thread for each notice.
 */
typedef void (*sf_notice_fn)(void *arg, int from_rank, const char *what,
			     const char *ckpt);
void sf_mpi_set_notice(struct sf_mpi *mp, sf_notice_fn fn, void *arg);
int sf_mpi_notify(struct sf_mpi *mp, const char *what, const char *ckpt);

/*
 * The live union (sf_mpi_live.c). Every daemon scans its store again every
 * few hundred milliseconds and tells its peers, per checkpoint, how many
 * files it holds now; the file lists stay with their holders and are
 * fetched when a daemon opens or reads the checkpoint. These say what the
 * peers hold now. Any thread; none blocks on a peer.
 *
 * union_state: checkpoint name as the other ranks hold it: *stamp changes
 * whenever a peer's holding of it changed (0: never since start), *held is
 * 1 when some other rank holds a file of it. 0 or -EINVAL.
 *
 * union_sync: ask every peer for one more scan of its store; returns the
 * number to pass to union_synced (0: nothing to wait for: one rank, or the
 * request could not be sent). union_synced: 1 once every peer answered
 * it after a scan that began after the request (its notices applied here
 * first) or is marked down, else 0. A caller waits for it with a bound of
 * its own (a peer killed and not yet marked down never answers).
 *
 * union_cache: what this daemon holds of the peers' file lists (tests,
 * benchmarks): *pairs, the (file, holder) pairs cached of checkpoint name
 * (of every checkpoint for NULL), *names, the checkpoint names known,
 * *fetched, the lists fetched from peers since start (any may be NULL).
 * 0, or -EINVAL (-SF_ENOMPI with MPI off).
 */
int sf_mpi_union_state(struct sf_mpi *mp, const char *name, uint64_t *stamp,
		       int *held);
uint64_t sf_mpi_union_sync(struct sf_mpi *mp);
int sf_mpi_union_synced(struct sf_mpi *mp, uint64_t seq);
int sf_mpi_union_cache(struct sf_mpi *mp, const char *name, size_t *pairs,
		       size_t *names, uint64_t *fetched);

/*
 * COLLECTIVE in effect: called once by each daemon after its mount is gone.
 * Keeps serving peers until every daemon has called it, then stops the
 * service thread and finalizes MPI. Frees mp. Accepts NULL.
 */
int sf_mpi_finalize(struct sf_mpi *mp);

#endif
