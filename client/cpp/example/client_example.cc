// A front end's use of kvmem, with nothing but the client library: open a
// stream, append frames, recall with a query, fetch the recalled blocks'
// KV and check it byte for byte against what was sent.
//
//   client_example unix:/path/to/kvmem.sock
//
// It includes only client/cpp headers (and the generated kvmem.v1 code they
// include) and links only kvmem_client, kvmem_proto and gRPC:
// tests/client/client_only_test.sh builds it that way, outside the kvmem
// build, runs it against a real kvmem-server and checks with ldd that it
// pulls in neither RocksDB nor FAISS. Exit status 0 when every check holds.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "client/cpp/kvmem_client.h"

namespace {

constexpr uint32_t kHeads = 2, kHeadDim = 16, kTokens = 8, kFrames = 48;

// Frame i's KV (one layer, K then V, [kv_heads][tokens][head_dim], fp32):
// a value pattern of its own per frame, so any misplaced byte shows.
std::string FramePayload(uint32_t i) {
  std::vector<float> v(2 * kHeads * kTokens * kHeadDim);
  for (size_t j = 0; j < v.size(); ++j) {
    v[j] = static_cast<float>(i) + static_cast<float>(j % 97) / 97.0f;
  }
  return std::string(reinterpret_cast<const char*>(v.data()),
                     v.size() * sizeof(float));
}

int Fail(const char* what, const grpc::Status& s) {
  std::fprintf(stderr, "client_example: %s: %s\n", what,
               s.error_message().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: client_example unix:/path/to.sock\n");
    return 2;
  }
  auto client = kvmem::KvmemClient::Connect(argv[1]);
  if (!client->WaitForReady(std::chrono::seconds(10))) {
    std::fprintf(stderr, "client_example: %s is not ready\n", argv[1]);
    return 1;
  }
  kvmem::v1::StreamConfig config;
  config.mutable_geometry()->set_layers(1);
  config.mutable_geometry()->set_kv_heads(kHeads);
  config.mutable_geometry()->set_head_dim(kHeadDim);
  config.mutable_geometry()->set_dtype(kvmem::v1::DTYPE_FP32);
  config.mutable_geometry()->set_max_tokens_per_frame(kTokens);
  config.set_hot_window_tokens(4 * kTokens);
  kvmem::v1::OpenStreamResponse opened;
  grpc::Status s = client->OpenStream("example", config, &opened);
  if (!s.ok()) return Fail("OpenStream", s);

  std::vector<kvmem::OutgoingFrame> frames(kFrames);
  for (uint32_t i = 0; i < kFrames; ++i) {
    frames[i].header.set_frame_index(i);
    frames[i].header.set_first_token_position(uint64_t{i} * kTokens);
    frames[i].header.set_token_count(kTokens);
    frames[i].payload = FramePayload(i);
  }
  kvmem::v1::AppendFramesResponse appended;
  s = client->AppendFrames("example", frames, &appended);
  if (!s.ok()) return Fail("AppendFrames", s);

  // A query that looks like frame 3's keys: the recall set should hold the
  // block with frame 3 among blocks outside the hot window.
  kvmem::v1::RecallRequest req;
  req.set_stream_id("example");
  const std::string f3 = FramePayload(3);
  const float* keys = reinterpret_cast<const float*>(f3.data());
  for (uint32_t h = 0; h < kHeads; ++h) {
    for (uint32_t d = 0; d < kHeadDim; ++d) {
      req.add_query(keys[(h * kTokens) * kHeadDim + d]);
    }
  }
  req.mutable_budget()->set_max_tokens(4 * kTokens);
  kvmem::v1::RecallResponse recalled;
  s = client->Recall(req, &recalled);
  if (!s.ok()) return Fail("Recall", s);
  if (recalled.blocks_size() == 0) {
    std::fprintf(stderr, "client_example: the recall set is empty\n");
    return 1;
  }
  std::vector<uint64_t> ids;
  for (const auto& b : recalled.blocks()) ids.push_back(b.block_id());
  std::vector<kvmem::FetchedBlock> fetched;
  s = client->FetchBlocks("example", ids, &fetched);
  if (!s.ok()) return Fail("FetchBlocks", s);
  size_t bytes = 0;
  for (const kvmem::FetchedBlock& b : fetched) {
    std::string want;
    for (uint64_t f = b.info.first_frame(); f <= b.info.last_frame(); ++f) {
      want += FramePayload(static_cast<uint32_t>(f));
    }
    if (b.payload != want) {
      std::fprintf(stderr,
                   "client_example: block %llu differs from the "
                   "frames sent\n",
                   static_cast<unsigned long long>(b.info.block_id()));
      return 1;
    }
    bytes += b.payload.size();
  }
  s = client->DeleteStream("example");
  if (!s.ok()) return Fail("DeleteStream", s);
  std::printf(
      "client_example: %u frames appended (last durable %lld), "
      "%d blocks recalled, %zu bytes fetched byte-exact\n",
      kFrames, static_cast<long long>(appended.last_durable_frame()),
      recalled.blocks_size(), bytes);
  return 0;
}
