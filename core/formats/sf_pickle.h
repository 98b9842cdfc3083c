/*
 * sf_pickle.h - a pickle reader that never executes anything.
 *
 * Decodes a Python pickle (protocols 0 to 5, the opcodes that torch,
 * numpy and paddle checkpoints use) into a graph of plain values. Names a
 * pickle refers to (GLOBAL, STACK_GLOBAL) are never imported or called:
 * each becomes an SF_PK_GLOBAL node holding its module and name, and it
 * must be on the caller's allowlist or the whole load is refused
 * (-SF_EREFUSED). Calls (REDUCE, NEWOBJ, NEWOBJ_EX) and BUILD become
 * SF_PK_OBJ nodes that record the callable, its arguments and the state
 * BUILD gave; persistent ids (BINPERSID, PERSID) become SF_PK_PERSID
 * nodes. Interpreting those (a torch.Size, a dataclass's fields) is the
 * format adapter's job, with the accessors below.
 *
 * Bytes values are not copied: a BYTES node records where its bytes lie in
 * the input (off, len), so a format can serve a numpy array stored inline
 * in a pickle straight from the file (BINBYTES, protocol 3 and later);
 * short ones are also copied (data). A protocol-0 STRING with escapes is
 * the one exception (escaped is set): its value is only in data (at most
 * SF_PK_BYTES_COPY bytes), off is where its text begins, and its bytes must
 * never be served from the input (sf_pk_bytes_span refuses it). Protocol
 * 0-2 pickles carry bytes
 * (numpy arrays among them) as latin-1 strs, so a STR may hold NULs.
 *
 * Untrusted input: every count, length and depth is capped (struct
 * sf_pickle_opts, with defaults), the memo is bounded, and a malformed or
 * truncated pickle fails with -SF_EFORMAT and a one-line reason. The memo
 * can make the graph share nodes and even form cycles (a list that
 * contains itself): code walking a graph must bound its depth.
 *
 * Ownership: sf_pickle_load() returns a document that owns every node;
 * node pointers and their strings stay valid until sf_pickle_free().
 */
#ifndef SF_PICKLE_H
#define SF_PICKLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sf_io.h"

/* The nodes (struct sf_pk) and the options (struct sf_pickle_opts):
 * sf_pk.h, below the reader's machinery (sf_pickle_dec.h) and this API. */
#include "sf_pk.h"

struct sf_pickle;

/*
 * Decode the pickle that starts at offset 0 of in and ends at its STOP
 * opcode (bytes after it are ignored). opts may be NULL (no globals
 * allowed, default caps). 0 and *out (free with sf_pickle_free), or
 * -SF_EFORMAT (malformed, truncated, an opcode not supported),
 * -SF_EREFUSED (a global not on the list: err names it), -SF_ETOOBIG (a
 * cap), -SF_EBUDGET (opts->budget spent), -ENOMEM, -EIO; a one-line
 * reason in err either way.
 */
int sf_pickle_load(const struct sf_input *in, const struct sf_pickle_opts *opts,
		   struct sf_pickle **out, char *err, size_t errlen);
void sf_pickle_free(struct sf_pickle *p); /* accepts NULL */

/* The value STOP returned. Borrowed from p. */
const struct sf_pk *sf_pickle_root(const struct sf_pickle *p);
/* The input offset just past the STOP opcode. */
uint64_t sf_pickle_end(const struct sf_pickle *p);

/* --- accessors: all accept NULL and nodes of any kind --- */

/* v is the global module.name. */
bool sf_pk_is_global(const struct sf_pk *v, const char *module,
		     const char *name);
/* v is an OBJ whose callable is the global module.name. */
bool sf_pk_is_obj(const struct sf_pk *v, const char *module, const char *name);
/* The value under string key in a DICT (or an OBJ's SETITEMS dict), or
 * NULL. The whole key must match (a key with a NUL inside matches none);
 * a key given twice answers its last value, as Python keeps. */
const struct sf_pk *sf_pk_get(const struct sf_pk *dict, const char *key);
/* An attribute of an OBJ from its BUILD state: a DICT, or the tuple
 * (dict or None, slots dict) that objects with __slots__ give (a name in
 * both answers the slot's value: Python sets slots last). NULL if
 * absent. */
const struct sf_pk *sf_pk_attr(const struct sf_pk *obj, const char *name);
/* Element i of a TUPLE or LIST, or NULL. */
const struct sf_pk *sf_pk_item(const struct sf_pk *seq, size_t i);
/* Number of elements of a TUPLE, LIST or DICT; 0 for anything else. */
size_t sf_pk_len(const struct sf_pk *v);
/* An INT (or BOOL) into *out: true, else false. */
bool sf_pk_int(const struct sf_pk *v, int64_t *out);
/*
 * v as a shape, offsets or strides: a tuple (with SF_PK_UINTS_LIST a list
 * too; with SF_PK_UINTS_SIZE also a torch.Size(...) call holding one) of
 * at most max non-negative ints (bools count as ints, as in Python), into
 * out[0..*n). false for anything else; out and *n are then unspecified.
 */
#define SF_PK_UINTS_LIST 1u
#define SF_PK_UINTS_SIZE 2u
bool sf_pk_uints(const struct sf_pk *v, unsigned flags, uint64_t *out,
		 size_t max, unsigned *n);
/* Where a BYTES value lies in the input: true and [*off, *off + *len)
 * for one whose bytes are the input's; false for anything else, an
 * escaped STRING among them (its value is only in data). What a format
 * serves from the file must come from here. */
bool sf_pk_bytes_span(const struct sf_pk *v, uint64_t *off, uint64_t *len);
/* The string of a STR, else NULL (NULL too for a STR with a NUL inside,
 * so a C string from here is the whole value). */
const char *sf_pk_str(const struct sf_pk *v);

#endif
