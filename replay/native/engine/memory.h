// The memory a server lets large responses take, shared among its clients: the rules and
// the words of the grpcio server's (transport/response_memory.py, host.memory_room).
//
// A response is made only when the memory this process may still take has room for it
// and its copy, less what the large responses still being sent hold; one client (one
// connection) holds at most half of that while another of its responses is in flight.
// The room is the least of the machine's MemAvailable and of every memory cgroup the
// server is in (their folders given by the Python side, which finds them as
// host.memory_room does), read again at each large pull.
#ifndef TFGB_MEMORY_H_
#define TFGB_MEMORY_H_

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "engine.h"

namespace tfgb {

// Responses at least this large are checked against the memory room before they are made.
constexpr uint64_t kMemoryCheckedBytes = 64ULL << 20;
// Copies of a response a server is taken to hold at once: it and gRPC's copy.
constexpr int64_t kResponseCopies = 2;
// A v1 cgroup's "no limit" (a page-rounded 2^63 - 1): at or past this, no bound.
constexpr int64_t kV1NoLimitBytes = 1LL << 62;

// A memory cgroup folder the server is in, its cgroup version, and its name as a refusal
// gives it (e.g. "/job").
struct RoomSource {
  std::string folder;
  uint32_t version = 2;
  std::string name;
};

struct Room {
  int64_t available = 0;
  std::string bound;
};

// A cgroup file holding one count; false where it is missing, unlimited ("max") or not one.
inline bool ReadCount(const std::string& path, int64_t* count) {
  std::ifstream in(path);
  std::string text;
  if (!(in >> text) || text.empty() || text.size() > 19) return false;
  if (!std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return false;
  }
  *count = std::stoll(text);
  return true;
}

// One field of a cgroup's memory.stat; 0 where it has none.
inline int64_t MemoryStat(const std::string& path, const std::string& field) {
  std::ifstream in(path);
  std::string key;
  int64_t value = 0;
  while (in >> key >> value) {
    if (key == field) return value;
  }
  return 0;
}

// The least room of the cgroups in `sources` and of the machine; none where nothing can
// be read.  The first of equal rooms is kept, a cgroup's before the machine's.
inline std::optional<Room> RoomNow(const std::vector<RoomSource>& sources) {
  std::optional<Room> least;
  auto consider = [&least](Room room) {
    if (!least || room.available < least->available) least = std::move(room);
  };
  for (const RoomSource& source : sources) {
    bool v2 = source.version == 2;
    int64_t limit = 0, used = 0;
    if (!ReadCount(source.folder + (v2 ? "/memory.max" : "/memory.limit_in_bytes"), &limit) ||
        !ReadCount(source.folder + (v2 ? "/memory.current" : "/memory.usage_in_bytes"), &used) ||
        limit >= kV1NoLimitBytes) {
      continue;
    }
    int64_t droppable =
        MemoryStat(source.folder + "/memory.stat", v2 ? "inactive_file" : "total_inactive_file");
    consider({std::max<int64_t>(0, limit - std::max<int64_t>(0, used - droppable)),
              "its memory cgroup " + source.name + " (limit " + std::to_string(limit) + " B)"});
  }
  int64_t machine = AvailableMemoryBytes();
  if (machine >= 0) consider({machine, "the machine's MemAvailable"});
  return least;
}

// The memory held by large responses in flight, per client.  Thread-safe.
class ResponseMemory {
 public:
  explicit ResponseMemory(std::vector<RoomSource> sources) : sources_(std::move(sources)) {}

  // Holds the memory a response of `content` bytes takes, for `client`: the bytes held,
  // to Release when the call has ended; -1 with `*refusal` saying why not.
  int64_t Reserve(uint64_t content, const std::string& client, std::string* refusal) {
    int64_t needed = kResponseCopies * static_cast<int64_t>(content);
    std::lock_guard<std::mutex> hold(lock_);
    std::optional<Room> room = RoomNow(sources_);
    if (room) {
      int64_t spare = room->available - held_;
      if (needed > spare) {
        std::string held =
            held_ ? ", less " + std::to_string(held_) + " B held by responses still being sent"
                  : "";
        *refusal = "a response of " + std::to_string(content) + " B needs about " +
                   std::to_string(needed) + " B of memory here (it and gRPC's copy); this "
                   "server has " + std::to_string(std::max<int64_t>(spare, 0)) +
                   " B to spare (" + std::to_string(room->available) + " B free to it, bounded "
                   "by " + room->bound + held + ")";
        return -1;
      }
      auto found = by_client_.find(client);
      int64_t mine = found == by_client_.end() ? 0 : found->second;
      int64_t share = (spare + held_) / 2;
      if (mine && mine + needed > share) {
        *refusal = "this client already has responses holding " + std::to_string(mine) +
                   " B in flight here; one client holds at most half of the " +
                   std::to_string(spare + held_) + " B this server has for responses (" +
                   room->bound + ") while another of its responses is sent";
        return -1;
      }
    }
    held_ += needed;
    by_client_[client] += needed;
    return needed;
  }

  // A response's call has ended: its memory is free again.
  void Release(const std::string& client, int64_t bytes) {
    std::lock_guard<std::mutex> hold(lock_);
    held_ -= bytes;
    auto found = by_client_.find(client);
    if (found == by_client_.end()) return;
    found->second -= bytes;
    if (found->second <= 0) by_client_.erase(found);
  }

 private:
  const std::vector<RoomSource> sources_;
  std::mutex lock_;
  int64_t held_ = 0;
  std::map<std::string, int64_t> by_client_;
};

}  // namespace tfgb

#endif  // TFGB_MEMORY_H_
