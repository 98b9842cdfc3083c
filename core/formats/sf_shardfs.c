/*
 * sf_shardfs.c - the native format "shardfs/1": the JSON codec (manifest,
 * parts, journal shard records, the shards xattr) and the adapter on the
 * format seam (see sf_shardfs.h, docs/FORMAT.md).
 *
 * Invariants: a model that leaves sf_shardfs_parse() has passed every rule
 * of the model's validator (sf_model.h) and the format's own (its
 * "format" string, every shard with checksums, root files not named like
 * rank directories); the dump writes exactly what the parser reads, and
 * escapes whatever it is given, so its output is valid JSON.
 */
#include "sf_shardfs.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "sf_checksum.h"
#include "sf_error.h"
#include "sf_io.h"
#include "sf_parse.h"

bool sf_shardfs_file_name_ok(const char *name, size_t len)
{
	size_t pl = sizeof(SF_SHARDFS_RANK_PREFIX) - 1;

	return !(len >= pl && memcmp(name, SF_SHARDFS_RANK_PREFIX, pl) == 0);
}

/* ------------------------------------------------------------------ */
/* parse                                                               */

/* A JSON value as a non-negative integer; label names it in messages. */
static int json_u64(const struct sf_where *w, const json_t *v, const char *label,
		    uint64_t *out)
{
	if (!sf_json_u64(v, out))
		return sf_fail(w, -SF_EMANIFEST, "%s must be a non-negative integer", label);
	return 0;
}

static int get_u64(const struct sf_where *w, const json_t *obj, const char *key,
		   uint64_t *out)
{
	char label[48];
	const json_t *v = json_object_get(obj, key);
	if (!v)
		return sf_fail(w, -SF_EMANIFEST, "missing \"%s\"", key);
	snprintf(label, sizeof(label), "\"%s\"", key);
	return json_u64(w, v, label, out);
}

/* A required string member without NUL bytes (borrowed from obj). */
static int get_string(const struct sf_where *w, const json_t *obj, const char *key,
		      const char **s, size_t *len)
{
	const json_t *v = json_object_get(obj, key);
	if (!v)
		return sf_fail(w, -SF_EMANIFEST, "missing \"%s\"", key);
	if (!json_is_string(v))
		return sf_fail(w, -SF_EMANIFEST, "\"%s\" must be a string", key);
	*s = json_string_value(v);
	*len = json_string_length(v);
	if (memchr(*s, '\0', *len))
		return sf_fail(w, -SF_EMANIFEST, "\"%s\" contains a NUL byte", key);
	return 0;
}

/* Read a JSON array of exactly n non-negative integers into out. */
static int get_u64_array(const struct sf_where *w, const json_t *v, const char *key,
			 size_t n, const char *what, uint64_t *out)
{
	char label[48];
	if (!json_is_array(v))
		return sf_fail(w, -SF_EMANIFEST, "\"%s\" must be an array", key);
	if (json_array_size(v) != n)
		return sf_fail(w, -SF_EMANIFEST, "\"%s\" has %zu entries, expected %zu (%s)",
			    key, json_array_size(v), n, what);
	for (size_t i = 0; i < n; i++) {
		snprintf(label, sizeof(label), "\"%s\"[%zu]", key, i);
		int rc = json_u64(w, json_array_get(v, i), label, &out[i]);
		if (rc < 0)
			return rc;
	}
	return 0;
}

/* A shown manifest's coded shard (sf_shardfs_put_shard): "codec",
 * "stored_nbytes", "decoded_offset" and "decoded_nbytes" into *s; nothing
 * when o has no "codec". */
static int parse_codec(const struct sf_where *w, const json_t *o,
		       struct sf_shard *s)
{
	static const enum sf_codec codecs[] = { SF_CODEC_ZSTD, SF_CODEC_UNREADABLE };
	const json_t *c = json_object_get(o, "codec");
	int rc;

	if (!c)
		return 0;
	if (!json_is_string(c))
		return sf_fail(w, -SF_EMANIFEST, "\"codec\" must be a string");
	for (size_t i = 0; i < sizeof(codecs) / sizeof(codecs[0]); i++)
		if (strcmp(json_string_value(c), sf_codec_name(codecs[i])) == 0)
			s->codec = codecs[i];
	if (s->codec == SF_CODEC_NONE)
		return sf_fail(w, -SF_EMANIFEST, "unknown \"codec\"");
	rc = get_u64(w, o, "stored_nbytes", &s->stored_len);
	if (rc == 0)
		rc = get_u64(w, o, "decoded_offset", &s->decoded_off);
	if (rc == 0)
		rc = get_u64(w, o, "decoded_nbytes", &s->decoded_len);
	return rc;
}

/* Parse shard object o of tensor t into *s (zeroed by the caller; on
 * failure the caller frees what *s holds). need_sums: a shardfs/1
 * manifest's shard (checksums required, no codec); else a shown one's. */
static int parse_shard(const struct sf_where *w, const struct sf_model *m,
		       const struct sf_tensor *t, const json_t *o, bool need_sums,
		       struct sf_shard *s)
{
	uint64_t v;
	int rc;

	if (!json_is_object(o))
		return sf_fail(w, -SF_EMANIFEST, "must be an object");
	rc = get_u64(w, o, "rank", &v);
	if (rc < 0)
		return rc;
	if (v >= m->world_size)
		return sf_fail(w, -SF_EMANIFEST,
			    "\"rank\" = %" PRIu64 " is not below \"world_size\" = %" PRIu32,
			    v, m->world_size);
	s->rank = (uint32_t)v;

	const json_t *offs = json_object_get(o, "offsets");
	const json_t *lens = json_object_get(o, "lengths");
	const json_t *flat = json_object_get(o, "flat");
	if (flat && (offs || lens))
		return sf_fail(w, -SF_EMANIFEST,
			    "has both \"flat\" and \"offsets\"/\"lengths\"");
	if (!flat && !(offs && lens))
		return sf_fail(w, -SF_EMANIFEST,
			    "needs \"offsets\" and \"lengths\", or \"flat\"");
	if (flat) {
		uint64_t fl[2];
		rc = get_u64_array(w, flat, "flat", 2, "byte offset, byte length", fl);
		if (rc < 0)
			return rc;
		s->flat = true;
		s->flat_off = fl[0];
		s->flat_len = fl[1];
	} else {
		s->box.ndim = t->ndim;
		rc = get_u64_array(w, offs, "offsets", t->ndim, "one per dimension",
				   s->box.off);
		if (rc < 0)
			return rc;
		rc = get_u64_array(w, lens, "lengths", t->ndim, "one per dimension",
				   s->box.len);
		if (rc < 0)
			return rc;
	}

	const char *file;
	size_t flen;
	rc = get_string(w, o, "file", &file, &flen);
	if (rc < 0)
		return rc;
	const char *why = sf_name_problem(file, flen, false, true);
	if (why)
		return sf_fail(w, -SF_EMANIFEST, "\"file\" %s", why);
	s->file = strndup(file, flen);
	if (!s->file)
		return -ENOMEM;
	rc = get_u64(w, o, "file_offset", &s->file_offset);
	if (rc < 0)
		return rc;
	rc = get_u64(w, o, "nbytes", &s->nbytes);
	if (rc < 0)
		return rc;

	const json_t *jstr = json_object_get(o, "strides");
	if (jstr) {
		if (flat)
			return sf_fail(w, -SF_EMANIFEST, "a flat range has no \"strides\"");
		s->strides = calloc(SF_MAX_NDIM, sizeof(*s->strides));
		if (!s->strides)
			return -ENOMEM;
		rc = get_u64_array(w, jstr, "strides", t->ndim, "one per dimension",
				   s->strides);
		if (rc < 0)
			return rc;
	}

	if (!need_sums) {
		rc = parse_codec(w, o, s);
		if (rc < 0)
			return rc;
	}
	const json_t *sums = json_object_get(o, "xxh3");
	if (!sums && !need_sums) {
		rc = sf_shard_check(w, m, t, s);
		return rc == -SF_ERANGE ? -SF_EMANIFEST : rc;
	}
	if (!sums)
		return sf_fail(w, -SF_EMANIFEST, "missing \"xxh3\"");
	if (!json_is_array(sums))
		return sf_fail(w, -SF_EMANIFEST, "\"xxh3\" must be an array");
	/* The count is bounded by the input size; shard_validate checks it
	 * against nbytes. */
	s->nblocks = json_array_size(sums);
	/* never NULL: a shard with "xxh3" is verified, even an empty list
	 * (which the count check then refuses for a non-empty payload) */
	s->xxh3 = calloc(s->nblocks ? s->nblocks : 1, sizeof(*s->xxh3));
	if (!s->xxh3)
		return -ENOMEM;
	for (size_t i = 0; i < s->nblocks; i++) {
		const json_t *h = json_array_get(sums, i);
		if (!json_is_string(h) ||
		    sf_xxh3_parse(json_string_value(h), json_string_length(h),
				  &s->xxh3[i]) < 0)
			return sf_fail(w, -SF_EMANIFEST,
				    "\"xxh3\"[%zu] must be 16 lowercase hex digits", i);
	}
	rc = sf_shard_check(w, m, t, s);
	return rc == -SF_ERANGE ? -SF_EMANIFEST : rc;
}

/* Parse one entry of "tensors", "files" or "objects". */
static int parse_tensor(struct sf_where *w, struct sf_model *m,
			enum sf_entry_kind kind, const char *name, size_t len,
			const json_t *o, bool shown)
{
	uint64_t shape[SF_MAX_NDIM];
	struct sf_tensor *t;
	const char *dt;
	size_t dtlen;
	int rc;

	sf_where_set(w, sf_entry_kind_name(kind), name, len);
	if (!json_is_object(o))
		return sf_fail(w, -SF_EMANIFEST, "must be an object");
	rc = get_string(w, o, "dtype", &dt, &dtlen);
	if (rc < 0)
		return rc;
	enum sf_dtype dtype = sf_dtype_from_name(dt, dtlen);
	if (dtype == SF_DT_INVALID) {
		char q[sizeof(w->qname)];
		sf_quote_name(q, dt, dtlen);
		return sf_fail(w, -SF_EMANIFEST, "unknown \"dtype\" %s", q);
	}
	const json_t *js = json_object_get(o, "shape");
	if (!js)
		return sf_fail(w, -SF_EMANIFEST, "missing \"shape\"");
	if (!json_is_array(js))
		return sf_fail(w, -SF_EMANIFEST, "\"shape\" must be an array");
	if (json_array_size(js) > SF_MAX_NDIM)
		return sf_fail(w, -SF_ETOOBIG, "\"shape\" has %zu dimensions, more than %d",
			       json_array_size(js), SF_MAX_NDIM);
	unsigned ndim = (unsigned)json_array_size(js);
	rc = get_u64_array(w, js, "shape", ndim, "", shape);
	if (rc < 0)
		return rc;
	if (kind == SF_ENTRY_FILE && !shown && !sf_shardfs_file_name_ok(name, len))
		return sf_fail(w, -SF_EMANIFEST,
			       "name starts with \"" SF_SHARDFS_RANK_PREFIX "\" (payload directories)");

	const json_t *jsh = json_object_get(o, "shards");
	if (!jsh)
		return sf_fail(w, -SF_EMANIFEST, "missing \"shards\"");
	if (!json_is_array(jsh))
		return sf_fail(w, -SF_EMANIFEST, "\"shards\" must be an array");
	size_t nsh = json_array_size(jsh);
	if (nsh > SF_MAX_SHARDS)
		return sf_fail(w, -SF_ETOOBIG, "%zu shards, more than %u", nsh, SF_MAX_SHARDS);

	rc = sf_model_append_checked(m, w, kind, name, len, dtype, ndim, shape, &t);
	if (rc < 0)
		return rc;
	if (nsh) {
		t->shards = calloc(nsh, sizeof(*t->shards));
		if (!t->shards)
			return -ENOMEM;
		t->cap_shards = nsh;
	}
	for (size_t i = 0; i < nsh; i++) {
		struct sf_shard s = { 0 };
		w->shard = (long)i;
		rc = parse_shard(w, m, t, json_array_get(jsh, i), !shown, &s);
		if (rc < 0) {
			sf_shard_clear(&s);
			return rc;
		}
		t->shards[t->nshards++] = s;
	}
	w->shard = -1;
	return 0;
}

/* Parse every entry of a "tensors", "files" or "objects" object. */
static int parse_section(struct sf_where *w, struct sf_model *m,
			 enum sf_entry_kind kind, const json_t *obj, bool shown)
{
	const char *key;
	size_t klen;
	json_t *v;

	json_object_keylen_foreach((json_t *)obj, key, klen, v) {
		int rc = parse_tensor(w, m, kind, key, klen, v, shown);
		if (rc < 0)
			return rc;
	}
	return 0;
}

/* How parse_impl reads its input. */
enum parse_mode {
	PARSE_MANIFEST,        /* a shardfs/1 manifest.json */
	PARSE_PART,            /* one rank's part: no coverage check */
	PARSE_SHOWN,           /* a mount's manifest.json, of any format */
};

static int parse_impl(const char *json, size_t len, enum parse_mode mode,
		      struct sf_model **out, char *err, size_t errlen)
{
	struct sf_where w;
	struct sf_model *m = NULL;
	json_error_t jerr;
	const char *s;
	size_t slen;
	uint64_t world, bsize;
	char fmt[SF_MAX_FORMAT] = SF_SHARDFS_FORMAT;
	int rc;

	sf_where_init(&w, err, errlen);
	if (!out || (!json && len))
		return -EINVAL;
	*out = NULL;
	if (len > SF_MAX_MANIFEST_BYTES)
		return sf_fail(&w, -SF_ETOOBIG, "manifest is %zu bytes, more than the limit of %u",
			    len, SF_MAX_MANIFEST_BYTES);
	json_t *root = json_loadb(json ? json : "", len,
				  JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &jerr);
	if (!root)
		return sf_fail(&w, -SF_EMANIFEST, "invalid JSON at line %d column %d: %s",
			    jerr.line, jerr.column, jerr.text);
	if (!json_is_object(root)) {
		rc = sf_fail(&w, -SF_EMANIFEST, "the manifest must be a JSON object");
		goto out_decref;
	}

	rc = get_string(&w, root, "format", &s, &slen);
	if (rc < 0)
		goto out_decref;
	if (mode == PARSE_SHOWN) {
		bool ok = slen && slen < SF_MAX_FORMAT;

		for (size_t i = 0; ok && i < slen; i++)
			ok = (unsigned char)s[i] >= 0x20 && s[i] != 0x7f;
		if (!ok) {
			rc = sf_fail(&w, -SF_EMANIFEST, "\"format\" must be 1..%d printable bytes",
				     SF_MAX_FORMAT - 1);
			goto out_decref;
		}
		memcpy(fmt, s, slen);
		fmt[slen] = '\0';
	} else if (slen != strlen(SF_SHARDFS_FORMAT) ||
		   memcmp(s, SF_SHARDFS_FORMAT, slen) != 0) {
		char q[sizeof(w.qname)];
		sf_quote_name(q, s, slen);
		rc = sf_fail(&w, -SF_EMANIFEST, "\"format\" is %s, expected \"" SF_SHARDFS_FORMAT "\"", q);
		goto out_decref;
	}
	rc = get_string(&w, root, "name", &s, &slen);
	if (rc < 0)
		goto out_decref;
	const char *why = sf_name_problem(s, slen, true, true);

	if (why) {
		rc = sf_fail(&w, -SF_EMANIFEST, "\"name\" %s", why);
		goto out_decref;
	}
	rc = get_u64(&w, root, "world_size", &world);
	if (rc < 0)
		goto out_decref;
	if (world < 1 || world > SF_MAX_WORLD) {
		rc = sf_fail(&w, -SF_EMANIFEST, "\"world_size\" = %" PRIu64 " is not in 1..%u",
			  world, SF_MAX_WORLD);
		goto out_decref;
	}
	rc = get_u64(&w, root, "block_size", &bsize);
	if (rc < 0)
		goto out_decref;
	if (bsize < SF_MIN_BLOCK_SIZE || bsize > SF_MAX_BLOCK_SIZE) {
		rc = sf_fail(&w, -SF_EMANIFEST, "\"block_size\" = %" PRIu64 " is not in %u..%u",
			  bsize, SF_MIN_BLOCK_SIZE, SF_MAX_BLOCK_SIZE);
		goto out_decref;
	}

	const json_t *tens = json_object_get(root, "tensors");
	const json_t *files = json_object_get(root, "files");
	const json_t *objs = json_object_get(root, "objects");
	if (!tens || !json_is_object(tens)) {
		rc = sf_fail(&w, -SF_EMANIFEST, "\"tensors\" must be an object");
		goto out_decref;
	}
	if (files && !json_is_object(files)) {
		rc = sf_fail(&w, -SF_EMANIFEST, "\"files\" must be an object");
		goto out_decref;
	}
	if (objs && !json_is_object(objs)) {
		rc = sf_fail(&w, -SF_EMANIFEST, "\"objects\" must be an object");
		goto out_decref;
	}
	size_t nt = json_object_size(tens), nf = files ? json_object_size(files) : 0;
	size_t no = objs ? json_object_size(objs) : 0;
	if (nt + nf + no > SF_MAX_TENSORS) {
		rc = sf_fail(&w, -SF_ETOOBIG, "%zu tensors and files, more than %u",
			     nt + nf + no, SF_MAX_TENSORS);
		goto out_decref;
	}

	/* s points into root, which outlives this copy. */
	char name[SF_MAX_NAME + 1];
	memcpy(name, s, slen);
	name[slen] = '\0';
	rc = -ENOMEM;
	m = sf_model_new(name, (uint32_t)world, bsize);
	if (!m)
		goto out_decref;
	sf_model_set_format(m, fmt);
	if (nt && !(m->tensors = calloc(nt, sizeof(*m->tensors))))
		goto out_destroy;
	m->cap_tensors = nt;
	if (nf && !(m->files = calloc(nf, sizeof(*m->files))))
		goto out_destroy;
	m->cap_files = nf;

	rc = parse_section(&w, m, SF_ENTRY_TENSOR, tens, mode == PARSE_SHOWN);
	if (rc < 0)
		goto out_destroy;
	if (files) {
		rc = parse_section(&w, m, SF_ENTRY_FILE, files, mode == PARSE_SHOWN);
		if (rc < 0)
			goto out_destroy;
	}
	if (objs) {
		rc = parse_section(&w, m, SF_ENTRY_OBJECT, objs, mode == PARSE_SHOWN);
		if (rc < 0)
			goto out_destroy;
	}
	rc = mode == PARSE_PART ? sf_model_finish_part(m, err, errlen) :
		       sf_model_finish(m, err, errlen);
	if (rc < 0)
		goto out_destroy;
	json_decref(root);
	*out = m;
	return 0;

out_destroy:
	sf_model_destroy(m);
out_decref:
	json_decref(root);
	return rc;
}

int sf_shardfs_parse(const char *json, size_t len, struct sf_model **out,
		     char *err, size_t errlen)
{
	return parse_impl(json, len, PARSE_MANIFEST, out, err, errlen);
}

int sf_shardfs_parse_part(const char *json, size_t len,
			  struct sf_model **out, char *err, size_t errlen)
{
	return parse_impl(json, len, PARSE_PART, out, err, errlen);
}

int sf_shardfs_parse_shown(const char *json, size_t len, struct sf_model **out,
			   char *err, size_t errlen)
{
	return parse_impl(json, len, PARSE_SHOWN, out, err, errlen);
}


/* ------------------------------------------------------------------ */
/* journal records                                                     */

int sf_shardfs_get_shard(const json_t *o, unsigned ndim, struct sf_shard *s)
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

		if (!json_is_array(a) || !json_is_array(b) ||
		    json_array_size(a) != ndim || json_array_size(b) != ndim)
			return -EINVAL;
		s->box.ndim = ndim;
		for (unsigned i = 0; i < ndim; i++)
			if (!sf_json_u64(json_array_get(a, i), &s->box.off[i]) ||
			    !sf_json_u64(json_array_get(b, i), &s->box.len[i]))
				return -EINVAL;
	}
	if (json_array_size(x) > (1u << 24))
		return -EINVAL;
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

void sf_shardfs_put_shard(struct sf_jw *w, unsigned ndim,
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
		sf_jw_u64_array(w, s->box.off, ndim);
		sf_jw_comma(w);
		sf_jw_key(w, "lengths");
		sf_jw_u64_array(w, s->box.len, ndim);
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
		sf_shardfs_put_shard(w, t->ndim, &t->shards[i], with_sums);
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

int sf_shardfs_dump(const struct sf_model *m, char **out, size_t *len)
{
	struct sf_jw w = { .pretty = true, .max = SF_MAX_MANIFEST_BYTES };

	if (!m || !out)
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
	sf_jw_lit(&w, "\n}\n");
	return sf_jw_finish(&w, out, len);
}

int sf_tensor_shards_json(const struct sf_tensor *t, char **out, size_t *len)
{
	struct sf_jw w = { .pretty = false, .max = SF_MAX_MANIFEST_BYTES };

	if (!t || !out)
		return -EINVAL;
	*out = NULL;
	put_shards(&w, t, false, "");
	return sf_jw_finish(&w, out, len);
}

/* ------------------------------------------------------------------ */
/* the adapter                                                         */

/* manifest.json: committed. The marker, or a rank's journal: being
 * written by shardfs. */
static enum sf_probe shardfs_probe(const struct sf_dirlist *ls)
{
	if (sf_dirlist_has(ls, SF_SHARDFS_MANIFEST, false))
		return SF_PROBE_YES;
	if (sf_dirlist_has(ls, SF_SHARDFS_MARKER, false))
		return SF_PROBE_PARTIAL;
	for (size_t i = 0; i < ls->n; i++)
		if (ls->is_dir[i] &&
		    strncmp(ls->names[i], SF_SHARDFS_RANK_PREFIX,
			    sizeof(SF_SHARDFS_RANK_PREFIX) - 1) == 0)
			return SF_PROBE_PARTIAL; /* the open decides */
	return SF_PROBE_NO;
}

static int shardfs_open(const struct sf_cdir *cd, struct sf_format_result *out,
			char *err, size_t errlen)
{
	struct sf_cfile f;
	int rc;

	rc = sf_cfile_open(cd, SF_SHARDFS_MANIFEST, &f);
	if (rc) {
		snprintf(err, errlen, SF_SHARDFS_MANIFEST ": %s",
			 rc == -EINVAL ? "not a regular file" : sf_strerror(rc));
		return rc;
	}
	rc = sf_cfile_read_all(&f, SF_MAX_MANIFEST_BYTES, &out->meta, &out->metalen);
	sf_cfile_close(&f);
	if (rc) {
		snprintf(err, errlen, SF_SHARDFS_MANIFEST ": %s",
			 rc == -EINVAL ? "not a regular file" : sf_strerror(rc));
		return rc;
	}
	return sf_shardfs_parse(out->meta, out->metalen, &out->model, err, errlen);
}

const struct sf_format sf_format_shardfs = {
	.name = SF_SHARDFS_FORMAT,
	.writable = true,
	.probe = shardfs_probe,
	.open = shardfs_open,
};
