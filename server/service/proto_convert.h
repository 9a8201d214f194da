// Conversions between kvmem.v1 messages and engine value types. Pure; the
// engine validates the converted values.
#ifndef KVMEM_SERVER_SERVICE_PROTO_CONVERT_H_
#define KVMEM_SERVER_SERVICE_PROTO_CONVERT_H_

#include "engine/types.h"
#include "kvmem/v1/service.pb.h"
#include "kvmem/v1/types.pb.h"

namespace kvmem {

StreamConfig FromProto(const v1::StreamConfig& p);
FrameSignals FromProto(const v1::FrameSignals& p);
RecallQuery FromProto(const v1::RecallRequest& p);
// Frame metadata only; the payload is assembled separately.
Frame FrameFromHeader(const v1::FrameHeader& p);

void ToProto(const StreamConfig& c, v1::StreamConfig* p);
void ToProto(const StreamStats& s, v1::StreamStats* p);
void ToProto(const BlockInfo& b, v1::RecalledBlock* p);
void ToProto(const RecallResult& r, v1::RecallResponse* p);

}  // namespace kvmem

#endif  // KVMEM_SERVER_SERVICE_PROTO_CONVERT_H_
