/*
 * sf_shardfs.h - the native format "shardfs/1" (docs/FORMAT.md) as an
 * adapter on the format seam. Its layout names and its JSON codec (the
 * manifest, a rank's part, the journal's shard records, the shards
 * xattr) are core/sf_manifest.h, shared with the write side.
 */
#ifndef SF_SHARDFS_H
#define SF_SHARDFS_H

#include "sf_format.h"

extern const struct sf_format sf_format_shardfs;

#endif
