/*
 * backend_nocuda.c — the CUDA entry points of a build made without nvcc
 * (or with CUDA=0): the backend reports that it was not compiled in.
 */
#include "backend.h"
#include "util.h"

int
g4_backend_cuda_available(void)
{
	return 0;
}

int
g4_backend_cuda_create(int device, g4_backend **out, g4_err *err)
{
	*out = NULL;
	return g4_fail(err, G4_ERR_UNSUPPORTED,
				   "this build has no CUDA backend (built without nvcc); use the cpu backend");
}
