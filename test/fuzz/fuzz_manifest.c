/*
 * fuzz_manifest.c - libFuzzer target for the manifest parser.
 *
 * For any input: sf_manifest_parse either fails with a documented code
 * (-SF_EMANIFEST, -SF_EGAP, -SF_ETOOBIG, -ENOMEM), no manifest and a
 * non-empty one-line message, or succeeds with a manifest that
 *   - dumps, and re-parses to a field-by-field identical manifest whose
 *     dump is byte-identical to the first;
 *   - finds each of its tensors and files by name;
 *   - gives a shards JSON for every tensor and file;
 *   - passes its own coverage check again.
 * sf_manifest_parse_shown (a mount's manifest.json, any format) gets the
 * same input: it fails with the same codes, or its model dumps and
 * re-parses (shown) to a byte-identical dump, and dumps with the input's
 * other top-level keys as extra keys (sf_manifest_dump_extra) to JSON
 * that shows each of them as given and reads back to the same model.
 * Any violation aborts (a crash for libFuzzer and for the replay driver).
 * The input is not NUL-terminated, so an over-read shows under ASan.
 */
#include <errno.h>
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "manifest_cmp.h"
#include "sf_error.h"
#include "sf_manifest.h"
#include "sf_log.h"
#include "sf_model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

const char fuzz_target[] = "fuzz_manifest";

static void check_tensor(const struct sf_model *m, const struct sf_tensor *t,
			 bool is_file)
{
	char err[512], *js = NULL;
	size_t len = 0;
	const struct sf_tensor *f = is_file ? sf_model_find_file(m, t->name)
					    : sf_model_find(m, t->name);
	if (f != t)
		fuzz_die("find did not return the entry", t->name);
	if (sf_manifest_shards_json(t, &js, &len) != 0 || !js || strlen(js) != len)
		fuzz_die("shards json failed", t->name);
	free(js);
	if (sf_tensor_check_coverage(t, err, sizeof(err)) != 0)
		fuzz_die("coverage changed its mind", err);
}

/*
 * The input's other top-level keys (what jansson reads of it) as the
 * extra of a dump of its model m (the seam's one dump of a foreign
 * checkpoint, HF's "hf" block): every one shown after the model's with
 * the same value, the model's part unchanged (d1, the plain dump), the
 * text read back by the shown parser. A key of the manifest's own is
 * refused.
 */
static void check_extra(const uint8_t *data, size_t size,
			const struct sf_model *m, const char *d1, size_t l1)
{
	json_t *in = json_loadb((const char *)data, size, JSON_REJECT_DUPLICATES, NULL);
	json_t *extra = json_object(), *back, *v;
	struct sf_model *m3 = NULL;
	char err[512], *dx = NULL, *d3 = NULL, *d4 = NULL;
	size_t lx = 0, l3 = 0;
	const char *key;
	int rc;

	if (!extra)
		fuzz_die("out of memory", NULL);
	json_object_foreach(in, key, v) {
		if (strcmp(key, "format") && strcmp(key, "name") &&
		    strcmp(key, "world_size") && strcmp(key, "block_size") &&
		    strcmp(key, "tensors") && strcmp(key, "files") &&
		    strcmp(key, "objects") && json_object_set(extra, key, v))
			fuzz_die("out of memory", NULL);
	}
	rc = sf_manifest_dump_extra(m, extra, &dx, &lx);
	if (rc == -SF_ETOOBIG)
		goto out_put;
	if (rc || !dx || strlen(dx) != lx)
		fuzz_die("dump with extra failed", sf_strerror(rc));
	if (json_object_size(extra) == 0 && (lx != l1 || memcmp(dx, d1, l1) != 0))
		fuzz_die("an empty extra changed the dump", m->name);
	if (lx < l1 || memcmp(dx, d1, l1 - 3) != 0) /* d1 ends "\n}\n" */
		fuzz_die("the extra changed the model's part", m->name);
	back = json_loadb(dx, lx, JSON_REJECT_DUPLICATES, NULL);
	if (!back)
		fuzz_die("dump with extra is no JSON", m->name);
	json_object_foreach(extra, key, v)
		if (!json_equal(json_object_get(back, key), v))
			fuzz_die("an extra key not shown as given", key);
	json_decref(back);
	if (sf_manifest_parse_shown(dx, lx, &m3, err, sizeof(err)) != 0 ||
	    sf_manifest_dump(m3, &d3, &l3) != 0 || l3 != l1 || memcmp(d3, d1, l1) != 0)
		fuzz_die("dump with extra does not read back", err);
	/* a key of the manifest's own is refused */
	if (json_object_set_new(extra, "tensors", json_true()) ||
	    sf_manifest_dump_extra(m, extra, &d4, NULL) != -EINVAL || d4)
		fuzz_die("an extra key named \"tensors\" was not refused", NULL);
	free(d3);
	sf_model_destroy(m3);
	free(dx);
out_put:
	json_decref(extra);
	json_decref(in);
}

static void check_shown(const uint8_t *data, size_t size)
{
	char err[512], *d1 = NULL, *d2 = NULL;
	struct sf_model *m = NULL, *m2 = NULL;
	size_t l1 = 0, l2 = 0;
	int rc = sf_manifest_parse_shown((const char *)data, size, &m, err, sizeof(err));

	if (rc < 0) {
		if (m)
			fuzz_die("failed shown parse returned a manifest", err);
		if (rc != -SF_EMANIFEST && rc != -SF_EGAP && rc != -SF_ETOOBIG && rc != -ENOMEM)
			fuzz_die("shown: undocumented error", sf_strerror(rc));
		fuzz_check_message(err, sizeof(err));
		return;
	}
	if (sf_manifest_dump(m, &d1, &l1) != 0 ||
	    sf_manifest_parse_shown(d1, l1, &m2, err, sizeof(err)) != 0)
		fuzz_die("shown dump does not re-parse", err);
	if (sf_manifest_dump(m2, &d2, &l2) != 0 || l1 != l2 || memcmp(d1, d2, l1) != 0)
		fuzz_die("shown: second dump differs", m->name);
	check_extra(data, size, m, d1, l1);
	free(d2);
	free(d1);
	sf_model_destroy(m2);
	sf_model_destroy(m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char err[512], err2[512], why[256];
	struct sf_model *m = NULL, *m2 = NULL;
	char *d1 = NULL, *d2 = NULL;
	size_t l1 = 0, l2 = 0;

	check_shown(data, size);
	fuzz_poison(err, sizeof(err));
	int rc = sf_manifest_parse((const char *)data, size, &m, err, sizeof(err));
	if (rc < 0) {
		if (m)
			fuzz_die("failed parse returned a manifest", err);
		if (rc != -SF_EMANIFEST && rc != -SF_EGAP && rc != -SF_ETOOBIG && rc != -ENOMEM)
			fuzz_die("undocumented error", sf_strerror(rc));
		fuzz_check_message(err, sizeof(err));
		return 0;
	}
	if (rc != 0 || !m)
		fuzz_die("parse returned neither an error nor a manifest", NULL);
	if (sf_manifest_dump(m, &d1, &l1) != 0 || strlen(d1) != l1)
		fuzz_die("dump failed", m->name);
	if (sf_manifest_parse(d1, l1, &m2, err2, sizeof(err2)) != 0)
		fuzz_die("dump does not re-parse", err2);
	if (!manifest_equal(m, m2, why, sizeof(why)))
		fuzz_die("parse(dump(m)) != m", why);
	if (sf_manifest_dump(m2, &d2, &l2) != 0 || l1 != l2 || memcmp(d1, d2, l1) != 0)
		fuzz_die("second dump differs", m->name);
	for (size_t i = 0; i < m->ntensors; i++)
		check_tensor(m, &m->tensors[i], false);
	for (size_t i = 0; i < m->nfiles; i++)
		check_tensor(m, &m->files[i], true);
	free(d2);
	free(d1);
	sf_model_destroy(m2);
	sf_model_destroy(m);
	return 0;
}
