/* The update rules for f32 and f64 shards: update_rules_impl.h instantiated per type. */
#include <math.h>

#include "core/parallel.h"
#include "core/vector_clones.h"
#include "optim/optim_internal.h"

#define T float
#define SQRT sqrtf
#define RULE(name) name##_f32
#include "optim/update_rules_impl.h"
#undef T
#undef SQRT
#undef RULE

#define T double
#define SQRT sqrt
#define RULE(name) name##_f64
#include "optim/update_rules_impl.h"
#undef T
#undef SQRT
#undef RULE
