/*
 * sf_deepspeed_obj.h - the non-tensor entries of DeepSpeed's archives as
 * JSON (see sf_deepspeed_obj.c): what manifest.json's "deepspeed" key
 * shows (step counts, the loss scaler, ds_config, ds_version, buffer
 * names, the optimizer's param groups).
 */
#ifndef SF_DEEPSPEED_OBJ_H
#define SF_DEEPSPEED_OBJ_H

#include <jansson.h>
#include <stdbool.h>

#include "sf_held.h"
#include "sf_kit.h"
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

/* objects/NAME for the same entries, each a torch.save archive that
 * torch.load reads to the value stored (sf_pickle_write.h). */
#define SF_DS_OBJ_MAX (1u << 20)      /* bytes of one object's archive */
#define SF_DS_OBJ_TOTAL (16u << 20)   /* bytes of all of a checkpoint's */
#define SF_DS_OBJ_COUNT 4096u         /* objects per checkpoint */

struct sf_ds_held {
	struct sf_held *v;      /* owned until handed over */
	size_t n, cap;
	size_t bytes;           /* sum of v[].len */
	size_t tensors;         /* entries left out: they hold tensors */
};

/*
 * Each string key's entry of dict root (a torch.save archive's decoded
 * pickle), written as a torch.save archive (globals only from
 * allow[0..nallow)) into h named PREFIX KEY. An entry that holds a tensor
 * is counted in h->tensors, unless descend is set and it is a dict: then
 * its own entries are written under PREFIX KEY/ (one level). An entry
 * past the caps, with a key no object may be named, or naming a global
 * off the list is left out with the kit's line. 0, or -ENOMEM.
 */
int sf_ds_obj_held(struct sf_kit *k, const struct sf_pk *root,
		   const char *prefix, bool descend,
		   const struct sf_pk_global *allow, size_t nallow,
		   struct sf_ds_held *h);
/* Sort h by name, leaving out (with the kit's line) a name given twice
 * or one that another's directory takes ("a" beside "a/b"). */
void sf_ds_held_finish(struct sf_kit *k, struct sf_ds_held *h);

#endif
