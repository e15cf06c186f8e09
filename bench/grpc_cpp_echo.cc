// gRPC C++'s own bare echo and push, the floors the replay engines are measured
// against (bench/replay_vs_raw.py): a generic-API server on one completion queue,
// and a client calling it one call at a time, nothing else.
//
//   grpc_cpp_echo serve [KEPT_BYTES]
//                                  prints its port, answers until stdin closes:
//                                  RecvTensor echoes; Push and each message of
//                                  PushStream are acknowledged with their length
//                                  (8 bytes), as the replay's server does.  With
//                                  KEPT_BYTES, malloc keeps freed buffers up to that
//                                  size (as the replay's servers do by default)
//   grpc_cpp_echo ping TARGET BYTES SECONDS
//                                  prints one round trip per line, in ns, then
//                                  "cpu_ns N" (the client's CPU time)
//   grpc_cpp_echo push TARGET BYTES SECONDS unary|stream
//                                  pushes BYTES, each sent once the last one's ack
//                                  is in (unary calls, or messages on one stream);
//                                  prints "bytes N", "wall_ns N", "cpu_ns N"

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <malloc.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

namespace {

const char kMethod[] = "/tensorflow.WorkerService/RecvTensor";
const char kPushMethod[] = "/tf_grpc_bench.Replay/Push";
const char kPushStreamMethod[] = "/tf_grpc_bench.Replay/PushStream";

int64_t Now() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

struct Call {
  grpc::GenericServerContext context;
  grpc::GenericServerAsyncReaderWriter stream{&context};
  grpc::ByteBuffer request;
  int stage = 0;  // 0: waiting for a call, 1: reading, 2: answered, 3: acked (a stream's)
};

grpc::ByteBuffer Ack(size_t length) {
  char bytes[8];
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((length >> (8 * i)) & 0xff);
  grpc::Slice slice(bytes, 8);
  return grpc::ByteBuffer(&slice, 1);
}

// A message read: echoed, acknowledged (Push: and finished), or the call finished.
void Answer(Call* call, bool ok) {
  const std::string method = call->context.method();
  if (!ok) {
    call->stage = 2;
    call->stream.Finish(method == kPushStreamMethod ? grpc::Status::OK : grpc::Status::CANCELLED,
                        call);
  } else if (method == kPushStreamMethod) {
    call->stage = 3;
    call->stream.Write(Ack(call->request.Length()), call);
  } else {
    call->stage = 2;
    grpc::ByteBuffer answer = method == kPushMethod ? Ack(call->request.Length()) : call->request;
    call->stream.WriteAndFinish(answer, grpc::WriteOptions(), grpc::Status::OK, call);
  }
}

int Serve(int64_t kept_bytes) {
  if (kept_bytes > 0) {
    mallopt(M_MMAP_THRESHOLD, static_cast<int>(kept_bytes));
    mallopt(M_TRIM_THRESHOLD, static_cast<int>(2 * kept_bytes));
  }
  grpc::AsyncGenericService service;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.SetMaxReceiveMessageSize(256 << 20);
  builder.SetMaxSendMessageSize(256 << 20);
  builder.RegisterAsyncGenericService(&service);
  auto cq = builder.AddCompletionQueue();
  auto server = builder.BuildAndStart();
  std::printf("%d\n", port);
  std::fflush(stdout);
  std::thread([&server] {
    char byte;
    while (read(0, &byte, 1) > 0) {
    }
    server->Shutdown();
  }).detach();
  auto* first = new Call;
  service.RequestCall(&first->context, &first->stream, cq.get(), cq.get(), first);
  void* tag;
  bool ok;
  while (cq->Next(&tag, &ok)) {
    auto* call = static_cast<Call*>(tag);
    if (call->stage == 0) {
      if (!ok) {
        delete call;
        cq->Shutdown();
        continue;
      }
      auto* next = new Call;
      service.RequestCall(&next->context, &next->stream, cq.get(), cq.get(), next);
      call->stage = 1;
      call->stream.Read(&call->request, call);
    } else if (call->stage == 1) {
      Answer(call, ok);
    } else if (call->stage == 3) {
      call->stage = 1;
      if (ok) {
        call->stream.Read(&call->request, call);
      } else {
        call->stage = 2;
        call->stream.Finish(grpc::Status::CANCELLED, call);
      }
    } else {
      delete call;
    }
  }
  return 0;
}

int Ping(const char* target, size_t bytes, double seconds) {
  grpc::ChannelArguments arguments;
  arguments.SetMaxReceiveMessageSize(256 << 20);
  arguments.SetMaxSendMessageSize(256 << 20);
  grpc::GenericStub stub(
      grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), arguments));
  std::string payload(bytes, '\0');
  grpc::Slice slice(payload.data(), payload.size());
  grpc::ByteBuffer request(&slice, 1);
  grpc::CompletionQueue cq;
  std::vector<int64_t> times;
  rusage before;
  getrusage(RUSAGE_SELF, &before);
  int64_t end = Now() + static_cast<int64_t>(seconds * 1e9);
  while (Now() < end) {
    grpc::ClientContext context;
    grpc::ByteBuffer response;
    grpc::Status status;
    int64_t start = Now();
    auto call = stub.PrepareUnaryCall(&context, kMethod, request, &cq);
    call->StartCall();
    call->Finish(&response, &status, nullptr);
    void* tag;
    bool ok;
    cq.Next(&tag, &ok);
    times.push_back(Now() - start);
    if (!status.ok() || response.Length() != bytes) {
      std::fprintf(stderr, "call failed: %s\n", status.error_message().c_str());
      return 1;
    }
  }
  rusage after;
  getrusage(RUSAGE_SELF, &after);
  auto ns = [](const timeval& t) { return t.tv_sec * 1000000000LL + t.tv_usec * 1000LL; };
  for (int64_t time : times) std::printf("%lld\n", static_cast<long long>(time));
  std::printf("cpu_ns %lld\n",
              static_cast<long long>(ns(after.ru_utime) + ns(after.ru_stime) -
                                     ns(before.ru_utime) - ns(before.ru_stime)));
  return 0;
}

int Push(const char* target, size_t bytes, double seconds, bool streamed) {
  grpc::ChannelArguments arguments;
  arguments.SetMaxReceiveMessageSize(256 << 20);
  arguments.SetMaxSendMessageSize(256 << 20);
  grpc::GenericStub stub(
      grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), arguments));
  std::string payload(bytes, '\0');
  grpc::Slice slice(payload.data(), payload.size());
  grpc::ByteBuffer request(&slice, 1);
  grpc::CompletionQueue cq;
  void* tag;
  bool ok;
  grpc::ClientContext stream_context;
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> stream;
  if (streamed) {
    stream = stub.PrepareCall(&stream_context, kPushStreamMethod, &cq);
    stream->StartCall(nullptr);
    cq.Next(&tag, &ok);
  }
  rusage before;
  getrusage(RUSAGE_SELF, &before);
  int64_t begin = Now(), end = begin + static_cast<int64_t>(seconds * 1e9), pushed = 0;
  while (Now() < end) {
    grpc::ByteBuffer ack;
    grpc::Status status;
    if (streamed) {
      stream->Write(request, nullptr);
      stream->Read(&ack, &ack);
      for (int events = 0; events < 2 && ok; ++events) cq.Next(&tag, &ok);
    } else {
      grpc::ClientContext context;
      auto call = stub.PrepareUnaryCall(&context, kPushMethod, request, &cq);
      call->StartCall();
      call->Finish(&ack, &status, nullptr);
      cq.Next(&tag, &ok);
    }
    if (!ok || !status.ok() || ack.Length() != 8) {
      std::fprintf(stderr, "push failed: %s\n", status.error_message().c_str());
      return 1;
    }
    pushed += bytes;
  }
  int64_t wall = Now() - begin;
  rusage after;
  getrusage(RUSAGE_SELF, &after);
  auto ns = [](const timeval& t) { return t.tv_sec * 1000000000LL + t.tv_usec * 1000LL; };
  std::printf("bytes %lld\nwall_ns %lld\ncpu_ns %lld\n", static_cast<long long>(pushed),
              static_cast<long long>(wall),
              static_cast<long long>(ns(after.ru_utime) + ns(after.ru_stime) -
                                     ns(before.ru_utime) - ns(before.ru_stime)));
  if (streamed) {
    stream->WritesDone(nullptr);
    cq.Next(&tag, &ok);
    grpc::Status status;
    stream->Finish(&status, nullptr);
    cq.Next(&tag, &ok);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if ((argc == 2 || argc == 3) && std::string(argv[1]) == "serve") {
    return Serve(argc == 3 ? std::strtoll(argv[2], nullptr, 10) : 0);
  }
  if (argc == 6 && std::string(argv[1]) == "push") {
    return Push(argv[2], std::strtoull(argv[3], nullptr, 10), std::atof(argv[4]),
                std::string(argv[5]) == "stream");
  }
  if (argc == 5 && std::string(argv[1]) == "ping") {
    return Ping(argv[2], std::strtoull(argv[3], nullptr, 10), std::atof(argv[4]));
  }
  std::fprintf(stderr,
               "usage: grpc_cpp_echo serve [KEPT_BYTES] | ping TARGET BYTES SECONDS | "
               "push TARGET BYTES SECONDS unary|stream\n");
  return 2;
}
