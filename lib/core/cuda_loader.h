/* Loading the CUDA module (lib/cuda/cuda_module.h) at the first use of a cuda device or
 * an nccl group. */
#ifndef FSDP2_CORE_CUDA_LOADER_H
#define FSDP2_CORE_CUDA_LOADER_H

#include <fsdp2/status.h>

#include "cuda/cuda_module.h"

/* The CUDA module's entry points, loading it at the first call (thread-safe; the module
 * stays loaded). Where it is looked for, in order: the path in FSDP2_CUDA_MODULE when
 * set (and nothing else then), FSDP2_CUDA_MODULE_FILE in the directory of the libfsdp2.so
 * this code is in, and that name on the dynamic linker's search path. A failure is kept:
 * every later call fails with FSDP2_ERR_NOT_AVAILABLE and the same message, which names
 * what was tried and why each try failed (the module missing, or a library it links, the
 * CUDA runtime or NCCL, missing). */
fsdp2_status_t fsdp2_cuda_module_get(const fsdp2_cuda_module_t **module);

#endif
