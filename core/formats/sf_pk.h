/*
 * sf_pk.h - what a pickle decodes to (see sf_pickle.h for the reader and
 * its rules): the node kinds, a node, the globals a caller accepts and
 * the reader's options. Types only: the reader's machinery
 * (sf_pickle_dec.h, sf_pickle_scalar.c) and its API and accessors
 * (sf_pickle.c) both name them. Nodes are owned by the document that
 * sf_pickle_load() returns.
 */
#ifndef SF_PK_H
#define SF_PK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum sf_pk_kind {
	SF_PK_NONE,
	SF_PK_BOOL,
	SF_PK_INT,      /* fits int64 (longer LONG1/LONG4 values are refused) */
	SF_PK_FLOAT,
	SF_PK_STR,      /* unicode (BINUNICODE...), valid UTF-8 */
	SF_PK_BYTES,    /* bytes, bytearray, STRING/BINSTRING (Python 2 str) */
	SF_PK_TUPLE,
	SF_PK_LIST,     /* also sets and frozensets, in pickle order */
	SF_PK_DICT,     /* in insertion order; keys are any nodes */
	SF_PK_GLOBAL,   /* module.name, allowlisted, never resolved */
	SF_PK_OBJ,      /* callable(*args) [+ BUILD state, SETITEMS, APPENDS] */
	SF_PK_PERSID,   /* persistent id (torch: a storage reference) */
};

struct sf_pk {
	enum sf_pk_kind kind;
	union {
		bool b;                         /* BOOL */
		int64_t i;                      /* INT */
		double f;                       /* FLOAT */
		struct {                        /* STR */
			const char *s;          /* NUL-terminated; may hold
						 * NULs (protocol 0-2 bytes
						 * and numpy arrays come as
						 * latin-1 strs): len counts;
						 * sf_pk_str() refuses those */
			size_t len;
		} str;
		struct {                        /* BYTES */
			uint64_t off;           /* byte offset in the input */
			uint64_t len;
			const unsigned char *data; /* a copy when len <=
						    * SF_PK_BYTES_COPY, else NULL;
						    * the value itself (decoded)
						    * for an escaped STRING */
			bool escaped;           /* an escaped STRING: the value
						 * is data only, [off, off+len)
						 * is NOT it */
		} bytes;
		struct {                        /* TUPLE, LIST */
			struct sf_pk **v;
			size_t n;
		} seq;
		struct {                        /* DICT */
			struct sf_pk **k;
			struct sf_pk **v;
			size_t n;
		} dict;
		struct {                        /* GLOBAL */
			const char *module;
			const char *name;
		} global;
		struct {                        /* OBJ */
			struct sf_pk *callable; /* usually a GLOBAL */
			struct sf_pk *args;     /* a TUPLE (NEWOBJ_EX: args only) */
			struct sf_pk *kwargs;   /* NEWOBJ_EX's DICT, or NULL */
			struct sf_pk *state;    /* BUILD's argument, or NULL */
			struct sf_pk *items;    /* a DICT of SETITEM(S) on it, or NULL */
			struct sf_pk *elems;    /* a LIST of APPEND(S) on it, or NULL */
			bool newobj;            /* NEWOBJ(_EX) (cls.__new__), not REDUCE */
		} obj;
		struct sf_pk *persid;           /* PERSID: the id value */
	} u;
};

#define SF_PK_BYTES_COPY 4096

/* A global a caller accepts: module and name, compared exactly. */
struct sf_pk_global {
	const char *module;
	const char *name;
};

struct sf_budget;
#define SF_PK_BUDGET_EVERY 65536u

struct sf_pickle_opts {
	const struct sf_pk_global *allow; /* accepted globals (borrowed) */
	size_t nallow;
	uint64_t max_nodes;  /* values created (default 1 << 22) */
	uint64_t max_bytes;  /* bytes copied into the document: strings, short
			      * bytes, arrays (default 256 MiB) */
	uint32_t max_depth;  /* MARK and stack depth (default 4096) */
	uint32_t max_memo;   /* memo entries (default 1 << 22) */
	struct sf_budget *budget; /* the open's (sf_budget.h), checked every
			      * SF_PK_BUDGET_EVERY opcodes; NULL: none */
};

#endif
