// Delivery through DeliverySink: a sink written here, in the test alone,
// receives every block's bytes exactly as the stream reads them, in both
// layouts, with the calls in the interface's order; a failing block leaves
// the sink abandoned, never finished; the inline sink keeps its byte limit
// and hands each block's bytes to the response.
#include "server/service/delivery.h"

#include <atomic>
#include <functional>
#include <random>

#include "base/executor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/service/delivery_sinks.h"
#include "tests/engine_fixture.h"

namespace kvmem {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Keeps each block's bytes in a string of its own and records the calls.
class CollectingSink final : public DeliverySink {
 public:
  absl::Status Reserve(const std::vector<uint64_t>& sizes) override {
    calls.push_back("reserve");
    if (on_reserve) on_reserve();
    blocks.assign(sizes.size(), std::string());
    for (size_t i = 0; i < sizes.size(); ++i) blocks[i].resize(sizes[i]);
    return absl::OkStatus();
  }
  uint8_t* Slot(size_t i) override {
    slots.fetch_add(1);
    return reinterpret_cast<uint8_t*>(blocks[i].data());
  }
  void Finish() override { calls.push_back("finish"); }
  void Abandon() override { calls.push_back("abandon"); }
  void Describe(size_t i, v1::DeliveredBlock* out) override {
    out->set_data(blocks[i]);
  }

  std::function<void()> on_reserve;  // Runs inside Reserve.
  std::vector<std::string> calls;
  std::vector<std::string> blocks;
  std::atomic<int> slots{0};
};

class DeliveryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    engine_ = testing::OpenTestEngine(dir_.path());
    ASSERT_TRUE(
        engine_->OpenStream("cam", testing::TestConfig(g_, 16, 2)).ok());
    std::mt19937_64 rng(2);
    for (uint64_t i = 0; i < 12; ++i) {
      ASSERT_TRUE(
          engine_
              ->Append("cam", testing::FrameOf(testing::RandomFrame(rng, g_, 3),
                                               i, g_.dtype))
              .ok());
    }
    auto s = engine_->Find("cam");
    ASSERT_TRUE(s.ok());
    stream_ = std::make_unique<StreamHandle>(*s);
  }

  std::string Expected(uint64_t block, PayloadLayout layout,
                       const std::vector<uint32_t>& layers) {
    auto pieces = stream_->ReadBlockPayload(block, layout, layers);
    EXPECT_TRUE(pieces.ok()) << pieces.status();
    std::string out;
    for (const PayloadPiece& p : *pieces) out += p.ToString();
    return out;
  }

  testing::TestGeometry g_;
  testing::TempDir dir_;
  std::unique_ptr<MemoryEngine> engine_;
  std::unique_ptr<StreamHandle> stream_;
};

TEST_F(DeliveryTest, ASinkOfTheTestsOwnGetsEveryBlockExactly) {
  Executor executor(2);
  for (PayloadLayout layout :
       {PayloadLayout::kFrameMajor, PayloadLayout::kBlockLayerMajor}) {
    DeliveryRequest r;
    r.stream = stream_.get();
    r.block_ids = {4, 0, 2};
    r.layout = layout;
    if (layout == PayloadLayout::kBlockLayerMajor) r.layers = {2, 0};
    r.executor = &executor;
    r.helpers = 2;
    CollectingSink sink;
    auto d = Deliver(r, &sink);
    ASSERT_TRUE(d.ok()) << d.status();
    EXPECT_THAT(sink.calls, ElementsAre("reserve", "finish"));
    EXPECT_EQ(sink.slots.load(), 3);
    uint64_t bytes = 0;
    for (size_t i = 0; i < r.block_ids.size(); ++i) {
      EXPECT_EQ(sink.blocks[i], Expected(r.block_ids[i], layout, r.layers))
          << "block " << r.block_ids[i];
      EXPECT_EQ(d->blocks[i].id, r.block_ids[i]);
      bytes += sink.blocks[i].size();
    }
    EXPECT_EQ(d->bytes, bytes);
  }
}

// A request that cannot be sized (an unsealed block, a layer out of range)
// never reserves; a read that fails after the sink reserved (the stream is
// deleted meanwhile) abandons it and never finishes it.
TEST_F(DeliveryTest, AFailingBlockAbandonsTheSink) {
  DeliveryRequest r;
  r.stream = stream_.get();
  r.block_ids = {0, 99};  // 99 is not sealed.
  CollectingSink sink;
  auto d = Deliver(r, &sink);
  EXPECT_EQ(d.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(sink.calls, ::testing::IsEmpty());  // Sized before reserving.
  r.block_ids = {0};
  r.layout = PayloadLayout::kBlockLayerMajor;
  r.layers = {7};  // Beyond the geometry's 3 layers.
  CollectingSink sink2;
  EXPECT_EQ(Deliver(r, &sink2).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(sink2.calls, ::testing::IsEmpty());

  r.block_ids = {0, 1, 2};
  r.layers.clear();
  CollectingSink sink3;
  sink3.on_reserve = [this] { ASSERT_TRUE(engine_->DeleteStream("cam").ok()); };
  d = Deliver(r, &sink3);
  EXPECT_EQ(d.status().code(), absl::StatusCode::kNotFound) << d.status();
  EXPECT_THAT(sink3.calls, ElementsAre("reserve", "abandon"));
}

// Token delivery: each block's chosen tokens as the stream reads them
// (empty: all, BLOCK_LAYER_MAJOR's bytes); a bad token list is refused
// before anything is reserved.
TEST_F(DeliveryTest, TokenDeliveryGetsEachBlocksChosenTokens) {
  Executor executor(2);
  DeliveryRequest r;
  r.stream = stream_.get();
  r.block_ids = {4, 0, 2};
  r.layout = PayloadLayout::kBlockLayerMajor;
  r.layers = {2, 0};
  r.tokens = {{0, 5}, {}, {3}};
  r.executor = &executor;
  r.helpers = 2;
  CollectingSink sink;
  auto d = Deliver(r, &sink);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_THAT(sink.calls, ElementsAre("reserve", "finish"));
  uint64_t bytes = 0;
  for (size_t i = 0; i < r.block_ids.size(); ++i) {
    auto pieces =
        stream_->ReadBlockTokens(r.block_ids[i], r.tokens[i], r.layers);
    ASSERT_TRUE(pieces.ok()) << pieces.status();
    std::string want;
    for (const PayloadPiece& p : *pieces) want += p.ToString();
    EXPECT_EQ(sink.blocks[i], want) << "block " << r.block_ids[i];
    bytes += want.size();
  }
  EXPECT_EQ(sink.blocks[1],
            Expected(0, PayloadLayout::kBlockLayerMajor, r.layers));
  EXPECT_EQ(sink.blocks[2].size() * 6, sink.blocks[1].size());  // 1 of 6.
  EXPECT_EQ(d->bytes, bytes);

  r.tokens = {{0, 5}, {6}, {3}};  // Block 0 holds 6 tokens: 0..5.
  CollectingSink refused;
  d = Deliver(r, &refused);
  EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(d.status().message(), HasSubstr("block 0 has offset 6"));
  EXPECT_THAT(refused.calls, ::testing::IsEmpty());
}

TEST_F(DeliveryTest, InlineSinkKeepsItsLimitAndFillsTheResponse) {
  DeliveryRequest r;
  r.stream = stream_.get();
  r.block_ids = {1, 3};
  const uint64_t one = Expected(1, PayloadLayout::kFrameMajor, {}).size();
  InlineSink small(one);  // Room for one block, not two.
  auto d = Deliver(r, &small);
  EXPECT_EQ(d.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(d.status().message(), HasSubstr("deliver through shared memory"));
  InlineSink big(1 << 20);
  d = Deliver(r, &big);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(big.bytes(), d->bytes);
  for (size_t i = 0; i < 2; ++i) {
    v1::DeliveredBlock out;
    big.Describe(i, &out);
    EXPECT_EQ(out.target_case(), v1::DeliveredBlock::kData);
    EXPECT_EQ(out.data(),
              Expected(r.block_ids[i], PayloadLayout::kFrameMajor, {}));
  }
}

}  // namespace
}  // namespace kvmem
