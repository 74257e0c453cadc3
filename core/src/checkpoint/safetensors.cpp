// Safetensors reader (memory-mapped, fully validated) and atomic writer.
#include "torchpatch/checkpoint/safetensors.h"

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
#include <fmt/ranges.h>  // fmt::join
#include <nlohmann/json.hpp>

#include "base/tensor_shape.h"
#include "torchpatch/error.h"
#include "torchpatch/json_file.h"
#include "torchpatch/checkpoint/atomic_file.h"
#include "checkpoint/mapped_file.h"

namespace torchpatch::checkpoint {

namespace {

// The format stores integers and tensor bytes little-endian; tensors are handed out without byte
// swapping, so only little-endian hosts are supported.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors support needs a little-endian host");

constexpr const char* kMetadataKey = "__metadata__";
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

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

namespace {

CheckpointError file_error(const std::filesystem::path& path, const std::string& cause) {
  return CheckpointError(fmt::format("{}: {}", path.string(), cause));
}

// The length-prefixed JSON header; `data_start` receives where the data section begins.
nlohmann::json read_header(const std::filesystem::path& path, const uint8_t* data, uint64_t size, uint64_t& data_start) {
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | data[i];
  if (header_len > kMaxHeaderBytes) {
    throw file_error(path, fmt::format("header claims {} bytes, more than the {} a safetensors header may hold",
                                       header_len, kMaxHeaderBytes));
  }
  if (header_len > size - 8) {
    throw file_error(path, fmt::format("header claims {} bytes but only {} follow", header_len, size - 8));
  }
  data_start = 8 + header_len;
  // Bounded: at most 100 MB (the format's own limit) and shallow, so nothing after recurses deeply.
  JsonLimits limits;
  limits.max_bytes = kMaxHeaderBytes;
  limits.max_depth = 8;
  const std::string text(reinterpret_cast<const char*>(data + 8), header_len);
  const auto header = parse_json(text, path.string(), [](const std::string& m) { throw CheckpointError(m); }, limits,
                                 "header");
  if (!header.is_object()) throw file_error(path, fmt::format("header is not a JSON object but {}", header.type_name()));
  return header;
}

std::map<std::string, std::string> read_metadata(const std::filesystem::path& path, const nlohmann::json& value) {
  if (!value.is_object()) {
    throw file_error(path, fmt::format("{} is not a JSON object but {}", kMetadataKey, value.type_name()));
  }
  std::map<std::string, std::string> metadata;
  for (const auto& [key, text] : value.items()) {
    if (!text.is_string()) {
      throw file_error(path, fmt::format("{}: value of '{}' is not a string but {}", kMetadataKey, key, text.type_name()));
    }
    metadata.emplace(key, text.get<std::string>());
  }
  return metadata;
}

// One tensor's entry, checked: a known dtype, a shape of non-negative integers, offsets inside the
// data section of exactly the bytes the shape needs. Offsets in the result are from the file start.
TensorInfo read_entry(const std::filesystem::path& path, const std::string& name, const nlohmann::json& value,
                      uint64_t data_start, uint64_t data_size) {
  auto bad = [&](const std::string& cause) { return file_error(path, fmt::format("tensor '{}': {}", name, cause)); };
  if (!value.is_object()) throw bad(fmt::format("entry is not a JSON object but {}", value.type_name()));
  TensorInfo info;
  info.name = name;

  const auto dtype_it = value.find("dtype");
  if (dtype_it == value.end()) throw bad("missing 'dtype'");
  if (!dtype_it->is_string()) throw bad(fmt::format("'dtype' is not a string but {}", dtype_it->type_name()));
  const DtypeEntry* dtype = entry_named(dtype_it->get<std::string>());
  if (dtype == nullptr) throw bad(fmt::format("unknown dtype '{}'", dtype_it->get<std::string>()));
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
  if (end > data_size) throw bad(fmt::format("offsets [{}, {}) out of range: data section is {} bytes", begin, end, data_size));

  uint64_t needed = 0;
  overflow = overflow || __builtin_mul_overflow(numel, static_cast<uint64_t>(dtype->size), &needed);
  // A shape whose numel is zero needs zero bytes, even when another product overflowed.
  if (std::find(info.shape.begin(), info.shape.end(), 0) != info.shape.end()) {
    needed = 0;
    overflow = false;
  }
  if (overflow) {
    throw bad(fmt::format("holds {} bytes but shape {} of {} needs more than 2^64 bytes", end - begin,
                          shape_text(info.shape), dtype->name));
  }
  if (end - begin != needed) {
    throw bad(fmt::format("holds {} bytes but shape {} of {} needs {}", end - begin, shape_text(info.shape), dtype->name,
                          needed));
  }
  // Only an empty tensor gets here with such a shape: it needs no bytes, but LibTorch lays it out.
  if (!strides_fit_int64(info.shape)) {
    throw bad(fmt::format("shape {} spans more than 2^63 elements", shape_text(info.shape)));
  }
  info.begin = data_start + begin;
  info.end = data_start + end;
  return info;
}

// Sorts by position. Gaps are allowed; overlaps are not. Empty tensors occupy no bytes and overlap nothing.
void sort_and_check_overlaps(const std::filesystem::path& path, std::vector<TensorInfo>& tensors, uint64_t data_start) {
  std::sort(tensors.begin(), tensors.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
  });
  const TensorInfo* furthest = nullptr;  // the non-empty tensor reaching furthest so far
  for (const auto& info : tensors) {
    if (info.begin == info.end) continue;
    if (furthest != nullptr && furthest->end > info.begin) {
      throw file_error(path, fmt::format("tensor '{}': data [{}, {}) overlaps tensor '{}' at [{}, {})", info.name,
                                         info.begin - data_start, info.end - data_start, furthest->name,
                                         furthest->begin - data_start, furthest->end - data_start));
    }
    if (furthest == nullptr || info.end > furthest->end) furthest = &info;
  }
}

}  // namespace

std::shared_ptr<SafetensorsFile> SafetensorsFile::open(const std::filesystem::path& io,
                                                       const std::filesystem::path& display) {
  const auto& path = display.empty() ? io : display;
  // The constructor is private, so make_shared is not available.
  std::shared_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;
  // From here on the destructor unmaps, also when validation throws.
  std::tie(file->data_, file->size_) = map_file(io, path, 8, "safetensors file");
  uint64_t data_start = 0;
  const auto header = read_header(path, file->data_, file->size_, data_start);
  for (const auto& [name, value] : header.items()) {
    if (name == kMetadataKey) {
      file->metadata_ = read_metadata(path, value);
    } else {
      file->tensors_.push_back(read_entry(path, name, value, data_start, file->size_ - data_start));
    }
  }
  sort_and_check_overlaps(path, file->tensors_, data_start);
  for (size_t i = 0; i < file->tensors_.size(); ++i) file->index_.emplace(file->tensors_[i].name, i);
  return file;
}

SafetensorsFile::~SafetensorsFile() {
  unmap_file(data_, size_);
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
                      const std::map<std::string, std::string>& metadata,
                      const std::function<void(int64_t bytes)>& wrote) {
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
  for (const auto& item : tensors) {
    const std::string& name = item.first;  // not a structured binding: lambdas capture it (C++17)
    const at::Tensor& tensor = item.second;
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

  AtomicFile out(path);
  out.write(length, sizeof length);
  out.write(header_text);
  for (const auto& c : contiguous) {
    if (c.numel() > 0) out.write(c.data_ptr(), static_cast<size_t>(c.nbytes()));
    if (wrote) wrote(static_cast<int64_t>(c.nbytes()));
  }
  out.commit();
}

}  // namespace torchpatch::checkpoint
