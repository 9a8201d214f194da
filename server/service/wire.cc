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

absl::Status BadMessage(uint64_t n, absl::string_view type) {
  return absl::InvalidArgumentError(absl::StrCat(
      "message ", n, " of this call is not a valid ", type,
      " (it failed to parse); the call stops there: nothing from it on was "
      "stored"));
}

}  // namespace kvmem
