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
 * Two layouts of torch 2.x are read too. Saved without collectives
 * (use_collectives=False) a checkpoint has no `.metadata` but one
 * `__R.metadata` per rank, each with only that rank's chunks: they are
 * merged into one model, complete only when every rank from 0 to the
 * highest one any file names has its metadata (else PARTIAL: being
 * written). Chunks written through torch's ZStandard extension
 * (`transform_descriptors` ["stream.zstd/1"]) are coded shards
 * (sf_codec.h); any other transform, or a corrupt stream, makes the
 * chunk's reads fail with EIO and is logged.
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

/* One metadata document in memory (a `.metadata` or `__R.metadata` file's
 * bytes; borrowed). */
struct sf_dcp_doc {
	const void *buf;
	size_t len;
};

/*
 * Build the model of the DCP checkpoint in dirfd (named name) from
 * metadata given in memory instead of its files: n == 1, one global
 * `.metadata`; n > 1, rank i's `__i.metadata` in docs[i]. Chunk files are
 * read from dirfd as by the adapter's open (the fuzzer and tests use it).
 * 0, or a negative error with a one-line reason in err.
 */
int sf_dcp_open_docs(int dirfd, const char *name, const struct sf_dcp_doc *docs,
		     size_t n, struct sf_format_result *out, char *err,
		     size_t errlen);

#endif
