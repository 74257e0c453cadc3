// ProcessGroup over c10d: TCPStore (+ PrefixStore) for the rendezvous, ProcessGroupGloo for the
// collectives; every c10d, Gloo and socket failure becomes a DistError that names the rank and the cause.
#include "torchpatch/dist/process_group.h"

#include <csignal>
#include <cstdlib>
#include <mutex>
#include <thread>

#include <fmt/format.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

namespace torchpatch::dist {

namespace {

// A c10d or Gloo message without LibTorch's backtrace and Gloo's "[file.cc:123] " prefix.
std::string cause_of(const std::exception& e) {
  std::string text = e.what();
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&e)) text = c10_error->what_without_backtrace();
  if (!text.empty() && text.front() == '[') {
    const auto end = text.find("] ");
    if (end != std::string::npos) text.erase(0, end + 2);
  }
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return text;
}

std::string seconds(std::chrono::milliseconds t) { return fmt::format("{:g} s", t.count() / 1000.0); }

bool is_loopback(const std::string& host) { return host == "localhost" || host.rfind("127.", 0) == 0; }

std::optional<int> env_int(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const long parsed = std::strtol(value, &end, 10);
  if (*end != '\0' || errno != 0 || parsed < 0 || parsed > 1'000'000) {
    throw DistError(fmt::format("{}='{}' is not a non-negative whole number", name, value));
  }
  return static_cast<int>(parsed);
}

void check(const GroupOptions& o) {
  if (o.world_size < 1) throw DistError(fmt::format("a process group needs at least one process, not {}", o.world_size));
  if (o.rank < 0 || o.rank >= o.world_size) {
    throw DistError(fmt::format("rank {} is outside a group of {} (ranks 0 to {})", o.rank, o.world_size, o.world_size - 1));
  }
  if (o.master_port < 1 || o.master_port > 65535) {
    throw DistError(fmt::format("master port {} is not a TCP port (1 to 65535)", o.master_port));
  }
  if (o.timeout.count() <= 0) throw DistError("a process group's timeout must be positive");
}

c10::intrusive_ptr<c10d::Store> connect_store(const GroupOptions& o) {
  c10d::TCPStoreOptions store_options;
  store_options.port = static_cast<std::uint16_t>(o.master_port);
  store_options.isServer = o.rank == 0 && !o.agent_store;
  store_options.numWorkers = o.world_size;
  store_options.waitWorkers = false;  // the Gloo rendezvous waits for the peers, under the same timeout
  store_options.timeout = o.timeout;
  c10::intrusive_ptr<c10d::Store> store;
  try {
    store = c10::make_intrusive<c10d::TCPStore>(o.master_addr, store_options);
  } catch (const std::exception& e) {
    const auto cause = cause_of(e);
    if (store_options.isServer && cause.find("in use") != std::string::npos) {
      throw DistError(fmt::format("rank 0 cannot serve the group's store on port {}: the port is in use (choose "
                                  "another master port)",
                                  o.master_port));
    }
    throw DistError(fmt::format("rank {} could not {} the group's store at {}:{} within {}: {}", o.rank,
                                store_options.isServer ? "serve" : "reach", o.master_addr, o.master_port,
                                seconds(o.timeout), cause));
  }
  if (!o.store_prefix.empty()) store = c10::make_intrusive<c10d::PrefixStore>(o.store_prefix, store);
  return store;
}

std::shared_ptr<::gloo::transport::Device> gloo_device(const GroupOptions& o) {
  if (is_loopback(o.master_addr)) return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
  if (const char* interface = std::getenv("GLOO_SOCKET_IFNAME"); interface != nullptr && *interface != '\0') {
    return c10d::ProcessGroupGloo::createDeviceForInterface(interface);
  }
  return c10d::ProcessGroupGloo::createDefaultDevice();
}

void check_tensor(const char* what, const at::Tensor& tensor) {
  if (!tensor.defined() || !tensor.device().is_cpu() || !tensor.is_contiguous()) {
    throw InputError(fmt::format("{} takes a defined, contiguous CPU tensor", what));
  }
}

}  // namespace

struct ProcessGroup::State {
  GroupOptions options;
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> gloo;

  // Starts a collective and waits for it, at most the group's timeout.
  template <typename Start>
  void run(const char* what, Start&& start) {
    try {
      const auto work = start();
      // Spin (yielding) for a while before sleeping on the work's condition variable: on this
      // 2-core virtual machine an all-reduce of 768 floats between two processes took 1.8 ms when
      // the caller slept and 0.3 to 0.6 ms when it spun (docs/parallel.md).
      const auto spin_until = std::chrono::steady_clock::now() + std::chrono::microseconds(2000);
      while (!work->isCompleted() && std::chrono::steady_clock::now() < spin_until) std::this_thread::yield();
      work->wait(options.timeout);
    } catch (const std::exception& e) {
      throw DistError(fmt::format("rank {} of {}: {} failed: {} (a peer process may have died, been killed or not "
                                  "answered within {})",
                                  options.rank, options.world_size, what, cause_of(e), seconds(options.timeout)));
    }
  }
};

std::optional<GroupOptions> options_from_environment() {
  const auto rank = env_int("RANK");
  const auto world_size = env_int("WORLD_SIZE");
  if (!rank && !world_size) return std::nullopt;
  if (!rank || !world_size) throw DistError(fmt::format("{} is set but {} is not", rank ? "RANK" : "WORLD_SIZE",
                                                        rank ? "WORLD_SIZE" : "RANK"));
  GroupOptions options;
  options.rank = *rank;
  options.world_size = *world_size;
  if (const char* addr = std::getenv("MASTER_ADDR"); addr != nullptr && *addr != '\0') options.master_addr = addr;
  if (const auto port = env_int("MASTER_PORT")) options.master_port = *port;
  if (const char* agent = std::getenv("TORCHELASTIC_USE_AGENT_STORE")) {
    const std::string value = agent;
    options.agent_store = value == "True" || value == "true" || value == "1";
  }
  if (options.agent_store) {
    options.store_prefix = fmt::format("/worker/attempt_{}", env_int("TORCHELASTIC_RESTART_COUNT").value_or(0));
  }
  check(options);
  return options;
}

std::shared_ptr<ProcessGroup> ProcessGroup::join(const GroupOptions& options) {
  check(options);
  // Gloo writes to its sockets with writev: a peer that died would kill this process with SIGPIPE
  // instead of failing the collective with an error (Python ignores SIGPIPE; C++ programs do not).
  std::signal(SIGPIPE, SIG_IGN);
  auto state = std::make_unique<State>();
  state->options = options;
  state->store = connect_store(options);
  auto gloo_options = c10d::ProcessGroupGloo::Options::create(options.timeout);
  gloo_options->threads = 1;
  try {
    gloo_options->devices.push_back(gloo_device(options));
    state->gloo = c10::make_intrusive<c10d::ProcessGroupGloo>(state->store, options.rank, options.world_size,
                                                             gloo_options);
  } catch (const std::exception& e) {
    throw DistError(fmt::format("rank {} of {}: the group did not form within {} (store {}:{}): {}", options.rank,
                                options.world_size, seconds(options.timeout), options.master_addr,
                                options.master_port, cause_of(e)));
  }
  // A rank's connections can be complete while a peer still finishes its side of one. Without this
  // barrier a rank that fails right after joining (a configuration error every rank finds, say)
  // could close its sockets under that peer, which would then report a transport error instead of
  // the error itself. After it, every rank holds the whole group.
  auto group = std::shared_ptr<ProcessGroup>(new ProcessGroup(std::move(state)));
  try {
    group->state_->gloo->barrier()->wait(options.timeout);
  } catch (const std::exception& e) {
    throw DistError(fmt::format("rank {} of {}: the group formed, but not every rank confirmed it within {} (store "
                                "{}:{}): {} (a peer process may have died or been killed)",
                                options.rank, options.world_size, seconds(options.timeout), options.master_addr,
                                options.master_port, cause_of(e)));
  }
  return group;
}

ProcessGroup::ProcessGroup(std::unique_ptr<State> state) : state_(std::move(state)) {}
ProcessGroup::~ProcessGroup() = default;

int ProcessGroup::rank() const { return state_->options.rank; }
int ProcessGroup::size() const { return state_->options.world_size; }
const GroupOptions& ProcessGroup::options() const { return state_->options; }

namespace {
// LibTorch 1.13's Gloo has no bfloat16: such tensors travel as float32 (exact both ways for a
// broadcast or a gather; an all-reduce then sums in float32 and rounds once).
bool travels_as_float(const at::Tensor& t) { return t.scalar_type() == at::kBFloat16; }
}  // namespace

void ProcessGroup::all_reduce_sum(at::Tensor& tensor) {
  check_tensor("all_reduce_sum", tensor);
  std::vector<at::Tensor> tensors{travels_as_float(tensor) ? tensor.to(at::kFloat) : tensor};
  state_->run("all-reduce", [&] { return state_->gloo->allreduce(tensors); });
  if (!tensors[0].is_same(tensor)) tensor.copy_(tensors[0]);
}

void ProcessGroup::broadcast(at::Tensor& tensor, int root) {
  check_tensor("broadcast", tensor);
  if (root < 0 || root >= size()) throw InputError(fmt::format("broadcast from rank {} in a group of {}", root, size()));
  std::vector<at::Tensor> tensors{travels_as_float(tensor) ? tensor.to(at::kFloat) : tensor};
  c10d::BroadcastOptions options;
  options.rootRank = root;
  state_->run("broadcast", [&] { return state_->gloo->broadcast(tensors, options); });
  if (!tensors[0].is_same(tensor)) tensor.copy_(tensors[0]);
}

std::vector<at::Tensor> ProcessGroup::all_gather(const at::Tensor& tensor) {
  check_tensor("all_gather", tensor);
  const auto sent = travels_as_float(tensor) ? tensor.to(at::kFloat) : tensor;
  std::vector<std::vector<at::Tensor>> outputs(1);
  for (int r = 0; r < size(); ++r) outputs[0].push_back(at::empty_like(sent));
  std::vector<at::Tensor> inputs{sent};
  state_->run("all-gather", [&] { return state_->gloo->allgather(outputs, inputs); });
  if (sent.is_same(tensor)) return outputs[0];
  std::vector<at::Tensor> back;
  for (const auto& t : outputs[0]) back.push_back(t.to(tensor.scalar_type()));
  return back;
}

void ProcessGroup::barrier() {
  state_->run("barrier", [&] { return state_->gloo->barrier(); });
}

namespace {
std::mutex active_mutex;
std::shared_ptr<ProcessGroup> active;
}  // namespace

std::shared_ptr<ProcessGroup> active_group() {
  std::lock_guard<std::mutex> lock(active_mutex);
  return active;
}

ActiveGroup::ActiveGroup(std::shared_ptr<ProcessGroup> group) {
  std::lock_guard<std::mutex> lock(active_mutex);
  previous_ = std::exchange(active, std::move(group));
}

ActiveGroup::~ActiveGroup() {
  std::lock_guard<std::mutex> lock(active_mutex);
  active = std::move(previous_);
}

}  // namespace torchpatch::dist
