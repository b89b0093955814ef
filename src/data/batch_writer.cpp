#include "xlme/data/batch_writer.h"

#include "xlme/common/error.h"

namespace xlme::data {

BatchWriter::BatchWriter(Task task, int64_t rows, int64_t width, const SpecialIds& ids, bool pinned)
    : ids_(ids), width_(width) {
  const auto options = torch::TensorOptions().pinned_memory(pinned);
  batch_.task = task;
  batch_.input_ids = torch::empty({rows, width}, options.dtype(torch::kInt64));  // [B, T]
  batch_.labels = torch::empty({rows, width}, options.dtype(torch::kInt64));     // [B, T]
  batch_.positions = torch::empty({rows, width}, options.dtype(torch::kInt64));  // [B, T]
  batch_.masked = torch::empty({rows, width}, options.dtype(torch::kBool));      // [B, T]
  batch_.padding = torch::empty({rows, width}, options.dtype(torch::kBool));     // [B, T]
}

void BatchWriter::write(int64_t row, const std::vector<int32_t>& tokens, size_t second,
                        bool reset_positions, const MaskOptions& mask, Rng& rng) {
  const auto length = static_cast<int64_t>(tokens.size());
  XLME_CHECK(length <= width_, "a row of {} tokens does not fit a micro-batch {} wide", length,
             width_);
  const int64_t at = row * width_;
  int64_t* input = batch_.input_ids.data_ptr<int64_t>() + at;
  int64_t* labels = batch_.labels.data_ptr<int64_t>() + at;
  int64_t* positions = batch_.positions.data_ptr<int64_t>() + at;
  bool* masked = batch_.masked.data_ptr<bool>() + at;
  bool* padding = batch_.padding.data_ptr<bool>() + at;
  for (int64_t i = 0; i < length; ++i) {
    input[i] = labels[i] = tokens[i];
    positions[i] = i;
    masked[i] = padding[i] = false;
  }
  for (int64_t i = length; i < width_; ++i) {
    input[i] = labels[i] = ids_.pad;
    positions[i] = i;
    masked[i] = false;
    padding[i] = true;
  }
  if (second > 0 && reset_positions) {
    // f restarts where e started: right after <s>'s position 0.
    for (auto i = static_cast<int64_t>(second); i < length; ++i) {
      positions[i] = 1 + i - static_cast<int64_t>(second);
    }
  }
  mask_row(input, masked, length, ids_, mask, rng);
  batch_.real_tokens += length;
}

}  // namespace xlme::data
