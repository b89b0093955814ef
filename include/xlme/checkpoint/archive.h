// The torch::serialize archives of a checkpoint (model.pt, optimizer.pt, rank<N>.pt): written
// through a temporary name with every write checked, read with every tensor checked against the
// data record it comes from.
#pragma once

#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>
#include <torch/types.h>

#include <cstdint>
#include <map>
#include <string>

namespace xlme::checkpoint {

// The flat "a.b.c" -> tensor map of a module saved with torch::save(module) (a checkpoint's
// model.pt), on the CPU, read without building the module (through load_archive).
std::map<std::string, torch::Tensor> read_module_archive(const std::string& path);

// Reads the archive `path` (a module's, an optimizer's or a rank's state) into `archive` on
// `device`. Every tensor is first checked to lie inside the data record it is read from (a record
// shorter than its tensor would be read past its end): the error names the file and the tensor.
// An unreadable archive (not a zip, a damaged record) is an error naming the file. The file is
// read once: the check and LibTorch's reader parse the same bytes in memory.
void load_archive(torch::serialize::InputArchive& archive, const std::string& path,
                  const torch::Device& device);

// Writes `archive` (a module's or an optimizer's) to `path` through write_file_streamed: a
// temporary name, every write checked, a disk-full error that names the file and the size.
void save_archive(torch::serialize::OutputArchive& archive, const std::string& path);

}  // namespace xlme::checkpoint
