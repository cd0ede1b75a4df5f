/* Finds, loads and keeps the CUDA module (cuda_loader.h). */
#include <dlfcn.h>
#include <stdarg.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/env_internal.h"
#include "core/cuda_loader.h"
#include "core/error.h"
#include "core/log_internal.h"

#define LOADER_MESSAGE_MAX 1024

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static const fsdp2_cuda_module_t *loaded;
static char load_error[LOADER_MESSAGE_MAX];

static const fsdp2_cuda_host_t host = {
    .abi = FSDP2_CUDA_MODULE_ABI,
    .size = sizeof(fsdp2_cuda_host_t),
    .error = fsdp2_error,
    .error_set_message = fsdp2_error_set_message,
    .last_error = fsdp2_last_error,
    .status_name = fsdp2_status_name,
    .log_enabled = fsdp2_log_enabled,
    .log_write = fsdp2_log_write,
    .device_alloc = fsdp2_device_alloc,
    .dtype_size = fsdp2_dtype_size,
    .dtype_name = fsdp2_dtype_name,
    .f64_to_bf16 = fsdp2_f64_to_bf16,
    .f64_to_f16 = fsdp2_f64_to_f16,
};

/* Appends "; " and the formatted text to load_error (cut at its size). */
__attribute__((format(printf, 1, 2))) static void note(const char *fmt, ...)
{
    size_t used = strlen(load_error);
    if (used + 3 >= sizeof(load_error))
        return;
    if (used) {
        memcpy(load_error + used, "; ", 3);
        used += 2;
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(load_error + used, sizeof(load_error) - used, fmt, ap);
    va_end(ap);
}

/* Opens path and runs its init; 1 when the module is loaded, 0 with a note otherwise. */
static int try_load(const char *path)
{
    void *handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
        const char *why = dlerror();
        note("%s", why ? why : path);
        return 0;
    }
    fsdp2_cuda_module_init_fn init;
    *(void **)&init = dlsym(handle, FSDP2_CUDA_MODULE_INIT);
    if (!init) {
        note("%s has no %s: not a libfsdp2 CUDA module", path, FSDP2_CUDA_MODULE_INIT);
        dlclose(handle);
        return 0;
    }
    const fsdp2_cuda_module_t *module = NULL;
    fsdp2_status_t status = init(&host, &module);
    if (status == FSDP2_ERR_INVALID_STATE) {
        note("%s serves another copy of libfsdp2 in this process already (a program "
             "linked with libfsdp2.a and a library using libfsdp2.so?)",
             path);
        dlclose(handle);
        return 0;
    }
    if (status != FSDP2_SUCCESS || !module) {
        note("%s is from another build of libfsdp2: it refused this one's host table (module "
             "ABI %u)",
             path, FSDP2_CUDA_MODULE_ABI);
        dlclose(handle);
        return 0;
    }
    if (module->abi != FSDP2_CUDA_MODULE_ABI || module->size != sizeof(*module)) {
        note("%s is from another build of libfsdp2: module ABI %u with %u-byte tables, where "
             "this one has ABI %u with %zu-byte tables",
             path, module->abi, module->size, FSDP2_CUDA_MODULE_ABI, sizeof(*module));
        dlclose(handle);
        return 0;
    }
    loaded = module; /* the handle stays open for the process */
    FSDP2_LOG(INFO, INIT, "CUDA module: %s", path);
    return 1;
}

/* The directory of the object this function is in: libfsdp2.so's, or the program's when it
 * links the static library (where no module is, usually; the library path comes next). */
static int own_directory(char *dir, size_t len)
{
    Dl_info info;
    if (!dladdr((void *)own_directory, &info) || !info.dli_fname)
        return 0;
    const char *slash = strrchr(info.dli_fname, '/');
    if (!slash)
        return 0;
    size_t n = (size_t)(slash - info.dli_fname);
    if (n + 1 > len)
        return 0;
    memcpy(dir, info.dli_fname, n);
    dir[n] = '\0';
    return 1;
}

static void load(void)
{
    const char *env = fsdp2_env_text(FSDP2_ENV_CUDA_MODULE);
    if (env) {
        note("FSDP2_CUDA_MODULE='%s'", env);
        if (try_load(env))
            load_error[0] = '\0';
        return;
    }
    char dir[4096], path[4096 + sizeof(FSDP2_CUDA_MODULE_FILE) + 1];
    if (own_directory(dir, sizeof(dir))) {
        snprintf(path, sizeof(path), "%s/%s", dir, FSDP2_CUDA_MODULE_FILE);
        if (access(path, F_OK) == 0) {
            if (try_load(path))
                return;
        }
    }
    if (try_load(FSDP2_CUDA_MODULE_FILE))
        return;
    note("build libfsdp2 with CUDA (meson -Dcuda=enabled) and install %s beside "
         "libfsdp2.so, or name it in FSDP2_CUDA_MODULE",
         FSDP2_CUDA_MODULE_FILE);
}

fsdp2_status_t fsdp2_cuda_module_get(const fsdp2_cuda_module_t **module)
{
    pthread_once(&load_once, load);
    if (!loaded) /* at most 700 of its bytes: callers put a prefix of their own before it */
        return fsdp2_error(FSDP2_ERR_NOT_AVAILABLE, "the CUDA module could not be loaded: %.700s",
                           load_error);
    *module = loaded;
    return FSDP2_SUCCESS;
}
