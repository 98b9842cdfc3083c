/*
 * sf_hf_meta.h - the JSON of Hugging Face style weights, decoded strictly:
 * the index of sharded weights and the safetensors `__metadata__` that
 * torch DCP's HuggingFaceStorageWriter adds.
 *
 * The index (`model.safetensors.index.json`, `pytorch_model.bin.index.json`,
 * what save_pretrained, ColossalAI and DCP write) is
 *     {"metadata": {"total_size": N, ...}, "weight_map": {name: file, ...}}
 * with "metadata" optional (an object or null, kept as text for the
 * synthesized manifest) and every weight_map value a string. Names and
 * files are only checked for length and NUL bytes here; whether a name can
 * be shown, and whether a file lies inside the checkpoint, is the
 * adapter's call.
 *
 * A safetensors file DCP wrote carries, in its `__metadata__`, the keys
 * "DCP_VERSION" (e.g. "1.0") and "DCP_SHARDING_INFO": a string holding
 * JSON {name: {"saved_offsets": [o_0, ...]}, ...}, where each tensor of
 * that file lies in its global tensor.
 *
 * Untrusted input: text at most SF_MAX_MANIFEST_BYTES, at most
 * SF_MAX_TENSORS entries, names and files at most SF_MAX_NAME bytes,
 * offsets at most SF_MAX_NDIM of them, each in [0, 2^63); duplicate keys
 * are refused. Failure is -SF_EFORMAT (or -SF_ETOOBIG, -ENOMEM) with a
 * one-line printable reason.
 *
 * Ownership: each result owns its strings; free with its _free function
 * (NULL accepted).
 */
#ifndef SF_HF_META_H
#define SF_HF_META_H

#include <stddef.h>
#include <stdint.h>

#include "sf_box.h"

struct sf_hf_index {
	char **names;        /* weight_map keys, sorted by strcmp; owned */
	const char **files;  /* per name: its file, borrowed from ufiles */
	size_t n;            /* <= SF_MAX_TENSORS */
	char **ufiles;       /* the distinct files, sorted; owned */
	size_t nfiles;
	char *metadata;      /* "metadata" as compact JSON, or NULL; owned */
};

/* Parse len bytes of index JSON into *out. */
int sf_hf_index_parse(const char *json, size_t len, struct sf_hf_index **out,
		      char *err, size_t errlen);
void sf_hf_index_free(struct sf_hf_index *ix);
/* The file of name, or NULL. */
const char *sf_hf_index_file(const struct sf_hf_index *ix, const char *name);

struct sf_hf_offsets {
	char *name;                  /* owned */
	unsigned ndim;               /* <= SF_MAX_NDIM */
	uint64_t off[SF_MAX_NDIM];   /* elements */
};

/* What DCP put in one safetensors file's __metadata__. */
struct sf_hf_dcp {
	char version[16];            /* DCP_VERSION when it is short digits and
				      * dots, else "" */
	int has_sharding;            /* DCP_SHARDING_INFO was there (1/0) */
	struct sf_hf_offsets *offs;  /* sorted by name; owned */
	size_t n;                    /* <= SF_MAX_TENSORS */
};

/*
 * Parse a safetensors __metadata__ object (compact JSON text, len bytes,
 * as sf_st_header gives it) for DCP's keys into *out. A metadata without
 * them gives an empty result; DCP_SHARDING_INFO that is not a string of
 * the shape above fails.
 */
int sf_hf_dcp_parse(const char *json, size_t len, struct sf_hf_dcp **out,
		    char *err, size_t errlen);
void sf_hf_dcp_free(struct sf_hf_dcp *d);
/* The offsets recorded for name, or NULL. */
const struct sf_hf_offsets *sf_hf_dcp_find(const struct sf_hf_dcp *d,
					   const char *name);

#endif
