/*
 * sf_commit.h - the commit merge of a shardfs/1 checkpoint: the parts that
 * every rank exported (sf_wckpt_export_part) become its manifest.
 */
#ifndef SF_COMMIT_H
#define SF_COMMIT_H

#include <stddef.h>

#include "sf_engine.h"

/*
 * Merge the parts of all ranks into the checkpoint's manifest text: checks
 * that declarations agree (-SF_ECONFLICT), that every tensor is covered
 * (-SF_EGAP), and that overlapping shards hold the same bytes (identical
 * shards by checksum lists, others by reading both through src and ck;
 * -SF_ECONFLICT). One-line reason in err. On success *out is the manifest
 * (malloc'd, the caller frees). Before it returns, src forgets ck (closes
 * what it opened for it), so ck may be a short-lived value.
 */
int sf_commit_merge(const char *name, const char *const *parts,
		    const size_t *lens, int nparts, struct sf_source *src,
		    const struct sf_ckpt_ref *ck, char **out, size_t *outlen,
		    char *err, size_t errlen);

#endif
