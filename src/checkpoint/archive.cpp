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

namespace xlme::checkpoint {
namespace {

namespace fs = std::filesystem;

// The deepest nesting of objects, lists and dicts an archive may hold (xlme writes 4 levels).
constexpr int kMaxArchiveDepth = 64;

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
void check_archive_value(const c10::IValue& value, const std::string& name, int depth,
                         const std::map<const void*, std::size_t>& record_bytes,
                         const std::string& path) {
  XLME_CHECK(depth <= kMaxArchiveDepth, "'{}': {} is nested more than {} levels deep; {}", path,
             shown(name), kMaxArchiveDepth, kDamagedHint);
  if (value.isTensor()) {
    check_archive_tensor(value.toTensor(), name, record_bytes, path);
  } else if (value.isObject()) {
    const auto& object = value.toObjectRef();
    const auto type = object.type();
    for (std::size_t i = 0; i < object.slots().size(); ++i) {
      check_archive_value(object.getSlot(i), member_name(name, type->getAttributeName(i)),
                          depth + 1, record_bytes, path);
    }
  } else if (value.isGenericDict()) {
    for (const auto& item : value.toGenericDict()) {
      const std::string key = item.key().isString() ? item.key().toStringRef() : "(key)";
      check_archive_value(item.value(), member_name(name, key), depth + 1, record_bytes, path);
    }
  } else if (value.isList()) {
    const auto items = value.toListRef();
    for (std::size_t i = 0; i < items.size(); ++i) {
      check_archive_value(items[i], member_name(name, std::to_string(i)), depth + 1, record_bytes,
                          path);
    }
  } else if (value.isTuple()) {
    const auto& items = value.toTupleRef().elements();
    for (std::size_t i = 0; i < items.size(); ++i) {
      check_archive_value(items[i], member_name(name, std::to_string(i)), depth + 1, record_bytes,
                          path);
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

// Checks, before LibTorch reads archive `bytes` (the file `path`) for use, that every tensor lies
// inside the record its bytes come from: LibTorch sizes a storage by the element count written in
// the pickle, not by its record, and places a tensor in its storage without a bounds check, so a
// short record is read past its end. The pickle is unpickled here on the CPU with placeholder
// classes (the archive's code is not compiled), each record's size remembered by its buffer.
void check_archive_records(const std::string& bytes, const std::string& path) {
  caffe2::serialize::PyTorchStreamReader reader(std::make_shared<ArchiveBytes>(bytes));
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
  std::map<const void*, std::size_t> record_bytes;
  const auto read_record = [&](const std::string& key) {
    auto [data, size] = reader.getRecord("data/" + key);
    record_bytes[data.get()] = size;
    return std::move(data);
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
  torch::jit::Unpickler unpickler(read_pickle, resolve_class, build_object, read_record,
                                  torch::Device(torch::kCPU));
  unpickler.set_version(reader.version());
  check_archive_value(unpickler.parse_ivalue(), "", 0, record_bytes, path);
}

}  // namespace

void load_archive(torch::serialize::InputArchive& archive, const std::string& path,
                  const torch::Device& device) {
  XLME_CHECK(fs::is_regular_file(path), "'{}' not found", path);
  // Read once: the bytes that are checked are the bytes that are loaded.
  const std::string bytes = read_file(path, "checkpoint file");
  try {
    check_archive_records(bytes, path);
    archive.load_from(bytes.data(), bytes.size(), device);
  } catch (const c10::Error& e) {
    const std::string what = e.what_without_backtrace();
    XLME_FAIL("cannot read '{}': {}; {}", path, what.substr(0, what.find('\n')), kDamagedHint);
  }
}

std::map<std::string, torch::Tensor> read_module_archive(const std::string& path) {
  torch::serialize::InputArchive archive;
  load_archive(archive, path, torch::kCPU);
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
