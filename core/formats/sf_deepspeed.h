/*
 * sf_deepspeed.h - the DeepSpeed ZeRO adapter (stages 1, 2 and 3, as
 * DeepSpeed's engine.save_checkpoint and the HF Trainer write it): a
 * directory with `latest` naming a tag directory (global_stepN/), or a
 * bare tag directory, holding *_optim_states.pt (one per data-parallel
 * rank: the flat fp32 partitions and Adam's moments) and
 * *_model_states.pt (the 16-bit module, the parameter shapes, buffers);
 * tensor parallel (mp_rank_XX); and DeepSpeed universal checkpoints
 * (latest_universal, TAG/zero/PARAM/fp32.pt). See sf_deepspeed.c for
 * what it shows.
 */
#ifndef SF_DEEPSPEED_H
#define SF_DEEPSPEED_H

#include "sf_format.h"

#define SF_DEEPSPEED_FORMAT "deepspeed"

extern const struct sf_format sf_format_deepspeed;

#endif
