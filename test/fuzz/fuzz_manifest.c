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
 * re-parses (shown) to a byte-identical dump.
 * Any violation aborts (a crash for libFuzzer and for the replay driver).
 * The input is not NUL-terminated, so an over-read shows under ASan.
 */
#include <errno.h>
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
