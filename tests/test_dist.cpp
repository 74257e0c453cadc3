// Process groups over c10d (Gloo on loopback) with real processes: this test binary starts copies of
// itself as ranks (the hidden test "[.dist-rank]"), checks what each computed, and that a rank
// killed mid-run, a port in use, a peer that never comes and bad launcher variables are clear errors.
#include "test_prelude.h"

#include <cctype>
#include "cli_util.h"

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <iostream>

#include <fmt/format.h>

#include "torchpatch/dist/process_group.h"

using torchpatch::dist::DistError;
using torchpatch::dist::GroupOptions;
using torchpatch::dist::ProcessGroup;

namespace {

// This binary's ranks: the hidden test below, under run_group's variables.
std::vector<testutil::Result> run_ranks(int world, const std::string& env = "") {
  return testutil::run_group(world, std::filesystem::read_symlink("/proc/self/exe").string(), "'[.dist-rank]'", env);
}

// setenv for one scope.
struct ScopedEnv {
  std::vector<std::pair<std::string, std::optional<std::string>>> saved;
  void set(const std::string& name, const char* value) {
    const char* old = std::getenv(name.c_str());
    saved.emplace_back(name, old ? std::optional<std::string>(old) : std::nullopt);
    if (value) {
      ::setenv(name.c_str(), value, 1);
    } else {
      ::unsetenv(name.c_str());
    }
  }
  ~ScopedEnv() {
    for (auto it = saved.rbegin(); it != saved.rend(); ++it) {
      if (it->second) {
        ::setenv(it->first.c_str(), it->second->c_str(), 1);
      } else {
        ::unsetenv(it->first.c_str());
      }
    }
  }
};

}  // namespace

// One rank, started by run_ranks: joins from the launcher variables and checks each collective
// against what every rank contributed. TORCHPATCH_TEST_DIE_RANK=r: rank r exits once the group has
// formed (after a barrier every rank passes), before the first all-reduce.
TEST_CASE("dist rank", "[.dist-rank]") {
  auto options = torchpatch::dist::options_from_environment();
  REQUIRE(options);
  options->timeout = std::chrono::milliseconds(10000);
  const auto group = ProcessGroup::join(*options);
  const int rank = group->rank(), world = group->size();
  if (const char* die = std::getenv("TORCHPATCH_TEST_DIE_RANK")) {
    group->barrier();  // the group has formed on every rank: the rank dies mid-run, not while joining
    if (std::atoi(die) == rank) std::_Exit(3);
  }

  auto sum = at::full({5}, static_cast<float>(rank + 1));
  group->all_reduce_sum(sum);
  CHECK(at::equal(sum, at::full({5}, world * (world + 1) / 2.0f)));

  auto values = rank == 0 ? at::arange(6, at::kLong) : at::zeros({6}, at::kLong);
  group->broadcast(values, 0);
  CHECK(at::equal(values, at::arange(6, at::kLong)));

  const auto gathered = group->all_gather(at::full({2, 3}, rank, at::kInt));
  REQUIRE(gathered.size() == static_cast<std::size_t>(world));
  for (int r = 0; r < world; ++r) CHECK(at::equal(gathered[r], at::full({2, 3}, r, at::kInt)));
  group->barrier();
  std::cout << fmt::format("rank {} of {} ok", rank, world) << std::endl;
}

TEST_CASE("two and four ranks on loopback sum, broadcast and gather as one group", "[dist]") {
  for (const int world : {2, 4}) {
    const auto results = run_ranks(world);
    for (int rank = 0; rank < world; ++rank) {
      INFO(results[rank].out);
      CHECK(results[rank].code == 0);
      CHECK(results[rank].out.find(fmt::format("rank {} of {} ok", rank, world)) != std::string::npos);
    }
  }
}

TEST_CASE("a rank that dies makes the others fail with a message naming them, within the timeout", "[dist]") {
  const auto start = std::chrono::steady_clock::now();
  const auto results = run_ranks(2, "TORCHPATCH_TEST_DIE_RANK=1");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  INFO(results[0].out);
  CHECK(results[1].code == 3);
  CHECK(results[0].code != 0);
  // Catch wraps the exception's text in its report at 80 columns, where the port's digits put it:
  // compare with every run of whitespace as one space.
  std::string flat;
  for (const char c : results[0].out) {
    const bool space = std::isspace(static_cast<unsigned char>(c)) != 0;
    if (!space) flat += c;
    else if (!flat.empty() && flat.back() != ' ') flat += ' ';
  }
  CHECK(flat.find("rank 0 of 2: all-reduce failed") != std::string::npos);
  CHECK(flat.find("a peer process may have died") != std::string::npos);
  CHECK(seconds < 60);  // the collective's timeout is 10 s; a hang would run into ctest's limit
}

TEST_CASE("a port in use, a peer that never comes and bad options are clear errors", "[dist]") {
  const testutil::LoopbackPort busy(true);
  GroupOptions options;
  options.master_port = busy.number;
  options.timeout = std::chrono::milliseconds(2000);
  CHECK_THROWS_WITH(ProcessGroup::join(options),
                    fmt::format("rank 0 cannot serve the group's store on port {}: the port is in use (choose another "
                                "master port)",
                                busy.number));

  const testutil::LoopbackPort free_port(false);
  options.master_port = free_port.number;
  options.world_size = 2;
  options.timeout = std::chrono::milliseconds(1000);
  const auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH(ProcessGroup::join(options), Catch::Matchers::StartsWith("rank 0 of 2: the group did not form within 1 s"));
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(30));

  options.rank = 2;
  CHECK_THROWS_WITH(ProcessGroup::join(options), "rank 2 is outside a group of 2 (ranks 0 to 1)");
  options.rank = 0;
  options.master_port = 70000;
  CHECK_THROWS_WITH(ProcessGroup::join(options), "master port 70000 is not a TCP port (1 to 65535)");
}

TEST_CASE("launcher variables: torchrun's set, partners missing, values that are not numbers", "[dist]") {
  ScopedEnv env;
  env.set("RANK", nullptr);
  env.set("WORLD_SIZE", nullptr);
  env.set("MASTER_ADDR", nullptr);
  env.set("MASTER_PORT", nullptr);
  env.set("TORCHELASTIC_USE_AGENT_STORE", nullptr);
  env.set("TORCHELASTIC_RESTART_COUNT", nullptr);
  CHECK_FALSE(torchpatch::dist::options_from_environment());

  env.set("RANK", "1");
  CHECK_THROWS_WITH(torchpatch::dist::options_from_environment(), "RANK is set but WORLD_SIZE is not");
  env.set("WORLD_SIZE", "two");
  CHECK_THROWS_WITH(torchpatch::dist::options_from_environment(), "WORLD_SIZE='two' is not a non-negative whole number");
  env.set("WORLD_SIZE", "1");
  CHECK_THROWS_WITH(torchpatch::dist::options_from_environment(), "rank 1 is outside a group of 1 (ranks 0 to 0)");

  env.set("WORLD_SIZE", "4");
  env.set("MASTER_ADDR", "10.0.0.7");
  env.set("MASTER_PORT", "29511");
  env.set("TORCHELASTIC_USE_AGENT_STORE", "True");
  env.set("TORCHELASTIC_RESTART_COUNT", "2");
  const auto options = torchpatch::dist::options_from_environment();
  REQUIRE(options);
  CHECK(options->rank == 1);
  CHECK(options->world_size == 4);
  CHECK(options->master_addr == "10.0.0.7");
  CHECK(options->master_port == 29511);
  CHECK(options->agent_store);
  CHECK(options->store_prefix == "/worker/attempt_2");
}
