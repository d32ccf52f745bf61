// A test double of the CUDA runtime functions that src/dist's device communication, the CUDA
// backend's host code and the device tests call, so that the staged MPI backend (comm_staged.cpp),
// the rank → chip map, the strategies on device buffers and the tests themselves run — and must
// pass — on machines without a GPU (CI). Linked instead of libcudart into the test targets
// test_nccl_comm_mock, test_cp_device and ctxpar_emu only; the ctxpar program never uses it.
//
// "Device" memory is host memory. What makes the double worth having is asynchrony: every stream
// is a queue of deferred tasks (copies, memsets, host functions, event records, waits on events)
// that runs only when the host waits for something (cudaStreamSynchronize, cudaEventSynchronize,
// cudaDeviceSynchronize, cudaFree) — and then only that stream, plus, on demand, the streams whose
// events it waits for — or a single task per query (cudaEventQuery, cudaStreamQuery), so polling
// loops progress. Work that is not ordered by an event therefore runs late, and a missing
// cudaStreamWaitEvent shows up as stale data in the tests every time, where on a GPU it would
// show up only sometimes.
//
// Semantics kept from the CUDA runtime documentation: an event never recorded is complete;
// cudaStreamWaitEvent waits for the record current at the time of the call (re-recording later
// does not change it); cudaFree and cudaDeviceSynchronize finish all work; pageable host memory
// is staged as CUDA does (cudaMemcpyAsync). Kernels are not modelled here: the emulated kernels
// of kernels/cuda, built with CTXPAR_CUDA_EMU_STREAMS (emu.hpp), enqueue themselves through
// cudaLaunchHostFunc and so run in stream order like every other task. Not modelled:
// the legacy default stream's implicit synchronization with blocking streams (ctxpar creates only
// non-blocking streams), several devices' separate memories.
// CTXPAR_CUDA_MOCK_DEVICES (default 1) sets the device count.
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <vector>

namespace {

struct MockStream;

struct Record {  // one cudaEventRecord: done once its stream reached it
  bool done = false;
  MockStream* stream = nullptr;  // where it was recorded
  double at_ms = 0;              // host time when the stream reached it (cudaEventElapsedTime)
};

double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Task {
  std::function<void()> run;           // work (may be empty)
  std::shared_ptr<Record> wait_for;    // cudaStreamWaitEvent: runnable only when this is done
  std::shared_ptr<Record> completes;   // cudaEventRecord: marks this done
};

struct MockStream {
  std::deque<Task> q;
};

struct MockEvent {
  std::shared_ptr<Record> current;  // null: never recorded (complete)
};

std::vector<std::unique_ptr<MockStream>>& streams() {
  static std::vector<std::unique_ptr<MockStream>> s;
  return s;
}
MockStream& legacy() {  // stream 0
  static MockStream s;
  return s;
}
MockStream& of(cudaStream_t s) { return s == nullptr ? legacy() : *reinterpret_cast<MockStream*>(s); }

cudaError_t g_last = cudaSuccess;
int g_device = 0;

int device_count() {
  const char* e = std::getenv("CTXPAR_CUDA_MOCK_DEVICES");
  return e ? std::atoi(e) : 1;
}

[[noreturn]] void deadlock(const char* what) {
  std::fprintf(stderr, "cuda mock: deadlock in %s (a stream waits for work that is never enqueued)\n", what);
  std::abort();
}

template <class P> void drain_until(MockStream& s, P done, const char* what);

// Runs the head task of `s`, first running — on demand, and only as far as needed — the stream
// whose event it waits for. Lazy on purpose: nothing runs that no one waits for, so work that is
// not ordered by an event runs late, which is what exposes a missing cudaStreamWaitEvent.
bool step_toward(MockStream& s, const char* what) {
  if (s.q.empty()) return false;
  if (std::shared_ptr<Record> w = s.q.front().wait_for; w && !w->done) {
    if (w->stream == &s) deadlock(what);
    drain_until(*w->stream, [&] { return w->done; }, what);
  }
  Task t = std::move(s.q.front());
  s.q.pop_front();
  if (t.run) t.run();
  if (t.completes) {
    t.completes->done = true;
    t.completes->at_ms = now_ms();
  }
  return true;
}

template <class P> void drain_until(MockStream& s, P done, const char* what) {
  while (!done())
    if (!step_toward(s, what)) deadlock(what);
}

void drain_all(const char* what) {
  drain_until(legacy(), [] { return legacy().q.empty(); }, what);
  for (auto& s : streams()) drain_until(*s, [&] { return s->q.empty(); }, what);
}

// Pinned host allocations (cudaHostAlloc): start -> bytes.
std::map<const void*, size_t>& pinned() {
  static std::map<const void*, size_t> m;
  return m;
}
bool is_pinned(const void* p) {
  auto it = pinned().upper_bound(p);
  if (it == pinned().begin()) return false;
  --it;
  return static_cast<const unsigned char*>(p) < static_cast<const unsigned char*>(it->first) + it->second;
}

void enqueue(cudaStream_t s, std::function<void()> f) { of(s).q.push_back(Task{std::move(f), nullptr, nullptr}); }

cudaError_t ret(cudaError_t e) {
  if (e != cudaSuccess) g_last = e;
  return e;
}

}  // namespace

extern "C" {

cudaError_t cudaGetDeviceCount(int* count) {
  *count = device_count();
  return *count > 0 ? cudaSuccess : ret(cudaErrorNoDevice);
}
cudaError_t cudaGetDevice(int* device) {
  *device = g_device;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) {
  if (device < 0 || device >= device_count()) return ret(cudaErrorInvalidDevice);
  g_device = device;
  return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (device < 0 || device >= device_count()) return ret(cudaErrorInvalidDevice);
  std::memset(prop, 0, sizeof *prop);
  std::snprintf(prop->name, sizeof prop->name, "ctxpar CUDA mock");
  // Same UUID for the same index in every process: ranks on one mock device share a GPU.
  for (int i = 0; i < 16; ++i) prop->uuid.bytes[i] = char(0x40 + device + i);
  prop->major = 9;
  return cudaSuccess;
}
cudaError_t cudaDeviceGetPCIBusId(char* pciBusId, int len, int device) {
  if (device < 0 || device >= device_count()) return ret(cudaErrorInvalidDevice);
  std::snprintf(pciBusId, size_t(len), "0000:%02x:00.0", 0x19 + device);
  return cudaSuccess;
}
const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    default: return "cudaError(mock)";
  }
}
const char* cudaGetErrorString(cudaError_t e) { return cudaGetErrorName(e); }
cudaError_t cudaGetLastError(void) {
  const cudaError_t e = g_last;
  g_last = cudaSuccess;
  return e;
}

cudaError_t cudaMalloc(void** p, size_t bytes) {
  *p = std::malloc(bytes == 0 ? 1 : bytes);
  return *p ? cudaSuccess : ret(cudaErrorMemoryAllocation);
}
cudaError_t cudaFree(void* p) {
  drain_all("cudaFree");  // as CUDA: cudaFree waits for the device
  std::free(p);
  return cudaSuccess;
}
cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  // A mock device as large as an H200 (the memory check's arithmetic, not a real figure).
  *free_bytes = *total_bytes = size_t(141) << 30;
  return cudaSuccess;
}
cudaError_t cudaHostAlloc(void** p, size_t bytes, unsigned int) {
  const cudaError_t e = cudaMalloc(p, bytes);
  if (e == cudaSuccess) pinned()[*p] = bytes;
  return e;
}
cudaError_t cudaFreeHost(void* p) {
  pinned().erase(p);
  return cudaFree(p);
}
// Stream-ordered allocation: the memory exists at once (nothing can use it before the stream
// reaches later work anyway); the release waits for the stream's earlier work, as CUDA's does.
cudaError_t cudaMallocAsync(void** p, size_t bytes, cudaStream_t) {
  *p = std::malloc(bytes == 0 ? 1 : bytes);
  return *p ? cudaSuccess : ret(cudaErrorMemoryAllocation);
}
cudaError_t cudaFreeAsync(void* p, cudaStream_t s) {
  enqueue(s, [=] { std::free(p); });
  return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int) {
  streams().push_back(std::make_unique<MockStream>());
  *s = reinterpret_cast<cudaStream_t>(streams().back().get());
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  auto& v = streams();
  for (size_t i = 0; i < v.size(); ++i)
    if (reinterpret_cast<cudaStream_t>(v[i].get()) == s) {
      drain_until(*v[i], [&] { return v[i]->q.empty(); }, "cudaStreamDestroy");
      v.erase(v.begin() + std::ptrdiff_t(i));
      return cudaSuccess;
    }
  return ret(cudaErrorInvalidResourceHandle);
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  MockStream& st = of(s);
  drain_until(st, [&] { return st.q.empty(); }, "cudaStreamSynchronize");
  return cudaSuccess;
}
cudaError_t cudaStreamQuery(cudaStream_t s) {
  step_toward(of(s), "cudaStreamQuery");  // one task per query, so polling loops progress
  return of(s).q.empty() ? cudaSuccess : cudaErrorNotReady;
}
cudaError_t cudaDeviceSynchronize(void) {
  drain_all("cudaDeviceSynchronize");
  return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned int) {
  *e = reinterpret_cast<cudaEvent_t>(new MockEvent);
  return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t* e) { return cudaEventCreateWithFlags(e, 0); }
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  const auto* a = reinterpret_cast<MockEvent*>(start);
  const auto* b = reinterpret_cast<MockEvent*>(end);
  if (!a->current || !b->current) return ret(cudaErrorInvalidResourceHandle);
  if (!a->current->done || !b->current->done) return ret(cudaErrorNotReady);
  *ms = float(b->current->at_ms - a->current->at_ms);
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  delete reinterpret_cast<MockEvent*>(e);
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  auto* ev = reinterpret_cast<MockEvent*>(e);
  ev->current = std::make_shared<Record>();
  ev->current->stream = &of(s);
  of(s).q.push_back(Task{nullptr, nullptr, ev->current});
  return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t e) {
  auto* ev = reinterpret_cast<MockEvent*>(e);
  if (!ev->current || ev->current->done) return cudaSuccess;
  step_toward(*ev->current->stream, "cudaEventQuery");  // one task per query
  return ev->current->done ? cudaSuccess : cudaErrorNotReady;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  std::shared_ptr<Record> r = reinterpret_cast<MockEvent*>(e)->current;
  if (r) drain_until(*r->stream, [&] { return r->done; }, "cudaEventSynchronize");
  return cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int) {
  auto* ev = reinterpret_cast<MockEvent*>(e);
  if (ev->current && !ev->current->done) of(s).q.push_back(Task{nullptr, ev->current, nullptr});
  return cudaSuccess;
}

// As CUDA with pageable host memory (anything not from cudaHostAlloc): a copy from it is staged
// when the call is made (the caller may reuse the source at once), a copy into it returns only
// when complete. Copies from and to pinned memory and between device buffers are deferred.
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t s) {
  if (kind == cudaMemcpyHostToDevice && !is_pinned(src)) {
    auto staged = std::make_shared<std::vector<unsigned char>>(static_cast<const unsigned char*>(src),
                                                               static_cast<const unsigned char*>(src) + bytes);
    enqueue(s, [=] { std::memcpy(dst, staged->data(), bytes); });
    return cudaSuccess;
  }
  enqueue(s, [=] { std::memcpy(dst, src, bytes); });
  if (kind == cudaMemcpyDeviceToHost && !is_pinned(dst)) drain_until(of(s), [&] { return of(s).q.empty(); }, "cudaMemcpyAsync");
  return cudaSuccess;
}
cudaError_t cudaMemcpy2DAsync(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height,
                              cudaMemcpyKind kind, cudaStream_t s) {
  if (kind != cudaMemcpyDeviceToDevice) return ret(cudaErrorInvalidValue);  // what ctxpar uses; the rest unmodelled
  enqueue(s, [=] {
    for (size_t i = 0; i < height; ++i)
      std::memcpy(static_cast<char*>(dst) + i * dpitch, static_cast<const char*>(src) + i * spitch, width);
  });
  return cudaSuccess;
}
// Synchronous: waits for all earlier work (stricter than CUDA, whose legacy-stream copy waits
// only for blocking streams; ctxpar creates non-blocking ones), then copies.
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind) {
  drain_all("cudaMemcpy");
  std::memcpy(dst, src, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemset(void* p, int value, size_t bytes) {
  enqueue(nullptr, [=] { std::memset(p, value, bytes); });
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t s) {
  enqueue(s, [=] { std::memset(p, value, bytes); });
  return cudaSuccess;
}
cudaError_t cudaLaunchHostFunc(cudaStream_t s, cudaHostFn_t fn, void* user) {
  enqueue(s, [=] { fn(user); });
  return cudaSuccess;
}

}  // extern "C"
