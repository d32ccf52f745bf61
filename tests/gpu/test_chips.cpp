// Rank → GPU mapping (dist/chips.hpp). The policy, the map's text and its gather need no GPU, so
// they run everywhere (CI included); the queries of a real device run only where one is present.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "dist/chips.hpp"
#include "mpi_test_env.hpp"

using namespace ctxpar;
using ctxpar::test::world;

namespace {

TEST(Chips, OneGpuPerRankWhenEnoughGpus) {
  for (int L : {1, 2, 4, 8})
    for (int G : {L, 8, 16})
      for (int l = 0; l < L; ++l) EXPECT_EQ(device_for_local_rank(l, L, G), l) << "L=" << L << " G=" << G;
}

TEST(Chips, SharedGpusInContiguousBalancedBlocks) {
  // 4 ranks, 1 GPU: all on 0. 4 ranks, 2 GPUs: 0,0,1,1. 3 ranks, 2 GPUs: 0,0,1.
  for (int l = 0; l < 4; ++l) EXPECT_EQ(device_for_local_rank(l, 4, 1), 0);
  const std::vector<int> two = {0, 0, 1, 1};
  for (int l = 0; l < 4; ++l) EXPECT_EQ(device_for_local_rank(l, 4, 2), two[size_t(l)]);
  const std::vector<int> three = {0, 0, 1};
  for (int l = 0; l < 3; ++l) EXPECT_EQ(device_for_local_rank(l, 3, 2), three[size_t(l)]);
  // Every GPU used, loads differ by at most one, devices non-decreasing in the local rank.
  for (int L = 2; L <= 16; ++L)
    for (int G = 1; G < L; ++G) {
      std::vector<int> load(size_t(G), 0);
      int prev = 0;
      for (int l = 0; l < L; ++l) {
        const int d = device_for_local_rank(l, L, G);
        ASSERT_GE(d, prev) << "L=" << L << " G=" << G;
        ASSERT_LT(d, G);
        prev = d;
        ++load[size_t(d)];
      }
      const auto [lo, hi] = std::minmax_element(load.begin(), load.end());
      EXPECT_GE(*lo, 1) << "L=" << L << " G=" << G;
      EXPECT_LE(*hi - *lo, 1) << "L=" << L << " G=" << G;
    }
}

std::vector<ChipInfo> two_hosts_map() {
  // host a: ranks 0,1 on one GPU; host b: ranks 2,3 on their own GPUs (same index 0 as host a's).
  auto chip = [](int r, const char* host, int l, int dev, const char* pci) {
    ChipInfo c;
    c.rank = r;
    c.host = host;
    c.local_rank = l;
    c.local_size = 2;
    c.device = dev;
    c.name = "NVIDIA H200";
    c.pci_bus_id = pci;
    return c;
  };
  return {chip(0, "a", 0, 0, "0000:19:00.0"), chip(1, "a", 1, 0, "0000:19:00.0"), chip(2, "b", 0, 0, "0000:19:00.0"),
          chip(3, "b", 1, 1, "0000:3b:00.0")};
}

TEST(Chips, DenseBf16PeakByDeviceName) {
  EXPECT_DOUBLE_EQ(gpu_bf16_dense_peak_flops("NVIDIA H200"), 989e12);
  EXPECT_DOUBLE_EQ(gpu_bf16_dense_peak_flops("NVIDIA H200 NVL"), 835e12);
  EXPECT_DOUBLE_EQ(gpu_bf16_dense_peak_flops("NVIDIA H100 80GB HBM3"), 989e12);
  EXPECT_DOUBLE_EQ(gpu_bf16_dense_peak_flops("NVIDIA H100 PCIe"), 756e12);
  EXPECT_DOUBLE_EQ(gpu_bf16_dense_peak_flops("NVIDIA A100-SXM4-80GB"), 312e12);
  EXPECT_DOUBLE_EQ(gpu_bf16_dense_peak_flops("NVIDIA L40S"), 362e12);
  EXPECT_DOUBLE_EQ(gpu_bf16_dense_peak_flops("ctxpar CUDA mock"), 0.0);
}

TEST(Chips, DescribeNamesEveryRankAndSharing) {
  const std::string s = describe_chip_map(two_hosts_map());
  EXPECT_NE(s.find("4 ranks on 2 hosts, 3 GPUs (up to 2 ranks per GPU)"), std::string::npos) << s;
  EXPECT_NE(s.find("rank 0  host a  local 0/2  cuda:0  NVIDIA H200  0000:19:00.0  shared with ranks 1\n"), std::string::npos) << s;
  EXPECT_NE(s.find("rank 1  host a  local 1/2  cuda:0  NVIDIA H200  0000:19:00.0  shared with ranks 0\n"), std::string::npos) << s;
  // Same PCI id on another host is another GPU: not shared.
  EXPECT_NE(s.find("rank 2  host b  local 0/2  cuda:0  NVIDIA H200  0000:19:00.0\n"), std::string::npos) << s;
  EXPECT_NE(s.find("rank 3  host b  local 1/2  cuda:1  NVIDIA H200  0000:3b:00.0\n"), std::string::npos) << s;
  EXPECT_EQ(std::count(s.begin(), s.end(), '\n'), 5);
}

// In ctest all ranks run on one host: node-local ranks are a permutation of 0..P-1 in rank order.
TEST(Chips, NodeLocalOnOneHost) {
  const NodeLocal nl = node_local(world());
  EXPECT_EQ(nl.size, world().size());
  EXPECT_EQ(nl.rank, world().rank());  // split_type keyed by rank keeps the order
}

TEST(Chips, GatherChipMapInRankOrder) {
  ChipInfo mine;
  mine.rank = world().rank();
  mine.host = "host-" + std::to_string(world().rank() % 2);
  mine.local_rank = world().rank() / 2;
  mine.local_size = 7;
  mine.device = 100 + world().rank();
  mine.name = std::string(120, 'x');  // longer than the record's field: cut, still terminated
  mine.pci_bus_id = "pci-" + std::to_string(world().rank());
  const std::vector<ChipInfo> map = gather_chip_map(world(), mine);
  ASSERT_EQ(map.size(), size_t(world().size()));
  for (int q = 0; q < world().size(); ++q) {
    const ChipInfo& c = map[size_t(q)];
    EXPECT_EQ(c.rank, q);
    EXPECT_EQ(c.host, "host-" + std::to_string(q % 2));
    EXPECT_EQ(c.local_rank, q / 2);
    EXPECT_EQ(c.local_size, 7);
    EXPECT_EQ(c.device, 100 + q);
    EXPECT_EQ(c.name, std::string(95, 'x'));
    EXPECT_EQ(c.pci_bus_id, "pci-" + std::to_string(q));
  }
}

TEST(Chips, DeviceCountNeverFailsAndExplainsZero) {
  const DeviceCount dc = cuda_device_count();
  EXPECT_GE(dc.count, 0);
  if (dc.count == 0) EXPECT_FALSE(dc.why.empty());
  else EXPECT_TRUE(dc.why.empty()) << dc.why;
}

TEST(Chips, RealDeviceMap) {
  const DeviceCount dc = cuda_device_count();
  int32_t n = dc.count;
  world().all_reduce(std::span<int32_t>(&n, 1), ReduceOp::min);
  if (n == 0) GTEST_SKIP() << "no CUDA device (" << dc.why << ")";
  const NodeLocal nl = node_local(world());
  const int dev = select_device(nl.rank, nl.size);
  EXPECT_EQ(dev, device_for_local_rank(nl.rank, nl.size, dc.count));
  const std::vector<ChipInfo> map = gather_chip_map(world(), this_chip(world().rank(), nl.rank, nl.size, dev));
  for (const ChipInfo& c : map) {
    EXPECT_FALSE(c.name.empty());
    EXPECT_FALSE(c.pci_bus_id.empty());
  }
  const std::string s = describe_chip_map(map);
  EXPECT_NE(s.find("cuda:" + std::to_string(dev)), std::string::npos) << s;
  if (world().rank() == 0) std::printf("%s", s.c_str());
}

}  // namespace
