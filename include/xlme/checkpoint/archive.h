// The torch::serialize archives of a checkpoint (model.pt, optimizer.pt, rank<N>.pt): written
// through a temporary name with every write checked, read with every tensor checked against the
// data record it comes from.
#pragma once

#include "xlme/checkpoint/weights.h"

#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>
#include <torch/types.h>

#include <cstdint>
#include <map>
#include <string>

namespace xlme::checkpoint {

// Reads the archive `path` (an optimizer's or a rank's state) into `archive` on `device`.
// Before anything it declares is allocated: the file may be at most `max_data_bytes` (the tensor
// data the reader expects) plus 64 MiB (the pickle, code and version records), or it is refused
// without being read; the zip directory's record sizes are checked against the same bounds; every
// tensor of the pickle is checked to lie inside the data record it is read from (a record shorter
// than its tensor would be read past its end). Errors name the file and the tensor or record. An
// unreadable archive (not a zip, a damaged record) is an error naming the file. The file is read
// once: the checks and LibTorch's reader parse the same bytes in memory, so the peak is about
// twice the file.
void load_archive(torch::serialize::InputArchive& archive, const std::string& path,
                  const torch::Device& device, uint64_t max_data_bytes);

// load_archive of a module's archive (model.pt) that must hold exactly the tensors `expected`
// (a model's weight_specs): an extra tensor, a missing one, another shape or another dtype is
// refused naming the file and the tensor before LibTorch reads it (LibTorch would take the
// stored tensor as it is, and a transposed or float64 table fail later without a name).
void load_module_archive(torch::serialize::InputArchive& archive, const std::string& path,
                         const torch::Device& device, const WeightSpecs& expected);

// The flat "a.b.c" -> tensor map of a module saved with torch::save(module) (a checkpoint's
// model.pt), on the CPU, read without building the module through load_module_archive.
std::map<std::string, torch::Tensor> read_module_archive(const std::string& path,
                                                         const WeightSpecs& expected);

// The same for another model's archive (--init-from takes over what matches): any tensors, at
// most `max_data_bytes` of them, through load_archive.
std::map<std::string, torch::Tensor> read_module_archive(const std::string& path,
                                                         uint64_t max_data_bytes);

// Writes `archive` (a module's or an optimizer's) to `path` through write_file_streamed: a
// temporary name, every write checked, a disk-full error that names the file and the size.
void save_archive(torch::serialize::OutputArchive& archive, const std::string& path);

}  // namespace xlme::checkpoint
