/*
 * sf_error.c - the one error table: each shardfs domain error with its
 * message and the errno it stands for wherever it must reach a POSIX
 * caller (FUSE replies, the tools' messages, logs). Anything about the
 * bytes themselves (a bad checksum, a short payload, an unreachable peer,
 * a hole in the shards, malformed or refused data) is EIO for a reader:
 * the core has already logged which checkpoint, tensor, shard and block
 * went wrong.
 *
 * Invariant: every value in [SF_ERR_BASE, SF_ERR_LAST) has a row in
 * sf_err_table, in enum order.
 */
#include "sf_error.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

struct sf_err_row {
	const char *text;
	int posix;      /* errno shown to POSIX callers */
};

static const struct sf_err_row sf_err_table[SF_ERR_LAST - SF_ERR_BASE] = {
	[SF_EMANIFEST - SF_ERR_BASE] = { "invalid manifest", EIO },
	[SF_ECHECKSUM - SF_ERR_BASE] = { "checksum mismatch", EIO },
	[SF_ESHORT - SF_ERR_BASE] = { "payload file missing or short", EIO },
	[SF_EGAP - SF_ERR_BASE] = { "tensor not fully covered by its shards", EIO },
	[SF_ECONFLICT - SF_ERR_BASE] = { "conflicting declarations or shard bytes", EINVAL },
	[SF_ESLICE - SF_ERR_BASE] = { "malformed slice", EINVAL },
	[SF_ERANGE - SF_ERR_BASE] = { "box or range outside the tensor", ERANGE },
	[SF_EPEER - SF_ERR_BASE] = { "peer daemon unreachable", EIO },
	[SF_ENOMPI - SF_ERR_BASE] = { "shardfs was built without MPI", ENOTSUP },
	[SF_ENOCUDA - SF_ERR_BASE] = { "shardfs was built without CUDA", ENOTSUP },
	[SF_ECUDA - SF_ERR_BASE] = { "CUDA runtime error", EIO },
	[SF_ECOMMITTED - SF_ERR_BASE] = { "checkpoint is committed (read-only)", EROFS },
	[SF_ETOOBIG - SF_ERR_BASE] = { "size or count exceeds a shardfs limit", E2BIG },
	[SF_EFORMAT - SF_ERR_BASE] = { "malformed checkpoint data", EIO },
	[SF_EREFUSED - SF_ERR_BASE] = { "refused: names something outside what shardfs reads", EIO },
	[SF_EBUDGET - SF_ERR_BASE] = { "the checkpoint's open spent its budget", EIO },
};

const char *sf_strerror(int err)
{
	if (err < 0)
		err = -err;
	if (err >= SF_ERR_BASE && err < SF_ERR_LAST)
		return sf_err_table[err - SF_ERR_BASE].text;
	if (err == 0)
		return "success";
	/* strerror() may use a shared buffer only for unknown values; the
	 * known errno strings are static in glibc. */
	return strerror(err);
}

int sf_errno(int err)
{
	if (err < 0)
		err = -err;
	if (err >= SF_ERR_BASE && err < SF_ERR_LAST)
		return sf_err_table[err - SF_ERR_BASE].posix;
	/* A plain errno; anything outside errno space is an I/O error. */
	return err > 0 && err < SF_ERR_BASE ? err : EIO;
}
