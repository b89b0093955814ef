// The objectives.set registry: one row per objective set, saying what the set trains and what it
// needs (docs/ARCHITECTURE.md#loss). Code asks the row for what it needs to know (the model's
// architecture, the batch sources, the terms), never compares the name: adding a set is one row in
// src/config/objective_set.cpp. The table is plain data that the config checks objectives.set
// against, so it sits in config/, below everything that reads it (data, model, objectives, train);
// its names are in namespace objectives, the area that computes the terms.
#pragma once

#include <string>
#include <vector>

namespace xlme::objectives {

struct ObjectiveSet {
  std::string name;         // the objectives.set value
  std::string description;  // what it trains, for the config reference
  // ELECTRA: a generator and a discriminator trained jointly, each task adding its replaced-token
  // detection term (MRTD, TRTD) to the generator's MLM / TLM. false: one encoder with an MLM head.
  bool discriminator = true;
  bool monolingual = true;        // trains on monolingual text: MLM (and MRTD)
  bool translation_pairs = true;  // trains on translation pairs <s> e </s> f </s>: TLM (and TRTD)
  // MiniLMv2-style distillation (distill.*): the discriminator-sized encoder alone, no head,
  // mimicking a frozen teacher's self-attention relations; `discriminator` is false.
  bool distillation = false;
  // VECO's cross-attention MLM (model.cross_attention): one encoder with an MLM head, each
  // micro-batch split into two sides x and y (data::split_pair), four terms per task:
  // -log P(x|x^) - log P(x|x^,y^) - log P(y|y^) - log P(y|y^,x^); `discriminator` is false.
  bool cross_attention = false;

  // The terms of a monolingual / translation-pair micro-batch, the generator's first; empty when
  // the set does not train on that data. Distillation: the query-query, key-key and value-value
  // relation terms (the hidden-state cosine term, when weighted, is objectives::Objectives's).
  // VECO: mlm_x, mlm_xy, mlm_y, mlm_yx / tlm_x, tlm_xy, tlm_y, tlm_yx (x given x^; x given x^ and
  // y^; y given y^; y given y^ and x^).
  std::vector<std::string> monolingual_terms() const;
  std::vector<std::string> translation_pair_terms() const;
};

// Every objective set, in the order the config reference lists them.
const std::vector<ObjectiveSet>& objective_sets();

// The row of objectives.set `name`; an unknown name throws xlme::Error listing the known ones.
const ObjectiveSet& objective_set(const std::string& name);

// The names of objective_sets(), in order: the values objectives.set accepts.
std::vector<std::string> objective_set_names();

// "xlme = MLM+TLM+MRTD+TRTD; ...": the config reference's line for objectives.set.
const char* objective_set_help();

}  // namespace xlme::objectives
