// KvmemClient's FetchBlocks calls (client/cpp/kvmem_client.h): requests,
// reading the chunk stream, and resuming a fetch the server refused for
// room in the caller's share.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <string_view>
#include <thread>

#include "client/cpp/kvmem_client.h"

namespace kvmem {

v1::FetchBlocksRequest KvmemClient::FetchRequest(
    const std::string& stream_id, const std::vector<uint64_t>& block_ids,
    const FetchOptions& o) {
  v1::FetchBlocksRequest req;
  req.set_stream_id(stream_id);
  for (uint64_t id : block_ids) req.add_block_ids(id);
  req.set_max_chunk_bytes(o.max_chunk_bytes);
  req.set_layout(o.layout);
  for (uint32_t l : o.layers) req.add_layers(l);
  for (const v1::BlockTokens& t : o.tokens) *req.add_tokens() = t;
  return req;
}

void KvmemClient::NoteFetchedTokens(const FetchOptions& o,
                                    std::vector<BlockView>* views) {
  if (o.layout != v1::PAYLOAD_LAYOUT_TOKEN_LAYER_MAJOR) return;
  for (BlockView& v : *views) {
    const uint64_t id = v.info.block_id();
    auto named = std::find_if(
        o.tokens.begin(), o.tokens.end(),
        [id](const v1::BlockTokens& t) { return t.block_id() == id; });
    v.token_offsets.clear();
    if (named != o.tokens.end() && named->token_offsets_size() > 0) {
      v.token_offsets.assign(named->token_offsets().begin(),
                             named->token_offsets().end());
      continue;
    }
    for (uint32_t j = 0; j < v.info.token_count(); ++j) {
      v.token_offsets.push_back(j);
    }
  }
}

namespace {

// Reads a FetchBlocks byte stream to its end, each chunk checked to continue
// its block: on_chunk(chunk, first), first when the chunk starts a block.
// DATA_LOSS (the call cancelled) for a chunk out of order.
grpc::Status ReadFetchStream(
    grpc::ClientContext* ctx,
    grpc::ClientReader<v1::FetchBlocksResponse>* reader,
    const std::function<void(v1::FetchBlocksResponse*, bool)>& on_chunk) {
  v1::FetchBlocksResponse chunk;
  bool in_block = false;
  uint64_t block_bytes = 0;  // Of the current block, so far.
  while (reader->Read(&chunk)) {
    if (chunk.has_block()) {
      in_block = true;
      block_bytes = 0;
    }
    if (!in_block || block_bytes != chunk.offset()) {
      ctx->TryCancel();
      reader->Finish().IgnoreError();
      return grpc::Status(grpc::StatusCode::DATA_LOSS,
                          "FetchBlocks chunks arrived out of order");
    }
    block_bytes += chunk.data().size();
    on_chunk(&chunk, chunk.has_block());
  }
  return reader->Finish();
}

// The leading decimal number of s[at..] (below 2^30), or -1.
int64_t LeadingNumber(std::string_view s, size_t at) {
  if (at >= s.size() || s[at] < '0' || s[at] > '9') return -1;
  int64_t n = 0;
  for (; at < s.size() && s[at] >= '0' && s[at] <= '9' && n < (1 << 30); ++at) {
    n = n * 10 + (s[at] - '0');
  }
  return n;
}

// The blocks a finished FetchBlocks call's trailing metadata says were sent
// before a refusal (kBlocksSentHeader: decimal digits only), or -1.
int64_t SentHeader(const grpc::ClientContext& ctx) {
  const auto& trailers = ctx.GetServerTrailingMetadata();
  auto it = trailers.find(kBlocksSentHeader);
  if (it == trailers.end()) return -1;
  const std::string_view value(it->second.data(), it->second.size());
  if (value.empty() || value.size() > 9 ||
      value.find_first_not_of("0123456789") != std::string_view::npos) {
    return -1;
  }
  return LeadingNumber(value, 0);
}

// The blocks a FetchBlocks refusal for room was sent with: `header` (its
// trailing metadata's count) when there is one, else what the message
// says ("FetchBlocks sent N of M blocks: ...", a server before the
// header); -1 for any other status.
int64_t BlocksSentBeforeRefusal(const grpc::Status& st, int64_t header) {
  if (st.error_code() != grpc::StatusCode::RESOURCE_EXHAUSTED) return -1;
  if (header >= 0) return header;
  constexpr std::string_view kSent = "FetchBlocks sent ";
  if (st.error_message().rfind(kSent, 0) != 0) return -1;
  return LeadingNumber(st.error_message(), kSent.size());
}

}  // namespace

grpc::Status KvmemClient::FetchResuming(
    const std::string& stream_id, v1::FetchBlocksRequest req,
    const std::function<void(size_t)>& truncate,
    const std::function<void(v1::FetchBlocksResponse*, bool)>& on_chunk) {
  constexpr int kIdleTries = 5;  // 20, 40, 80, 160, 320 ms.
  size_t done = 0;               // Blocks received whole, before req's.
  for (int idle = 0;;) {
    size_t got = 0;       // This attempt's blocks begun.
    int64_t header = -1;  // Its kBlocksSentHeader.
    grpc::Status st = Routed(stream_id, [&](v1::KvMemory::Stub* stub,
                                            grpc::ClientContext* ctx) {
      truncate(done);
      got = 0;
      auto reader = stub->FetchBlocks(ctx, req);
      grpc::Status read = ReadFetchStream(
          ctx, reader.get(), [&](v1::FetchBlocksResponse* chunk, bool first) {
            got += first ? 1 : 0;
            on_chunk(chunk, first);
          });
      header = SentHeader(*ctx);
      return read;
    });
    const int64_t sent = BlocksSentBeforeRefusal(st, header);
    if (sent < 0 || static_cast<uint64_t>(sent) > got ||
        static_cast<int>(sent) >= req.block_ids_size()) {
      return st;
    }
    // The first `sent` blocks arrived whole; ask for the rest (and the
    // token lists of those only: the server refuses lists of blocks not
    // asked for).
    done += static_cast<size_t>(sent);
    truncate(done);
    idle = sent > 0 ? 0 : idle + 1;
    if (idle > kIdleTries) return st;
    v1::FetchBlocksRequest rest = req;
    rest.clear_block_ids();
    rest.clear_tokens();
    std::vector<uint64_t> left(req.block_ids().begin() + sent,
                               req.block_ids().end());
    for (uint64_t id : left) rest.add_block_ids(id);
    for (const v1::BlockTokens& t : req.tokens()) {
      if (std::find(left.begin(), left.end(), t.block_id()) != left.end()) {
        *rest.add_tokens() = t;
      }
    }
    req = std::move(rest);
    if (idle > 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10 << idle));
    }
  }
}

grpc::Status KvmemClient::FetchBlocks(const std::string& stream_id,
                                      const std::vector<uint64_t>& block_ids,
                                      std::vector<FetchedBlock>* blocks,
                                      uint32_t max_chunk_bytes) {
  FetchOptions options;
  options.max_chunk_bytes = max_chunk_bytes;
  blocks->clear();
  return FetchResuming(
      stream_id, FetchRequest(stream_id, block_ids, options),
      [&](size_t n) { blocks->resize(std::min(n, blocks->size())); },
      [&](v1::FetchBlocksResponse* chunk, bool first) {
        if (first) {
          blocks->push_back({chunk->block(), std::string()});
          blocks->back().payload.reserve(chunk->block().payload_bytes());
        }
        blocks->back().payload.append(chunk->data());
      });
}

grpc::Status KvmemClient::FetchInto(const std::string& stream_id,
                                    const std::vector<uint64_t>& block_ids,
                                    const FetchOptions& options,
                                    std::vector<uint8_t>* buffer,
                                    std::vector<BlockView>* views) {
  std::vector<size_t> starts;
  size_t used = 0;
  views->clear();
  grpc::Status s = FetchResuming(
      stream_id, FetchRequest(stream_id, block_ids, options),
      [&](size_t n) {
        if (n < views->size()) {
          used = starts[n];
          views->resize(n);
          starts.resize(n);
        }
      },
      [&](v1::FetchBlocksResponse* chunk, bool first) {
        if (first) {
          starts.push_back(used);
          BlockView& v = views->emplace_back();
          v.block_id = chunk->block_id();
          v.info = chunk->block();
        }
        const std::string& d = chunk->data();
        if (buffer->size() < used + d.size()) buffer->resize(used + d.size());
        std::memcpy(buffer->data() + used, d.data(), d.size());
        used += d.size();
        views->back().size += d.size();
      });
  // Pointers last: the buffer may have grown while the chunks came.
  for (size_t i = 0; i < views->size(); ++i) {
    (*views)[i].data = buffer->data() + starts[i];
  }
  NoteFetchedTokens(options, views);
  return s;
}

}  // namespace kvmem
