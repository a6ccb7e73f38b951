#pragma once
/// The JSON spelling of the run's typed events (messages/metrics.hpp lists
/// every kind and its fields): what the metrics actor writes to
/// metrics.jsonl, less "time_s".  Defined in actors/metrics.cpp, the one
/// owner of the line schema; the protocol tests' fake metrics use it too.

#include <nlohmann/json.hpp>

#include "messages/metrics.hpp"

namespace tandem {

nlohmann::json event_line(const run_event& e);

} // namespace tandem
