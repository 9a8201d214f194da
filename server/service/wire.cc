#include "server/service/wire.h"

#include <grpcpp/impl/codegen/proto_utils.h>
#include <grpcpp/support/proto_buffer_reader.h>
#include <grpcpp/support/proto_buffer_writer.h>

#include "absl/strings/str_cat.h"

namespace kvmem {

bool ParseMessage(const grpc::ByteBuffer& in,
                  google::protobuf::MessageLite* msg) {
  grpc::ByteBuffer view(in);  // Shares the slices (a reference, no copy).
  grpc::ProtoBufferReader reader(&view);
  if (reader.status().ok() && msg->ParseFromZeroCopyStream(&reader)) {
    return true;
  }
  msg->Clear();
  return false;
}

absl::Status ParseRequest(const grpc::ByteBuffer& in,
                          google::protobuf::MessageLite* msg) {
  if (ParseMessage(in, msg)) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("the request is not a valid ", msg->GetTypeName(), " (its ",
                   in.Length(), " bytes failed to parse)"));
}

grpc::Status SerializeMessage(const google::protobuf::MessageLite& msg,
                              grpc::ByteBuffer* out) {
  out->Clear();  // gRPC's writer must start from an empty buffer.
  bool own_buffer;
  return grpc::GenericSerialize<grpc::ProtoBufferWriter,
                                google::protobuf::MessageLite>(msg, out,
                                                               &own_buffer);
}

namespace {

// Appends v as a protobuf varint.
void AppendVarint(uint64_t v, std::string* out) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

void DropKeep(void* keep) {
  delete static_cast<std::shared_ptr<const void>*>(keep);
}

}  // namespace

grpc::Status SerializeWithBytes(const google::protobuf::MessageLite& msg,
                                uint32_t field,
                                const std::vector<absl::string_view>& parts,
                                const std::shared_ptr<const void>& keep,
                                grpc::ByteBuffer* out) {
  // Parts this small are cheaper to copy than to track.
  constexpr size_t kCopyBelow = 4096;
  std::string head;
  if (!msg.AppendToString(&head)) {
    return grpc::Status(grpc::StatusCode::INTERNAL,
                        "a response failed to serialise");
  }
  size_t n = 0;
  for (absl::string_view p : parts) n += p.size();
  AppendVarint((uint64_t{field} << 3) | 2, &head);  // Length-delimited.
  AppendVarint(n, &head);
  std::vector<grpc::Slice> slices;
  for (absl::string_view p : parts) {
    if (p.size() < kCopyBelow) {
      head.append(p.data(), p.size());
      continue;
    }
    if (!head.empty()) {
      slices.emplace_back(head);
      head.clear();
    }
    slices.emplace_back(const_cast<char*>(p.data()), p.size(), &DropKeep,
                        new std::shared_ptr<const void>(keep));
  }
  if (!head.empty()) slices.emplace_back(head);
  grpc::ByteBuffer b(slices.data(), slices.size());
  out->Swap(&b);
  return grpc::Status::OK;
}

absl::Status BadMessage(uint64_t n, absl::string_view type) {
  return absl::InvalidArgumentError(absl::StrCat(
      "message ", n, " of this call is not a valid ", type,
      " (it failed to parse); the call stops there: nothing from it on was "
      "stored"));
}

}  // namespace kvmem
