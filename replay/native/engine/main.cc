// tfgb-engine ROLE [PARENT_PID]: `serve`, `client` (frames on standard input and output,
// see engine.h), or `version` (one line: the program's protocol and gRPC's version).
//
// With PARENT_PID the program dies with that process, even one killed with SIGKILL
// (PR_SET_PDEATHSIG, as tf_grpc_bench.lifetime does for the tool's Python children;
// set here rather than between fork and exec, where a parent running grpcio would
// run grpcio's fork handlers in the child).
//
// Abseil's mutexes detect deadlocks where Abseil was built without NDEBUG (Debian's
// is): every lock taken is entered in a graph of which locks are held together, a
// few percent of the program's CPU under a replay's calls.  TensorFlow's gRPC is
// built optimized, without it, so the program turns it off before gRPC starts.

#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "absl/synchronization/mutex.h"
#include "engine.h"

int main(int argc, char** argv) {
  const char* role = argc > 1 ? argv[1] : "";
  if (argc > 2) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != static_cast<pid_t>(atol(argv[2]))) return 0;  // the parent is gone already
  }
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  try {
    if (strcmp(role, "serve") == 0) return tfgb::RunServer();
    if (strcmp(role, "client") == 0) return tfgb::RunClient();
  } catch (const tfgb::ProtocolError& error) {
    fprintf(stderr, "tfgb-engine %s: %s\n", role, error.what());
    return 2;
  }
  if (strcmp(role, "version") == 0) {
    printf("protocol %u grpc %s\n", tfgb::kProtocolVersion, grpc::Version().c_str());
    return 0;
  }
  fprintf(stderr, "usage: tfgb-engine serve|client|version [PARENT_PID]\n");
  return 2;
}
