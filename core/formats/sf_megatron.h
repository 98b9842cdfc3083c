/*
 * sf_megatron.h - Megatron-Core distributed checkpoints (what
 * `megatron.core.dist_checkpointing.save` writes: Megatron-LM, NeMo) on
 * the format seam, read-only.
 *
 * A checkpoint directory holds `metadata.json` ({"sharded_backend": ...,
 * "sharded_backend_version": N, ...}, written last), `common.pt` (torch.save
 * of the non-sharded state; never unpickled here) and the sharded backend's
 * files. The `torch_dist` backend is a PyTorch DCP checkpoint (.metadata +
 * __R_T.distcp): the adapter opens it with the DCP adapter's machinery
 * (sf_dcp_open_ex) and adds Megatron's parts:
 *  - `.metadata` may be Megatron's subclass of DCP's Metadata (MCoreMetadata,
 *    megatron-core 0.15) and name MCoreSavePlan; both are allowlisted;
 *  - a tensor saved from flattened ranges (the distributed optimizer's
 *    state before megatron-core 0.16) is stored reformulated: global shape
 *    X (n dims) split into local blocks b (b_i = X_i / F_i) is stored as
 *    F_0 x .. x F_{n-1} x prod(b), each chunk a flat range of one block;
 *    `.metadata`'s mcore_data[key]["nd_reformulated_orig_global_shape"]
 *    says X. Such tensors are shown with shape X, each chunk becoming the
 *    few boxes of X its flat range covers (sf_mcore_flat_boxes).
 *  - megatron-core 0.15+ (0.17's defaults) names, after the above: the
 *    distributed optimizer's `dp_reshardable` state, one 1-D tensor per
 *    grad-buffer bucket and state (`optimizer.distributed.dp_group_idx_G.
 *    gbuf_idx_B.dtype_D.bucket_idx_K.STATE`, STATE param (fp32 main
 *    params), exp_avg, exp_avg_sq), is shown whole as
 *    `optimizer/STATE/dp_group_idx_G.gbuf_idx_B.dtype_D.bucket_idx_K`
 *    (which parameter lies where in a bucket is not in the files: no
 *    per-parameter view, one log line says so); with
 *    `singleton_local_shards` a gated fc1 saved as KEY_w and KEY_v is
 *    shown as KEY = cat(KEY_w, KEY_v) on axis 0 (what the same model
 *    saves as KEY without it), when KEY is not stored itself and both
 *    parts agree in dtype and every other axis.
 * Keys are Megatron's sharded keys; ShardedObjects are DCP byte items
 * named KEY/shard_OFFSETS_SHAPE, shown as objects/KEY/shard_... .
 * metadata.json and common.pt are root files, byte for byte.
 *
 * Other backends (zarr, which megatron-core wrote before torch_dist became
 * its default) are recognized and left out with one log line saying they
 * are not read. A metadata.json that is
 * not Megatron's (no "sharded_backend") beside DCP files leaves the DCP
 * checkpoint shown as plain DCP, as without this adapter.
 */
#ifndef SF_MEGATRON_H
#define SF_MEGATRON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sf_box.h"
#include "sf_format.h"

#define SF_MCORE_FORMAT "megatron-torch_dist"
#define SF_MCORE_CONFIG "metadata.json"
#define SF_MCORE_COMMON "common.pt"
#define SF_MCORE_CONFIG_MAX (64u << 10)   /* bytes of metadata.json */
#define SF_MCORE_BACKEND_MAX 32           /* bytes of a backend name + NUL */

extern const struct sf_format sf_format_megatron;

/* What metadata.json says. */
struct sf_mcore_config {
	char backend[SF_MCORE_BACKEND_MAX]; /* sharded_backend: [A-Za-z0-9_.-]+ */
	int64_t version;                    /* sharded_backend_version, 0..2^31-1;
					     * 1 when absent (megatron's default) */
};

/*
 * Decode metadata.json (text, len bytes, not NUL-terminated, at most
 * SF_MCORE_CONFIG_MAX). 0 and *out, or -SF_EFORMAT with *foreign set when
 * the text is no JSON object with a "sharded_backend" key (some other
 * tool's metadata.json), -SF_EFORMAT with *foreign clear when it has that
 * key with a wrong type or value, -SF_ETOOBIG over the cap (*foreign
 * set), -ENOMEM. A one-line reason in err.
 */
int sf_mcore_config_parse(const char *text, size_t len,
			  struct sf_mcore_config *out, bool *foreign,
			  char *err, size_t errlen);

/*
 * The boxes of an n-dimensional block (origin org, shape blk, n >= 1)
 * that its row-major elements [start, start + len) cover, in order: each
 * box's elements are row-major contiguous in the range, box i starting
 * at flat element start + sum of the earlier boxes' sizes. At most
 * SF_MCORE_MAX_BOXES(n) boxes into out; their count in *nout. 0, or
 * -SF_ERANGE when the range does not lie in the block or len is 0,
 * -SF_ETOOBIG when the block's size overflows.
 */
#define SF_MCORE_MAX_BOXES(n) (2 * (n) - 1)
int sf_mcore_flat_boxes(unsigned n, const uint64_t *org, const uint64_t *blk,
			uint64_t start, uint64_t len, struct sf_box *out,
			size_t *nout);

#endif
