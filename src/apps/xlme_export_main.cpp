// xlme-export: export a checkpoint as a portable model folder (safetensors, config.json, tokenizer)
#include "xlme/cli/app.h"
#include "xlme/export/export.h"

#include <string>

int main(int argc, char** argv) {
  const xlme::AppSpec spec{
      "xlme-export",
      "export a checkpoint as a portable model folder (safetensors, config.json, tokenizer)",
      /*run_logs=*/false};
  std::string checkpoint, out_dir, dtype;
  bool with_generator = false, force = false;
  return xlme::run_app(
      argc, argv, spec,
      [&](const xlme::config::Config& config) {
        // The options below win over the export.* keys of --config / --set.
        auto options = xlme::export_::ExportOptions::from_config(config);
        if (!checkpoint.empty()) options.checkpoint = checkpoint;
        if (!out_dir.empty()) options.out_dir = out_dir;
        if (!dtype.empty()) options.dtype = dtype;
        options.with_generator = options.with_generator || with_generator;
        options.force = force;
        xlme::export_::export_model(options);
        return xlme::kExitOk;
      },
      [&](CLI::App& cli) {
        cli.add_option("--checkpoint", checkpoint,
                       "run folder (its newest valid checkpoint), checkpoint folder "
                       "(<run>/checkpoints/step_<N>) or export folder to export (= --set "
                       "export.checkpoint=DIR)")
            ->type_name("DIR");
        cli.add_option("--out", out_dir, "folder to write (= --set export.out_dir=DIR)")
            ->type_name("DIR");
        cli.add_flag("--with-generator", with_generator,
                     "also export the generator and its head (= --set export.with_generator=true)");
        cli.add_option("--dtype", dtype, "dtype of the weights (= --set export.dtype=...)")
            ->check(CLI::IsMember({"fp32", "bf16"}));
        cli.add_flag("--force", force,
                     "replace a non-empty --out folder written by xlme-export (its .xlme-export "
                     "marker); any other folder is refused");
      });
}
