#include "messages/registry.hpp"

#include <caf/all.hpp>

#include "messages/errors.hpp"
#include "messages/probe.hpp"

namespace tandem {

void register_messages(caf::actor_system_config& cfg) {
  cfg.add_error_category(
    error_category,
    [](uint8_t code, caf::atom_value, const caf::message& ctx) -> std::string {
      auto text = "tandem." + to_string(static_cast<errc>(code));
      if (!ctx.empty())
        text += ": " + (ctx.match_element<std::string>(0) ? ctx.get_as<std::string>(0) : to_string(ctx));
      return text;
    });
  // Append only, below this line.
  cfg.add_message_type<probe_report>("tandem.probe_report");
}

} // namespace tandem
