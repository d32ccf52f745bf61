# Thin wrapper over CMake. The README's two commands:
#   make run    installs missing Debian packages, builds, runs the default job on 4 local ranks
#   make test   builds and runs every test through ctest (CTEST_ARGS="-L quick": the ~3-minute subset)
# Other targets: make (build), make deps, make debug (ASan/UBSan build in build-debug), make clean.
BUILD    ?= build
PRESET   ?= cpu-release
NP       ?= 4
JOBS     ?= $(shell nproc)
MPIRUN   ?= mpirun
# OpenMPI refuses root unless told; more ranks than cores need --oversubscribe.
export OMPI_ALLOW_RUN_AS_ROOT=1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPIFLAGS ?= --oversubscribe --bind-to none
RUN_ARGS ?=

.PHONY: all deps build run test debug clean

all: build

deps:
	@bash scripts/install-deps.sh

$(BUILD)/CMakeCache.txt: | deps
	cmake --preset $(PRESET)

build: deps $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

run: build
	OMP_NUM_THREADS=1 $(MPIRUN) -np $(NP) $(MPIFLAGS) $(BUILD)/ctxpar train --config inputs/default.toml $(RUN_ARGS)

# Tests run TEST_JOBS at a time, then the ten slowest print. Four per core: a test's PROCESSORS
# is its rank count, and with fewer slots the 4- and 8-rank tests run alone, leaving cores idle
# while their interpreter starts or their ranks wait (2 cores: -j4 764 s, -j8 658 s;
# docs/measurements.md).
TEST_JOBS ?= $(shell echo $$(( 4 * $$(nproc) )))
CTEST_ARGS ?=
test: build
	@cd $(BUILD) || exit 1; rc=0; ctest --output-on-failure -j $(TEST_JOBS) --output-junit ctest-junit.xml $(CTEST_ARGS) || rc=$$?; \
	  sh $(CURDIR)/scripts/slowest_tests.sh ctest-junit.xml; exit $$rc

debug: deps
	cmake --preset cpu-debug && cmake --build build-debug -j $(JOBS)
	# OpenMPI's own allocations would be reported as leaks; SLURM/jobs tests drive the release binary.
	cd build-debug && ASAN_OPTIONS=detect_leaks=0 ctest --output-on-failure -j $(JOBS) -LE "slurm|jobs"

clean:
	rm -rf $(BUILD) build-debug

# make figures: every figure (PNG + CSV, analysis/figures.py) from the traces under
# $(FIGURES_SWEEP), after a small local sweep into it (jobs/sweep.py --local keeps finished runs,
# so a second call only redraws). Point FIGURES_SWEEP at a cluster sweep to draw that instead.
FIGURES_SWEEP      ?= out/sweep
FIGURES_OUT        ?= out/figures
FIGURES_SWEEP_ARGS ?= --mode train --config inputs/tiny.toml --nodes 1,2 --ranks-per-node 2 \
                      --strategies ring,allgather --seq 512,1K,2K -- steps=3 warmup=1
.PHONY: figures
figures: build
	/usr/bin/python3 jobs/sweep.py --local --quiet --ctxpar $(BUILD)/ctxpar --out $(FIGURES_SWEEP) $(FIGURES_SWEEP_ARGS)
	/usr/bin/python3 -m analysis.figures $(FIGURES_SWEEP) -o $(FIGURES_OUT)
