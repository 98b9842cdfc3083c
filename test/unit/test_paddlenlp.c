/*
 * test_paddlenlp.c - the PaddleNLP unified checkpoint adapter
 * (core/formats/sf_paddlenlp.c) without a mount: its probe on listings
 * (names only: complete, being written, not its own), the adapter table's
 * choice between it and the Hugging Face adapter, and an open of the
 * committed bf16 fixture paddlenlp 2.8.1 wrote (test/fixtures/paddlenlp)
 * through the seam: the tensors' names, dtypes (U16 shown as BF16) and
 * shards, and the root files; and the hybrid-parallel adapter's split
 * rules per model_type (core/formats/sf_paddlenlp_tp.c) against
 * PaddleNLP's _get_tensor_parallel_mappings conditions.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "sf_error.h"
#include "sf_format.h"
#include "sf_formats.h"
#include "sf_model.h"
#include "sf_paddlenlp.h"
#include "sf_paddlenlp_hp.h"
#include "sf_paddlenlp_tp.h"
#include "sf_test.h"

#define NMAX 10

struct lname {
	char name[96];
	bool dir;
};

static int cmp_lname(const void *a, const void *b)
{
	return strcmp(((const struct lname *)a)->name, ((const struct lname *)b)->name);
}

/* The listing of names (NULL-terminated; "x/" a directory) probed by f,
 * or (f NULL) the table's choice into *chosen. */
static enum sf_probe probe(const struct sf_format *f, const char *const *names,
			   const struct sf_format **chosen)
{
	struct sf_dirlist ls = { 0 };
	struct lname l[NMAX];
	char *v[NMAX];
	bool d[NMAX];
	enum sf_probe how;

	while (ls.n < NMAX && names[ls.n]) {
		size_t n = strlen(names[ls.n]);

		snprintf(l[ls.n].name, sizeof(l[ls.n].name), "%s", names[ls.n]);
		l[ls.n].dir = n && names[ls.n][n - 1] == '/';
		if (l[ls.n].dir)
			l[ls.n].name[n - 1] = '\0';
		ls.n++;
	}
	qsort(l, ls.n, sizeof(*l), cmp_lname);
	for (size_t i = 0; i < ls.n; i++) {
		v[i] = l[i].name;
		d[i] = l[i].dir;
	}
	ls.names = v;
	ls.is_dir = d;
	if (f)
		return f->probe(&ls);
	*chosen = sf_format_probe(&ls, &how);
	return how;
}

#define MI "model.safetensors.index.json"
#define OI "optimizer.safetensors.index.json"
#define WI "master_weights.safetensors.index.json"
#define M1 "model-00001-of-00001.safetensors"
#define O1 "optimizer-00001-of-00001.safetensors"
#define W1 "master_weights-00001-of-00001.safetensors"

static void test_probe(void)
{
	static const struct {
		enum sf_probe want;
		const char *table;  /* the format the table picks, or NULL */
		const char *names[NMAX];
	} cases[] = {
		{ SF_PROBE_YES, SF_PADDLENLP_FORMAT, { "config.json", MI, M1, OI, O1, WI, W1 } },
		{ SF_PROBE_YES, SF_PADDLENLP_FORMAT, { MI, M1, OI, O1 } }, /* fp32: no master */
		{ SF_PROBE_YES, SF_PADDLENLP_FORMAT,
		  { MI, "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
		    OI, "optimizer-00001-of-00002.safetensors",
		    "optimizer-00002-of-00002.safetensors" } },
		/* the model alone: Hugging Face weights */
		{ SF_PROBE_NO, "hf", { "config.json", MI, M1 } },
		/* the optimizer's files being written: not complete (HF shows
		 * the model's weights meanwhile) */
		{ SF_PROBE_PARTIAL, "hf", { MI, M1, OI, "optimizer-00001-of-00002.safetensors" } },
		{ SF_PROBE_PARTIAL, "hf", { MI, M1, O1 } },            /* no optimizer index yet */
		/* no model index: HF takes the first index it finds (its rule) */
		{ SF_PROBE_PARTIAL, "hf", { OI, O1, WI, W1 } },
		{ SF_PROBE_PARTIAL, "hf", { MI, M1, OI, O1, "optimizer-00002-of-00003.safetensors" } },
		{ SF_PROBE_NO, NULL, { "config.json" } },
		{ SF_PROBE_NO, "hf", { MI, M1, "optimizer-0001-of-0001.safetensors" } },
		{ SF_PROBE_NO, "hf", { MI, M1, "optimizer-00001-of-00001.safetensors/" } },
		{ SF_PROBE_NO, NULL, { NULL } },
	};

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		const struct sf_format *f = sf_format_find(SF_PADDLENLP_FORMAT), *t = NULL;

		if (!CHECK(f) || !CHECK_EQ(probe(f, cases[i].names, NULL), cases[i].want))
			fprintf(stderr, "  probe case %zu\n", i);
		probe(NULL, cases[i].names, &t);
		if (!CHECK(cases[i].table ? t && strcmp(t->name, cases[i].table) == 0 : !t))
			fprintf(stderr, "  table case %zu: %s\n", i, t ? t->name : "(none)");
	}
}

/* The hybrid-parallel adapter's probe: the trainer's file names, complete
 * grids of tensor ranks x stages (x sharding ranks for the optimizer). */
static void test_probe_hp(void)
{
	static const struct {
		enum sf_probe want;
		const char *names[NMAX];
	} cases[] = {
		{ SF_PROBE_YES, { "model_state.pdparams", "optimizer.pdopt", "config.json" } },
		{ SF_PROBE_YES, { "model_state.tp00.pdparams", "model_state.tp01.pdparams",
				  "optimizer.tp00.pdopt", "optimizer.tp01.pdopt" } },
		{ SF_PROBE_YES, { "model_state.tp00_pp00.pdparams", "model_state.tp00_pp01.pdparams",
				  "optimizer.tp00_pp00_shard00.pdopt", "optimizer.tp00_pp01_shard00.pdopt",
				  "optimizer.tp00_pp00_shard01.pdopt", "optimizer.tp00_pp01_shard01.pdopt" } },
		{ SF_PROBE_YES, { "model_state.pp00.pdparams", "model_state.pp01.pdparams" } },
		{ SF_PROBE_YES, { "model_state.pdparams", "optimizer.shard00.pdopt",
				  "optimizer.shard01.pdopt" } },
		/* a rank's file not there yet */
		{ SF_PROBE_PARTIAL, { "model_state.tp01.pdparams", "optimizer.tp00.pdopt",
				      "optimizer.tp01.pdopt" } },
		{ SF_PROBE_PARTIAL, { "model_state.tp00.pdparams", "model_state.tp01.pdparams",
				      "optimizer.tp01.pdopt" } },
		{ SF_PROBE_PARTIAL, { "model_state.pdparams", "optimizer.shard01.pdopt" } },
		{ SF_PROBE_PARTIAL, { "model_state.tp00.pdparams", "model_state.pp00.pdparams" } },
		{ SF_PROBE_NO, { "optimizer.tp00.pdopt" } },
		{ SF_PROBE_NO, { "model_state.tp0.pdparams", "model_state.pp00_tp00.pdparams",
				 "model_state.tp00_.pdparams", "model_state..pdparams",
				 "model_state.tp00pp00.pdparams", "model_state.tp00.pdparams/" } },
		/* save_sharded_model: every sharding rank's model file */
		{ SF_PROBE_YES, { "model_state.tp00_shard00.pdparams", "model_state.tp00_shard01.pdparams",
				  "optimizer.tp00_shard00.pdopt", "optimizer.tp00_shard01.pdopt" } },
		{ SF_PROBE_PARTIAL, { "model_state.tp00_shard01.pdparams",
				      "optimizer.tp00_shard00.pdopt", "optimizer.tp00_shard01.pdopt" } },
		{ SF_PROBE_PARTIAL, { "model_state.tp00_shard00.pdparams" } },
		{ SF_PROBE_NO, { "scheduler.pdparams", "config.json" } },
	};

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
		if (!CHECK_EQ(probe(&sf_format_paddlenlp_hp, cases[i].names, NULL), cases[i].want))
			fprintf(stderr, "  hybrid probe case %zu\n", i);
}

static const struct sf_tensor *find(const struct sf_model *m, const char *name)
{
	for (size_t i = 0; i < m->ntensors; i++)
		if (strcmp(m->tensors[i].name, name) == 0)
			return &m->tensors[i];
	return NULL;
}

static void test_open(const char *fixtures)
{
	char dir[1024], err[512] = "";
	struct sf_format_result res = { 0 };
	struct sf_cdir cd = { .name = "bf16" };
	const struct sf_tensor *t;
	int dfd, rc;

	snprintf(dir, sizeof(dir), "%s/paddlenlp-2.8.1/bf16", fixtures);
	dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (!CHECK(dfd >= 0))
		return;
	cd.dirfd = dfd;
	cd.dir = dir;
	cd.ref.dir = dir;
	cd.ref.name = "bf16";
	rc = sf_format_open(&sf_format_paddlenlp, &cd, &res, err, sizeof(err));
	if (!CHECK_EQ(rc, 0)) {
		fprintf(stderr, "  open: %s\n", err);
		goto out_close;
	}
	CHECK(strcmp(res.model->format, SF_PADDLENLP_FORMAT) == 0);
	/* 21 weights, 4 states of each, 21 master weights */
	CHECK_EQ(res.model->ntensors, (size_t)(21 * 6));
	t = find(res.model, "llama.embed_tokens.weight");
	if (CHECK(t)) {
		CHECK_EQ(t->dtype, SF_DT_BF16);
		CHECK_EQ(t->ndim, 2u);
		CHECK_EQ(t->shape[0], 64u);
		CHECK_EQ(t->nshards, 1u);
		CHECK(strcmp(t->shards[0].file, "model-00001-of-00001.safetensors") == 0);
	}
	t = find(res.model, "optimizer/moment2_0/llama.layers.1.mlp.down_proj.weight");
	CHECK(t && t->dtype == SF_DT_F32 && t->shape[0] == 32 && t->shape[1] == 16);
	t = find(res.model, "master_weights/lm_head.weight");
	CHECK(t && t->dtype == SF_DT_F32 && t->nshards == 1 &&
	      strcmp(t->shards[0].file, "master_weights-00001-of-00001.safetensors") == 0);
	CHECK(!find(res.model, "llama.embed_tokens.weight/moment1_0"));
	CHECK(res.extra != NULL);
	/* config.json a root file; the indexes and weight files not */
	CHECK(res.model->nfiles == 1 && strcmp(res.model->files[0].name, "config.json") == 0);
	sf_format_result_clear(&res);
out_close:
	close(dfd);
}

/* The split-rule table: each row's conditions as PaddleNLP writes them. */
static void test_tp_rules(void)
{
	static const struct {
		const char *mt, *param;
		int T;
		uint64_t vocab, kv;
		bool tied;
		enum sf_tp_axis want;
	} cases[] = {
		{ "llama", "lm_head.weight", 2, 64, 4, false, SF_TP_COL },
		{ "llama", "lm_head.weight", 2, 63, 4, false, SF_TP_NONE },
		{ "llama", "llama.embed_tokens.weight", 2, 63, 4, false, SF_TP_NONE },
		{ "llama", "llama.layers.0.self_attn.k_proj.weight", 2, 64, 3, false, SF_TP_NONE },
		{ "llama", "llama.layers.0.self_attn.k_proj.weight", 2, 64, 4, false, SF_TP_COL },
		{ "llama", "llama.layers.0.mlp.gate_up_fused_proj.weight", 2, 64, 4, false, SF_TP_COL2 },
		{ "llama", "llama.layers.0.self_attn.q_proj.bias", 2, 64, 4, false, SF_TP_NONE },
		{ "llama", "llama.layers.0.self_attn.q_proj.weight", 1, 64, 4, false, SF_TP_NONE },
		{ "llama", "llama.layers.0.xself_attn.q_proj.weight", 2, 64, 4, false, SF_TP_NONE },
		{ "llama", "x.lm_head.weight", 2, 64, 4, false, SF_TP_NONE },
		{ "qwen2", "lm_head.weight", 2, 64, 2, false, SF_TP_COL },
		{ "qwen2", "lm_head.weight", 2, 64, 2, true, SF_TP_ROW },
		{ "qwen2", "lm_head.weight", 2, 63, 2, true, SF_TP_NONE },
		{ "qwen2", "qwen2.layers.1.self_attn.q_proj.bias", 2, 64, 2, false, SF_TP_COL },
		{ "qwen2", "qwen2.layers.1.self_attn.v_proj.bias", 2, 64, 1, false, SF_TP_NONE },
		{ "qwen2", "qwen2.layers.1.self_attn.qkv_proj.bias", 2, 64, 1, false, SF_TP_COL },
		{ "qwen2", "qwen2.layers.1.self_attn.o_proj.bias", 2, 64, 2, false, SF_TP_NONE },
		{ "mistral", "lm_head.weight", 2, 63, 1, false, SF_TP_COL },
		{ "mistral", "mistral.embed_tokens.weight", 2, 63, 1, false, SF_TP_ROW },
		{ "mistral", "mistral.layers.0.self_attn.k_proj.weight", 2, 64, 1, false, SF_TP_NONE },
		{ "mistral", "mistral.layers.0.mlp.down_proj.weight", 2, 64, 1, false, SF_TP_ROW },
		{ "mistral", "mistral.layers.0.self_attn.q_proj.bias", 2, 64, 1, false, SF_TP_NONE },
		{ "mixtral", "mixtral.layers.0.block_sparse_moe.experts.0.w1.weight", 2, 64, 2, false, SF_TP_COL },
		{ "mixtral", "mixtral.layers.0.block_sparse_moe.experts.17.w2.weight", 2, 64, 2, false, SF_TP_ROW },
		{ "mixtral", "mixtral.layers.0.block_sparse_moe.experts.x.w2.weight", 2, 64, 2, false, SF_TP_NONE },
		{ "mixtral", "mixtral.layers.0.block_sparse_moe.experts..w3.weight", 2, 64, 2, false, SF_TP_NONE },
		{ "mixtral", "block_sparse_moe.experts.3.w3.weight", 2, 64, 2, false, SF_TP_COL },
		{ "mixtral", "mixtral.layers.0.xblock_sparse_moe.experts.3.w3.weight", 2, 64, 2, false, SF_TP_NONE },
		{ "mixtral", "mixtral.layers.0.block_sparse_moe.gate.weight", 2, 64, 2, false, SF_TP_NONE },
		{ "mixtral", "lm_head.weight", 2, 63, 2, false, SF_TP_NONE },
		{ "qwen", "qwen.h.11.attn.c_attn.weight", 2, 64, 4, false, SF_TP_COL3 },
		{ "qwen", "qwen.h.0.attn.c_attn.bias", 2, 64, 4, false, SF_TP_COL3 },
		{ "qwen", "qwen.h.0.mlp.c_proj.weight", 2, 64, 4, false, SF_TP_ROW },
		{ "qwen", "qwen.h.0.mlp.w2.weight", 2, 64, 4, false, SF_TP_COL },
		{ "qwen", "qwen.wte.weight", 2, 63, 4, false, SF_TP_ROW },
		{ "qwen", "lm_head.weight", 2, 63, 4, false, SF_TP_COL },
		{ "qwen", "qwen.h.0.ln_1.weight", 2, 64, 4, false, SF_TP_NONE },
		{ "qwen", "qwen.h.a.attn.c_attn.weight", 2, 64, 4, false, SF_TP_NONE },
	};

	CHECK(!sf_tp_model_find("gpt"));
	CHECK(!sf_tp_model_find(NULL));
	CHECK(!sf_tp_model_find("llam"));
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		const struct sf_tp_model *m = sf_tp_model_find(cases[i].mt);
		struct sf_tp_cfg c = { cases[i].T, cases[i].vocab, cases[i].kv, cases[i].tied };

		if (!CHECK(m) || !CHECK_EQ(sf_tp_axis_of(m, &c, cases[i].param), cases[i].want))
			fprintf(stderr, "  case %zu: %s %s\n", i, cases[i].mt, cases[i].param);
	}
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: test_paddlenlp FIXTURES_PADDLENLP_DIR\n");
		return 2;
	}
	test_probe();
	test_probe_hp();
	test_tp_rules();
	test_open(argv[1]);
	return sf_test_done("test_paddlenlp");
}
