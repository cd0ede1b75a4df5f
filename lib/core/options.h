/* Versioned options structs. Every public options struct starts with `unsigned size`,
 * which its FSDP2_*_INIT macro sets to sizeof at the application's build. A struct only
 * ever grows at its end, so an application built against an older header passes an
 * older, smaller size: the fields it knows are taken and the rest keep their defaults.
 * A size this library does not know (a newer header's, or garbage) is refused. */
#ifndef FSDP2_CORE_OPTIONS_H
#define FSDP2_CORE_OPTIONS_H

#include <stddef.h>

#include <fsdp2/status.h>

/* An earlier version of a struct: the size it had, and how many leading bytes of the
 * current struct its fields fill (its size, or less where its tail padding is now a
 * field). */
typedef struct fsdp2_options_version {
    unsigned size;
    size_t bytes;
} fsdp2_options_version_t;

/* Copies the user's src over dst, which holds the defaults (dst_size bytes, its first
 * member the size): all of it when src's size is dst_size, the leading bytes of an
 * earlier version when it is one of those (n of them); dst's size is then dst_size.
 * Any other size is FSDP2_ERR_INVALID_ARGUMENT naming `what`, the size and the ones
 * accepted. */
fsdp2_status_t fsdp2_options_copy(const char *what, void *dst, size_t dst_size, const void *src,
                                  const fsdp2_options_version_t *earlier, size_t n);

#endif
