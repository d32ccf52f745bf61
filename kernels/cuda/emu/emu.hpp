// CPU emulator of the CUDA execution model, for testing the kernels of kernels/cuda on machines
// without a GPU (CI, and every session that has none). It is force-included (-include) when the
// kernel sources and tests/gpu/test_cuda_ops.cpp are compiled as plain C++ with
// -DCTXPAR_CUDA_EMU (tests/gpu/CMakeLists.txt, target test_cuda_ops_emu). Not part of the library.
//
// What it emulates
//  - Blocks run one after another; the threads of a block are cooperative fibers on the calling OS
//    thread (a register-only stack switch on x86-64: glibc's swapcontext makes a sigprocmask system
//    call per switch, half of an emulated training step's time; ucontext elsewhere and under
//    AddressSanitizer, which knows swapcontext), switched only at synchronization points: __syncthreads, __syncwarp and
//    every warp collective (__shfl_xor_sync, mma.sync, ldmatrix). Scheduling is adversarial for
//    missing barriers: each round takes the warps in a pseudo-random order (fixed seed: runs are
//    reproducible) and runs each warp as far as it can get — until all its threads wait at
//    __syncthreads or have exited — before the next warp starts; lanes within a warp are resumed
//    in random order. A warp thus runs through a whole segment between two __syncthreads while
//    the other warps have not started it, so a missing barrier between a write and another warp's
//    read shows up as wrong data. A round in which no thread arrives at a barrier or finishes is
//    a deadlock (divergent __syncthreads, a collective with exited lanes) and aborts with a
//    message — stricter than a GPU.
//  - mma.sync.m16n8k16 (bf16 x bf16 + fp32) and ldmatrix.x4[.trans] implemented from the PTX ISA
//    fragment tables (kernels/cuda/mma.cuh quotes them), written independently of the helpers in
//    mma.cuh that produce the fragments: a helper that puts an element in the wrong lane or
//    register gives a wrong product here, as on the GPU. Products are summed in fp32 in k order
//    (the tensor core's internal summation order and rounding differ at the last-bit level).
//  - cp.async: a copy may land any time between its issue and the wait for its group; the
//    emulator takes one extreme or the other. Default ("late"): copies are performed at
//    cp.async.wait_group, so reading a tile before waiting for it reads stale data. With
//    CTXPAR_EMU_CP_ASYNC=early in the environment: copies land at issue, so issuing a copy into a
//    buffer that another warp may still be reading (a missing __syncthreads before the reload)
//    corrupts that warp's data. tests/gpu runs the emulated test in both modes. A thread that
//    exits with copies outstanding aborts; alignment rules (16 bytes) of cp.async and ldmatrix
//    are checked.
//  - Dynamic shared memory is filled with 0xFF bytes (NaN as float and bf16) at every block start,
//    so reading shared memory nobody wrote shows up as NaN; the size limit set with
//    cudaFuncSetAttribute (default 48 KiB, at most 227 KiB as on sm_90) is enforced.
//  - The runtime calls the kernels and tests use (malloc/memcpy/memset, async variants, streams as
//    no-ops, cudaGetDeviceCount = 1) are mapped to host versions by macros, so the emulated build
//    needs no CUDA driver and no libcudart.
// What it does not emulate: timing, concurrency between blocks (atomics are plain adds), cuBLASLt,
// memory spaces (device pointers are host pointers), bank conflicts, register limits.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <ucontext.h>

#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <numeric>
#include <random>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace ctxpar::cuda::emu {

#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__)
#define CTXPAR_EMU_FAST_SWITCH 1
// Saves the callee-saved registers, MXCSR and the x87 control word on the current stack, stores
// the stack pointer in *save_sp, loads load_sp and restores what that stack saved (System V ABI:
// everything else is caller-saved). A new fiber's stack is laid out by fiber_stack() below.
inline __attribute__((naked, noinline)) void stack_switch(void** /*save_sp*/, void* /*load_sp*/) {
  __asm__ volatile(
      "pushq %rbp\n\t"
      "pushq %rbx\n\t"
      "pushq %r12\n\t"
      "pushq %r13\n\t"
      "pushq %r14\n\t"
      "pushq %r15\n\t"
      "subq $8, %rsp\n\t"
      "stmxcsr (%rsp)\n\t"
      "fnstcw 4(%rsp)\n\t"
      "movq %rsp, (%rdi)\n\t"
      "movq %rsi, %rsp\n\t"
      "ldmxcsr (%rsp)\n\t"
      "fldcw 4(%rsp)\n\t"
      "addq $8, %rsp\n\t"
      "popq %r15\n\t"
      "popq %r14\n\t"
      "popq %r13\n\t"
      "popq %r12\n\t"
      "popq %rbx\n\t"
      "popq %rbp\n\t"
      "ret\n\t");
}
#endif

[[noreturn]] inline void fail(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  std::fprintf(stderr, "\n[cuda emulator] ");
  std::vfprintf(stderr, fmt, ap);
  std::fprintf(stderr, "\n");
  va_end(ap);
  std::abort();
}

struct Barrier {
  int count = 0, arrived = 0;
  uint64_t gen = 0;
};

struct PendingCopy {
  void* dst;
  const void* src;
  bool valid;
};

struct Fiber {
#if CTXPAR_EMU_FAST_SWITCH
  void* sp = nullptr;  // the saved stack pointer while switched out
#else
  ucontext_t ctx{};
#endif
  char* stack = nullptr;
  uint3 tid{0, 0, 0};
  bool done = false;
  std::vector<std::vector<PendingCopy>> groups;  // committed cp.async groups, oldest first
  std::vector<PendingCopy> open;                 // issued, not yet committed
};

constexpr int kSlots = 8;                     // 64-bit exchange slots per lane for collectives
constexpr size_t kStackBytes = size_t(256) << 10;
constexpr int kDefaultDynSmem = 48 * 1024;
constexpr int kMaxDynSmem = 227 * 1024;       // sm_90 opt-in maximum per block

struct Machine {
  dim3 grid, block;
  uint3 bid{0, 0, 0};
  std::function<void()> body;
  unsigned char* dyn_smem = nullptr;
  size_t dyn_smem_cap = 0;
  std::vector<Fiber> fibers;
  int current = -1;
  Barrier block_bar;
  std::vector<Barrier> warp_bars;
  std::vector<std::vector<uint64_t>> xchg;  // per warp: 32 lanes x kSlots
#if CTXPAR_EMU_FAST_SWITCH
  void* sched_sp = nullptr;
#else
  ucontext_t sched{};
#endif
  uint64_t events = 0;
  std::map<const void*, int> max_dyn_smem;  // per kernel, from cudaFuncSetAttribute
  std::vector<int> warp_order, lane_order;  // visiting orders, reshuffled every round
  bool cp_async_early = [] {
    const char* e = std::getenv("CTXPAR_EMU_CP_ASYNC");
    return e != nullptr && std::strcmp(e, "early") == 0;
  }();
  std::mt19937 rng{12345};
  cudaError_t last_error = cudaSuccess;
  ~Machine() {  // fiber stacks and shared memory live as long as the process (LeakSanitizer)
    for (Fiber& f : fibers) std::free(f.stack);
    std::free(dyn_smem);
  }
};

inline Machine& machine() {
  static Machine m;
  return m;
}

inline Fiber& self() {
  Machine& m = machine();
  if (m.current < 0) fail("a device intrinsic was called outside a kernel");
  return m.fibers[size_t(m.current)];
}
inline const uint3& thread_idx() { return self().tid; }
inline const uint3& block_idx() { return machine().bid; }
inline const dim3& block_dim() { return machine().block; }
inline const dim3& grid_dim() { return machine().grid; }

inline void yield() {
  Machine& m = machine();
#if CTXPAR_EMU_FAST_SWITCH
  stack_switch(&self().sp, m.sched_sp);
#else
  swapcontext(&self().ctx, &m.sched);
#endif
}

inline void barrier_wait(Barrier& b) {
  Machine& m = machine();
  ++m.events;
  const uint64_t g = b.gen;
  if (++b.arrived == b.count) {
    b.arrived = 0;
    ++b.gen;
    return;
  }
  while (b.gen == g) yield();
}

inline int lane() { return int(self().tid.x) & 31; }
inline int warp() { return int(self().tid.x) >> 5; }
inline void syncthreads() { barrier_wait(machine().block_bar); }
inline void syncwarp() { barrier_wait(machine().warp_bars[size_t(warp())]); }
inline uint64_t* slots(int l) { return machine().xchg[size_t(warp())].data() + size_t(l) * kSlots; }

template <class T>
T shfl_xor(unsigned mask, T v, int lane_mask) {
  static_assert(sizeof(T) <= 8, "shfl of more than 8 bytes");
  if (mask != 0xffffffffu) fail("__shfl_xor_sync with a partial mask is not emulated");
  if (lane_mask <= 0 || lane_mask >= 32) fail("__shfl_xor_sync lane mask %d outside 1..31", lane_mask);
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  slots(lane())[0] = bits;
  syncwarp();
  const uint64_t o = slots(lane() ^ lane_mask)[0];
  syncwarp();
  T r;
  std::memcpy(&r, &o, sizeof(T));
  return r;
}

inline float bf16_bits_to_float(uint32_t h) {
  const uint32_t u = (h & 0xffffu) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 from the PTX ISA tables:
//   A element (row, k): register (row >= 8) + 2 (k >= 8) of lane 4 (row % 8) + (k % 8) / 2,
//     low half for even k;  B element (k, col): register (k >= 8) of lane 4 col + (k % 8) / 2;
//   C/D: lane 4 g + t holds (g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1).
inline void mma_16816(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  uint64_t* const w = slots(0);  // this warp's exchange slots (32 lanes x kSlots), looked up once
  const int L = lane();
  uint64_t* s = w + size_t(L) * kSlots;
  for (int i = 0; i < 4; ++i) s[i] = a[i];
  s[4] = b[0];
  s[5] = b[1];
  syncwarp();
  // This lane's two rows of A (g, g + 8) and two columns of B (2t, 2t + 1), read once.
  const int g = L >> 2, t = L & 3;
  float ar[2][16], bc[2][16];
  for (int k = 0; k < 16; ++k) {
    const int half = (k & 1) ? 16 : 0;
    for (int h = 0; h < 2; ++h) {
      const int row = g + 8 * h, col = 2 * t + h;
      const uint64_t ra = w[size_t((row % 8) * 4 + (k % 8) / 2) * kSlots + (row >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0)];
      const uint64_t rb = w[size_t(col * 4 + (k % 8) / 2) * kSlots + 4 + (k >= 8 ? 1 : 0)];
      ar[h][k] = bf16_bits_to_float(uint32_t(ra) >> half);
      bc[h][k] = bf16_bits_to_float(uint32_t(rb) >> half);
    }
  }
  float out[4];
  for (int e = 0; e < 4; ++e) {
    const float* a_row = ar[e >> 1];
    const float* b_col = bc[e & 1];
    float acc = 0.f;
    for (int k = 0; k < 16; ++k) acc += a_row[k] * b_col[k];
    out[e] = c[e] + acc;
  }
  syncwarp();
  for (int e = 0; e < 4; ++e) c[e] = out[e];
}

// ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16: lanes 8j..8j+7 give the 8 row addresses of
// matrix j (16 bytes each). Without .trans lane L receives row L/4, columns 2(L%4), 2(L%4)+1 of
// each matrix; with .trans, rows 2(L%4) and 2(L%4)+1 of column L/4 (the transposed matrix's row
// L/4). Register j holds matrix j, the first element in the low half.
inline void ldmatrix_x4(uint32_t (&r)[4], const void* row_addr, bool trans) {
  if (reinterpret_cast<uintptr_t>(row_addr) & 15u) fail("ldmatrix: row address %p not 16-byte aligned", row_addr);
  uint64_t* const w = slots(0);  // this warp's exchange slots, looked up once
  const int L = lane();
  w[size_t(L) * kSlots] = uint64_t(reinterpret_cast<uintptr_t>(row_addr));
  syncwarp();
  auto row = [w](int l) { return reinterpret_cast<const uint16_t*>(uintptr_t(w[size_t(l) * kSlots])); };
  for (int j = 0; j < 4; ++j) {
    uint32_t lo, hi;
    if (!trans) {
      lo = row(8 * j + L / 4)[2 * (L % 4)];
      hi = row(8 * j + L / 4)[2 * (L % 4) + 1];
    } else {
      lo = row(8 * j + 2 * (L % 4))[L / 4];
      hi = row(8 * j + 2 * (L % 4) + 1)[L / 4];
    }
    r[j] = lo | (hi << 16);
  }
  syncwarp();
}

inline void cp_async16(void* dst, const void* src, bool valid) {
  if (reinterpret_cast<uintptr_t>(dst) & 15u) fail("cp.async: shared address %p not 16-byte aligned", dst);
  if (valid && (reinterpret_cast<uintptr_t>(src) & 15u)) fail("cp.async: global address %p not 16-byte aligned", src);
  if (machine().cp_async_early) {
    if (valid)
      std::memcpy(dst, src, 16);
    else
      std::memset(dst, 0, 16);
    return;
  }
  self().open.push_back({dst, src, valid});
}
inline void cp_async_commit() {
  Fiber& f = self();
  f.groups.push_back(std::move(f.open));
  f.open.clear();
}
inline void cp_async_wait(int n) {
  Fiber& f = self();
  while (int(f.groups.size()) > n) {
    for (const PendingCopy& c : f.groups.front()) {
      if (c.valid)
        std::memcpy(c.dst, c.src, 16);
      else
        std::memset(c.dst, 0, 16);
    }
    f.groups.erase(f.groups.begin());
  }
}

inline unsigned char* dynamic_smem() { return machine().dyn_smem; }

inline void fiber_entry() {
  Machine& m = machine();
  m.body();
  Fiber& f = self();
  if (!f.open.empty() || !f.groups.empty()) fail("thread %u exited with cp.async copies not waited for", f.tid.x);
  f.done = true;
  ++m.events;
}  // returns to uc_link = the scheduler (ucontext)

#if CTXPAR_EMU_FAST_SWITCH
// A fiber's first frame: runs the thread, then leaves for the scheduler for good.
[[noreturn]] inline void fiber_trampoline() {
  fiber_entry();
  void* dead = nullptr;
  stack_switch(&dead, machine().sched_sp);
  __builtin_unreachable();
}

// The initial stack of a fiber, as stack_switch leaves one: MXCSR and the x87 control word (the
// caller's), six callee-saved registers (zero), the trampoline as the return address, and a
// zero fake return address for the trampoline (so its frame is 16-byte aligned as after a call).
inline void* fiber_stack(char* stack, size_t bytes) {
  uintptr_t top = (reinterpret_cast<uintptr_t>(stack) + bytes) & ~uintptr_t(15);
  uint64_t* p = reinterpret_cast<uint64_t*>(top);
  *--p = 0;                                                // fake return address of the trampoline
  *--p = reinterpret_cast<uint64_t>(&fiber_trampoline);    // popped by ret
  for (int i = 0; i < 6; ++i) *--p = 0;                    // rbp rbx r12 r13 r14 r15
  uint32_t mxcsr = 0;
  uint16_t fcw = 0;
  __asm__ volatile("stmxcsr %0" : "=m"(mxcsr));
  __asm__ volatile("fnstcw %0" : "=m"(fcw));
  *--p = uint64_t(mxcsr) | (uint64_t(fcw) << 32);
  return p;
}
#endif

inline void run_block(const uint3 bid) {
  Machine& m = machine();
  const int n = int(m.block.x);
  m.bid = bid;
  if (m.dyn_smem) std::memset(m.dyn_smem, 0xFF, m.dyn_smem_cap);
  if (int(m.fibers.size()) < n) m.fibers.resize(size_t(n));
  m.block_bar = Barrier{n, 0, 0};
  m.warp_bars.assign(size_t(n / 32), Barrier{32, 0, 0});
  m.xchg.assign(size_t(n / 32), std::vector<uint64_t>(32 * kSlots, 0));
  for (int i = 0; i < n; ++i) {
    Fiber& f = m.fibers[size_t(i)];
    if (!f.stack) f.stack = static_cast<char*>(std::malloc(kStackBytes));
    f.tid = uint3{unsigned(i), 0, 0};
    f.done = false;
    f.groups.clear();
    f.open.clear();
#if CTXPAR_EMU_FAST_SWITCH
    f.sp = fiber_stack(f.stack, kStackBytes);
#else
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = f.stack;
    f.ctx.uc_stack.ss_size = kStackBytes;
    f.ctx.uc_link = &m.sched;
    makecontext(&f.ctx, fiber_entry, 0);
#endif
  }
  m.warp_order.resize(size_t(n / 32));
  std::iota(m.warp_order.begin(), m.warp_order.end(), 0);
  m.lane_order.resize(32);
  std::iota(m.lane_order.begin(), m.lane_order.end(), 0);
  for (;;) {
    const uint64_t before = m.events;
    bool alive = false;
    std::shuffle(m.warp_order.begin(), m.warp_order.end(), m.rng);
    for (const int w : m.warp_order) {
      for (;;) {  // run warp w until it makes no progress (all its threads at __syncthreads or done)
        const uint64_t warp_before = m.events;
        bool warp_alive = false;
        std::shuffle(m.lane_order.begin(), m.lane_order.end(), m.rng);
        for (const int l : m.lane_order) {
          const int i = 32 * w + l;
          if (m.fibers[size_t(i)].done) continue;
          warp_alive = alive = true;
          m.current = i;
#if CTXPAR_EMU_FAST_SWITCH
          stack_switch(&m.sched_sp, m.fibers[size_t(i)].sp);
#else
          swapcontext(&m.sched, &m.fibers[size_t(i)].ctx);
#endif
        }
        m.current = -1;
        if (!warp_alive || m.events == warp_before) break;
      }
    }
    if (!alive) break;
    if (m.events == before)
      fail("deadlock in block (%u,%u,%u): every live thread waits at a barrier that cannot complete "
           "(divergent __syncthreads, or a warp collective after some lanes exited)",
           bid.x, bid.y, bid.z);
  }
}

// The launch's configuration, checked when it is made (a GPU reports these at the launch too).
template <class... P>
void check_launch(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem_bytes) {
  Machine& m = machine();
  if (m.current >= 0) fail("kernel launched from inside a kernel");
  if (block.y != 1 || block.z != 1) fail("only 1-D blocks are emulated");
  if (block.x == 0 || block.x > 1024 || block.x % 32 != 0)
    fail("block of %u threads: the emulator needs a multiple of 32 up to 1024", block.x);
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.y > 65535 || grid.z > 65535 || grid.x > 0x7fffffffu)
    fail("invalid grid (%u, %u, %u)", grid.x, grid.y, grid.z);
  const auto it = m.max_dyn_smem.find(reinterpret_cast<const void*>(kernel));
  const int limit = it == m.max_dyn_smem.end() ? kDefaultDynSmem : it->second;
  if (smem_bytes > size_t(limit))
    fail("launch with %zu bytes of dynamic shared memory; the kernel allows %d (cudaFuncSetAttribute)", smem_bytes, limit);
}

// Runs every block of a checked launch, one after another.
template <class... P, class Tuple>
void run_grid(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem_bytes, Tuple& params) {
  Machine& m = machine();
  if (smem_bytes > m.dyn_smem_cap) {
    std::free(m.dyn_smem);
    m.dyn_smem = static_cast<unsigned char*>(std::aligned_alloc(128, (smem_bytes + 127) / 128 * 128));
    m.dyn_smem_cap = (smem_bytes + 127) / 128 * 128;
  }
  m.body = [&] { std::apply(kernel, params); };
  m.grid = grid;
  m.block = block;
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) run_block(uint3{x, y, z});
  m.body = nullptr;
}

// CTXPAR_LAUNCH. By default the kernel runs at once (streams are not modelled). With
// CTXPAR_CUDA_EMU_STREAMS the runtime is a test double with streams (tests/gpu/cuda_runtime_mock.cpp,
// linked instead of libcudart, which this header then leaves unmapped): the launch is checked
// now and enqueued on `stream` through cudaLaunchHostFunc, so it runs in stream order, after the
// copies and event waits enqueued before it, as on a GPU.
template <class... P, class... A>
void launch(cudaStream_t stream, void (*kernel)(P...), dim3 grid, dim3 block, size_t smem_bytes, A&&... args) {
  check_launch(kernel, grid, block, smem_bytes);
#if defined(CTXPAR_CUDA_EMU_STREAMS)
  struct Deferred {
    std::function<void()> run;
  };
  auto* d = new Deferred{[kernel, grid, block, smem_bytes,
                          params = std::tuple<std::decay_t<P>...>(std::forward<A>(args)...)]() mutable {
    run_grid(kernel, grid, block, smem_bytes, params);
  }};
  const cudaError_t e = cudaLaunchHostFunc(
      stream,
      [](void* u) {
        auto* dd = static_cast<Deferred*>(u);
        dd->run();
        delete dd;
      },
      d);
  if (e != cudaSuccess) fail("cudaLaunchHostFunc failed for an emulated kernel");
#else
  (void)stream;
  std::tuple<std::decay_t<P>...> params(std::forward<A>(args)...);
  run_grid(kernel, grid, block, smem_bytes, params);
#endif
}

// ---- runtime API on host memory ----
template <class T>
cudaError_t rt_malloc(T** p, size_t n) {
  *p = static_cast<T*>(std::aligned_alloc(256, (n + 255) / 256 * 256 + 256));
  return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
template <class T>
cudaError_t rt_malloc_async(T** p, size_t n, cudaStream_t) {
  return rt_malloc(p, n);
}
inline cudaError_t rt_free(void* p) {
  std::free(p);
  return cudaSuccess;
}
inline cudaError_t rt_free_async(void* p, cudaStream_t) { return rt_free(p); }
template <class T>
cudaError_t rt_host_alloc(T** p, size_t n, unsigned) {  // pinned memory is host memory here
  return rt_malloc(p, n);
}
inline cudaError_t rt_memcpy(void* d, const void* s, size_t n, cudaMemcpyKind) {
  if (n) std::memmove(d, s, n);
  return cudaSuccess;
}
inline cudaError_t rt_memcpy_async(void* d, const void* s, size_t n, cudaMemcpyKind k, cudaStream_t = nullptr) {
  return rt_memcpy(d, s, n, k);
}
inline cudaError_t rt_memcpy_2d_async(void* d, size_t dp, const void* s, size_t sp, size_t w, size_t h, cudaMemcpyKind,
                                      cudaStream_t = nullptr) {
  for (size_t i = 0; i < h; ++i)
    if (w) std::memmove(static_cast<char*>(d) + i * dp, static_cast<const char*>(s) + i * sp, w);
  return cudaSuccess;
}
inline cudaError_t rt_memset(void* d, int v, size_t n) {
  if (n) std::memset(d, v, n);
  return cudaSuccess;
}
inline cudaError_t rt_memset_async(void* d, int v, size_t n, cudaStream_t = nullptr) { return rt_memset(d, v, n); }
inline cudaError_t rt_ok(...) { return cudaSuccess; }
// Events: kernels run at once here, so every event is complete and no time passes between two.
inline cudaError_t rt_event_create(cudaEvent_t* e, unsigned) {
  static char token;
  *e = reinterpret_cast<cudaEvent_t>(&token);
  return cudaSuccess;
}
inline cudaError_t rt_event_elapsed(float* ms, cudaEvent_t, cudaEvent_t) {
  *ms = 0;
  return cudaSuccess;
}
inline cudaError_t rt_stream_create(cudaStream_t* s, unsigned) {  // streams are not modelled: one order
  *s = nullptr;
  return cudaSuccess;
}
inline cudaError_t rt_get_last_error() {
  const cudaError_t e = machine().last_error;
  machine().last_error = cudaSuccess;
  return e;
}
inline cudaError_t rt_get_device_count(int* n) {
  *n = 1;
  return cudaSuccess;
}
inline cudaError_t rt_get_device(int* d) {
  *d = 0;
  return cudaSuccess;
}
inline cudaError_t rt_get_device_properties(cudaDeviceProp* p, int) {
  std::memset(p, 0, sizeof *p);
  std::snprintf(p->name, sizeof p->name, "ctxpar CPU emulator");
  p->major = 9;
  p->minor = 0;
  p->multiProcessorCount = 1;
  p->totalGlobalMem = size_t(1) << 30;
  return cudaSuccess;
}
template <class F>
cudaError_t rt_func_set_attribute(F* f, cudaFuncAttribute attr, int value) {
  if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize) {
    if (value < 0 || value > kMaxDynSmem) return cudaErrorInvalidValue;
    machine().max_dyn_smem[reinterpret_cast<const void*>(f)] = value;
  }
  return cudaSuccess;
}
inline const char* rt_error_name(cudaError_t e) { return e == cudaSuccess ? "cudaSuccess" : "cudaError (emulated)"; }

}  // namespace ctxpar::cuda::emu

// ---- device intrinsics and built-ins ----
#undef __shared__
#define __shared__ static  // blocks run one at a time: a static is the block's shared variable
#define __launch_bounds__(...)
#define threadIdx (::ctxpar::cuda::emu::thread_idx())
#define blockIdx (::ctxpar::cuda::emu::block_idx())
#define blockDim (::ctxpar::cuda::emu::block_dim())
#define gridDim (::ctxpar::cuda::emu::grid_dim())
#define __syncthreads() ::ctxpar::cuda::emu::syncthreads()
#define __syncwarp(...) ::ctxpar::cuda::emu::syncwarp()
#define __shfl_xor_sync(mask, v, lane_mask) ::ctxpar::cuda::emu::shfl_xor((mask), (v), (lane_mask))

inline float atomicAdd(float* p, float v) {
  const float o = *p;
  *p = o + v;
  return o;
}
inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
  const unsigned long long o = *p;
  *p = o + v;
  return o;
}

// ---- runtime API ----
// (With CTXPAR_CUDA_EMU_STREAMS these come from the runtime test double instead; only the shared
// memory limit stays the emulator's.)
#define cudaFuncSetAttribute(...) ::ctxpar::cuda::emu::rt_func_set_attribute(__VA_ARGS__)
#if !defined(CTXPAR_CUDA_EMU_STREAMS)
#define cudaMalloc(...) ::ctxpar::cuda::emu::rt_malloc(__VA_ARGS__)
#define cudaMallocAsync(...) ::ctxpar::cuda::emu::rt_malloc_async(__VA_ARGS__)
#define cudaFree(...) ::ctxpar::cuda::emu::rt_free(__VA_ARGS__)
#define cudaFreeAsync(...) ::ctxpar::cuda::emu::rt_free_async(__VA_ARGS__)
#define cudaHostAlloc(...) ::ctxpar::cuda::emu::rt_host_alloc(__VA_ARGS__)
#define cudaFreeHost(...) ::ctxpar::cuda::emu::rt_free(__VA_ARGS__)
#define cudaMemcpy(...) ::ctxpar::cuda::emu::rt_memcpy(__VA_ARGS__)
#define cudaMemcpyAsync(...) ::ctxpar::cuda::emu::rt_memcpy_async(__VA_ARGS__)
#define cudaMemcpy2DAsync(...) ::ctxpar::cuda::emu::rt_memcpy_2d_async(__VA_ARGS__)
#define cudaMemset(...) ::ctxpar::cuda::emu::rt_memset(__VA_ARGS__)
#define cudaMemsetAsync(...) ::ctxpar::cuda::emu::rt_memset_async(__VA_ARGS__)
#define cudaStreamSynchronize(...) ::ctxpar::cuda::emu::rt_ok(__VA_ARGS__)
#define cudaStreamCreateWithFlags(...) ::ctxpar::cuda::emu::rt_stream_create(__VA_ARGS__)
#define cudaStreamDestroy(...) ::ctxpar::cuda::emu::rt_ok(__VA_ARGS__)
#define cudaEventCreateWithFlags(...) ::ctxpar::cuda::emu::rt_event_create(__VA_ARGS__)
#define cudaEventRecord(...) ::ctxpar::cuda::emu::rt_ok(__VA_ARGS__)
#define cudaEventSynchronize(...) ::ctxpar::cuda::emu::rt_ok(__VA_ARGS__)
#define cudaEventElapsedTime(...) ::ctxpar::cuda::emu::rt_event_elapsed(__VA_ARGS__)
#define cudaEventDestroy(...) ::ctxpar::cuda::emu::rt_ok(__VA_ARGS__)
#define cudaStreamWaitEvent(...) ::ctxpar::cuda::emu::rt_ok(__VA_ARGS__)
#define cudaDeviceSynchronize() ::ctxpar::cuda::emu::rt_ok()
#define cudaGetLastError() ::ctxpar::cuda::emu::rt_get_last_error()
#define cudaGetDeviceCount(...) ::ctxpar::cuda::emu::rt_get_device_count(__VA_ARGS__)
#define cudaGetDevice(...) ::ctxpar::cuda::emu::rt_get_device(__VA_ARGS__)
#define cudaGetDeviceProperties(...) ::ctxpar::cuda::emu::rt_get_device_properties(__VA_ARGS__)
#define cudaGetErrorName(e) ::ctxpar::cuda::emu::rt_error_name(e)
#define cudaGetErrorString(e) ::ctxpar::cuda::emu::rt_error_name(e)
#endif
