/*
 * sf_paddlenlp_tp.c - PaddleNLP's tensor-parallel split rules per
 * model_type (sf_paddlenlp_tp.h).
 *
 * Invariants:
 *  - a row is a transcription of one model's
 *    `_get_tensor_parallel_mappings(config, is_split=True)` in the
 *    PaddleNLP release named beside it, nothing inferred: a parameter no
 *    rule names is replicated, as PaddleNLP leaves it;
 *  - rules are tried in order; a rule whose conditions fail lets the
 *    next one with the same name decide (Qwen2's tied / untied lm_head);
 *  - pure functions over static data.
 */
#include "sf_paddlenlp_tp.h"

#include <stddef.h>
#include <string.h>

/* A rule's conditions (all must hold). */
#define IF_VOCAB 1u                  /* vocab_size % degree == 0 */
#define IF_KV 2u                     /* num_key_value_heads % degree == 0 */
#define IF_TIED 4u                   /* tie_word_embeddings */
#define IF_UNTIED 8u                 /* not tie_word_embeddings */
#define WHOLE 16u                    /* name is the whole structured name */

struct rule {
	const char *name;
	enum sf_tp_axis ax;
	unsigned when;
};

struct sf_tp_model {
	const char *type;
	const struct rule *r;
	size_t n;
};

#define COL SF_TP_COL
#define ROW SF_TP_ROW

/* paddlenlp 2.8.1 (and 3.0.0b4, unchanged): LlamaPretrainedModel */
static const struct rule llama[] = {
	{ "lm_head.weight", COL, WHOLE | IF_VOCAB },
	{ "embed_tokens.weight", ROW, IF_VOCAB },
	{ "self_attn.o_proj.weight", ROW, 0 },
	{ "mlp.down_proj.weight", ROW, 0 },
	{ "self_attn.qkv_proj.weight", COL, 0 },
	{ "self_attn.q_proj.weight", COL, 0 },
	{ "self_attn.k_proj.weight", COL, IF_KV },
	{ "self_attn.v_proj.weight", COL, IF_KV },
	{ "mlp.gate_up_fused_proj.weight", SF_TP_COL2, 0 },
	{ "mlp.gate_proj.weight", COL, 0 },
	{ "mlp.up_proj.weight", COL, 0 },
};

/* paddlenlp 3.0.0b4: Qwen2PretrainedModel (2.8.1 has no qwen2): Llama's,
 * with the attention biases and lm_head cut like the embedding (rows)
 * when tied */
static const struct rule qwen2[] = {
	{ "lm_head.weight", ROW, WHOLE | IF_VOCAB | IF_TIED },
	{ "lm_head.weight", COL, WHOLE | IF_VOCAB | IF_UNTIED },
	{ "embed_tokens.weight", ROW, IF_VOCAB },
	{ "self_attn.o_proj.weight", ROW, 0 },
	{ "mlp.down_proj.weight", ROW, 0 },
	{ "self_attn.qkv_proj.weight", COL, 0 },
	{ "self_attn.qkv_proj.bias", COL, 0 },
	{ "self_attn.q_proj.weight", COL, 0 },
	{ "self_attn.q_proj.bias", COL, 0 },
	{ "self_attn.k_proj.weight", COL, IF_KV },
	{ "self_attn.v_proj.weight", COL, IF_KV },
	{ "self_attn.k_proj.bias", COL, IF_KV },
	{ "self_attn.v_proj.bias", COL, IF_KV },
	{ "mlp.gate_up_fused_proj.weight", SF_TP_COL2, 0 },
	{ "mlp.gate_proj.weight", COL, 0 },
	{ "mlp.up_proj.weight", COL, 0 },
};

/* paddlenlp 3.0.0b4: MistralPreTrainedModel (2.8.1 has no mistral): no
 * fused layers, and the embeddings and lm_head cut whatever the
 * vocabulary (PaddleNLP does not test it) */
static const struct rule mistral[] = {
	{ "lm_head.weight", COL, WHOLE },
	{ "embed_tokens.weight", ROW, 0 },
	{ "self_attn.o_proj.weight", ROW, 0 },
	{ "mlp.down_proj.weight", ROW, 0 },
	{ "self_attn.q_proj.weight", COL, 0 },
	{ "self_attn.k_proj.weight", COL, IF_KV },
	{ "self_attn.v_proj.weight", COL, IF_KV },
	{ "mlp.gate_proj.weight", COL, 0 },
	{ "mlp.up_proj.weight", COL, 0 },
};

/* paddlenlp 2.8.1: MixtralPretrainedModel: Llama's attention, and every
 * expert's w1 and w3 by columns, w2 by rows (the router gate whole) */
static const struct rule mixtral[] = {
	{ "lm_head.weight", COL, WHOLE | IF_VOCAB },
	{ "embed_tokens.weight", ROW, IF_VOCAB },
	{ "self_attn.o_proj.weight", ROW, 0 },
	{ "self_attn.q_proj.weight", COL, 0 },
	{ "self_attn.k_proj.weight", COL, IF_KV },
	{ "self_attn.v_proj.weight", COL, IF_KV },
	{ "block_sparse_moe.experts.*.w1.weight", COL, 0 },
	{ "block_sparse_moe.experts.*.w2.weight", ROW, 0 },
	{ "block_sparse_moe.experts.*.w3.weight", COL, 0 },
};

/* paddlenlp 2.8.1: QWenPretrainedModel (Qwen 1; its keys carry the
 * "qwen." prefix): c_attn's fused [q, k, v] weight and bias cut three
 * ways, mlp.w1 and w2 by columns, the projections and wte by rows,
 * whatever the vocabulary */
static const struct rule qwen[] = {
	{ "lm_head.weight", COL, WHOLE },
	{ "qwen.h.*.mlp.w2.weight", COL, 0 },
	{ "qwen.h.*.mlp.w1.weight", COL, 0 },
	{ "qwen.h.*.attn.c_attn.weight", SF_TP_COL3, 0 },
	{ "qwen.h.*.attn.c_attn.bias", SF_TP_COL3, 0 },
	{ "qwen.wte.weight", ROW, 0 },
	{ "qwen.h.*.mlp.c_proj.weight", ROW, 0 },
	{ "qwen.h.*.attn.c_proj.weight", ROW, 0 },
};

#undef COL
#undef ROW

static const struct sf_tp_model models[] = {
	{ "llama", llama, sizeof(llama) / sizeof(llama[0]) },
	{ "qwen2", qwen2, sizeof(qwen2) / sizeof(qwen2[0]) },
	{ "mistral", mistral, sizeof(mistral) / sizeof(mistral[0]) },
	{ "mixtral", mixtral, sizeof(mixtral) / sizeof(mixtral[0]) },
	{ "qwen", qwen, sizeof(qwen) / sizeof(qwen[0]) },
};

const char *sf_tp_model_types(void)
{
	return "llama, qwen2, mistral, mixtral, qwen";
}

const struct sf_tp_model *sf_tp_model_find(const char *mt)
{
	for (size_t i = 0; mt && i < sizeof(models) / sizeof(models[0]); i++)
		if (strcmp(models[i].type, mt) == 0)
			return &models[i];
	return NULL;
}

/* s ends with pattern p at a '.' (or is it), a '*' of p standing for
 * one or more digits (a layer's or an expert's number). */
static bool ends(const char *s, const char *p)
{
	size_t i = strlen(s), j = strlen(p);

	while (j > 0) {
		if (p[j - 1] == '*') {
			size_t k = i;

			while (k > 0 && s[k - 1] >= '0' && s[k - 1] <= '9')
				k--;
			if (k == i)
				return false;
			i = k;
		} else if (i == 0 || s[i - 1] != p[j - 1]) {
			return false;
		} else {
			i--;
		}
		j--;
	}
	return i == 0 || s[i - 1] == '.';
}

static bool holds(unsigned when, const struct sf_tp_cfg *c)
{
	uint64_t T = (uint64_t)c->degree;

	return (!(when & IF_VOCAB) || c->vocab % T == 0) &&
	       (!(when & IF_KV) || c->kv_heads % T == 0) &&
	       (!(when & IF_TIED) || c->tied) &&
	       (!(when & IF_UNTIED) || !c->tied);
}

enum sf_tp_axis sf_tp_axis_of(const struct sf_tp_model *m, const struct sf_tp_cfg *c,
			      const char *param)
{
	if (!m || c->degree <= 1)
		return SF_TP_NONE;
	for (size_t i = 0; i < m->n; i++) {
		const struct rule *r = &m->r[i];
		bool named = r->when & WHOLE ? strcmp(param, r->name) == 0 :
			     ends(param, r->name);

		if (named && holds(r->when, c))
			return r->ax;
	}
	return SF_TP_NONE;
}
