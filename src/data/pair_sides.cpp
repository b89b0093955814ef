#include "xlme/data/pair_sides.h"

#include "xlme/common/error.h"

#include <algorithm>
#include <vector>

namespace xlme::data {

namespace {

// One side of a row under construction: its token, label and mask columns.
struct SideRow {
  std::vector<int64_t> input, label;
  std::vector<bool> masked;

  void push(int64_t in, int64_t out, bool mask) {
    input.push_back(in);
    label.push_back(out);
    masked.push_back(mask);
  }
};

Batch side_batch(const std::vector<SideRow>& rows, Task task, const SpecialIds& ids) {
  const auto batch = static_cast<int64_t>(rows.size());
  int64_t length = 1;
  for (const auto& row : rows) length = std::max(length, static_cast<int64_t>(row.input.size()));
  Batch out;
  out.task = task;
  out.input_ids = torch::full({batch, length}, ids.pad, torch::kInt64);
  out.labels = torch::full({batch, length}, ids.pad, torch::kInt64);
  out.masked = torch::zeros({batch, length}, torch::kBool);
  out.padding = torch::ones({batch, length}, torch::kBool);
  out.positions = torch::zeros({batch, length}, torch::kInt64);
  auto input = out.input_ids.accessor<int64_t, 2>();
  auto label = out.labels.accessor<int64_t, 2>();
  auto masked = out.masked.accessor<bool, 2>();
  auto padding = out.padding.accessor<bool, 2>();
  auto positions = out.positions.accessor<int64_t, 2>();
  for (int64_t b = 0; b < batch; ++b) {
    const auto& row = rows[static_cast<size_t>(b)];
    for (size_t t = 0; t < row.input.size(); ++t) {
      const auto i = static_cast<int64_t>(t);
      input[b][i] = row.input[t];
      label[b][i] = row.label[t];
      masked[b][i] = row.masked[t];
      padding[b][i] = false;
      positions[b][i] = i;
    }
    out.real_tokens += static_cast<int64_t>(row.input.size());
  }
  return out;
}

}  // namespace

PairSides split_pair(const Batch& batch, const SpecialIds& ids) {
  const auto input_ids = batch.input_ids.to(torch::kInt64).contiguous();
  const auto labels = batch.labels.to(torch::kInt64).contiguous();
  const auto masked_t = batch.masked.to(torch::kBool).contiguous();
  const auto padding_t = batch.padding.to(torch::kBool).contiguous();
  const auto input = input_ids.accessor<int64_t, 2>();
  const auto label = labels.accessor<int64_t, 2>();
  const auto masked = masked_t.accessor<bool, 2>();
  const auto padding = padding_t.accessor<bool, 2>();
  const int64_t rows = input_ids.size(0), length = input_ids.size(1);
  std::vector<SideRow> xs(static_cast<size_t>(rows)), ys(static_cast<size_t>(rows));
  for (int64_t b = 0; b < rows; ++b) {
    int64_t real = 0;  // padding is trailing
    while (real < length && !padding[b][real]) ++real;
    XLME_CHECK(real >= 2 && label[b][0] == ids.bos && label[b][real - 1] == ids.eos,
               "VECO splits framed sequences <s> ... </s>; row {} of a {} micro-batch is not one "
               "(first id {}, last real id {})",
               b, batch.task == Task::kPara ? "translation-pair" : "monolingual", label[b][0],
               real > 0 ? label[b][real - 1] : ids.pad);
    // x: <s> a </s> up to the first </s>; y: <s>, then [y_begin, real) (b and its </s>).
    int64_t x_end = 1;
    while (x_end < real - 1 && label[b][x_end] != ids.eos) ++x_end;
    XLME_CHECK(x_end < real - 1,
               "row {} of a {} micro-batch has no </s> between its two sides; VECO trains on "
               "pairs <s> a </s> b </s>: translation pairs, or two adjacent sentences of one "
               "document (what the shard reader, the held-out and the synthetic batches frame "
               "for objectives.set=veco)",
               b, batch.task == Task::kPara ? "translation-pair" : "monolingual");
    int64_t y_begin = x_end + 1;
    // XLM-R's sentence-pair framing (fine-tuning) doubles it: <s> a </s></s> b </s>.
    if (y_begin < real - 1 && label[b][y_begin] == ids.eos) ++y_begin;
    auto& x = xs[static_cast<size_t>(b)];
    auto& y = ys[static_cast<size_t>(b)];
    for (int64_t t = 0; t < x_end; ++t) x.push(input[b][t], label[b][t], masked[b][t]);
    x.push(ids.eos, ids.eos, false);
    y.push(ids.bos, ids.bos, false);
    for (int64_t t = y_begin; t < real; ++t) y.push(input[b][t], label[b][t], masked[b][t]);
  }
  return {side_batch(xs, batch.task, ids), side_batch(ys, batch.task, ids)};
}

}  // namespace xlme::data
