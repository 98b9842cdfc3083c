/*
 * manifest_cmp.h - field-by-field comparison of two manifests, shared by
 * the corpus test and the fuzz target (both check parse(dump(m)) == m).
 */
#ifndef MANIFEST_CMP_H
#define MANIFEST_CMP_H

#include <stdbool.h>
#include <stddef.h>

#include "sf_model.h"

/* True if a and b describe the same checkpoint (builder bookkeeping such
 * as capacities is ignored). Otherwise false, with the first difference
 * named in why (always NUL-terminated when whylen > 0). */
bool manifest_equal(const struct sf_model *a, const struct sf_model *b,
		    char *why, size_t whylen);

#endif
