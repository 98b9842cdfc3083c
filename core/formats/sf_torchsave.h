/*
 * sf_torchsave.h - the tensors in a torch.save archive, found without
 * running torch.
 *
 * torch.save writes a zip (sf_zip.h) holding PREFIX/data.pkl, a pickle
 * (sf_pickle.h) whose tensors are calls of torch._utils._rebuild_tensor_v2
 * (storage, storage_offset, size, stride, ...) with the storage a
 * persistent id ('storage', torch.<Type>Storage, KEY, location, numel),
 * or, for the types torch 2.x has no typed storage for (float8, uint16,
 * uint32, uint64), of _rebuild_tensor_v3(storage, storage_offset, size,
 * stride, requires_grad, hooks, torch.<dtype>[, metadata]) with the storage
 * ('storage', torch.storage.UntypedStorage, KEY, location, nbytes), and
 * one entry PREFIX/data/KEY per storage holding its raw bytes
 * (little-endian, as the machines these checkpoints come from write). This
 * reader finds data.pkl as torch does (in the folder of the archive's
 * first entry; a second data.pkl fails the archive) and decodes it with
 * only those names allowed, and gives, for
 * each tensor, where its storage lies in the input and how the tensor
 * views it: enough to serve the tensor's bytes in place.
 *
 * The archive's root object may be one tensor (what DCP's writer saves
 * per chunk) or a dict (an OrderedDict too) of string keys to tensors (a
 * Hugging Face pytorch_model.bin); in a dict, values that are not tensors
 * are skipped and counted.
 *
 * Untrusted input: every storage and view is checked (dtype known, the
 * view's elements inside its storage, sizes overflow-checked; a storage
 * named as two types fails: torch loads a storage once, as the type it
 * meets first, and views it as that); anything
 * else is -SF_EFORMAT, a name outside the allowlist -SF_EREFUSED, with a
 * one-line reason.
 *
 * Ownership: struct sf_torchsave owns its tensors and their keys, valid
 * until sf_torchsave_free().
 */
#ifndef SF_TORCHSAVE_H
#define SF_TORCHSAVE_H

#include <stddef.h>
#include <stdint.h>

#include "sf_box.h"
#include "sf_dtype.h"
#include "sf_io.h"

struct sf_ts_tensor {
	char *key;               /* "" for a root tensor, else its dict key */
	enum sf_dtype dtype;
	unsigned ndim;           /* <= SF_MAX_NDIM */
	uint64_t shape[SF_MAX_NDIM];
	uint64_t stride[SF_MAX_NDIM]; /* in elements */
	uint64_t storage_offset; /* in elements */
	enum sf_dtype storage_dtype; /* the type its storage is pickled as
				  * (U8 for an UntypedStorage); one per
				  * storage, as torch loads it once */
	uint64_t data_off;       /* the storage's first byte, in the input */
	uint64_t storage_bytes;  /* the storage entry's size */
	uint64_t span;           /* bytes of the storage the view reaches,
				  * from storage_offset (0 when empty) */
	int contiguous;          /* row-major contiguous (strides as a
				  * fresh tensor's); 1 or 0 */
};

struct sf_torchsave {
	struct sf_ts_tensor *t;
	size_t n;
	size_t skipped;          /* non-tensor values in a root dict */
};

/*
 * Read the torch.save archive that fills in. 0 and *out (free with
 * sf_torchsave_free), or -SF_EFORMAT, -SF_EREFUSED, -SF_ETOOBIG, -ENOMEM,
 * -EIO with a one-line reason in err.
 */
int sf_torchsave_open(const struct sf_input *in, struct sf_torchsave **out,
		      char *err, size_t errlen);
void sf_torchsave_free(struct sf_torchsave *ts); /* accepts NULL */

/*
 * An archive whose pickle the caller walks itself (DeepSpeed's nested
 * dicts): the archive that fills in, its data.pkl decoded with the names
 * a tensor needs plus extra[0..nextra) (at most 64; borrowed for the
 * call), charged to budget b (may be NULL). 0 and *out (free with
 * sf_ts_doc_free; it borrows in), or as sf_torchsave_open.
 */
struct sf_ts_doc;
struct sf_pk;
struct sf_pk_global;
struct sf_budget;
int sf_ts_doc_open(const struct sf_input *in, const struct sf_pk_global *extra,
		   size_t nextra, struct sf_budget *b, struct sf_ts_doc **out,
		   char *err, size_t errlen);
/* The pickle's root value. Borrowed from d. */
const struct sf_pk *sf_ts_doc_root(const struct sf_ts_doc *d);
/* Node v of d's pickle as a tensor into *t (t->key is key, borrowed, for
 * messages): 0; 1 when v is no tensor call; or -SF_EFORMAT with the
 * reason in err (a storage or view that does not check). A storage is
 * not checked against other views of it (sf_torchsave_open does that). */
int sf_ts_doc_tensor(struct sf_ts_doc *d, const struct sf_pk *v,
		     const char *key, struct sf_ts_tensor *t, char *err,
		     size_t errlen);
void sf_ts_doc_free(struct sf_ts_doc *d); /* accepts NULL */

/* For sf_budget_decode (sf_budget.h): reads a decoded stream as a
 * torch.save archive; its note is the struct sf_torchsave (owned by the
 * budget); -EIO from the archive in memory is -SF_EFORMAT. */
struct sf_stream_reader;
extern const struct sf_stream_reader sf_torchsave_reader;

/* The dtype of a storage class name such as "FloatStorage", or
 * SF_DT_INVALID. */
enum sf_dtype sf_torch_storage_dtype(const char *name);
/* The dtype of a torch dtype attribute name such as "float32", "half",
 * "bfloat16", or SF_DT_INVALID. */
enum sf_dtype sf_torch_dtype(const char *name);

#endif
