/*
 * sf_pickle_write.h - a decoded pickle value (sf_pk.h) written back as a
 * pickle, and wrapped as a torch.save archive that torch.load reads to
 * the value that was decoded (see sf_pickle_write.c for the opcodes).
 *
 * What it cannot write exactly it refuses, with a one-line reason: a
 * persistent id or a call that rebuilds a tensor (-ENOTSUP: tensors are
 * not written), a global outside the
 * caller's allowlist (-SF_EREFUSED), a BYTES value whose bytes the reader
 * did not copy (-ENOTSUP), a value nested deeper than SF_PKW_MAX_DEPTH (a
 * cycle the memo made among them) or output past the caller's cap
 * (-SF_ETOOBIG). Shared nodes are written once per reference: equal
 * values, not one object (pickle's memo identity is not kept).
 *
 * Ownership: *out is the caller's (free()); the value and the allowlist
 * are borrowed for the call.
 */
#ifndef SF_PICKLE_WRITE_H
#define SF_PICKLE_WRITE_H

#include <stddef.h>

#include "sf_pk.h"

#define SF_PKW_MAX_DEPTH 64u

/*
 * v as a protocol-2 pickle (PROTO 2 ... STOP; BINBYTES, a protocol-3
 * opcode, for a BYTES value; NEWOBJ_EX, protocol 4, for a call that had
 * keyword arguments), at most cap bytes. 0 and *out, *outlen, or a
 * negative error (above, and -ENOMEM) with *out NULL.
 */
int sf_pkw_pickle(const struct sf_pk *v, const struct sf_pk_global *allow,
		  size_t nallow, size_t cap, unsigned char **out,
		  size_t *outlen, char *err, size_t errlen);

/*
 * v as a torch.save archive: a zip of stored (uncompressed) entries
 * ARCHIVE/data.pkl (sf_pkw_pickle), ARCHIVE/byteorder ("little") and
 * ARCHIVE/version ("3\n") with archive as ARCHIVE (one plain name, at
 * most 64 bytes), at most cap bytes in all. As sf_pkw_pickle.
 */
int sf_pkw_torch_save(const struct sf_pk *v, const struct sf_pk_global *allow,
		      size_t nallow, const char *archive, size_t cap,
		      unsigned char **out, size_t *outlen, char *err,
		      size_t errlen);

#endif
