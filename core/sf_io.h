/*
 * sf_io.h - the two file reads every layer needs: an exact pread and a
 * bounded whole-file read. Used by the store, the write path, the local
 * payload source and the MPI peer layer, so a short read or a planted FIFO
 * means the same thing everywhere.
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

#endif
