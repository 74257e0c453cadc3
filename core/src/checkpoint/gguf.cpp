// GGUF reader (memory-mapped, every length and offset checked against the file) and writer.
#include "torchpatch/checkpoint/gguf.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <set>
#include <utility>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "checkpoint/mapped_file.h"
#include "torchpatch/checkpoint/atomic_file.h"
#include "torchpatch/error.h"
#include "torchpatch/printable.h"

namespace torchpatch::checkpoint {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "GGUF support needs a little-endian host");

namespace {

constexpr char kMagic[4] = {'G', 'G', 'U', 'F'};
constexpr int kMaxDims = 4;           // GGML_MAX_DIMS
constexpr int kMaxArrayDepth = 4;     // arrays of arrays: the writers nest at most one level
constexpr uint64_t kDefaultAlignment = 32;

struct ValueTypeEntry {
  GgufType type;
  const char* name;
  uint64_t size;  // bytes of a scalar; 0 for STRING and ARRAY
};

constexpr ValueTypeEntry kValueTypes[] = {
    {GgufType::UINT8, "UINT8", 1},     {GgufType::INT8, "INT8", 1},       {GgufType::UINT16, "UINT16", 2},
    {GgufType::INT16, "INT16", 2},     {GgufType::UINT32, "UINT32", 4},   {GgufType::INT32, "INT32", 4},
    {GgufType::FLOAT32, "FLOAT32", 4}, {GgufType::BOOL, "BOOL", 1},       {GgufType::STRING, "STRING", 0},
    {GgufType::ARRAY, "ARRAY", 0},     {GgufType::UINT64, "UINT64", 8},   {GgufType::INT64, "INT64", 8},
    {GgufType::FLOAT64, "FLOAT64", 8},
};

const ValueTypeEntry* value_type(uint32_t id) {
  for (const auto& e : kValueTypes) {
    if (static_cast<uint32_t>(e.type) == id) return &e;
  }
  return nullptr;
}

// Reads the header in order; every read is checked against the bytes left, and every failure
// names the file and what was being read.
class HeaderReader {
 public:
  HeaderReader(const std::filesystem::path& path, const uint8_t* data, uint64_t size) : path_(path), data_(data), size_(size) {}

  CheckpointError error(const std::string& where, const std::string& cause) const {
    return CheckpointError(fmt::format("{}: {}: {} (at byte {})", path_.string(), where, cause, pos_));
  }
  uint64_t position() const { return pos_; }
  uint64_t left() const { return size_ - pos_; }

  void need(uint64_t bytes, const std::string& where, const char* what) const {
    if (bytes > left()) {
      throw error(where, fmt::format("{} needs {} bytes but the file has {} left: the file is truncated or the "
                                     "field lies", what, bytes, left()));
    }
  }
  template <class T>
  T scalar(const std::string& where, const char* what) {
    need(sizeof(T), where, what);
    T value;
    std::memcpy(&value, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return value;
  }
  std::string string(const std::string& where) {
    const auto length = scalar<uint64_t>(where, "a string's length");
    need(length, where, fmt::format("a string of {} bytes", length).c_str());
    std::string text(reinterpret_cast<const char*>(data_ + pos_), length);
    pos_ += length;
    return text;
  }
  // A count of items each at least `min_item_bytes` long: a count the rest of the file cannot hold
  // is refused before anything is allocated for it.
  uint64_t count(const std::string& where, const char* what, uint64_t min_item_bytes) {
    const auto n = scalar<uint64_t>(where, what);
    if (min_item_bytes > 0 && n > left() / min_item_bytes) {
      throw error(where, fmt::format("{} is {}, but the {} bytes left hold at most {}", what, n, left(),
                                     left() / min_item_bytes));
    }
    return n;
  }

  GgufValue value(uint32_t type_id, const std::string& where, int depth) {
    const auto* type = value_type(type_id);
    if (type == nullptr) throw error(where, fmt::format("unknown value type {} (GGUF's are 0 to 12)", type_id));
    GgufValue v;
    v.type = type->type;
    switch (type->type) {
      case GgufType::UINT8: v.integer = scalar<uint8_t>(where, "a UINT8"); break;
      case GgufType::INT8: v.integer = static_cast<uint64_t>(int64_t{scalar<int8_t>(where, "an INT8")}); break;
      case GgufType::UINT16: v.integer = scalar<uint16_t>(where, "a UINT16"); break;
      case GgufType::INT16: v.integer = static_cast<uint64_t>(int64_t{scalar<int16_t>(where, "an INT16")}); break;
      case GgufType::UINT32: v.integer = scalar<uint32_t>(where, "a UINT32"); break;
      case GgufType::INT32: v.integer = static_cast<uint64_t>(int64_t{scalar<int32_t>(where, "an INT32")}); break;
      case GgufType::UINT64: v.integer = scalar<uint64_t>(where, "a UINT64"); break;
      case GgufType::INT64: v.integer = static_cast<uint64_t>(scalar<int64_t>(where, "an INT64")); break;
      case GgufType::FLOAT32: v.real = scalar<float>(where, "a FLOAT32"); break;
      case GgufType::FLOAT64: v.real = scalar<double>(where, "a FLOAT64"); break;
      case GgufType::BOOL: {
        const auto b = scalar<uint8_t>(where, "a BOOL");
        if (b > 1) throw error(where, fmt::format("a BOOL holds {}, not 0 or 1", b));
        v.boolean = b == 1;
        break;
      }
      case GgufType::STRING: v.text = string(where); break;
      case GgufType::ARRAY: read_array(v, where, depth); break;
    }
    return v;
  }

 private:
  void read_array(GgufValue& v, const std::string& where, int depth) {
    if (depth >= kMaxArrayDepth) throw error(where, fmt::format("arrays nested more than {} deep", kMaxArrayDepth));
    const auto element = scalar<uint32_t>(where, "an array's element type");
    const auto* type = value_type(element);
    if (type == nullptr) throw error(where, fmt::format("array of unknown value type {} (GGUF's are 0 to 12)", element));
    v.element_type = type->type;
    // A string is at least its 8-byte length, an array its 4-byte type and 8-byte count.
    const uint64_t min_bytes = type->size > 0 ? type->size : type->type == GgufType::STRING ? 8 : 12;
    const auto n = count(where, "the array's length", min_bytes);
    v.array.reserve(n);
    for (uint64_t i = 0; i < n; ++i) v.array.push_back(value(element, where, depth + 1));
  }

  const std::filesystem::path& path_;
  const uint8_t* data_;
  uint64_t size_;
  uint64_t pos_ = 0;
};

std::string dims_text(const std::vector<int64_t>& dims) {
  std::string text = "[";
  for (size_t i = 0; i < dims.size(); ++i) text += (i ? ", " : "") + std::to_string(dims[i]);
  return text + "]";
}

}  // namespace

const char* gguf_type_name(GgufType type) {
  const auto* e = value_type(static_cast<uint32_t>(type));
  return e ? e->name : "?";
}

bool GgufValue::is_integer() const {
  switch (type) {
    case GgufType::UINT8: case GgufType::INT8: case GgufType::UINT16: case GgufType::INT16:
    case GgufType::UINT32: case GgufType::INT32: case GgufType::UINT64: case GgufType::INT64: return true;
    default: return false;
  }
}

std::optional<int64_t> GgufValue::as_int() const {
  if (!is_integer()) return std::nullopt;
  if (!is_signed() && integer > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
  return static_cast<int64_t>(integer);
}

std::optional<double> GgufValue::as_number() const {
  if (type == GgufType::FLOAT32 || type == GgufType::FLOAT64) return real;
  if (!is_integer()) return std::nullopt;
  return is_signed() ? static_cast<double>(static_cast<int64_t>(integer)) : static_cast<double>(integer);
}

GgufValue GgufValue::of(uint32_t v) { GgufValue g; g.type = GgufType::UINT32; g.integer = v; return g; }
GgufValue GgufValue::of(int32_t v) { GgufValue g; g.type = GgufType::INT32; g.integer = static_cast<uint64_t>(int64_t{v}); return g; }
GgufValue GgufValue::of(uint64_t v) { GgufValue g; g.type = GgufType::UINT64; g.integer = v; return g; }
GgufValue GgufValue::of(float v) { GgufValue g; g.type = GgufType::FLOAT32; g.real = v; return g; }
GgufValue GgufValue::of(bool v) { GgufValue g; g.type = GgufType::BOOL; g.boolean = v; return g; }
GgufValue GgufValue::of(std::string v) { GgufValue g; g.type = GgufType::STRING; g.text = std::move(v); return g; }

GgufValue GgufValue::strings(std::vector<std::string> v) {
  GgufValue g;
  g.type = GgufType::ARRAY;
  g.element_type = GgufType::STRING;
  g.array.reserve(v.size());
  for (auto& s : v) g.array.push_back(of(std::move(s)));
  return g;
}

GgufValue GgufValue::int32s(const std::vector<int32_t>& v) {
  GgufValue g;
  g.type = GgufType::ARRAY;
  g.element_type = GgufType::INT32;
  for (const auto x : v) g.array.push_back(of(x));
  return g;
}

GgufValue GgufValue::float32s(const std::vector<float>& v) {
  GgufValue g;
  g.type = GgufType::ARRAY;
  g.element_type = GgufType::FLOAT32;
  for (const auto x : v) g.array.push_back(of(x));
  return g;
}

std::vector<int64_t> GgufTensorInfo::shape() const { return {dims.rbegin(), dims.rend()}; }

int64_t GgufTensorInfo::numel() const {
  int64_t n = 1;
  for (const auto d : dims) n *= d;
  return n;
}

// ---------------------------------------------------------------------------------------------
// Reading
// ---------------------------------------------------------------------------------------------

namespace {

// One tensor's entry: at most 4 dimensions, whole blocks along the first, a size that fits in 63 bits.
GgufTensorInfo read_tensor_info(HeaderReader& in, uint64_t index) {
  GgufTensorInfo info;
  const auto where = fmt::format("tensor {}", index);
  info.name = in.string(where);
  const auto named = fmt::format("tensor '{}'", printable(info.name));
  const auto n_dims = in.scalar<uint32_t>(named, "the dimension count");
  if (n_dims == 0 || n_dims > kMaxDims) {
    throw in.error(named, fmt::format("{} dimensions (GGUF allows 1 to {})", n_dims, kMaxDims));
  }
  uint64_t numel = 1;
  for (uint32_t i = 0; i < n_dims; ++i) {
    const auto d = in.scalar<uint64_t>(named, "a dimension");
    if (d > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) || __builtin_mul_overflow(numel, d, &numel) ||
        numel > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      throw in.error(named, "its dimensions multiply past 2^63 elements");
    }
    info.dims.push_back(static_cast<int64_t>(d));
  }
  const auto type_id = in.scalar<uint32_t>(named, "the type");
  const auto* type = ggml_type_info(type_id);
  if (type == nullptr) {
    throw in.error(named, fmt::format("GGML type {} is not one torchpatch reads (it reads F32, F16, BF16, F64, I8-I64, "
                                      "Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1 and Q2_K-Q8_K): requantize the file with "
                                      "llama-quantize to one of them", type_id));
  }
  info.type = type->type;
  if (info.dims[0] % type->block_size != 0) {
    throw in.error(named, fmt::format("its first dimension {} is not a multiple of {}'s block of {} weights",
                                      info.dims[0], type->name, type->block_size));
  }
  // A row's bytes must fit in 64 bits too (raw() views rows), whatever the other dimensions: a zero
  // among them leaves the first unbounded by the element count.
  int64_t row_bytes = 0;
  if (__builtin_mul_overflow(info.dims[0] / type->block_size, static_cast<int64_t>(type->type_size), &row_bytes)) {
    throw in.error(named, fmt::format("a row of its first dimension {} runs past 2^63 bytes", info.dims[0]));
  }
  info.begin = in.scalar<uint64_t>(named, "the offset");
  // numel / block_size blocks of type_size bytes each: under 2^63 * 292 / 256, which fits in 64 bits.
  const uint64_t bytes = numel / static_cast<uint64_t>(type->block_size) * static_cast<uint64_t>(type->type_size);
  info.end = bytes;  // the size, until the data section's start is known
  return info;
}

// Places each tensor in the file (offsets are from the data section) and refuses misaligned,
// out-of-range and overlapping data.
void place_tensors(const std::filesystem::path& path, std::vector<GgufTensorInfo>& tensors, uint64_t data_start,
                   uint64_t file_size, uint64_t alignment) {
  const uint64_t data_size = file_size - data_start;
  for (auto& info : tensors) {
    const uint64_t offset = info.begin, bytes = info.end;
    const auto bad = [&](const std::string& cause) {
      return CheckpointError(fmt::format("{}: tensor '{}' ({} {}): {}", path.string(), printable(info.name),
                                         ggml_type_info(info.type).name, dims_text(info.dims), cause));
    };
    if (offset % alignment != 0) throw bad(fmt::format("offset {} is not a multiple of the alignment {}", offset, alignment));
    if (offset > data_size || bytes > data_size - offset) {
      throw bad(fmt::format("its {} bytes at offset {} run past the end of the data section ({} bytes): the file "
                            "is truncated or the entry lies", bytes, offset, data_size));
    }
    info.begin = data_start + offset;
    info.end = info.begin + bytes;
  }
  std::vector<const GgufTensorInfo*> order;
  for (const auto& info : tensors) order.push_back(&info);
  std::sort(order.begin(), order.end(), [](const auto* a, const auto* b) { return a->begin < b->begin; });
  const GgufTensorInfo* furthest = nullptr;
  for (const auto* info : order) {
    if (info->begin == info->end) continue;
    if (furthest != nullptr && furthest->end > info->begin) {
      throw CheckpointError(fmt::format("{}: tensor '{}': data [{}, {}) overlaps tensor '{}' at [{}, {})", path.string(),
                                        printable(info->name), info->begin - data_start, info->end - data_start,
                                        printable(furthest->name), furthest->begin - data_start,
                                        furthest->end - data_start));
    }
    if (furthest == nullptr || info->end > furthest->end) furthest = info;
  }
}

}  // namespace

std::shared_ptr<GgufFile> GgufFile::open(const std::filesystem::path& io, const std::filesystem::path& display) {
  const auto& path = display.empty() ? io : display;
  std::shared_ptr<GgufFile> file(new GgufFile());
  file->path_ = path;
  std::tie(file->data_, file->size_) = map_file(io, path, 24, "GGUF file (magic, version and two counts)");
  HeaderReader in(path, file->data_, file->size_);
  if (std::memcmp(file->data_, kMagic, 4) != 0) {
    throw CheckpointError(fmt::format("{}: not a GGUF file: it starts with {:02x} {:02x} {:02x} {:02x}, not \"GGUF\"",
                                      path.string(), file->data_[0], file->data_[1], file->data_[2], file->data_[3]));
  }
  in.scalar<uint32_t>("magic", "the magic");
  file->version_ = in.scalar<uint32_t>("version", "the version");
  if (file->version_ != 2 && file->version_ != 3) {
    throw in.error("version", fmt::format("GGUF version {} (torchpatch reads 2 and 3; version 1 files predate "
                                          "2023-08: convert them again with llama.cpp)", file->version_));
  }
  // A tensor entry is at least 8 + 4 + 8 + 4 + 8 bytes; a metadata entry 8 + 4 + 1.
  const auto n_tensors = in.count("header", "the tensor count", 32);
  const auto n_values = in.count("header", "the metadata count", 13);

  for (uint64_t i = 0; i < n_values; ++i) {
    auto key = in.string(fmt::format("metadata entry {}", i));
    const auto where = fmt::format("metadata '{}'", printable(key));
    const auto type = in.scalar<uint32_t>(where, "the value type");
    auto value = in.value(type, where, 0);
    if (!file->metadata_index_.emplace(key, file->metadata_.size()).second) throw in.error(where, "the key is given twice");
    file->metadata_.emplace_back(std::move(key), std::move(value));
  }
  if (const auto* a = file->find_value("general.alignment")) {
    if (a->type != GgufType::UINT32 || a->integer == 0 || (a->integer & (a->integer - 1)) != 0) {
      throw CheckpointError(fmt::format("{}: metadata 'general.alignment' must be a UINT32 power of two, not {} {}",
                                        path.string(), gguf_type_name(a->type), a->as_number().value_or(0)));
    }
    file->alignment_ = a->integer;
  }
  for (uint64_t i = 0; i < n_tensors; ++i) {
    auto info = read_tensor_info(in, i);
    if (!file->index_.emplace(info.name, file->tensors_.size()).second) {
      throw in.error(fmt::format("tensor '{}'", printable(info.name)), "the name is given twice");
    }
    file->tensors_.push_back(std::move(info));
  }
  const uint64_t header_end = in.position();
  const uint64_t pad = (file->alignment_ - header_end % file->alignment_) % file->alignment_;
  // A file without tensors may end right after its header.
  const uint64_t data_start = std::min(header_end + pad, file->size_);
  place_tensors(path, file->tensors_, data_start, file->size_, file->alignment_);
  return file;
}

GgufFile::~GgufFile() { unmap_file(data_, size_); }

const GgufValue* GgufFile::find_value(const std::string& key) const {
  const auto it = metadata_index_.find(key);
  return it == metadata_index_.end() ? nullptr : &metadata_[it->second].second;
}

const GgufTensorInfo* GgufFile::find(const std::string& name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

const GgufTensorInfo& GgufFile::info(const std::string& name) const {
  const auto* info = find(name);
  if (info == nullptr) throw CheckpointError(fmt::format("{}: no tensor named '{}'", path_.string(), printable(name)));
  return *info;
}

at::Tensor GgufFile::raw(const std::string& name) const {
  const auto& info = this->info(name);
  const auto& type = ggml_type_info(info.type);
  auto shape = info.shape();
  shape.back() = shape.back() / type.block_size * type.type_size;
  const auto options = at::TensorOptions().dtype(at::kByte);
  if (info.begin == info.end) return at::empty(shape, options);
  auto keep = shared_from_this();
  return at::from_blob(const_cast<uint8_t*>(data_ + info.begin), shape, [keep](void*) {}, options);
}

at::Tensor GgufFile::tensor(const std::string& name) const {
  const auto& info = this->info(name);
  const auto& type = ggml_type_info(info.type);
  const auto view_as = [&](at::ScalarType dtype) {
    const auto options = at::TensorOptions().dtype(dtype);
    if (info.begin == info.end) return at::empty(info.shape(), options);
    const uint8_t* src = data_ + info.begin;
    if (reinterpret_cast<uintptr_t>(src) % static_cast<uintptr_t>(type.type_size) != 0) {
      auto copy = at::empty(info.shape(), options);
      std::memcpy(copy.data_ptr(), src, info.end - info.begin);
      return copy;
    }
    auto keep = shared_from_this();
    return at::from_blob(const_cast<uint8_t*>(src), info.shape(), [keep](void*) {}, options);
  };
  switch (info.type) {
    case GgmlType::F32: return view_as(at::kFloat);
    case GgmlType::F64: return view_as(at::kDouble);
    case GgmlType::I8: return view_as(at::kChar);
    case GgmlType::I16: return view_as(at::kShort);
    case GgmlType::I32: return view_as(at::kInt);
    case GgmlType::I64: return view_as(at::kLong);
    default: break;
  }
  auto out = at::empty(info.shape(), at::TensorOptions().dtype(at::kFloat));
  dequantize_ggml(info.type, data_ + info.begin, info.numel(), out.data_ptr<float>());
  return out;
}

// ---------------------------------------------------------------------------------------------
// Finding
// ---------------------------------------------------------------------------------------------

std::optional<std::filesystem::path> gguf_file_of(const std::filesystem::path& model, const char* unless) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_regular_file(model, ec)) {
    if (model.extension() == ".gguf") return model;
    return std::nullopt;
  }
  if (!fs::is_directory(model, ec) || fs::exists(model / unless, ec)) return std::nullopt;
  std::vector<fs::path> found;
  for (fs::directory_iterator it(model, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->path().extension() == ".gguf" && it->is_regular_file(ec)) found.push_back(it->path());
  }
  if (found.empty()) return std::nullopt;
  if (found.size() > 1) {
    std::sort(found.begin(), found.end());
    std::vector<std::string> names;
    for (const auto& f : found) names.push_back(f.filename().string());
    throw ConfigError(fmt::format("{}: holds {} GGUF files ({}) and no {}: give the one to load",
                                  model.string(), found.size(), fmt::join(names, ", "), unless));
  }
  return found.front();
}

// ---------------------------------------------------------------------------------------------
// Writing
// ---------------------------------------------------------------------------------------------

namespace {

class HeaderWriter {
 public:
  template <class T>
  void scalar(T v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    bytes_.insert(bytes_.end(), p, p + sizeof(T));
  }
  void string(const std::string& s) {
    scalar<uint64_t>(s.size());
    bytes_.insert(bytes_.end(), s.begin(), s.end());
  }
  void value(const GgufValue& v) {
    switch (v.type) {
      case GgufType::UINT8: case GgufType::INT8: scalar(static_cast<uint8_t>(v.integer)); break;
      case GgufType::UINT16: case GgufType::INT16: scalar(static_cast<uint16_t>(v.integer)); break;
      case GgufType::UINT32: case GgufType::INT32: scalar(static_cast<uint32_t>(v.integer)); break;
      case GgufType::UINT64: case GgufType::INT64: scalar(v.integer); break;
      case GgufType::FLOAT32: scalar(static_cast<float>(v.real)); break;
      case GgufType::FLOAT64: scalar(v.real); break;
      case GgufType::BOOL: scalar(static_cast<uint8_t>(v.boolean ? 1 : 0)); break;
      case GgufType::STRING: string(v.text); break;
      case GgufType::ARRAY:
        scalar(static_cast<uint32_t>(v.element_type));
        scalar<uint64_t>(v.array.size());
        for (const auto& e : v.array) value(e);
        break;
    }
  }
  void pad_to(uint64_t alignment) { bytes_.resize((bytes_.size() + alignment - 1) / alignment * alignment, 0); }
  std::vector<uint8_t>& bytes() { return bytes_; }

 private:
  std::vector<uint8_t> bytes_;
};

}  // namespace

void save_gguf(const std::filesystem::path& path, const std::vector<std::pair<std::string, GgufValue>>& metadata,
               const std::vector<GgufTensorToWrite>& tensors) {
  uint64_t alignment = kDefaultAlignment;
  for (const auto& [key, value] : metadata) {
    if (key == "general.alignment" && value.type == GgufType::UINT32 && value.integer > 0) alignment = value.integer;
  }
  HeaderWriter header;
  uint32_t magic;
  std::memcpy(&magic, kMagic, 4);
  header.scalar(magic);
  header.scalar<uint32_t>(3);
  header.scalar<uint64_t>(tensors.size());
  header.scalar<uint64_t>(metadata.size());
  for (const auto& [key, value] : metadata) {
    header.string(key);
    header.scalar(static_cast<uint32_t>(value.type));
    header.value(value);
  }
  std::vector<at::Tensor> data;
  std::set<std::string> names;
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    const auto& type = ggml_type_info(t.type);
    const auto bad = [&](const std::string& cause) {
      return CheckpointError(fmt::format("{}: tensor '{}' ({}): {}", path.string(), t.name, type.name, cause));
    };
    if (!names.insert(t.name).second) throw bad("the name is given twice");
    if (t.shape.empty() || t.shape.size() > static_cast<size_t>(kMaxDims)) throw bad("GGUF holds 1 to 4 dimensions");
    if (t.shape.back() % type.block_size != 0) {
      throw bad(fmt::format("its last dimension {} is not whole blocks of {}", t.shape.back(), type.block_size));
    }
    int64_t numel = 1;
    for (const auto d : t.shape) numel *= d;
    const auto bytes = numel / type.block_size * type.type_size;
    auto c = t.data.contiguous();
    if (!c.device().is_cpu() || c.nbytes() != static_cast<size_t>(bytes)) {
      throw bad(fmt::format("{} bytes on {} given for shape {}, which needs {} on the CPU", c.nbytes(), c.device().str(),
                            dims_text(t.shape), bytes));
    }
    header.string(t.name);
    header.scalar<uint32_t>(t.shape.size());
    for (auto it = t.shape.rbegin(); it != t.shape.rend(); ++it) header.scalar<uint64_t>(*it);
    header.scalar(static_cast<uint32_t>(t.type));
    header.scalar<uint64_t>(offset);
    offset += (bytes + alignment - 1) / alignment * alignment;
    data.push_back(std::move(c));
  }
  header.pad_to(alignment);
  AtomicFile out(path);
  out.write(header.bytes().data(), header.bytes().size());
  const std::vector<uint8_t> zeros(alignment, 0);
  for (const auto& c : data) {
    if (c.nbytes() > 0) out.write(c.data_ptr(), c.nbytes());
    out.write(zeros.data(), (alignment - c.nbytes() % alignment) % alignment);
  }
  out.commit();
}

}  // namespace torchpatch::checkpoint
