// The safetensors format (https://github.com/huggingface/safetensors): an 8-byte little-endian
// header size N, N bytes of JSON {name: {dtype, shape, data_offsets: [begin, end]}, optionally
// "__metadata__": {string: string}}, padded with spaces to a multiple of 8, then the raw
// little-endian tensor data, offsets relative to its start. Readable by `safetensors`,
// `scripts/xlme_reference.py` and anything that reads the format; no code is ever executed.
#pragma once

#include "xlme/checkpoint/weights.h"

#include <torch/types.h>

#include <cstdint>
#include <map>
#include <set>
#include <string>

namespace xlme::checkpoint {

struct SafetensorsContent {
  std::map<std::string, torch::Tensor> tensors;  // CPU tensors, in their stored dtype
  std::map<std::string, std::string> metadata;   // "__metadata__"
};

// "F32" for torch::kFloat32, ... (F64, F32, F16, BF16, I64, I32, I16, I8, U8, BOOL); throws
// xlme::Error naming `name` for any other dtype.
std::string safetensors_dtype(torch::ScalarType type, const std::string& name);

// The whole file as bytes: tensors stored in sorted name order, back to back, the header compact
// JSON with "__metadata__" first (when not empty) and the tensors in name order.
std::string safetensors_bytes(const SafetensorsContent& content);

// Writes `content` to `path` atomically through write_file_streamed (a temporary file beside it,
// every write checked, fsync, rename, fsync of the folder), streaming tensor by tensor: a failed
// write (disk full, file-size limit) leaves `path` as it was and no temporary file, and the error
// names the file and the size. Tensors on any device, contiguous or not.
void write_safetensors(const std::string& path, const SafetensorsContent& content);

// Reads and checks a whole file; every malformed header or data region is an xlme::Error that
// names the file and what is wrong. The tensors do not alias each other.
SafetensorsContent read_safetensors(const std::string& path);

// What a file declares, read and checked without its data (the 8-byte size, the header, every
// entry's dtype, shape and offsets against the file's real size): a reader compares it with its
// model before it allocates anything.
struct SafetensorsHeader {
  WeightSpecs tensors;
  std::map<std::string, std::string> metadata;
};
SafetensorsHeader read_safetensors_header(const std::string& path);

// Reads only the tensors in `names` (each must be in the file; the others are never read nor
// allocated), after the same checks of the whole header as read_safetensors.
SafetensorsContent read_safetensors(const std::string& path, const std::set<std::string>& names);

// The same from bytes in memory; `name` stands for the file in error messages.
SafetensorsContent parse_safetensors(const std::string& bytes, const std::string& name);

}  // namespace xlme::checkpoint
