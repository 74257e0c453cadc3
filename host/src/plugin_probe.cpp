#include "plugin_probe.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include <fmt/format.h>
#include <torch/version.h>

#include "torchpatch/checkpoint/atomic_file.h"
#include "torchpatch/json_file.h"
#include "torchpatch/printable.h"
#include "torchpatch/version.h"

namespace torchpatch::probe {

namespace fs = std::filesystem;

void mark(int fd, Phase phase) {
  if (fd < 0) return;
  const char c = static_cast<char>(phase);
  while (::write(fd, &c, 1) < 0 && errno == EINTR) {
  }
}

namespace {

const char* phase_name(char phase) {
  switch (static_cast<Phase>(phase)) {
    case Phase::kStaticInit: return "static initialisation";
    case Phase::kDescriptor: return "the descriptor call";
    case Phase::kRegistration: return "registration";
    case Phase::kDone: return "the end of loading";
  }
  return "the start of the probe";
}

[[noreturn]] void child_main(const std::function<void(int)>& load, int phase_fd, int err_fd) {
  const int null = ::open("/dev/null", O_RDWR);
  if (null >= 0) ::dup2(null, STDIN_FILENO), ::dup2(null, STDOUT_FILENO);
  ::dup2(err_fd, STDERR_FILENO);
  try {
    load(phase_fd);
  } catch (...) {  // refusals are the parent's to find out; only dying counts here
  }
  mark(phase_fd, Phase::kDone);
  ::_exit(0);
}

// The last line the child wrote to stderr, for the refusal ("terminate called after ...").
std::string last_line(const std::string& text) {
  std::size_t end = text.find_last_not_of("\n\r ");
  if (end == std::string::npos) return {};
  const std::size_t start = text.rfind('\n', end);
  std::string line = text.substr(start == std::string::npos ? 0 : start + 1, end + 1 - (start == std::string::npos ? 0 : start + 1));
  if (line.size() > 300) line = line.substr(0, 300) + "...";
  return printable(line);
}

std::string describe_status(int status, char phase) {
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    const char* abbrev = ::sigabbrev_np(sig);
    return fmt::format("crashed with signal {} (SIG{}, {}) during {} in its probe process", sig, abbrev ? abbrev : "?",
                       ::strsignal(sig), phase_name(phase));
  }
  return fmt::format("ended its probe process with exit status {} during {} (a plugin must not exit its host)",
                     WEXITSTATUS(status), phase_name(phase));
}

}  // namespace

Outcome run_in_child(const std::function<void(int fd)>& load, std::chrono::milliseconds timeout) {
  int phase_pipe[2], err_pipe[2];
  if (::pipe2(phase_pipe, O_CLOEXEC) != 0) return {false, fmt::format("cannot probe: pipe: {}", std::strerror(errno))};
  if (::pipe2(err_pipe, O_CLOEXEC) != 0) {
    ::close(phase_pipe[0]), ::close(phase_pipe[1]);
    return {false, fmt::format("cannot probe: pipe: {}", std::strerror(errno))};
  }
  std::fflush(nullptr);  // or the child's exit would write the parent's buffered output again
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(phase_pipe[0]), ::close(err_pipe[0]);
    child_main(load, phase_pipe[1], err_pipe[1]);
  }
  ::close(phase_pipe[1]), ::close(err_pipe[1]);
  if (pid < 0) {
    ::close(phase_pipe[0]), ::close(err_pipe[0]);
    return {false, fmt::format("cannot probe: fork: {}", std::strerror(errno))};
  }

  // Read phases and stderr until the child closes the phase pipe (it ended) or time runs out.
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  char phase = 0;
  std::string err;
  bool phase_open = true, err_open = true, timed_out = false;
  while (phase_open) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      timed_out = true;
      break;
    }
    pollfd fds[2] = {{phase_pipe[0], POLLIN, 0}, {err_pipe[0], static_cast<short>(err_open ? POLLIN : 0), 0}};
    if (::poll(fds, 2, static_cast<int>(left.count())) < 0 && errno != EINTR) break;
    char buffer[4096];
    if (fds[0].revents) {
      const ssize_t n = ::read(phase_pipe[0], buffer, sizeof buffer);
      if (n > 0) phase = buffer[n - 1];
      else if (n == 0 || errno != EINTR) phase_open = false;
    }
    if (err_open && fds[1].revents) {
      const ssize_t n = ::read(err_pipe[0], buffer, sizeof buffer);
      if (n > 0) err.append(buffer, static_cast<std::size_t>(n));
      else if (n == 0 || errno != EINTR) err_open = false;
      if (err.size() > 16384) err.erase(0, err.size() - 8192);  // only the end is reported
    }
  }
  if (timed_out) ::kill(pid, SIGKILL);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  ::close(phase_pipe[0]), ::close(err_pipe[0]);

  Outcome outcome;
  if (timed_out) {
    outcome.reason = fmt::format("did not finish loading within {} s in its probe process, during {} (killed)", timeout.count() / 1000.0,
                                 phase_name(phase));
  } else if (phase == static_cast<char>(Phase::kDone) && WIFEXITED(status) && WEXITSTATUS(status) == 0) {
    outcome.passed = true;
    return outcome;
  } else {
    outcome.reason = describe_status(status, phase);
  }
  if (const auto line = last_line(err); !line.empty()) outcome.reason += fmt::format("; it printed: {}", line);
  return outcome;
}

std::string Cache::key(const struct ::stat& st) {
  return fmt::format("{}:{}:{}:{}.{}:{}.{} torchpatch {}.{}.{} torch {}.{}.{}", st.st_dev, st.st_ino,
                     st.st_size, st.st_mtim.tv_sec, st.st_mtim.tv_nsec, st.st_ctim.tv_sec, st.st_ctim.tv_nsec,
                     TORCHPATCH_VERSION_MAJOR, TORCHPATCH_VERSION_MINOR, TORCHPATCH_VERSION_PATCH, TORCH_VERSION_MAJOR, TORCH_VERSION_MINOR, TORCH_VERSION_PATCH);
}

void Cache::read() {
  if (read_) return;
  read_ = true;
  std::error_code ec;
  if (file_.empty() || !fs::exists(file_, ec)) return;
  try {
    auto json = read_json_file(file_, [](const std::string& message) { throw std::runtime_error(message); },
                               JsonLimits{std::uint64_t{4} << 20, 8});
    if (json.is_object() && json.contains("probes") && json["probes"].is_object()) entries_ = json["probes"];
  } catch (const std::exception&) {  // damaged: start afresh
  }
}

std::optional<Outcome> Cache::find(const std::string& key) {
  read();
  const auto it = entries_.find(key);
  if (it == entries_.end() || !it->is_object()) return std::nullopt;
  const auto passed = it->find("passed");
  const auto reason = it->find("reason");
  if (passed == it->end() || !passed->is_boolean() || reason == it->end() || !reason->is_string()) return std::nullopt;
  return Outcome{passed->get<bool>(), reason->get<std::string>()};
}

void Cache::store(const std::string& key, const fs::path& plugin, const Outcome& outcome) {
  if (file_.empty()) return;
  read();
  if (entries_.size() >= 512) entries_ = nlohmann::json::object();  // plugins come and go: forget them all
  entries_[key] = {{"path", plugin.string()}, {"passed", outcome.passed}, {"reason", outcome.reason}};
  try {
    std::error_code ec;
    fs::create_directories(file_.parent_path(), ec);
    checkpoint::write_file_atomically(file_, nlohmann::json{{"probes", entries_}}.dump(1) + "\n");
  } catch (const std::exception&) {  // a read-only home: probe again next time
  }
}

}  // namespace torchpatch::probe
