/*
 * sf_engine_ra.h - read-ahead for the engine (sf_engine.c): from the reads
 * it sees, which payload bytes a sequential reader needs next, handed to
 * the source's advise() (sf_source.h). Engine-private: only sf_engine.c
 * creates and calls one. Thread-safe (its own lock, never held while
 * advising, and never held with the engine's).
 */
#ifndef SF_ENGINE_RA_H
#define SF_ENGINE_RA_H

#include <stddef.h>
#include <stdint.h>

#include "sf_engine.h"

struct sf_ra;

/* A read-ahead of window win bytes (> 0) advising src (borrowed, must
 * outlive it; src->ops->advise must be set). 0 or -ENOMEM. */
int sf_ra_create(uint64_t win, const struct sf_source *src, struct sf_ra **out);
void sf_ra_destroy(struct sf_ra *ra); /* accepts NULL */

/* Note a read of bytes [off, off+len) of view (NULL: the whole tensor) of
 * t, len > 0, and advise what comes next; called before the read's own
 * blocks are fetched. ck, m, t and view are only used during the call
 * (kept as keys, never dereferenced later). */
void sf_ra_note(struct sf_ra *ra, const struct sf_ckpt_ref *ck,
		const struct sf_model *m, const struct sf_tensor *t,
		const struct sf_box *view, uint64_t off, size_t len);

/* Forget every stream of checkpoint ck (before it is closed). */
void sf_ra_forget(struct sf_ra *ra, const struct sf_ckpt_ref *ck);

#endif
