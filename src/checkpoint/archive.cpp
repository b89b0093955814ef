#include "xlme/checkpoint/archive.h"

#include "messages.h"
#include "xlme/common/error.h"
#include "xlme/common/io.h"
#include "xlme/common/shape_text.h"

#include <caffe2/serialize/inline_container.h>
#include <caffe2/serialize/read_adapter_interface.h>
#include <torch/csrc/jit/api/compilation_unit.h>
#include <torch/csrc/jit/serialization/unpickler.h>
#include <torch/serialize.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <vector>

namespace xlme::checkpoint {
namespace {

namespace fs = std::filesystem;

// The deepest nesting of objects, lists and dicts an archive may hold (xlme writes 4 levels).
constexpr int kMaxArchiveDepth = 64;

// The most bytes of records other than tensor data (the pickle, TorchScript code, version) an
// archive may declare: xlme's hold tens of kilobytes.
constexpr uint64_t kMaxArchiveOtherBytes = 64u << 20;

// What to do about a damaged file of a checkpoint.
constexpr const char* kDamagedHint =
    "the file is damaged or was altered; restore the checkpoint from a copy, or resume from "
    "another checkpoint";

void flatten_module_archive(torch::serialize::InputArchive& archive, const std::string& prefix,
                            std::map<std::string, torch::Tensor>& out) {
  for (const auto& key : archive.keys()) {
    torch::Tensor tensor;
    if (archive.try_read(key, tensor)) {
      out.emplace(prefix + key, tensor.detach());
      continue;
    }
    torch::serialize::InputArchive child;
    if (archive.try_read(key, child)) flatten_module_archive(child, prefix + key + ".", out);
  }
}

// "a.b" + "c" -> "a.b.c".
std::string member_name(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}

// Checks that tensor `name` of archive `path` lies inside its storage, and its storage inside the
// record its bytes were read from (`record_bytes`: the size of each record by its buffer).
void check_archive_tensor(const torch::Tensor& tensor, const std::string& name,
                          const std::map<const void*, std::size_t>& record_bytes,
                          const std::string& path) {
  if (!tensor.defined()) return;
  XLME_CHECK(tensor.layout() == torch::kStrided && !tensor.is_quantized(),
             "'{}': tensor {} is not a dense tensor; xlme writes only dense tensors; {}", path,
             shown(name), kDamagedHint);
  const c10::Storage& storage = tensor.storage();
  const auto record = record_bytes.find(storage.data());
  const std::size_t available = record == record_bytes.end() ? 0 : record->second;
  XLME_CHECK(storage.nbytes() <= available,
             "'{}': the data record of tensor {} holds {} bytes but its storage needs {}; {}", path,
             shown(name), available, storage.nbytes(), kDamagedHint);
  if (tensor.numel() == 0) return;
  // The last element's index in the storage, then its end in bytes, without overflow.
  int64_t last = tensor.storage_offset();
  bool overflow = last < 0;
  for (int64_t d = 0; d < tensor.dim() && !overflow; ++d) {
    int64_t reach = 0;
    overflow = tensor.stride(d) < 0 ||
               __builtin_mul_overflow(tensor.size(d) - 1, tensor.stride(d), &reach) ||
               __builtin_add_overflow(last, reach, &last);
  }
  int64_t end = 0;
  overflow = overflow || __builtin_add_overflow(last, 1, &end) ||
             __builtin_mul_overflow(end, static_cast<int64_t>(tensor.element_size()), &end);
  XLME_CHECK(!overflow && static_cast<uint64_t>(end) <= storage.nbytes(),
             "'{}': tensor {} (shape {}, offset {}) reaches past the {} bytes of its data "
             "record; {}",
             path, shown(name), shape_text(tensor.sizes()), tensor.storage_offset(),
             storage.nbytes(), kDamagedHint);
}

// check_archive_tensor on every tensor under `value` (objects, lists, tuples, dicts).
// Each tensor's shape and dtype goes into `specs` under its dotted name.
void check_archive_value(const c10::IValue& value, const std::string& name, int depth,
                         const std::map<const void*, std::size_t>& record_bytes,
                         const std::string& path, WeightSpecs& specs) {
  XLME_CHECK(depth <= kMaxArchiveDepth, "'{}': {} is nested more than {} levels deep; {}", path,
             shown(name), kMaxArchiveDepth, kDamagedHint);
  if (value.isTensor()) {
    const auto& tensor = value.toTensor();
    check_archive_tensor(tensor, name, record_bytes, path);
    if (tensor.defined()) specs[name] = {tensor.sizes().vec(), tensor.scalar_type()};
  } else if (value.isObject()) {
    const auto& object = value.toObjectRef();
    const auto type = object.type();
    for (std::size_t i = 0; i < object.slots().size(); ++i) {
      check_archive_value(object.getSlot(i), member_name(name, type->getAttributeName(i)),
                          depth + 1, record_bytes, path, specs);
    }
  } else if (value.isGenericDict()) {
    for (const auto& item : value.toGenericDict()) {
      const std::string key = item.key().isString() ? item.key().toStringRef() : "(key)";
      check_archive_value(item.value(), member_name(name, key), depth + 1, record_bytes, path,
                          specs);
    }
  } else if (value.isList()) {
    const auto items = value.toListRef();
    for (std::size_t i = 0; i < items.size(); ++i) {
      check_archive_value(items[i], member_name(name, std::to_string(i)), depth + 1, record_bytes,
                          path, specs);
    }
  } else if (value.isTuple()) {
    const auto& items = value.toTupleRef().elements();
    for (std::size_t i = 0; i < items.size(); ++i) {
      check_archive_value(items[i], member_name(name, std::to_string(i)), depth + 1, record_bytes,
                          path, specs);
    }
  }
}

// The bytes of archive `bytes` (the file `path`) that LibTorch's reader asks for; a read past the
// end returns what there is.
class ArchiveBytes final : public caffe2::serialize::ReadAdapterInterface {
 public:
  explicit ArchiveBytes(const std::string& bytes) : bytes_(bytes) {}
  std::size_t size() const override { return bytes_.size(); }
  std::size_t read(uint64_t pos, void* buffer, std::size_t n, const char* /*what*/) const override {
    if (pos >= bytes_.size()) return 0;
    n = std::min<std::size_t>(n, bytes_.size() - pos);
    std::memcpy(buffer, bytes_.data() + pos, n);
    return n;
  }

 private:
  const std::string& bytes_;
};

// Checks, before LibTorch reads archive `bytes` (the file `path`) for use, what it declares:
// every record's size (the tensor data in all at most `max_data_bytes`, the other records, the
// pickle and TorchScript code, at most kMaxArchiveOtherBytes), and that every tensor lies inside
// the record its bytes come from: LibTorch sizes a storage by the element count written in the
// pickle, not by its record, and places a tensor in its storage without a bounds check, so a short
// record is read past its end. The pickle is unpickled here on the CPU with placeholder classes
// (the archive's code is not compiled) and placeholder data (no record is read: each stands for
// its size), and the tensors it declares are returned by dotted name.
// With `expected`, the declared tensors are compared with it (check_declared_weights) before the
// data records' total is: a mistyped or transposed tensor is named as such.
void check_archive_records(const std::string& bytes, const std::string& path,
                           uint64_t max_data_bytes, const WeightSpecs* expected) {
  caffe2::serialize::PyTorchStreamReader reader(std::make_shared<ArchiveBytes>(bytes));
  uint64_t data_bytes = 0, other_bytes = 0;
  std::pair<std::string, uint64_t> largest_data, largest_other;  // name, bytes
  for (const auto& name : reader.getAllRecords()) {
    const uint64_t size = reader.getRecordSize(name);
    const bool data = name.rfind("data/", 0) == 0;
    uint64_t& total = data ? data_bytes : other_bytes;
    if (__builtin_add_overflow(total, size, &total)) total = UINT64_MAX;
    auto& largest = data ? largest_data : largest_other;
    if (size >= largest.second) largest = {name, size};
  }
  XLME_CHECK(other_bytes <= kMaxArchiveOtherBytes,
             "'{}' declares {} bytes of records other than tensor data (the largest: {}, {} "
             "bytes), more than the {} this reader accepts; nothing was allocated for them; {}",
             path, other_bytes, shown(largest_other.first), largest_other.second,
             kMaxArchiveOtherBytes, kDamagedHint);
  const auto pickle = reader.getRecord("data.pkl");
  const char* pickle_data = static_cast<const char*>(std::get<0>(pickle).get());
  const std::size_t pickle_bytes = std::get<1>(pickle);
  std::size_t consumed = 0;
  const auto read_pickle = [&](char* buffer, std::size_t n) {
    n = std::min(n, pickle_bytes - consumed);
    std::memcpy(buffer, pickle_data + consumed, n);
    consumed += n;
    return n;
  };
  // One placeholder byte per record: a distinct address for each record, never read.
  std::vector<char> placeholders(reader.getAllRecords().size() + 1);
  std::map<const void*, std::size_t> record_bytes;
  const auto read_record = [&](const std::string& key) {
    const std::string name = "data/" + key;
    const std::size_t size = reader.getRecordSize(name);  // throws for a missing record
    void* at = &placeholders.at(record_bytes.size());
    record_bytes[at] = size;
    return at::DataPtr(at, torch::Device(torch::kCPU));
  };
  const auto unit = std::make_shared<torch::jit::CompilationUnit>();
  const auto resolve_class = [&](const c10::QualifiedName& name) {
    return c10::StrongTypePtr(unit, c10::ClassType::create(name, unit));
  };
  // An object of a class of its own, with the pickled state's entries as attributes.
  const auto build_object = [&](const c10::StrongTypePtr& type, const c10::IValue& state) {
    const auto dict = state.toGenericDict();
    const auto cls = c10::ClassType::create(type.type_->expectRef<c10::ClassType>().name(), unit);
    for (const auto& item : dict) cls->addAttribute(item.key().toStringRef(), item.value().type());
    auto object = c10::ivalue::Object::create(c10::StrongTypePtr(unit, cls), dict.size());
    std::size_t slot = 0;
    for (const auto& item : dict) object->setSlot(slot++, item.value());
    return object;
  };
  WeightSpecs specs;
  {
    torch::jit::Unpickler unpickler(read_pickle, resolve_class, build_object, read_record,
                                    torch::Device(torch::kCPU));
    unpickler.set_version(reader.version());
    check_archive_value(unpickler.parse_ivalue(), "", 0, record_bytes, path, specs);
  }
  if (expected) {
    check_declared_weights(specs, *expected, torch::kFloat32, path,
                           "the checkpoint does not belong to this model (compare model.* with "
                           "its config.yaml), or it was altered: resume from another checkpoint");
  }
  XLME_CHECK(data_bytes <= max_data_bytes,
             "'{}' declares {} bytes of tensor data (the largest record: {}, {} bytes), more than "
             "the {} this reader expects of it; nothing was allocated for them; {}",
             path, data_bytes, shown(largest_data.first), largest_data.second, max_data_bytes,
             kDamagedHint);
}

// Reads archive `path` into `archive` after check_archive_records (and, when `expected` is set,
// check_declared_weights against it).
void load_checked_archive(torch::serialize::InputArchive& archive, const std::string& path,
                          const torch::Device& device, uint64_t max_data_bytes,
                          const WeightSpecs* expected) {
  XLME_CHECK(fs::is_regular_file(path), "'{}' not found", path);
  // The file is never read whole when it is larger than what it may hold: a sparse file can
  // declare gigabytes on a few kilobytes of disk.
  // Twice the data: a float64 copy of the model is still read far enough to be named as such.
  uint64_t max_file_bytes = 0;
  if (__builtin_mul_overflow(max_data_bytes, 2, &max_file_bytes) ||
      __builtin_add_overflow(max_file_bytes, kMaxArchiveOtherBytes, &max_file_bytes)) {
    max_file_bytes = UINT64_MAX;
  }
  std::error_code ec;
  const uint64_t size = fs::file_size(path, ec);
  XLME_CHECK(!ec, "cannot read the size of '{}': {}", path, ec.message());
  XLME_CHECK(size <= max_file_bytes,
             "'{}' is {} bytes, more than twice the {} bytes of tensor data this reader expects of "
             "it (plus {} bytes of other records); it holds more than the model's tensors and is "
             "not read; {}",
             path, size, max_data_bytes, kMaxArchiveOtherBytes, kDamagedHint);
  // Read once: the bytes that are checked are the bytes that are loaded.
  const std::string bytes = read_file(path, "checkpoint file", max_file_bytes);
  try {
    check_archive_records(bytes, path, max_data_bytes, expected);
    archive.load_from(bytes.data(), bytes.size(), device);
  } catch (const c10::Error& e) {
    const std::string what = e.what_without_backtrace();
    XLME_FAIL("cannot read '{}': {}; {}", path, what.substr(0, what.find('\n')), kDamagedHint);
  }
}

}  // namespace

void load_archive(torch::serialize::InputArchive& archive, const std::string& path,
                  const torch::Device& device, uint64_t max_data_bytes) {
  load_checked_archive(archive, path, device, max_data_bytes, nullptr);
}

void load_module_archive(torch::serialize::InputArchive& archive, const std::string& path,
                         const torch::Device& device, const WeightSpecs& expected) {
  load_checked_archive(archive, path, device, weight_bytes(expected), &expected);
}

std::map<std::string, torch::Tensor> read_module_archive(const std::string& path,
                                                         const WeightSpecs& expected) {
  torch::serialize::InputArchive archive;
  load_module_archive(archive, path, torch::kCPU, expected);
  std::map<std::string, torch::Tensor> out;
  flatten_module_archive(archive, "", out);
  return out;
}

std::map<std::string, torch::Tensor> read_module_archive(const std::string& path,
                                                         uint64_t max_data_bytes) {
  torch::serialize::InputArchive archive;
  load_archive(archive, path, torch::kCPU, max_data_bytes);
  std::map<std::string, torch::Tensor> out;
  flatten_module_archive(archive, "", out);
  return out;
}

void save_archive(torch::serialize::OutputArchive& archive, const std::string& path) {
  write_file_streamed(path, [&](const ByteSink& sink) {
    try {
      archive.save_to(sink);
    } catch (const c10::Error& e) {
      XLME_FAIL("cannot write '{}': {}", path, e.what_without_backtrace());
    }
  });
}

}  // namespace xlme::checkpoint
