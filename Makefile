# The front door: a thin layer over CMake so that one command does the whole set-up on a fresh
# Debian 12 machine (install missing packages, configure, build) and then runs something.
#
#   make          packages + configure (first time only) + build
#   make test     the same, then every ctest entry, then `make sanitize` (LOOM_SKIP_SANITIZE=1
#                 skips that step)
#   make demo     the same, then build/bin/loom-gpt on the built-in synthetic task (8 ranks:
#                 dp 2 x tp 2 x pp 2 under mpirun; one process without MPI)
#   make bench    the same, then every CPU benchmark and one report (benchmarks/report.py), which
#                 also regenerates the figures in benchmarks/README.md and README.md
#   make sanitize the unit tests and a 2-rank MPI test built with ASan + UBSan in a directory of
#                 their own, build-sanitize (tests/sanitize/run.sh)
#   make clean    remove the build directory
#   make format   clang-format -i the C++ sources
#
# Variables: BUILD (build directory, default build), LOOM_CMAKE_ARGS (extra cmake flags, e.g.
# LOOM_CMAKE_ARGS="-DLOOM_WITH_CUDA=OFF"; given on the command line they re-run the configure
# step so they take effect on an existing build), JOBS (parallel compile jobs, default nproc),
# LOOM_SKIP_DEPS=1 (skip the package check), SANITIZE_BUILD (the sanitizer build's directory,
# default $(BUILD)-sanitize), LOOM_SKIP_SANITIZE=1 (make test without the sanitizer step).
#
# Every target is phony and the recipes decide for themselves what to skip: ninja already knows
# when the build is up to date and re-runs cmake when a CMakeLists.txt changes, so make only has
# to know whether the build directory has been configured at all.

BUILD ?= build
GENERATOR ?= Ninja
# Debian's python has numpy and PyTorch from apt; the python3 first on PATH may be a pyenv
# build without them (see DESIGN.md, "Facts about the machines").
PYTHON ?= /usr/bin/python3
JOBS ?= $(shell nproc)
CTEST_JOBS ?= 2
LOOM_CMAKE_ARGS ?=
SANITIZE_BUILD ?= $(BUILD)-sanitize
CLANG_FORMAT ?= clang-format
BENCH_FLAGS ?= --readme
# mpirun as the tests run it (tests/CMakeLists.txt): more ranks than cores, as root, shared
# memory and loopback only, one OpenMP thread per rank.
MPIRUN := OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 mpirun \
          --oversubscribe --bind-to none --mca mpi_yield_when_idle 1 --mca btl self,vader \
          --mca btl_vader_single_copy_mechanism none --mca oob_tcp_if_include lo

# Folders holding C++ sources (the later layers are picked up once they exist).
FORMAT_DIRS := $(wildcard core kernels optimizer collectives parallel examples tests benchmarks \
                          python include)

.PHONY: all deps configure build test sanitize demo bench fuzz clean format

all: build

deps:
	@LOOM_CMAKE_ARGS="$(LOOM_CMAKE_ARGS)" LOOM_BUILD_DIR="$(BUILD)" bash scripts/install-deps.sh

# Configure when the build directory has no generated build system yet, or when extra cmake
# flags were given (cmake then updates the existing cache with them).
configure: deps
	@if [ ! -f "$(BUILD)/CMakeCache.txt" ] || [ ! -f "$(BUILD)/build.ninja" -a ! -f "$(BUILD)/Makefile" ] \
	    || [ -n "$(strip $(LOOM_CMAKE_ARGS))" ]; then \
	  echo "make: configuring $(BUILD)"; \
	  cmake -S . -B "$(BUILD)" -G "$(GENERATOR)" --no-warn-unused-cli -DPython3_EXECUTABLE=$(PYTHON) $(LOOM_CMAKE_ARGS); \
	else \
	  echo "make: $(BUILD) is configured (make clean, or pass LOOM_CMAKE_ARGS, to configure again)"; \
	fi

build: configure
	cmake --build "$(BUILD)" -j $(JOBS)

# The sanitizer step runs after ctest, not beside it, so that its build and runs do not compete
# with the multi-rank tests for the cores.
test: build
	ctest --test-dir "$(BUILD)" --output-on-failure -j $(CTEST_JOBS)
	@if [ "$(LOOM_SKIP_SANITIZE)" = 1 ]; then \
	  echo "make test: LOOM_SKIP_SANITIZE=1, skipping the sanitizer step (make sanitize)"; \
	else \
	  JOBS=$(JOBS) bash tests/sanitize/run.sh "$(SANITIZE_BUILD)"; \
	fi

# The unit tests and collectives_test on 2 ranks under ASan + UBSan (and LSan) in
# $(SANITIZE_BUILD), which the script configures with its own flags (CPU only); a sanitizer
# report anywhere fails it.
sanitize: deps
	@JOBS=$(JOBS) bash tests/sanitize/run.sh "$(SANITIZE_BUILD)"

# The main job: the built-in task trained with dp 2 x tp 2 x pp 2 (8 ranks, 1F1B) under mpirun,
# writing the pipeline timeline to $(BUILD)/demo_trace.json. Without MPI: one process.
demo: build
	@if [ ! -x "$(BUILD)/bin/loom-gpt" ]; then \
	  echo "make demo: $(BUILD)/bin/loom-gpt was not built (is examples/gpt in the tree?)"; exit 1; \
	fi
	@if command -v mpirun > /dev/null && [ -x "$(BUILD)/bin/loom-bench-collectives" ]; then \
	  echo "make demo: mpirun -np 8 $(BUILD)/bin/loom-gpt --dp 2 --tp 2 --pp 2 --schedule 1f1b"; \
	  $(MPIRUN) -np 8 ./$(BUILD)/bin/loom-gpt --dp 2 --tp 2 --pp 2 --schedule 1f1b \
	    --trace "$(BUILD)/demo_trace.json"; \
	else \
	  echo "make demo: no MPI here; training on one process"; ./$(BUILD)/bin/loom-gpt; \
	fi

# Every CPU benchmark in one run (benchmarks/report.py): one table of loom beside its peer
# (PyTorch on OpenBLAS) and its limit (memcpy, the GEMM peak, raw MPI, the raw disk) for each
# measure, in $(BUILD)/bench/report.md and report.json with every program's log. BENCH_FLAGS
# (default --readme) regenerates the report blocks of benchmarks/README.md and README.md from it;
# BENCH_FLAGS="--only gpt,ddp" runs some suites and leaves the READMEs alone.
bench: build
	$(PYTHON) benchmarks/report.py --build "$(BUILD)" $(BENCH_FLAGS)

# libFuzzer (clang, ASan + UBSan) on every parser of outside bytes, FUZZ_SECONDS (default 60)
# per target; build-fuzz/ holds the corpora and any findings (tests/fuzz/run.sh).
fuzz: build
	bash tests/fuzz/run.sh "$(BUILD)" $(FUZZ_SECONDS)

clean:
	rm -rf "$(BUILD)"

format:
	find $(FORMAT_DIRS) \( -name '*.h' -o -name '*.cpp' -o -name '*.cu' -o -name '*.cuh' \) -print0 | xargs -0 -r $(CLANG_FORMAT) -i
