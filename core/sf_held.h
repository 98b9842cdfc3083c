/*
 * sf_held.h - objects whose bytes a checkpoint's open made and holds in
 * memory (objects/NAME), for the values that lie inside a framework's
 * file with no byte range of their own (DeepSpeed's step counts and
 * config inside each archive's one pickle, re-written as torch.save
 * archives: sf_pickle_write.h). No model entry: the engine never reads
 * them, manifest.json does not list them; the mount serves them as
 * stored here, read-only.
 *
 * Ownership: an array of them and each name and data is owned by whoever
 * holds the array (struct sf_format_result, then struct sf_ckpt), freed
 * with sf_held_free.
 */
#ifndef SF_HELD_H
#define SF_HELD_H

#include <stddef.h>
#include <stdlib.h>

struct sf_held {
	char *name;             /* '/'-separated, checked as an object's */
	unsigned char *data;    /* the bytes served */
	size_t len;
};

static inline void sf_held_free(struct sf_held *h, size_t n)
{
	for (size_t i = 0; h && i < n; i++) {
		free(h[i].name);
		free(h[i].data);
	}
	free(h);
}

#endif
