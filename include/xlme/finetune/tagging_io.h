// Readers of the tagging tasks (udpos, panx; task_registry.h): XTREME's processed CoNLL-style
// TSVs, raw PAN-X and UD `.conllu` files (the upstream gold), and the commands that write XTREME's
// processed layout from those downloads (docs/finetuning.md#xtremes-protocol,
// #where-gold-comes-from).
#pragma once

#include "xlme/finetune/examples.h"

#include <cstdint>
#include <string>
#include <vector>

namespace xlme::finetune {

// ---- Tagging (udpos, panx) ---------------------------------------------------------------------

// XTREME's processed file `<download_dir>/<task>/{split}-{lang}.tsv`; throws naming the path, the
// task and the language when it is missing.
std::string tagging_file(const std::string& download_dir, const std::string& task,
                         const std::string& split, const std::string& lang);

// CoNLL-style `word TAB tag` lines, a blank line between sentences; test files carry only the
// word (tags stay empty). A file mixes neither. Tags must be in task_labels(task) (pass "" to skip
// the check). Throws naming file:line otherwise.
std::vector<TaggedSentence> read_conll_tsv(const std::string& path, const std::string& task);

// Raw PAN-X (WikiAnn, Rahimi et al.) `lang:token TAB tag` lines: everything up to the first ':' is
// dropped (XTREME's later rule; the original cut at the second ':' too). A line without exactly two
// TAB fields ends a sentence, as XTREME's panx_preprocess. Tags are checked against panx's set.
std::vector<TaggedSentence> read_panx_raw(const std::string& path);

// A UD `.conllu` file as XTREME's udpos pipeline sees it (conllu_to_conll.py
// --replace_subtokens_with_fused_forms, then utils_preprocess.py): FORM and UPOS of every word;
// a multi-word token `3-4 del` becomes one word with the fused form and the UPOS of the span's
// head (the node with fewest ancestors in the HEAD tree, ties broken by the conversion tool's POS
// precedence list for `lang`); empty nodes (`8.1`) and comments are skipped; U+200C and spaces
// inside forms are deleted; sentences whose forms are all `_` are dropped (the original rule).
// UPOS must be one of the 17 tags.
std::vector<TaggedSentence> read_conllu(const std::string& path, const std::string& lang);

// The `.conllu` files of `lang` and `split` under a UD release folder (e.g. ud-treebanks-v2.5):
// every file, at any depth, whose name starts with "<lang>_" and contains `split`, sorted by file
// name, as XTREME concatenates all treebanks of a language. Throws naming the folder when none.
std::vector<std::string> ud_conllu_files(const std::string& ud_dir, const std::string& lang,
                                         const std::string& split);

// The upstream files with `task`'s test gold for `lang` under `gold_dir` (finetune.gold_dir), as
// the task's row names them (task_registry.h): panx `<lang>/test` (raw WikiAnn), udpos every
// `<lang>_*test*.conllu` of a UD release folder. Throws naming what is missing.
std::vector<std::string> tagging_gold_files(const std::string& gold_dir, const std::string& task,
                                            const std::string& lang);

// The test sentences of `lang` from tagging_gold_files, read by read_panx_raw or read_conllu and
// concatenated in file order.
std::vector<TaggedSentence> read_tagging_gold(const std::string& gold_dir, const std::string& task,
                                              const std::string& lang);

// XTREME's udpos test files hold words only, so a gold of another UD release with the same words
// (tags changed) passes the test-file check; the release is checked on the dev set instead: the
// `gold_dir` release's dev sentences of `lang` (read_conllu), words and tags, must be XTREME's
// `dev_file` ("" = none). Returns what was checked, for the log ("; the gold's release checked:
// ..." or "; the tags' release not checked: ..." when either dev set is missing); throws naming
// both files and the first difference.
std::string check_ud_release(const std::string& gold_dir, const std::string& dev_file,
                             const std::string& lang);

// ---- XTREME's processed layout from the downloads -----------------------------------------------

// A file prepare_udpos / prepare_panx wrote.
struct PreparedFile {
  std::string path;
  int64_t sentences = 0;
};

// `<out_dir>/<task>/{split}-{lang}.tsv` as XTREME's utils_preprocess.py writes them: `word TAB tag`
// lines, a blank line between sentences (none after the last); test files hold the word only
// (XTREME removes test labels: score test with finetune.gold_dir). Replaces the file atomically.
void write_tagged_tsv(const std::string& path, const std::vector<TaggedSentence>& sentences,
                      bool with_tags);

// udpos from a UD release folder (e.g. ud-treebanks-v2.5), as download_data.sh does with
// conllu_to_conll.py and udpos_preprocess: per language and split, every treebank whose file name
// starts with "<lang>_" and contains the split, concatenated in file-name order and read by
// read_conllu (multi-word tokens fused, empty nodes and comments skipped). `languages` empty =
// udpos's 33; a language without files of a split gets no file. Throws naming the folder when no
// file is found at all.
std::vector<PreparedFile> prepare_udpos(const std::string& ud_dir, const std::string& out_dir,
                                        const std::vector<std::string>& languages);

// panx from the unpacked WikiAnn archives `<panx_dir>/<lang>/{train,dev,test}` (raw `lang:token
// TAB tag` lines, read by read_panx_raw), as panx_preprocess. `languages` empty = panx's 40; a
// missing file is skipped. Throws naming the folder when none is found.
std::vector<PreparedFile> prepare_panx(const std::string& panx_dir, const std::string& out_dir,
                                       const std::vector<std::string>& languages);

// prepare_udpos or prepare_panx, as the tagging task `task`'s gold row says; throws listing the
// tagging tasks for another name.
std::vector<PreparedFile> prepare_tagging(const std::string& task, const std::string& input_dir,
                                          const std::string& out_dir,
                                          const std::vector<std::string>& languages);

}  // namespace xlme::finetune
