/*
 * sf_dcp_entry.h - the DCP adapter's entries, private to the adapter
 * (sf_dcp.c decodes the metadata documents and opens; sf_dcp_entry.c turns
 * each merged state_dict key into a tensor or an object of the model).
 *
 * Ownership: struct dcp is one open's state, made and freed by sf_dcp.c:
 * it owns si (freed when the open ends) and, through its kit, the chunk
 * files; every string and struct sf_pk it or an item points at is
 * borrowed from the decoded documents, which outlive the open.
 */
#ifndef SF_DCP_ENTRY_H
#define SF_DCP_ENTRY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sf_kit.h"
#include "sf_model.h"
#include "sf_pickle.h"

#define DCP_MAX_FILES 65536u          /* distinct chunk files */
#define MOD113 "torch.distributed._shard.checkpoint.metadata"
#define MOD2 "torch.distributed.checkpoint.metadata"

struct sinfo; /* one storage_data entry (sf_dcp_entry.c) */

/* One state_dict_metadata entry of one document. */
struct item {
	const char *key;
	const struct sf_pk *v;
	uint32_t rank, seq;
};

/* One open of a DCP checkpoint. */
struct dcp {
	struct sf_kit k;             /* the open: directory, err, budget, and
				      * the chunk files, each opened once */
	struct sinfo *si;            /* sorted: of a key, the one read first */
	size_t nsi, capsi;
	struct sf_model *m;          /* made by sf_kit_start; sf_kit_end's */
	bool per_rank;               /* documents are __R.metadata, not .metadata */
	const struct sf_pk_global *allow; /* the globals metadata may name */
	size_t nallow;
};

/* Is v an instance of DCP's class cls (either module)? */
bool sf_dcp_is(const struct sf_pk *v, const char *cls);

/* storage_data of document rank (named doc, for messages):
 * {MetadataIndex: _StorageInfo} appended to d->si. 0, or an error with
 * the reason in d->k.w. */
int sf_dcp_read_storage(struct dcp *d, const struct sf_pk *sd, uint32_t rank,
			const char *doc);

/* Sort d->si so that the first entry of a key is the one read: the
 * lowest rank's (torch's loader on rank 0 reads its own), of one
 * document's repeats the last; the others are its replicas. */
void sf_dcp_sort_storage(struct dcp *d);

/* One key of the merged documents: its[0..n), one per rank, lowest first,
 * added to d->m as a tensor or an object, or left out (logged). 0, or an
 * error that ends the open with the reason in d->k.w. */
int sf_dcp_add_key(struct dcp *d, const struct item *its, size_t n);

#endif
