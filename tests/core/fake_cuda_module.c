/* A stand-in for the CUDA module (lib/cuda/cuda_module.h) that answers with tables of
 * another build: the loader must refuse it and name both sides. FAKE_MODULE_REFUSES
 * makes its init refuse the host's table instead. */
#include "cuda/cuda_module.h"

#ifndef FAKE_MODULE_REFUSES
static const fsdp2_cuda_module_t other_build = {
    .abi = FSDP2_CUDA_MODULE_ABI + 1,
    .size = sizeof(fsdp2_cuda_module_t) + 8,
};
#endif

__attribute__((visibility("default"))) fsdp2_status_t
fsdp2_cuda_module_init(const fsdp2_cuda_host_t *host, const fsdp2_cuda_module_t **module)
{
#ifdef FAKE_MODULE_REFUSES
    (void)host;
    (void)module;
    return FSDP2_ERR_NOT_AVAILABLE;
#else
    (void)host;
    *module = &other_build;
    return FSDP2_SUCCESS;
#endif
}
