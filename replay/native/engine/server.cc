// The replay server on gRPC C++'s async generic service: the same method paths,
// sessions, control calls and refusals as the grpcio server (replay/transport/
// handlers.py, sessions.py).
//
// Every call is one `ServerCall` driven by its completion-queue events (one
// polling thread per queue; one queue unless asked for more).  Payload calls
// are answered on that thread; a control call (statistics, reset) is answered
// from a short-lived thread of its own, since it may wait for the other
// processes serving the same port (siblings).

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/generic/generic_stub.h>
#include <malloc.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <limits>
#include <map>
#include <shared_mutex>
#include <sstream>
#include <thread>

#include "engine.h"
#include "memory.h"
#include "sessions.h"

namespace tfgb {
namespace {

constexpr uint64_t kPayloadCacheBytes = 2ULL << 30;
constexpr int kPendingCallsPerQueue = 64;
constexpr int kSiblingTimeoutS = 10;

struct Config {
  bool serialized = false;
  std::string host;
  uint32_t port = 0;
  bool shared = false;
  bool sibling = false;
  std::vector<Option> options;
  std::string key_pem, chain_pem, root_pem;
  int64_t max_response = -1;
  int64_t send_limit = 0;
  bool has_token = false;
  std::string token;
  uint32_t max_sessions = 256;
  uint32_t threads = 1;
  // The memory cgroups the server is in (memory.h).
  std::vector<RoomSource> rooms;
  // Allocations up to this many bytes come from malloc's heap (0: glibc's defaults).
  int64_t kept_allocation_bytes = 0;
};

Config ReadConfig(const std::string& body) {
  Decoder in(body);
  if (in.kind() != 'S') throw ProtocolError("expected the server's set-up frame");
  if (in.U32() != kProtocolVersion) throw ProtocolError("protocol version mismatch");
  Config config;
  config.serialized = in.U8() != 0;
  config.host = in.Str();
  config.port = in.U32();
  config.shared = in.U8() != 0;
  config.sibling = in.U8() != 0;
  config.options = ReadOptions(&in);
  config.key_pem = in.Str();
  config.chain_pem = in.Str();
  config.root_pem = in.Str();
  config.max_response = in.I64();
  config.send_limit = in.I64();
  config.has_token = in.U8() != 0;
  config.token = in.Str();
  config.max_sessions = in.U32();
  config.threads = std::max<uint32_t>(1, in.U32());
  for (uint32_t count = in.U32(); count > 0; --count) {
    RoomSource source;
    source.folder = in.Str();
    source.version = in.U8();
    source.name = in.Str();
    config.rooms.push_back(std::move(source));
  }
  config.kept_allocation_bytes = in.I64();
  return config;
}

std::string Join(const std::string& host, uint32_t port) {
  bool bare_v6 = host.find(':') != std::string::npos && host[0] != '[';
  return (bare_v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

std::string DialAddress(const std::string& host, uint32_t port) {
  if (host == "0.0.0.0") return Join("127.0.0.1", port);
  if (host == "::" || host == "[::]") return Join("::1", port);
  return Join(host, port);
}

bool ValidSessionId(const std::string& id) {
  if (id.empty() || id.size() > 64) return false;
  return std::all_of(id.begin(), id.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '-' || c == '_';
  });
}

std::string Metadata(const grpc::ServerContext& context, const char* key) {
  const auto& metadata = context.client_metadata();
  auto found = metadata.find(key);
  if (found == metadata.end()) return "";
  return std::string(found->second.data(), found->second.size());
}

bool HasMetadata(const grpc::ServerContext& context, const char* key) {
  return context.client_metadata().count(key) > 0;
}

std::string StatsJson(const Snapshot& s, const std::string& mode, const std::string& address,
                      const std::string& session) {
  std::ostringstream out;
  out << "{\"address\": " << JsonString(address) << ", \"cpu_ns\": " << s.cpu_ns
      << ", \"mode\": " << JsonString(mode);
  if (!session.empty()) out << ", \"other_sessions\": " << s.other_sessions;
  out << ", \"per_method\": {";
  bool first = true;
  for (const auto& entry : s.per_method) {
    out << (first ? "" : ", ") << JsonString(entry.first) << ": [" << entry.second.first << ", "
        << entry.second.second << "]";
    first = false;
  }
  out << "}, \"pid\": " << getpid();
  if (s.received_messages_per_process.size() > 1) {
    out << ", \"processes\": " << s.received_messages_per_process.size()
        << ", \"received_messages_per_process\": [";
    for (size_t i = 0; i < s.received_messages_per_process.size(); ++i) {
      out << (i ? ", " : "") << s.received_messages_per_process[i];
    }
    out << "]";
  }
  out << ", \"received_bytes\": " << s.received_bytes
      << ", \"received_messages\": " << s.received_messages << ", \"sent_bytes\": " << s.sent_bytes
      << ", \"sent_messages\": " << s.sent_messages;
  if (!session.empty()) out << ", \"session\": " << JsonString(session);
  out << ", \"wall_ns\": " << s.wall_ns << "}";
  return out.str();
}

// Between the processes serving one port (all of this program): plain lines.
std::string SiblingText(const Snapshot& s) {
  std::ostringstream out;
  out << s.received_bytes << ' ' << s.received_messages << ' ' << s.sent_bytes << ' '
      << s.sent_messages << ' ' << s.cpu_ns << ' ' << s.wall_ns << ' ' << s.other_sessions << '\n';
  for (const auto& entry : s.per_method) {
    out << entry.second.first << ' ' << entry.second.second << ' ' << entry.first << '\n';
  }
  return out.str();
}

bool ParseSiblingText(const std::string& text, Snapshot* s) {
  std::istringstream in(text);
  if (!(in >> s->received_bytes >> s->received_messages >> s->sent_bytes >> s->sent_messages >>
        s->cpu_ns >> s->wall_ns >> s->other_sessions)) {
    return false;
  }
  std::string line;
  std::getline(in, line);
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    int64_t messages, bytes;
    if (!(fields >> messages >> bytes)) return false;
    fields.get();
    std::string method;
    std::getline(fields, method);
    s->per_method[method] = {messages, bytes};
  }
  return true;
}

void Merge(Snapshot* into, const Snapshot& other) {
  into->received_bytes += other.received_bytes;
  into->received_messages += other.received_messages;
  into->sent_bytes += other.sent_bytes;
  into->sent_messages += other.sent_messages;
  into->cpu_ns += other.cpu_ns;
  into->wall_ns = std::max(into->wall_ns, other.wall_ns);
  into->other_sessions = std::max(into->other_sessions, other.other_sessions);
  for (const auto& entry : other.per_method) {
    auto& mine = into->per_method[entry.first];
    mine.first += entry.second.first;
    mine.second += entry.second.second;
  }
  into->received_messages_per_process.push_back(other.received_messages);
}

grpc::ByteBuffer BufferOf(const std::string& text) {
  grpc::Slice slice(text);
  return grpc::ByteBuffer(&slice, 1);
}

std::string TextOf(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  if (buffer.Valid()) buffer.Dump(&slices);
  std::string text;
  for (const auto& slice : slices) text.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  return text;
}

// The other processes serving this port, reached on their own loopback ports.
class Siblings {
 public:
  void Set(const std::vector<std::string>& addresses) {
    for (const auto& address : addresses) {
      addresses_.push_back(address);
      stubs_.emplace_back(new grpc::GenericStub(
          grpc::CreateChannel(address, grpc::InsecureChannelCredentials())));
    }
  }
  bool empty() const { return addresses_.empty(); }

  // `method` on every sibling for `session`; their answers, or the failure to send back.
  grpc::Status Call(const std::string& method, const std::string& session, const Config& config,
                    std::vector<std::string>* answers) {
    for (size_t i = 0; i < stubs_.size(); ++i) {
      grpc::ClientContext context;
      context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(kSiblingTimeoutS));
      context.AddMetadata(kSiblingMetadata, "1");
      if (!session.empty()) context.AddMetadata(kSessionMetadata, session);
      if (config.has_token) context.AddMetadata(kTokenMetadata, config.token);
      grpc::CompletionQueue queue;
      grpc::ByteBuffer request = BufferOf(""), response;
      grpc::Status status;
      auto call = stubs_[i]->PrepareUnaryCall(&context, method, request, &queue);
      call->StartCall();
      call->Finish(&response, &status, &queue);
      void* tag;
      bool ok;
      queue.Next(&tag, &ok);
      if (!status.ok()) {
        static const char* kCodes[] = {"OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT",
                                       "DEADLINE_EXCEEDED", "NOT_FOUND", "ALREADY_EXISTS",
                                       "PERMISSION_DENIED", "RESOURCE_EXHAUSTED",
                                       "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE",
                                       "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS",
                                       "UNAUTHENTICATED"};
        int code = status.error_code();
        return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                            "server process at " + addresses_[i] + " (same port) did not answer " +
                                method + ": " + (code >= 0 && code <= 16 ? kCodes[code] : "UNKNOWN"));
      }
      answers->push_back(TextOf(response));
    }
    return grpc::Status::OK;
  }

 private:
  std::vector<std::string> addresses_;
  std::vector<std::unique_ptr<grpc::GenericStub>> stubs_;
};

// What every call shares.
class Replay {
 public:
  explicit Replay(const Config& config)
      : config(config), sessions(config.max_sessions), memory(config.rooms),
        mode(config.serialized ? "serialized" : "non-serialized") {
    max_response_ = config.max_response < 0 ? config.send_limit : config.max_response;
    int64_t available = AvailableMemoryBytes();
    cache_limit_ = available < 0 ? kPayloadCacheBytes
                                 : std::min<uint64_t>(kPayloadCacheBytes, available / 4);
  }

  const Config config;
  Sessions sessions;
  ResponseMemory memory;
  Siblings siblings;
  const std::string mode;
  std::string address;
  std::atomic<int> control_threads{0};
  // Set once the server has shut down: events still coming out of the queues end
  // their calls instead of starting anything more on them.
  std::atomic<bool> draining{false};
  // Held (shared) while an event is handled, (exclusively) while draining begins, so no
  // call starts an operation on a queue that is shutting down.
  std::shared_mutex handling;

  int64_t max_response() const { return max_response_; }

  // Refuses a response of `content` bytes (a `message`-byte message) the server may not make.
  grpc::Status CheckResponse(uint64_t content, uint64_t message) {
    if (content > static_cast<uint64_t>(max_response_) ||
        message > static_cast<uint64_t>(config.send_limit)) {
      return grpc::Status(
          grpc::StatusCode::RESOURCE_EXHAUSTED,
          "a response of " + std::to_string(content) + " bytes was asked for; this server answers "
          "at most " + std::to_string(std::min(max_response_, config.send_limit)) +
              " (serve --max-response, --max-message-size)");
    }
    return grpc::Status::OK;
  }

  // Zeros to answer `content` bytes from (kept for the next pull when they fit the cache);
  // a large response's memory is held first (ServerCall::Hold).
  std::shared_ptr<ZeroBuffer> Zeros(uint64_t content) {
    std::lock_guard<std::mutex> hold(zeros_lock_);
    if (zeros_ && zeros_->size() >= content) return zeros_;
    if (content > cache_limit_) return ZeroBuffer::Make(content);  // this call's alone
    // Grown by doubling, so a trace's ascending sizes do not each make a new one.
    uint64_t grown = std::max<uint64_t>(content, zeros_ ? 2 * zeros_->size() : 0);
    zeros_ = ZeroBuffer::Make(std::min(grown, cache_limit_));
    return zeros_;
  }

 private:
  int64_t max_response_;
  uint64_t cache_limit_;
  std::mutex zeros_lock_;
  std::shared_ptr<ZeroBuffer> zeros_;
};

enum class Kind { kEcho, kPush, kRawPull, kSerializedPull, kStream, kControl };

grpc::Status Refusal(grpc::StatusCode code, const std::string& details) {
  return grpc::Status(code, details);
}

// One call, from its arrival to its end.
class ServerCall {
 public:
  ServerCall(Replay* replay, grpc::AsyncGenericService* service, grpc::ServerCompletionQueue* cq)
      : replay_(replay), service_(service), cq_(cq), stream_(&context_) {
    service_->RequestCall(&context_, &stream_, cq_, cq_, this);
  }

  ~ServerCall() { ReleaseHeld(); }

  void Proceed(bool ok) {
    std::shared_lock<std::shared_mutex> handling(replay_->handling);
    if (replay_->draining.load()) return delete this;
    switch (stage_) {
      case Stage::kWaiting:
        if (!ok) return delete this;  // the server is shutting down
        new ServerCall(replay_, service_, cq_);
        return Begin();
      case Stage::kReading:
        if (!ok) return Finish(kind_ == Kind::kStream ? grpc::Status::OK
                                                       : Refusal(grpc::StatusCode::INTERNAL,
                                                                 "no request message"));
        return Answer();
      case Stage::kWriting:
        if (!ok) return Finish(grpc::Status::CANCELLED);
        return Read();
      case Stage::kFinishing:
        return delete this;
    }
  }

 private:
  enum class Stage { kWaiting, kReading, kWriting, kFinishing };

  // Holds the memory a response of `content` bytes takes (large ones), or the refusal;
  // the call's previous response (a stream's) has been sent by now.
  grpc::Status Hold(uint64_t content) {
    ReleaseHeld();
    if (content < kMemoryCheckedBytes) return grpc::Status::OK;
    std::string refusal, client = context_.peer();
    int64_t held = replay_->memory.Reserve(content, client, &refusal);
    if (held < 0) return Refusal(grpc::StatusCode::RESOURCE_EXHAUSTED, refusal);
    held_ = held;
    held_by_ = client;
    return grpc::Status::OK;
  }

  void ReleaseHeld() {
    if (held_ == 0) return;
    replay_->memory.Release(held_by_, held_);
    held_ = 0;
  }

  void Begin() {
    method_ = context_.method();
    if (method_ == kStatsMethod || method_ == kResetMethod) {
      kind_ = Kind::kControl;
      return Read();
    }
    std::string id = Metadata(context_, kSessionMetadata);
    if (!id.empty() && !ValidSessionId(id)) {
      return Finish(Refusal(grpc::StatusCode::INVALID_ARGUMENT,
                            std::string(kSessionMetadata) +
                                ": expected 1-64 letters, digits, '-' or '_'"));
    }
    try {
      session_ = replay_->sessions.Get(id, context_.peer());
    } catch (const SessionRefusal& refusal) {
      return Finish(Refusal(grpc::StatusCode::RESOURCE_EXHAUSTED, refusal.what()));
    }
    if (method_.compare(0, strlen(kControlPrefix), kControlPrefix) == 0) {
      return Finish(Refusal(grpc::StatusCode::UNIMPLEMENTED, "Method not found!"));
    }
    bool serialized = replay_->config.serialized;
    if (method_ == kEchoStreamMethod || method_ == kPushStreamMethod) {
      kind_ = Kind::kStream;
    } else if (method_ == kEchoMethod) {
      kind_ = Kind::kEcho;
    } else if (method_ == kPushMethod) {
      kind_ = Kind::kPush;
    } else {
      kind_ = serialized ? Kind::kSerializedPull : Kind::kRawPull;
    }
    Read();
  }

  void Read() {
    stage_ = Stage::kReading;
    request_.Clear();
    stream_.Read(&request_, this);
  }

  void Finish(const grpc::Status& status) {
    stage_ = Stage::kFinishing;
    stream_.Finish(status, this);
  }

  void Reply(const grpc::ByteBuffer& response) {
    if (kind_ == Kind::kStream) {
      stage_ = Stage::kWriting;
      stream_.Write(response, this);
    } else {
      stage_ = Stage::kFinishing;
      stream_.WriteAndFinish(response, grpc::WriteOptions(), grpc::Status::OK, this);
    }
  }

  void Answer() {
    if (kind_ == Kind::kControl) return AnswerControlElsewhere();
    grpc::ByteBuffer response;
    grpc::Status status = Respond(&response);
    if (!status.ok()) return Finish(status);
    Reply(response);
  }

  grpc::Status Respond(grpc::ByteBuffer* response);
  grpc::Status RespondRawPull(grpc::ByteBuffer* response);
  grpc::Status RespondSerializedPull(grpc::ByteBuffer* response);
  void AnswerControlElsewhere();
  grpc::Status Control(grpc::ByteBuffer* response);

  Replay* replay_;
  grpc::AsyncGenericService* service_;
  grpc::ServerCompletionQueue* cq_;
  grpc::GenericServerContext context_;
  grpc::GenericServerAsyncReaderWriter stream_;
  grpc::ByteBuffer request_;
  std::shared_ptr<Session> session_;
  std::string method_;
  Kind kind_ = Kind::kRawPull;
  Stage stage_ = Stage::kWaiting;
  // Memory this call's response holds (memory.h), and the client it is counted to.
  int64_t held_ = 0;
  std::string held_by_;
};

// The serialized mode's messages, made whole (as a protobuf serializer makes them).
grpc::ByteBuffer Contiguous(const grpc::ByteBuffer& message) {
  grpc::Slice copy(message.Length());
  char* out = reinterpret_cast<char*>(const_cast<uint8_t*>(copy.begin()));
  std::vector<grpc::Slice> slices;
  if (message.Valid()) message.Dump(&slices);
  for (const auto& slice : slices) {
    memcpy(out, slice.begin(), slice.size());
    out += slice.size();
  }
  return grpc::ByteBuffer(&copy, 1);
}

grpc::ByteBuffer UintMessage(uint64_t value) {  // Ack{received_bytes}
  if (value == 0) return grpc::ByteBuffer(nullptr, 0);
  char encoded[11];
  encoded[0] = 0x08;
  char* end = WriteVarint(encoded + 1, value);
  grpc::Slice slice(encoded, end - encoded);
  return grpc::ByteBuffer(&slice, 1);
}

grpc::ByteBuffer RawAck(uint64_t value) {
  char encoded[8];
  for (int i = 0; i < 8; ++i) encoded[i] = static_cast<char>((value >> (8 * i)) & 0xff);
  grpc::Slice slice(encoded, 8);
  return grpc::ByteBuffer(&slice, 1);
}

// Walks a serialized message's fields as a protobuf parser would; false if it is not
// one.  `first_varint` gets field 1 when that is a varint (a PullRequest's length).
bool ParseMessage(const grpc::ByteBuffer& message, uint64_t* first_varint) {
  MessageReader reader(message);
  while (reader.remaining() > 0) {
    uint64_t tag = 0, value = 0;
    if (!reader.Varint(&tag) || (tag >> 3) == 0) return false;
    bool ok = false;
    switch (tag & 7) {
      case 0:
        ok = reader.Varint(&value);
        if ((tag >> 3) == 1) *first_varint = value;
        break;
      case 1:
        ok = reader.Skip(8);
        break;
      case 2:
        ok = reader.Varint(&value) && reader.Skip(value);
        break;
      case 5:
        ok = reader.Skip(4);
        break;
    }
    if (!ok) return false;
  }
  return true;
}

const grpc::Status kUnparsable(grpc::StatusCode::INTERNAL, "Exception deserializing request!");

grpc::Status ServerCall::Respond(grpc::ByteBuffer* response) {
  const int64_t size = request_.Length();
  uint64_t unused = 0;
  bool payload = kind_ == Kind::kEcho || kind_ == Kind::kPush || kind_ == Kind::kStream;
  if (payload && replay_->config.serialized && !ParseMessage(request_, &unused)) {
    return kUnparsable;
  }
  switch (kind_) {
    case Kind::kEcho:
    case Kind::kPush: {
      bool echo = kind_ == Kind::kEcho;
      if (echo) {
        *response = replay_->config.serialized ? Contiguous(request_) : request_;
      } else {
        *response = replay_->config.serialized ? UintMessage(size) : RawAck(size);
      }
      session_->Add(echo ? kEchoMethod : kPushMethod, size, response->Length());
      return grpc::Status::OK;
    }
    case Kind::kStream: {
      bool echo = method_ == kEchoStreamMethod;
      if (echo) {
        *response = replay_->config.serialized ? Contiguous(request_) : request_;
      } else {
        *response = replay_->config.serialized ? UintMessage(size) : RawAck(size);
      }
      session_->Add(method_, size, response->Length());
      return grpc::Status::OK;
    }
    case Kind::kRawPull:
      return RespondRawPull(response);
    case Kind::kSerializedPull:
      return RespondSerializedPull(response);
    case Kind::kControl:
      break;
  }
  return grpc::Status(grpc::StatusCode::INTERNAL, "unreachable");
}

grpc::Status ServerCall::RespondRawPull(grpc::ByteBuffer* response) {
  uint64_t content = 0;
  if (request_.Length() >= kRawPullHeaderBytes) {
    MessageReader reader(request_);
    for (int i = 0; i < 8; ++i) {
      uint8_t byte = 0;
      reader.Byte(&byte);
      content |= static_cast<uint64_t>(byte) << (8 * i);
    }
  } else if (HasMetadata(context_, kResponseLengthMetadata)) {
    std::string text = Metadata(context_, kResponseLengthMetadata);
    size_t begin = text.find_first_not_of(" \t"), end = text.find_last_not_of(" \t");
    text = begin == std::string::npos ? "" : text.substr(begin, end - begin + 1);
    if (!text.empty() && text[0] == '+') text.erase(0, 1);
    bool digits = !text.empty() && std::all_of(text.begin(), text.end(), ::isdigit);
    if (!digits) {
      return Refusal(grpc::StatusCode::INVALID_ARGUMENT,
                     std::string(kResponseLengthMetadata) +
                         ": expected a response length in bytes");
    }
    text.erase(0, std::min(text.find_first_not_of('0'), text.size() - 1));
    if (text.size() > 19) {  // past any limit: refused, naming the length as it was asked
      return Refusal(grpc::StatusCode::RESOURCE_EXHAUSTED,
                     "a response of " + text + " bytes was asked for; this server answers at most " +
                         std::to_string(std::min(replay_->max_response(), replay_->config.send_limit)) +
                         " (serve --max-response, --max-message-size)");
    }
    content = std::stoull(text);
  }
  grpc::Status status = replay_->CheckResponse(content, content);
  if (!status.ok()) return status;
  status = Hold(content);
  if (!status.ok()) return status;
  auto zeros = replay_->Zeros(content);
  grpc::Slice slice = ZeroSlice(zeros, content);
  *response = grpc::ByteBuffer(&slice, content ? 1 : 0);
  session_->Add(method_, request_.Length(), content);
  return grpc::Status::OK;
}

grpc::Status ServerCall::RespondSerializedPull(grpc::ByteBuffer* response) {
  uint64_t content = 0;
  if (!ParseMessage(request_, &content)) return kUnparsable;
  uint64_t message = content ? BytesFieldBytes(content) : 0;
  grpc::Status status = replay_->CheckResponse(content, message);
  if (!status.ok()) return status;
  status = Hold(content);
  if (!status.ok()) return status;
  grpc::Slice whole(message);
  char* out = reinterpret_cast<char*>(const_cast<uint8_t*>(whole.begin()));
  if (content) {
    out[0] = 0x0a;
    char* body = WriteVarint(out + 1, content);
    memset(body, 0, content);
  }
  *response = grpc::ByteBuffer(&whole, message ? 1 : 0);
  session_->Add(method_, request_.Length(), message);
  return grpc::Status::OK;
}

void ServerCall::AnswerControlElsewhere() {
  replay_->control_threads++;
  std::thread([this] {
    grpc::ByteBuffer response;
    grpc::Status status = Control(&response);
    Replay* replay = replay_;
    if (status.ok()) {
      stage_ = Stage::kFinishing;
      stream_.WriteAndFinish(response, grpc::WriteOptions(), grpc::Status::OK, this);
    } else {
      Finish(status);
    }
    replay->control_threads--;
  }).detach();
}

grpc::Status ServerCall::Control(grpc::ByteBuffer* response) {
  const Config& config = replay_->config;
  if (config.has_token) {
    std::string given = Metadata(context_, kTokenMetadata);
    // Compared in constant time: how much of a guess matched stays unknown.
    unsigned char differ = given.size() != config.token.size();
    for (size_t i = 0; i < config.token.size(); ++i) {
      differ |= static_cast<unsigned char>(config.token[i] ^ (i < given.size() ? given[i] : 0));
    }
    if (differ) {
      return Refusal(grpc::StatusCode::UNAUTHENTICATED,
                     std::string("missing or wrong token (") + kTokenMetadata + ")");
    }
  }
  std::string id = Metadata(context_, kSessionMetadata);
  if (!id.empty() && !ValidSessionId(id)) {
    return Refusal(grpc::StatusCode::INVALID_ARGUMENT,
                   std::string(kSessionMetadata) + ": expected 1-64 letters, digits, '-' or '_'");
  }
  // A call another process serving this address passes on is not its client's.
  bool from_sibling = HasMetadata(context_, kSiblingMetadata);
  std::string peer = from_sibling ? "" : context_.peer();
  std::shared_ptr<Session> session;
  try {
    session = replay_->sessions.Get(id, peer);
  } catch (const SessionRefusal& refusal) {
    return Refusal(grpc::StatusCode::RESOURCE_EXHAUSTED, refusal.what());
  }
  session->Touch(peer);
  bool forward = !from_sibling && !replay_->siblings.empty();
  std::vector<std::string> answers;
  if (method_ == kResetMethod) {
    session->Reset();
    *response = BufferOf("");
    return forward ? replay_->siblings.Call(method_, id, config, &answers) : grpc::Status::OK;
  }
  Snapshot own = session->Take();
  own.other_sessions = replay_->sessions.ActiveSince(session->reset_wall_ns(), session.get());
  if (from_sibling) {
    *response = BufferOf(SiblingText(own));
    return grpc::Status::OK;
  }
  own.received_messages_per_process.push_back(own.received_messages);
  if (forward) {
    grpc::Status status = replay_->siblings.Call(method_, id, config, &answers);
    if (!status.ok()) return status;
    for (const auto& answer : answers) {
      Snapshot other;
      if (!ParseSiblingText(answer, &other)) {
        return Refusal(grpc::StatusCode::UNAVAILABLE, "unreadable statistics from a sibling");
      }
      Merge(&own, other);
    }
  }
  *response = BufferOf(StatsJson(own, replay_->mode, replay_->address, id));
  return grpc::Status::OK;
}

// Stop requests: SIGTERM, or the parent's pipe closing (or saying 'Q').
class Stop {
 public:
  void Request() {
    std::lock_guard<std::mutex> hold(lock_);
    stopped_ = true;
    changed_.notify_all();
  }
  void Wait() {
    std::unique_lock<std::mutex> hold(lock_);
    changed_.wait(hold, [this] { return stopped_; });
  }

 private:
  std::mutex lock_;
  std::condition_variable changed_;
  bool stopped_ = false;
};

std::shared_ptr<grpc::ServerCredentials> CredentialsOf(const Config& config) {
  if (config.key_pem.empty()) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions options(
      config.root_pem.empty() ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
                              : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  options.pem_root_certs = config.root_pem;
  options.pem_key_cert_pairs.push_back({config.key_pem, config.chain_pem});
  return grpc::SslServerCredentials(options);
}

void Poll(grpc::ServerCompletionQueue* cq) {
  void* tag;
  bool ok;
  while (cq->Next(&tag, &ok)) static_cast<ServerCall*>(tag)->Proceed(ok);
}

void WriteError(const std::string& message) {
  Encoder out('E');
  out.Str(message);
  WriteFrame(1, out.body());
}

}  // namespace

namespace {

// Binds and starts the server the set-up frame describes, and says where it listens;
// null (having said why) if it cannot listen.
std::unique_ptr<grpc::Server> Start(Replay* replay, grpc::AsyncGenericService* service,
                                    std::vector<std::unique_ptr<grpc::ServerCompletionQueue>>* queues) {
  const Config& config = replay->config;
  grpc::ServerBuilder builder;
  for (const Option& option : config.options) {
    if (option.is_int) {
      builder.AddChannelArgument(option.key, static_cast<int>(option.int_value));
    } else {
      builder.AddChannelArgument(option.key, option.string_value);
    }
  }
  int port = 0, sibling_port = 0;
  std::string bind = Join(config.host, config.port);
  builder.AddListeningPort(bind, CredentialsOf(config), &port);
  if (config.shared) {
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &sibling_port);
  }
  builder.RegisterAsyncGenericService(service);
  for (uint32_t i = 0; i < config.threads; ++i) queues->push_back(builder.AddCompletionQueue());
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) {
    WriteError("cannot listen on " + bind + ": port in use or address not available");
    return nullptr;
  }
  if (config.shared && sibling_port == 0) {
    WriteError("cannot listen on 127.0.0.1 for the other server processes");
    return nullptr;
  }
  replay->address = DialAddress(config.host, port);
  Encoder ok('O');
  ok.U32(port);
  ok.Str(config.shared ? Join("127.0.0.1", sibling_port) : "");
  WriteFrame(1, ok.body());
  return server;
}

// Waits for the addresses of the other processes serving the port (shared servers only).
bool MeetSiblings(Replay* replay) {
  if (!replay->config.shared) return true;
  std::string body;
  if (!ReadFrame(0, &body)) return false;
  Decoder in(body);
  std::vector<std::string> addresses(in.U32());
  for (auto& address : addresses) address = in.Str();
  replay->siblings.Set(addresses);
  WriteFrame(1, Encoder('K').body());
  return true;
}

}  // namespace

int RunServer() {
  // Stop signals: SIGTERM only (the parent decides; Ctrl-C and hang-ups reach it too).
  signal(SIGINT, SIG_IGN);
  signal(SIGHUP, SIG_IGN);
  signal(SIGPIPE, SIG_IGN);
  sigset_t stops;
  sigemptyset(&stops);
  sigaddset(&stops, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stops, nullptr);
  TightenTimerSlack();
  std::string body;
  if (!ReadFrame(0, &body)) return 0;
  Replay replay(ReadConfig(body));
  KeepFreedMemory(replay.config.kept_allocation_bytes);
  grpc::AsyncGenericService service;
  std::vector<std::unique_ptr<grpc::ServerCompletionQueue>> queues;
  std::unique_ptr<grpc::Server> server = Start(&replay, &service, &queues);
  if (!server) return 1;
  if (!MeetSiblings(&replay)) return 0;
  for (auto& queue : queues) {
    for (int i = 0; i < kPendingCallsPerQueue; ++i) new ServerCall(&replay, &service, queue.get());
  }
  std::vector<std::thread> pollers;
  for (auto& queue : queues) pollers.emplace_back(Poll, queue.get());
  Stop stop;
  std::thread([&stop, stops] {
    int signum;
    sigwait(&stops, &signum);
    stop.Request();
  }).detach();
  std::thread([&stop] {
    std::string frame;
    while (ReadFrame(0, &frame) && frame[0] != 'Q') {
    }
    stop.Request();
  }).detach();
  stop.Wait();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  while (replay.control_threads.load() > 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  {
    std::unique_lock<std::shared_mutex> draining(replay.handling);
    replay.draining = true;
    for (auto& queue : queues) queue->Shutdown();
  }
  for (auto& poller : pollers) poller.join();
  auto received = replay.sessions.Received();
  Encoder totals('Z');
  totals.I64(received.second);
  totals.I64(received.first);
  WriteFrame(1, totals.body());
  fflush(nullptr);
  _exit(0);
}

}  // namespace tfgb
