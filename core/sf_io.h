/*
 * sf_io.h - the file reads every layer needs: an exact pread, a bounded
 * whole-file read, and the byte source the decoders of foreign formats
 * (pickle, zip) read through. Used by the store, the write path, the local
 * payload source, the format adapters and the MPI peer layer, so a short
 * read or a planted FIFO means the same thing everywhere.
 */
#ifndef SF_IO_H
#define SF_IO_H

#include <stddef.h>
#include <stdint.h>

/* Read exactly len bytes at off (EINTR retried). 0, -SF_ESHORT at end of
 * file, -EIO on a read error. */
int sf_pread_full(int fd, void *buf, size_t len, uint64_t off);

/* Read the whole regular file path, at most max bytes, into *out
 * (malloc'd, NUL-terminated, the caller frees; *len without the NUL).
 * Opened non-blocking, so a FIFO fails (-EINVAL) instead of hanging.
 * -errno from open (-ENOENT ...), -SF_ETOOBIG over max, -EIO on a read
 * error or a file that shrank while read. */
int sf_read_file(const char *path, size_t max, char **out, size_t *len);
/* The same for an open descriptor (read from offset 0; not closed). It
 * must be a regular file (-EINVAL otherwise). */
int sf_read_fd(int fd, size_t max, char **out, size_t *len);

/*
 * A read-only byte source for decoders: a memory buffer, the region
 * [base, base+size) of an open file, or of a file read through a callback
 * (a peer daemon's copy under MPI). A plain value, copied freely; it
 * borrows the buffer, the descriptor or the callback's context, which must
 * outlive every copy. Decoders read only through sf_input_read(), so a
 * region can never be read past its end, whatever offsets the data inside
 * it claims.
 */
typedef int (*sf_input_read_fn)(void *ctx, void *buf, size_t len,
				uint64_t off); /* exactly len bytes: 0 or -err */
struct sf_input {
	const unsigned char *mem;  /* the bytes; NULL: read from fd or fn */
	int fd;                    /* with mem NULL and fn NULL */
	sf_input_read_fn fn;       /* with mem NULL: reads file offsets */
	void *ctx;                 /* fn's context (borrowed) */
	uint64_t base;             /* fd, fn: file offset of byte 0 */
	uint64_t size;             /* bytes readable: [0, size) */
};

/* The input over buf[0..len) (borrowed). */
struct sf_input sf_input_mem(const void *buf, size_t len);
/* The input over bytes [base, base+size) of fd (borrowed). */
struct sf_input sf_input_fd(int fd, uint64_t base, uint64_t size);
/* The input over bytes [base, base+size) that fn reads (ctx borrowed). */
struct sf_input sf_input_cb(sf_input_read_fn fn, void *ctx, uint64_t base,
			    uint64_t size);

/* Read exactly len bytes at off of in. 0; -SF_ESHORT when [off, off+len)
 * is not inside the input or the file is shorter than it says; -EIO on a
 * read error. */
int sf_input_read(const struct sf_input *in, void *buf, size_t len,
		  uint64_t off);

/* The sub-range [off, off+len) of in as an input of its own: 0, or
 * -SF_ESHORT when it is not inside in (overflow-checked). */
int sf_input_sub(const struct sf_input *in, uint64_t off, uint64_t len,
		 struct sf_input *out);

#endif
