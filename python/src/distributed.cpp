// The communicator (collectives/communicator.h) as loom._loom.distributed: world(), the
// Communicator's collectives on tensors, Work. python/loom/distributed.py adds torch.distributed's
// module-level functions (all_reduce, get_rank, ...) over the world.
//
// Method names follow c10d's ProcessGroup (allreduce, broadcast, allgather, reduce_scatter,
// reduce, barrier, send, recv), with loom's argument order (input, then output). Every call
// takes async_op (torch's name): False (default) waits before returning; True returns a Work the
// caller must wait() on before reading an output or reusing an input. The calls and wait() run
// with the GIL released: under mpirun a rank blocks there on its peers, and other Python threads
// (a data loader) keep running. A Work keeps its tensors alive, so a buffer dropped by Python
// cannot be freed while MPI still writes into it.
#include <pybind11/stl.h>

#include <cctype>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "bindings.h"
#include "collectives/communicator.h"
#include "collectives/termination.h"

namespace loom::python {
namespace {

using comm::Communicator;
using comm::ReduceOp;

// A pending collective and the tensors it reads or writes.
struct PyWork {
  comm::WorkPtr work;
  std::vector<Tensor> buffers;

  ~PyWork() {
    // An unfinished Work waits in its destructor: let other threads run meanwhile.
    if (work && PyGILState_Check()) {
      py::gil_scoped_release release;
      work.reset();
    }
  }
  void wait() {
    py::gil_scoped_release release;
    work->wait();
  }
};

// "sum" / "avg" / "max" / "min" (any case) or a loom.distributed.ReduceOp.
ReduceOp op_arg(py::handle op, const char* call) {
  if (py::isinstance<py::str>(op)) {
    std::string name = op.cast<std::string>();
    for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (name == "sum") return ReduceOp::kSum;
    if (name == "avg") return ReduceOp::kAvg;
    if (name == "max") return ReduceOp::kMax;
    if (name == "min") return ReduceOp::kMin;
    throw py::value_error(std::string(call) + ": op must be 'sum', 'avg', 'max' or 'min', got '" +
                          op.cast<std::string>() + "'");
  }
  return op.cast<ReduceOp>();
}

// The script's place that made this call: the innermost Python frame outside loom.distributed's
// own module-level wrappers (all_reduce, ...), as (file, line); ("", 0) without one. Every rank
// of a collective must call it from the same place (Note [Collective signatures]).
std::pair<std::string, int> python_call_site() {
  PyFrameObject* frame = PyEval_GetFrame();  // borrowed
  Py_XINCREF(frame);
  while (frame) {
    PyCodeObject* code = PyFrame_GetCode(frame);  // new reference
    std::string file = py::reinterpret_steal<py::object>(reinterpret_cast<PyObject*>(code))
                           .attr("co_filename")
                           .cast<std::string>();
    const std::string wrapper = "loom/distributed/__init__.py";
    const bool ours = file.size() >= wrapper.size() &&
                      file.compare(file.size() - wrapper.size(), wrapper.size(), wrapper) == 0;
    if (!ours) {
      const int line = PyFrame_GetLineNumber(frame);
      Py_DECREF(frame);
      return {file, line};
    }
    PyFrameObject* back = PyFrame_GetBack(frame);  // new reference
    Py_DECREF(frame);
    frame = back;
  }
  return {"", 0};
}

// Issues `issue` (GIL released); waits unless async_op. Returns the Work or None.
template <typename Issue>
py::object run(Issue issue, std::vector<Tensor> buffers, bool async_op) {
  comm::WorkPtr work;
  auto [file, line] = python_call_site();
  {
    comm::ScopedCallSite site(std::move(file), line);
    py::gil_scoped_release release;
    work = issue();
    if (!async_op) work->wait();
  }
  if (!async_op) return py::none();
  auto w = std::make_unique<PyWork>();
  w->work = std::move(work);
  w->buffers = std::move(buffers);
  return py::cast(std::move(w));
}

}  // namespace

void init_distributed(py::module_& m) {
  py::module_ d = m.def_submodule("distributed", "loom's communicator (import loom.distributed)");

  py::enum_<ReduceOp>(d, "ReduceOp")
      .value("SUM", ReduceOp::kSum)
      .value("AVG", ReduceOp::kAvg)
      .value("MAX", ReduceOp::kMax)
      .value("MIN", ReduceOp::kMin);

  py::class_<PyWork>(d, "Work", R"(A pending collective (returned by calls with async_op=True).

Call wait() before reading the output or reusing the input; it releases the GIL. Dropping an
unfinished Work waits for it.

    work = comm.allreduce(t, async_op=True)
    ...                # overlap other work
    work.wait()
)")
      .def("wait", &PyWork::wait, "Blocks (GIL released) until the collective completes.")
      .def(
          "is_completed",
          [](PyWork& self) {
            py::gil_scoped_release release;
            return self.work->test();
          },
          "Polls without blocking; True once complete.");

  py::class_<Communicator, std::shared_ptr<Communicator>>(d, "Communicator", R"(A group of ranks.

    comm = loom.distributed.world()          # MPI world under mpirun, else a world of one
    t = loom.full([4], float(comm.rank))
    comm.allreduce(t, op="sum")              # in place; waits (async_op=False)
)")
      .def_property_readonly("rank", &Communicator::rank)
      .def_property_readonly("size", &Communicator::size)
      .def_property_readonly("name", &Communicator::name)
      .def_property_readonly("backend", [](const Communicator& c) { return c.backend(); })
      .def(
          "allreduce",
          [](Communicator& c, Tensor& tensor, py::object op, std::optional<Tensor> out,
             bool async_op) {
            comm::AllreduceOptions o{op_arg(op, "allreduce")};
            Tensor& output = out ? *out : tensor;
            return run([&] { return c.allreduce(tensor, output, o); }, {tensor, output}, async_op);
          },
          py::arg("tensor"), py::arg("op") = "sum", py::arg("out") = py::none(),
          py::arg("async_op") = false,
          "out (default: tensor itself, in place) = op over ranks of tensor. op: 'sum', 'avg', "
          "'max', 'min' or a ReduceOp.")
      .def(
          "broadcast",
          [](Communicator& c, Tensor& tensor, int src, bool async_op) {
            comm::BroadcastOptions o{src};
            return run([&] { return c.broadcast(tensor, o); }, {tensor}, async_op);
          },
          py::arg("tensor"), py::arg("src") = 0, py::arg("async_op") = false,
          "Every rank's tensor becomes rank src's (in place).")
      .def(
          "allgather",
          [](Communicator& c, const Tensor& input, Tensor& output, bool async_op) {
            return run([&] { return c.allgather(input, output); }, {input, output}, async_op);
          },
          py::arg("input"), py::arg("output"), py::arg("async_op") = false,
          "input: n elements; output: size * n elements, chunk r from rank r.")
      .def(
          "reduce_scatter",
          [](Communicator& c, const Tensor& input, Tensor& output, py::object op, bool async_op) {
            comm::ReduceScatterOptions o{op_arg(op, "reduce_scatter")};
            return run([&] { return c.reduce_scatter(input, output, o); }, {input, output},
                       async_op);
          },
          py::arg("input"), py::arg("output"), py::arg("op") = "sum", py::arg("async_op") = false,
          "input: size * n elements; output: n elements, rank r gets chunk r of the reduction.")
      .def(
          "reduce",
          [](Communicator& c, const Tensor& input, Tensor& output, int dst, py::object op,
             bool async_op) {
            comm::ReduceOptions o{op_arg(op, "reduce"), dst};
            return run([&] { return c.reduce(input, output, o); }, {input, output}, async_op);
          },
          py::arg("input"), py::arg("output"), py::arg("dst") = 0, py::arg("op") = "sum",
          py::arg("async_op") = false, "output (significant on rank dst) = op over ranks of input.")
      .def(
          "send",
          [](Communicator& c, const Tensor& tensor, int dst, int tag, bool async_op) {
            comm::PointToPointOptions o{tag};
            return run([&] { return c.send(tensor, dst, o); }, {tensor}, async_op);
          },
          py::arg("tensor"), py::arg("dst"), py::arg("tag") = 0, py::arg("async_op") = false)
      .def(
          "recv",
          [](Communicator& c, Tensor& tensor, int src, int tag, bool async_op) {
            comm::PointToPointOptions o{tag};
            return run([&] { return c.recv(tensor, src, o); }, {tensor}, async_op);
          },
          py::arg("tensor"), py::arg("src"), py::arg("tag") = 0, py::arg("async_op") = false)
      .def(
          "barrier",
          [](Communicator& c, bool async_op) {
            return run([&] { return c.barrier(); }, {}, async_op);
          },
          py::arg("async_op") = false)
      .def("split", &Communicator::split, py::arg("color"), py::arg("key"), py::arg("name"),
           py::call_guard<py::gil_scoped_release>(),
           "The ranks that pass the same color, ordered by (key, rank). Every rank must call it.")
      .def_property_readonly("sequence_number", &Communicator::sequence_number)
      .def("op_count", &Communicator::op_count, py::arg("op"))
      .def("op_bytes", &Communicator::op_bytes, py::arg("op"))
      .def_property(
          "debug", &Communicator::debug, &Communicator::set_debug,
          "Whether each collective is checked, before it is posted, to be the same call "
          "on every rank (op, dtype, count, root, reduction, collectives before it and the "
          "script line of allreduce, reduce_scatter, allgather and all_to_all). On "
          "unless LOOM_COMM_DEBUG=0.")
      .def_property("timeout_seconds", &Communicator::timeout_seconds,
                    &Communicator::set_timeout_seconds)
      .def(
          "set_algorithm",
          [](Communicator& c, const std::string& algorithm, std::vector<int> node_of_rank) {
            LOOM_CHECK(algorithm == "flat" || algorithm == "hier" || algorithm == "auto",
                       "Communicator.set_algorithm: expected 'flat', 'hier' or 'auto', got '",
                       algorithm, "'");
            c.set_algorithm(algorithm == "flat"   ? comm::Algorithm::kFlat
                            : algorithm == "hier" ? comm::Algorithm::kHierarchical
                                                  : comm::Algorithm::kAuto,
                            std::move(node_of_rank));
          },
          py::arg("algorithm"), py::arg("node_of_rank") = std::vector<int>{},
          py::call_guard<py::gil_scoped_release>(),
          "How this group runs allreduce, reduce_scatter, allgather and all_to_all across "
          "nodes: 'flat', 'hier' (two levels: inside each node, then across) or 'auto' (per "
          "call, by a cost table measured now). Every rank of the group must call it alike. "
          "node_of_rank: each rank's node (default: by host name). A DeviceMesh sets its "
          "groups from LOOM_COLL_ALGO (auto by default) when the job spans nodes.")
      .def_property_readonly("algorithm", &Communicator::algorithm_str,
                             "'flat', or how the group picks two-level collectives.")
      .def("__repr__", [](const Communicator& c) {
        return "<loom.distributed.Communicator '" + c.name() + "' rank " +
               std::to_string(c.rank()) + " of " + std::to_string(c.size()) + ", backend " +
               c.backend() + ">";
      });

  d.def("world", &comm::world, py::arg("backend") = "auto",
        py::call_guard<py::gil_scoped_release>(),
        "The world communicator: MPI under mpirun (when loom has MPI), else a world of one. "
        "backend: 'auto', 'self', 'mpi' or 'nccl'. Created once; later calls return it.");
  d.def("launched_by_mpi", &comm::launched_by_mpi);
  // For python/loom/_job_exit.py (See Note [Leaving the job] in collectives/termination.cpp).
  d.def("_in_multi_rank_job", &comm::in_multi_rank_job,
        "True while this process is one rank of a multi-rank MPI job.");
  d.def(
      "_abort_job", [](int status, const std::string& reason) { comm::abort_job(status, reason); },
      py::arg("status"), py::arg("reason"),
      "Ends every rank of the job now (MPI_Abort) with a message naming `reason`; outside a "
      "multi-rank job, exits with `status`. Does not return.");
}

}  // namespace loom::python
