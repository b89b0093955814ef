// Precompiled header of the `xlme` target, reused by every executable (CMakeLists.txt).
// Only heavy, stable third-party headers belong here.
#pragma once

#include <torch/torch.h>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <yaml-cpp/yaml.h>
#include <CLI/CLI.hpp>
