#include "dist/chips.hpp"

#include <mpi.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <set>
#include <sstream>
#include <utility>

#include "dist/comm_mpi.hpp"
#include "dist/cuda_util.hpp"

namespace ctxpar {

NodeLocal node_local(Comm& comm) {
  MPI_Comm node = MPI_COMM_NULL;
  CTXPAR_CHECK(MPI_Comm_split_type(mpi_handle(comm), MPI_COMM_TYPE_SHARED, comm.rank(), MPI_INFO_NULL, &node) == MPI_SUCCESS,
               "MPI_Comm_split_type(shared) failed on communicator '" << comm.name() << "'");
  NodeLocal nl;
  MPI_Comm_rank(node, &nl.rank);
  MPI_Comm_size(node, &nl.size);
  MPI_Comm_free(&node);
  return nl;
}

int device_for_local_rank(int local_rank, int local_size, int device_count) {
  CTXPAR_CHECK(device_count >= 1, "device_for_local_rank: no GPU (device_count " << device_count << ")");
  CTXPAR_CHECK(local_size >= 1 && local_rank >= 0 && local_rank < local_size,
               "device_for_local_rank: local rank " << local_rank << " of " << local_size);
  if (device_count >= local_size) return local_rank;
  return int(int64_t(local_rank) * device_count / local_size);
}

DeviceCount cuda_device_count() {
  DeviceCount d;
  const cudaError_t e = cudaGetDeviceCount(&d.count);
  if (e != cudaSuccess) {
    d.count = 0;
    d.why = std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
    cudaGetLastError();  // reset the runtime's last error, so later checks report their own
  } else if (d.count == 0) {
    d.why = "the CUDA runtime sees no device";
  }
  return d;
}

DeviceMemory cuda_device_memory(int device) {
  DeviceMemory m;
  int prev = 0;
  if (cudaGetDevice(&prev) != cudaSuccess || cudaSetDevice(device) != cudaSuccess) {
    cudaGetLastError();
    return m;
  }
  size_t f = 0, t = 0;
  if (cudaMemGetInfo(&f, &t) == cudaSuccess) {
    m.free_bytes = int64_t(f);
    m.total_bytes = int64_t(t);
  }
  cudaGetLastError();
  cudaSetDevice(prev);
  return m;
}

int select_device(int local_rank, int local_size) {
  const DeviceCount dc = cuda_device_count();
  CTXPAR_CHECK(dc.count > 0, "device=cuda but no CUDA device is usable on host " << dist_detail::host_name() << ": "
                                                                                 << dc.why);
  const int dev = device_for_local_rank(local_rank, local_size, dc.count);
  CTXPAR_DIST_CUDA_CHECK(cudaSetDevice(dev));
  return dev;
}

double gpu_bf16_dense_peak_flops(const std::string& name) {
  // First match wins: the specific variants before the family.
  static const std::pair<const char*, double> kTable[] = {
      {"H200 NVL", 835e12}, {"GH200", 989e12}, {"H200", 989e12},   {"H100 PCIe", 756e12}, {"H100 NVL", 835e12},
      {"H100", 989e12},     {"H800", 989e12},  {"A100", 312e12},   {"A800", 312e12},      {"B200", 2250e12},
      {"B100", 1750e12},    {"L40S", 362e12},  {"L40", 181e12},    {"L4", 121e12}};
  for (const auto& [key, flops] : kTable)
    if (name.find(key) != std::string::npos) return flops;
  return 0;
}

ChipInfo this_chip(int rank, int local_rank, int local_size, int device) {
  ChipInfo c;
  c.rank = rank;
  c.host = dist_detail::host_name();
  c.local_rank = local_rank;
  c.local_size = local_size;
  c.device = device;
  cudaDeviceProp prop{};
  CTXPAR_DIST_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  c.name = prop.name;
  char bus[32] = {0};
  CTXPAR_DIST_CUDA_CHECK(cudaDeviceGetPCIBusId(bus, int(sizeof bus), device));
  c.pci_bus_id = bus;
  return c;
}

namespace {

// Fixed-size record for the all_gather (strings cut at the field width, always terminated).
constexpr size_t kStr = 96;
struct ChipRecord {
  int32_t rank, local_rank, local_size, device;
  char host[kStr], name[kStr], pci[kStr];
};

void put(char (&dst)[kStr], const std::string& s) {
  std::memset(dst, 0, kStr);
  std::memcpy(dst, s.data(), std::min(s.size(), kStr - 1));
}

}  // namespace

std::vector<ChipInfo> gather_chip_map(Comm& comm, const ChipInfo& mine) {
  ChipRecord rec{};
  rec.rank = mine.rank;
  rec.local_rank = mine.local_rank;
  rec.local_size = mine.local_size;
  rec.device = mine.device;
  put(rec.host, mine.host);
  put(rec.name, mine.name);
  put(rec.pci, mine.pci_bus_id);
  std::vector<ChipRecord> all(size_t(comm.size()));
  comm.all_gather(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(&rec), sizeof rec),
                  std::span<uint8_t>(reinterpret_cast<uint8_t*>(all.data()), all.size() * sizeof rec));
  std::vector<ChipInfo> map;
  for (const ChipRecord& r : all) {
    ChipInfo c;
    c.rank = r.rank;
    c.local_rank = r.local_rank;
    c.local_size = r.local_size;
    c.device = r.device;
    c.host = r.host;
    c.name = r.name;
    c.pci_bus_id = r.pci;
    map.push_back(std::move(c));
  }
  return map;
}

std::string describe_chip_map(const std::vector<ChipInfo>& map) {
  // A GPU is (host, PCI bus id); the device index alone repeats across hosts.
  std::map<std::pair<std::string, std::string>, std::vector<int>> ranks_of_gpu;
  std::set<std::string> hosts;
  for (const ChipInfo& c : map) {
    ranks_of_gpu[{c.host, c.pci_bus_id}].push_back(c.rank);
    hosts.insert(c.host);
  }
  size_t most = 0;
  for (const auto& [gpu, ranks] : ranks_of_gpu) most = std::max(most, ranks.size());
  std::ostringstream os;
  os << "rank -> chip: " << map.size() << (map.size() == 1 ? " rank" : " ranks") << " on " << hosts.size()
     << (hosts.size() == 1 ? " host, " : " hosts, ") << ranks_of_gpu.size() << (ranks_of_gpu.size() == 1 ? " GPU" : " GPUs");
  if (most > 1) os << " (up to " << most << " ranks per GPU)";
  os << "\n";
  for (const ChipInfo& c : map) {
    os << "  rank " << c.rank << "  host " << c.host << "  local " << c.local_rank << "/" << c.local_size << "  cuda:"
       << c.device << "  " << c.name << "  " << c.pci_bus_id;
    const std::vector<int>& sharers = ranks_of_gpu[{c.host, c.pci_bus_id}];
    if (sharers.size() > 1) {
      os << "  shared with ranks ";
      bool first = true;
      for (int r : sharers) {
        if (r == c.rank) continue;
        os << (first ? "" : ",") << r;
        first = false;
      }
    }
    os << "\n";
  }
  return os.str();
}

}  // namespace ctxpar
