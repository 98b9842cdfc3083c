/*
 * sf_error.h - the one error convention of shardfs.
 *
 * Every function that can fail returns 0 (or a non-negative count) on
 * success and a negative number on failure: either a negated errno value
 * (-ENOMEM, -EIO, ...) or a negated shardfs domain error from the reserved
 * range [SF_ERR_BASE, SF_ERR_LAST). sf_strerror() names both; sf_errno()
 * gives the errno a POSIX caller sees (one table, core/sf_error.c).
 */
#ifndef SF_ERROR_H
#define SF_ERROR_H

#ifdef __cplusplus
extern "C" {
#endif

enum sf_err {
	SF_ERR_BASE = 4096,
	SF_EMANIFEST = SF_ERR_BASE, /* manifest malformed or violates the format */
	SF_ECHECKSUM,  /* payload bytes do not match their XXH3 block checksum */
	SF_ESHORT,     /* payload file missing or shorter than its shard */
	SF_EGAP,       /* a tensor is not fully covered by its shards */
	SF_ECONFLICT,  /* declarations disagree, or overlapping shards differ */
	SF_ESLICE,     /* malformed slice syntax NAME@START:STOP,... */
	SF_ERANGE,     /* a box or range lies outside its tensor */
	SF_EPEER,      /* a peer daemon is unreachable or answered badly */
	SF_ENOMPI,     /* shardfs was built without MPI */
	SF_ENOCUDA,    /* shardfs was built without CUDA */
	SF_ECUDA,      /* a CUDA runtime call failed */
	SF_ECOMMITTED, /* the checkpoint is committed and immutable */
	SF_ETOOBIG,    /* a size or count exceeds a shardfs limit */
	SF_EFORMAT,    /* a foreign checkpoint's data is malformed (pickle, zip, metadata) */
	SF_EREFUSED,   /* data names something shardfs never decodes or follows
	                * (a pickle global outside the allowlist, a path outside
	                * the checkpoint, an unknown transform) */
	SF_EBUDGET,    /* a checkpoint's open spent its budget (bytes decoded
	                * or time; sf_budget.h) */
	SF_ERR_LAST
};

/*
 * Name an error. Accepts either sign (-EIO and EIO give the same text).
 * Returns a static string; never NULL.
 */
const char *sf_strerror(int err);

/*
 * The errno a domain error stands for when it must reach a POSIX caller
 * (fs/ replies with it). Plain errnos pass through; anything outside
 * errno space is EIO. Always positive; 0 gives EIO too.
 */
int sf_errno(int err);

#ifdef __cplusplus
}
#endif
#endif
