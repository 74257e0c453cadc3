// The --tp launcher: fork/exec one copy of this program per rank, watch them, name the rank that
// failed, stop the rest within a bounded time, and leave no process behind (also on Ctrl-C). What the
// ranks print on stderr is said once (RankErrors).
#include "launch.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <poll.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <set>
#include <string>
#include <vector>
#include <thread>

#include <filesystem>

#include <fmt/format.h>

#include "torchpatch/error.h"

extern char** environ;

namespace torchpatch::cli {

namespace {

constexpr int kMaxRanks = 64;
// After a rank fails, how long the others get to notice (their collectives fail at once when a peer's
// connection closes) and print their own error before they are stopped.
constexpr auto kGrace = std::chrono::seconds(5);

volatile std::sig_atomic_t interrupted = 0;
void on_signal(int signal) { interrupted = signal; }

int free_loopback_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  int port = 0;
  if (fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  if (fd >= 0) ::close(fd);
  if (port == 0) throw Error(fmt::format("--tp: no free TCP port on loopback: {}", std::strerror(errno)));
  return port;
}

// Removes --tp N (or --tp=N) from `args`; 0 when absent.
int take_tp(std::vector<std::string>& args) {
  for (auto it = args.begin(); it != args.end() && *it != "--"; ++it) {
    std::string value;
    auto end = it + 1;
    if (*it == "--tp") {
      if (end == args.end()) throw UsageError("--tp needs a value: the number of processes");
      value = *end++;
    } else if (it->rfind("--tp=", 0) == 0) {
      value = it->substr(5);
    } else {
      continue;
    }
    char* rest = nullptr;
    const long n = std::strtol(value.c_str(), &rest, 10);
    if (value.empty() || *rest != '\0' || n < 1 || n > kMaxRanks) {
      throw UsageError(fmt::format("--tp: expected a number of processes from 1 to {}, got '{}'", kMaxRanks, value));
    }
    args.erase(it, end);
    return static_cast<int>(n);
  }
  return 0;
}

std::string describe_status(int status) {
  if (WIFSIGNALED(status)) {
    const char* name = ::strsignal(WTERMSIG(status));
    return fmt::format("was killed by signal {} ({})", WTERMSIG(status), name ? name : "unknown");
  }
  return fmt::format("exited with code {}", WEXITSTATUS(status));
}

// Everything a rank's exec needs, built before fork: the child only calls async-signal-safe functions.
struct RankExec {
  std::vector<std::string> env_strings;
  std::vector<char*> envp, argv;
};

RankExec rank_exec(const std::vector<std::string>& argv, int rank, int world, int port) {
  RankExec exec;
  const std::vector<std::string> ours{"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"};
  // The machine's cores shared between the ranks (as torchrun does), unless the caller chose: more
  // threads than cores spin against each other in every parallel region.
  const long cores = std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN));
  bool threads_given = false;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    const auto name = entry.substr(0, entry.find('='));
    threads_given = threads_given || name == "OMP_NUM_THREADS";
    if (std::find(ours.begin(), ours.end(), name) == ours.end()) exec.env_strings.push_back(entry);
  }
  for (const auto& [name, value] : {std::pair{"RANK", rank}, std::pair{"LOCAL_RANK", rank},
                                    std::pair{"WORLD_SIZE", world}, std::pair{"LOCAL_WORLD_SIZE", world},
                                    std::pair{"MASTER_PORT", port}}) {
    exec.env_strings.push_back(fmt::format("{}={}", name, value));
  }
  exec.env_strings.push_back("MASTER_ADDR=127.0.0.1");
  // Rank 0's stderr reaches the terminal through the launcher: its progress may still draw a bar.
  if (rank == 0 && ::isatty(STDERR_FILENO) == 1) exec.env_strings.push_back("TORCHPATCH_STDERR_IS_TERMINAL=1");
  if (!threads_given) exec.env_strings.push_back(fmt::format("OMP_NUM_THREADS={}", std::max(1L, cores / world)));
  for (auto& e : exec.env_strings) exec.envp.push_back(e.data());
  exec.envp.push_back(nullptr);
  for (const auto& a : argv) exec.argv.push_back(const_cast<char*>(a.c_str()));
  exec.argv.push_back(nullptr);
  return exec;
}

pid_t start_rank(const std::string& self, RankExec& exec, int stderr_fd) {
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid != 0) return pid;
  // The child: the launcher's handlers are not its own, and it dies with the launcher.
  for (const int signal : {SIGINT, SIGTERM, SIGHUP}) ::signal(signal, SIG_DFL);
  ::prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (::getppid() != parent) ::_exit(1);
  if (stderr_fd >= 0) ::dup2(stderr_fd, STDERR_FILENO);
  ::execve(self.c_str(), exec.argv.data(), exec.envp.data());
  static const char message[] = "torchpatch: cannot start a rank\n";
  (void)!::write(2, message, sizeof message - 1);
  ::_exit(127);
}

// The ranks' standard error: rank 0's passed on as it comes; the others' kept and, once every rank
// has ended, printed with their rank, without the lines rank 0 printed too: an error every rank meets
// is said once, and what only another rank met (the cause, often) is still said.
class RankErrors {
 public:
  explicit RankErrors(int world)
      : read_(world, -1), write_(world, -1), partial_(world), lines_(world), dropped_(world, 0) {
    for (int rank = 0; rank < world; ++rank) {
      int fds[2];
      if (::pipe2(fds, O_CLOEXEC) != 0) continue;  // that rank then writes to the launcher's stderr
      read_[rank] = fds[0];
      write_[rank] = fds[1];
    }
  }
  ~RankErrors() {
    for (const int fd : read_) if (fd >= 0) ::close(fd);
    for (const int fd : write_) if (fd >= 0) ::close(fd);
  }
  RankErrors(const RankErrors&) = delete;
  RankErrors& operator=(const RankErrors&) = delete;

  /// The descriptor rank `rank` gets as its standard error (-1: the launcher's own).
  int for_rank(int rank) const { return write_[rank]; }
  /// After the rank's fork: only the child writes to the pipe now.
  void started(int rank) {
    if (write_[rank] >= 0) ::close(write_[rank]);
    write_[rank] = -1;
    if (read_[rank] >= 0) ::fcntl(read_[rank], F_SETFL, O_NONBLOCK);
  }
  /// Waits up to `ms` for output and takes in what there is.
  void take(int ms) {
    std::vector<pollfd> fds;
    for (const int fd : read_) if (fd >= 0) fds.push_back({fd, POLLIN, 0});
    if (fds.empty() || ::poll(fds.data(), fds.size(), ms) <= 0) {
      if (fds.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(ms));
      return;
    }
    for (std::size_t rank = 0; rank < read_.size(); ++rank) drain(rank);
  }
  /// Every rank has ended: the rest of their output, and the other ranks' lines.
  void finish() {
    for (std::size_t rank = 0; rank < read_.size(); ++rank) {
      // Bounded: a rank's own child may still hold the pipe and write.
      for (int i = 0; i < 64 && read_[rank] >= 0 && has_data(read_[rank]); ++i) drain(rank);
    }
    for (std::size_t rank = 1; rank < lines_.size(); ++rank) {
      if (!partial_[rank].empty()) lines_[rank].push_back(partial_[rank]);
      for (const auto& line : lines_[rank]) {
        if (seen_.insert(line).second) std::cerr << fmt::format("rank {}: {}\n", rank, line);
      }
      if (dropped_[rank] > 0) std::cerr << fmt::format("rank {}: ({} more lines not shown)\n", rank, dropped_[rank]);
    }
  }

 private:
  // What the rank has written, up to 64 KiB a call, so a rank that floods its stderr cannot keep the
  // launcher from watching the ranks.
  void drain(std::size_t rank) {
    if (read_[rank] < 0) return;
    char buffer[4096];
    ssize_t n = 0;
    for (int chunks = 0; chunks < 16 && (n = ::read(read_[rank], buffer, sizeof buffer)) > 0; ++chunks) {
      if (rank == 0) (void)!::write(STDERR_FILENO, buffer, static_cast<std::size_t>(n));
      auto& partial = partial_[rank];
      partial.append(buffer, static_cast<std::size_t>(n));
      for (std::size_t end; (end = partial.find('\n')) != std::string::npos; partial.erase(0, end + 1)) {
        const auto line = partial.substr(0, end);
        if (rank == 0) seen_.insert(line);
        else if (lines_[rank].size() < kKeptLines) lines_[rank].push_back(line);
        else ++dropped_[rank];
      }
      if (rank == 0 && partial.size() > 65536) partial.clear();  // a progress bar redrawn without newlines
    }
    if (n == 0) {  // the rank closed it (it ended)
      ::close(read_[rank]);
      read_[rank] = -1;
    }
  }

  static bool has_data(int fd) {
    pollfd p{fd, POLLIN, 0};
    return ::poll(&p, 1, 0) > 0;
  }

  static constexpr std::size_t kKeptLines = 200;  ///< of each other rank
  std::vector<int> read_, write_;
  std::vector<std::string> partial_;
  std::vector<std::vector<std::string>> lines_;
  std::vector<std::size_t> dropped_;
  std::set<std::string> seen_;
};

}  // namespace

OptionSpec tp_option() {
  return {"tp", "N",
          "run as N processes on this machine, attention heads, MLPs and experts split between them (tensor and "
          "expert parallelism over c10d/Gloo on loopback; rank 0 prints; under torchrun leave it out)"};
}

std::optional<int> launch_ranks(const std::string& command, std::vector<std::string>& args, bool debug,
                                const std::function<void(const std::vector<std::string>&)>& before_start) {
  for (const auto& arg : args) {
    if (arg == "--help" || arg == "-h") return std::nullopt;  // the command prints its help, --tp included
  }
  const int world = take_tp(args);
  if (world <= 1) return std::nullopt;
  if (std::getenv("RANK") != nullptr || std::getenv("WORLD_SIZE") != nullptr) {
    throw UsageError("--tp starts its own processes; under a launcher that sets RANK and WORLD_SIZE, leave it out");
  }
  if (before_start) before_start(args);
  int port = 0;
  if (const char* given = std::getenv("MASTER_PORT"); given != nullptr && *given != '\0') {
    port = std::atoi(given);
    if (port < 1 || port > 65535) throw UsageError(fmt::format("MASTER_PORT='{}' is not a TCP port", given));
  } else {
    port = free_loopback_port();
  }
  const auto self = std::filesystem::read_symlink("/proc/self/exe").string();
  std::vector<std::string> argv{"torchpatch", command};
  if (debug) argv.push_back("--debug");  // before the arguments: after a "--" it would be one of them
  argv.insert(argv.end(), args.begin(), args.end());

  std::cout.flush();
  for (const int signal : {SIGINT, SIGTERM, SIGHUP}) std::signal(signal, on_signal);
  std::vector<pid_t> ranks(world, 0);
  std::vector<RankExec> execs;
  for (int rank = 0; rank < world; ++rank) execs.push_back(rank_exec(argv, rank, world, port));
  RankErrors errors(world);
  for (int rank = 0; rank < world; ++rank) {
    ranks[rank] = start_rank(self, execs[rank], errors.for_rank(rank));
    errors.started(rank);
    if (ranks[rank] < 0) {
      ranks[rank] = 0;
      std::cerr << fmt::format("torchpatch {}: cannot start rank {}: {}\n", command, rank, std::strerror(errno));
      interrupted = SIGTERM;
      break;
    }
  }
  const auto stop_all = [&](int signal) {
    for (const pid_t pid : ranks) {
      if (pid > 0) ::kill(pid, signal);
    }
  };
  int code = 0, live = 0;
  for (const pid_t pid : ranks) live += pid > 0;
  std::optional<std::chrono::steady_clock::time_point> failed_at;
  bool terminated = false, forwarded = false;
  while (live > 0) {
    // Every rank that has ended since the last look; one killed by a signal is named first, since
    // the others' failures are usually the consequence.
    std::vector<std::pair<int, int>> ended;  // rank, status
    int status = 0;
    for (pid_t pid; (pid = ::waitpid(-1, &status, WNOHANG)) > 0;) {
      for (int rank = 0; rank < world; ++rank) {
        if (ranks[rank] != pid) continue;
        ranks[rank] = 0;
        --live;
        ended.emplace_back(rank, status);
      }
    }
    std::stable_sort(ended.begin(), ended.end(),
                     [](const auto& a, const auto& b) { return WIFSIGNALED(a.second) && !WIFSIGNALED(b.second); });
    for (const auto& [rank, how] : ended) {
      const bool ok = WIFEXITED(how) && WEXITSTATUS(how) == 0;
      if (ok || failed_at || interrupted) continue;
      std::cerr << fmt::format("torchpatch {}: rank {} of {} {}; stopping the other ranks\n", command, rank, world,
                               describe_status(how));
      code = WIFEXITED(how) ? WEXITSTATUS(how) : 1;
      failed_at = std::chrono::steady_clock::now();
    }
    if (interrupted && !forwarded) {
      stop_all(SIGTERM);
      forwarded = true;
      failed_at = std::chrono::steady_clock::now();
    }
    if (failed_at && std::chrono::steady_clock::now() - *failed_at > kGrace) {
      stop_all(terminated ? SIGKILL : SIGTERM);
      terminated = true;
      *failed_at += std::chrono::seconds(2);  // then SIGKILL what is left, 2 s later
    }
    if (live > 0) errors.take(20);
  }
  errors.finish();
  if (interrupted) return 128 + interrupted;
  return code;
}

}  // namespace torchpatch::cli
