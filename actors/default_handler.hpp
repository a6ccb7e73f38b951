#pragma once
/// The default handler of Tandem's actors (STYLE.md habit 7): a message that
/// no handler of the actor's protocol matches is logged, with its sender and
/// its element types, and answered with errc::unexpected_message,
/// "<name> cannot handle <message>".  Fails loudly instead of CAF's
/// print-and-drop.

#include <cstddef>
#include <string>

#include <caf/actor_system.hpp>
#include <caf/message.hpp>
#include <caf/message_view.hpp>
#include <caf/result.hpp>
#include <caf/scheduled_actor.hpp>
#include <caf/uniform_type_info_map.hpp>
#include <spdlog/spdlog.h>

#include "messages/errors.hpp"

namespace tandem {

/// The element types of `msg` as the type registry names them:
/// "(@str, @i32)" (CAF's portable names); "()" for an empty message.
inline std::string message_type_names(caf::actor_system& sys, const caf::message& msg) {
  std::string out = "(";
  for (size_t i = 0; i < msg.size(); ++i) {
    if (i > 0)
      out += ", ";
    out += sys.types().portable_name(msg.type(i));
  }
  return out + ")";
}

/// Installs the default handler on `self`; `name` is its state's name
/// ("tandem.prefetch"), a string that outlives the actor.
inline void install_default_handler(caf::scheduled_actor* self, const char* name) {
  self->set_default_handler([name](caf::scheduled_actor* me, caf::message_view& view)
                              -> caf::result<caf::message> {
    auto msg = view.copy_content_to_message();
    const auto& sender = me->current_sender();
    spdlog::error("{} (actor {}) cannot handle {} of type {} from {}", name, me->id(),
                  caf::to_string(msg), message_type_names(me->system(), msg),
                  sender ? "actor " + std::to_string(sender->id()) : std::string("an anonymous sender"));
    return make_error(errc::unexpected_message, std::string(name) + " cannot handle "
                                                  + caf::to_string(msg));
  });
}

} // namespace tandem
