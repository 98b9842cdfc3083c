/*
 * sf_formats.h - the table of format adapters (sf_formats.c) and the
 * probe that asks each in turn. Above every adapter: the seam's types
 * (sf_format.h) sit below them. Every struct sf_format returned is static:
 * never freed, valid for the life of the process.
 */
#ifndef SF_FORMATS_H
#define SF_FORMATS_H

#include "sf_format.h"

/* The adapters, in probe order; NULL-terminated. */
extern const struct sf_format *const sf_formats[];

/*
 * Ask every adapter about the directory listed in ls: the first YES wins,
 * else the first PARTIAL; NULL when none claims it. *how gets the answer
 * (SF_PROBE_NO with NULL).
 */
const struct sf_format *sf_format_probe(const struct sf_dirlist *ls,
					enum sf_probe *how);

/* The adapter named name, or NULL. */
const struct sf_format *sf_format_find(const char *name);

#endif
