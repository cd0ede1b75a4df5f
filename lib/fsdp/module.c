/* The module tree: names, parameters, buffers, lookup by fully qualified name. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "fsdp/fsdp_internal.h"

static fsdp2_status_t check_name(const char *name, const char *what, int allow_empty)
{
    FSDP2_ARG_CHECK(name, "%s name is NULL", what);
    size_t n = strlen(name);
    FSDP2_ARG_CHECK(n > 0 || allow_empty, "%s name is empty", what);
    FSDP2_ARG_CHECK(n < FSDP2_NAME_MAX, "%s name '%.40s...' is longer than %d characters", what,
                    name, FSDP2_NAME_MAX - 1);
    FSDP2_ARG_CHECK(!strchr(name, '.'), "%s name '%s' contains '.' (names join with dots)", what,
                    name);
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_module_create(const char *name, fsdp2_module_t **out)
{
    FSDP2_ARG_CHECK(out, "module is NULL");
    *out = NULL;
    FSDP2_CHECK(check_name(name, "module", 1));
    fsdp2_module_t *m = calloc(1, sizeof(*m));
    if (!m)
        return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "module '%s'", name);
    snprintf(m->name, sizeof(m->name), "%s", name);
    *out = m;
    return FSDP2_SUCCESS;
}

void fsdp_module_fqn(const fsdp2_module_t *m, char *buf, size_t len)
{
    /* Names from the root down: collect the path upwards, then join it. */
    const fsdp2_module_t *path[64];
    int n = 0;
    for (const fsdp2_module_t *x = m; x && x->parent && n < 64; x = x->parent)
        path[n++] = x;
    size_t used = 0;
    buf[0] = '\0';
    for (int i = n - 1; i >= 0 && used < len; i--) {
        int w = snprintf(buf + used, len - used, "%s%s", i == n - 1 ? "" : ".", path[i]->name);
        used += w > 0 ? (size_t)w : 0;
    }
}

void fsdp_param_fqn(const fsdp2_param_t *p, char *buf, size_t len)
{
    fsdp_module_fqn(p->owner, buf, len);
    size_t used = strlen(buf);
    if (used < len)
        snprintf(buf + used, len - used, "%s%s", used ? "." : "", p->name);
}

static int name_taken(const fsdp2_module_t *m, const char *name)
{
    for (size_t i = 0; i < m->num_children; i++) {
        if (!strcmp(m->children[i]->name, name))
            return 1;
    }
    for (size_t i = 0; i < m->num_params; i++) {
        if (!strcmp(m->params[i]->name, name))
            return 1;
    }
    for (size_t i = 0; i < m->num_buffers; i++) {
        if (!strcmp(m->buffers[i].name, name))
            return 1;
    }
    for (size_t i = 0; i < m->num_ties; i++) {
        if (!strcmp(m->ties[i].name, name))
            return 1;
    }
    return 0;
}

static fsdp2_status_t check_new_name(const fsdp2_module_t *m, const char *name)
{
    if (!name_taken(m, name))
        return FSDP2_SUCCESS;
    char fqn[FSDP2_FQN_MAX];
    fsdp_module_fqn(m, fqn, sizeof(fqn));
    return fsdp2_error(FSDP2_ERR_INVALID_ARGUMENT, "module '%s' already has something named '%s'",
                       fqn, name);
}

/* Appends item to a growable array of pointers or structs. */
static fsdp2_status_t grow(void **array, size_t count, size_t elem)
{
    void *bigger = realloc(*array, (count + 1) * elem);
    if (!bigger)
        return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "module tree");
    *array = bigger;
    return FSDP2_SUCCESS;
}

static fsdp2_status_t check_unsharded(const fsdp2_module_t *m, const char *what)
{
    for (const fsdp2_module_t *x = m; x; x = x->parent) {
        if (x->group) {
            char fqn[FSDP2_FQN_MAX];
            fsdp_module_fqn(x, fqn, sizeof(fqn));
            return fsdp2_error(FSDP2_ERR_INVALID_STATE, "%s: module '%s' is already sharded", what,
                               fqn);
        }
    }
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_module_add_child(fsdp2_module_t *parent, fsdp2_module_t *child)
{
    FSDP2_ARG_CHECK(parent && child, "add_child: parent or child is NULL");
    FSDP2_ARG_CHECK(child->parent == NULL, "add_child: module '%s' already has a parent",
                    child->name);
    FSDP2_ARG_CHECK(child != parent && fsdp_module_top(parent) != child,
                    "add_child: module '%s' would become its own ancestor", child->name);
    FSDP2_CHECK(check_name(child->name, "child module", 0));
    FSDP2_CHECK(check_new_name(parent, child->name));
    FSDP2_CHECK(check_unsharded(parent, "add_child"));
    FSDP2_ARG_CHECK(!child->group, "add_child: module '%s' is sharded; build the tree first",
                    child->name);
    FSDP2_CHECK(grow((void **)&parent->children, parent->num_children, sizeof(*parent->children)));
    parent->children[parent->num_children++] = child;
    child->parent = parent;
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_module_add_param(fsdp2_module_t *m, const char *name, fsdp2_tensor_t *value,
                                      int requires_grad, fsdp2_param_t **out)
{
    if (out)
        *out = NULL;
    FSDP2_ARG_CHECK(m && value, "add_param: module or value is NULL");
    FSDP2_CHECK(check_name(name, "parameter", 0));
    FSDP2_CHECK(check_new_name(m, name));
    FSDP2_CHECK(check_unsharded(m, "add_param"));
    int is_float = 0;
    fsdp2_dtype_is_float(value->dtype, &is_float);
    FSDP2_ARG_CHECK(is_float, "add_param '%s': dtype %s is not floating point", name,
                    fsdp2_dtype_name(value->dtype));
    FSDP2_ARG_CHECK(value->device.type == FSDP2_DEVICE_META || value->device.type == FSDP2_DEVICE_CPU,
                    "add_param '%s': declare parameters on meta or cpu", name);
    fsdp2_param_t *p = calloc(1, sizeof(*p));
    if (!p)
        return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "parameter '%s'", name);
    fsdp2_status_t status = grow((void **)&m->params, m->num_params, sizeof(*m->params));
    if (status == FSDP2_SUCCESS)
        status = fsdp2_tensor_retain(value, &p->value);
    if (status != FSDP2_SUCCESS) {
        free(p);
        return status;
    }
    snprintf(p->name, sizeof(p->name), "%s", name);
    p->owner = m;
    p->ndim = value->ndim;
    memcpy(p->shape, value->shape, sizeof(p->shape));
    p->dtype = value->dtype;
    p->requires_grad = requires_grad != 0;
    p->materialized = value->device.type != FSDP2_DEVICE_META;
    p->grad_offset = -1;
    p->grad_full_offset = -1;
    m->params[m->num_params++] = p;
    if (out)
        *out = p;
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_module_tie_param(fsdp2_module_t *m, const char *name, fsdp2_param_t *target)
{
    FSDP2_ARG_CHECK(m && target, "tie_param: module or target is NULL");
    FSDP2_CHECK(check_name(name, "parameter", 0));
    FSDP2_CHECK(check_new_name(m, name));
    FSDP2_CHECK(check_unsharded(m, "tie_param"));
    FSDP2_ARG_CHECK(fsdp_module_top(m) == fsdp_module_top(target->owner),
                    "tie_param '%s': the target '%s' belongs to another module tree", name,
                    target->name);
    FSDP2_CHECK(grow((void **)&m->ties, m->num_ties, sizeof(*m->ties)));
    snprintf(m->ties[m->num_ties].name, sizeof(m->ties[m->num_ties].name), "%s", name);
    m->ties[m->num_ties++].target = target;
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_module_add_buffer(fsdp2_module_t *m, const char *name, fsdp2_tensor_t *value)
{
    FSDP2_ARG_CHECK(m && value, "add_buffer: module or value is NULL");
    FSDP2_CHECK(check_name(name, "buffer", 0));
    FSDP2_CHECK(check_new_name(m, name));
    FSDP2_CHECK(grow((void **)&m->buffers, m->num_buffers, sizeof(*m->buffers)));
    named_tensor_t *b = &m->buffers[m->num_buffers];
    FSDP2_CHECK(fsdp2_tensor_retain(value, &b->tensor));
    snprintf(b->name, sizeof(b->name), "%s", name);
    m->num_buffers++;
    return FSDP2_SUCCESS;
}

static void param_free(fsdp2_param_t *p)
{
    fsdp2_tensor_release(p->value);
    fsdp2_dtensor_release(p->sharded);
    fsdp2_dtensor_release(p->sharded_grad);
    for (int i = 0; i < FSDP_BUFFER_SLOTS; i++)
        fsdp2_tensor_release(p->unsharded_view[i]);
    for (int i = 0; i < FSDP_GRAD_SLOTS; i++)
        fsdp2_tensor_release(p->grad_view[i]);
    free(p);
}

static void module_free(fsdp2_module_t *m)
{
    for (size_t i = 0; i < m->num_children; i++)
        module_free(m->children[i]);
    if (m->group)
        fsdp_group_free(m->group);
    for (size_t i = 0; i < m->num_params; i++)
        param_free(m->params[i]);
    for (size_t i = 0; i < m->num_buffers; i++)
        fsdp2_tensor_release(m->buffers[i].tensor);
    free(m->children);
    free(m->params);
    free(m->buffers);
    free(m->ties);
    free(m);
}

/* Every root planned in the tree (an unsharded top may hold several), streams drained. */
static fsdp2_status_t free_roots(fsdp2_module_t *m)
{
    fsdp2_status_t status = FSDP2_SUCCESS;
    if (m->group && m->group->root && m->group->root->group == m->group) {
        status = fsdp2_module_synchronize(m);
        fsdp_root_free(m->group->root);
    }
    for (size_t i = 0; i < m->num_children; i++) {
        fsdp2_status_t s = free_roots(m->children[i]);
        if (status == FSDP2_SUCCESS)
            status = s;
    }
    return status;
}

fsdp2_status_t fsdp2_module_destroy(fsdp2_module_t *root)
{
    if (!root)
        return FSDP2_SUCCESS;
    FSDP2_ARG_CHECK(!root->parent, "module_destroy: '%s' has a parent; destroy the root",
                    root->name);
    fsdp2_status_t status = free_roots(root);
    module_free(root);
    return status;
}

fsdp2_module_t *fsdp_module_top(fsdp2_module_t *m)
{
    while (m->parent)
        m = m->parent;
    return m;
}

fsdp2_status_t fsdp_module_walk(fsdp2_module_t *m, fsdp2_status_t (*fn)(fsdp2_module_t *, void *),
                                void *ctx)
{
    FSDP2_CHECK(fn(m, ctx));
    for (size_t i = 0; i < m->num_children; i++)
        FSDP2_CHECK(fsdp_module_walk(m->children[i], fn, ctx));
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_module_parent(const fsdp2_module_t *m, fsdp2_module_t **parent)
{
    FSDP2_ARG_CHECK(m && parent, "module or parent is NULL");
    *parent = m->parent;
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_module_child_count(const fsdp2_module_t *m, size_t *count)
{
    FSDP2_ARG_CHECK(m && count, "module or count is NULL");
    *count = m->num_children;
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_module_child(const fsdp2_module_t *m, size_t index, fsdp2_module_t **child)
{
    FSDP2_ARG_CHECK(m && child, "module or child is NULL");
    FSDP2_ARG_CHECK(index < m->num_children, "module '%s' has %zu children, not index %zu",
                    m->name, m->num_children, index);
    *child = m->children[index];
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_module_fqn(const fsdp2_module_t *m, char *buf, size_t len)
{
    FSDP2_ARG_CHECK(m && buf && len > 0, "module_fqn: an argument is NULL");
    fsdp_module_fqn(m, buf, len);
    return FSDP2_SUCCESS;
}

static void collect(const fsdp2_module_t *m, fsdp2_param_t **out, size_t capacity, size_t *n)
{
    for (size_t i = 0; i < m->num_params; i++, (*n)++) {
        if (*n < capacity)
            out[*n] = m->params[i];
    }
    for (size_t i = 0; i < m->num_children; i++)
        collect(m->children[i], out, capacity, n);
}

fsdp2_status_t fsdp2_module_params(const fsdp2_module_t *m, fsdp2_param_t **out, size_t capacity,
                                   size_t *count)
{
    FSDP2_ARG_CHECK(m && count && (out || capacity == 0), "module_params: an argument is NULL");
    *count = 0;
    collect(m, out, capacity, count);
    return FSDP2_SUCCESS;
}

/* Finds the module at the dotted path prefix of fqn under m; *last is the final name. */
static const fsdp2_module_t *descend(const fsdp2_module_t *m, const char *fqn, const char **last)
{
    const char *s = fqn;
    for (const char *dot; (dot = strchr(s, '.')); s = dot + 1) {
        size_t n = (size_t)(dot - s);
        const fsdp2_module_t *next = NULL;
        for (size_t i = 0; i < m->num_children && !next; i++) {
            if (strlen(m->children[i]->name) == n && !strncmp(m->children[i]->name, s, n))
                next = m->children[i];
        }
        if (!next)
            return NULL;
        m = next;
    }
    *last = s;
    return m;
}

fsdp2_status_t fsdp2_module_find_param(const fsdp2_module_t *m, const char *fqn,
                                       fsdp2_param_t **param)
{
    FSDP2_ARG_CHECK(m && fqn && param, "find_param: an argument is NULL");
    *param = NULL;
    const char *last;
    const fsdp2_module_t *owner = descend(m, fqn, &last);
    for (size_t i = 0; owner && i < owner->num_params; i++) {
        if (!strcmp(owner->params[i]->name, last)) {
            *param = owner->params[i];
            return FSDP2_SUCCESS;
        }
    }
    for (size_t i = 0; owner && i < owner->num_ties; i++) {
        if (!strcmp(owner->ties[i].name, last)) {
            *param = owner->ties[i].target;
            return FSDP2_SUCCESS;
        }
    }
    return fsdp2_error(FSDP2_ERR_NOT_FOUND, "no parameter '%s' under module '%s'", fqn, m->name);
}

fsdp2_status_t fsdp2_module_find_buffer(const fsdp2_module_t *m, const char *fqn,
                                        fsdp2_tensor_t **buffer)
{
    FSDP2_ARG_CHECK(m && fqn && buffer, "find_buffer: an argument is NULL");
    *buffer = NULL;
    const char *last;
    const fsdp2_module_t *owner = descend(m, fqn, &last);
    for (size_t i = 0; owner && i < owner->num_buffers; i++) {
        if (!strcmp(owner->buffers[i].name, last)) {
            *buffer = owner->buffers[i].tensor;
            return FSDP2_SUCCESS;
        }
    }
    return fsdp2_error(FSDP2_ERR_NOT_FOUND, "no buffer '%s' under module '%s'", fqn, m->name);
}

fsdp2_status_t fsdp2_param_info(const fsdp2_param_t *p, fsdp2_param_info_t *info)
{
    FSDP2_ARG_CHECK(p && info, "param or info is NULL");
    memset(info, 0, sizeof(*info));
    fsdp_param_fqn(p, info->fqn, sizeof(info->fqn));
    info->ndim = p->ndim;
    memcpy(info->shape, p->shape, sizeof(info->shape));
    info->dtype = p->dtype;
    info->requires_grad = p->requires_grad;
    info->sharded = p->group != NULL;
    info->materialized = p->materialized;
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_param_module(const fsdp2_param_t *p, fsdp2_module_t **module)
{
    FSDP2_ARG_CHECK(p && module, "param or module is NULL");
    *module = p->owner;
    return FSDP2_SUCCESS;
}

void fsdp_param_set_materialized(fsdp2_param_t *p)
{
    p->materialized = 1;
}
