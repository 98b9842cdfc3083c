/*
 * sf_dcp.h - PyTorch distributed checkpoints (DCP, torch 1.13 to 2.x) on
 * the format seam, read-only.
 *
 * A DCP checkpoint directory holds `.metadata` (a pickle of
 * torch.distributed.checkpoint's Metadata: every state-dict key with its
 * dtype, global size and chunks, and where each chunk is stored) and the
 * `__R_N.distcp` files, in which every item is a torch.save archive at
 * (relative_path, offset, length). The adapter decodes the metadata with
 * the restricted pickle reader (only DCP's own classes, torch.Size and
 * dtypes allowed), opens each chunk's archive in place (sf_torchsave.h),
 * and gives a model whose shards point at the chunks' storage bytes: a
 * box of the tensor, strided when the chunk was saved from a view. Items
 * that are not tensors (BytesStorageMetadata: step counters, RNG state,
 * whole nested dicts in torch 1.13) become objects holding their stored
 * bytes. Every other regular file in the directory is a root file.
 *
 * DCP carries no checksums: every shard is unverified.
 */
#ifndef SF_DCP_H
#define SF_DCP_H

#include "sf_format.h"

#define SF_DCP_FORMAT "torch-dcp"
#define SF_DCP_METADATA ".metadata"
#define SF_DCP_SUFFIX ".distcp"

extern const struct sf_format sf_format_dcp;

#endif
