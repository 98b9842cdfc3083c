/*
 * sf_deepspeed_obj.h - the non-tensor entries of DeepSpeed's archives as
 * JSON (see sf_deepspeed_obj.c): what manifest.json's "deepspeed" key
 * shows (step counts, the loss scaler, ds_config, ds_version, buffer
 * names, the optimizer's param groups).
 */
#ifndef SF_DEEPSPEED_OBJ_H
#define SF_DEEPSPEED_OBJ_H

#include <jansson.h>

#include "sf_pk.h"
#include "sf_torchsave.h"

#define SF_DS_JSON_MAX_NODES 100000u /* values rendered per archive */
#define SF_DS_JSON_MAX_DEPTH 32u

/*
 * The entries of dict root (a torch.save archive's doc) as a new JSON
 * object, every key except the names in skip (NULL-terminated), each
 * value as sf_deepspeed_obj.c renders it. At most SF_DS_JSON_MAX_NODES
 * values (then "truncated": true). NULL for no dict, or out of memory.
 * The caller owns the reference.
 */
json_t *sf_ds_obj_json(struct sf_ts_doc *doc, const struct sf_pk *root,
		       const char *const *skip);

#endif
