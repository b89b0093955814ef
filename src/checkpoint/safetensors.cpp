#include "xlme/checkpoint/safetensors.h"

#include "xlme/common/error.h"
#include "xlme/common/io.h"
#include "xlme/common/json.h"
#include "xlme/common/shape_text.h"

#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <set>
#include <vector>

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "safetensors data is little-endian; this writer copies host bytes");

namespace xlme::checkpoint {
namespace {

namespace fs = std::filesystem;

// The format's own cap on the header (safetensors refuses larger ones).
constexpr uint64_t kMaxSafetensorsHeader = 100u * 1024 * 1024;

// The largest size, element count or byte count of a tensor: LibTorch's are int64.
constexpr int64_t kSafetensorsMaxSize = std::numeric_limits<int64_t>::max();

// The most dimensions a tensor may have (a hostile shape could list millions).
constexpr size_t kSafetensorsMaxDims = 64;

struct SafetensorsDtype {
  const char* name;
  torch::ScalarType type;
};

constexpr SafetensorsDtype kSafetensorsDtypes[] = {
    {"F64", torch::kFloat64},   {"F32", torch::kFloat32}, {"F16", torch::kFloat16},
    {"BF16", torch::kBFloat16}, {"I64", torch::kInt64},   {"I32", torch::kInt32},
    {"I16", torch::kInt16},     {"I8", torch::kInt8},     {"U8", torch::kUInt8},
    {"BOOL", torch::kBool}};

std::string safetensors_dtype_list() {
  std::string out;
  for (const auto& d : kSafetensorsDtypes) out += (out.empty() ? "" : ", ") + std::string(d.name);
  return out;
}

// A tensor as the contiguous CPU tensor whose bytes are written.
torch::Tensor safetensors_payload(const torch::Tensor& t) {
  return t.detach().to(torch::kCPU).contiguous();
}

uint64_t safetensors_nbytes(const torch::Tensor& t) {
  return static_cast<uint64_t>(t.numel()) * static_cast<uint64_t>(t.element_size());
}

// The header, padded with spaces so that the data starts at a multiple of 8.
std::string safetensors_header(const SafetensorsContent& content) {
  std::string header = "{";
  if (!content.metadata.empty()) {
    header += "\"__metadata__\":{";
    bool first = true;
    for (const auto& [key, value] : content.metadata) {
      header += (first ? "" : ",") + json_quote(key) + ":" + json_quote(value);
      first = false;
    }
    header += "}";
  }
  uint64_t offset = 0;
  for (const auto& [name, tensor] : content.tensors) {
    XLME_CHECK(name != "__metadata__" && !name.empty(), "a safetensors tensor cannot be named '{}'",
               name);
    XLME_CHECK(tensor.defined(), "tensor '{}' is undefined and cannot be written", name);
    const uint64_t bytes = safetensors_nbytes(tensor);
    std::string shape;
    for (const int64_t size : tensor.sizes()) {
      shape += (shape.empty() ? "" : ",") + std::to_string(size);
    }
    if (header.size() > 1) header += ",";
    header +=
        fmt::format(R"({}:{{"dtype":"{}","shape":[{}],"data_offsets":[{},{}]}})", json_quote(name),
                    safetensors_dtype(tensor.scalar_type(), name), shape, offset, offset + bytes);
    offset += bytes;
  }
  header += "}";
  header.append((8 - header.size() % 8) % 8, ' ');
  return header;
}

std::string safetensors_size_prefix(uint64_t size) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i)
    out[static_cast<size_t>(i)] = static_cast<char>((size >> (8 * i)) & 0xff);
  return out;
}

// Reads `length` bytes at `offset` of the file into `dst`.
using SafetensorsReader = std::function<void(uint64_t offset, uint64_t length, void* dst)>;

struct SafetensorsEntry {
  std::string name;
  torch::ScalarType type;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;
};

SafetensorsEntry safetensors_entry(const std::string& file, const std::string& name,
                                   const nlohmann::json& spec) {
  XLME_CHECK(spec.is_object() && spec.contains("dtype") && spec.contains("shape") &&
                 spec.contains("data_offsets"),
             "safetensors file '{}': tensor '{}' needs an object with dtype, shape and "
             "data_offsets, got {}",
             file, name, describe_json(spec));
  SafetensorsEntry e;
  e.name = name;
  const auto& dtype = spec["dtype"];
  const auto found =
      std::find_if(std::begin(kSafetensorsDtypes), std::end(kSafetensorsDtypes),
                   [&](const SafetensorsDtype& d) { return dtype.is_string() && dtype == d.name; });
  XLME_CHECK(found != std::end(kSafetensorsDtypes),
             "safetensors file '{}': tensor '{}' has the unknown dtype {}; known: {}", file, name,
             dtype.is_string() ? json_excerpt(dtype) : describe_json(dtype),
             safetensors_dtype_list());
  e.type = found->type;
  const auto& shape = spec["shape"];
  XLME_CHECK(shape.is_array(), "safetensors file '{}': the shape of tensor '{}' is not a list: {}",
             file, name, describe_json(shape));
  XLME_CHECK(shape.size() <= kSafetensorsMaxDims,
             "safetensors file '{}': tensor '{}' has {} dimensions; at most {} are read", file,
             name, shape.size(), kSafetensorsMaxDims);
  // Bytes of the tensor, computed without overflow. Every size, and the product of the sizes
  // (0 counted as 1, which bounds LibTorch's strides) times the element size, must fit in int64.
  uint64_t bound = static_cast<uint64_t>(c10::elementSize(e.type));
  bool overflow = false, empty = false;
  for (const auto& size : shape) {
    XLME_CHECK(size.is_number_unsigned() &&
                   size.get<uint64_t>() <= static_cast<uint64_t>(kSafetensorsMaxSize),
               "safetensors file '{}': the shape of tensor '{}' holds {}, not a size", file, name,
               describe_json(size));
    e.shape.push_back(size.get<int64_t>());
    empty = empty || size.get<uint64_t>() == 0;
    overflow = overflow ||
               __builtin_mul_overflow(bound, std::max<uint64_t>(size.get<uint64_t>(), 1), &bound) ||
               bound > static_cast<uint64_t>(kSafetensorsMaxSize);
  }
  XLME_CHECK(!overflow,
             "safetensors file '{}': tensor '{}' ({} of shape {}) would need more than 2^63 bytes "
             "(its size overflows); the header is damaged or was made to break readers",
             file, name, found->name, shape_text(e.shape));
  const auto& offsets = spec["data_offsets"];
  XLME_CHECK(offsets.is_array() && offsets.size() == 2 && offsets[0].is_number_unsigned() &&
                 offsets[1].is_number_unsigned() && offsets[0] <= offsets[1],
             "safetensors file '{}': data_offsets of tensor '{}' must be [begin, end] with 0 <= "
             "begin <= end, got {}",
             file, name, describe_json(offsets));
  e.begin = offsets[0].get<uint64_t>();
  e.end = offsets[1].get<uint64_t>();
  const uint64_t bytes = empty ? 0 : bound;
  XLME_CHECK(e.end - e.begin == bytes,
             "safetensors file '{}': tensor '{}' ({} of shape {}) needs {} bytes but its "
             "data_offsets [{}, {}] span {}",
             file, name, found->name, shape_text(e.shape), bytes, e.begin, e.end, e.end - e.begin);
  return e;
}

// A checked header: the tensors tile the data region, which starts at `data_start`.
struct SafetensorsLayout {
  std::vector<SafetensorsEntry> entries;
  std::map<std::string, std::string> metadata;
  uint64_t data_start = 0;
};

SafetensorsLayout parse_safetensors_layout(const SafetensorsReader& read, uint64_t file_size,
                                           const std::string& file) {
  XLME_CHECK(file_size >= 8,
             "safetensors file '{}' is {} bytes long, shorter than its 8-byte header size; it is "
             "truncated or not a safetensors file",
             file, file_size);
  unsigned char prefix[8];
  read(0, 8, prefix);
  uint64_t header_size = 0;
  for (int i = 7; i >= 0; --i) header_size = (header_size << 8) | prefix[i];
  XLME_CHECK(header_size <= file_size - 8 && header_size <= kMaxSafetensorsHeader,
             "safetensors file '{}' announces a {}-byte header but the file has only {} bytes "
             "after the size; it is truncated or not a safetensors file",
             file, header_size, file_size - 8);
  std::string text(header_size, '\0');
  read(8, header_size, text.data());
  const auto header =
      parse_json<nlohmann::json>(text, fmt::format("safetensors file '{}': the header", file),
                                 /*unique_keys=*/true);
  XLME_CHECK(header.is_object(), "safetensors file '{}': the header is not a JSON object", file);

  SafetensorsLayout layout;
  auto& entries = layout.entries;
  for (const auto& [name, spec] : header.items()) {
    if (name == "__metadata__") {
      XLME_CHECK(spec.is_object(),
                 "safetensors file '{}': __metadata__ must be an object of strings", file);
      for (const auto& [key, value] : spec.items()) {
        XLME_CHECK(value.is_string(),
                   "safetensors file '{}': __metadata__ value of '{}' is {}, not a string", file,
                   key, describe_json(value));
        layout.metadata[key] = value.get<std::string>();
      }
      continue;
    }
    entries.push_back(safetensors_entry(file, name, spec));
  }

  // The tensors must tile the data region exactly: no overlap, no gap, nothing left over.
  const uint64_t data_start = 8 + header_size;
  const uint64_t data_size = file_size - data_start;
  std::sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t covered = 0;
  for (size_t i = 0; i < entries.size(); ++i) {
    const auto& e = entries[i];
    XLME_CHECK(e.begin >= covered,
               "safetensors file '{}': tensors '{}' and '{}' overlap (bytes [{}, {}) and [{}, {}) "
               "of the data)",
               file, entries[i - 1].name, e.name, entries[i - 1].begin, entries[i - 1].end, e.begin,
               e.end);
    XLME_CHECK(e.begin == covered,
               "safetensors file '{}': bytes [{}, {}) of the data belong to no tensor (before "
               "'{}')",
               file, covered, e.begin, e.name);
    covered = e.end;
  }
  XLME_CHECK(covered <= data_size,
             "safetensors file '{}' is truncated: its tensors need {} bytes of data but the file "
             "holds {} ({} bytes long); re-export or copy it again",
             file, covered, data_size, file_size);
  XLME_CHECK(covered == data_size,
             "safetensors file '{}': the data region has {} bytes but the tensors cover only {}; "
             "{} bytes at the end belong to no tensor",
             file, data_size, covered, data_size - covered);
  layout.data_start = data_start;
  return layout;
}

// The tensors of `layout` that `wanted` names (all when it is null), read through `read`.
SafetensorsContent read_safetensors_tensors(const SafetensorsReader& read,
                                            const SafetensorsLayout& layout,
                                            const std::set<std::string>* wanted,
                                            const std::string& file) {
  SafetensorsContent content;
  content.metadata = layout.metadata;
  for (const auto& e : layout.entries) {
    if (wanted && wanted->count(e.name) == 0) continue;
    auto tensor = torch::empty(e.shape, torch::TensorOptions().dtype(e.type));
    if (e.end > e.begin) read(layout.data_start + e.begin, e.end - e.begin, tensor.data_ptr());
    content.tensors.emplace(e.name, std::move(tensor));
  }
  if (wanted) {
    for (const auto& name : *wanted) {
      XLME_CHECK(content.tensors.count(name), "safetensors file '{}' has no tensor '{}'", file,
                 name);
    }
  }
  return content;
}

// A reader of the file `path`, opened once: the header and the data come from the same file.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path) : path_(path) {
    std::error_code ec;
    XLME_CHECK(fs::is_regular_file(path, ec), "safetensors file '{}' not found", path);
    size_ = fs::file_size(path, ec);
    XLME_CHECK(!ec, "cannot read the size of '{}': {}", path, ec.message());
    in_.open(path, std::ios::binary);
    XLME_CHECK(in_.good(), "cannot open '{}': {}", path, std::strerror(errno));
  }
  SafetensorsReader reader() {
    return [this](uint64_t offset, uint64_t length, void* dst) {
      in_.seekg(static_cast<std::streamoff>(offset));
      in_.read(static_cast<char*>(dst), static_cast<std::streamsize>(length));
      XLME_CHECK(static_cast<uint64_t>(in_.gcount()) == length,
                 "cannot read {} bytes at offset {} of '{}' (the file changed while read?)", length,
                 offset, path_);
    };
  }
  uint64_t size() const { return size_; }

 private:
  std::string path_;
  uint64_t size_ = 0;
  std::ifstream in_;
};

}  // namespace

std::string safetensors_dtype(torch::ScalarType type, const std::string& name) {
  for (const auto& d : kSafetensorsDtypes) {
    if (d.type == type) return d.name;
  }
  XLME_FAIL("tensor '{}' has dtype {}, which safetensors export does not support ({})", name,
            c10::toString(type), safetensors_dtype_list());
}

std::string safetensors_bytes(const SafetensorsContent& content) {
  const std::string header = safetensors_header(content);
  std::string out = safetensors_size_prefix(header.size()) + header;
  for (const auto& [name, tensor] : content.tensors) {
    const auto payload = safetensors_payload(tensor);
    out.append(static_cast<const char*>(payload.data_ptr()), safetensors_nbytes(payload));
  }
  return out;
}

void write_safetensors(const std::string& path, const SafetensorsContent& content) {
  const std::string header = safetensors_header(content);
  write_file_streamed(path, [&](const ByteSink& sink) {
    const std::string prefix = safetensors_size_prefix(header.size());
    sink(prefix.data(), prefix.size());
    sink(header.data(), header.size());
    for (const auto& [name, tensor] : content.tensors) {
      const auto payload = safetensors_payload(tensor);
      sink(payload.data_ptr(), safetensors_nbytes(payload));
    }
  });
}

SafetensorsContent read_safetensors(const std::string& path) {
  SafetensorsFile file(path);
  const auto layout = parse_safetensors_layout(file.reader(), file.size(), path);
  return read_safetensors_tensors(file.reader(), layout, nullptr, path);
}

SafetensorsHeader read_safetensors_header(const std::string& path) {
  SafetensorsFile file(path);
  const auto layout = parse_safetensors_layout(file.reader(), file.size(), path);
  SafetensorsHeader header;
  header.metadata = layout.metadata;
  for (const auto& e : layout.entries) header.tensors[e.name] = {e.shape, e.type};
  return header;
}

SafetensorsContent read_safetensors(const std::string& path, const std::set<std::string>& names) {
  SafetensorsFile file(path);
  const auto layout = parse_safetensors_layout(file.reader(), file.size(), path);
  return read_safetensors_tensors(file.reader(), layout, &names, path);
}

SafetensorsContent parse_safetensors(const std::string& bytes, const std::string& name) {
  const auto read = [&](uint64_t offset, uint64_t length, void* dst) {
    std::memcpy(dst, bytes.data() + offset, length);
  };
  return read_safetensors_tensors(read, parse_safetensors_layout(read, bytes.size(), name), nullptr,
                                  name);
}

}  // namespace xlme::checkpoint
