/*
 * sf_paddlenlp_meta.h - the name tables of PaddleNLP's model_meta.json
 * (what sharding_io.save_distributed_model_meta writes beside a
 * hybrid-parallel checkpoint saved with sharding stage 1).
 *
 * `sharding_metas` holds per "tpXX_ppYY" (always both, two digits) a
 * `structure_name_mapping`: structured name -> paddle's static name of
 * every parameter of that tensor rank and stage. The adapter needs it when
 * the model files do not name a parameter: save_sharded_model in bf16
 * leaves every parameter with a master weight out of them
 * (exclude_paramters_in_state_dict), so only model_meta.json names the
 * optimizer's states and master weights.
 */
#ifndef SF_PADDLENLP_META_H
#define SF_PADDLENLP_META_H

#include <stddef.h>

#include "sf_format.h"

#define SF_PNLP_META_MAX_BYTES (64u << 20)  /* model_meta.json read at most */
#define SF_PNLP_META_MAX_NAMES (1u << 22)   /* pairs kept at most */

struct sf_pnlp_meta_pair;

struct sf_pnlp_meta {
	void *root;                          /* owned: the parsed JSON */
	struct sf_pnlp_meta_pair *pairs;     /* owned: sorted by tp, pp, static */
	size_t n;
};

/* model_meta.json of cd into *m (zeroed first). 0 with m->n pairs (none
 * when the file is absent); -SF_EFORMAT (malformed: why[whylen] says
 * how), -SF_ETOOBIG, -ENOMEM or the read's error. The caller frees with
 * sf_pnlp_meta_free either way. */
int sf_pnlp_meta_load(const struct sf_cdir *cd, struct sf_pnlp_meta *m,
		      char *why, size_t whylen);

/* The structured name model_meta.json gives static name sn on tensor rank
 * tp, stage pp (-1 read as 0), or NULL. Borrowed from m. */
const char *sf_pnlp_meta_struct(const struct sf_pnlp_meta *m, int tp, int pp,
				const char *sn);

void sf_pnlp_meta_free(struct sf_pnlp_meta *m);

#endif
