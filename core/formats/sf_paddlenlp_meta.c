/*
 * sf_paddlenlp_meta.c - model_meta.json's name tables (sf_paddlenlp_meta.h).
 *
 * Invariants:
 *  - reads only model_meta.json beneath the checkpoint, at most
 *    SF_PNLP_META_MAX_BYTES; keeps at most SF_PNLP_META_MAX_NAMES pairs;
 *  - a "sharding_metas" key other than tpXX_ppYY (two digits each) or a
 *    mapping value that is not a string is skipped, never guessed;
 *  - the pairs borrow their strings from the parsed JSON, which m owns.
 */
#include "sf_paddlenlp_meta.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sf_array.h"
#include "sf_error.h"

struct sf_pnlp_meta_pair {
	int tp, pp;
	const char *sn, *st;
};

static int cmp_pair(const void *a, const void *b)
{
	const struct sf_pnlp_meta_pair *x = a, *y = b;

	if (x->tp != y->tp)
		return x->tp < y->tp ? -1 : 1;
	if (x->pp != y->pp)
		return x->pp < y->pp ? -1 : 1;
	return strcmp(x->sn, y->sn);
}

/* "tp03_pp01" -> 3, 1 */
static int parse_key(const char *k, int *tp, int *pp)
{
	if (strlen(k) != 9 || strncmp(k, "tp", 2) || strncmp(k + 4, "_pp", 3))
		return -1;
	for (int i = 2; i < 9; i += (i == 3 ? 4 : 1))
		if (k[i] < '0' || k[i] > '9')
			return -1;
	*tp = (k[2] - '0') * 10 + (k[3] - '0');
	*pp = (k[7] - '0') * 10 + (k[8] - '0');
	return 0;
}

int sf_pnlp_meta_load(const struct sf_cdir *cd, struct sf_pnlp_meta *m,
		      char *why, size_t whylen)
{
	struct sf_cfile cf;
	char *text = NULL;
	size_t len = 0, cap = 0;
	json_error_t je;
	json_t *root, *metas, *one;
	const char *key;
	int rc;

	memset(m, 0, sizeof(*m));
	rc = sf_cfile_open(cd, "model_meta.json", &cf);
	if (rc == -ENOENT)
		return 0;
	if (rc)
		return rc;
	rc = sf_cfile_read_all(&cf, SF_PNLP_META_MAX_BYTES, &text, &len);
	sf_cfile_close(&cf);
	if (rc)
		return rc;
	root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
	free(text);
	if (!root) {
		snprintf(why, whylen, "model_meta.json: %s", je.text);
		return -SF_EFORMAT;
	}
	m->root = root;
	metas = json_object_get(root, "sharding_metas");
	if (!json_is_object(metas)) {
		snprintf(why, whylen, "model_meta.json: no sharding_metas object");
		return -SF_EFORMAT;
	}
	json_object_foreach(metas, key, one) {
		json_t *map = json_object_get(one, "structure_name_mapping"), *v;
		const char *st;
		int tp, pp;

		if (parse_key(key, &tp, &pp) || !json_is_object(map))
			continue;
		json_object_foreach(map, st, v) {
			if (!json_is_string(v))
				continue;
			rc = sf_array_grow(&m->pairs, m->n, &cap, sizeof(*m->pairs), 64,
					   SF_PNLP_META_MAX_NAMES);
			if (rc) {
				snprintf(why, whylen, "model_meta.json: more than %u names",
					 SF_PNLP_META_MAX_NAMES);
				return rc;
			}
			m->pairs[m->n++] = (struct sf_pnlp_meta_pair){ tp, pp,
				json_string_value(v), st };
		}
	}
	if (m->n > 1)
		qsort(m->pairs, m->n, sizeof(*m->pairs), cmp_pair);
	return 0;
}

const char *sf_pnlp_meta_struct(const struct sf_pnlp_meta *m, int tp, int pp,
				const char *sn)
{
	struct sf_pnlp_meta_pair k = { tp < 0 ? 0 : tp, pp < 0 ? 0 : pp, sn, NULL }, *p;

	if (!m->n)
		return NULL;
	p = bsearch(&k, m->pairs, m->n, sizeof(*m->pairs), cmp_pair);
	return p ? p->st : NULL;
}

void sf_pnlp_meta_free(struct sf_pnlp_meta *m)
{
	free(m->pairs);
	json_decref(m->root);
	memset(m, 0, sizeof(*m));
}
