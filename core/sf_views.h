/*
 * sf_views.h - the synthesized files of a checkpoint: model.safetensors
 * (every tensor in one safetensors file, names sorted) and the npy/ views.
 *
 * safetensors layout: 8-byte little-endian header length N, N bytes of JSON
 * ({"__metadata__":{...}, "NAME": {"dtype","shape","data_offsets":[b,e]}},
 * padded with spaces so the data starts 8-byte aligned), then the tensors'
 * bytes back to back in sorted name order. npy: format 1.0 (2.0 when the
 * header needs it), header padded to a multiple of 64 bytes.
 */
#ifndef SF_VIEWS_H
#define SF_VIEWS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sf_engine.h"
#include "sf_model.h"

/* SF_MAX_ST_HEADER, the SF_VIEW_* names and sf_view_name_reserved() are
 * sf_model.h's: the model's validator refuses root files named like a view. */

struct sf_st_layout {
	char *head;            /* the 8-byte length + JSON header + padding */
	uint64_t head_len;     /* bytes of head (multiple of 8) */
	uint64_t *data_off;    /* per tensor of m->tensors: absolute file offset */
	size_t ntensors;
	uint64_t total;        /* file size */
};

/* Build the layout of m's model.safetensors. Caller frees with
 * sf_st_layout_destroy(). The manifest must outlive the layout. */
int sf_st_layout_build(const struct sf_model *m,
		       struct sf_st_layout **out);
void sf_st_layout_destroy(struct sf_st_layout *st); /* accepts NULL */

/* Fill buf with bytes [off, off+len) of model.safetensors (clamped by the
 * caller to st->total), reading tensor bytes through the engine. */
int sf_st_read(struct sf_engine *e, const struct sf_ckpt_ref *ck,
	       const struct sf_model *m, const struct sf_st_layout *st,
	       uint64_t off, void *buf, size_t len);

/*
 * Like sf_st_read, without copying: set iov[0..ret) to bytes [off, off+len)
 * of model.safetensors, in order: a piece of st->head (valid while st is),
 * then each overlapped tensor's verified bytes in the engine's cached
 * blocks, pinned in holds[0..*nholds) (one hold per tensor, each empty on
 * entry) until the caller passes each to sf_engine_release(). Returns the
 * number of iovecs; -E2BIG, without logging and with nothing held, when
 * the range needs more than maxiov pieces, more than maxholds tensors or a
 * tensor more pieces or blocks than one hold takes (the caller then copies
 * with sf_st_read); or sf_st_read's errors, with nothing held.
 */
struct iovec;
int sf_st_readv(struct sf_engine *e, const struct sf_ckpt_ref *ck,
		const struct sf_model *m, const struct sf_st_layout *st,
		uint64_t off, size_t len, struct iovec *iov, unsigned maxiov,
		struct sf_engine_hold *holds, unsigned maxholds,
		unsigned *nholds);

/* The npy header of t into a malloc'd buffer (*out, *len; caller frees).
 * -ENOTSUP when numpy has no native type for t's dtype. */
int sf_npy_header(const struct sf_tensor *t, char **out, size_t *len);

/* How many tensors of m npy/ leaves out (their dtype has no numpy type),
 * and their dtypes' names, ", "-separated in dtype order, into buf
 * (always terminated, cut to size). */
size_t sf_npy_left_out(const struct sf_model *m, char *buf, size_t size);

#endif
