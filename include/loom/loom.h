// The umbrella header: everything a program that trains with loom needs.
#pragma once

#include "core/autograd.h"
#include "core/device.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/ops.h"
#include "core/tensor.h"
