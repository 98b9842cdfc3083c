/*
 * sf_pickle_dec.h - internal to the pickle reader (sf_pickle_dec.c,
 * sf_pickle_scalar.c, sf_pickle.c; each calls only the ones before it):
 * the decoder's state and the helpers the three files share. Not for
 * other modules; the interface is sf_pickle.h.
 */
#ifndef SF_PICKLE_DEC_H
#define SF_PICKLE_DEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sf_io.h"
#include "sf_pk.h"

#define PK_WINDOW (64u << 10)     /* read window, bytes */
#define PK_LINE_MAX (64u << 10)   /* a text argument line, bytes */
#define PK_BLOCK 1024             /* nodes per allocation block, at most */
#define PK_BLOCK_FIRST 64         /* nodes of the first block; each next
				   * doubles, up to PK_BLOCK */

/* Nodes in block b (so a small document allocates little). */
static inline size_t pk_block_cap(size_t b)
{
	return b >= 4 ? PK_BLOCK : (size_t)PK_BLOCK_FIRST << b;
}
#define PK_LONG_MAX 64            /* LONG1/LONG4 bytes examined at most */

#define PK_DEF_NODES (1ull << 22)
#define PK_DEF_BYTES (256ull << 20)
#define PK_DEF_DEPTH 4096u
#define PK_DEF_MEMO (1u << 22)

/* Flags of a node that the public struct does not carry. */
enum {
	PKF_SET = 1,    /* a LIST made by EMPTY_SET: ADDITEMS only */
	PKF_FROZEN = 2, /* a LIST made by FROZENSET: never changes */
};

/* A node and its bookkeeping; the public node is its first member. */
struct pk_node {
	struct sf_pk pk;
	size_t cap;       /* slots of seq.v, or of dict.k */
	size_t cap2;      /* slots of dict.v */
	unsigned flags;   /* PKF_* */
};

struct sf_pickle {
	struct pk_node **blocks; /* block b holds pk_block_cap(b) nodes, owned */
	size_t nblocks, blocks_cap;
	size_t used;             /* nodes used in the last block */
	uint64_t nodes;          /* nodes created (max_nodes) */
	uint64_t bytes;          /* bytes allocated (max_bytes) */
	struct sf_pk *root;
	uint64_t end;            /* offset just past STOP */
};

/* The decoder's state for one load. */
struct pk_dec {
	const struct sf_input *in;
	struct sf_pickle *doc;
	const struct sf_pickle_opts *o;
	uint64_t pos;            /* next byte to decode */
	unsigned char *win;      /* PK_WINDOW bytes, owned */
	uint64_t win_off;        /* input offset of win[0] */
	size_t win_len;          /* valid bytes in win */
	uint64_t op_off;         /* offset of the current opcode */
	unsigned char op;        /* the current opcode */
	bool have_op;            /* op was read (else: expecting one) */

	struct sf_pk **stack;    /* values, owned array */
	size_t sn, scap;
	size_t *marks;           /* stack lengths at each MARK, owned */
	size_t mn, mcap;
	struct sf_pk **memo;     /* index -> value or NULL, owned */
	size_t memo_len, memo_cap;
	uint64_t memo_count;     /* defined entries (MEMOIZE's index) */
	char *line;              /* a text line, owned */
	size_t line_cap;
	size_t line_len;         /* without the newline */

	char *err;
	size_t errlen;
};

static inline struct pk_node *node_of(struct sf_pk *v)
{
	return (struct pk_node *)v; /* pk is the first member */
}

/* sf_pickle_dec.c: errors, the document, the input, the stack, the memo. */
/* The mnemonic of an opcode, or NULL for a byte that is none. */
const char *sf_pkd_op_name(unsigned char op);
int sf_pkd_fail(struct pk_dec *d, int rc, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
void sf_pkd_sanitize(char *out, size_t outlen, const char *s, size_t len);
int sf_pkd_charge(struct pk_dec *d, uint64_t n);
int sf_pkd_new_node(struct pk_dec *d, enum sf_pk_kind kind, struct sf_pk **out);
int sf_pkd_truncated(struct pk_dec *d);
int sf_pkd_in_error(struct pk_dec *d, int rc);
int sf_pkd_get_byte(struct pk_dec *d, unsigned char *b);
int sf_pkd_get_bytes(struct pk_dec *d, void *buf, size_t n);
int sf_pkd_skip(struct pk_dec *d, uint64_t n);
int sf_pkd_get_le(struct pk_dec *d, size_t n, uint64_t *v);
int sf_pkd_get_line(struct pk_dec *d, size_t max);
int sf_pkd_push(struct pk_dec *d, struct sf_pk *v);
int sf_pkd_pop(struct pk_dec *d, struct sf_pk **v);
int sf_pkd_top(struct pk_dec *d, struct sf_pk **v);
int sf_pkd_underflow(struct pk_dec *d);
size_t sf_pkd_fence(const struct pk_dec *d);      /* stack index of the MARK */
int sf_pkd_pop_mark(struct pk_dec *d, size_t *start);
int sf_pkd_seq_reserve(struct pk_dec *d, struct sf_pk *v, size_t want);
int sf_pkd_memo_put(struct pk_dec *d, uint64_t idx);
int sf_pkd_memo_get(struct pk_dec *d, uint64_t idx);

/* sf_pickle_scalar.c: the opcodes of scalars, strings, bytes, globals
 * and persistent ids; each reads its argument at d->pos and pushes. */
int sf_pkd_push_new(struct pk_dec *d, enum sf_pk_kind kind, struct sf_pk **out);
int sf_pkd_push_bool(struct pk_dec *d, bool b);
int sf_pkd_push_int(struct pk_dec *d, int64_t i);
int sf_pkd_push_persid(struct pk_dec *d, struct sf_pk *id);
/* [+-]?[0-9]+ into *out: 0; -1 malformed; -2 outside int64. */
int sf_pkd_parse_dec(const char *s, size_t len, int64_t *out);
int sf_pkd_op_int_text(struct pk_dec *d, bool is_long);   /* INT, LONG */
int sf_pkd_op_long_bin(struct pk_dec *d, uint64_t n);     /* LONG1, LONG4 */
int sf_pkd_op_float_text(struct pk_dec *d);
int sf_pkd_op_binfloat(struct pk_dec *d);
int sf_pkd_op_binunicode(struct pk_dec *d, uint64_t n);
int sf_pkd_op_unicode(struct pk_dec *d);
int sf_pkd_op_binbytes(struct pk_dec *d, uint64_t n);
int sf_pkd_op_string(struct pk_dec *d);
int sf_pkd_op_global(struct pk_dec *d);
int sf_pkd_op_stack_global(struct pk_dec *d);
int sf_pkd_op_persid_text(struct pk_dec *d);

#endif
