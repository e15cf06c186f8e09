// The native replay engine: gRPC C++ (generic API, completion queues) driven by
// the Python side through frames on its standard input and output.
//
// One program, two roles (main.cc): `serve` answers the replay's wire protocol
// (server.cc) exactly as the Python server does; `client` executes a worker's
// plan (client.cc): the calls, their sizes, targets and windows, released when
// Python says, and sends back one sample per completed call.  The frames are
// laid out in replay/native/protocol.py, their one description; this header
// only reads and writes them.

#ifndef TFGB_ENGINE_H_
#define TFGB_ENGINE_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

namespace tfgb {

constexpr uint32_t kProtocolVersion = 8;

// Method paths and metadata of the wire protocol (replay/transport/wire.py).
extern const char kEchoMethod[];
extern const char kPushMethod[];
extern const char kPullMethod[];
extern const char kEchoStreamMethod[];
extern const char kPushStreamMethod[];
extern const char kControlPrefix[];
extern const char kStatsMethod[];
extern const char kResetMethod[];
extern const char kSessionMetadata[];
extern const char kTokenMetadata[];
extern const char kResponseLengthMetadata[];
extern const char kSiblingMetadata[];
constexpr size_t kRawPullHeaderBytes = 8;

// A frame that does not parse: the peer is not the Python side it expects.
class ProtocolError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

int64_t MonotonicNs();
// CPU time (user + system) of this process, from getrusage.
int64_t ProcessCpuNs();
// MemAvailable of /proc/meminfo in bytes, -1 where unknown.
int64_t AvailableMemoryBytes();
// Timer slack of 1 ns, so that waits end when asked (as the Python side's do).
void TightenTimerSlack();
// Allocations up to `bytes` come from malloc's heap, which keeps what is freed (0: the C
// library's defaults).
void KeepFreedMemory(int64_t bytes);

// Little-endian fields of a frame body.
class Encoder {
 public:
  explicit Encoder(char kind) { out_.push_back(kind); }
  void U8(uint8_t value) { out_.push_back(static_cast<char>(value)); }
  void U32(uint32_t value);
  void I64(int64_t value);
  void Str(const std::string& value);
  const std::string& body() const { return out_; }

 private:
  std::string out_;
};

class Decoder {
 public:
  explicit Decoder(const std::string& body) : data_(body), pos_(1) {}
  char kind() const { return data_.empty() ? '\0' : data_[0]; }
  uint8_t U8();
  uint32_t U32();
  int64_t I64();
  std::string Str();

 private:
  void Need(size_t bytes) const;
  const std::string& data_;
  size_t pos_;
};

// Frames: a u32 little-endian body length, then the body (its first byte the kind).
bool ReadFrame(int fd, std::string* body);  // false at end of input
void WriteFrame(int fd, const std::string& body);  // whole frames, thread-safe

// A gRPC option as the Python side gives it (key, integer or string).
struct Option {
  std::string key;
  bool is_int = true;
  int64_t int_value = 0;
  std::string string_value;
};
std::vector<Option> ReadOptions(Decoder* in);
grpc::ChannelArguments ChannelArgumentsOf(const std::vector<Option>& options);

// Zeroed memory that messages are sent from without a copy; slices keep it alive.
class ZeroBuffer {
 public:
  static std::shared_ptr<ZeroBuffer> Make(size_t bytes);
  ~ZeroBuffer();
  size_t size() const { return size_; }
  const char* data() const { return data_; }

 private:
  ZeroBuffer(char* data, size_t size) : data_(data), size_(size) {}
  char* data_;
  size_t size_;
};
// A slice over the first `bytes` of `buffer` (no copy); empty for 0 bytes.
grpc::Slice ZeroSlice(const std::shared_ptr<ZeroBuffer>& buffer, size_t bytes);

// Protobuf wire format, for the serialized mode's four small messages.
size_t VarintBytes(uint64_t value);
char* WriteVarint(char* out, uint64_t value);
// Size of a length-delimited field (tag < 16) holding `length` bytes.
inline size_t BytesFieldBytes(uint64_t length) { return 1 + VarintBytes(length) + length; }

// Reads a received message across its slices.
class MessageReader {
 public:
  explicit MessageReader(const grpc::ByteBuffer& buffer);
  size_t remaining() const { return remaining_; }
  bool Byte(uint8_t* value);
  bool Varint(uint64_t* value);
  bool Skip(uint64_t bytes);

 private:
  std::vector<grpc::Slice> slices_;
  size_t slice_ = 0;
  size_t offset_ = 0;
  size_t remaining_ = 0;
};

// A failed call's status for the Python side to word (wire.failure_message): the
// fields after a leading unit separator (protocol.py, ``F`` frames); a chunk of a
// payload says which (`chunk_index` of `chunk_count`).
std::string DescribeFailure(const std::string& target, const std::string& method,
                            const grpc::Status& status, uint32_t chunk_index = 0,
                            uint32_t chunk_count = 1);

// JSON string literal of `text` (bytes past ASCII escaped one by one).
std::string JsonString(const std::string& text);

// The roles.
int RunServer();
int RunClient();

}  // namespace tfgb

#endif  // TFGB_ENGINE_H_
