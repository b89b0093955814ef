// A table lookup whose gradient is the rows it read (docs/ops.md, `embedding_lookup`).
//
// The shared token table ([vocab, E], 768 MB in fp32 at Base's 250,002 x 768) is read three times
// per micro-batch: the generator's and the discriminator's lookups and the generator's tied output
// projection. LibTorch's dense embedding backward gives each lookup's gradient as a [vocab, E]
// tensor, zeros but for the rows read, which autograd then adds to the table's gradient: per
// micro-batch two 768 MB tensors written and added, for a few thousand rows. Where the table's
// .grad is already a dense buffer (the trainer's gradient buckets attach it before the first
// backward), this lookup's backward adds those rows alone into the buffer itself, coalesced first
// (rows sorted and summed in a fixed order, then one add per element: the same bits every run),
// and hands autograd an empty gradient (ops::gradient_added_in_place), as the tied projection's
// product does with the weight_grad op: the table's three uses then meet in autograd as empty
// tensors, with no [vocab, E] sum and no concatenation of rows. Elsewhere (no .grad yet,
// fine-tuning, evaluation) it is torch::embedding; so it is while a CUDA graph is captured
// (train.cuda_graphs): coalescing reads the number of distinct rows on the host, which a capture
// forbids, and LibTorch's dense backward does not.
#pragma once

#include <torch/types.h>

namespace xlme::ops {

// table [rows, E] indexed by ids [...] -> [..., E], differentiable with respect to table.
torch::Tensor embedding_lookup(const torch::Tensor& table, const torch::Tensor& ids);

// Whether embedding_lookup() gives `table` its rows alone as gradient: autograd is recording, the
// table takes a gradient, its .grad is a dense tensor already, and no CUDA graph is being captured
// on the current stream.
bool embedding_gradient_is_rows(const torch::Tensor& table);

}  // namespace xlme::ops
