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

struct sf_pk;
struct sf_pk_global;
struct sf_where;

/*
 * What an adapter for a format built on DCP's files (Megatron-Core's
 * torch_dist) adds to the DCP open. Everything borrowed; a NULL or zero
 * field adds nothing.
 */
#define SF_DCP_EXT_MAX_ALLOW 64
struct sf_dcp_ext {
	const char *format;             /* user.shardfs.format instead of DCP's */
	const struct sf_pk_global *allow; /* more globals .metadata may name */
	size_t nallow;                  /* <= SF_DCP_EXT_MAX_ALLOW */
	const char *meta_module;        /* another class .metadata's root may */
	const char *meta_class;         /* be (a subclass of DCP's Metadata) */
	/* Called once every entry is in m (not finished yet), with
	 * .metadata's root: may reshape, replace or drop entries. 0, or a
	 * negative error with its reason written through w (the checkpoint
	 * is then left out). */
	int (*adjust)(void *arg, struct sf_model *m, const struct sf_pk *root,
		      const struct sf_where *w);
	void *arg;
};

/* The DCP open (sf_format_dcp.open) with ext (NULL: exactly that open). */
int sf_dcp_open_ex(const struct sf_cdir *cd, const struct sf_dcp_ext *ext,
		   struct sf_format_result *out, char *err, size_t errlen);
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

/*
 * sf_dcp_open_docs in two steps, for opening the same documents against
 * several directories (the fuzzer tries each input against three chunk
 * directories; decoding a document depends on its bytes only):
 *   sf_dcp_docs_load  decode the n documents (as above) into *out; 0, or
 *                     a negative error with a one-line reason in err and
 *                     *out NULL;
 *   sf_dcp_docs_open  build the model of dirfd's checkpoint from them,
 *                     exactly as sf_dcp_open_docs would, under budget
 *                     (sf_budget.h; NULL: a fresh one with the default
 *                     limits); the documents are only read, so this can
 *                     be called again;
 *   sf_dcp_docs_free  accepts NULL.
 */
struct sf_dcp_docs;
int sf_dcp_docs_load(const struct sf_dcp_doc *docs, size_t n,
		     struct sf_dcp_docs **out, char *err, size_t errlen);
int sf_dcp_docs_open(const struct sf_dcp_docs *dd, int dirfd, const char *name,
		     struct sf_budget *budget, struct sf_format_result *out,
		     char *err, size_t errlen);
void sf_dcp_docs_free(struct sf_dcp_docs *dd);

#endif
