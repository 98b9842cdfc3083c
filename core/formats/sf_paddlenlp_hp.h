/*
 * sf_paddlenlp_hp.h - PaddleNLP's hybrid-parallel checkpoints (what its
 * Trainer saves with tensor, pipeline and sharding stage 1 parallelism,
 * paddlenlp 2.8.1) on the format seam, read-only.
 *
 * A checkpoint directory holds `model_state.SUFFIX.pdparams` per tensor
 * rank and pipeline stage (with save_sharded_model per sharding rank too,
 * each holding the parameters its sharding rank owns; in bf16 none that
 * has a master weight, whose states model_meta.json then names:
 * sf_paddlenlp_meta.h) and
 * `optimizer.SUFFIX.pdopt` per tensor rank, stage and sharding rank, SUFFIX the degrees above 1 of `tpXX`, `ppYY`,
 * `shardZZ` joined by `_` (no suffix at all on one card:
 * `model_state.pdparams`, `optimizer.pdopt`), and, with sharding, the
 * trainer's `model_meta.json`. Each is a `paddle.save` pickle: the model
 * file a dict structured name -> numpy array plus
 * `StructuredToParameterName@@` (structured -> paddle's static name); the
 * optimizer file a dict static state name (`linear_0.w_0_moment1_0`,
 * `..._fp32_master_0_moment1_0`) -> array, `master_weights` (static name
 * -> fp32 array), each array possibly wrapped as paddle's
 * `(builtins.tuple, ((name, array),))`.
 *
 * Shown as the unified checkpoint shows the same state (sf_paddlenlp.h):
 * every weight under its structured name, `optimizer/STATE/PARAM`,
 * `master_weights/PARAM`, whole: pipeline stages and save_sharded_model's
 * model files merged by name (a name in several: the first stage's,
 * lowest sharding rank's), sharding stage 1 (V1) states taken from the
 * sharding rank that holds them, V2's 1-D slices joined in sharding-rank
 * order (the padding cut; slices that do not add up to paddle's padded
 * size leave the state out with one line), tensor-parallel pieces
 * put together along the axis PaddleNLP's split functions cut them (the
 * rules of config.json's model_type, sf_paddlenlp_tp.h: llama, qwen2,
 * mistral, mixtral, qwen; its `tensor_parallel_degree` must agree with the files;
 * `gate_up_fused_proj` as [gate, up] halves per rank, Qwen's `c_attn`
 * as [q, k, v] thirds; a tied parameter's
 * states named by its last structured name), replicated ones served from tensor
 * rank 0 with the others kept as replicas. BF16 (stored as uint16) is
 * shown as BF16 where config.json says bfloat16.
 *
 * Not read: a tensor-parallel checkpoint of a model_type the table lacks (the
 * checkpoint left out with one line: the cut is in each model's Python
 * code, and paddlenlp 2.8.1 writes no param_meta), and, shown as root
 * files, expert parallelism's `moeZZ` files.
 *
 * PaddleNLP saves no checksums: every shard is unverified.
 */
#ifndef SF_PADDLENLP_HP_H
#define SF_PADDLENLP_HP_H

#include "sf_format.h"

#define SF_PADDLENLP_HP_FORMAT "paddlenlp-hybrid"

extern const struct sf_format sf_format_paddlenlp_hp;

#endif
