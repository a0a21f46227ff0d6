// Shared declarations of the pybind11 module loom._loom: one init_* per binding file (errors,
// dtypes and Tensor, operators and functional ops, autograd, nn modules, optimizers, the
// communicator, weight files), called in order by module.cpp, and the argument helpers the files
// share.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>

#include "core/tensor.h"
#include "kernels/embedding_bag_types.h"
#include "optimizer/adamw.h"
#include "optimizer/sgd.h"

namespace loom::python {

namespace py = pybind11;

void init_errors(py::module_& m);       // errors.cpp: loom::Error -> ValueError, ...
void init_tensor(py::module_& m);       // tensor.cpp: dtypes, Tensor, tensor(), from_numpy, numpy
void init_ops(py::module_& m);          // ops.cpp: operators, reductions, nn.functional
void init_math(py::module_& m);         // math_ops.cpp: exp log ... pow clamp where expand
void init_creation(py::module_& m);     // creation_ops.cpp: random, stack, linspace, eye, tril
void init_indexing(py::module_& m);     // indexing.cpp: t[...] and t[...] = value
void init_autograd(py::module_& m);     // autograd.cpp: backward, grad, no-grad guards
void init_nn(py::module_& m);           // nn.cpp: built-in modules (loom._loom.nn), Parameter
void init_optim(py::module_& m);        // optim.cpp: SGD, AdamW, clip_grad_norm (loom._loom.optim)
void init_distributed(py::module_& m);  // distributed.cpp: world, Communicator, Work
void init_io(py::module_& m);           // io.cpp: load, save (weight files)
void init_parallel(py::module_& m);     // parallel.cpp: mesh, DDP, ZeRO, tensor-parallel layers
void init_pipeline(py::module_& m);     // pipeline.cpp: schedules, validator, executor, stages
void init_data(py::module_& m);         // data.cpp: built-in datasets, batch loader, lr schedules
void init_sharded(py::module_& m);      // sharded.cpp: sharded embedding-bag collections
void init_checkpoint(py::module_& m);   // checkpoint.cpp: distributed checkpoints
void init_plan(py::module_& m);         // plan.cpp: the parallel planner (loom.plan)

// A loom.dtype, or its name ("float32", "bfloat16", ... or loom's "f32", "bf16", ...).
DType dtype_arg(py::handle obj);
// The Python object of a dtype: one per dtype, so `t.dtype is loom.float32` holds.
py::object dtype_object(DType dtype);
// True for a Python float or int (bool included): an operand that becomes a 0-d tensor.
bool is_scalar(py::handle obj);
// A shape from PyTorch's *size arguments: f(2, 3) or f((2, 3)) / f([2, 3]) (tensor.cpp); each
// size checked (an integer that fits in int64), else a TypeError / ValueError naming it.
Shape shape_args(const py::args& args);

// The next random draw of loom's global generator (creation_ops.cpp, Note [The Python
// generator]): its seed and the stream the draw uses. For C++ code that draws with a stream of its
// own (GPT.generate's sampling), so that loom.manual_seed governs it too. Needs the GIL.
struct RandomStream {
  uint64_t seed;
  std::string stream;
};
RandomStream next_random_stream();

// An embedding-bag pooling by name ("sum", "mean", "none"); `owner` names the caller in errors
// (nn.cpp; the sharded collection refuses "none" itself).
kernels::EmbeddingPooling embedding_pooling_arg(const std::string& name, const char* owner);

// The options of loom.optim.SGD / AdamW from their Python arguments (optim.cpp), shared with the
// optimizers ZeroRedundancyOptimizer builds over its shards (parallel.cpp).
optim::SgdOptions sgd_options(double lr, double momentum, double dampening, double weight_decay,
                              bool nesterov);
optim::AdamWOptions adamw_options(double lr, double beta1, double beta2, double eps,
                                  double weight_decay);

}  // namespace loom::python
