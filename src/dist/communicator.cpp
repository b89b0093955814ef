#include "xlme/dist/communicator.h"

#include "xlme/common/error.h"
#include "xlme/common/exit_codes.h"

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#ifdef USE_C10D_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif
#include <ATen/ATen.h>
#include <arpa/inet.h>
#include <c10/core/Event.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <dlfcn.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <torch/cuda.h>
#include <torch/version.h>
#include <unistd.h>

#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <string_view>
#include <thread>

namespace xlme::dist {
namespace {

using Clock = std::chrono::steady_clock;

std::string alive_key(int rank) {
  return fmt::format("xlme/alive/{}", rank);
}
// Rank 0 sets it once every rank is there; its value is every rank's "host:pid", one per line.
constexpr const char* kAllAliveKey = "xlme/alive/all";
std::string beat_key(int rank) {
  return fmt::format("xlme/beat/{}", rank);
}
// Counts the processes that joined as a rank: only the first may go on (a second one, started by
// mistake with the same RANK, would share the rank's heartbeat and hang the job's collectives).
std::string claim_key(int rank) {
  return fmt::format("xlme/claim/{}", rank);
}
std::string left_key(int rank) {
  return fmt::format("xlme/left/{}", rank);
}
// The first rank that finds the job lost writes why; every rank's heartbeat reads it.
constexpr const char* kVerdictKey = "xlme/verdict";
// How often rank 0 names the ranks it is still waiting for at the rendezvous: every 30 s, or
// four times before a shorter start-up timeout (never more often than every second).
constexpr auto kMissingReportEvery = std::chrono::seconds(30);
Clock::duration missing_report_every(Clock::duration startup_timeout) {
  const Clock::duration quarter = startup_timeout / 4;
  return std::max<Clock::duration>(std::chrono::seconds(1),
                                   std::min<Clock::duration>(kMissingReportEvery, quarter));
}
// How often the rendezvous looks at the stop signal and the deadline.
constexpr auto kRendezvousPoll = std::chrono::milliseconds(50);
// A client's attempts to reach the store last this long each, so that a stop signal is seen.
constexpr auto kConnectAttempt = std::chrono::seconds(1);

std::string host_name() {
  char name[256] = {};
  ::gethostname(name, sizeof(name) - 1);
  return name;
}

std::string this_host() {
  return fmt::format("{}:{}", host_name(), ::getpid());
}

std::string first_line(const std::string& text) {
  return text.substr(0, text.find('\n'));
}

std::string message_of(const std::exception& e) {
  const auto* torch_error = dynamic_cast<const c10::Error*>(&e);
  return first_line(torch_error ? torch_error->what_without_backtrace() : e.what());
}

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

double in_seconds(std::chrono::milliseconds duration) {
  return std::chrono::duration<double>(duration).count();
}

// The numeric addresses `host` resolves to here (empty when it does not resolve).
std::vector<std::string> resolve(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  std::vector<std::string> addresses;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &found) != 0) return addresses;
  for (const addrinfo* a = found; a != nullptr; a = a->ai_next) {
    char text[INET6_ADDRSTRLEN] = {};
    const void* raw =
        a->ai_family == AF_INET
            ? static_cast<const void*>(&reinterpret_cast<const sockaddr_in*>(a->ai_addr)->sin_addr)
            : static_cast<const void*>(
                  &reinterpret_cast<const sockaddr_in6*>(a->ai_addr)->sin6_addr);
    if (::inet_ntop(a->ai_family, raw, text, sizeof(text)) != nullptr) addresses.push_back(text);
  }
  ::freeaddrinfo(found);
  return addresses;
}

// "" when a TCP connection to host:port opens within `timeout` (and is closed at once), else why
// not ("connection refused", "timed out", the resolver's error). A client probes the store this
// way while it waits: c10d's own client logs each failed attempt with a C++ backtrace.
std::string probe_tcp(const std::string& host, int port, std::chrono::milliseconds timeout) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (const int code = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &found); code != 0) {
    return fmt::format("cannot resolve '{}': {}", host, ::gai_strerror(code));
  }
  std::string why = "no address";
  const auto end = Clock::now() + timeout;
  for (const addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int fd =
        ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      why = std::strerror(errno);
      continue;
    }
    int error = ::connect(fd, a->ai_addr, a->ai_addrlen) == 0 ? 0 : errno;
    if (error == EINPROGRESS) {
      pollfd poll_fd{fd, POLLOUT, 0};
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(end - Clock::now()).count();
      const int ready = ::poll(&poll_fd, 1, static_cast<int>(std::max<int64_t>(left, 0)));
      socklen_t size = sizeof(error);
      if (ready == 1) {
        ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &size);
      } else {
        error = ETIMEDOUT;
      }
    }
    ::close(fd);
    if (error == 0) {
      ::freeaddrinfo(found);
      return "";
    }
    why = std::strerror(error);
  }
  ::freeaddrinfo(found);
  return why;
}

bool is_loopback(const std::string& address) {
  return address.rfind("127.", 0) == 0 || address == "::1" || address.rfind("::ffff:127.", 0) == 0;
}

// ", which resolves to 127.0.1.1 here, a loopback address ..." when `host` does; else "".
std::string loopback_note(const std::string& host, const char* what) {
  const auto addresses = resolve(host);
  if (addresses.empty() || !is_loopback(addresses.front())) return "";
  return fmt::format(
      "; {} '{}' resolves to {} on this host ({}), a loopback address that other hosts cannot "
      "reach: set it to the address of rank 0's host on the job's network, or map the name to "
      "that address in /etc/hosts",
      what, host, addresses.front(), host_name());
}

// A job on several hosts with Gloo: c10d's Gloo device takes the address this host's name
// resolves to (loopback when it resolves to none) unless GLOO_SOCKET_IFNAME names an interface,
// and announces it to the other ranks. Debian maps the host's own name to 127.0.1.1, which the
// other hosts cannot reach: one side failed at once and the other waited 5 x dist.timeout_s.
void check_gloo_address(int rank, const std::vector<std::string>& hosts) {
  const char* ifname = std::getenv("GLOO_SOCKET_IFNAME");
  if (ifname != nullptr && *ifname != '\0') return;
  std::set<std::string> distinct;
  for (const auto& host : hosts) distinct.insert(host.substr(0, host.rfind(':')));
  if (distinct.size() < 2) return;
  const std::string name = host_name();
  const auto addresses = resolve(name);
  if (!addresses.empty() && !is_loopback(addresses.front())) return;
  XLME_FAIL(
      "rank {} on host {}: this host's name resolves to {}, a loopback address, but the job "
      "spans {} hosts ({}): Gloo would announce an address the other hosts cannot reach. Set "
      "GLOO_SOCKET_IFNAME to the interface of the job's network (e.g. eth0, as listed by "
      "'ip addr') on every rank, or map {} to its network address in /etc/hosts (Debian maps it "
      "to 127.0.1.1)",
      rank, name, addresses.empty() ? std::string("nothing") : addresses.front(), distinct.size(),
      fmt::join(distinct, ", "), name);
}

// A rank's own heartbeat and its watch over the others, on two threads and a store connection of
// their own, so that neither the training nor a hung store call stops them. Every period/5 the
// beat thread adds 1 to this rank's counter in the store and reads the counters it watches (rank
// 0 watches every rank; the others watch rank 0, whose process also serves the store unless
// torchrun's agent does) and the verdict key. The judge thread never touches the store: it stops
// the process when a watched counter has not moved for a period (a dead, frozen or unreachable
// rank), when the store has not answered for a period, or when another rank wrote a verdict,
// after writing its own for the others. Ranks that left normally are not watched.
class Heartbeat {
 public:
  Heartbeat(c10::intrusive_ptr<c10d::Store> store, int rank, std::vector<std::string> hosts,
            std::string store_where, bool rank0_serves, std::chrono::milliseconds period)
      : state_(std::make_shared<State>()) {
    State& s = *state_;
    s.store = std::move(store);
    s.rank = rank;
    s.hosts = std::move(hosts);
    s.store_where = std::move(store_where);
    s.rank0_serves = rank0_serves;
    s.period = period;
    s.beat = std::max<std::chrono::milliseconds>(period / 5, std::chrono::milliseconds(20));
    const int world = static_cast<int>(s.hosts.size());
    for (int r = 0; r < world; ++r) {
      if (r != rank && (rank == 0 || r == 0)) s.watched.push_back(r);
    }
    const auto now = Clock::now();
    s.last_io = now;
    s.counters.assign(s.watched.size(), -1);
    s.changed.assign(s.watched.size(), now);
    s.left.assign(s.watched.size(), false);
    s.started.assign(s.watched.size(), false);
    // Ranks start their heartbeats at slightly different times after the rendezvous (more so on
    // a loaded host): a rank is judged by the period once its counter has moved, and before that
    // by this longer allowance for its first beat.
    s.first_beat =
        std::max<std::chrono::milliseconds>(4 * period, period + std::chrono::seconds(30));
    beat_thread_ = std::thread([state = state_] { beat_loop(*state); });
    judge_thread_ = std::thread([state = state_] { judge_loop(*state); });
  }

  // Tells the others that this rank left (normally, or failed with `failure`), waiting at most a
  // few beats for the store to take it, then stops both threads. A beat thread stuck in a store
  // call is left behind (it holds its own reference to the state).
  void leave(const std::string& failure) {
    State& s = *state_;
    {
      std::unique_lock<std::mutex> lock(s.mutex);
      if (failure.empty()) {
        s.leaving = true;
      } else if (s.outgoing.empty()) {
        s.outgoing = failure;
      }
      s.judging = false;
      s.wake.notify_all();
      s.wake.wait_for(lock, 3 * s.beat,
                      [&] { return failure.empty() ? s.left_sent : s.verdict_sent; });
      s.stopping = true;
      s.wake.notify_all();
    }
    judge_thread_.join();
    std::unique_lock<std::mutex> lock(s.mutex);
    if (s.wake.wait_for(lock, 2 * s.beat, [&] { return s.beat_done; })) {
      lock.unlock();
      beat_thread_.join();
    } else {
      beat_thread_.detach();
    }
  }

  ~Heartbeat() {
    if (judge_thread_.joinable()) leave("");
  }

 private:
  struct State {
    std::mutex mutex;
    std::condition_variable wake;
    c10::intrusive_ptr<c10d::Store> store;
    int rank = 0;
    std::vector<std::string> hosts;  // every rank's "host:pid"
    std::string store_where;
    bool rank0_serves = true;
    std::chrono::milliseconds period{0}, beat{0};
    std::vector<int> watched;
    // Written by the beat thread.
    Clock::time_point last_io;  // the last round that reached the store
    std::string io_error;
    std::vector<int64_t> counters;
    std::vector<Clock::time_point> changed;
    std::vector<bool> left;
    std::vector<bool> started;  // its counter has moved: it beats
    std::chrono::milliseconds first_beat{0};
    std::string verdict;  // another rank's, read from the store
    bool left_sent = false, verdict_sent = false, beat_done = false;
    // Written by the others, sent by the beat thread.
    std::string outgoing;
    bool leaving = false, stopping = false, judging = true;
  };

  static std::string who(const State& s, int rank) {
    const std::string& host = s.hosts[rank];
    const auto colon = host.rfind(':');
    return fmt::format("rank {} (host {}, pid {})", rank, host.substr(0, colon),
                       host.substr(colon + 1));
  }

  static void beat_loop(State& s) {
    std::unique_lock<std::mutex> lock(s.mutex);
    while (!s.stopping) {
      const std::string outgoing = s.verdict_sent ? "" : s.outgoing;
      const bool leaving = s.leaving && !s.left_sent;
      std::vector<bool> left = s.left;
      lock.unlock();
      std::vector<int64_t> counters(s.watched.size(), -1);
      std::string verdict;
      std::string error;
      try {
        if (!outgoing.empty())
          s.store->set(kVerdictKey, std::vector<uint8_t>(outgoing.begin(), outgoing.end()));
        // A rank that stops with its own verdict has nothing to read: rank 0 need not wait for it.
        if (leaving || !outgoing.empty()) s.store->set(left_key(s.rank), std::vector<uint8_t>{1});
        s.store->add(beat_key(s.rank), 1);
        for (std::size_t i = 0; i < s.watched.size(); ++i) {
          if (left[i]) continue;
          counters[i] = s.store->add(beat_key(s.watched[i]), 0);
          left[i] = s.store->check({left_key(s.watched[i])});
        }
        if (s.store->check({kVerdictKey})) {
          const auto value = s.store->get(kVerdictKey);
          verdict.assign(value.begin(), value.end());
          // This rank stops too: rank 0 need not keep the store up for it.
          if (verdict != outgoing) s.store->set(left_key(s.rank), std::vector<uint8_t>{1});
        }
      } catch (const std::exception& e) {
        error = message_of(e);
      }
      lock.lock();
      if (!error.empty()) {
        s.io_error = error;
      } else {
        const auto now = Clock::now();
        s.last_io = now;
        s.verdict_sent = s.verdict_sent || !outgoing.empty();
        s.left_sent = s.left_sent || leaving;
        for (std::size_t i = 0; i < s.watched.size(); ++i) {
          s.left[i] = left[i];
          if (counters[i] != s.counters[i]) s.changed[i] = now;
          if (counters[i] >= 0) s.counters[i] = counters[i];
          if (counters[i] >= 1) s.started[i] = true;
        }
        if (!verdict.empty() && verdict != s.outgoing) s.verdict = verdict;
      }
      s.wake.notify_all();
      s.wake.wait_for(lock, s.beat, [&] {
        return s.stopping || (!s.outgoing.empty() && !s.verdict_sent) ||
               (s.leaving && !s.left_sent);
      });
    }
    s.beat_done = true;
    s.wake.notify_all();
  }

  static void judge_loop(State& s) {
    std::unique_lock<std::mutex> lock(s.mutex);
    while (s.judging) {
      s.wake.wait_for(lock, s.beat, [&] { return !s.judging; });
      if (!s.judging) break;
      const auto now = Clock::now();
      std::string message;
      if (!s.verdict.empty()) {
        message = fmt::format("rank {}: stopping, as another rank found: {}", s.rank, s.verdict);
      } else if (now - s.last_io > s.period) {
        message = fmt::format(
            "rank {}: the rendezvous store at {} ({}) has not answered for {:.1f} s "
            "(dist.heartbeat_s = {:g}){}: {} is dead, frozen or unreachable from this host; "
            "stopping (the last checkpoint is intact: run the same command again once every "
            "host is back)",
            s.rank, s.store_where, s.rank0_serves ? "served by " + who(s, 0) : "torchrun's agent",
            std::chrono::duration<double>(now - s.last_io).count(), in_seconds(s.period),
            s.io_error.empty() ? "" : " (" + s.io_error + ")",
            s.rank0_serves ? "rank 0" : "the agent");
      } else {
        for (std::size_t i = 0; i < s.watched.size() && message.empty(); ++i) {
          const auto allowed = s.started[i] ? s.period : s.first_beat;
          if (s.left[i] || now - s.changed[i] <= allowed) continue;
          message = fmt::format(
              "{} has not been heard from for {:.1f} s (dist.heartbeat_s = {:g}{}): it died, "
              "froze or lost the network; every rank stops (the last checkpoint is intact: run "
              "the same command again once its host is back)",
              who(s, s.watched[i]), std::chrono::duration<double>(now - s.changed[i]).count(),
              in_seconds(s.period),
              s.started[i] ? ""
                           : fmt::format("; it never beat, and a first beat may take {:g} s",
                                         in_seconds(s.first_beat)));
          // Tell the others first, for at most two beats.
          s.outgoing = message;
          s.wake.notify_all();
          s.wake.wait_for(lock, 2 * s.beat, [&] { return s.verdict_sent; });
          message = fmt::format("rank {}: {}", s.rank, message);
        }
      }
      if (!message.empty()) {
        lock.unlock();
        spdlog::error("{}", message);
        spdlog::default_logger()->flush();
        std::_Exit(kExitError);
      }
    }
  }

  std::shared_ptr<State> state_;
  std::thread beat_thread_;
  std::thread judge_thread_;
};

std::shared_ptr<::gloo::transport::Device> gloo_device(const std::string& master_addr) {
  if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME"); ifname && *ifname) {
    return c10d::ProcessGroupGloo::createDeviceForInterface(ifname);
  }
  // A single-host job rendezvousing on loopback stays on loopback, whatever the hostname says.
  if (master_addr == "127.0.0.1" || master_addr == "localhost" || master_addr == "::1") {
    return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
  }
  return c10d::ProcessGroupGloo::createDefaultDevice();
}

// The address rank 0's store must listen on, while this thread creates the store; null elsewhere
// (read by the bind() below).
thread_local const sockaddr_storage* t_store_listen_address = nullptr;

// MASTER_ADDR as a socket address when it is a numeric IPv4 or IPv6 address or "localhost"
// (127.0.0.1); nothing for a host name, which may resolve here to another address (Debian maps
// the host's own name to 127.0.1.1) than on the other hosts.
std::optional<sockaddr_storage> store_listen_address(const std::string& master_addr) {
  sockaddr_storage address{};
  auto* v4 = reinterpret_cast<sockaddr_in*>(&address);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&address);
  const std::string host = master_addr == "localhost" ? "127.0.0.1" : master_addr;
  if (::inet_pton(AF_INET, host.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
  } else if (::inet_pton(AF_INET6, host.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
  } else {
    return std::nullopt;
  }
  return address;
}

// While in scope, the store this thread creates listens on `address` only (see bind() below).
class StoreListenScope {
 public:
  explicit StoreListenScope(const sockaddr_storage* address) { t_store_listen_address = address; }
  ~StoreListenScope() { t_store_listen_address = nullptr; }
  StoreListenScope(const StoreListenScope&) = delete;
  StoreListenScope& operator=(const StoreListenScope&) = delete;
};

}  // namespace

struct Communicator::Group {
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::Backend> pg;
  std::unique_ptr<Heartbeat> heartbeat;  // null with dist.heartbeat_s = 0
  bool serves_store = false;
  std::chrono::milliseconds heartbeat_period{0};
  std::chrono::milliseconds leave_wait{0};
};

double PendingSum::get() {
  XLME_CHECK(read_, "PendingSum::get: no sum pending (an internal error: please report it)");
  const double value = read_();
  read_ = nullptr;
  return value;
}

void PendingWork::wait() {
  XLME_CHECK(wait_, "PendingWork::wait: nothing pending (an internal error: please report it)");
  auto wait = std::move(wait_);
  wait_ = nullptr;
  wait();
}

Communicator::Communicator(LaunchInfo launch, torch::Device device, std::string backend)
    : launch_(std::move(launch)), device_(device), backend_(std::move(backend)) {}

Communicator::~Communicator() {
  if (!group_ || !group_->heartbeat) return;
  const int world = launch_.world_size;
  const bool failed = std::uncaught_exceptions() > 0;
  group_->heartbeat->leave(
      failed ? fmt::format("rank {} (host {}) stopped with an error; its log says why",
                           launch_.rank, host_name())
             : "");
  if (!group_->serves_store) return;
  // The store lives in this process: the others' heartbeats read it until they leave (after a
  // failure, until they have read why, which takes them a beat or two).
  const auto deadline =
      Clock::now() + (failed ? 3 * group_->heartbeat_period / 5 : group_->leave_wait);
  try {
    for (int r = 1; r < world && Clock::now() < deadline; ++r) {
      while (!group_->store->check({left_key(r)}) && Clock::now() < deadline) {
        std::this_thread::sleep_for(kRendezvousPoll);
      }
    }
  } catch (const std::exception& e) {
    spdlog::warn("rank 0: cannot see whether the other ranks left: {}", message_of(e));
  }
}

namespace {

// Why the rendezvous gave up when the stop signal came `while_doing` something.
RendezvousInterrupted interrupted(const LaunchInfo& launch, const std::string& while_doing) {
  return RendezvousInterrupted(
      fmt::format("rank {} of {}: stopped by a signal while {}: no step ran, nothing to save",
                  launch.rank, launch.world_size, while_doing),
      __FILE__, __LINE__);
}

// c10d's store for this rank: served here (rank 0 without torchrun's agent) or reached as a
// client, retried every kConnectAttempt until `deadline` so that `stop` is seen in between.
// `timeout`: the store's own timeout for its calls afterwards.
c10::intrusive_ptr<c10d::Store> open_store(const LaunchInfo& launch, bool serve,
                                           std::chrono::milliseconds timeout,
                                           Clock::time_point deadline,
                                           const std::function<bool()>& stop,
                                           const std::string& waiting_for) {
  const std::string where = fmt::format("{}:{}", launch.master_addr, launch.master_port);
  c10d::TCPStoreOptions options;
  options.port = static_cast<std::uint16_t>(launch.master_port);
  options.isServer = serve;
  options.numWorkers = launch.world_size;
  options.waitWorkers = false;
  // c10d's store listens on every interface; rank 0's listens on MASTER_ADDR alone when it is an
  // address, so that a job on 127.0.0.1 stays on loopback (the store has no authentication).
  const std::optional<sockaddr_storage> listen_at =
      serve ? store_listen_address(launch.master_addr) : std::nullopt;
  std::string last_error;
  const auto start = Clock::now();
  const auto report_every = missing_report_every(deadline - start);
  auto next_report = start + report_every;
  while (true) {
    const auto attempt_start = Clock::now();
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - attempt_start);
    const auto attempt = std::max(std::min<std::chrono::milliseconds>(kConnectAttempt, left),
                                  std::chrono::milliseconds(1));
    options.timeout = serve ? timeout : attempt;
    // A client reaches for c10d's store only once its port accepts connections.
    const std::string unreachable =
        serve ? "" : probe_tcp(launch.master_addr, launch.master_port, attempt);
    if (unreachable.empty()) {
      try {
        const StoreListenScope scope(listen_at ? &*listen_at : nullptr);
        c10::intrusive_ptr<c10d::Store> store =
            c10::make_intrusive<c10d::TCPStore>(launch.master_addr, options);
        store->setTimeout(timeout);
        // The agent's store outlives the workers it restarts: each attempt keeps its keys apart.
        if (launch.agent_store) {
          store = c10::make_intrusive<c10d::PrefixStore>(
              fmt::format("xlme/attempt_{}", launch.restart_count), store);
        }
        return store;
      } catch (const std::exception& e) {
        last_error = message_of(e);
      }
    } else {
      last_error = unreachable;
      if (Clock::now() >= next_report && Clock::now() < deadline) {
        spdlog::info(
            "rank {} of {}: the rendezvous at {} is not up yet ({}) after {:.0f} s (giving up "
            "after {:.0f} s)",
            launch.rank, launch.world_size, where, unreachable, seconds_since(start),
            std::chrono::duration<double>(deadline - start).count());
        next_report += report_every;
      }
      // A refused connection returns at once: the attempts stay kConnectAttempt apart.
      const auto retry_at = std::min(attempt_start + kConnectAttempt, deadline);
      while (Clock::now() < retry_at && !(stop && stop())) {
        std::this_thread::sleep_for(kRendezvousPoll);
      }
    }
    XLME_CHECK(!serve || (last_error.find("EADDRINUSE") == std::string::npos &&
                          last_error.find("ddress already in use") == std::string::npos),
               "rank 0 of {}: MASTER_PORT {} is already taken on {} (another job, or a process "
               "left over from an earlier one, listens there); set MASTER_PORT to a free port "
               "for every rank, or stop that process",
               launch.world_size, launch.master_port, launch.master_addr);
    if (serve || Clock::now() >= deadline) break;
    if (stop && stop()) throw interrupted(launch, waiting_for);
  }
  XLME_FAIL(
      "rank {} of {}: cannot {} the rendezvous at {} ({}){}; check MASTER_ADDR and MASTER_PORT, "
      "{}",
      launch.rank, launch.world_size, serve ? "serve" : "reach", where, last_error,
      serve ? "" : loopback_note(launch.master_addr, "MASTER_ADDR"),
      launch.agent_store
          ? "and that torchrun's agent on the first node (TORCHELASTIC_USE_AGENT_STORE=True) is "
            "running"
          : "that the port is free on rank 0's host, and that rank 0 is running");
}

std::vector<std::string> split_lines(const std::vector<uint8_t>& bytes) {
  std::vector<std::string> lines;
  std::istringstream in(std::string(bytes.begin(), bytes.end()));
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

}  // namespace

std::shared_ptr<Communicator> Communicator::create(const LaunchInfo& launch,
                                                   const torch::Device& device,
                                                   const std::string& backend,
                                                   std::chrono::milliseconds timeout) {
  CommOptions options;
  options.timeout = timeout;
  options.startup_timeout = timeout;
  return create(launch, device, backend, options);
}

namespace {

// The backend dist.backend names for `device` ("auto": nccl on CUDA, else gloo); throws when it
// is unknown or cannot run on `device`.
std::string choose_backend(const std::string& backend, const torch::Device& device) {
  std::string chosen = backend;
  if (chosen == "auto") chosen = device.is_cuda() ? "nccl" : "gloo";
  XLME_CHECK(chosen == "gloo" || chosen == "nccl",
             "unknown distributed backend '{}'; use auto, gloo or nccl", backend);
  XLME_CHECK(chosen == "gloo" || device.is_cuda(),
             "dist.backend=nccl needs CUDA tensors but this process runs on {} (run.device); use "
             "dist.backend=gloo or auto",
             device.str());
  return chosen;
}

// What the start-up steps share: this rank, the rendezvous's address, when start-up began and
// its deadline (dist.startup_timeout_s), and the stop signal.
struct StartUp {
  const LaunchInfo& launch;
  const CommOptions& options;
  std::string where;  // MASTER_ADDR:MASTER_PORT
  Clock::time_point start;
  Clock::time_point deadline;

  bool stopped() const { return options.stop_requested && options.stop_requested(); }
  double startup_seconds() const { return in_seconds(options.startup_timeout); }
};

// Rendezvous: rank 0 serves a TCPStore without waiting for the others, so that the start-up
// check, not the store, decides who is missing and says so. Under torchrun's agent store the
// agent serves it already and every rank is a client, as in PyTorch's own rendezvous.
c10::intrusive_ptr<c10d::Store> rendezvous(const StartUp& s, bool serve) {
  if (serve && !store_listen_address(s.launch.master_addr)) {
    spdlog::info(
        "MASTER_ADDR {} is a host name: the rendezvous store listens on every interface of this "
        "host; set MASTER_ADDR to this host's address on the job's private network to listen "
        "there only",
        s.launch.master_addr);
  }
  return open_store(
      s.launch, serve, s.options.timeout, s.deadline, [&s] { return s.stopped(); },
      "reaching the rendezvous at " + s.where);
}

// Start-up check, first half: this rank announces itself as `host` (its heartbeat counter first,
// so that the counters exist before anyone reads them). A second process with the same rank
// stops here with DuplicateRank, before it writes anything the job reads.
void announce(c10d::Store& store, const StartUp& s, const std::string& host) {
  const int rank = s.launch.rank;
  try {
    if (store.add(claim_key(rank), 1) > 1) {
      std::string first = "not announced yet";
      if (store.check({alive_key(rank)})) {
        const auto value = store.get(alive_key(rank));
        first = std::string(value.begin(), value.end());
      }
      throw DuplicateRank(
          fmt::format(
              "rank {} of {}: another process already joined the rendezvous at {} as rank {} "
              "(host:pid {}); this one ({}) stops without touching that job. Each rank is "
              "started once: check RANK (and LOCAL_RANK, SLURM_PROCID) of this launch, or "
              "whether the same job was launched twice on MASTER_PORT {}",
              rank, s.launch.world_size, s.where, rank, first, host, s.launch.master_port),
          __FILE__, __LINE__);
    }
    store.add(beat_key(rank), 1);
    store.set(alive_key(rank), std::vector<uint8_t>(host.begin(), host.end()));
  } catch (const DuplicateRank&) {
    throw;
  } catch (const std::exception& e) {
    XLME_FAIL("rank {} of {}: the rendezvous store at {} failed: {}; see rank 0's log", rank,
              s.launch.world_size, s.where, message_of(e));
  }
}

// Start-up check on rank 0: waits until every rank has announced itself, naming the ones that
// stay silent, then confirms the rendezvous with every rank's host:pid. Returns them.
std::vector<std::string> confirm_all_joined(c10d::Store& store, const StartUp& s) {
  const int world = s.launch.world_size;
  const auto report_every = missing_report_every(s.options.startup_timeout);
  auto next_report = s.start + report_every;
  std::vector<int> missing;
  do {
    missing.clear();
    for (int r = 0; r < world; ++r) {
      if (!store.check({alive_key(r)})) missing.push_back(r);
    }
    if (missing.empty()) break;
    if (s.stopped()) {
      throw interrupted(s.launch,
                        fmt::format("waiting for rank(s) {} to join", fmt::join(missing, ", ")));
    }
    // No report at the deadline itself: the error that names the ranks follows at once.
    if (const auto now = Clock::now(); now >= next_report && now < s.deadline) {
      next_report += report_every;
      spdlog::warn(
          "rendezvous at {}: still waiting for rank(s) {} of {} after {:.0f} s (giving up "
          "after dist.startup_timeout_s = {:g} s)",
          s.where, fmt::join(missing, ", "), world, seconds_since(s.start), s.startup_seconds());
    }
    std::this_thread::sleep_for(kRendezvousPoll);
  } while (Clock::now() < s.deadline);
  XLME_CHECK(missing.empty(),
             "rank(s) {} of {} did not join the rendezvous at {} within {:g} s "
             "(dist.startup_timeout_s); check that every process was launched and can reach {}",
             fmt::join(missing, ", "), world, s.where, s.startup_seconds(), s.where);
  std::vector<std::string> hosts;
  std::string all;
  for (int r = 0; r < world; ++r) {
    const auto value = store.get(alive_key(r));
    hosts.emplace_back(value.begin(), value.end());
    all += hosts.back() + "\n";
  }
  store.set(kAllAliveKey, std::vector<uint8_t>(all.begin(), all.end()));
  return hosts;
}

// Start-up check on the other ranks: waits for rank 0's confirmation and returns every rank's
// host:pid from it.
std::vector<std::string> await_confirmation(c10d::Store& store, const StartUp& s) {
  const int rank = s.launch.rank;
  const int world = s.launch.world_size;
  std::vector<std::string> hosts;
  try {
    while (!store.check({kAllAliveKey})) {
      if (s.stopped()) throw interrupted(s.launch, "waiting for rank 0 to confirm the rendezvous");
      XLME_CHECK(Clock::now() < s.deadline,
                 "rank {} of {}: rank 0 did not confirm within {:g} s (dist.startup_timeout_s) "
                 "that all ranks joined the rendezvous at {}; rank 0's log names the missing "
                 "ranks",
                 rank, world, s.startup_seconds(), s.where);
      std::this_thread::sleep_for(kRendezvousPoll);
    }
    hosts = split_lines(store.get(kAllAliveKey));
  } catch (const xlme::Error&) {
    throw;
  } catch (const std::exception& e) {
    XLME_FAIL(
        "rank {} of {}: lost the rendezvous store at {} while waiting for rank 0 ({}); see "
        "rank 0's log",
        rank, world, s.where, message_of(e));
  }
  XLME_CHECK(static_cast<int>(hosts.size()) == world,
             "rank {} of {}: rank 0 confirmed {} ranks at the rendezvous {}; is another job "
             "using MASTER_PORT {}?",
             rank, world, hosts.size(), s.where, s.launch.master_port);
  return hosts;
}

// Group construction: the `backend` process group over the rendezvous store, each collective
// limited to options.timeout. `hosts`: every rank's host:pid, to check gloo's address.
c10::intrusive_ptr<c10d::Backend> make_process_group(const c10::intrusive_ptr<c10d::Store>& store,
                                                     const StartUp& s, const std::string& backend,
                                                     const std::vector<std::string>& hosts) {
  const int rank = s.launch.rank;
  const int world = s.launch.world_size;
  auto prefix = c10::make_intrusive<c10d::PrefixStore>("xlme/pg", store);
  try {
    if (backend == "gloo") {
      check_gloo_address(rank, hosts);
      auto pg_options = c10d::ProcessGroupGloo::Options::create(s.options.timeout);
      pg_options->devices.push_back(gloo_device(s.launch.master_addr));
      return c10::make_intrusive<c10d::ProcessGroupGloo>(prefix, rank, world, pg_options);
    }
#ifdef USE_C10D_NCCL
    // A failed or timed-out collective tears the process down (TORCH_NCCL_ASYNC_ERROR_HANDLING
    // 3, LibTorch 2.x's default; 1.x defaulted to 0, a hang) unless the user chose otherwise.
    ::setenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", "3", /*overwrite=*/0);
    const char* handling = std::getenv("TORCH_NCCL_ASYNC_ERROR_HANDLING");
    if (std::string(handling) == "0" || std::string(handling) == "2") {
      spdlog::warn(
          "TORCH_NCCL_ASYNC_ERROR_HANDLING={}: a failed NCCL collective will not stop this "
          "process; unset it (xlme then uses 3) so that a lost rank ends the job",
          handling);
    }
    auto pg_options = c10d::ProcessGroupNCCL::Options::create();
    pg_options->timeout = s.options.timeout;
    return c10::make_intrusive<c10d::ProcessGroupNCCL>(prefix, rank, world, pg_options);
#else
    XLME_FAIL(
        "dist.backend=nccl needs a CUDA LibTorch built with NCCL; this build ({}) has "
        "none: use dist.backend=gloo",
        TORCH_VERSION);
#endif
  } catch (const xlme::Error&) {
    throw;
  } catch (const std::exception& e) {
    XLME_FAIL("rank {} of {}: cannot create the {} process group: {}", rank, world, backend,
              e.what());
  }
}

// One line per rank saying how it joined the job.
void log_joined(const StartUp& s, const torch::Device& device, const std::string& backend) {
  // SLURM without MASTER_PORT: launch_info_from_env() derived the port from the job id.
  const char* master_port = std::getenv("MASTER_PORT");
  const bool slurm_port = s.launch.launcher == "slurm" &&
                          (master_port == nullptr || *master_port == '\0') &&
                          std::getenv("SLURM_JOB_ID") != nullptr;
  spdlog::info("distributed: rank {} of {} (local rank {}) on {}, {} via {}, rendezvous {}{}; {}",
               s.launch.rank, s.launch.world_size, s.launch.local_rank, device.str(), backend,
               s.launch.launcher, s.where,
               s.launch.agent_store ? " (torchrun agent's store)"
               : slurm_port         ? " (port 15000 + SLURM_JOB_ID % 20000; set MASTER_PORT to "
                                      "choose another)"
                                    : "",
               s.options.heartbeat.count() > 0
                   ? fmt::format("heartbeat: a rank silent for {:g} s stops the job",
                                 in_seconds(s.options.heartbeat))
                   : std::string("no heartbeat (dist.heartbeat_s = 0)"));
}

}  // namespace

std::shared_ptr<Communicator> Communicator::create(const LaunchInfo& launch,
                                                   const torch::Device& device,
                                                   const std::string& backend,
                                                   const CommOptions& options) {
  const std::string chosen = choose_backend(backend, device);
  std::shared_ptr<Communicator> comm(new Communicator(launch, device, chosen));
  if (launch.world_size == 1) return comm;
  stop_with_parent(launch);

  const auto start = Clock::now();
  const StartUp s{launch, options, fmt::format("{}:{}", launch.master_addr, launch.master_port),
                  start, start + options.startup_timeout};
  comm->group_ = std::make_unique<Group>();
  Group& group = *comm->group_;
  group.serves_store = launch.rank == 0 && !launch.agent_store;
  group.store = rendezvous(s, group.serves_store);

  announce(*group.store, s, this_host());
  const std::vector<std::string> hosts =
      launch.rank == 0 ? confirm_all_joined(*group.store, s) : await_confirmation(*group.store, s);

  // From here on a lost rank is noticed within dist.heartbeat_s, also while the process group
  // connects (a rank that fails below tells the others through its destructor).
  if (options.heartbeat.count() > 0) {
    const auto period = options.heartbeat;
    const auto store = open_store(launch, /*serve=*/false, period, Clock::now() + period, nullptr,
                                  "opening the heartbeat's connection");
    group.heartbeat = std::make_unique<Heartbeat>(store, launch.rank, hosts, s.where,
                                                  !launch.agent_store, period);
    group.heartbeat_period = period;
    group.leave_wait = std::max<std::chrono::milliseconds>(period, std::chrono::seconds(5));
  }

  group.pg = make_process_group(group.store, s, chosen, hosts);

  // One all-reduce through the new group proves the collective path end to end.
  std::vector<torch::Tensor> probe{torch::ones({1}, torch::TensorOptions().device(device))};
  comm->all_reduce_sum(probe);
  const double total = probe[0].item<double>();
  XLME_CHECK(total == launch.world_size,
             "start-up all-reduce over {} ranks returned {} instead of {}", launch.world_size,
             total, launch.world_size);
  log_joined(s, device, chosen);
  return comm;
}

void Communicator::check_devices(const std::vector<torch::Tensor>& tensors,
                                 const char* collective) const {
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    XLME_CHECK(tensors[i].device() == device_,
               "{}: tensor {} of {} is on {} but this communicator's collectives run on {} ({}); "
               "create it on the communicator's device (an internal error: please report it)",
               collective, i, tensors.size(), tensors[i].device().str(), device_.str(), backend_);
  }
}

void Communicator::all_reduce_sum(std::vector<torch::Tensor>& tensors) {
  check_devices(tensors, "all-reduce");
  if (!group_) return;
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  try {
    // One collective per tensor: a multi-tensor call means "one tensor per device" to c10d.
    for (auto& tensor : tensors) {
      std::vector<torch::Tensor> one{tensor};
      works.push_back(group_->pg->allreduce(one));
    }
    for (auto& work : works) work->wait();
  } catch (const std::exception& e) {
    XLME_FAIL(
        "rank {}: all-reduce failed ({}); another rank probably died or exceeded "
        "dist.timeout_s, see its log",
        rank(), e.what());
  }
}

void Communicator::broadcast(std::vector<torch::Tensor>& tensors, int root) {
  check_devices(tensors, "broadcast");
  if (!group_) return;
  c10d::BroadcastOptions options;
  options.rootRank = root;
  try {
    for (auto& tensor : tensors) {
      std::vector<torch::Tensor> one{tensor};
      group_->pg->broadcast(one, options)->wait();
    }
  } catch (const std::exception& e) {
    XLME_FAIL("rank {}: broadcast from rank {} failed ({}); see the other ranks' logs", rank(),
              root, e.what());
  }
}

PendingSum Communicator::start_sum(double value) {
  if (!group_) return PendingSum([value] { return value; });
  // Created here, on the collective's device: no caller can hand NCCL a CPU tensor.
  std::vector<torch::Tensor> one{
      torch::full({1}, value, torch::TensorOptions(torch::kFloat64).device(device_))};
  c10::intrusive_ptr<c10d::Work> work;
  try {
    work = group_->pg->allreduce(one);
  } catch (const std::exception& e) {
    XLME_FAIL("rank {}: cannot start an all-reduce ({}); see the other ranks' logs", rank(),
              e.what());
  }
  const int me = rank();
  auto wait = [work, me] {
    try {
      work->wait();
    } catch (const std::exception& e) {
      XLME_FAIL(
          "rank {}: all-reduce failed ({}); another rank probably died or exceeded "
          "dist.timeout_s, see its log",
          me, e.what());
    }
  };
  if (device_.is_cuda() && backend_ == "nccl") {
    // NCCL's wait() only orders the current stream after the collective; the copy to pinned
    // memory and an event behind it let get() wait for the collective, not for later kernels.
    wait();
    auto host = torch::empty({1}, torch::TensorOptions(torch::kFloat64).pinned_memory(true));
    host.copy_(one[0], /*non_blocking=*/true);
    auto event = std::make_shared<c10::Event>(device_.type());
    event->record(c10::impl::VirtualGuardImpl(device_.type()).getStream(device_));
    return PendingSum([host, event] {
      event->synchronize();
      return host.data_ptr<double>()[0];
    });
  }
  auto tensor = one[0];
  return PendingSum([tensor, wait] {
    wait();
    return tensor.item<double>();
  });
}

std::vector<double> Communicator::reduce_scalars(const std::vector<double>& values, ScalarOp op) {
  if (!group_ || values.empty()) return values;
  std::vector<torch::Tensor> one{
      torch::tensor(values, torch::kFloat64).to(device_)};  // [n], on the collective's device
  c10d::AllreduceOptions options;
  options.reduceOp = op == ScalarOp::kSum   ? c10d::ReduceOp::SUM
                     : op == ScalarOp::kMin ? c10d::ReduceOp::MIN
                                            : c10d::ReduceOp::MAX;
  try {
    group_->pg->allreduce(one, options)->wait();
  } catch (const std::exception& e) {
    XLME_FAIL(
        "rank {}: all-reduce failed ({}); another rank probably died or exceeded "
        "dist.timeout_s, see its log",
        rank(), e.what());
  }
  const auto host = one[0].cpu();
  return std::vector<double>(host.data_ptr<double>(), host.data_ptr<double>() + host.numel());
}

namespace {

// A wait that names the collective and the rank when the work failed.
std::function<void()> waiting_for(c10::intrusive_ptr<c10d::Work> work, int rank,
                                  const char* collective) {
  return [work = std::move(work), rank, collective] {
    try {
      work->wait();
    } catch (const std::exception& e) {
      XLME_FAIL(
          "rank {}: {} failed ({}); another rank probably died or exceeded dist.timeout_s, see "
          "its log",
          rank, collective, e.what());
    }
  };
}

}  // namespace

PendingWork Communicator::start_all_reduce_sum(torch::Tensor tensor) {
  check_devices({tensor}, "all-reduce");
  if (!group_) return PendingWork([] {});
  std::vector<torch::Tensor> one{std::move(tensor)};
  try {
    return PendingWork(waiting_for(group_->pg->allreduce(one), rank(), "all-reduce"));
  } catch (const std::exception& e) {
    XLME_FAIL("rank {}: cannot start an all-reduce ({}); see the other ranks' logs", rank(),
              e.what());
  }
}

PendingWork Communicator::start_reduce_scatter_sum(torch::Tensor input, torch::Tensor output) {
  check_devices({input, output}, "reduce-scatter");
  XLME_CHECK(input.numel() == output.numel() * world_size(),
             "reduce-scatter: {} input elements for {} ranks x {} (an internal error: please "
             "report it)",
             input.numel(), world_size(), output.numel());
  if (!group_) {
    output.copy_(input);
    return PendingWork([] {});
  }
  try {
    return PendingWork(
        waiting_for(group_->pg->_reduce_scatter_base(output, input), rank(), "reduce-scatter"));
  } catch (const std::exception& e) {
    XLME_FAIL("rank {}: cannot start a reduce-scatter ({}); see the other ranks' logs", rank(),
              e.what());
  }
}

void Communicator::all_gather(torch::Tensor input, torch::Tensor output) {
  check_devices({input, output}, "all-gather");
  XLME_CHECK(output.numel() == input.numel() * world_size(),
             "all-gather: {} output elements for {} ranks x {} (an internal error: please "
             "report it)",
             output.numel(), world_size(), input.numel());
  if (!group_) {
    output.copy_(input);
    return;
  }
  c10::intrusive_ptr<c10d::Work> work;
  try {
    work = group_->pg->_allgather_base(output, input);
  } catch (const std::exception& e) {
    XLME_FAIL("rank {}: cannot start an all-gather ({}); see the other ranks' logs", rank(),
              e.what());
  }
  waiting_for(work, rank(), "all-gather")();
}

std::vector<std::string> Communicator::all_gather_strings(const std::string& value) {
  if (!group_) return {value};
  const std::string prefix = fmt::format("xlme/strings/{}/", string_exchanges_++);
  std::vector<std::string> values;
  try {
    group_->store->set(prefix + std::to_string(rank()),
                       std::vector<uint8_t>(value.begin(), value.end()));
    for (int r = 0; r < world_size(); ++r) {
      const std::vector<uint8_t> bytes = group_->store->get(prefix + std::to_string(r));
      values.emplace_back(bytes.begin(), bytes.end());
    }
  } catch (const std::exception& e) {
    XLME_FAIL(
        "rank {}: cannot exchange values through the rendezvous store ({}); see the other "
        "ranks' logs",
        rank(), e.what());
  }
  return values;
}

void Communicator::barrier() {
  if (!group_) return;
  try {
    // NCCL's barrier is an all-reduce on a device it guesses from the rank unless told which.
    c10d::BarrierOptions options;
    if (device_.is_cuda()) options.device_ids = {static_cast<int64_t>(device_.index())};
    group_->pg->barrier(options)->wait();
  } catch (const std::exception& e) {
    XLME_FAIL("rank {}: barrier failed ({}); see the other ranks' logs", rank(), e.what());
  }
}

void broadcast_tensors(Communicator& comm, const std::vector<torch::Tensor>& tensors, int root) {
  if (comm.world_size() == 1) return;
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> data;
  for (const auto& t : tensors) data.push_back(t.detach());
  comm.broadcast(data, root);
}

void all_reduce_gradients(Communicator& comm, const std::vector<torch::Tensor>& params,
                          int64_t bucket_bytes, bool average) {
  if (comm.world_size() == 1) return;
  XLME_CHECK(bucket_bytes > 0, "gradient bucket size must be positive, got {} bytes", bucket_bytes);
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> grads;
  for (const auto& p : params) {
    if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
    grads.push_back(p.grad());
  }
  // Buckets of consecutive gradients with one dtype and device, each flattened into one tensor.
  std::size_t begin = 0;
  while (begin < grads.size()) {
    std::size_t end = begin;
    std::size_t bytes = 0;
    while (
        end < grads.size() && grads[end].scalar_type() == grads[begin].scalar_type() &&
        grads[end].device() == grads[begin].device() &&
        (end == begin || bytes + grads[end].nbytes() <= static_cast<std::size_t>(bucket_bytes))) {
      bytes += grads[end].nbytes();
      ++end;
    }
    const std::vector<torch::Tensor> bucket(grads.begin() + begin, grads.begin() + end);
    std::vector<torch::Tensor> flat{at::flatten_dense_tensors(bucket)};
    comm.all_reduce_sum(flat);
    if (average) flat[0].div_(comm.world_size());
    const auto pieces = at::unflatten_dense_tensors(flat[0], bucket);
    for (std::size_t i = 0; i < bucket.size(); ++i) bucket[i].copy_(pieces[i]);
    begin = end;
  }
}

}  // namespace xlme::dist

// c10d's TCPStore server (libuv's or the classic one) binds its socket to the wildcard address "::"
// or "0.0.0.0" whatever host it is given; TCPStoreOptions has no address to bind to. So
// this process's bind() rewrites a wildcard bind, on the thread creating rank 0's store and only
// while it does (t_store_listen_address), to MASTER_ADDR with the port asked for: an IPv6 socket
// takes MASTER_ADDR's IPv4-mapped form (c10d turns IPV6_V6ONLY off), an IPv4 socket cannot take an
// IPv6 address and fails, as if IPv4 were missing. Every other bind() goes to the C library
// unchanged. The executable's definition takes precedence over libc's for LibTorch's calls.
extern "C" int bind(int fd, const sockaddr* address, socklen_t length) noexcept {
  using Bind = int (*)(int, const sockaddr*, socklen_t);
  static const auto libc_bind = reinterpret_cast<Bind>(::dlsym(RTLD_NEXT, "bind"));
  const sockaddr_storage* target = xlme::dist::t_store_listen_address;
  if (target == nullptr || address == nullptr) return libc_bind(fd, address, length);
  if (address->sa_family == AF_INET) {
    const auto* asked = reinterpret_cast<const sockaddr_in*>(address);
    if (asked->sin_addr.s_addr != htonl(INADDR_ANY)) return libc_bind(fd, address, length);
    if (target->ss_family != AF_INET) {
      errno = EAFNOSUPPORT;
      return -1;
    }
    sockaddr_in specific = *reinterpret_cast<const sockaddr_in*>(target);
    specific.sin_port = asked->sin_port;
    return libc_bind(fd, reinterpret_cast<const sockaddr*>(&specific), sizeof(specific));
  }
  if (address->sa_family == AF_INET6) {
    const auto* asked = reinterpret_cast<const sockaddr_in6*>(address);
    if (!IN6_IS_ADDR_UNSPECIFIED(&asked->sin6_addr)) return libc_bind(fd, address, length);
    sockaddr_in6 specific{};
    specific.sin6_family = AF_INET6;
    specific.sin6_port = asked->sin6_port;
    if (target->ss_family == AF_INET6) {
      specific.sin6_addr = reinterpret_cast<const sockaddr_in6*>(target)->sin6_addr;
    } else {  // ::ffff:a.b.c.d
      specific.sin6_addr.s6_addr[10] = 0xff;
      specific.sin6_addr.s6_addr[11] = 0xff;
      std::memcpy(&specific.sin6_addr.s6_addr[12],
                  &reinterpret_cast<const sockaddr_in*>(target)->sin_addr, 4);
    }
    return libc_bind(fd, reinterpret_cast<const sockaddr*>(&specific), sizeof(specific));
  }
  return libc_bind(fd, address, length);
}
