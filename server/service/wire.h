// Messages as the service receives and sends them: raw bytes (grpc::
// ByteBuffer), parsed and serialised here. Every method takes its
// messages raw (kvmem_service.h) because gRPC's typed handlers cannot say
// what was wrong: a unary request that does not parse is answered
// UNIMPLEMENTED with no message, and a client-stream message that does not
// parse looks like the end of the stream (the call then ends OK, truncated).
// Parsing and serialising read and write the buffer's slices in place
// (protobuf zero-copy streams), as gRPC's own handlers do.
#ifndef KVMEM_SERVER_SERVICE_WIRE_H_
#define KVMEM_SERVER_SERVICE_WIRE_H_

#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/status.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/message_lite.h"

namespace kvmem {

// Parses `in` into *msg; false (and *msg cleared) when the bytes are not a
// valid message of msg's type.
bool ParseMessage(const grpc::ByteBuffer& in,
                  google::protobuf::MessageLite* msg);

// ParseMessage for a unary request: OK, or INVALID_ARGUMENT naming msg's
// type and the request's size.
absl::Status ParseRequest(const grpc::ByteBuffer& in,
                          google::protobuf::MessageLite* msg);

// Serialises msg into *out (replacing what it held).
grpc::Status SerializeMessage(const google::protobuf::MessageLite& msg,
                              grpc::ByteBuffer* out);

// Serialises msg followed by bytes field `field` holding `parts` back to
// back, without copying large parts: the buffer's slices point into them,
// and `keep` (which must own their memory) lives until gRPC lets go of the
// last slice. REQUIRES: msg has no value in `field` itself.
grpc::Status SerializeWithBytes(const google::protobuf::MessageLite& msg,
                                uint32_t field,
                                const std::vector<absl::string_view>& parts,
                                const std::shared_ptr<const void>& keep,
                                grpc::ByteBuffer* out);

// INVALID_ARGUMENT for message n (1-based) of a client stream that failed to
// parse as `type`: the call stops there, nothing from it on is stored.
absl::Status BadMessage(uint64_t n, absl::string_view type);

}  // namespace kvmem

#endif  // KVMEM_SERVER_SERVICE_WIRE_H_
