/*
 * test_model_entry.c - sf_model_entry_check against the model builder.
 *
 * The writer's replay asks sf_model_entry_check whether a declaration
 * would be taken, without building a model (core/sf_model.h). The naive
 * model is the builder itself: for random entries (names from an alphabet
 * rich in what the rules refuse: '/', '.', '..', '@', control bytes, empty
 * components, names near and past SF_MAX_NAME; every dtype and invalid
 * ones; 0 to SF_MAX_NDIM + 1 dimensions; zero, small, huge and overflowing
 * sizes), tensors and root files, sf_model_entry_check must give exactly
 * what sf_model_add_tensor gives into a fresh empty model.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sf_box.h"
#include "sf_error.h"
#include "sf_model.h"
#include "sf_test.h"

#define PROG "test_model_entry"
#define CASES 200000

static const char *const pieces[] = {
	"a", "w", "layers", "0", "17", "weight", "model.embed_tokens",
	"/", "/", "/", ".", "..", "@", "-", "_", "~", " ", "\t", "\x01",
	"\x7f", "\xc3\xa9", "\xff", "tensors", "npy", "slices", "manifest.json",
	"model.safetensors", "//", "./", "/..", "x.npy", ":", "\\",
};

/* A random name of pieces, sometimes near SF_MAX_NAME bytes. */
static void rand_name(char *out, size_t cap)
{
	size_t n = 0, want;

	switch (sf_rand_below(8)) {
	case 0:
		want = 0;
		break;
	case 1:
		want = SF_MAX_NAME - 8 + sf_rand_below(16);
		break;
	default:
		want = 1 + sf_rand_below(40);
	}
	while (n < want && n + 1 < cap) {
		const char *p;
		size_t k;

		if (want > 100) {
			out[n++] = (char)('a' + sf_rand_below(26));
			continue;
		}
		p = pieces[sf_rand_below(sizeof(pieces) / sizeof(pieces[0]))];
		k = strlen(p);
		if (n + k + 1 > cap)
			break;
		memcpy(out + n, p, k);
		n += k;
	}
	out[n] = '\0';
}

static uint64_t rand_dim(void)
{
	switch (sf_rand_below(10)) {
	case 0:
		return 0;
	case 1:
		return UINT64_MAX - sf_rand_below(4);
	case 2:
		return (uint64_t)1 << (20 + sf_rand_below(44));
	case 3:
		return sf_rand();
	default:
		return 1 + sf_rand_below(4096);
	}
}

int main(void)
{
	static char name[SF_MAX_NAME + 64];
	unsigned long agree_ok = 0, agree_bad = 0;

	sf_test_seed(PROG, 4242);
	for (int i = 0; i < CASES; i++) {
		bool is_file = sf_rand_below(4) == 0;
		int dt = (int)sf_rand_below(SF_DT_COUNT + 2); /* invalid ones too */
		unsigned ndim = (unsigned)sf_rand_below(SF_MAX_NDIM + 2);
		uint64_t shape[SF_MAX_NDIM + 2];
		struct sf_model *m;
		struct sf_tensor *t = NULL;
		int want, got;

		if (is_file && sf_rand_below(2)) {
			dt = SF_DT_U8; /* what a root file is */
			ndim = 1;
		}
		rand_name(name, sizeof(name));
		for (unsigned d = 0; d < ndim; d++)
			shape[d] = rand_dim();
		m = sf_model_new("c", 1, 1u << 20);
		if (!CHECK(m != NULL))
			break;
		want = sf_model_add_tensor(m, is_file, name, (enum sf_dtype)dt,
					   ndim, shape, &t);
		got = sf_model_entry_check(is_file, name, (enum sf_dtype)dt, ndim,
					   shape);
		if (!CHECK_EQ(got, want))
			fprintf(stderr, "  case %d: %s '%s' dtype %d ndim %u: builder %d (%s), check %d\n",
				i, is_file ? "file" : "tensor", name, dt, ndim,
				want, sf_model_why(m), got);
		if (want == 0)
			agree_ok++;
		else
			agree_bad++;
		sf_model_destroy(m);
	}
	/* both answers were exercised, not only refusals */
	CHECK(agree_ok > CASES / 50);
	CHECK(agree_bad > CASES / 50);
	printf("%s: %lu entries taken, %lu refused\n", PROG, agree_ok, agree_bad);
	return sf_test_done(PROG);
}
