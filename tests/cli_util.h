// Running the torchpatch CLI from tests: exit code and output, temporary files.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "test_util.h"

namespace testutil {

struct Result {
  int code = -1;
  std::string out;  // stdout and stderr together
};

// Runs `command` through the shell and reads its standard output (`2>&1` in it adds the errors).
inline Result shell(const std::string& command) {
  Result result;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return result;
  std::array<char, 4096> buffer{};
  std::size_t n = 0;
  while ((n = std::fread(buffer.data(), 1, buffer.size(), pipe)) > 0) result.out.append(buffer.data(), n);
  const int status = ::pclose(pipe);
  result.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

// Runs the CLI through the shell; `env` is an optional "NAME=value" prefix.
inline Result torchpatch_cli(const std::string& arguments, const std::string& env = "") {
  return shell(env + " " + std::string(TORCHPATCH_CLI) + " " + arguments + " 2>&1");
}

inline std::string llama_dir() { return (data_dir() / "llama_basic").string(); }

inline std::filesystem::path temp_file(const std::string& name) {
  return std::filesystem::temp_directory_path() / ("torchpatch-cli-" + std::to_string(::getpid()) + "-" + name);
}

// A fresh directory (from temp_file(name)) removed at scope exit.
struct ScratchDir {
  std::filesystem::path path;
  explicit ScratchDir(const std::string& name) : path(temp_file(name)) {
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~ScratchDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path, ignored);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
};

// A loopback TCP port: bound (and listening, to hold it) while `hold`, else free when returned.
struct LoopbackPort {
  int fd = -1;
  int number = 0;
  explicit LoopbackPort(bool hold) {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
      number = ntohs(addr.sin_port);
    }
    if (hold) {
      ::listen(fd, 1);
    } else {
      ::close(fd);
      fd = -1;
    }
  }
  ~LoopbackPort() {
    if (fd >= 0) ::close(fd);
  }
  LoopbackPort(const LoopbackPort&) = delete;
  LoopbackPort& operator=(const LoopbackPort&) = delete;
};

// Starts `world` copies of `program arguments` at once as the ranks of one group on loopback (RANK,
// WORLD_SIZE, MASTER_ADDR and MASTER_PORT set, `env` added) and collects each rank's exit code and
// output, in rank order.
inline std::vector<Result> run_group(int world, const std::string& program, const std::string& arguments,
                                     const std::string& env = "") {
  const LoopbackPort port(false);
  std::vector<FILE*> pipes;
  for (int rank = 0; rank < world; ++rank) {
    const auto command = "RANK=" + std::to_string(rank) + " WORLD_SIZE=" + std::to_string(world) +
                         " MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(port.number) + " " + env + " '" +
                         program + "' " + arguments + " 2>&1";
    pipes.push_back(::popen(command.c_str(), "r"));
  }
  std::vector<Result> results(world);
  for (int rank = 0; rank < world; ++rank) {
    if (pipes[rank] == nullptr) continue;
    std::array<char, 4096> buffer{};
    std::size_t n = 0;
    while ((n = std::fread(buffer.data(), 1, buffer.size(), pipes[rank])) > 0) results[rank].out.append(buffer.data(), n);
    const int status = ::pclose(pipes[rank]);
    results[rank].code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
  return results;
}

inline std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto pos = text.find(what); pos != std::string::npos; pos = text.find(what, pos + 1)) ++n;
  return n;
}

}  // namespace testutil
