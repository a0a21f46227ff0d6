// Every nn module: include this to build models.
#pragma once

#include "core/nn/attention.h"
#include "core/nn/block.h"
#include "core/nn/dropout.h"
#include "core/nn/embedding.h"
#include "core/nn/embedding_bag_collection.h"
#include "core/nn/generate.h"
#include "core/nn/gpt.h"
#include "core/nn/gpt_config.h"
#include "core/nn/init.h"
#include "core/nn/kv_cache.h"
#include "core/nn/layer_norm.h"
#include "core/nn/linear.h"
#include "core/nn/mlp.h"
#include "core/nn/module.h"
