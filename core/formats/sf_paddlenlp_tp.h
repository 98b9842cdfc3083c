/*
 * sf_paddlenlp_tp.h - how PaddleNLP cuts each model's parameters across
 * tensor-parallel ranks: its models' `_get_tensor_parallel_mappings`
 * rules as a data table keyed by config.json's `model_type`.
 *
 * Each model's rules name a parameter by the end of its structured name
 * (at a '.': "self_attn.q_proj.weight" matches
 * "llama.layers.3.self_attn.q_proj.weight"; a '*' stands for a
 * layer's or an expert's number) or, where PaddleNLP keys it
 * without a prefix, by the whole name ("lm_head.weight"); the first rule
 * whose name and conditions hold gives the axis, none: replicated. The
 * conditions are PaddleNLP's: vocab_size divisible by the degree (else
 * the embeddings and lm_head stay whole), num_key_value_heads divisible
 * (else k_proj and v_proj stay whole), tie_word_embeddings (Qwen2's
 * lm_head then cut like the embedding). Rows, and the PaddleNLP release
 * each was read from, are in sf_paddlenlp_tp.c.
 *
 * Everything here is static data or a pure function: nothing to free.
 */
#ifndef SF_PADDLENLP_TP_H
#define SF_PADDLENLP_TP_H

#include <stdbool.h>
#include <stdint.h>

/* The axis a parameter is cut along: SF_TP_COL the last (column linear:
 * is_column=True; a 1-D bias its only one), SF_TP_ROW the first (row
 * linear, vocabulary embedding), SF_TP_COL2 the last as PaddleNLP's
 * is_naive_2fuse cuts a fused [gate, up] (rank r holds [gate_r, up_r]),
 * SF_TP_COL3 as is_naive_3fuse cuts a fused [q, k, v] (rank r holds
 * [q_r, k_r, v_r]). */
enum sf_tp_axis { SF_TP_NONE, SF_TP_COL, SF_TP_ROW, SF_TP_COL2, SF_TP_COL3 };

/* What config.json says that the rules depend on. */
struct sf_tp_cfg {
	int degree;                  /* tensor_parallel_degree (> 0) */
	uint64_t vocab;              /* vocab_size */
	uint64_t kv_heads;           /* num_key_value_heads, else num_attention_heads */
	bool tied;                   /* tie_word_embeddings */
};

struct sf_tp_model;

/* The rules of model_type mt, or NULL when shardfs does not know how
 * PaddleNLP cuts it. Static. */
const struct sf_tp_model *sf_tp_model_find(const char *mt);

/* The axis model m's rules cut parameter param (a structured name) along
 * under config c; SF_TP_NONE when degree is 1 or no rule holds. */
enum sf_tp_axis sf_tp_axis_of(const struct sf_tp_model *m, const struct sf_tp_cfg *c,
			      const char *param);

/* The model types the table knows, comma-separated (for messages and
 * docs tests). Static. */
const char *sf_tp_model_types(void);

#endif
