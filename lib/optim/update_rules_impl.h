/* The update rules, written once for an element type. update_rules.c includes this
 * file once per type with T (the element type), SQRT (its square root) and RULE(name)
 * (name suffixed by the type) defined.
 *
 * Why element arithmetic in T and not in double: torch.optim's single-tensor path
 * (foreach=False) computes each elementwise op in the tensor's dtype, with the Python
 * scalars (lr, 1 - beta1, ...) rounded to it; doing the same gives its numbers, up to
 * the last-bit differences of the fused multiply-adds its vectorised kernels may use.
 * The coefficients themselves (bias corrections, lr / bc1) are computed in double, as
 * Python does, and rounded once. Each rule is one pass: every element is read and
 * written once, with the op order of torch's sequence of in-place ops. No header
 * guard: it is meant to be included twice. */

/* torch.lerp(start, end, weight): the two-sided form keeps it exact at both ends.
 * near_start is |weight| < 0.5, decided once by the caller, so the loop has no branch. */
static inline T RULE(lerp)(T start, T end, T weight, int near_start)
{
    return near_start ? start + weight * (end - start) : end - (end - start) * ((T)1 - weight);
}

/* The rules below are cloned for AVX-512 and AVX2 (FSDP2_VECTOR_CLONES: the same bits in
 * every clone), their loops written without branches so that they vectorise. */

/* torch.optim.SGD: g = grad + wd * p; buf = g (first step) or momentum * buf +
 * (1 - dampening) * g; g = nesterov ? g + momentum * buf : buf; p -= lr * g. Without
 * momentum there is no buf (NULL): a loop of its own. */
FSDP2_VECTOR_CLONES
static void RULE(sgd)(const optim_coeffs_t *c, int64_t n, T *restrict p, const T *restrict grad,
                      T *restrict buf)
{
    const T neg_lr = (T)-c->lr, wd = (T)c->weight_decay, momentum = (T)c->momentum;
    const T keep = (T)(1.0 - c->dampening);
    const int use_wd = c->weight_decay != 0.0;
    const int first = c->first_step, nesterov = c->nesterov;
    if (c->momentum == 0.0) {
        for (int64_t i = 0; i < n; i++) {
            T g = use_wd ? grad[i] + wd * p[i] : grad[i];
            p[i] = p[i] + neg_lr * g;
        }
        return;
    }
    for (int64_t i = 0; i < n; i++) {
        T g = use_wd ? grad[i] + wd * p[i] : grad[i];
        T b = first ? g : buf[i] * momentum + keep * g;
        buf[i] = b;
        g = nesterov ? g + momentum * b : b;
        p[i] = p[i] + neg_lr * g;
    }
}

/* torch.optim.AdamW: p *= 1 - lr * wd; m = lerp(m, g, 1 - beta1); v = beta2 * v +
 * (1 - beta2) * g * g; p -= (lr / bc1) * m / (sqrt(v) / sqrt(bc2) + eps). */
FSDP2_VECTOR_CLONES
static void RULE(adamw)(const optim_coeffs_t *c, int64_t n, T *restrict p, const T *restrict grad,
                        T *restrict m, T *restrict v)
{
    const T decay = (T)(1.0 - c->lr * c->weight_decay);
    const T w1 = (T)(1.0 - c->beta1), beta2 = (T)c->beta2, w2 = (T)(1.0 - c->beta2);
    const T bc2_sqrt = (T)sqrt(c->bias_correction2), eps = (T)c->eps;
    const T neg_step = (T)(-c->lr / c->bias_correction1);
    const int near_start = w1 < (T)0.5 && w1 > (T)-0.5;
    for (int64_t i = 0; i < n; i++) {
        T g = grad[i];
        T pi = p[i] * decay;
        T mi = RULE(lerp)(m[i], g, w1, near_start);
        T vi = v[i] * beta2 + w2 * g * g;
        T denom = SQRT(vi) / bc2_sqrt + eps;
        m[i] = mi;
        v[i] = vi;
        p[i] = pi + neg_step * (mi / denom);
    }
}

/* torch.optim.Adadelta: g = grad + wd * p; sq = rho * sq + (1 - rho) * g * g;
 * delta = sqrt(acc + eps) / sqrt(sq + eps) * g; acc = rho * acc + (1 - rho) * delta^2;
 * p -= lr * delta. */
FSDP2_VECTOR_CLONES
static void RULE(adadelta)(const optim_coeffs_t *c, int64_t n, T *restrict p,
                           const T *restrict grad, T *restrict sq, T *restrict acc)
{
    const T neg_lr = (T)-c->lr, wd = (T)c->weight_decay, eps = (T)c->eps;
    const T rho = (T)c->rho, w = (T)(1.0 - c->rho);
    const int use_wd = c->weight_decay != 0.0;
    for (int64_t i = 0; i < n; i++) {
        T g = use_wd ? grad[i] + wd * p[i] : grad[i];
        T sqi = sq[i] * rho + w * g * g;
        T std = SQRT(sqi + eps);
        T delta = SQRT(acc[i] + eps) / std * g;
        sq[i] = sqi;
        acc[i] = acc[i] * rho + w * delta * delta;
        p[i] = p[i] + neg_lr * delta;
    }
}

/* Elements [lo, lo + n) of a shard. */
static void RULE(update_range)(const optim_coeffs_t *c, const optim_shard_t *s, int64_t lo,
                               int64_t n)
{
    T *p = (T *)s->param + lo, *s0 = s->state[0], *s1 = s->state[1];
    const T *g = (const T *)s->grad + lo;
    switch (c->kind) {
    case FSDP2_OPTIMIZER_SGD:
        RULE(sgd)(c, n, p, g, s0 ? s0 + lo : NULL);
        break;
    case FSDP2_OPTIMIZER_ADAMW:
        RULE(adamw)(c, n, p, g, s0 + lo, s1 + lo);
        break;
    case FSDP2_OPTIMIZER_ADADELTA:
        RULE(adadelta)(c, n, p, g, s0 + lo, s1 + lo);
        break;
    }
}

/* Every element is independent: chunks on the pool's threads give the same numbers. */
void RULE(optim_update)(const optim_coeffs_t *c, const optim_shard_t *s)
{
    int64_t numel = s->numel;
    FSDP2_OMP("omp parallel for schedule(static) if(numel > FSDP2_PAR_CHUNK)")
    for (int64_t lo = 0; lo < numel; lo += FSDP2_PAR_CHUNK)
        RULE(update_range)(c, s, lo, numel - lo < FSDP2_PAR_CHUNK ? numel - lo : FSDP2_PAR_CHUNK);
}
