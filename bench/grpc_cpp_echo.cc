// gRPC C++'s own bare echo, the floor the replay engines are measured against
// (bench/replay_vs_raw.py): a generic-API echo server on one completion queue,
// and a client calling it one call at a time, nothing else.
//
//   grpc_cpp_echo serve            prints its port, echoes until stdin closes
//   grpc_cpp_echo ping TARGET BYTES SECONDS
//                                  prints one round trip per line, in ns, then
//                                  "cpu_ns N" (the client's CPU time)

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
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

int64_t Now() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

struct Call {
  grpc::GenericServerContext context;
  grpc::GenericServerAsyncReaderWriter stream{&context};
  grpc::ByteBuffer request;
  int stage = 0;  // 0: waiting for a call, 1: reading, 2: answered
};

int Serve() {
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
      call->stage = 2;
      if (ok) {
        call->stream.WriteAndFinish(call->request, grpc::WriteOptions(), grpc::Status::OK, call);
      } else {
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

}  // namespace

int main(int argc, char** argv) {
  if (argc == 2 && std::string(argv[1]) == "serve") return Serve();
  if (argc == 5 && std::string(argv[1]) == "ping") {
    return Ping(argv[2], std::strtoull(argv[3], nullptr, 10), std::atof(argv[4]));
  }
  std::fprintf(stderr, "usage: grpc_cpp_echo serve | ping TARGET BYTES SECONDS\n");
  return 2;
}
