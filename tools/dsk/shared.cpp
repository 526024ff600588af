// The options shared by the commands that run cases (`dsk bench`, `dsk verify`).
#include "shared.hpp"

namespace dsk::cli {

void add_case_options(CLI::App* cmd, CaseOptions& options, bool with_plot) {
  cmd->add_option("modules", options.modules, "modules to run (default: every module; see --list)");
  cmd->add_option("--json", options.json, "also write the results as JSON to FILE")
      ->type_name("FILE");
  if (with_plot)
    cmd->add_option("--plot", options.plot, "draw the roofline with the results into FILE.png")
        ->type_name("FILE");
  cmd->add_flag("--quick", options.quick, "fewer shapes and shorter timing");
  cmd->add_option("--filter", options.filter,
                  "run only cases whose module/name contains a match of REGEX (POSIX extended)")
      ->type_name("REGEX");
  cmd->add_flag("--list", options.list, "list the modules and their cases, run nothing");
}

}  // namespace dsk::cli
