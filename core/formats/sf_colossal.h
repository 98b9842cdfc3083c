/*
 * sf_colossal.h - ColossalAI's distributed checkpoint IO (hpcaitech/
 * ColossalAI PR 6181; HybridParallelCheckpointIO with gather_dtensor=False):
 * per writer (dist_id = tp_size * pp_rank + tp_rank) a
 * pytorch_model-meta-dist-RRRRR.index.json (safetensors) or .json (.bin)
 * whose "metadata" gives every parameter's offsets, lengths, global_shape
 * and file, and the writer's weight files (model-dist-RRRRR-shard-NNNNN.
 * safetensors, pytorch_model-dist-RRRRR-shard-NNNNN.bin, or one
 * pytorch_model-dist-RRRRR.bin / .safetensors). Every parameter is shown
 * whole from every writer's part, buffers (no meta entry) once when every
 * writer that holds one holds the same bytes (sf_colossal.c says how).
 */
#ifndef SF_COLOSSAL_H
#define SF_COLOSSAL_H

#include "sf_format.h"

#define SF_COLOSSAL_FORMAT "colossalai-dist"

extern const struct sf_format sf_format_colossal;

#endif
