// The plan executor: one worker's calls on gRPC C++'s generic stub, released when
// the Python side says.
//
// Python sends the worker's calls once (set-up frame), then one frame per step:
// either the step's calls in order with their release times (every pacing but
// dependencies), or, under dependencies pacing, nothing yet: releases follow in
// frames of their own as Python's dependency tracker finds them, fed with the
// completions this program reports as they happen.  So when a call may go is
// decided in Python alone; this program waits for the release time and for the
// window (calls in flight in all, and to the call's server), issues, and times.
//
// Threads: one reads Python's frames and issues what they let go at once; one polls
// the completion queue and issues what a completion lets go (a closed loop pays no
// thread hand-off per call); the main thread issues what falls due at a release
// time later.

#include <grpcpp/generic/generic_stub.h>
#include <signal.h>
#include <unistd.h>

#include <condition_variable>
#include <cstring>
#include <algorithm>
#include <deque>
#include <map>
#include <queue>
#include <set>
#include <thread>
#include <tuple>

#include "engine.h"

namespace tfgb {
namespace {

constexpr uint32_t kNoLimit = 0xffffffffu;
constexpr int64_t kWatchPeriodNs = 100000000;  // streams' deadlines are checked this often
constexpr int64_t kEndStreamsNs = 500000000;   // how long quitting waits for streams to end
constexpr int64_t kFlushNs = 10000000;         // and then for their resets to be written
enum class Shape : uint8_t { kEcho = 0, kAck = 1, kPull = 2 };

struct CallSpec {
  uint32_t method = 0;
  Shape shape = Shape::kPull;
  uint32_t server = 0;
  int64_t request_bytes = 0;
  int64_t response_bytes = 0;
  uint32_t server_limit = kNoLimit;
  std::vector<int64_t> buffers;
  int64_t content = 0;  // serialized pull: the response content asked for
  std::string tensor_name;
  int64_t padding = 0;
  // Call.chunk_index of chunk_count: the chunks of one payload, consecutive in a step,
  // share the deadline the first of them issued got (transport.driver.PayloadDeadlines).
  uint32_t chunk_index = 0;
  uint32_t chunk_count = 1;
};

struct Config {
  bool serialized = false;
  bool streaming = false;
  uint32_t channels_per_server = 1;
  int64_t deadline_ns = 0;
  int64_t connect_timeout_ns = 0;
  uint32_t window = 0;  // 0: no limit on calls in flight in all
  std::string session;
  std::vector<std::string> targets;
  std::vector<Option> options;
  std::string root_pem, key_pem, chain_pem;
  std::vector<std::string> methods;
  std::vector<CallSpec> calls;
  int64_t kept_allocation_bytes = 0;  // KeepFreedMemory
};

Config ReadConfig(const std::string& body) {
  Decoder in(body);
  if (in.kind() != 'S') throw ProtocolError("expected the client's set-up frame");
  if (in.U32() != kProtocolVersion) throw ProtocolError("protocol version mismatch");
  Config config;
  config.serialized = in.U8() != 0;
  config.streaming = in.U8() != 0;
  config.channels_per_server = std::max<uint32_t>(1, in.U32());
  config.deadline_ns = in.I64();
  config.connect_timeout_ns = in.I64();
  config.window = in.U32();
  config.session = in.Str();
  config.targets.resize(in.U32());
  for (auto& target : config.targets) target = in.Str();
  config.options = ReadOptions(&in);
  config.root_pem = in.Str();
  config.key_pem = in.Str();
  config.chain_pem = in.Str();
  config.methods.resize(in.U32());
  for (auto& method : config.methods) method = in.Str();
  config.calls.resize(in.U32());
  for (auto& call : config.calls) {
    call.method = in.U32();
    call.shape = static_cast<Shape>(in.U8());
    call.server = in.U32();
    call.request_bytes = in.I64();
    call.response_bytes = in.I64();
    call.server_limit = in.U32();
    call.buffers.resize(in.U32());
    for (auto& size : call.buffers) size = in.I64();
    call.content = in.I64();
    call.tensor_name = in.Str();
    call.padding = in.I64();
    call.chunk_index = in.U32();
    call.chunk_count = in.U32();
    if (call.method >= config.methods.size() || call.server >= config.targets.size()) {
      throw ProtocolError("a call names a method or server the set-up does not list");
    }
  }
  config.kept_allocation_bytes = in.I64();
  return config;
}

// What a completion-queue tag stands for.
class Event {
 public:
  virtual ~Event() = default;
  virtual void Done(bool ok) = 0;
};

struct Sample {
  uint32_t tag;
  int64_t start_ns, end_ns, release_ns;
  uint8_t held;  // the window held the call back (measurement.release_held)
};

class Engine;

// One unary call in flight.
struct UnaryCall : Event {
  Engine* engine;
  uint32_t tag, call;
  int64_t start_ns, release_ns;
  grpc::ClientContext context;
  grpc::ByteBuffer response;
  grpc::Status status;
  std::unique_ptr<grpc::GenericClientAsyncResponseReader> reader;
  void Done(bool ok) override;
};

class Stream;

struct StreamOp : Event {
  Stream* stream;
  void (Stream::*handler)(bool);
  void Done(bool ok) override { (stream->*handler)(ok); }
};

struct Awaited {
  uint32_t tag, call;
  int64_t start_ns, release_ns, deadline_ns;
};

// Echo and ack calls as messages on one bidirectional stream (rpc kind "streaming"):
// each message answered by one, in order.  Every method runs under the engine's lock.
class Stream {
 public:
  Stream(Engine* engine, grpc::GenericStub* stub, const std::string& target,
         const std::string& path, const std::string& session, grpc::CompletionQueue* cq);
  void Submit(const Awaited& awaited, const grpc::ByteBuffer& request);
  void Watch(int64_t now_ns);
  void Cancel() { Break(true); }
  bool awaiting() const { return !awaited_.empty(); }
  bool ended() const { return broken_; }

 private:
  void Started(bool ok);
  void Written(bool ok);
  void Read(bool ok);
  void Finished(bool ok);
  void Pump();
  void Break(bool cancel);

  Engine* engine_;
  std::string target_, path_;
  grpc::ClientContext context_;
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> stream_;
  StreamOp start_op_, write_op_, read_op_, finish_op_;
  std::deque<grpc::ByteBuffer> to_write_;
  std::deque<Awaited> awaited_;
  grpc::ByteBuffer answer_;
  grpc::Status status_;
  bool started_ = false, writing_ = false, reading_ = false;
  bool breaking_ = false, finishing_ = false, broken_ = false, timed_out_ = false;
  std::string error_;
};

struct Target {
  std::string address;
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  std::vector<std::unique_ptr<grpc::GenericStub>> stubs;
  std::map<std::pair<size_t, std::string>, std::unique_ptr<Stream>> streams;
  size_t next = 0;
  int64_t in_flight = 0;
};

// How a step's calls are given (the R frame's mode byte).
enum class StepMode : uint8_t { kOrdered = 0, kDependent = 1, kCycled = 2 };

// One step's calls: given in order, or released one by one (dependencies pacing).
// A cycled step is an ordered one replayed again, whole, each time its calls have
// all completed, until its stop time: what Python's loop does with a synthetic
// workload's one step, without a frame each way between cycles.
struct StepState {
  bool active = false;
  bool dependent = false;
  bool cycled = false;
  int64_t stop_at_ns = -1;
  uint32_t expected = 0;
  struct Entry {
    uint32_t tag, call;
    int64_t release_ns;
  };
  std::vector<Entry> order;  // in issue order
  size_t position = 0;
  bool position_checked = false;
  // (release, tag, call), earliest release first, then the lowest tag.
  std::priority_queue<std::tuple<int64_t, uint32_t, uint32_t>,
                      std::vector<std::tuple<int64_t, uint32_t, uint32_t>>, std::greater<>>
      due;
  uint32_t issued = 0;
  bool stopping = false;
  std::string error;
  std::vector<Sample> samples;
  std::vector<std::pair<uint32_t, int64_t>> arrivals;  // (tag, end) not yet reported
  // The window's holds, as measurement.release_held defines them for both engines: the
  // window refused a due call and has not let one go since; the end of the latest
  // completion; the end of the completion that last opened the window after a refusal
  // (-1: none); the tags of the calls it held back.
  bool refused = false;
  int64_t last_completion_ns = -1;
  int64_t held_until_ns = -1;
  std::set<uint32_t> held;
};

class Engine {
 public:
  explicit Engine(Config config);
  std::string Prepare();  // builds channels and requests; an error message or ""
  void Serve();

  // A call ended (`failure` "" if it succeeded); takes the lock, or expects it held.
  void Completed(uint32_t tag, uint32_t call, int64_t start_ns, int64_t end_ns,
                 int64_t release_ns, int64_t response_bytes, const std::string& failure);
  void CompletedLocked(uint32_t tag, uint32_t call, int64_t start_ns, int64_t end_ns,
                       int64_t release_ns, int64_t response_bytes, const std::string& failure);
  std::string Failure(uint32_t call, const grpc::Status& status) const;
  // A stream has ended (its Finish came back): `EndStreams` may be waiting for it.
  void StreamEnded() { changed_.notify_all(); }
  std::mutex lock;

 private:
  void ReadCommands();
  void Apply(const std::string& frame);
  void Pump();
  void WakeTimerIfSooner();
  bool WindowAllows(uint32_t call) const;
  bool Admit(uint32_t call, uint32_t tag, int64_t release_ns);
  int64_t PayloadTimeoutNs(uint32_t tag, const CallSpec& call);
  void Issue(uint32_t tag, uint32_t call, int64_t release_ns);
  grpc::ByteBuffer RequestOf(uint32_t call) const;
  bool StepDone() const;
  void Flush();
  void AnswerStrayStop();
  void PollCompletions();
  void EndStreams();

  Config config_;
  std::vector<Target> targets_;
  std::shared_ptr<ZeroBuffer> zeros_;
  std::vector<grpc::ByteBuffer> raw_requests_;
  grpc::CompletionQueue cq_;
  std::condition_variable changed_;
  StepState step_;
  int64_t in_flight_ = 0;
  int64_t wake_at_ns_ = -1;
  int64_t sleeping_until_ns_ = -1;
  std::mutex output_lock_;
  // The deadline (monotonic ns) of each chunked payload of the current step, by its first
  // chunk's tag, valid where its round is `payload_round_` (a new step, or a cycled step's
  // next cycle, begins a round): kept between steps so that no call allocates.
  std::vector<std::pair<uint64_t, int64_t>> payload_deadlines_;
  uint64_t payload_round_ = 1;
};

void UnaryCall::Done(bool) {
  int64_t end = MonotonicNs();
  engine->Completed(tag, call, start_ns, end, release_ns, status.ok() ? response.Length() : -1,
                    status.ok() ? "" : engine->Failure(call, status));
  delete this;
}

Engine::Engine(Config config) : config_(std::move(config)) {}

std::string Engine::Prepare() {
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  if (!config_.root_pem.empty()) {
    grpc::SslCredentialsOptions options;
    options.pem_root_certs = config_.root_pem;
    options.pem_private_key = config_.key_pem;
    options.pem_cert_chain = config_.chain_pem;
    credentials = grpc::SslCredentials(options);
  }
  grpc::ChannelArguments arguments = ChannelArgumentsOf(config_.options);
  targets_.resize(config_.targets.size());
  for (size_t i = 0; i < targets_.size(); ++i) {
    targets_[i].address = config_.targets[i];
  }
  std::vector<bool> used(targets_.size(), false);
  int64_t largest = 0;
  for (const CallSpec& call : config_.calls) {
    used[call.server] = true;
    largest = std::max(largest, call.request_bytes);
  }
  zeros_ = ZeroBuffer::Make(largest);
  for (size_t i = 0; i < targets_.size(); ++i) {
    if (!used[i]) continue;
    for (uint32_t c = 0; c < config_.channels_per_server; ++c) {
      auto channel = grpc::CreateCustomChannel(targets_[i].address, credentials, arguments);
      targets_[i].stubs.emplace_back(new grpc::GenericStub(channel));
      targets_[i].channels.push_back(channel);
    }
  }
  for (uint32_t id = 0; id < config_.calls.size(); ++id) {
    grpc::ByteBuffer request = RequestOf(id);
    raw_requests_.push_back(config_.serialized ? grpc::ByteBuffer() : request);
    const CallSpec& call = config_.calls[id];
    if (static_cast<int64_t>(request.Length()) != call.request_bytes) {
      return "request for " + config_.methods[call.method] + " encodes to " +
             std::to_string(request.Length()) + " B, the workload says " +
             std::to_string(call.request_bytes) + " B";
    }
  }
  auto deadline = std::chrono::system_clock::now() +
                  std::chrono::nanoseconds(config_.connect_timeout_ns);
  for (Target& target : targets_) {
    for (auto& channel : target.channels) {
      if (!channel->WaitForConnected(deadline)) {
        char seconds[32];
        snprintf(seconds, sizeof seconds, "%g", config_.connect_timeout_ns / 1e9);
        return target.address + ": no replay server reachable within " + seconds + " s";
      }
    }
  }
  return "";
}

// The request of `call`: raw bytes as slices over shared zeros (a header slice where
// the request has one), or the whole serialized message, made now.
grpc::ByteBuffer Engine::RequestOf(uint32_t id) const {
  const CallSpec& call = config_.calls[id];
  if (!config_.serialized) {
    if (!raw_requests_.empty() && raw_requests_.size() > id) return raw_requests_[id];
    std::vector<grpc::Slice> slices;
    size_t zeros = call.request_bytes;
    if (call.shape == Shape::kPull && call.request_bytes >= 8) {
      char header[8];
      for (int i = 0; i < 8; ++i) header[i] = static_cast<char>((call.response_bytes >> (8 * i)) & 0xff);
      slices.emplace_back(header, 8);
      zeros -= 8;
    }
    if (zeros) slices.push_back(ZeroSlice(zeros_, zeros));
    return grpc::ByteBuffer(slices.data(), slices.size());
  }
  size_t size = 0;
  if (call.shape == Shape::kPull) {
    if (call.content) size += 1 + VarintBytes(call.content);
    if (!call.tensor_name.empty()) size += BytesFieldBytes(call.tensor_name.size());
    if (call.padding) size += BytesFieldBytes(call.padding);
  } else {
    for (int64_t buffer : call.buffers) size += BytesFieldBytes(buffer);
  }
  grpc::Slice whole(size);
  char* out = reinterpret_cast<char*>(const_cast<uint8_t*>(whole.begin()));
  auto put_bytes = [&out, this](char tag, const char* data, size_t length) {
    *out++ = tag;
    out = WriteVarint(out, length);
    memcpy(out, data ? data : zeros_->data(), length);
    out += length;
  };
  if (call.shape == Shape::kPull) {
    if (call.content) {
      *out++ = 0x08;
      out = WriteVarint(out, call.content);
    }
    if (!call.tensor_name.empty()) put_bytes(0x12, call.tensor_name.data(), call.tensor_name.size());
    if (call.padding) put_bytes(0x1a, nullptr, call.padding);
  } else {
    for (int64_t buffer : call.buffers) put_bytes(0x0a, nullptr, buffer);
  }
  return grpc::ByteBuffer(&whole, size ? 1 : 0);
}

bool Engine::WindowAllows(uint32_t id) const {
  const CallSpec& call = config_.calls[id];
  if (config_.window && in_flight_ >= config_.window) return false;
  return call.server_limit == kNoLimit || targets_[call.server].in_flight <= call.server_limit;
}

// The timeout of chunk `call` at `tag` issued now: what is left of the deadline its
// payload's first chunk issued got (<= 0: passed), `--deadline` if it is that chunk
// (hold the lock).
int64_t Engine::PayloadTimeoutNs(uint32_t tag, const CallSpec& call) {
  int64_t now = MonotonicNs();
  uint32_t first = tag - std::min(tag, call.chunk_index);
  if (first >= payload_deadlines_.size()) payload_deadlines_.resize(first + 1, {0, 0});
  auto& payload = payload_deadlines_[first];
  if (payload.first != payload_round_) payload = {payload_round_, now + config_.deadline_ns};
  return payload.second - now;
}

void Engine::Issue(uint32_t tag, uint32_t id, int64_t release_ns) {
  const CallSpec& call = config_.calls[id];
  int64_t timeout_ns = call.chunk_count > 1 ? PayloadTimeoutNs(tag, call) : config_.deadline_ns;
  Target& target = targets_[call.server];
  size_t channel = target.next;
  target.next = (target.next + 1) % target.stubs.size();
  ++in_flight_;
  ++target.in_flight;
  ++step_.issued;
  const std::string& method = config_.methods[call.method];
  bool streamed = config_.streaming && call.shape != Shape::kPull;
  if (streamed) {
    const char* path = call.shape == Shape::kEcho ? kEchoStreamMethod : kPushStreamMethod;
    auto& stream = target.streams[{channel, path}];
    if (!stream) {
      stream.reset(new Stream(this, target.stubs[channel].get(), target.address, path,
                              config_.session, &cq_));
    }
    int64_t start = MonotonicNs();
    // A deadline passed: the stream's watch ends it, as it ends a late answer.
    stream->Submit({tag, id, start, release_ns, start + timeout_ns}, RequestOf(id));
    return;
  }
  if (timeout_ns <= 0) {
    // The payload's deadline passed before this chunk went: it fails at once, unsent, as
    // gRPC fails a call issued past its deadline (the grpcio engine's do).
    int64_t now = MonotonicNs();
    CompletedLocked(tag, id, now, now, release_ns, -1,
                    Failure(id, grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                                             "Deadline Exceeded")));
    return;
  }
  auto* pending = new UnaryCall;
  pending->engine = this;
  pending->tag = tag;
  pending->call = id;
  pending->release_ns = release_ns;
  pending->context.set_deadline(std::chrono::system_clock::now() +
                                std::chrono::nanoseconds(timeout_ns));
  if (!config_.session.empty()) pending->context.AddMetadata(kSessionMetadata, config_.session);
  if (!config_.serialized && call.shape == Shape::kPull && call.request_bytes < 8) {
    pending->context.AddMetadata(kResponseLengthMetadata, std::to_string(call.response_bytes));
  }
  pending->start_ns = MonotonicNs();
  pending->reader = target.stubs[channel]->PrepareUnaryCall(&pending->context, method,
                                                            RequestOf(id), &cq_);
  pending->reader->StartCall();
  pending->reader->Finish(&pending->response, &pending->status, pending);
}

// Whether the window lets a due call go now, noting its holds (hold the lock): a
// refusal; the completion that opened it again; the call held if released before that.
bool Engine::Admit(uint32_t id, uint32_t tag, int64_t release_ns) {
  if (!WindowAllows(id)) {
    step_.refused = true;
    return false;
  }
  if (step_.refused) {
    step_.refused = false;
    step_.held_until_ns = step_.last_completion_ns;
  }
  if (release_ns >= 0 && release_ns <= step_.held_until_ns) step_.held.insert(tag);
  return true;
}

// Issues what may go now; notes when to look again (hold the lock).
void Engine::Pump() {
  wake_at_ns_ = -1;
  while (step_.active && !step_.stopping && step_.error.empty()) {
    int64_t now = MonotonicNs();
    if (!step_.dependent) {
      if (step_.position >= step_.order.size()) break;
      if (!step_.position_checked) {
        if (step_.stop_at_ns >= 0 && now >= step_.stop_at_ns) {
          step_.stopping = true;
          break;
        }
        step_.position_checked = true;
      }
      auto next = step_.order[step_.position];
      if (next.release_ns > now) {
        wake_at_ns_ = next.release_ns;
        break;
      }
      if (!Admit(next.call, next.tag, next.release_ns)) break;
      ++step_.position;
      step_.position_checked = false;
      Issue(next.tag, next.call, next.release_ns);
    } else {
      if (step_.due.empty()) break;
      auto next = step_.due.top();
      if (std::get<0>(next) > now) {
        wake_at_ns_ = std::get<0>(next);
        break;
      }
      if (!Admit(std::get<2>(next), std::get<1>(next), std::get<0>(next))) break;
      step_.due.pop();
      Issue(std::get<1>(next), std::get<2>(next), std::get<0>(next));
    }
  }
}

bool Engine::StepDone() const {
  if (!step_.active || in_flight_ > 0) return false;
  if (step_.stopping || !step_.error.empty()) return true;
  if (step_.dependent) return step_.issued >= step_.expected;
  if (step_.cycled) return false;  // ends when its stop time stops it (Pump)
  return step_.position >= step_.order.size();
}

std::string Engine::Failure(uint32_t id, const grpc::Status& status) const {
  const CallSpec& call = config_.calls[id];
  return DescribeFailure(targets_[call.server].address, config_.methods[call.method], status,
                         call.chunk_index, call.chunk_count);
}

void Engine::Completed(uint32_t tag, uint32_t id, int64_t start_ns, int64_t end_ns,
                       int64_t release_ns, int64_t response_bytes, const std::string& failure) {
  std::lock_guard<std::mutex> hold(lock);
  CompletedLocked(tag, id, start_ns, end_ns, release_ns, response_bytes, failure);
}

void Engine::CompletedLocked(uint32_t tag, uint32_t id, int64_t start_ns, int64_t end_ns,
                             int64_t release_ns, int64_t response_bytes,
                             const std::string& failure) {
  const CallSpec& call = config_.calls[id];
  --in_flight_;
  --targets_[call.server].in_flight;
  step_.last_completion_ns = std::max(step_.last_completion_ns, end_ns);
  std::string error = failure;
  if (error.empty() && response_bytes != call.response_bytes) {
    error = targets_[call.server].address + config_.methods[call.method] + ": response of " +
            std::to_string(response_bytes) + " B, expected " +
            std::to_string(call.response_bytes) + " B (is the server running in " +
            (config_.serialized ? "serialized" : "non-serialized") + " mode?)";
  }
  if (!error.empty()) {
    if (step_.error.empty()) step_.error = error;
  } else {
    step_.samples.push_back(
        {tag, start_ns, end_ns, release_ns, static_cast<uint8_t>(step_.held.count(tag))});
    if (step_.dependent) step_.arrivals.emplace_back(tag, end_ns);
  }
  if (step_.cycled && in_flight_ == 0 && step_.position >= step_.order.size()) {
    // The cycle's calls have all completed: the next begins (Pump checks the stop time
    // before its first call, as Python's loop checks it before each step).
    step_.position = 0;
    step_.position_checked = false;
    ++payload_round_;  // each cycle's payloads have deadlines of their own
    // The window's holds begin again, as they do with each step Python gives.
    step_.refused = false;
    step_.last_completion_ns = step_.held_until_ns = -1;
    step_.held.clear();
  }
  Pump();
  WakeTimerIfSooner();
}

// Reports completions (dependencies pacing) and a finished step, in that order.
void Engine::Flush() {
  std::lock_guard<std::mutex> out(output_lock_);
  std::string arrivals, finished;
  {
    std::lock_guard<std::mutex> hold(lock);
    if (!step_.arrivals.empty()) {
      Encoder frame('C');
      frame.U32(step_.arrivals.size());
      for (const auto& arrival : step_.arrivals) {
        frame.U32(arrival.first);
        frame.I64(arrival.second);
      }
      arrivals = frame.body();
      step_.arrivals.clear();
    }
    if (StepDone()) {
      Encoder frame('F');
      frame.U32(step_.dependent || step_.cycled ? step_.issued : step_.position);
      frame.Str(step_.error);
      frame.U32(step_.samples.size());
      for (const Sample& sample : step_.samples) {
        frame.U32(sample.tag);
        frame.I64(sample.start_ns);
        frame.I64(sample.end_ns);
        frame.I64(sample.release_ns);
        frame.U8(sample.held);
      }
      finished = frame.body();
      step_ = StepState();
    }
  }
  if (!arrivals.empty()) WriteFrame(1, arrivals);
  if (!finished.empty()) WriteFrame(1, finished);
}

// An ``X`` with no step under way (it came after the step's ``F`` was written): answered
// with an empty ``F``, so a Python side waiting for the step's end after sending it never
// waits for good.  Written on the commands' thread, before anything a later command
// answers (the ``U`` its driver asks next, which skips it).
void Engine::AnswerStrayStop() {
  std::lock_guard<std::mutex> out(output_lock_);
  Encoder frame('F');
  frame.U32(0);
  frame.Str("");
  frame.U32(0);
  WriteFrame(1, frame.body());
}

void Engine::PollCompletions() {
  void* tag;
  bool ok;
  while (cq_.Next(&tag, &ok)) {
    static_cast<Event*>(tag)->Done(ok);
    // Take whatever else is ready before reporting, so completions go out together.
    for (int more = 0; more < 256; ++more) {
      auto ready = cq_.AsyncNext(&tag, &ok, gpr_time_0(GPR_CLOCK_MONOTONIC));
      if (ready != grpc::CompletionQueue::GOT_EVENT) break;
      static_cast<Event*>(tag)->Done(ok);
    }
    Flush();
  }
}

// Takes Python's frames and acts on them at once, on this thread: a step's first calls
// go from here, with no hand-off to another thread.
void Engine::ReadCommands() {
  std::string frame;
  try {
    while (ReadFrame(0, &frame)) {
      if (frame[0] == 'Q') break;
      if (frame[0] == 'U') {
        Encoder reply('U');
        reply.I64(ProcessCpuNs());
        WriteFrame(1, reply.body());
        continue;
      }
      bool stray_stop;
      {
        std::lock_guard<std::mutex> hold(lock);
        stray_stop = frame[0] == 'X' && !step_.active;
        Apply(frame);
        Pump();
        WakeTimerIfSooner();
      }
      Flush();
      if (stray_stop) AnswerStrayStop();
    }
  } catch (const ProtocolError& error) {
    fprintf(stderr, "tfgb-engine client: %s\n", error.what());
    _exit(2);
  }
  EndStreams();
  _exit(0);  // the Python side is gone or done: nothing of this process is worth keeping
}

// Quitting: every open stream is cancelled, as grpcio's client cancels its streams when
// it closes, so that a server (and a recorder of the wire) sees each stream end with a
// RST_STREAM, not its connection dropped under it.  Waits, within kEndStreamsNs, for
// every stream's Finish, then kFlushNs for the transport to write the resets.
void Engine::EndStreams() {
  std::unique_lock<std::mutex> hold(lock);
  bool any = false;
  for (Target& target : targets_) {
    for (auto& entry : target.streams) {
      entry.second->Cancel();
      any = true;
    }
  }
  if (!any) return;
  auto ended = [this] {
    for (const Target& target : targets_) {
      for (const auto& entry : target.streams) {
        if (!entry.second->ended()) return false;
      }
    }
    return true;
  };
  changed_.wait_for(hold, std::chrono::nanoseconds(kEndStreamsNs), ended);
  hold.unlock();
  std::this_thread::sleep_for(std::chrono::nanoseconds(kFlushNs));
}

// The timer thread sleeps until the next release it knows of: wake it if there is a
// sooner one now (hold the lock).
void Engine::WakeTimerIfSooner() {
  if (wake_at_ns_ >= 0 && (sleeping_until_ns_ < 0 || wake_at_ns_ < sleeping_until_ns_)) {
    changed_.notify_all();
  }
}

// A command from Python (hold the lock).
void Engine::Apply(const std::string& frame) {
  Decoder in(frame);
  if (in.kind() == 'R') {
    if (step_.active) throw ProtocolError("a step began before the last one finished");
    step_ = StepState();
    step_.active = true;
    ++payload_round_;
    step_.stop_at_ns = in.I64();
    uint8_t mode = in.U8();
    if (mode > static_cast<uint8_t>(StepMode::kCycled)) throw ProtocolError("unknown step mode");
    step_.dependent = mode == static_cast<uint8_t>(StepMode::kDependent);
    step_.expected = in.U32();
    step_.order.resize(in.U32());
    for (auto& entry : step_.order) {
      entry.tag = in.U32();
      entry.call = in.U32();
      entry.release_ns = in.I64();
      if (entry.call >= config_.calls.size()) throw ProtocolError("a step names an unknown call");
    }
    // Cycled only with calls and a stop time, else it would never end.
    step_.cycled = mode == static_cast<uint8_t>(StepMode::kCycled) && !step_.order.empty() &&
                   step_.stop_at_ns >= 0;
  } else if (in.kind() == 'D') {
    uint32_t count = in.U32();
    for (uint32_t i = 0; i < count; ++i) {
      uint32_t tag = in.U32(), call = in.U32();
      int64_t release = in.I64();
      if (call >= config_.calls.size()) throw ProtocolError("a release names an unknown call");
      // Releases meant for a step that ended (an error) are late: dropped.
      if (step_.active && step_.dependent) step_.due.emplace(release, tag, call);
    }
  } else if (in.kind() == 'X') {
    if (step_.active) step_.stopping = true;
  } else {
    throw ProtocolError("unknown command");
  }
}

// The timer thread: issues what falls due at a release time, and watches the streams'
// deadlines; completions and Python's frames issue the rest on their own threads.
void Engine::Serve() {
  std::thread(&Engine::PollCompletions, this).detach();
  std::thread(&Engine::ReadCommands, this).detach();
  std::unique_lock<std::mutex> hold(lock);
  while (true) {
    Pump();
    bool watching = false;
    for (Target& target : targets_) {
      for (auto& entry : target.streams) {
        entry.second->Watch(MonotonicNs());
        watching = watching || entry.second->awaiting();
      }
    }
    hold.unlock();
    Flush();
    hold.lock();
    // The next release as the latest Pump, on any thread, found it: one that another
    // thread found while this one flushed is not lost.
    int64_t wake = wake_at_ns_;
    if (watching) {
      int64_t watch = MonotonicNs() + kWatchPeriodNs;
      wake = wake < 0 ? watch : std::min(wake, watch);
    }
    sleeping_until_ns_ = wake;
    if (wake < 0) {
      changed_.wait(hold);
    } else {
      int64_t left = wake - MonotonicNs();
      if (left > 0) changed_.wait_for(hold, std::chrono::nanoseconds(left));
    }
    sleeping_until_ns_ = -1;
  }
}

Stream::Stream(Engine* engine, grpc::GenericStub* stub, const std::string& target,
               const std::string& path, const std::string& session, grpc::CompletionQueue* cq)
    : engine_(engine), target_(target), path_(path) {
  start_op_.stream = write_op_.stream = read_op_.stream = finish_op_.stream = this;
  start_op_.handler = &Stream::Started;
  write_op_.handler = &Stream::Written;
  read_op_.handler = &Stream::Read;
  finish_op_.handler = &Stream::Finished;
  if (!session.empty()) context_.AddMetadata(kSessionMetadata, session);
  stream_ = stub->PrepareCall(&context_, path, cq);
  stream_->StartCall(&start_op_);
}

void Stream::Submit(const Awaited& awaited, const grpc::ByteBuffer& request) {
  if (broken_) {
    engine_->CompletedLocked(awaited.tag, awaited.call, awaited.start_ns, MonotonicNs(),
                             awaited.release_ns, -1, error_);
    return;
  }
  awaited_.push_back(awaited);
  to_write_.push_back(request);
  Pump();
}

void Stream::Pump() {
  if (breaking_) {
    if (!writing_ && !reading_ && !finishing_) {
      finishing_ = true;
      stream_->Finish(&status_, &finish_op_);
    }
    return;
  }
  if (!started_) return;
  if (!writing_ && !to_write_.empty()) {
    writing_ = true;
    stream_->Write(to_write_.front(), &write_op_);
  }
  if (!reading_ && !awaited_.empty()) {
    reading_ = true;
    answer_.Clear();
    stream_->Read(&answer_, &read_op_);
  }
}

// Ends the stream: `cancel` for one this side gives up on (a deadline passed, an answer
// nobody asked for); without it, after an operation failed, the stream has ended and its
// status says why (a server gone: UNAVAILABLE, as grpcio's client says, not the
// CANCELLED this side's own cancel would put in its place).
void Stream::Break(bool cancel) {
  if (!breaking_) {
    breaking_ = true;
    if (cancel) context_.TryCancel();
  }
  Pump();
}

void Stream::Watch(int64_t now_ns) {
  if (!breaking_ && !awaited_.empty() && now_ns > awaited_.front().deadline_ns) {
    timed_out_ = true;
    Break(true);
  }
}

void Stream::Started(bool ok) {
  std::lock_guard<std::mutex> hold(engine_->lock);
  started_ = true;
  if (!ok) return Break(false);
  Pump();
}

void Stream::Written(bool ok) {
  std::lock_guard<std::mutex> hold(engine_->lock);
  writing_ = false;
  if (!to_write_.empty()) to_write_.pop_front();
  if (!ok) return Break(false);
  Pump();
}

void Stream::Read(bool ok) {
  int64_t end = MonotonicNs();
  Awaited awaited{};
  int64_t length = 0;
  {
    std::lock_guard<std::mutex> hold(engine_->lock);
    reading_ = false;
    if (!ok || awaited_.empty()) return Break(ok);
    awaited = awaited_.front();
    awaited_.pop_front();
    length = answer_.Length();
    Pump();
  }
  engine_->Completed(awaited.tag, awaited.call, awaited.start_ns, end, awaited.release_ns, length,
                     "");
}

void Stream::Finished(bool) {
  std::deque<Awaited> failed;
  std::string error;
  {
    std::lock_guard<std::mutex> hold(engine_->lock);
    if (!broken_) {
      broken_ = true;
      if (timed_out_) {
        error_ = target_ + path_ + ": no answer within the deadline (--deadline) [DEADLINE_EXCEEDED]";
      } else if (status_.ok()) {
        error_ = target_ + path_ + ": the server ended the stream";
      } else {
        error_ = DescribeFailure(target_, path_, status_);
      }
      to_write_.clear();
    }
    failed.swap(awaited_);
    error = error_;
    engine_->StreamEnded();
  }
  for (const Awaited& awaited : failed) {
    engine_->Completed(awaited.tag, awaited.call, awaited.start_ns, MonotonicNs(),
                       awaited.release_ns, -1, error);
  }
}

}  // namespace

int RunClient() {
  signal(SIGPIPE, SIG_IGN);
  // Ctrl-C and hang-ups reach the whole process group: the Python side decides.
  signal(SIGINT, SIG_IGN);
  signal(SIGHUP, SIG_IGN);
  TightenTimerSlack();
  std::string body;
  if (!ReadFrame(0, &body)) return 0;
  Config config = ReadConfig(body);
  // The responses received (a worker's pulls, hundreds of MB a round) reuse freed
  // buffers, as the servers' requests do: else each is page faults and zeroing.
  KeepFreedMemory(config.kept_allocation_bytes);
  Engine engine(std::move(config));
  std::string error = engine.Prepare();
  if (!error.empty()) {
    Encoder frame('E');
    frame.Str(error);
    WriteFrame(1, frame.body());
    return 1;
  }
  WriteFrame(1, Encoder('K').body());
  engine.Serve();
  return 0;
}

}  // namespace tfgb
