/*
 * sf_gpu.h - load files, byte ranges of files, or the tensors of a
 * safetensors file into CUDA device memory.
 *
 * A loader is bound to one device. A load splits its ranges into chunks of
 * at most one staging buffer, reads the chunks with pread() from a small
 * pool of reader threads into a ring of pinned host staging buffers, and
 * copies each filled buffer to the device with cudaMemcpyAsync on the
 * buffer's own stream; an event per buffer says when it may be refilled.
 * So file reads of later chunks overlap the host-to-device copies of earlier
 * ones, with at most `depth` chunks in flight.
 *
 * Ownership: everything a loader hands out (sf_gpu_tensor records, their
 * names, and the device pointers in them) is owned by the loader and stays
 * valid until sf_gpu_loader_destroy(), which frees the device memory. Loads
 * only append results; a failed load appends nothing and frees what it
 * allocated.
 *
 * Errors follow sf_error.h: 0 or a count on success, else a negative errno
 * or -SF_E*. A failing CUDA call gives -SF_ECUDA, and sf_gpu_last_error()
 * then holds "CALL: cuda error string" (also for other failures it holds a
 * one-line reason). Built without CUDA (the stub library), every entry point
 * returns -SF_ENOCUDA and the message says shardfs was built without CUDA.
 *
 * The direct path (issue 29, 2; off with opts.no_direct): a whole file
 * that is a tensor file of a shardfs mount (tensors/NAME), and each tensor
 * of a safetensors file beside a tensors/ directory (the mount's
 * model.safetensors), is planned from the mount's user.shardfs.where:
 * what the mount offers is read straight from this node's store files,
 * opened with the caller's own rights, and every block's XXH3 is checked
 * before the bytes are copied to the device; everything else (not
 * offered, a denied open, a changed file, a failed check) is read through
 * the file named, i.e. the mount, which verifies it too. Other files and
 * partial ranges are read as named. The stats count the bytes each way.
 *
 * A loader is not thread-safe: one load at a time per loader.
 */
#ifndef SF_GPU_H
#define SF_GPU_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sf_box.h"
#include "sf_dtype.h"

#define SF_GPU_DEFAULT_STAGING (8u << 20) /* bytes per staging buffer */
#define SF_GPU_MAX_STAGING (1u << 30)
#define SF_GPU_DEFAULT_DEPTH 4u           /* staging buffers in flight */
#define SF_GPU_MAX_DEPTH 64u
#define SF_GPU_MAX_READERS 32u
#define SF_GPU_MAX_RANGES (1u << 20)      /* ranges or tensors per load */
#define SF_GPU_ERRLEN 256                 /* bytes of sf_gpu_last_error() */

struct sf_gpu_opts {
	int device;             /* CUDA device ordinal, >= 0 */
	size_t staging_bytes;   /* per staging buffer; 0: default; <= MAX */
	unsigned depth;         /* staging buffers; 0: default; <= MAX_DEPTH */
	unsigned readers;       /* reader threads; 0: = depth; <= MAX_READERS */
	bool no_direct;         /* never the direct path (see below) */
};

/* How a load allocates device memory. */
enum sf_gpu_alloc {
	SF_GPU_PER_FILE = 0,    /* one cudaMalloc per file, results inside it */
	SF_GPU_PER_TENSOR = 1,  /* one cudaMalloc per tensor or range */
};

/* One range to load. length SF_GPU_TO_EOF means "to the end of the file". */
#define SF_GPU_TO_EOF UINT64_MAX
struct sf_gpu_range {
	const char *path;       /* borrowed for the call */
	uint64_t offset;        /* bytes */
	uint64_t length;        /* bytes, or SF_GPU_TO_EOF */
	const char *name;       /* result name (copied); NULL: "PATH@OFF+LEN" */
};

/* One loaded result. Owned by the loader (see above). */
struct sf_gpu_tensor {
	const char *name;       /* tensor name, or the range's name */
	enum sf_dtype dtype;    /* SF_DT_U8 for raw ranges and whole files */
	unsigned ndim;
	uint64_t shape[SF_MAX_NDIM];
	void *dev;              /* device pointer to nbytes bytes */
	uint64_t nbytes;
	const char *path;       /* where the bytes came from (for verify) */
	uint64_t file_offset;
};

/* Stats of one load (or read-only pass). */
struct sf_gpu_stats {
	uint64_t bytes;         /* bytes read and copied */
	uint64_t chunks;        /* staging-buffer-sized pieces */
	double read_busy_s;     /* summed over reader threads: time in pread */
	double total_s;         /* wall clock of the whole call */
	uint64_t direct_bytes;  /* read from store files and checked here */
	uint64_t mount_bytes;   /* read through the file named (the mount) */
	uint64_t rereads;       /* direct chunks read again through the mount
				 * after a failed read or checksum */
};

struct sf_gpu_loader;

/*
 * Open device opts->device (NULL opts: defaults on device 0), allocate the
 * staging ring and start the reader threads. On failure returns -SF_ECUDA
 * (no device: err says "no CUDA device: <cuda error string>"), -SF_ENOCUDA,
 * -EINVAL or -ENOMEM, with a one-line reason in err (may be NULL).
 */
int sf_gpu_loader_create(const struct sf_gpu_opts *opts,
			 struct sf_gpu_loader **out, char *err, size_t errlen);
/* Join the readers, free device memory and staging. Accepts NULL. */
void sf_gpu_loader_destroy(struct sf_gpu_loader *l);

/* The reason for the last failure on l (static text for NULL l). Never NULL;
 * valid until the next call on l. */
const char *sf_gpu_last_error(const struct sf_gpu_loader *l);

/* Load n ranges. PER_FILE packs consecutive ranges of the same path into
 * one allocation (each result 256-byte aligned in it). Returns the number
 * of results appended. */
int sf_gpu_load_ranges(struct sf_gpu_loader *l, const struct sf_gpu_range *r,
		       size_t n, enum sf_gpu_alloc alloc,
		       struct sf_gpu_stats *st);
/* Load one whole file as one U8 result named after the path. */
int sf_gpu_load_file(struct sf_gpu_loader *l, const char *path,
		     struct sf_gpu_stats *st);
/* Parse a safetensors file's header (bounded by SF_MAX_ST_HEADER, fully
 * validated) and load each tensor as a result with its name, dtype and
 * shape. PER_FILE: one allocation for the data section. */
int sf_gpu_load_safetensors(struct sf_gpu_loader *l, const char *path,
			    enum sf_gpu_alloc alloc, struct sf_gpu_stats *st);

/* The same reads as sf_gpu_load_ranges() through the same pipeline, but
 * without device copies: the baseline of "file reads alone". */
int sf_gpu_read_only(struct sf_gpu_loader *l, const struct sf_gpu_range *r,
		     size_t n, struct sf_gpu_stats *st);

/* Results so far, in load order. Borrowed (see Ownership). */
size_t sf_gpu_count(const struct sf_gpu_loader *l);
const struct sf_gpu_tensor *sf_gpu_get(const struct sf_gpu_loader *l,
				       size_t i);

/* Copy t's device bytes back and compare with t->path at t->file_offset.
 * 0 when equal; -EBADMSG on a difference (*first_diff, may be NULL, gets
 * its byte index in t); other negatives on errors. */
int sf_gpu_verify(struct sf_gpu_loader *l, const struct sf_gpu_tensor *t,
		  uint64_t *first_diff);

#endif
