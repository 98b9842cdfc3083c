/*
 * sf_manifest.c - the model <-> JSON codec of shardfs/1, writing side:
 * the manifest dump, the shard JSON of journal records and their reading
 * back, the shards xattr (see sf_manifest.h, docs/FORMAT.md). The parser
 * is sf_manifest_parse.c.
 *
 * Invariants: a model that leaves sf_manifest_parse() has passed every rule
 * of the model's validator (sf_model.h) and the format's own (its
 * "format" string, every shard with checksums, root files not named like
 * rank directories); the dump writes exactly what the parser reads, and
 * escapes whatever it is given, so its output is valid JSON; a format's
 * extra keys never take a name the manifest uses itself.
 */
#include "sf_manifest.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "sf_checksum.h"
#include "sf_error.h"
#include "sf_io.h"
#include "sf_parse.h"

/* ------------------------------------------------------------------ */
/* journal records                                                     */

int sf_manifest_get_shard(const json_t *o, unsigned ndim, struct sf_shard *s)
{
	const json_t *flat = json_object_get(o, "flat"), *x = json_object_get(o, "xxh3");
	const json_t *file = json_object_get(o, "file");
	uint64_t rank;

	memset(s, 0, sizeof(*s));
	if (!sf_json_u64(json_object_get(o, "rank"), &rank) || rank > UINT32_MAX ||
	    !json_is_string(file) || !json_is_array(x) ||
	    !sf_json_u64(json_object_get(o, "file_offset"), &s->file_offset) ||
	    !sf_json_u64(json_object_get(o, "nbytes"), &s->nbytes) ||
	    !sf_relpath_valid(json_string_value(file)) || ndim > SF_MAX_NDIM)
		return -EINVAL;
	s->rank = (uint32_t)rank;
	if (flat) {
		if (!json_is_array(flat) || json_array_size(flat) != 2 ||
		    !sf_json_u64(json_array_get(flat, 0), &s->flat_off) ||
		    !sf_json_u64(json_array_get(flat, 1), &s->flat_len))
			return -EINVAL;
		s->flat = true;
	} else {
		const json_t *a = json_object_get(o, "offsets"), *b = json_object_get(o, "lengths");
		struct sf_box box = { .ndim = ndim };

		if (!json_is_array(a) || !json_is_array(b) ||
		    json_array_size(a) != ndim || json_array_size(b) != ndim)
			return -EINVAL;
		for (unsigned i = 0; i < ndim; i++)
			if (!sf_json_u64(json_array_get(a, i), &box.off[i]) ||
			    !sf_json_u64(json_array_get(b, i), &box.len[i]))
				return -EINVAL;
		if (sf_shard_set_box(s, &box))
			return -ENOMEM;
	}
	if (json_array_size(x) > (1u << 24)) {
		sf_shard_clear(s);
		return -EINVAL;
	}
	s->nblocks = json_array_size(x);
	s->xxh3 = malloc((s->nblocks ? s->nblocks : 1) * sizeof(uint64_t));
	s->file = strdup(json_string_value(file));
	if (!s->xxh3 || !s->file) {
		sf_shard_clear(s);
		return -ENOMEM;
	}
	for (size_t i = 0; i < s->nblocks; i++) {
		const json_t *h = json_array_get(x, i);

		if (!json_is_string(h) ||
		    sf_xxh3_parse(json_string_value(h), json_string_length(h),
				  &s->xxh3[i])) {
			sf_shard_clear(s);
			return -EINVAL;
		}
	}
	return 0;
}

/* ------------------------------------------------------------------ */
/* dump                                                                */

void sf_manifest_put_shard(struct sf_jw *w, unsigned ndim,
			   const struct sf_shard *s, bool with_sums)
{
	sf_jw_mem(w, "{", 1);
	sf_jw_key(w, "rank");
	sf_jw_u64(w, s->rank);
	sf_jw_comma(w);
	if (s->flat) {
		uint64_t fl[2] = { s->flat_off, s->flat_len };

		sf_jw_key(w, "flat");
		sf_jw_u64_array(w, fl, 2);
	} else {
		sf_jw_key(w, "offsets");
		sf_jw_u64_array(w, s->off, ndim);
		sf_jw_comma(w);
		sf_jw_key(w, "lengths");
		sf_jw_u64_array(w, s->len, ndim);
		if (s->strides) {
			sf_jw_comma(w);
			sf_jw_key(w, "strides");
			sf_jw_u64_array(w, s->strides, ndim);
		}
	}
	sf_jw_comma(w);
	sf_jw_key(w, "file");
	sf_jw_str(w, s->file);
	sf_jw_comma(w);
	sf_jw_key(w, "file_offset");
	sf_jw_u64(w, s->file_offset);
	sf_jw_comma(w);
	sf_jw_key(w, "nbytes");
	sf_jw_u64(w, s->nbytes);
	/* a foreign format's coded (compressed) chunk: shown, never parsed */
	if (s->codec != SF_CODEC_NONE) {
		sf_jw_comma(w);
		sf_jw_key(w, "codec");
		sf_jw_str(w, sf_codec_name(s->codec));
		sf_jw_comma(w);
		sf_jw_key(w, "stored_nbytes");
		sf_jw_u64(w, s->stored_len);
		sf_jw_comma(w);
		sf_jw_key(w, "decoded_offset");
		sf_jw_u64(w, s->decoded_off);
		sf_jw_comma(w);
		sf_jw_key(w, "decoded_nbytes");
		sf_jw_u64(w, s->decoded_len);
	}
	/* an empty shard has no blocks but is verified all the same */
	if (with_sums && (s->xxh3 || s->nbytes == 0)) {
		sf_jw_comma(w);
		sf_jw_key(w, "xxh3");
		sf_jw_mem(w, "[", 1);
		for (uint64_t i = 0; i < s->nblocks; i++) {
			char hex[19];

			hex[0] = '"';
			sf_xxh3_hex(s->xxh3[i], hex + 1);
			hex[17] = '"';
			if (i)
				sf_jw_comma(w);
			sf_jw_mem(w, hex, 18);
		}
		sf_jw_mem(w, "]", 1);
	}
	sf_jw_mem(w, "}", 1);
}

static void put_shards(struct sf_jw *w, const struct sf_tensor *t, bool with_sums,
		      const char *indent)
{
	sf_jw_mem(w, "[", 1);
	for (size_t i = 0; i < t->nshards; i++) {
		if (i)
			sf_jw_mem(w, ",", 1);
		if (w->pretty) {
			sf_jw_mem(w, "\n", 1);
			sf_jw_lit(w, indent);
		}
		sf_manifest_put_shard(w, t->ndim, &t->shards[i], with_sums);
	}
	sf_jw_mem(w, "]", 1);
}

static void put_entries(struct sf_jw *w, const struct sf_tensor *arr, size_t n)
{
	sf_jw_mem(w, "{", 1);
	for (size_t i = 0; i < n; i++) {
		const struct sf_tensor *t = &arr[i];

		sf_jw_lit(w, i ? ",\n  " : "\n  ");
		sf_jw_key(w, t->name);
		sf_jw_mem(w, "{", 1);
		sf_jw_key(w, "dtype");
		sf_jw_str(w, sf_dtype_name(t->dtype));
		sf_jw_comma(w);
		sf_jw_key(w, "shape");
		sf_jw_u64_array(w, t->shape, t->ndim);
		sf_jw_comma(w);
		sf_jw_key(w, "shards");
		put_shards(w, t, true, "   ");
		sf_jw_mem(w, "}", 1);
	}
	sf_jw_lit(w, n ? "\n }" : "}");
}

/* The keys the manifest itself uses: no extra key may be one. */
static bool key_reserved(const char *key)
{
	static const char *const own[] = {
		"format", "name", "world_size", "block_size", "tensors", "files",
		"objects",
	};

	for (size_t i = 0; i < sizeof(own) / sizeof(own[0]); i++)
		if (strcmp(key, own[i]) == 0)
			return true;
	return false;
}

/* Each key of extra after the manifest's own, its value compact. */
static void put_extra(struct sf_jw *w, const json_t *extra)
{
	const char *key;
	json_t *v;

	json_object_foreach((json_t *)extra, key, v) {
		char *text;

		if (w->err)
			return;
		if (key_reserved(key)) {
			w->err = -EINVAL;
			return;
		}
		text = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY | JSON_PRESERVE_ORDER);
		if (!text) {
			w->err = -ENOMEM;
			return;
		}
		sf_jw_lit(w, ",\n ");
		sf_jw_key(w, key);
		sf_jw_lit(w, text);
		free(text);
	}
}

int sf_manifest_dump(const struct sf_model *m, char **out, size_t *len)
{
	return sf_manifest_dump_extra(m, NULL, out, len);
}

int sf_manifest_dump_extra(const struct sf_model *m, const json_t *extra,
			   char **out, size_t *len)
{
	struct sf_jw w = { .pretty = true, .max = SF_MAX_MANIFEST_BYTES };

	if (!m || !out || (extra && !json_is_object(extra)))
		return -EINVAL;
	*out = NULL;
	sf_jw_lit(&w, "{\n ");
	sf_jw_key(&w, "format");
	sf_jw_str(&w, m->format);
	sf_jw_lit(&w, ",\n ");
	sf_jw_key(&w, "name");
	sf_jw_str(&w, m->name);
	sf_jw_lit(&w, ",\n ");
	sf_jw_key(&w, "world_size");
	sf_jw_u64(&w, m->world_size);
	sf_jw_lit(&w, ",\n ");
	sf_jw_key(&w, "block_size");
	sf_jw_u64(&w, m->block_size);
	sf_jw_lit(&w, ",\n ");
	sf_jw_key(&w, "tensors");
	put_entries(&w, m->tensors, m->ntensors);
	sf_jw_lit(&w, ",\n ");
	sf_jw_key(&w, "files");
	put_entries(&w, m->files, m->nfiles);
	if (m->nobjects) {
		sf_jw_lit(&w, ",\n ");
		sf_jw_key(&w, "objects");
		put_entries(&w, m->objects, m->nobjects);
	}
	if (extra)
		put_extra(&w, extra);
	sf_jw_lit(&w, "\n}\n");
	return sf_jw_finish(&w, out, len);
}

int sf_manifest_shards_json(const struct sf_tensor *t, char **out, size_t *len)
{
	struct sf_jw w = { .pretty = false, .max = SF_MAX_MANIFEST_BYTES };

	if (!t || !out)
		return -EINVAL;
	*out = NULL;
	put_shards(&w, t, false, "");
	return sf_jw_finish(&w, out, len);
}
