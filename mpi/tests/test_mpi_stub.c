/*
 * test_mpi_stub.c - the contract of sf_mpi_stub.c (MPI off): every entry
 * point fails with -SF_ENOMPI without touching anything, sf_mpi_source is
 * NULL, sf_mpi_built is 0 and sf_mpi_finalize(NULL) is a no-op.
 */
#include "sf_test.h"

#include "sf_error.h"
#include "sf_mpi.h"

#include <errno.h>
#include <string.h>

static int never_merge(void *arg, const char *ckpt, const char *const *parts,
		       const size_t *lens, int nparts, char **out,
		       size_t *outlen, char *err, size_t errlen)
{
	CHECK(!"the stub must not call merge");
	return -EIO;
}

int main(int argc, char **argv)
{
	struct sf_mpi *mp = (struct sf_mpi *)&argc; /* must not be touched */
	char *manifest = (char *)"x", err[128] = "";
	size_t mlen = 7;

	CHECK_EQ(sf_mpi_built(), 0);
	CHECK_EQ(sf_mpi_init(&argc, &argv, &mp), -SF_ENOMPI);
	CHECK(mp == NULL);
	CHECK_EQ(sf_mpi_rank(NULL), -SF_ENOMPI);
	CHECK_EQ(sf_mpi_size(NULL), -SF_ENOMPI);
	CHECK_EQ(sf_mpi_start(NULL, "/nonexistent", 0), -SF_ENOMPI);
	CHECK(sf_mpi_source(NULL) == NULL);
	CHECK_EQ(sf_mpi_commit(NULL, "step-1", "p", 1, never_merge, NULL, 1000,
			       &manifest, &mlen, err, sizeof(err)),
		 -SF_ENOMPI);
	CHECK(manifest == NULL);
	CHECK_EQ(mlen, 0);
	CHECK(strstr(err, "MPI") != NULL);
	err[0] = '\0';
	CHECK_EQ(sf_mpi_commit_done(NULL, "step-1", 0, 1000, err, sizeof(err)),
		 -SF_ENOMPI);
	CHECK(err[0] != '\0');
	err[0] = '\0';
	CHECK_EQ(sf_mpi_peers_up(NULL, err, sizeof(err)), -SF_ENOMPI);
	CHECK(err[0] != '\0');
	sf_mpi_set_notice(NULL, NULL, NULL);
	sf_mpi_set_read_timeout(NULL, 10);
	{
		struct sf_mpi_src_stats st;

		memset(&st, 0xff, sizeof(st));
		sf_mpi_source_stats(NULL, &st);
		CHECK_EQ(st.hints, 0);
		CHECK_EQ(st.claims, 0);
		CHECK_EQ(st.unused, 0);
	}
	CHECK_EQ(sf_mpi_notify(NULL, "deleted", "step-1"), -SF_ENOMPI);
	CHECK_EQ(sf_mpi_finalize(NULL), 0);
	CHECK(strcmp(sf_strerror(-SF_ENOMPI), sf_strerror(SF_ENOMPI)) == 0);
	return sf_test_done("test_mpi_stub");
}
