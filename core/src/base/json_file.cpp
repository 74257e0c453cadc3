#include "torchpatch/json_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

namespace torchpatch {

namespace {

[[noreturn]] void raise(const JsonFailure& fail, const std::string& message) {
  fail(message);
  throw std::logic_error("JsonFailure returned: " + message);  // a failure handler must throw
}

std::string kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode) || S_ISBLK(mode)) return "a device";
  return "not a regular file";
}

struct DepthExceeded {};

// nlohmann's DOM builder behind a depth count. The callback parser that `json::parse(text, callback)`
// runs re-examines the parent object whenever a member closes (quadratic: 40,000 header entries took
// 13 s); the SAX DOM builder is linear, and refusing a value as it opens keeps everything after it
// (copies, dump, destruction) shallow.
class DepthLimitedDom {
 public:
  using json = nlohmann::json;
  DepthLimitedDom(json& result, int max_depth) : dom_(result), max_depth_(max_depth) {}

  bool null() { return dom_.null(); }
  bool boolean(bool value) { return dom_.boolean(value); }
  bool number_integer(json::number_integer_t value) { return dom_.number_integer(value); }
  bool number_unsigned(json::number_unsigned_t value) { return dom_.number_unsigned(value); }
  bool number_float(json::number_float_t value, const json::string_t& text) { return dom_.number_float(value, text); }
  bool string(json::string_t& value) { return dom_.string(value); }
  bool binary(json::binary_t& value) { return dom_.binary(value); }
  bool key(json::string_t& value) { return dom_.key(value); }
  bool start_object(std::size_t size) { return enter() && dom_.start_object(size); }
  bool end_object() { return leave() && dom_.end_object(); }
  bool start_array(std::size_t size) { return enter() && dom_.start_array(size); }
  bool end_array() { return leave() && dom_.end_array(); }
  template <class Exception>
  bool parse_error(std::size_t position, const std::string& last_token, const Exception& error) {
    return dom_.parse_error(position, last_token, error);  // throws `error`
  }

 private:
  bool enter() {
    if (++depth_ > max_depth_) throw DepthExceeded{};
    return true;
  }
  bool leave() {
    --depth_;
    return true;
  }
  nlohmann::detail::json_sax_dom_parser<json> dom_;
  int max_depth_;
  int depth_ = 0;
};

}  // namespace

nlohmann::json parse_json(const std::string& text, const std::string& source, const JsonFailure& fail,
                          const JsonLimits& limits, const std::string& what) {
  const std::string subject = what.empty() ? std::string() : what + " ";
  if (text.size() > limits.max_bytes) {
    raise(fail, fmt::format("{}: {}{} bytes of JSON, more than the {} accepted", source, subject, text.size(),
                            limits.max_bytes));
  }
  try {
    nlohmann::json result;
    DepthLimitedDom handler(result, limits.max_depth);
    nlohmann::json::sax_parse(text, &handler);  // strict: bytes after the value are an error
    return result;
  } catch (const DepthExceeded&) {
    raise(fail, fmt::format("{}: {}JSON nested more than {} levels deep", source, subject, limits.max_depth));
  } catch (const nlohmann::json::exception& e) {
    raise(fail, fmt::format("{}: {}{}not valid JSON: {}", source, subject, what.empty() ? "" : "is ", e.what()));
  }
}

std::string read_regular_file(const std::filesystem::path& path, std::uint64_t max_bytes, const JsonFailure& fail,
                              const std::string& source) {
  const std::string name = source.empty() ? path.string() : source;
  // Non-blocking: opening a FIFO would otherwise wait for a writer.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) raise(fail, fmt::format("{}: cannot open: {}", name, std::strerror(errno)));
  struct stat st {};
  std::string refusal;
  if (::fstat(fd, &st) != 0) refusal = fmt::format("cannot stat: {}", std::strerror(errno));
  else if (!S_ISREG(st.st_mode)) refusal = kind_of(st.st_mode) + ", not a regular file";
  else if (static_cast<std::uint64_t>(st.st_size) > max_bytes) {
    refusal = fmt::format("{} bytes, more than the {} accepted", st.st_size, max_bytes);
  }
  std::string text;
  if (refusal.empty()) {
    text.resize(static_cast<std::size_t>(st.st_size));
    std::size_t done = 0;
    while (done < text.size()) {
      const ssize_t n = ::read(fd, text.data() + done, text.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        refusal = n < 0 ? fmt::format("cannot read: {}", std::strerror(errno)) : "file shrank while being read";
        break;
      }
      done += static_cast<std::size_t>(n);
    }
  }
  ::close(fd);
  if (!refusal.empty()) raise(fail, fmt::format("{}: {}", name, refusal));
  return text;
}

nlohmann::json read_json_file(const std::filesystem::path& path, const JsonFailure& fail, const JsonLimits& limits,
                              const std::string& source) {
  const std::string name = source.empty() ? path.string() : source;
  return parse_json(read_regular_file(path, limits.max_bytes, fail, name), name, fail, limits);
}

bool path_exists(const std::filesystem::path& path) {
  std::error_code ec;
  return std::filesystem::exists(std::filesystem::symlink_status(path, ec));
}

}  // namespace torchpatch
