/*
 * sf_wckpt_dir.h - the directories of shardfs/1 checkpoints in a store, as
 * the write side claims and retires them (sf_wckpt_dir.c): a new
 * checkpoint's directory made with its marker, one shardfs made adopted,
 * a deleted one moved aside and removed. Paths are the caller's; nothing
 * here holds state.
 */
#ifndef SF_WCKPT_DIR_H
#define SF_WCKPT_DIR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/*
 * Make dir (STORE/NAME) a new checkpoint directory, or find one that a
 * shardfs writer (another rank sharing the store, or an earlier life of
 * this daemon) already made. A new directory appears atomically with its
 * marker: it is made under a hidden temporary name in the store, the
 * marker written, then renamed into place without replacing anything, so
 * nobody ever sees a shardfs directory without its marker. Returns 0 when
 * dir is a directory shardfs writes into; -EEXIST when dir is a committed
 * checkpoint (manifest.json) or anything shardfs did not make (never
 * adopted, never written into); another negative errno.
 */
int sf_wckpt_claim_dir(const char *dir);

/* Did shardfs make directory dir for writing: it holds the marker, or a
 * rank's journal (rank-NNNNN/journal.jsonl, from versions before the
 * marker)? */
bool sf_wckpt_dir_is_ours(const char *dir);

/* Did rank write into checkpoint directory dir (its journal exists)? */
bool sf_wckpt_rank_wrote(const char *dir, uint32_t rank);

/*
 * Deleting a shardfs/1 checkpoint directory from its store, in two steps
 * so the caller can drop it from its own state in between:
 *   sf_wckpt_retire  remove manifest.json first (a crash from here on
 *                    leaves an uncommitted directory, never a committed
 *                    checkpoint with missing payloads), then rename dir to
 *                    a hidden STORE/.deleted-NAME-PID-N (*gone, malloc'd);
 *   sf_wckpt_remove_retired  remove that directory tree (best effort:
 *                    what cannot be removed is logged, nothing else).
 * retire returns 0, or a negative errno with a one-line reason in why.
 */
int sf_wckpt_retire(const char *store, const char *dir, const char *name,
		    char **gone, char *why, size_t whylen);
void sf_wckpt_remove_retired(const char *gone);

#endif
