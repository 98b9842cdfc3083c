/*
 * sf_zip.h - a reader of the zip archives checkpoints are made of.
 *
 * torch.save writes a zip (stored entries, no compression, ZIP64 end
 * records, local headers with data descriptors and zero sizes), and a DCP
 * .distcp file holds such archives back to back. This reader opens one
 * archive that fills an input (a file, or a region of one), reads its
 * central directory (ZIP64 too), and says where each entry's bytes lie,
 * so a format can serve stored entries in place without copying.
 *
 * Offsets in the archive are relative to the start of the input. Sizes
 * and offsets come from the central directory (local headers may hold
 * zeros); each entry's local header is checked (signature, the same name)
 * and its data must lie inside the input, before the central directory.
 * No two entries may have the same name, compared with ASCII letters
 * folded to lower case (torch's reader, miniz, looks names up so; Python's
 * zipfile takes the last of a repeated name): readers disagree on which
 * entry a repeated name means, so such an archive fails whole.
 * The central directory must end exactly where the ZIP64 end record (or,
 * without one, the end record) begins, and a ZIP64 end record exactly at
 * its locator: archives back to back opened whole fail instead of being
 * read as the last one at the wrong offsets.
 *
 * Untrusted input: the entry count, name lengths and the central
 * directory's size are capped (struct sf_zip_opts); anything malformed
 * fails with -SF_EFORMAT and a one-line reason, never reads outside the
 * input. Compressed entries are listed (method != 0) but sf_zip_entry_input
 * refuses them (-SF_EFORMAT): checkpoints store their data uncompressed.
 *
 * Ownership: sf_zip_open() returns an archive that owns its entries;
 * entry pointers and names stay valid until sf_zip_close(). The input (and
 * its descriptor or buffer) is borrowed and must outlive the archive.
 */
#ifndef SF_ZIP_H
#define SF_ZIP_H

#include <stddef.h>
#include <stdint.h>

#include "sf_io.h"

struct sf_zip_entry {
	const char *name;     /* NUL-terminated; may hold any bytes but NUL */
	uint16_t method;      /* 0 stored, 8 deflate, ... */
	uint32_t crc32;       /* as recorded (not checked) */
	uint64_t csize;       /* bytes stored in the archive */
	uint64_t size;        /* bytes after decompression */
	uint64_t header_off;  /* local header, from the input's start */
	uint64_t data_off;    /* stored data, from the input's start */
};

struct sf_zip_opts {
	uint32_t max_entries;   /* default 1 << 20 */
	uint64_t max_cd_bytes;  /* central directory (default 256 MiB) */
};

struct sf_zip;

/* Open the archive that fills in (its end record ends at, or a comment
 * before, in's end). opts may be NULL. 0 and *out (close with
 * sf_zip_close), or -SF_EFORMAT, -SF_ETOOBIG, -ENOMEM, -EIO with a
 * one-line reason in err. */
int sf_zip_open(const struct sf_input *in, const struct sf_zip_opts *opts,
		struct sf_zip **out, char *err, size_t errlen);
void sf_zip_close(struct sf_zip *z); /* accepts NULL */

/* The entries, in central directory order. Borrowed from z. */
size_t sf_zip_count(const struct sf_zip *z);
const struct sf_zip_entry *sf_zip_get(const struct sf_zip *z, size_t i);
/* The entry named exactly name (bytes, case and all), or NULL; a binary
 * search over the names sorted at open (unique, checked there). */
const struct sf_zip_entry *sf_zip_find(const struct sf_zip *z,
				       const char *name);

/* The stored bytes of entry e as an input of their own (a sub-range of
 * the archive's input). 0, or -SF_EFORMAT for a compressed entry or one
 * whose csize != size. */
int sf_zip_entry_input(const struct sf_zip *z, const struct sf_zip_entry *e,
		       struct sf_input *out);

#endif
