/*
 * sf_paddlenlp.h - PaddleNLP's unified checkpoint (paddlenlp 2.8.1's
 * trainer with `unified_checkpoint`, and its save_single_card_checkpoint /
 * save_single_card_optimizer) on the format seam, read-only.
 *
 * A checkpoint directory holds `model.safetensors.index.json` with its
 * `model-X-of-Y.safetensors` files, `optimizer.safetensors.index.json`
 * with `optimizer-X-of-Y.safetensors` (keys `PARAM/STATE`: moment1_0,
 * moment2_0, beta1_pow_acc_0, ...; its index says `"master_weights":
 * true|false`) and, with master weights, `master_weights.safetensors.
 * index.json` with `master_weights-X-of-Y.safetensors` (keys PARAM).
 * PaddleNLP writes every file from numpy (`{"format": "np"}` in
 * `__metadata__`), so a bfloat16 tensor is stored as U16.
 *
 * Shown: every model tensor under its name; optimizer state STATE of
 * PARAM as `optimizer/STATE/PARAM`; the master weight of PARAM as
 * `master_weights/PARAM`. Where config.json says `"dtype": "bfloat16"`
 * (or `"torch_dtype"`), every U16 tensor is shown as BF16 (paddle has no
 * uint16 parameters; the bytes are bfloat16's). Every tensor is one run
 * in one file. Other files (config.json, scheduler.pdparams,
 * trainer_state.json, ...) are root files.
 *
 * Recognized by names: the model index beside the optimizer's or the
 * master weights' (or their numbered files); numbered files of a set not
 * all there, or optimizer files without the model index, is a save still
 * being written (PARTIAL). A unified checkpoint without optimizer files
 * cannot be told from Hugging Face weights by names and is the HF
 * adapter's (U16 stays U16 there).
 *
 * PaddleNLP saves no checksums: every shard is unverified.
 */
#ifndef SF_PADDLENLP_H
#define SF_PADDLENLP_H

#include "sf_format.h"

#define SF_PADDLENLP_FORMAT "paddlenlp-unified"

extern const struct sf_format sf_format_paddlenlp;

#endif
