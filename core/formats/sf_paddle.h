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

#define SF_PADDLE_FORMAT "paddle-dcp"

extern const struct sf_format sf_format_paddle;

#endif
