// The client sessions the server counts apart, with the grpcio server's rules for a
// shared server (replay/transport/sessions.py says why): at most `limit` sessions; at
// most kPerClientLimit made by one client (one connection); a full table drops the
// sessions whose connections have all closed (the kernel's TCP table), and where that
// cannot be known the sessions idle for kSessionIdleNs.

#ifndef TFGB_SESSIONS_H_
#define TFGB_SESSIONS_H_

#include <arpa/inet.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine.h"

namespace tfgb {

constexpr int64_t kSessionIdleNs = 600LL * 1000000000;
constexpr int64_t kSessionRecentNs = 5LL * 1000000000;
constexpr int kPerClientLimit = 16;
constexpr size_t kMaxSessionPeers = 8;
constexpr size_t kMaxCountedMethods = 64;
constexpr size_t kMaxMethodChars = 256;
constexpr char kOtherMethods[] = "(other methods)";

// What a session (or a server process) counted since its reset.
struct Snapshot {
  int64_t received_bytes = 0, received_messages = 0, sent_bytes = 0, sent_messages = 0;
  int64_t cpu_ns = 0, wall_ns = 0, other_sessions = 0;
  std::map<std::string, std::pair<int64_t, int64_t>> per_method;
  std::vector<int64_t> received_messages_per_process;
};

// A TCP endpoint: 16 address bytes (IPv4 as IPv4-mapped IPv6) and a port.
using Endpoint = std::pair<std::array<uint8_t, 16>, int>;

// The endpoint of a gRPC peer name (ipv4:127.0.0.1:5000, ipv6:[::1]:5000); false for
// any other kind of peer.
inline bool PeerEndpoint(const std::string& peer, Endpoint* endpoint) {
  size_t colon = peer.find(':'), last = peer.rfind(':');
  if (colon == std::string::npos || last == colon) return false;
  std::string kind = peer.substr(0, colon), host = peer.substr(colon + 1, last - colon - 1);
  std::string port = peer.substr(last + 1);
  if (port.empty() || !std::all_of(port.begin(), port.end(), ::isdigit)) return false;
  host.erase(std::remove(host.begin(), host.end(), '['), host.end());
  host.erase(std::remove(host.begin(), host.end(), ']'), host.end());
  host = host.substr(0, host.find('%'));
  std::array<uint8_t, 16> bytes{};
  if (kind == "ipv4") {
    bytes[10] = bytes[11] = 0xff;
    if (inet_pton(AF_INET, host.c_str(), &bytes[12]) != 1) return false;
  } else if (kind != "ipv6" || inet_pton(AF_INET6, host.c_str(), bytes.data()) != 1) {
    return false;
  }
  *endpoint = {bytes, std::stoi(port)};
  return true;
}

// The remote ends of this network namespace's established TCP connections; false where
// the kernel does not list them.
inline bool EstablishedConnections(std::set<Endpoint>* found) {
  bool readable = false;
  for (const char* table : {"/proc/self/net/tcp", "/proc/self/net/tcp6"}) {
    std::ifstream in(table);
    if (!in) continue;
    readable = true;
    std::string line;
    std::getline(in, line);  // the header
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::string slot, local, remote, state;
      if (!(fields >> slot >> local >> remote >> state) || state != "01") continue;
      size_t colon = remote.find(':');
      std::string address = remote.substr(0, colon);
      if (colon == std::string::npos || (address.size() != 8 && address.size() != 32)) continue;
      std::array<uint8_t, 16> bytes{};
      size_t offset = address.size() == 8 ? 12 : 0;
      if (address.size() == 8) bytes[10] = bytes[11] = 0xff;
      // Each 32-bit word is printed as an integer in this machine's byte order.
      for (size_t word = 0; word * 8 < address.size(); ++word) {
        uint32_t value = std::stoul(address.substr(word * 8, 8), nullptr, 16);
        for (int i = 0; i < 4; ++i) {
          bytes[offset + word * 4 + i] = reinterpret_cast<uint8_t*>(&value)[i];
        }
      }
      found->insert({bytes, std::stoi(remote.substr(colon + 1), nullptr, 16)});
    }
  }
  return readable;
}

class Session {
 public:
  Session(std::string id, std::string maker) : id_(std::move(id)), maker_(std::move(maker)) {
    control_ns_ = reset_wall_ns_ = MonotonicNs();
    reset_cpu_ns_ = ProcessCpuNs();
    if (!maker_.empty()) peers_.push_back(maker_);
  }
  const std::string& id() const { return id_; }
  const std::string& maker() const { return maker_; }

  void Add(const std::string& method, int64_t received, int64_t sent) {
    std::lock_guard<std::mutex> hold(lock_);
    counts_.received_bytes += received;
    counts_.received_messages += 1;
    counts_.sent_bytes += sent;
    counts_.sent_messages += 1;
    auto entry = counts_.per_method.find(method);
    if (entry == counts_.per_method.end()) {
      bool room = counts_.per_method.size() < kMaxCountedMethods && method.size() <= kMaxMethodChars;
      entry = counts_.per_method.emplace(room ? method : kOtherMethods, std::make_pair(0, 0)).first;
    }
    entry->second.first += 1;
    entry->second.second += received;
    last_call_ns_ = MonotonicNs();
  }

  void Reset() {
    std::lock_guard<std::mutex> hold(lock_);
    earlier_bytes_ += counts_.received_bytes;
    earlier_messages_ += counts_.received_messages;
    counts_ = Snapshot();
    reset_wall_ns_ = MonotonicNs();
    reset_cpu_ns_ = ProcessCpuNs();
  }

  Snapshot Take() {
    std::lock_guard<std::mutex> hold(lock_);
    Snapshot snapshot = counts_;
    snapshot.cpu_ns = ProcessCpuNs() - reset_cpu_ns_;
    snapshot.wall_ns = MonotonicNs() - reset_wall_ns_;
    return snapshot;
  }

  // Bytes and messages received over the session's life.
  std::pair<int64_t, int64_t> Received() {
    std::lock_guard<std::mutex> hold(lock_);
    return {earlier_bytes_ + counts_.received_bytes, earlier_messages_ + counts_.received_messages};
  }

  int64_t last_call_ns() const { return last_call_ns_; }
  int64_t reset_wall_ns() const { return reset_wall_ns_; }
  int64_t ActiveNs() const { return std::max<int64_t>(last_call_ns_, control_ns_); }

  // Used on the connection `peer` (a control call): it lives while that does.
  void Touch(const std::string& peer) {
    control_ns_ = MonotonicNs();
    if (peer.empty() || id_.empty()) return;
    std::lock_guard<std::mutex> hold(lock_);
    if (std::find(peers_.begin(), peers_.end(), peer) != peers_.end()) return;
    peers_.push_back(peer);
    if (peers_.size() > kMaxSessionPeers) peers_.erase(peers_.begin());
  }

  // Whether the session's client has gone (sessions.py's _gone).
  bool Gone(const std::set<Endpoint>* established, int64_t now_ns) {
    int64_t idle_ns = now_ns - ActiveNs();
    std::vector<std::string> peers;
    {
      std::lock_guard<std::mutex> hold(lock_);
      peers = peers_;
    }
    auto received = Received();
    if (peers.empty() && received.first == 0 && received.second == 0) {
      return idle_ns > kSessionRecentNs;
    }
    std::vector<Endpoint> endpoints;
    for (const auto& peer : peers) {
      Endpoint endpoint;
      if (!PeerEndpoint(peer, &endpoint)) return idle_ns > kSessionIdleNs;
      endpoints.push_back(endpoint);
    }
    if (established == nullptr || endpoints.empty()) return idle_ns > kSessionIdleNs;
    return std::none_of(endpoints.begin(), endpoints.end(),
                        [established](const Endpoint& e) { return established->count(e) > 0; });
  }

 private:
  const std::string id_;
  const std::string maker_;
  std::mutex lock_;
  Snapshot counts_;
  std::vector<std::string> peers_;
  int64_t earlier_bytes_ = 0, earlier_messages_ = 0;
  int64_t reset_cpu_ns_;
  std::atomic<int64_t> control_ns_{0}, reset_wall_ns_{0}, last_call_ns_{0};
};

// A session refused, and the sentence saying why.
class SessionRefusal : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class Sessions {
 public:
  explicit Sessions(uint32_t limit) : limit_(limit) {
    by_id_.emplace("", std::make_shared<Session>("", ""));
  }

  // The session named `id`, made if new for the client at `peer` ("" for none); throws
  // SessionRefusal saying why not.
  std::shared_ptr<Session> Get(const std::string& id, const std::string& peer) {
    std::lock_guard<std::mutex> hold(lock_);
    auto found = by_id_.find(id);
    if (found != by_id_.end()) return found->second;
    auto made = made_by_.find(peer);
    if (!peer.empty() && made != made_by_.end() && made->second >= kPerClientLimit) {
      throw SessionRefusal("this client (connection " + peer + ") has made " +
                    std::to_string(kPerClientLimit) + " sessions this server still keeps, at most " +
                    std::to_string(kPerClientLimit) +
                    " per client; name one of them, or end the connection");
    }
    if (!MakeRoom()) {
      throw SessionRefusal("this server keeps at most " + std::to_string(limit_) +
                    " client sessions at once and all belong to clients still connected; try "
                    "again when one leaves");
    }
    if (!peer.empty()) made_by_[peer] += 1;
    return by_id_.emplace(id, std::make_shared<Session>(id, peer)).first->second;
  }

  int64_t ActiveSince(int64_t since_ns, const Session* besides) {
    std::lock_guard<std::mutex> hold(lock_);
    int64_t count = 0;
    for (const auto& entry : by_id_) {
      if (entry.second.get() != besides && entry.second->last_call_ns() >= since_ns) ++count;
    }
    return count;
  }

  std::pair<int64_t, int64_t> Received() {
    std::lock_guard<std::mutex> hold(lock_);
    std::pair<int64_t, int64_t> total = dropped_;
    for (const auto& entry : by_id_) {
      auto received = entry.second->Received();
      total.first += received.first;
      total.second += received.second;
    }
    return total;
  }

 private:
  // Drops sessions whose clients have gone if the table is full; whether there is room.
  bool MakeRoom() {
    if (by_id_.size() < limit_ + 1) return true;  // the default session is not counted
    std::set<Endpoint> established;
    bool known = EstablishedConnections(&established);
    int64_t now = MonotonicNs();
    for (auto entry = by_id_.begin(); entry != by_id_.end();) {
      if (!entry->first.empty() && entry->second->Gone(known ? &established : nullptr, now)) {
        auto received = entry->second->Received();
        dropped_.first += received.first;
        dropped_.second += received.second;
        const std::string& maker = entry->second->maker();
        if (!maker.empty() && --made_by_[maker] <= 0) made_by_.erase(maker);
        entry = by_id_.erase(entry);
      } else {
        ++entry;
      }
    }
    return by_id_.size() < limit_ + 1;
  }

  const uint32_t limit_;
  std::mutex lock_;
  std::map<std::string, std::shared_ptr<Session>> by_id_;
  std::map<std::string, int> made_by_;
  std::pair<int64_t, int64_t> dropped_{0, 0};
};

}  // namespace tfgb

#endif  // TFGB_SESSIONS_H_
