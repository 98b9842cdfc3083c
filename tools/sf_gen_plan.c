/*
 * sf_gen_plan.c - stage 1 of `shardctl gen` (see sf_gen.c): the plan, a
 * list of tensors (name, dtype, shape) and, for each, the shards that
 * hold it (rank plus box or flat range), sharded the way training jobs
 * shard them (column/row-parallel boxes, FSDP flat ranges, replicas); the
 * Llama-shaped model whose hidden size brings the total close to --size;
 * and the root files (config.json, tokenizer_config.json) with their
 * bytes.
 *
 * Invariants: only geometry lives here, no tensor bytes (root files
 * excepted): a plan is O(tensors + shards) whatever --size; a shard is a
 * rank plus a box or flat range of its tensor, its file, offsets and
 * checksums left for the writer (sf_gen.c) to fill. Single-threaded: no
 * locks.
 */
#include "sf_gen_plan.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sf_box.h"
#include "sf_error.h"
#include "sf_model.h"

void sf_gen_plan_clear(struct gen_plan *p)
{
	for (size_t i = 0; i < p->n; i++) {
		struct gen_tensor *t = &p->t[i];

		for (size_t k = 0; k < t->nshards; k++)
			sf_shard_clear(&t->shards[k]);
		free(t->shards);
		free(t->name);
		free(t->blob);
	}
	free(p->t);
	memset(p, 0, sizeof(*p));
}

/* Append a tensor; returns its index or a negative error. */
static int plan_add(struct gen_plan *p, uint64_t seed, const char *name,
		    enum sf_dtype dt, unsigned ndim, const uint64_t *shape)
{
	struct gen_tensor *t;
	int rc;

	if (p->n == p->cap) {
		size_t cap = p->cap ? 2 * p->cap : 64;
		struct gen_tensor *nt = realloc(p->t, cap * sizeof(*nt));

		if (!nt)
			return -ENOMEM;
		p->t = nt;
		p->cap = cap;
	}
	t = &p->t[p->n];
	memset(t, 0, sizeof(*t));
	t->name = strdup(name);
	if (!t->name)
		return -ENOMEM;
	t->dt = dt;
	t->ndim = ndim;
	memcpy(t->shape, shape, ndim * sizeof(*shape));
	rc = sf_shape_nbytes(ndim, shape, sf_dtype_size(dt), &t->nbytes);
	if (rc < 0) {
		free(t->name);
		return rc;
	}
	t->key = sf_gen_key(seed, name);
	p->tensor_bytes += t->nbytes;
	return (int)p->n++;
}

static int tensor_push_shard(struct gen_tensor *t, const struct sf_shard *s)
{
	if (t->nshards == t->cap) {
		size_t cap = t->cap ? 2 * t->cap : 4;
		struct sf_shard *ns = realloc(t->shards, cap * sizeof(*ns));

		if (!ns)
			return -ENOMEM;
		t->shards = ns;
		t->cap = cap;
	}
	t->shards[t->nshards++] = *s;
	return 0;
}

static int shard_box(struct gen_tensor *t, uint32_t rank,
		     const struct sf_box *b)
{
	struct sf_shard s = { .rank = rank, .flat = false };
	int rc;

	s.nbytes = sf_box_numel(b) * sf_dtype_size(t->dt);
	if (!s.nbytes && t->ndim)
		return 0;
	rc = sf_shard_set_box(&s, b);
	if (rc == 0 && (rc = tensor_push_shard(t, &s)) < 0)
		sf_shard_clear(&s);
	return rc;
}

static int shard_flat(struct gen_tensor *t, uint32_t rank, uint64_t off,
		      uint64_t len)
{
	struct sf_shard s = { .rank = rank, .flat = true, .flat_off = off,
			      .flat_len = len, .nbytes = len };

	return len ? tensor_push_shard(t, &s) : 0;
}

/* Cut dimension `dim` into n near-equal boxes (uneven when it does not
 * divide), box r on rank (first + r) % world. */
static int split_box(struct gen_tensor *t, unsigned dim, uint32_t n,
		     uint32_t world, uint32_t first)
{
	for (uint32_t r = 0; r < n; r++) {
		struct sf_box b;
		int rc;

		sf_box_full(&b, t->ndim, t->shape);
		b.off[dim] = t->shape[dim] * r / n;
		b.len[dim] = t->shape[dim] * (r + 1) / n - b.off[dim];
		rc = shard_box(t, (first + r) % world, &b);
		if (rc < 0)
			return rc;
	}
	return 0;
}

/* Cut the flattened tensor into n element-aligned byte ranges, jittered so
 * they are uneven and (in general) not row-aligned. */
static int split_flat(struct gen_tensor *t, uint32_t n)
{
	size_t isz = sf_dtype_size(t->dt);
	uint64_t numel = t->nbytes / isz, prev = 0;

	for (uint32_t r = 0; r < n; r++) {
		uint64_t end = numel * (r + 1) / n;
		int rc;

		if (r + 1 < n) {
			int64_t jit = (int64_t)((r * 7 + 3) % 13) - 6;

			if (jit < 0 && (uint64_t)-jit > end)
				end = 0;
			else
				end = (uint64_t)((int64_t)end + jit);
			if (end < prev)
				end = prev;
			if (end > numel)
				end = numel;
		}
		rc = shard_flat(t, r, prev * isz, (end - prev) * isz);
		if (rc < 0)
			return rc;
		prev = end;
	}
	return 0;
}

static int split_repl(struct gen_tensor *t, uint32_t n)
{
	struct sf_box b;

	sf_box_full(&b, t->ndim, t->shape);
	for (uint32_t r = 0; r < n; r++) {
		int rc = shard_box(t, r, &b);

		if (rc < 0)
			return rc;
	}
	return 0;
}

enum split { SPLIT_DIM0, SPLIT_DIM1, SPLIT_REPL, SPLIT_FLAT };

/* Add a model tensor sharded as `how` says, adjusted for the layout. */
static int add_model(struct gen_plan *p, const struct sf_gen_opts *o,
		     const char *name, enum sf_dtype dt, unsigned ndim,
		     const uint64_t *shape, enum split how)
{
	int i = plan_add(p, o->seed, name, dt, ndim, shape);
	struct gen_tensor *t;

	if (i < 0)
		return i;
	t = &p->t[i];
	if (o->layout == SF_GEN_REPLICATED)
		how = SPLIT_REPL;
	else if (o->layout == SF_GEN_FSDP)
		how = SPLIT_FLAT;
	switch (how) {
	case SPLIT_DIM0: return split_box(t, 0, o->ranks, o->ranks, 0);
	case SPLIT_DIM1: return split_box(t, 1, o->ranks, o->ranks, 0);
	case SPLIT_REPL: return split_repl(t, o->ranks);
	case SPLIT_FLAT: return split_flat(t, o->ranks);
	}
	return -EINVAL;
}

static uint64_t round_up(uint64_t v, uint64_t m)
{
	return (v + m - 1) / m * m;
}

/* Hyper-parameters of a Llama-shaped model of hidden size h (a multiple
 * of 32, of 64 from 512 on) with l layers: GQA with 4 query heads per kv head, Llama's MLP
 * ratio, a vocabulary of 125/16 h plus one added token (32001 at 4096). */
static void llama_dims(struct gen_plan *p, uint64_t h, uint64_t l)
{
	uint64_t hd = h >= 512 ? 64 : h >= 64 ? 16 : 8;

	p->hidden = h;
	p->layers = l;
	p->heads = h / hd;
	p->kv_heads = p->heads >= 4 ? p->heads / 4 : 1;
	p->inter = round_up(h * 43 / 16, 32);
	p->vocab = h * 125 / 16 + 1;
	p->max_pos = 2048;
}

static int build_llama(struct gen_plan *p, const struct sf_gen_opts *o)
{
	static const char *const proj[] = { "q_proj", "k_proj", "v_proj", "o_proj" };
	static const char *const mlp[] = { "gate_proj", "up_proj", "down_proj" };
	uint64_t h = p->hidden, kv = h / p->heads * p->kv_heads, in = p->inter;
	char name[SF_MAX_NAME];
	uint64_t sh[2];
	int rc;

	sh[0] = p->vocab; sh[1] = h;
	rc = add_model(p, o, "model.embed_tokens.weight", o->dtype, 2, sh, SPLIT_DIM0);
	for (uint64_t l = 0; rc == 0 && l < p->layers; l++) {
		for (unsigned k = 0; rc == 0 && k < 4; k++) {
			snprintf(name, sizeof(name),
				 "model.layers.%llu.self_attn.%s.weight",
				 (unsigned long long)l, proj[k]);
			sh[0] = (k == 1 || k == 2) ? kv : h;
			sh[1] = h;
			rc = add_model(p, o, name, o->dtype, 2, sh,
				       k == 3 ? SPLIT_DIM1 : SPLIT_DIM0);
		}
		for (unsigned k = 0; rc == 0 && k < 3; k++) {
			snprintf(name, sizeof(name), "model.layers.%llu.mlp.%s.weight",
				 (unsigned long long)l, mlp[k]);
			sh[0] = k == 2 ? h : in;
			sh[1] = k == 2 ? in : h;
			rc = add_model(p, o, name, o->dtype, 2, sh,
				       k == 2 ? SPLIT_DIM1 : SPLIT_DIM0);
		}
		sh[0] = h;
		if (rc == 0) {
			snprintf(name, sizeof(name),
				 "model.layers.%llu.input_layernorm.weight",
				 (unsigned long long)l);
			rc = add_model(p, o, name, o->dtype, 1, sh, SPLIT_REPL);
		}
		if (rc == 0) {
			snprintf(name, sizeof(name),
				 "model.layers.%llu.post_attention_layernorm.weight",
				 (unsigned long long)l);
			rc = add_model(p, o, name, o->dtype, 1, sh, SPLIT_REPL);
		}
	}
	sh[0] = h;
	if (rc == 0)
		rc = add_model(p, o, "model.norm.weight", o->dtype, 1, sh, SPLIT_REPL);
	sh[0] = p->vocab; sh[1] = h;
	if (rc == 0)
		rc = add_model(p, o, "lm_head.weight", o->dtype, 2, sh, SPLIT_DIM0);
	return rc;
}

/* The "many" layout: o->ntensors tensors of [rows, 64] elements, each cut
 * into one row box per rank (uneven when ranks does not divide rows),
 * named like the experts of a mixture-of-experts model, 1000 per layer,
 * all in one directory of tensors/. rows makes the total close to
 * o->size, at least one row per rank. */
#define GEN_MANY_COLS 64u
#define GEN_MANY_PER_LAYER 1000u

static int build_many(struct gen_plan *p, const struct sf_gen_opts *o)
{
	uint64_t n = o->ntensors ? o->ntensors : SF_GEN_MANY_DEFAULT;
	uint64_t row = GEN_MANY_COLS * sf_dtype_size(o->dtype);
	uint64_t rows = o->size / n / row;
	char name[SF_MAX_NAME];
	uint64_t sh[2];
	int rc = 0;

	if (rows < o->ranks)
		rows = o->ranks;
	sh[0] = rows;
	sh[1] = GEN_MANY_COLS;
	for (uint64_t i = 0; rc == 0 && i < n; i++) {
		snprintf(name, sizeof(name), "model.layers.%llu.mlp.experts.%llu.weight",
			 (unsigned long long)(i / GEN_MANY_PER_LAYER),
			 (unsigned long long)(i % GEN_MANY_PER_LAYER));
		rc = add_model(p, o, name, o->dtype, 2, sh, SPLIT_DIM0);
	}
	return rc;
}

/* Layers that get optimizer state in the mixed layout. */
static uint64_t mixed_optim_layers(const struct gen_plan *p)
{
	return p->layers < 2 ? p->layers : 2;
}

/* The extras of the mixed layout: Adam state for the first layers as
 * FSDP-style flat F32 shards, a step counter, a 0-d scalar, an empty
 * tensor, odd dtypes, and a tensor sharded as one box plus one flat range. */
static int build_mixed_extras(struct gen_plan *p, const struct sf_gen_opts *o)
{
	static const char *const state[] = { "exp_avg", "exp_avg_sq" };
	size_t nmodel = p->n;
	char name[SF_MAX_NAME];
	uint64_t sh[2];
	int i, rc = 0;

	for (size_t k = 0; rc == 0 && k < nmodel; k++) {
		const char *w = p->t[k].name;
		unsigned long long l;
		int used = 0;

		if (sscanf(w, "model.layers.%llu.%n", &l, &used) != 1 || !used ||
		    l >= mixed_optim_layers(p))
			continue;
		for (unsigned s = 0; rc == 0 && s < 2; s++) {
			/* copies: plan_add may move p->t */
			unsigned ndim = p->t[k].ndim;
			uint64_t shape[SF_MAX_NDIM];

			memcpy(shape, p->t[k].shape, sizeof(shape));
			snprintf(name, sizeof(name), "optim/%s/%s", state[s], w);
			i = plan_add(p, o->seed, name, SF_DT_F32, ndim, shape);
			rc = i < 0 ? i : split_flat(&p->t[i], o->ranks);
		}
	}
	if (rc < 0)
		return rc;

	sh[0] = 1;
	i = plan_add(p, o->seed, "optim/step", SF_DT_I64, 1, sh);
	if (i < 0 || (rc = split_repl(&p->t[i], o->ranks)) < 0)
		return i < 0 ? i : rc;

	i = plan_add(p, o->seed, "scalars/loss_scale", SF_DT_F32, 0, sh);
	if (i < 0)
		return i;
	{
		struct sf_box b;

		sf_box_full(&b, 0, sh); /* a 0-d box: the one element */
		rc = shard_box(&p->t[i], 0, &b);
		if (rc < 0)
			return rc;
	}

	sh[0] = 0;
	i = plan_add(p, o->seed, "scalars/empty", SF_DT_F32, 1, sh);
	if (i < 0)
		return i;

	sh[0] = 61; sh[1] = 67; /* column-parallel causal mask, uneven */
	i = plan_add(p, o->seed, "buffers/attn_mask", SF_DT_BOOL, 2, sh);
	if (i < 0 || (rc = split_box(&p->t[i], 0, o->ranks, o->ranks, 0)) < 0)
		return i < 0 ? i : rc;

	sh[0] = 256; sh[1] = p->hidden / p->heads; /* rope cache, row-parallel */
	i = plan_add(p, o->seed, "buffers/rope_cos", SF_DT_F16, 2, sh);
	if (i < 0 || (rc = split_box(&p->t[i], 1, o->ranks, o->ranks, 0)) < 0)
		return i < 0 ? i : rc;

	sh[0] = 1000; sh[1] = 37; /* quantization codes, FSDP flat */
	i = plan_add(p, o->seed, "buffers/quant_codes", SF_DT_U8, 2, sh);
	if (i < 0 || (rc = split_flat(&p->t[i], o->ranks)) < 0)
		return i < 0 ? i : rc;

	/* SPEC's example: rows [0, R/2) as a box on rank 0, the rest as one
	 * flat byte range on rank 1 (rank 0 again when world is 1). */
	sh[0] = p->hidden / 2 + 3; sh[1] = p->hidden;
	i = plan_add(p, o->seed, "model.embed_positions.weight", o->dtype, 2, sh);
	if (i < 0)
		return i;
	{
		struct gen_tensor *t = &p->t[i];
		struct sf_box b;
		uint64_t split;

		sf_box_full(&b, 2, t->shape);
		b.len[0] = t->shape[0] / 2;
		split = b.len[0] * t->shape[1] * sf_dtype_size(t->dt);
		rc = shard_box(t, 0, &b);
		if (rc == 0)
			rc = shard_flat(t, 1 % o->ranks, split, t->nbytes - split);
	}
	return rc;
}

/* The model for hidden size h and the layout's layer count. */
static int build_plan(struct gen_plan *p, const struct sf_gen_opts *o,
		      uint64_t h, uint64_t layers)
{
	int rc;

	memset(p, 0, sizeof(*p));
	llama_dims(p, h, layers);
	rc = build_llama(p, o);
	if (rc == 0 && o->layout == SF_GEN_MIXED)
		rc = build_mixed_extras(p, o);
	if (rc < 0)
		sf_gen_plan_clear(p);
	return rc;
}

static uint64_t next_hidden(uint64_t h)
{
	return h < 512 ? h + 32 : h < 4096 ? h + 64 : h + 256;
}

/* Pick the largest hidden size whose plan stays within o->size (the
 * smallest model if none does) and build that plan. */
int sf_gen_plan_for_size(struct gen_plan *p, const struct sf_gen_opts *o)
{
	uint64_t layers, best = 32;
	int rc;

	if (o->layout == SF_GEN_MANY) {
		uint64_t n = o->ntensors ? o->ntensors : SF_GEN_MANY_DEFAULT;

		memset(p, 0, sizeof(*p));
		/* config.json describes the experts' shape */
		llama_dims(p, GEN_MANY_COLS, (n + GEN_MANY_PER_LAYER - 1) /
					     GEN_MANY_PER_LAYER);
		rc = build_many(p, o);
		if (rc < 0)
			sf_gen_plan_clear(p);
		return rc;
	}

	layers = o->size < (8u << 20) ? 2 : o->size < (128u << 20) ? 4 :
		 o->size < (UINT64_C(2) << 30) ? 8 :
		 o->size < (UINT64_C(32) << 30) ? 16 : 32;
	for (uint64_t h = 32; h <= 65536; h = next_hidden(h)) {
		struct gen_plan trial;

		rc = build_plan(&trial, o, h, layers);
		if (rc < 0)
			return rc;
		if (trial.tensor_bytes > o->size) {
			sf_gen_plan_clear(&trial);
			break;
		}
		best = h;
		sf_gen_plan_clear(&trial);
	}
	return build_plan(p, o, best, layers);
}

/* ------------------------------------------------------------------ */
/* root files                                                          */
/* ------------------------------------------------------------------ */

static const char *torch_dtype(enum sf_dtype dt)
{
	switch (dt) {
	case SF_DT_F64: return "float64";
	case SF_DT_F32: return "float32";
	case SF_DT_F16: return "float16";
	case SF_DT_BF16: return "bfloat16";
	case SF_DT_F8_E4M3: return "float8_e4m3fn";
	case SF_DT_F8_E5M2: return "float8_e5m2";
	default: return sf_dtype_name(dt);
	}
}

/* Add root file `name` with the JSON text of obj (stolen) on rank 0. */
static int add_json_file(struct gen_plan *p, const struct sf_gen_opts *o,
			 const char *name, json_t *obj)
{
	char *text;
	size_t len;
	uint64_t sh[1];
	int i, rc;

	if (!obj)
		return -ENOMEM;
	text = json_dumps(obj, JSON_INDENT(2));
	json_decref(obj);
	if (!text)
		return -ENOMEM;
	len = strlen(text);
	/* json_dumps leaves no trailing newline; text files want one */
	{
		char *nl = realloc(text, len + 2);

		if (!nl) {
			free(text);
			return -ENOMEM;
		}
		text = nl;
		text[len++] = '\n';
		text[len] = '\0';
	}
	sh[0] = len;
	i = plan_add(p, o->seed, name, SF_DT_U8, 1, sh);
	if (i < 0) {
		free(text);
		return i;
	}
	p->tensor_bytes -= len; /* files are not tensors */
	p->t[i].is_file = true;
	p->t[i].blob = text;
	rc = shard_flat(&p->t[i], 0, 0, len);
	return rc;
}

int sf_gen_add_blobs(struct gen_plan *p, const struct sf_gen_opts *o)
{
	json_t *cfg, *tok;
	int rc;

	cfg = json_pack("{s:[s], s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:I,"
			" s:s, s:f, s:f, s:b, s:b, s:I, s:I, s:s, s:s,"
			" s:{s:s, s:I, s:I}}",
			"architectures", "LlamaForCausalLM",
			"model_type", "llama",
			"hidden_size", (json_int_t)p->hidden,
			"intermediate_size", (json_int_t)p->inter,
			"num_hidden_layers", (json_int_t)p->layers,
			"num_attention_heads", (json_int_t)p->heads,
			"num_key_value_heads", (json_int_t)p->kv_heads,
			"vocab_size", (json_int_t)p->vocab,
			"max_position_embeddings", (json_int_t)p->max_pos,
			"hidden_act", "silu",
			"rms_norm_eps", 1e-5,
			"rope_theta", 10000.0,
			"tie_word_embeddings", 0,
			"use_cache", 1,
			"bos_token_id", (json_int_t)1,
			"eos_token_id", (json_int_t)2,
			"torch_dtype", torch_dtype(o->dtype),
			"transformers_version", "4.40.0",
			"shardfs_gen",
			"layout", sf_gen_layout_name(o->layout),
			"ranks", (json_int_t)o->ranks,
			"seed", (json_int_t)o->seed);
	rc = add_json_file(p, o, "config.json", cfg);
	if (rc < 0)
		return rc;
	tok = json_pack("{s:s, s:s, s:s, s:s, s:n, s:b, s:b, s:I, s:s, s:b}",
			"tokenizer_class", "LlamaTokenizer",
			"bos_token", "<s>",
			"eos_token", "</s>",
			"unk_token", "<unk>",
			"pad_token",
			"add_bos_token", 1,
			"add_eos_token", 0,
			"model_max_length", (json_int_t)p->max_pos,
			"padding_side", "left",
			"clean_up_tokenization_spaces", 0);
	return add_json_file(p, o, "tokenizer_config.json", tok);
}

