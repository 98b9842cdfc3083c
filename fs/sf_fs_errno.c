/*
 * sf_fs_errno.c - the single place where shardfs errors become the errno
 * of a FUSE reply. Core functions return a negative errno or a negative
 * SF_E* domain error; the kernel only understands errnos. Anything about
 * the bytes themselves (bad checksum, short payload, unreachable peer, a
 * hole in the shards) is EIO for the reader: the core has already logged
 * which checkpoint, tensor, shard and block went wrong.
 */
#include <errno.h>

#include "sf_error.h"
#include "sf_fs_internal.h"

void sf_fs_reply_err(fuse_req_t req, int err)
{
	fuse_reply_err(req, sf_fs_errno(err));
}

int sf_fs_errno(int err)
{
	int e = err < 0 ? -err : err;

	switch (e) {
	case 0:
		return 0;
	case SF_ECHECKSUM:
	case SF_ESHORT:
	case SF_EPEER:
	case SF_EGAP:
	case SF_EMANIFEST:
		return EIO;
	case SF_ESLICE:
		return EINVAL;
	case SF_ERANGE:
		return ERANGE;
	case SF_ECOMMITTED:
		return EROFS;
	case SF_ETOOBIG:
		return E2BIG;
	case SF_ECONFLICT:
		return EINVAL;
	default:
		break;
	}
	if (e >= SF_ERR_BASE && e < SF_ERR_LAST)
		return sf_errno(e);
	/* A plain errno; anything outside errno space is an I/O error. */
	return e > 0 && e < SF_ERR_BASE ? e : EIO;
}
