#include "xlme/dist/communicator.h"

#include "xlme/common/error.h"

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
#include <netinet/in.h>
#include <sys/socket.h>
#include <torch/cuda.h>
#include <torch/version.h>
#include <unistd.h>

#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string_view>
#include <thread>

namespace xlme::dist {
namespace {

using Clock = std::chrono::steady_clock;

std::string alive_key(int rank) {
  return fmt::format("xlme/alive/{}", rank);
}
constexpr const char* kAllAliveKey = "xlme/alive/all";
// How often rank 0 names the ranks it is still waiting for at the rendezvous.
constexpr auto kMissingReportEvery = std::chrono::seconds(30);

std::string this_host() {
  char name[256] = {};
  ::gethostname(name, sizeof(name) - 1);
  return fmt::format("{}:{}", name, ::getpid());
}

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

Communicator::~Communicator() = default;

std::shared_ptr<Communicator> Communicator::create(const LaunchInfo& launch,
                                                   const torch::Device& device,
                                                   const std::string& backend,
                                                   std::chrono::milliseconds timeout) {
  std::string chosen = backend;
  if (chosen == "auto") chosen = device.is_cuda() ? "nccl" : "gloo";
  XLME_CHECK(chosen == "gloo" || chosen == "nccl",
             "unknown distributed backend '{}'; use auto, gloo or nccl", backend);
  XLME_CHECK(chosen == "gloo" || device.is_cuda(),
             "dist.backend=nccl needs CUDA tensors but this process runs on {} (run.device); use "
             "dist.backend=gloo or auto",
             device.str());
  std::shared_ptr<Communicator> comm(new Communicator(launch, device, chosen));
  if (launch.world_size == 1) return comm;

  const int rank = launch.rank;
  const int world = launch.world_size;
  const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(timeout).count();
  const std::string where = fmt::format("{}:{}", launch.master_addr, launch.master_port);
  comm->group_ = std::make_unique<Group>();
  Group& group = *comm->group_;

  // Rendezvous: rank 0 serves a TCPStore without waiting for the others, so that the presence
  // check below, not the store, decides who is missing and says so. Under torchrun's agent store
  // the agent serves it already and every rank is a client, as in PyTorch's own rendezvous.
  const bool serve = rank == 0 && !launch.agent_store;
  c10d::TCPStoreOptions options;
  options.port = static_cast<std::uint16_t>(launch.master_port);
  options.isServer = serve;
  options.numWorkers = world;
  options.waitWorkers = false;
  options.timeout = timeout;
  // c10d's store listens on every interface; rank 0's listens on MASTER_ADDR alone when it is an
  // address, so that a job on 127.0.0.1 stays on loopback (the store has no authentication).
  const std::optional<sockaddr_storage> listen_at =
      serve ? store_listen_address(launch.master_addr) : std::nullopt;
  if (serve && !listen_at) {
    spdlog::info(
        "MASTER_ADDR {} is a host name: the rendezvous store listens on every interface of this "
        "host; set MASTER_ADDR to this host's address on the job's private network to listen "
        "there only",
        launch.master_addr);
  }
  try {
    const StoreListenScope scope(listen_at ? &*listen_at : nullptr);
    c10::intrusive_ptr<c10d::Store> store =
        c10::make_intrusive<c10d::TCPStore>(launch.master_addr, options);
    // The agent's store outlives the workers it restarts: each attempt keeps its keys apart.
    if (launch.agent_store) {
      store = c10::make_intrusive<c10d::PrefixStore>(
          fmt::format("xlme/attempt_{}", launch.restart_count), store);
    }
    group.store = store;
  } catch (const std::exception& e) {
    const auto* torch_error = dynamic_cast<const c10::Error*>(&e);
    const std::string what = torch_error ? torch_error->what_without_backtrace() : e.what();
    XLME_CHECK(!serve || (what.find("EADDRINUSE") == std::string::npos &&
                          what.find("ddress already in use") == std::string::npos),
               "rank 0 of {}: MASTER_PORT {} is already taken on {} (another job, or a process "
               "left over from an earlier one, listens there); set MASTER_PORT to a free port "
               "for every rank, or stop that process",
               world, launch.master_port, launch.master_addr);
    XLME_FAIL(
        "rank {} of {}: cannot {} the rendezvous at {} within {} s ({}); check MASTER_ADDR and "
        "MASTER_PORT, {}",
        rank, world, serve ? "serve" : "reach", where, seconds, what.substr(0, what.find('\n')),
        launch.agent_store
            ? "and that torchrun's agent on the first node (TORCHELASTIC_USE_AGENT_STORE=True) "
              "is running"
            : "that the port is free on rank 0's host, and that rank 0 is running");
  }

  // Start-up check: every rank announces itself; rank 0 names the ones that stay silent.
  const std::string host = this_host();
  group.store->set(alive_key(rank), std::vector<uint8_t>(host.begin(), host.end()));
  if (rank == 0) {
    const auto start = Clock::now();
    const auto deadline = start + timeout;
    auto next_report = start + kMissingReportEvery;
    std::vector<int> missing;
    do {
      missing.clear();
      for (int r = 0; r < world; ++r) {
        if (!group.store->check({alive_key(r)})) missing.push_back(r);
      }
      if (missing.empty()) break;
      if (Clock::now() >= next_report) {
        next_report += kMissingReportEvery;
        spdlog::warn(
            "rendezvous at {}: still waiting for rank(s) {} of {} after {:.0f} s (giving up "
            "after dist.timeout_s = {} s)",
            where, fmt::join(missing, ", "), world,
            std::chrono::duration<double>(Clock::now() - start).count(), seconds);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    } while (Clock::now() < deadline);
    XLME_CHECK(missing.empty(),
               "rank(s) {} of {} did not join the rendezvous at {} within {} s "
               "(dist.timeout_s); check that every process was launched and can reach {}",
               fmt::join(missing, ", "), world, where, seconds, where);
    group.store->set(kAllAliveKey, std::vector<uint8_t>{1});
  } else {
    try {
      group.store->wait({kAllAliveKey}, timeout);
    } catch (const std::exception& e) {
      XLME_FAIL(
          "rank {} of {}: rank 0 did not confirm within {} s that all ranks joined the "
          "rendezvous at {}; rank 0's log names the missing ranks ({})",
          rank, world, seconds, where, e.what());
    }
  }

  auto prefix = c10::make_intrusive<c10d::PrefixStore>("xlme/pg", group.store);
  try {
    if (chosen == "gloo") {
      auto pg_options = c10d::ProcessGroupGloo::Options::create(timeout);
      pg_options->devices.push_back(gloo_device(launch.master_addr));
      group.pg = c10::make_intrusive<c10d::ProcessGroupGloo>(prefix, rank, world, pg_options);
    } else {
#ifdef USE_C10D_NCCL
      auto pg_options = c10d::ProcessGroupNCCL::Options::create();
      pg_options->timeout = timeout;
      group.pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(prefix, rank, world, pg_options);
#else
      XLME_FAIL(
          "dist.backend=nccl needs a CUDA LibTorch built with NCCL; this build ({}) has "
          "none: use dist.backend=gloo",
          TORCH_VERSION);
#endif
    }
  } catch (const xlme::Error&) {
    throw;
  } catch (const std::exception& e) {
    XLME_FAIL("rank {} of {}: cannot create the {} process group: {}", rank, world, chosen,
              e.what());
  }

  // One all-reduce through the new group proves the collective path end to end.
  std::vector<torch::Tensor> probe{torch::ones({1}, torch::TensorOptions().device(device))};
  comm->all_reduce_sum(probe);
  const double total = probe[0].item<double>();
  XLME_CHECK(total == world, "start-up all-reduce over {} ranks returned {} instead of {}", world,
             total, world);
  // SLURM without MASTER_PORT: launch_info_from_env() derived the port from the job id.
  const char* master_port = std::getenv("MASTER_PORT");
  const bool slurm_port = launch.launcher == "slurm" &&
                          (master_port == nullptr || *master_port == '\0') &&
                          std::getenv("SLURM_JOB_ID") != nullptr;
  spdlog::info("distributed: rank {} of {} (local rank {}) on {}, {} via {}, rendezvous {}{}", rank,
               world, launch.local_rank, device.str(), chosen, launch.launcher, where,
               launch.agent_store ? " (torchrun agent's store)"
               : slurm_port ? " (port 15000 + SLURM_JOB_ID % 20000; set MASTER_PORT to choose "
                              "another)"
                            : "");
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
