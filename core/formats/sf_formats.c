/*
 * sf_formats.c - the table of format adapters (sf_formats.h) and the probe
 * that asks each in turn. Adding a format is adding its adapter's row
 * here.
 *
 * Invariant: the native format comes first, so a directory shardfs made
 * is always its own, whatever else it holds.
 */
#include "sf_formats.h"
#include "sf_colossal.h"
#include "sf_dcp.h"
#include "sf_deepspeed.h"
#include "sf_dtensor.h"
#include "sf_hf.h"
#include "sf_megatron.h"
#include "sf_paddle.h"
#include "sf_paddlenlp.h"
#include "sf_paddlenlp_hp.h"
#include "sf_shardfs.h"

#include <string.h>

const struct sf_format *const sf_formats[] = {
	&sf_format_shardfs,
	&sf_format_megatron,    /* before DCP: its files are DCP's + metadata.json */
	&sf_format_dcp,
	&sf_format_paddle,
	&sf_format_dtensor,
	&sf_format_colossal,
	&sf_format_paddlenlp, /* before HF: its model index is HF's */
	&sf_format_paddlenlp_hp,
	&sf_format_deepspeed, /* before HF: a Trainer checkpoint-N may hold both */
	&sf_format_hf,  /* last: its single-file rule is the broadest */
	NULL,
};

const struct sf_format *sf_format_find(const char *name)
{
	for (size_t i = 0; sf_formats[i]; i++)
		if (strcmp(sf_formats[i]->name, name) == 0)
			return sf_formats[i];
	return NULL;
}

const struct sf_format *sf_format_probe(const struct sf_dirlist *ls,
					enum sf_probe *how)
{
	const struct sf_format *partial = NULL;

	for (size_t i = 0; sf_formats[i]; i++) {
		enum sf_probe p = sf_formats[i]->probe(ls);

		if (p == SF_PROBE_YES) {
			*how = p;
			return sf_formats[i];
		}
		if (p == SF_PROBE_PARTIAL && !partial)
			partial = sf_formats[i];
	}
	*how = partial ? SF_PROBE_PARTIAL : SF_PROBE_NO;
	return partial;
}

