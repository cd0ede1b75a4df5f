/* Versioned options structs (options.h). */
#include <stdio.h>
#include <string.h>

#include "core/error.h"
#include "core/options.h"

fsdp2_status_t fsdp2_options_copy(const char *what, void *dst, size_t dst_size, const void *src,
                                  const fsdp2_options_version_t *earlier, size_t n)
{
    unsigned given;
    memcpy(&given, src, sizeof(given));
    size_t bytes = given == dst_size ? dst_size : 0;
    for (size_t i = 0; !bytes && i < n; i++)
        if (given == earlier[i].size)
            bytes = earlier[i].bytes;
    if (!bytes) {
        char accepted[128];
        int at = snprintf(accepted, sizeof(accepted), "%zu", dst_size);
        for (size_t i = 0; i < n && at > 0 && (size_t)at < sizeof(accepted); i++)
            at += snprintf(accepted + at, sizeof(accepted) - (size_t)at, " or %u",
                           earlier[i].size);
        return fsdp2_error(FSDP2_ERR_INVALID_ARGUMENT,
                           "%s size %u is not one this library knows (%s; set it with the "
                           "struct's _INIT macro)",
                           what, given, accepted);
    }
    memcpy(dst, src, bytes);
    unsigned size = (unsigned)dst_size;
    memcpy(dst, &size, sizeof(size));
    return FSDP2_SUCCESS;
}
