/*
 * sf_paddle.h - PaddlePaddle distributed checkpoints
 * (`paddle.distributed.save_state_dict`, paddle 2.6 to 3.x) on the format
 * seam, read-only.
 *
 * A checkpoint directory holds `ID.metadata` (a pickle of paddle's
 * Metadata: every state-dict key with the chunks of it each rank saved, as
 * LocalTensorMetadata (global_offset, local_shape, dtype, global_shape,
 * is_flattened, flattened_range), and LocalTensorIndex -> the file that
 * stores each chunk) and `R_ID.distcp` per rank R: a pickled dict of
 * numpy arrays, each array's bytes one run inside the pickle. With
 * `safetensors=True` paddle writes `R_ID.safetensors` instead, which the
 * adapter reads through the safetensors header parser.
 *
 * The adapter decodes both pickles with the restricted pickle reader
 * (paddle's three metadata classes under both module paths they had, and
 * numpy's array reconstruction globals; nothing else), finds each array's
 * bytes in its file without copying them, checks dtype, shape, byte order
 * and order (a Fortran-order array is served through strides) against the
 * metadata, and gives a model whose shards point at those bytes. A
 * flattened chunk (a range of the row-major flattening of its box) becomes
 * the few boxes that range covers. Every other regular file in the
 * directory is a root file.
 *
 * Generations: paddle names a save by its unique id, and a directory may
 * hold several. The checkpoint is the newest (largest id among the
 * metadata and data files), which is what paddle's load_state_dict reads
 * by default; older generations' files are not shown. The newest without
 * its metadata, or with paddle's `ID.metadata.lock` still there, is a save
 * being written (PARTIAL).
 *
 * Paddle saves no checksums: every shard is unverified.
 */
#ifndef SF_PADDLE_H
#define SF_PADDLE_H

#include "sf_format.h"
#include "sf_pk.h"

#define SF_PADDLE_FORMAT "paddle-dcp"

/* One numpy array as paddle.save pickles it (numpy's ndarray.__reduce__:
 * _reconstruct, then BUILD with (version, shape, dtype, is_fortran,
 * data)): its type code ("f4", "u2": BF16 is stored as u2), shape, order
 * and where its bytes lie in the file. Also read by the PaddleNLP
 * hybrid-parallel adapter (sf_paddlenlp_hp.c). */
struct sf_paddle_np {
	char code[3];
	unsigned ndim;
	uint64_t shape[SF_MAX_NDIM];
	bool fortran;                /* column-major bytes */
	uint64_t off, len;           /* the data bytes in the file */
};
/* v (a node of a pickle read with numpy's _reconstruct, ndarray and dtype
 * allowed) of a file of fsize bytes into *a: NULL, or why it cannot be
 * served (a static string: not an array, a type or byte order shardfs
 * does not serve, data that is not one run of the file's bytes). */
const char *sf_paddle_np_array(const struct sf_pk *v, uint64_t fsize,
			       struct sf_paddle_np *a);

extern const struct sf_format sf_format_paddle;

#endif
