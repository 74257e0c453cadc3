// Safetensors reader (memory-mapped, fully validated) and atomic writer.
#include "torchpatch/checkpoint/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <limits>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "torchpatch/error.h"

namespace torchpatch::checkpoint {

namespace {

// The format stores integers and tensor bytes little-endian; tensors are handed out without byte
// swapping, so only little-endian hosts are supported.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors support needs a little-endian host");

constexpr const char* kMetadataKey = "__metadata__";

struct DtypeEntry {
  Dtype dtype;
  const char* name;
  int64_t size;
  c10::ScalarType scalar;
};

constexpr DtypeEntry kDtypes[] = {
    {Dtype::F64, "F64", 8, c10::ScalarType::Double},
    {Dtype::F32, "F32", 4, c10::ScalarType::Float},
    {Dtype::F16, "F16", 2, c10::ScalarType::Half},
    {Dtype::BF16, "BF16", 2, c10::ScalarType::BFloat16},
    {Dtype::I64, "I64", 8, c10::ScalarType::Long},
    {Dtype::I32, "I32", 4, c10::ScalarType::Int},
    {Dtype::I16, "I16", 2, c10::ScalarType::Short},
    {Dtype::I8, "I8", 1, c10::ScalarType::Char},
    {Dtype::U8, "U8", 1, c10::ScalarType::Byte},
    {Dtype::BOOL, "BOOL", 1, c10::ScalarType::Bool},
};

const DtypeEntry& entry_of(Dtype dtype) {
  for (const auto& e : kDtypes) {
    if (e.dtype == dtype) return e;
  }
  throw CheckpointError(fmt::format("invalid safetensors dtype value {}", static_cast<int>(dtype)));
}

const DtypeEntry* entry_named(const std::string& name) {
  for (const auto& e : kDtypes) {
    if (name == e.name) return &e;
  }
  return nullptr;
}

std::string shape_text(const std::vector<int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

std::string errno_text(int err) { return std::strerror(err); }

// Reads the unsigned integer `value` (a JSON number) or returns false.
bool as_u64(const nlohmann::json& value, uint64_t& out) {
  if (value.is_number_unsigned()) {
    out = value.get<uint64_t>();
    return true;
  }
  if (value.is_number_integer() && value.get<int64_t>() >= 0) {
    out = static_cast<uint64_t>(value.get<int64_t>());
    return true;
  }
  return false;
}

// Writes all of `data`, retrying short writes and EINTR. Returns 0 or an errno value.
int write_all(int fd, const void* data, size_t size) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (size > 0) {
    const size_t chunk = std::min<size_t>(size, size_t{1} << 30);
    const ssize_t n = ::write(fd, p, chunk);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    p += n;
    size -= static_cast<size_t>(n);
  }
  return 0;
}

}  // namespace

const char* dtype_name(Dtype dtype) { return entry_of(dtype).name; }

int64_t dtype_size(Dtype dtype) { return entry_of(dtype).size; }

c10::ScalarType to_scalar_type(Dtype dtype) { return entry_of(dtype).scalar; }

Dtype from_scalar_type(c10::ScalarType type) {
  for (const auto& e : kDtypes) {
    if (e.scalar == type) return e.dtype;
  }
  throw CheckpointError(fmt::format("scalar type {} has no safetensors dtype", c10::toString(type)));
}

// ---------------------------------------------------------------------------------------------
// Reading
// ---------------------------------------------------------------------------------------------

std::shared_ptr<SafetensorsFile> SafetensorsFile::open(const std::filesystem::path& path) {
  // The constructor is private, so make_shared is not available.
  std::shared_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;
  const std::string where = path.string();
  auto fail = [&](const std::string& cause) { return CheckpointError(fmt::format("{}: {}", where, cause)); };

  const int fd = ::open(where.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw fail(fmt::format("cannot open: {}", errno_text(errno)));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    throw fail(fmt::format("cannot stat: {}", errno_text(err)));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw fail("not a regular file");
  }
  const auto file_size = static_cast<uint64_t>(st.st_size);
  if (file_size < 8) {  // also rules out mapping an empty file
    ::close(fd);
    throw fail(fmt::format("truncated: {} bytes, a safetensors file needs at least 8", file_size));
  }
  // Private and writable: pages are shared with the page cache until written, and a write (say, a
  // training step on a parameter loaded as a view) copies the page instead of touching the file.
  void* map = ::mmap(nullptr, file_size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
  const int map_err = errno;
  ::close(fd);  // the mapping stays valid without the descriptor
  if (map == MAP_FAILED) throw fail(fmt::format("cannot map: {}", errno_text(map_err)));
  // From here on the destructor unmaps, also when validation throws.
  file->data_ = static_cast<const uint8_t*>(map);
  file->size_ = file_size;

  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | file->data_[i];
  if (header_len > file_size - 8) {
    throw fail(fmt::format("header claims {} bytes but only {} follow", header_len, file_size - 8));
  }
  const uint64_t data_start = 8 + header_len;
  const uint64_t data_size = file_size - data_start;

  nlohmann::json header;
  try {
    const auto* begin = reinterpret_cast<const char*>(file->data_ + 8);
    header = nlohmann::json::parse(begin, begin + header_len);
  } catch (const nlohmann::json::exception& e) {
    throw fail(fmt::format("header is not valid JSON: {}", e.what()));
  }
  if (!header.is_object()) {
    throw fail(fmt::format("header is not a JSON object but {}", header.type_name()));
  }

  for (const auto& [name, value] : header.items()) {
    if (name == kMetadataKey) {
      if (!value.is_object()) {
        throw fail(fmt::format("{} is not a JSON object but {}", kMetadataKey, value.type_name()));
      }
      for (const auto& [key, text] : value.items()) {
        if (!text.is_string()) {
          throw fail(fmt::format("{}: value of '{}' is not a string but {}", kMetadataKey, key, text.type_name()));
        }
        file->metadata_.emplace(key, text.get<std::string>());
      }
      continue;
    }

    auto bad = [&](const std::string& cause) { return fail(fmt::format("tensor '{}': {}", name, cause)); };
    if (!value.is_object()) throw bad(fmt::format("entry is not a JSON object but {}", value.type_name()));

    TensorInfo info;
    info.name = name;

    const auto dtype_it = value.find("dtype");
    if (dtype_it == value.end()) throw bad("missing 'dtype'");
    if (!dtype_it->is_string()) throw bad(fmt::format("'dtype' is not a string but {}", dtype_it->type_name()));
    const auto dtype_text = dtype_it->get<std::string>();
    const DtypeEntry* dtype = entry_named(dtype_text);
    if (dtype == nullptr) throw bad(fmt::format("unknown dtype '{}'", dtype_text));
    info.dtype = dtype->dtype;

    const auto shape_it = value.find("shape");
    if (shape_it == value.end()) throw bad("missing 'shape'");
    if (!shape_it->is_array()) throw bad(fmt::format("'shape' is not an array but {}", shape_it->type_name()));
    uint64_t numel = 1;
    bool overflow = false;
    for (const auto& dim : *shape_it) {
      uint64_t d = 0;
      if (!as_u64(dim, d)) throw bad(fmt::format("'shape' {} holds something other than a non-negative integer", shape_it->dump()));
      if (d > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        throw bad(fmt::format("'shape' {} has a dimension too large", shape_it->dump()));
      }
      info.shape.push_back(static_cast<int64_t>(d));
      overflow = overflow || __builtin_mul_overflow(numel, d, &numel);
    }

    const auto offsets_it = value.find("data_offsets");
    if (offsets_it == value.end()) throw bad("missing 'data_offsets'");
    uint64_t begin = 0;
    uint64_t end = 0;
    if (!offsets_it->is_array() || offsets_it->size() != 2 || !as_u64((*offsets_it)[0], begin) ||
        !as_u64((*offsets_it)[1], end)) {
      throw bad(fmt::format("'data_offsets' {} is not an array of two non-negative integers", offsets_it->dump()));
    }
    if (begin > end) throw bad(fmt::format("'data_offsets' [{}, {}) begin after end", begin, end));
    if (end > data_size) {
      throw bad(fmt::format("offsets [{}, {}) out of range: data section is {} bytes", begin, end, data_size));
    }

    uint64_t needed = 0;
    overflow = overflow || __builtin_mul_overflow(numel, static_cast<uint64_t>(dtype->size), &needed);
    // A shape whose numel is zero needs zero bytes, even when another product overflowed.
    const bool has_zero = std::find(info.shape.begin(), info.shape.end(), 0) != info.shape.end();
    if (has_zero) {
      needed = 0;
      overflow = false;
    }
    if (overflow) {
      throw bad(fmt::format("holds {} bytes but shape {} of {} needs more than 2^64 bytes", end - begin,
                            shape_text(info.shape), dtype->name));
    }
    if (end - begin != needed) {
      throw bad(fmt::format("holds {} bytes but shape {} of {} needs {}", end - begin, shape_text(info.shape),
                            dtype->name, needed));
    }

    info.begin = data_start + begin;
    info.end = data_start + end;
    file->tensors_.push_back(std::move(info));
  }

  std::sort(file->tensors_.begin(), file->tensors_.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
  });
  // Gaps are allowed; overlaps are not. Empty tensors occupy no bytes and overlap nothing.
  const TensorInfo* furthest = nullptr;  // the non-empty tensor reaching furthest so far
  for (const auto& info : file->tensors_) {
    if (info.begin == info.end) continue;
    if (furthest != nullptr && furthest->end > info.begin) {
      throw fail(fmt::format("tensor '{}': data [{}, {}) overlaps tensor '{}' at [{}, {})", info.name,
                             info.begin - data_start, info.end - data_start, furthest->name,
                             furthest->begin - data_start, furthest->end - data_start));
    }
    if (furthest == nullptr || info.end > furthest->end) furthest = &info;
  }
  for (size_t i = 0; i < file->tensors_.size(); ++i) file->index_.emplace(file->tensors_[i].name, i);
  return file;
}

SafetensorsFile::~SafetensorsFile() {
  if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
}

const TensorInfo* SafetensorsFile::find(const std::string& name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

at::Tensor SafetensorsFile::tensor(const std::string& name) const {
  const TensorInfo* info = find(name);
  if (info == nullptr) throw CheckpointError(fmt::format("{}: no tensor named '{}'", path_.string(), name));
  const auto options = at::TensorOptions().dtype(to_scalar_type(info->dtype)).device(at::kCPU);
  const uint64_t nbytes = info->end - info->begin;
  if (nbytes == 0) return at::empty(info->shape, options);

  const uint8_t* src = data_ + info->begin;
  if (reinterpret_cast<uintptr_t>(src) % static_cast<uintptr_t>(dtype_size(info->dtype)) == 0) {
    // Zero-copy view of the mapping. The mapping is MAP_PRIVATE (copy on write), so writing into the
    // tensor never modifies the file, only this process's copy of the page. The deleter keeps the
    // file mapped for as long as the tensor's storage lives.
    auto keep = shared_from_this();
    return at::from_blob(const_cast<uint8_t*>(src), info->shape, [keep](void*) {}, options);
  }
  at::Tensor copy = at::empty(info->shape, options);
  std::memcpy(copy.data_ptr(), src, nbytes);
  return copy;
}

// ---------------------------------------------------------------------------------------------
// Writing
// ---------------------------------------------------------------------------------------------

void save_safetensors(const std::filesystem::path& path,
                      const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  const std::string where = path.string();
  auto fail = [&](const std::string& cause) { return CheckpointError(fmt::format("{}: {}", where, cause)); };

  // Validate everything before touching the file system.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    auto& meta = header[kMetadataKey];
    meta = nlohmann::ordered_json::object();
    for (const auto& [key, value] : metadata) meta[key] = value;
  }
  std::vector<at::Tensor> contiguous;
  contiguous.reserve(tensors.size());
  std::set<std::string> seen;
  uint64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    auto bad = [&](const std::string& cause) { return fail(fmt::format("tensor '{}': {}", name, cause)); };
    if (name == kMetadataKey) throw bad("the name is reserved for metadata");
    if (!seen.insert(name).second) throw bad("duplicate tensor name");
    if (!tensor.defined()) throw bad("undefined tensor");
    if (!tensor.device().is_cpu()) throw bad(fmt::format("tensor is on {}, not on CPU", tensor.device().str()));
    Dtype dtype{};
    try {
      dtype = from_scalar_type(tensor.scalar_type());
    } catch (const CheckpointError&) {
      throw bad(fmt::format("dtype {} is not supported by safetensors", c10::toString(tensor.scalar_type())));
    }
    at::Tensor c = tensor.contiguous();
    const auto nbytes = static_cast<uint64_t>(c.numel()) * static_cast<uint64_t>(dtype_size(dtype));
    header[name] = {{"dtype", dtype_name(dtype)},
                    {"shape", c.sizes().vec()},
                    {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
    contiguous.push_back(std::move(c));
  }
  std::string header_text = header.dump();
  header_text.append((8 - header_text.size() % 8) % 8, ' ');
  uint8_t length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<uint8_t>(static_cast<uint64_t>(header_text.size()) >> (8 * i));

  const std::string tmp = fmt::format("{}.tmp.{}", where, ::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  if (fd < 0) throw fail(fmt::format("cannot create '{}': {}", tmp, errno_text(errno)));
  auto abandon = [&](int fd_to_close, const char* what, int err) {
    if (fd_to_close >= 0) ::close(fd_to_close);
    ::unlink(tmp.c_str());
    return fail(fmt::format("cannot {} '{}': {}", what, tmp, errno_text(err)));
  };

  int err = write_all(fd, length, sizeof length);
  if (err == 0) err = write_all(fd, header_text.data(), header_text.size());
  for (size_t i = 0; err == 0 && i < contiguous.size(); ++i) {
    const at::Tensor& c = contiguous[i];
    if (c.numel() == 0) continue;
    err = write_all(fd, c.data_ptr(), static_cast<size_t>(c.nbytes()));
  }
  if (err != 0) throw abandon(fd, "write", err);
  if (::fsync(fd) != 0) throw abandon(fd, "flush", errno);
  if (::close(fd) != 0) throw abandon(-1, "close", errno);
  if (::rename(tmp.c_str(), where.c_str()) != 0) {
    const int rename_err = errno;
    ::unlink(tmp.c_str());
    throw fail(fmt::format("cannot rename '{}' over it: {}", tmp, errno_text(rename_err)));
  }
  // Make the rename itself durable; failing to sync the directory is not worth an error.
  std::filesystem::path dir = path.parent_path();
  if (dir.empty()) dir = ".";
  const int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd >= 0) {
    ::fsync(dir_fd);
    ::close(dir_fd);
  }
}

}  // namespace torchpatch::checkpoint
