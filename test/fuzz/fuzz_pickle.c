/*
 * fuzz_pickle.c - libFuzzer target for the pickle reader
 * (core/formats/sf_pickle.h), with the globals DCP metadata and torch
 * archives name on its allowlist so deep paths are reached.
 *
 * Input: a pickle (seeds: DCP .metadata files torch 1.13 and 2.15 wrote,
 * and the valid pickles of test/corpus/pickle). For any input,
 * sf_pickle_load either fails with -SF_EFORMAT, -SF_EREFUSED,
 * -SF_ETOOBIG, -SF_ESHORT or -ENOMEM (a one-line message but for -ENOMEM)
 * and no document, or gives a document whose end lies inside the input,
 * whose every reachable node (walked to a bounded depth: memo cycles) has
 * a known kind, every BYTES range inside the input and equal to its copy,
 * every STR NUL-terminated at its length, and every GLOBAL on the
 * allowlist; the accessors accept every node. Any violation aborts.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "sf_error.h"
#include "sf_io.h"
#include "sf_pickle.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

const char fuzz_target[] = "fuzz_pickle";

static const struct sf_pk_global allow[] = {
	{ "torch.distributed.checkpoint.metadata", "Metadata" },
	{ "torch.distributed.checkpoint.metadata", "TensorStorageMetadata" },
	{ "torch.distributed.checkpoint.metadata", "ChunkStorageMetadata" },
	{ "torch.distributed.checkpoint.metadata", "MetadataIndex" },
	{ "torch.distributed.checkpoint.metadata", "TensorProperties" },
	{ "torch.distributed.checkpoint.metadata", "BytesStorageMetadata" },
	{ "torch.distributed.checkpoint.filesystem", "_StorageInfo" },
	{ "torch._utils", "_rebuild_tensor_v2" },
	{ "torch", "Size" },
	{ "torch", "float32" },
	{ "torch", "FloatStorage" },
	{ "collections", "OrderedDict" },
};
#define NALLOW (sizeof(allow) / sizeof(allow[0]))

static void walk(const struct sf_pk *v, const uint8_t *data, size_t size,
		 int depth)
{
	int64_t i;

	if (!v)
		fuzz_die("NULL node", NULL);
	if (depth > 32)
		return;
	(void)sf_pk_len(v);
	(void)sf_pk_int(v, &i);
	(void)sf_pk_attr(v, "fqn");
	(void)sf_pk_get(v, "x");
	switch (v->kind) {
	case SF_PK_NONE: case SF_PK_BOOL: case SF_PK_INT: case SF_PK_FLOAT:
		break;
	case SF_PK_STR:
		if (!v->u.str.s || strlen(v->u.str.s) != v->u.str.len)
			fuzz_die("string length", NULL);
		break;
	case SF_PK_BYTES:
		if (v->u.bytes.off > size || v->u.bytes.len > size - v->u.bytes.off)
			fuzz_die("bytes outside the input", NULL);
		if (v->u.bytes.data &&
		    memcmp(v->u.bytes.data, data + v->u.bytes.off, v->u.bytes.len))
			fuzz_die("bytes copy differs", NULL);
		if (!v->u.bytes.data && v->u.bytes.len <= SF_PK_BYTES_COPY)
			fuzz_die("short bytes not copied", NULL);
		break;
	case SF_PK_TUPLE: case SF_PK_LIST:
		for (size_t k = 0; k < v->u.seq.n; k++)
			walk(v->u.seq.v[k], data, size, depth + 1);
		break;
	case SF_PK_DICT:
		for (size_t k = 0; k < v->u.dict.n; k++) {
			walk(v->u.dict.k[k], data, size, depth + 1);
			walk(v->u.dict.v[k], data, size, depth + 1);
		}
		break;
	case SF_PK_GLOBAL: {
		size_t k;

		for (k = 0; k < NALLOW; k++)
			if (sf_pk_is_global(v, allow[k].module, allow[k].name))
				break;
		if (k == NALLOW)
			fuzz_die("a global off the allowlist", v->u.global.name);
		break;
	}
	case SF_PK_OBJ:
		walk(v->u.obj.callable, data, size, depth + 1);
		walk(v->u.obj.args, data, size, depth + 1);
		if (v->u.obj.args->kind != SF_PK_TUPLE)
			fuzz_die("call arguments not a tuple", NULL);
		if (v->u.obj.kwargs)
			walk(v->u.obj.kwargs, data, size, depth + 1);
		if (v->u.obj.state)
			walk(v->u.obj.state, data, size, depth + 1);
		if (v->u.obj.items)
			walk(v->u.obj.items, data, size, depth + 1);
		if (v->u.obj.elems)
			walk(v->u.obj.elems, data, size, depth + 1);
		break;
	case SF_PK_PERSID:
		walk(v->u.persid, data, size, depth + 1);
		break;
	default:
		fuzz_die("unknown node kind", NULL);
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct sf_input in = sf_input_mem(data, size);
	struct sf_pickle_opts o = { .allow = allow, .nallow = NALLOW,
				    .max_nodes = 1u << 16, .max_depth = 64 };
	struct sf_pickle *p = NULL;
	char err[256];
	int rc;

	fuzz_poison(err, sizeof(err));
	rc = sf_pickle_load(&in, &o, &p, err, sizeof(err));
	if (rc) {
		if (p)
			fuzz_die("document on failure", NULL);
		if (rc != -ENOMEM && rc != -SF_EFORMAT && rc != -SF_EREFUSED &&
		    rc != -SF_ETOOBIG && rc != -SF_ESHORT)
			fuzz_die("unexpected error code", sf_strerror(rc));
		if (rc != -ENOMEM)
			fuzz_check_message(err, sizeof(err));
		return 0;
	}
	if (sf_pickle_end(p) == 0 || sf_pickle_end(p) > size)
		fuzz_die("end outside the input", NULL);
	walk(sf_pickle_root(p), data, size, 0);
	sf_pickle_free(p);
	return 0;
}
