/*
 * sf_dtensor.h - per-rank torch.save pickles of DTensor state dicts (verl's
 * model_world_size_W_rank_R.pt; FSDP2, with or without tensor parallel,
 * saved with torch.save per rank): a directory holding
 * model_world_size_W_rank_R.pt for every R in 0..W-1, each a torch.save
 * of a dict whose values are DTensors (their local shard, mesh and
 * placements; or FSDP1's ShardedTensors with their shard metadata), plain
 * tensors and other values. Every tensor whose ranks' shards tile it is
 * shown whole (sf_dtensor.c says how).
 */
#ifndef SF_DTENSOR_H
#define SF_DTENSOR_H

#include "sf_format.h"

#define SF_DTENSOR_FORMAT "torch-dtensor"

extern const struct sf_format sf_format_dtensor;

#endif
