// The CPU references of the backend ops, one header per op under engine/ops/ (each with its batch
// type): walk (ops/walk_blocks.h), attention errors (ops/attention_errors.h), t-SNE gradient
// (ops/tsne_gradient.h), k-center (ops/kcenter.h), attention scores (ops/attention_scores.h), key
// clusters (ops/key_clusters.h), cache scores (ops/cache_scores.h), expected scores
// (ops/expected_scores.h), chunk scores (ops/chunk_scores.h). They are the double-precision
// references the CUDA kernels are tested against; this header gathers them
// for callers that use several.
#pragma once

#include "engine/ops/attention_errors.h"
#include "engine/ops/attention_scores.h"
#include "engine/ops/cache_scores.h"
#include "engine/ops/chunk_scores.h"
#include "engine/ops/expected_scores.h"
#include "engine/ops/kcenter.h"
#include "engine/ops/key_clusters.h"
#include "engine/ops/tsne_gradient.h"
#include "engine/ops/walk_blocks.h"
