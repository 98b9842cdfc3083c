/*
 * fuzz_pickle.c - libFuzzer target for the restricted pickle reader
 * (core/formats/sf_pickle.c, sf_pickle_load).
 *
 * Input: the pickle, read from memory, with small caps (so deep and wide
 * graphs hit them quickly) and an allowlist of the globals torch, numpy
 * and DCP checkpoints name (so the OBJ/BUILD/SETITEMS paths are reached).
 * Seeds: DCP .metadata files torch 1.13 and 2.15 wrote, and the pickles
 * of test/corpus/pickle (valid-*, invalid-*).
 * For any input, sf_pickle_load either
 *   - fails with -SF_EFORMAT, -SF_EREFUSED, -SF_ETOOBIG or -ENOMEM, no
 *     document, and a non-empty one-line message; or
 *   - returns a document for which everything sf_pickle.h promises holds,
 *     checked on every node reachable from the root (each visited once,
 *     however the memo shares and cycles them): the end lies inside the
 *     input; STRs are NUL-terminated valid UTF-8 of their length; BYTES
 *     lie inside the input, with a copy exactly when len <=
 *     SF_PK_BYTES_COPY, equal to the input's bytes at the span
 *     sf_pk_bytes_span gives (or, for a protocol-0 STRING with escapes,
 *     flagged escaped, no span, its text quoted in the input); sequences and dicts
 *     have their arrays; GLOBALs are on the allowlist; OBJs have a
 *     callable, a TUPLE of args, kwargs a DICT or NULL, items a DICT,
 *     elems a LIST; the node count is within max_nodes; and every
 *     accessor answers on every node without crashing;
 *   - and the writer (sf_pickle_write.c) writes the root back within its
 *     cap, to a pickle the reader decodes to a value that writes the same
 *     bytes again, or fails with -ENOTSUP, -SF_ETOOBIG or -ENOMEM and a
 *     message.
 * Any violation aborts. The input is not NUL-terminated, so an over-read
 * shows under ASan.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "sf_error.h"
#include "sf_io.h"
#include "sf_pickle.h"
#include "sf_pickle_write.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

const char fuzz_target[] = "fuzz_pickle";

static const struct sf_pk_global allow[] = {
	{"collections", "OrderedDict"},
	{"torch._utils", "_rebuild_tensor_v2"},
	/* torch 2.x's float8 and uint16/32/64 tensors (issue 30) */
	{"torch._utils", "_rebuild_tensor_v3"},
	{"torch.storage", "UntypedStorage"},
	{"torch", "float8_e4m3fn"},
	{"torch", "uint16"},
	{"torch", "FloatStorage"},
	{"torch", "BFloat16Storage"},
	{"torch", "Size"},
	{"torch", "float32"},
	{"torch", "bfloat16"},
	{"torch", "int64"},
	{"torch.serialization", "_get_layout"},
	{"builtins", "getattr"},
	{"builtins", "bytearray"},
	{"builtins", "set"},
	{"__builtin__", "set"},
	{"__builtin__", "bytes"},
	{"__builtin__", "bytearray"},
	{"__builtin__", "frozenset"},
	{"__builtin__", "object"},
	{"_codecs", "encode"},
	{"copyreg", "_reconstructor"},
	{"numpy", "ndarray"},
	{"numpy", "dtype"},
	{"numpy.core.multiarray", "_reconstruct"},
	{"numpy.core.numeric", "_frombuffer"},
	{"torch.distributed._shard.checkpoint.metadata", "Metadata"},
	{"torch.distributed._shard.checkpoint.metadata", "TensorStorageMetadata"},
	{"torch.distributed._shard.checkpoint.metadata", "ChunkStorageMetadata"},
	{"torch.distributed._shard.checkpoint.metadata", "BytesStorageMetadata"},
	{"torch.distributed._shard.checkpoint.metadata", "MetadataIndex"},
	{"torch.distributed._shard.checkpoint.filesystem", "_StorageInfo"},
	{"torch.distributed._shard.sharded_tensor.metadata", "TensorProperties"},
	{"torch.distributed._shard.sharded_tensor.metadata", "MEM_FORMAT_ENCODING"},
	/* DCP as torch 2.x names it (main's fuzz_pickle; its .metadata seeds) */
	{"torch.distributed.checkpoint.metadata", "Metadata"},
	{"torch.distributed.checkpoint.metadata", "TensorStorageMetadata"},
	{"torch.distributed.checkpoint.metadata", "ChunkStorageMetadata"},
	{"torch.distributed.checkpoint.metadata", "MetadataIndex"},
	{"torch.distributed.checkpoint.metadata", "TensorProperties"},
	{"torch.distributed.checkpoint.metadata", "BytesStorageMetadata"},
	{"torch.distributed.checkpoint.filesystem", "_StorageInfo"},
	/* numpy 2's module names (paddle's .distcp pickles) */
	{"numpy._core.multiarray", "_reconstruct"},
	{"__main__", "Point"},
	{"__main__", "Slotted"},
	{"__main__", "Tagged"},
};
#define NALLOW (sizeof(allow) / sizeof(allow[0]))

#define MAX_NODES (1u << 16)

/* A set of visited node pointers (open addressing, grows). */
struct seen {
	const struct sf_pk **slot;
	size_t cap, n;
};

static bool seen_add(struct seen *s, const struct sf_pk *v)
{
	if ((s->n + 1) * 2 > s->cap) {
		struct seen t = {.cap = s->cap ? s->cap * 2 : 1024};
		t.slot = calloc(t.cap, sizeof(*t.slot));
		if (!t.slot)
			abort();
		for (size_t i = 0; i < s->cap; i++)
			if (s->slot[i])
				seen_add(&t, s->slot[i]);
		free(s->slot);
		*s = t;
	}
	size_t h = ((uintptr_t)v >> 4) * 0x9e3779b97f4a7c15ull;
	for (size_t i = h & (s->cap - 1);; i = (i + 1) & (s->cap - 1)) {
		if (s->slot[i] == v)
			return false;
		if (!s->slot[i]) {
			s->slot[i] = v;
			s->n++;
			return true;
		}
	}
}

static bool utf8_ok(const unsigned char *s, size_t n)
{
	for (size_t i = 0; i < n;) {
		unsigned c = s[i], k, cp, min;
		if (c < 0x80) {
			i++;
			continue;
		}
		if (c >= 0xc2 && c <= 0xdf) {
			k = 1; cp = c & 0x1f; min = 0x80;
		} else if (c >= 0xe0 && c <= 0xef) {
			k = 2; cp = c & 0x0f; min = 0x800;
		} else if (c >= 0xf0 && c <= 0xf4) {
			k = 3; cp = c & 0x07; min = 0x10000;
		} else {
			return false;
		}
		if (n - i <= k)
			return false;
		for (unsigned j = 1; j <= k; j++) {
			if ((s[i + j] & 0xc0) != 0x80)
				return false;
			cp = (cp << 6) | (s[i + j] & 0x3f);
		}
		if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
			return false;
		i += k + 1;
	}
	return true;
}

static bool allowed(const char *m, const char *n)
{
	for (size_t i = 0; i < NALLOW; i++)
		if (!strcmp(allow[i].module, m) && !strcmp(allow[i].name, n))
			return true;
	return false;
}

/* Node invariants; pushes its children onto *todo. */
static void check_node(const struct sf_pk *v, const uint8_t *data, size_t size,
		       const struct sf_pk ***todo, size_t *ntodo, size_t *tcap)
{
#define PUSH(x)                                                          \
	do {                                                             \
		if (!(x))                                                \
			fuzz_die("NULL child", NULL);                    \
		if (*ntodo == *tcap) {                                   \
			*tcap = *tcap ? *tcap * 2 : 256;                 \
			*todo = realloc(*todo, *tcap * sizeof(**todo));  \
			if (!*todo)                                      \
				abort();                                 \
		}                                                        \
		(*todo)[(*ntodo)++] = (x);                               \
	} while (0)
	int64_t i64;

	/* Accessors never crash, whatever the kind. */
	(void)sf_pk_get(v, "a");
	(void)sf_pk_attr(v, "a");
	(void)sf_pk_item(v, 0);
	(void)sf_pk_is_obj(v, "torch", "Size");
	(void)sf_pk_is_global(v, "torch", "Size");
	if (sf_pk_int(v, &i64) != (v->kind == SF_PK_INT || v->kind == SF_PK_BOOL))
		fuzz_die("sf_pk_int on the wrong kind", NULL);
	if (sf_pk_str(v) && v->kind != SF_PK_STR)
		fuzz_die("sf_pk_str on the wrong kind", NULL);

	switch (v->kind) {
	case SF_PK_NONE:
	case SF_PK_BOOL:
	case SF_PK_INT:
	case SF_PK_FLOAT:
		break;
	case SF_PK_STR:
		if (!v->u.str.s || v->u.str.s[v->u.str.len] != 0 ||
		    !utf8_ok((const unsigned char *)v->u.str.s, v->u.str.len))
			fuzz_die("bad STR", NULL);
		if (sf_pk_str(v) && strlen(sf_pk_str(v)) != v->u.str.len)
			fuzz_die("sf_pk_str of a STR with a NUL", NULL);
		break;
	case SF_PK_BYTES: {
		uint64_t off = v->u.bytes.off, len = v->u.bytes.len, so, sl;
		if (off > size || len > size - off)
			fuzz_die("BYTES outside the input", NULL);
		if ((len <= SF_PK_BYTES_COPY) != (v->u.bytes.data != NULL))
			fuzz_die("BYTES copy rule broken", NULL);
		/* An escaped protocol-0 STRING decodes to other bytes: its
		 * text starts with a quote just before off, and it has no
		 * span to serve from (issue 30); every other BYTES value is
		 * the input's bytes at its span. */
		if (v->u.bytes.escaped) {
			if (!v->u.bytes.data || off == 0 ||
			    (data[off - 1] != '\'' && data[off - 1] != '"'))
				fuzz_die("escaped BYTES that is no quoted STRING", NULL);
			if (sf_pk_bytes_span(v, &so, &sl))
				fuzz_die("a span for an escaped STRING", NULL);
		} else {
			if (!sf_pk_bytes_span(v, &so, &sl) || so != off || sl != len)
				fuzz_die("BYTES span is not its (off, len)", NULL);
			if (v->u.bytes.data && memcmp(v->u.bytes.data, data + off, len))
				fuzz_die("BYTES copy differs from the input", NULL);
		}
		break;
	}
	case SF_PK_TUPLE:
	case SF_PK_LIST:
		if (v->u.seq.n && !v->u.seq.v)
			fuzz_die("sequence without its array", NULL);
		if (sf_pk_len(v) != v->u.seq.n)
			fuzz_die("sf_pk_len", NULL);
		for (size_t i = 0; i < v->u.seq.n; i++)
			PUSH(v->u.seq.v[i]);
		break;
	case SF_PK_DICT:
		if (v->u.dict.n && (!v->u.dict.k || !v->u.dict.v))
			fuzz_die("dict without its arrays", NULL);
		for (size_t i = 0; i < v->u.dict.n; i++) {
			if (v->u.dict.k[i]->kind == SF_PK_LIST ||
			    v->u.dict.k[i]->kind == SF_PK_DICT)
				fuzz_die("unhashable key accepted", NULL);
			PUSH(v->u.dict.k[i]);
			PUSH(v->u.dict.v[i]);
		}
		break;
	case SF_PK_GLOBAL:
		if (!allowed(v->u.global.module, v->u.global.name))
			fuzz_die("global not on the allowlist", v->u.global.module);
		break;
	case SF_PK_OBJ:
		PUSH(v->u.obj.callable);
		PUSH(v->u.obj.args);
		if (v->u.obj.args->kind != SF_PK_TUPLE)
			fuzz_die("OBJ args not a tuple", NULL);
		if (v->u.obj.kwargs) {
			if (v->u.obj.kwargs->kind != SF_PK_DICT || !v->u.obj.newobj)
				fuzz_die("bad kwargs", NULL);
			PUSH(v->u.obj.kwargs);
		}
		if (v->u.obj.state)
			PUSH(v->u.obj.state);
		if (v->u.obj.items) {
			if (v->u.obj.items->kind != SF_PK_DICT)
				fuzz_die("OBJ items not a dict", NULL);
			PUSH(v->u.obj.items);
		}
		if (v->u.obj.elems) {
			if (v->u.obj.elems->kind != SF_PK_LIST)
				fuzz_die("OBJ elems not a list", NULL);
			PUSH(v->u.obj.elems);
		}
		break;
	case SF_PK_PERSID:
		PUSH(v->u.persid);
		break;
	default:
		fuzz_die("unknown kind", NULL);
	}
#undef PUSH
}

/* The writer (sf_pickle_write.h) on the decoded value: it writes a
 * pickle (within the cap) that the reader decodes to a value writing the
 * same bytes again, or fails with a documented code and a message. */
static void write_back(const struct sf_pk *root, const struct sf_pickle_opts *o)
{
	unsigned char *a = (unsigned char *)&a, *b = NULL;
	size_t alen = 0, blen = 0;
	struct sf_pickle *q = NULL;
	struct sf_input in;
	char err[256];
	int rc;

	fuzz_poison(err, sizeof(err));
	rc = sf_pkw_pickle(root, allow, NALLOW, 64u << 10, &a, &alen, err,
			   sizeof(err));
	if (rc) {
		if (a)
			fuzz_die("a failed write returned bytes", err);
		if (rc != -ENOTSUP && rc != -SF_ETOOBIG && rc != -ENOMEM)
			fuzz_die("write: undocumented error", sf_strerror(rc));
		if (rc != -ENOMEM)
			fuzz_check_message(err, sizeof(err));
		return;
	}
	if (alen > (64u << 10))
		fuzz_die("write past its cap", NULL);
	in = sf_input_mem(a, alen);
	rc = sf_pickle_load(&in, o, &q, err, sizeof(err));
	if (rc == -ENOMEM || rc == -SF_ETOOBIG) { /* the copy has no memo */
		free(a);
		return;
	}
	if (rc)
		fuzz_die("what the writer wrote does not read back", err);
	rc = sf_pkw_pickle(sf_pickle_root(q), allow, NALLOW, 64u << 10, &b,
			   &blen, err, sizeof(err));
	if (rc == 0 && (alen != blen || memcmp(a, b, alen) != 0))
		fuzz_die("written, read and written again: other bytes", NULL);
	if (rc && rc != -ENOMEM)
		fuzz_die("what was written once cannot be written again", err);
	free(b);
	sf_pickle_free(q);
	free(a);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct sf_pickle_opts o = {
		.allow = allow, .nallow = NALLOW, .max_nodes = MAX_NODES,
		.max_bytes = 16u << 20, .max_depth = 512, .max_memo = 1u << 12,
	};
	struct sf_input in = sf_input_mem(data, size);
	struct sf_pickle *p = (struct sf_pickle *)&p; /* not NULL */
	char err[512];
	int rc;

	fuzz_poison(err, sizeof(err));
	rc = sf_pickle_load(&in, &o, &p, err, sizeof(err));
	if (rc < 0) {
		if (p)
			fuzz_die("failed load returned a document", err);
		if (rc == -ENOMEM)
			return 0;
		if (rc != -SF_EFORMAT && rc != -SF_EREFUSED && rc != -SF_ETOOBIG)
			fuzz_die("undocumented error", sf_strerror(rc));
		fuzz_check_message(err, sizeof(err));
		for (const char *c = err; *c; c++)
			if ((unsigned char)*c < 0x20 || (unsigned char)*c >= 0x7f)
				fuzz_die("unprintable byte in the message", err);
		return 0;
	}
	if (rc != 0 || !p || !sf_pickle_root(p))
		fuzz_die("load returned neither an error nor a document", NULL);
	if (sf_pickle_end(p) == 0 || sf_pickle_end(p) > size ||
	    data[sf_pickle_end(p) - 1] != '.')
		fuzz_die("end is not just past a STOP", NULL);

	struct seen seen = {0};
	const struct sf_pk **todo = NULL;
	size_t ntodo = 0, tcap = 0;
	check_node(sf_pickle_root(p), data, size, &todo, &ntodo, &tcap);
	seen_add(&seen, sf_pickle_root(p));
	while (ntodo) {
		const struct sf_pk *v = todo[--ntodo];
		if (!seen_add(&seen, v))
			continue;
		check_node(v, data, size, &todo, &ntodo, &tcap);
	}
	if (seen.n > MAX_NODES)
		fuzz_die("more nodes than max_nodes", NULL);
	free(todo);
	free(seen.slot);
	write_back(sf_pickle_root(p), &o);
	sf_pickle_free(p);
	return 0;
}
