// What both roles share: frames, clocks, zero buffers, protobuf varints, messages.

#include <errno.h>
#include <malloc.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <algorithm>
#include <cstring>
#include <fstream>
#include <limits>

#include "engine.h"

namespace tfgb {

const char kEchoMethod[] = "/tf_grpc_bench.Replay/Echo";
const char kPushMethod[] = "/tf_grpc_bench.Replay/Push";
const char kPullMethod[] = "/tf_grpc_bench.Replay/Pull";
const char kEchoStreamMethod[] = "/tf_grpc_bench.Replay/EchoStream";
const char kPushStreamMethod[] = "/tf_grpc_bench.Replay/PushStream";
const char kControlPrefix[] = "/tf_grpc_bench.Control/";
const char kStatsMethod[] = "/tf_grpc_bench.Control/Stats";
const char kResetMethod[] = "/tf_grpc_bench.Control/Reset";
const char kSessionMetadata[] = "tfgb-session";
const char kTokenMetadata[] = "tfgb-token";
const char kResponseLengthMetadata[] = "tfgb-response-bytes";
const char kSiblingMetadata[] = "tfgb-sibling";

int64_t MonotonicNs() {
  timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return static_cast<int64_t>(now.tv_sec) * 1000000000 + now.tv_nsec;
}

int64_t ProcessCpuNs() {
  rusage usage;
  getrusage(RUSAGE_SELF, &usage);
  auto ns = [](const timeval& t) {
    return static_cast<int64_t>(t.tv_sec) * 1000000000 + static_cast<int64_t>(t.tv_usec) * 1000;
  };
  return ns(usage.ru_utime) + ns(usage.ru_stime);
}

int64_t AvailableMemoryBytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  int64_t kib = 0;
  std::string unit;
  while (meminfo >> key >> kib >> unit) {
    if (key == "MemAvailable:") return kib * 1024;
  }
  return -1;
}

void TightenTimerSlack() { prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL); }

// gRPC reads each received message into buffers from malloc; with glibc's defaults a
// buffer past 128 KiB is a fresh mapping (or the heap's top is given back when it is
// freed), so every large message costs its size in page faults and zeroing.  Raised
// thresholds keep freed buffers for the next message, as a grpcio server process keeps
// them (wire.keep_freed_memory, the same sizes).
void KeepFreedMemory(int64_t bytes) {
  if (bytes <= 0) return;
  int kept = static_cast<int>(std::min<int64_t>(bytes, std::numeric_limits<int>::max() / 2));
  mallopt(M_MMAP_THRESHOLD, kept);
  mallopt(M_TRIM_THRESHOLD, 2 * kept);
}

void Encoder::U32(uint32_t value) {
  for (int i = 0; i < 4; ++i) out_.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

void Encoder::I64(int64_t value) {
  uint64_t bits = static_cast<uint64_t>(value);
  for (int i = 0; i < 8; ++i) out_.push_back(static_cast<char>((bits >> (8 * i)) & 0xff));
}

void Encoder::Str(const std::string& value) {
  U32(static_cast<uint32_t>(value.size()));
  out_.append(value);
}

void Decoder::Need(size_t bytes) const {
  if (pos_ + bytes > data_.size()) throw ProtocolError("frame shorter than its fields");
}

uint8_t Decoder::U8() {
  Need(1);
  return static_cast<uint8_t>(data_[pos_++]);
}

uint32_t Decoder::U32() {
  Need(4);
  uint32_t value = 0;
  for (int i = 0; i < 4; ++i) {
    value |= static_cast<uint32_t>(static_cast<uint8_t>(data_[pos_ + i])) << (8 * i);
  }
  pos_ += 4;
  return value;
}

int64_t Decoder::I64() {
  Need(8);
  uint64_t value = 0;
  for (int i = 0; i < 8; ++i) {
    value |= static_cast<uint64_t>(static_cast<uint8_t>(data_[pos_ + i])) << (8 * i);
  }
  pos_ += 8;
  return static_cast<int64_t>(value);
}

std::string Decoder::Str() {
  size_t length = U32();
  Need(length);
  std::string value = data_.substr(pos_, length);
  pos_ += length;
  return value;
}

namespace {

bool ReadExactly(int fd, char* out, size_t bytes) {
  size_t done = 0;
  while (done < bytes) {
    ssize_t got = read(fd, out + done, bytes - done);
    if (got == 0) return false;
    if (got < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    done += static_cast<size_t>(got);
  }
  return true;
}

std::mutex& WriteLock() {
  static std::mutex lock;
  return lock;
}

}  // namespace

bool ReadFrame(int fd, std::string* body) {
  unsigned char head[4];
  if (!ReadExactly(fd, reinterpret_cast<char*>(head), 4)) return false;
  uint32_t length = head[0] | (head[1] << 8) | (head[2] << 16) | (static_cast<uint32_t>(head[3]) << 24);
  body->resize(length);
  if (length == 0) throw ProtocolError("empty frame");
  return ReadExactly(fd, &(*body)[0], length);
}

void WriteFrame(int fd, const std::string& body) {
  std::string frame;
  frame.reserve(body.size() + 4);
  uint32_t length = static_cast<uint32_t>(body.size());
  for (int i = 0; i < 4; ++i) frame.push_back(static_cast<char>((length >> (8 * i)) & 0xff));
  frame.append(body);
  std::lock_guard<std::mutex> hold(WriteLock());
  size_t done = 0;
  while (done < frame.size()) {
    ssize_t put = write(fd, frame.data() + done, frame.size() - done);
    if (put < 0 && errno == EINTR) continue;
    if (put <= 0) return;  // the reader is gone: it will not read what follows either
    done += static_cast<size_t>(put);
  }
}

std::vector<Option> ReadOptions(Decoder* in) {
  std::vector<Option> options(in->U32());
  for (Option& option : options) {
    option.key = in->Str();
    option.is_int = in->U8() == 0;
    if (option.is_int) {
      option.int_value = in->I64();
    } else {
      option.string_value = in->Str();
    }
  }
  return options;
}

grpc::ChannelArguments ChannelArgumentsOf(const std::vector<Option>& options) {
  grpc::ChannelArguments arguments;
  for (const Option& option : options) {
    if (option.is_int) {
      arguments.SetInt(option.key, static_cast<int>(option.int_value));
    } else {
      arguments.SetString(option.key, option.string_value);
    }
  }
  return arguments;
}

std::shared_ptr<ZeroBuffer> ZeroBuffer::Make(size_t bytes) {
  // Real, touched memory (as a tensor is), not the kernel's shared zero page.
  void* data = bytes ? mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                            MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0)
                     : nullptr;
  if (data == MAP_FAILED) throw std::bad_alloc();
  if (data != nullptr) memset(data, 0, bytes);
  return std::shared_ptr<ZeroBuffer>(new ZeroBuffer(static_cast<char*>(data), bytes));
}

ZeroBuffer::~ZeroBuffer() {
  if (data_ != nullptr) munmap(data_, size_);
}

namespace {

void ReleaseHold(void* hold) { delete static_cast<std::shared_ptr<ZeroBuffer>*>(hold); }

}  // namespace

grpc::Slice ZeroSlice(const std::shared_ptr<ZeroBuffer>& buffer, size_t bytes) {
  if (bytes == 0) return grpc::Slice();
  if (bytes > buffer->size()) throw std::logic_error("zero slice past its buffer");
  auto* hold = new std::shared_ptr<ZeroBuffer>(buffer);
  return grpc::Slice(const_cast<char*>(buffer->data()), bytes, ReleaseHold, hold);
}

size_t VarintBytes(uint64_t value) {
  size_t length = 1;
  while (value >= 0x80) {
    value >>= 7;
    ++length;
  }
  return length;
}

char* WriteVarint(char* out, uint64_t value) {
  while (value >= 0x80) {
    *out++ = static_cast<char>((value & 0x7f) | 0x80);
    value >>= 7;
  }
  *out++ = static_cast<char>(value);
  return out;
}

MessageReader::MessageReader(const grpc::ByteBuffer& buffer) {
  if (buffer.Valid()) buffer.Dump(&slices_);
  for (const grpc::Slice& slice : slices_) remaining_ += slice.size();
}

bool MessageReader::Byte(uint8_t* value) {
  while (slice_ < slices_.size() && offset_ >= slices_[slice_].size()) {
    ++slice_;
    offset_ = 0;
  }
  if (slice_ >= slices_.size()) return false;
  *value = slices_[slice_].begin()[offset_++];
  --remaining_;
  return true;
}

bool MessageReader::Varint(uint64_t* value) {
  *value = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    uint8_t byte;
    if (!Byte(&byte)) return false;
    *value |= static_cast<uint64_t>(byte & 0x7f) << shift;
    if (!(byte & 0x80)) return true;
  }
  return false;
}

bool MessageReader::Skip(uint64_t bytes) {
  if (bytes > remaining_) return false;
  remaining_ -= bytes;
  while (bytes > 0) {
    size_t here = slices_[slice_].size() - offset_;
    if (bytes < here) {
      offset_ += bytes;
      return true;
    }
    bytes -= here;
    ++slice_;
    offset_ = 0;
  }
  return true;
}

std::string DescribeFailure(const std::string& target, const std::string& method,
                            const grpc::Status& status, uint32_t chunk_index,
                            uint32_t chunk_count) {
  // Worded by the Python side (wire.failure_message), as the grpcio engine words it.
  const char kSeparator = '\x1f';
  std::string detail = status.error_message();
  return std::string(1, kSeparator) + "status" + kSeparator +
         std::to_string(static_cast<int>(status.error_code())) + kSeparator +
         std::to_string(chunk_index) + kSeparator + std::to_string(chunk_count) + kSeparator +
         target + kSeparator + method + kSeparator + detail;
}

std::string JsonString(const std::string& text) {
  std::string out = "\"";
  for (unsigned char c : text) {
    if (c == '"' || c == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(c));
    } else if (c < 0x20 || c >= 0x7f) {
      char escaped[8];
      snprintf(escaped, sizeof escaped, "\\u%04x", c);
      out.append(escaped);
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  out.push_back('"');
  return out;
}

}  // namespace tfgb
